//! The joint search: every allowed configuration gets a closed-form lower bound; in order of
//! those bounds, each is checked against memory first and simulated only if it fits, until
//! no remaining bound can beat the `top`-th best step time found (or the simulation budget
//! is spent, which the plan then says).

use serde::Serialize;

use super::bound::lower_bound;
use super::config::{Config, PlanRequest};
use super::costs::cost_model;
use super::evaluate::step_time;
use super::explain::{neighbours, terms, why, Terms, DIMENSIONS};
use super::fit::{peaks, worst, BoundCache};
use super::impossible;
use super::row::row;
pub use super::row::{hardware_flops, PlanRow};
use super::space::enumerate_counted;
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
    /// differs from it there.
    pub explain: Vec<String>,
    /// Every configuration simulated, with its predicted step time, fastest first.
    #[serde(skip)]
    pub simulated: Vec<(Config, f64)>,
}

/// Make the plan for `req`, reporting progress as it goes.
pub fn plan(req: &PlanRequest, progress: &mut dyn FnMut(&Progress)) -> Result<Plan, PlanError> {
    if req.global_batch > MAX_GLOBAL_BATCH {
        return Err(PlanError::Impossible(format!(
            "global batch {} sequences: at most {MAX_GLOBAL_BATCH} (2^30) sequences a step can be planned",
            req.global_batch
        )));
    }
    let (configs, mut refused) = enumerate_counted(req);
    if configs.is_empty() {
        return Err(PlanError::Impossible(impossible::structure(req)));
    }
    let mut state = Progress {
        candidates: configs.len(),
        refused: refused.total,
        ..Progress::default()
    };
    let mut order: Vec<(f64, usize)> = Vec::with_capacity(configs.len());
    for (i, cfg) in configs.iter().enumerate() {
        order.push((lower_bound(cfg, &cost_model(req, cfg).0), i));
        if i % 4096 == 0 {
            state.bounded = i;
            progress(&state);
        }
    }
    state.bounded = configs.len();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let capacity = req.cluster.memory_bytes();
    let keep = req.top.max(1);
    let mut found: Vec<PlanRow> = Vec::new();
    let mut simulated: Vec<(Config, f64)> = Vec::new();
    let mut closest: Option<(u64, Config)> = None;
    let mut cut_short = false;
    let mut bounds = BoundCache::default();
    for &(bound, i) in &order {
        if found.len() >= keep && bound > found[keep - 1].step_time_s * (1.0 + MARGIN) {
            break;
        }
        if state.simulated >= req.max_simulated.max(1) {
            cut_short = true;
            break;
        }
        let cfg = configs[i];
        state.memory_checked += 1;
        let checked = match candidate(req, &cfg, &mut bounds, capacity) {
            Ok(c) => c,
            Err(e) => {
                refused.note(&cfg, e);
                state.refused += 1;
                progress(&state);
                continue;
            }
        };
        match checked {
            Checked::Unfit(peak) => {
                state.unfit += 1;
                if closest.map_or(true, |(p, _)| peak < p) {
                    closest = Some((peak, cfg));
                }
                progress(&state);
            }
            Checked::Fits(step, memory) => {
                state.simulated += 1;
                progress(&state);
                simulated.push((cfg, step));
                let row = row(req, cfg, step, bound, memory);
                let at = found.partition_point(|r| r.step_time_s <= step);
                found.insert(at, row);
                found.truncate(keep);
            }
        }
    }
    // Recompute where it is needed only: each ranked configuration that recomputes every
    // device again with only the devices that do not fit without it.
    if req.fixed.recompute.is_none() {
        for cfg in found.iter().map(|r| r.config).collect::<Vec<_>>() {
            let fewer = match fewer_recomputing(req, &cfg, capacity) {
                Ok(Some(fewer)) => fewer,
                Ok(None) => continue,
                Err(e) => {
                    refused.note(&cfg, e);
                    state.refused += 1;
                    continue;
                }
            };
            if simulated.iter().any(|(c, _)| *c == fewer) {
                continue;
            }
            let (memory, step) = match candidate(req, &fewer, &mut bounds, capacity) {
                Ok(Checked::Fits(step, memory)) => (memory, step),
                Ok(Checked::Unfit(_)) => continue,
                Err(e) => {
                    refused.note(&fewer, e);
                    state.refused += 1;
                    continue;
                }
            };
            let (costs, _) = cost_model(req, &fewer);
            state.simulated += 1;
            simulated.push((fewer, step));
            let bound = lower_bound(&fewer, &costs);
            let at = found.partition_point(|r| r.step_time_s <= step);
            found.insert(at, row(req, fewer, step, bound, memory));
            found.truncate(keep);
        }
    }
    let before = refused.total;
    state.searched =
        super::listed::add_searched(req, &mut found, keep, req.max_searched, &mut refused);
    state.refused += refused.total - before;
    if found.is_empty() {
        return Err(PlanError::Impossible(
            match (closest, refused.most_common()) {
                (Some((_, cfg)), _) => impossible::memory(req, &cfg)?,
                (None, Some(r)) => format!(
                    "every configuration checked was refused; most often ({} of {}): {} (e.g. {})",
                    r.count, refused.total, r.message, r.example
                ),
                (None, None) => "no configuration could be checked (raise --max-simulated)".into(),
            },
        ));
    }
    for r in &mut found {
        let t = terms_of(req, &r.config, r.step_time_s)?;
        r.limit = Some(t.limit());
        r.bubble = t.bubble / r.step_time_s;
        r.terms = Some(t);
    }
    // A searched best says first what the search bought over its shape's best fixed family;
    // its neighbours are then the best's own (not another shape's, which would credit the
    // best with values it does not have).
    let mut explain = explain(req, &found[0], &simulated)?;
    explain.splice(0..0, super::listed::explain(&found[0]));
    explain.extend(super::explain_moe::line(req, &found[0].config)?);
    explain.extend(refused.line());
    simulated.sort_by(|a, b| a.1.total_cmp(&b.1));
    Ok(Plan {
        rows: found,
        progress: state,
        cut_short,
        explain,
        simulated,
    })
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
    let memory = peaks(req, cfg)?;
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
) -> Result<Vec<String>, PlanError> {
    let Some(bt) = best.terms else {
        return Ok(Vec::new());
    };
    let b = (&best.config, best.step_time_s, &bt);
    let mut found = neighbours(&best.config, simulated);
    // A searched best's config names only its placement's family; the search line says how
    // it compares with the families, and "--schedule" is not a value it has.
    let schedule = DIMENSIONS.iter().position(|&d| d == "--schedule");
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
        .collect::<Result<Vec<_>, PlanError>>()?;
    // A layer-list model has no tensor parallelism, so neither of its dimensions is a choice.
    let fixed_by_model = |d: usize| {
        req.model.profile().is_some() && ["--tp", "--sequence-parallel"].contains(&DIMENSIONS[d])
    };
    let unexplored: Vec<&str> = (0..DIMENSIONS.len())
        .filter(|&d| !(searched && Some(d) == schedule))
        .filter(|&d| !fixed_by_model(d))
        .filter(|d| !found.iter().any(|(e, _)| e == d))
        .map(|d| DIMENSIONS[d])
        .collect();
    if !unexplored.is_empty() {
        lines.push(format!(
            "{}: no other value was simulated (it did not fit, was not allowed, or its lower bound was slower than the best)",
            unexplored.join(", ")
        ));
    }
    Ok(lines)
}
