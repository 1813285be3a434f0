//! The joint search: every allowed configuration gets a closed-form lower bound; in order of
//! those bounds, each is checked against memory first and simulated only if it fits, until
//! no remaining bound can beat the `top`-th best step time found (or the simulation budget
//! is spent, which the plan then says).

use serde::Serialize;

use super::bound::lower_bound;
use super::config::{Config, PlanRequest};
use super::costs::cost_model;
use super::evaluate::step_time;
use super::explain::{neighbours, terms, unexplored, why, Terms, DIMENSIONS};
use super::fit::{peaks, worst, BoundCache};
use super::impossible;
use super::refused::Refusals;
use super::request::Fp8Error;
use super::row::row;
pub use super::row::{hardware_flops, PlanRow};
use super::space::enumerate_counted;
use super::worded::Worded;
use super::PlanError;
use pipewright_model::memory::MemoryBreakdown;
use pipewright_schedule::recompute::Recompute;

/// A bound must exceed the `top`-th best step time by this fraction before the search
/// stops: the family bounds assume uniform stages, and real ones (the LM head) are not.
const MARGIN: f64 = 0.02;

/// How far the search has got (for a progress bar).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Configurations the request allows.
    pub candidates: usize,
    /// Configurations bounded so far.
    pub bounded: usize,
    /// Configurations whose memory was checked.
    pub memory_checked: usize,
    /// Configurations that did not fit.
    pub unfit: usize,
    /// Configurations simulated.
    pub simulated: usize,
    /// Schedule searches run (`search`'s list scheduler, see [`super::listed`]).
    pub searched: usize,
    /// Configurations a check refused, dropped from the search ([`Refusals`]).
    pub refused: usize,
}

/// The plan: the ranking, how the search went, and why the best won.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The best first, at most `top`.
    pub rows: Vec<PlanRow>,
    /// How the search went.
    pub progress: Progress,
    /// Whether the simulation budget ran out while some bound could still win.
    pub cut_short: bool,
    /// One line per dimension: why the best beat the best simulated configuration that
    /// differs from it there; each face writes the dimensions its way (JSON: the CLI's).
    pub explain: Vec<Worded>,
    /// Every configuration simulated, with its predicted step time, fastest first.
    #[serde(skip)]
    pub simulated: Vec<(Config, f64)>,
}

/// Make the plan for `req`, reporting progress as it goes.
pub fn plan(req: &PlanRequest, progress: &mut dyn FnMut(&Progress)) -> Result<Plan, PlanError> {
    if req.global_batch > MAX_GLOBAL_BATCH {
        return Err(PlanError::Impossible(Worded::plain(format!(
            "global batch {} sequences: at most {MAX_GLOBAL_BATCH} (2^30) sequences a step can be planned",
            req.global_batch
        ))));
    }
    // A request built by hand, not through `RawPlanRequest::build`, is held to the same
    // check: no silent bf16.
    Fp8Error::check(req.fp8, req.precision, &req.cluster, &req.cluster.name)
        .map_err(|e| PlanError::Impossible(Worded::new(move |name| e.named(name))))?;
    let (configs, refused) = enumerate_counted(req);
    if configs.is_empty() {
        return Err(PlanError::Impossible(impossible::structure(req)));
    }
    let mut s = Search::new(req, refused, configs.len());
    let order = s.bound_order(&configs, progress);
    s.rank(&configs, &order, progress);
    // Recompute where it is needed only (see [`fewer_recomputing`]).
    if req.fixed.recompute.is_none() {
        s.recompute_fewer();
    }
    s.finish()
}

/// The joint search's state: the rows ranked so far, what was simulated, the closest that
/// did not fit, and the refusals.
struct Search<'a> {
    req: &'a PlanRequest,
    refused: Refusals,
    state: Progress,
    keep: usize,
    capacity: u64,
    found: Vec<PlanRow>,
    simulated: Vec<(Config, f64)>,
    closest: Option<(u64, Config)>,
    cut_short: bool,
    bounds: BoundCache,
}

impl<'a> Search<'a> {
    fn new(req: &'a PlanRequest, refused: Refusals, candidates: usize) -> Self {
        let state = Progress {
            candidates,
            refused: refused.total,
            ..Progress::default()
        };
        Search {
            req,
            refused,
            state,
            keep: req.top.max(1),
            capacity: req.cluster.memory_bytes(),
            found: Vec::new(),
            simulated: Vec::new(),
            closest: None,
            cut_short: false,
            bounds: BoundCache::default(),
        }
    }

    /// Every configuration's lower bound with its index, lowest first.
    fn bound_order(
        &mut self,
        configs: &[Config],
        progress: &mut dyn FnMut(&Progress),
    ) -> Vec<(f64, usize)> {
        let mut order: Vec<(f64, usize)> = Vec::with_capacity(configs.len());
        for (i, cfg) in configs.iter().enumerate() {
            order.push((lower_bound(cfg, &cost_model(self.req, cfg).0), i));
            if i % 4096 == 0 {
                self.state.bounded = i;
                progress(&self.state);
            }
        }
        self.state.bounded = configs.len();
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        order
    }

    /// In bound order, check memory and simulate what fits, until no bound can beat the
    /// `top`-th best (with [`MARGIN`]) or the simulation budget is spent.
    fn rank(
        &mut self,
        configs: &[Config],
        order: &[(f64, usize)],
        progress: &mut dyn FnMut(&Progress),
    ) {
        let keep = self.keep;
        for &(bound, i) in order {
            if self.found.len() >= keep && bound > self.found[keep - 1].step_time_s * (1.0 + MARGIN)
            {
                break;
            }
            if self.state.simulated >= self.req.max_simulated.max(1) {
                self.cut_short = true;
                break;
            }
            let cfg = configs[i];
            self.state.memory_checked += 1;
            match candidate(self.req, &cfg, &mut self.bounds, self.capacity) {
                Err(e) => {
                    self.refused.note(&cfg, e);
                    self.state.refused += 1;
                }
                Ok(Checked::Unfit(peak)) => {
                    self.state.unfit += 1;
                    if self.closest.map_or(true, |(p, _)| peak < p) {
                        self.closest = Some((peak, cfg));
                    }
                }
                Ok(Checked::Fits(step, memory)) => {
                    self.state.simulated += 1;
                    self.insert(cfg, step, bound, memory);
                }
            }
            progress(&self.state);
        }
    }

    /// Rank a simulated configuration among the best `keep`.
    fn insert(&mut self, cfg: Config, step: f64, bound: f64, memory: Vec<MemoryBreakdown>) {
        self.simulated.push((cfg, step));
        let at = self.found.partition_point(|r| r.step_time_s <= step);
        self.found
            .insert(at, row(self.req, cfg, step, bound, memory));
        self.found.truncate(self.keep);
    }

    /// Each ranked configuration that recomputes every device, again with only the devices
    /// that do not fit without it.
    fn recompute_fewer(&mut self) {
        for cfg in self.found.iter().map(|r| r.config).collect::<Vec<_>>() {
            let fewer = match fewer_recomputing(self.req, &cfg, self.capacity) {
                Ok(Some(fewer)) => fewer,
                Ok(None) => continue,
                Err(e) => {
                    self.refused.note(&cfg, e);
                    self.state.refused += 1;
                    continue;
                }
            };
            if self.simulated.iter().any(|(c, _)| *c == fewer) {
                continue;
            }
            match candidate(self.req, &fewer, &mut self.bounds, self.capacity) {
                Ok(Checked::Fits(step, memory)) => {
                    let bound = lower_bound(&fewer, &cost_model(self.req, &fewer).0);
                    self.state.simulated += 1;
                    self.insert(fewer, step, bound, memory);
                }
                Ok(Checked::Unfit(_)) => {}
                Err(e) => {
                    self.refused.note(&fewer, e);
                    self.state.refused += 1;
                }
            }
        }
    }

    /// The searched rows added, terms and explanation filled in: the plan, or why nothing
    /// was found.
    fn finish(mut self) -> Result<Plan, PlanError> {
        let req = self.req;
        let before = self.refused.total;
        self.state.searched = super::listed::add_searched(
            req,
            &mut self.found,
            self.keep,
            req.max_searched,
            &mut self.refused,
        );
        self.state.refused += self.refused.total - before;
        if self.found.is_empty() {
            return Err(PlanError::Impossible(self.nothing_found()?));
        }
        for r in &mut self.found {
            let t = terms_of(req, &r.config, r.step_time_s)?;
            r.limit = Some(t.limit());
            r.bubble = t.bubble / r.step_time_s;
            r.terms = Some(t);
        }
        // A searched best says first what the search bought over its shape's best fixed
        // family; its neighbours are then the best's own (not another shape's, which would
        // credit the best with values it does not have).
        let mut explain = explain(req, &self.found[0], &self.simulated)?;
        let plain = |line: Option<String>| line.map(Worded::plain);
        explain.splice(0..0, plain(super::listed::explain(&self.found[0])));
        explain.extend(plain(super::explain_moe::line(req, &self.found[0].config)?));
        explain.extend(plain(self.refused.line()));
        self.simulated.sort_by(|a, b| a.1.total_cmp(&b.1));
        Ok(Plan {
            rows: self.found,
            progress: self.state,
            cut_short: self.cut_short,
            explain,
            simulated: self.simulated,
        })
    }

    /// Why nothing was ranked: the closest configuration's memory, else the commonest
    /// refusal.
    fn nothing_found(&self) -> Result<Worded, PlanError> {
        Ok(match (self.closest, self.refused.most_common()) {
            (Some((_, cfg)), _) => impossible::memory(self.req, &cfg)?,
            (None, Some(r)) => Worded::plain(format!(
                "every configuration checked was refused; most often ({} of {}): {} (e.g. {})",
                r.count, self.refused.total, r.message, r.example
            )),
            (None, None) => Worded::new(|name| {
                format!(
                    "no configuration could be checked (raise {})",
                    name("max_simulated", None)
                )
            }),
        })
    }
}

/// What checking one candidate found.
enum Checked {
    /// Its peak memory, bytes, does not fit.
    Unfit(u64),
    /// It fits: its step time and memory.
    Fits(f64, Vec<MemoryBreakdown>),
}

/// Check `cfg` against memory (the cached one-microbatch bound first), and simulate it if it
/// fits. An error is a check refusing this candidate alone.
fn candidate(
    req: &PlanRequest,
    cfg: &Config,
    bounds: &mut BoundCache,
    capacity: u64,
) -> Result<Checked, PlanError> {
    let floor = bounds.lower_bound(req, cfg)?;
    if floor > capacity {
        return Ok(Checked::Unfit(floor));
    }
    let memory = bounds.peaks(req, cfg)?;
    let peak = worst(&memory);
    if peak > capacity {
        return Ok(Checked::Unfit(peak));
    }
    let (costs, _) = cost_model(req, cfg);
    Ok(Checked::Fits(step_time(cfg, &costs)?, memory))
}

/// `cfg`, which recomputes on every pipeline device, with recomputation on the first devices
/// only: those up to the last one whose peak without recomputation would not fit (1F1B-like
/// schedules hold the most on their first devices). `None` when every device needs it, or
/// none does (the configuration without recomputation is a candidate of its own).
fn fewer_recomputing(
    req: &PlanRequest,
    cfg: &Config,
    capacity: u64,
) -> Result<Option<Config>, PlanError> {
    if cfg.recompute == Recompute::None || cfg.pp < 2 || cfg.recompute_devices < cfg.pp {
        return Ok(None);
    }
    let plain = Config {
        recompute: Recompute::None,
        ..*cfg
    };
    let over = peaks(req, &plain)?
        .iter()
        .rposition(|m| m.total() > capacity);
    Ok(match over {
        Some(d) if (d as u32) + 1 < cfg.pp => Some(Config {
            recompute_devices: d as u32 + 1,
            ..*cfg
        }),
        _ => None,
    })
}

/// The largest global batch a plan takes (a billion sequences, far past any published run):
/// its divisors and the microbatch counts they give are enumerated, and far larger batches
/// make that walk, and the search for a nearest batch that works, take minutes.
pub const MAX_GLOBAL_BATCH: u64 = 1 << 30;

fn terms_of(req: &PlanRequest, cfg: &Config, step: f64) -> Result<Terms, PlanError> {
    let (costs, pieces) = cost_model(req, cfg);
    terms(cfg, &costs, &pieces, step)
}

/// One line per dimension: the best configuration simulated that differs there (and in as
/// few other dimensions as possible), and which terms of the step make it slower.
fn explain(
    req: &PlanRequest,
    best: &PlanRow,
    simulated: &[(Config, f64)],
) -> Result<Vec<Worded>, PlanError> {
    let Some(bt) = best.terms else {
        return Ok(Vec::new());
    };
    let b = (&best.config, best.step_time_s, &bt);
    let mut found = neighbours(&best.config, simulated);
    // A searched best's config names only its placement's family; the search line says how
    // it compares with the families, and a schedule is not a value it has.
    let schedule = DIMENSIONS.iter().position(|&d| d == "schedule");
    let searched = best.searched.is_some();
    if searched {
        found.retain(|&(d, _)| Some(d) != schedule);
    }
    let mut lines = found
        .iter()
        .map(|&(d, i)| {
            let (c, step) = simulated[i];
            let t = terms_of(req, &c, step)?;
            Ok(why(d, b, (&c, step, &t)))
        })
        .collect::<Result<Vec<Worded>, PlanError>>()?;
    // A layer-list model has no tensor parallelism, so neither of its dimensions is a choice.
    let fixed_by_model = |d: usize| {
        req.model.profile().is_some() && ["tp", "sequence_parallel"].contains(&DIMENSIONS[d])
    };
    let left: Vec<&'static str> = (0..DIMENSIONS.len())
        .filter(|&d| !(searched && Some(d) == schedule))
        .filter(|&d| !fixed_by_model(d))
        .filter(|d| !found.iter().any(|(e, _)| e == d))
        .map(|d| DIMENSIONS[d])
        .collect();
    if !left.is_empty() {
        lines.push(unexplored(left));
    }
    Ok(lines)
}
