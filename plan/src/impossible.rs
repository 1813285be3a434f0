//! One line for a request nothing satisfies, naming the nearest thing that would work.

use super::config::{Config, Fixed, PlanRequest};
use super::fit::{peaks, worst};
use super::space::{divisors, enumerate, enumerate_counted, tp_options};
use super::worded::{with, Worded};
use super::PlanError;
use pipewright_model::shape::request::FieldName;

fn gib(bytes: f64) -> String {
    let gib = bytes / f64::from(1u32 << 30);
    if gib >= 1024.0 {
        format!("{:.1} TiB", gib / 1024.0)
    } else {
        format!("{gib:.1} GiB")
    }
}

/// Why no configuration divides the request (the heads, the GPUs, the batch or a fixed
/// dimension), and what would.
pub fn structure(req: &PlanRequest) -> Worded {
    let free = PlanRequest {
        fixed: Fixed::default(),
        ..req.clone()
    };
    if let Some(line) = fixed_tp(req, &free) {
        return line;
    }
    let (some, refused) = enumerate_counted(&free);
    if some.is_empty() {
        return match refused.most_common() {
            Some(r) => Worded::plain(format!(
                "every configuration was refused; most often ({} of {}): {} (e.g. {})",
                r.count, refused.total, r.message, r.example
            )),
            None => batch(req),
        };
    }
    // What refused the configurations the fixed dimensions allow, if a check did.
    let because = enumerate_counted(req)
        .1
        .most_common()
        .map_or(String::new(), |r| format!(": {}", r.message));
    if let Some(line) = fixed_tp_pp(req).or_else(|| released(req, &because)) {
        return line;
    }
    let c = enumerate(&free)[0];
    Worded::plain(format!("the dimensions fixed by hand fit no configuration together{because}; with none fixed, e.g. {c}"))
}

/// A fixed TP that cannot split the heads (or a profile's own TP), and the sizes that can.
fn fixed_tp(req: &PlanRequest, free: &PlanRequest) -> Option<Worded> {
    let tp = req.fixed.tp?;
    if tp_options(free).binary_search(&tp).is_ok() {
        return None;
    }
    let ok = tp_options(free);
    let node = if req.allow_cross_node_tp {
        String::new()
    } else {
        format!(" inside a node of {}", req.cluster.gpus_per_node)
    };
    let Some(shape) = req.model.gpt() else {
        let own = req.model.profile().map_or(1, |p| p.tp);
        return Some(Worded::new(move |name| {
            format!(
                "{}: a layer-list profile runs at the tp it was measured at ({own})",
                with(name, "tp", tp)
            )
        }));
    };
    let kv = if shape.kv_heads == shape.heads {
        String::new()
    } else {
        format!(" ({} key/value heads)", shape.kv_heads)
    };
    let why = format!(
        "cannot split the {} heads{kv} over {} GPUs{node}: TP sizes that can: {}",
        shape.heads,
        req.gpus,
        list(&ok)
    );
    Some(Worded::new(move |name| {
        format!("{} {why}", with(name, "tp", tp))
    }))
}

/// `--tp` and `--pp` fixed together fix dp: say so when it cannot split the GPUs or the batch.
fn fixed_tp_pp(req: &PlanRequest) -> Option<Worded> {
    let (tp, pp) = (req.fixed.tp?, req.fixed.pp?);
    let group = u64::from(tp) * u64::from(pp);
    let gpus = u64::from(req.gpus);
    if gpus % group != 0 {
        return Some(Worded::new(move |name| {
            format!(
                "{} x {} = {group} does not divide {}: every GPU must be in one pipeline of tp x pp GPUs",
                with(name, "tp", tp),
                with(name, "pp", pp),
                with(name, "gpus", gpus)
            )
        }));
    }
    let dp = gpus / group;
    let (batch, unit) = (req.global_batch, req.model.batch_unit());
    let fits = batch.div_ceil(dp) * dp;
    (batch % dp != 0).then(|| {
        Worded::new(move |name| {
            format!(
                "global batch {batch} {unit} cannot be split over dp = {dp} replicas ({} / ({} x {})): give a batch that {dp} divides, e.g. {fits}",
                with(name, "gpus", gpus),
                with(name, "tp", tp),
                with(name, "pp", pp)
            )
        })
    })
}

/// The first fixed dimension whose release lets a configuration through, named with one.
fn released(req: &PlanRequest, because: &str) -> Option<Worded> {
    let f = &req.fixed;
    let without = |clear: fn(&mut Fixed)| {
        let mut fixed = f.clone();
        clear(&mut fixed);
        fixed
    };
    let releases: [(&str, String, Fixed); 7] = [
        ("tp", opt(f.tp), without(|x| x.tp = None)),
        ("pp", opt(f.pp), without(|x| x.pp = None)),
        (
            "microbatch_size",
            opt(f.microbatch_size),
            without(|x| x.microbatch_size = None),
        ),
        ("schedule", opt(f.schedule), without(|x| x.schedule = None)),
        ("v", opt(f.v), without(|x| x.v = None)),
        ("zero", opt(f.zero), without(|x| x.zero = None)),
        (
            "sequence_parallel",
            opt(f.sequence_parallel),
            without(|x| x.sequence_parallel = None),
        ),
    ];
    releases
        .into_iter()
        .filter(|(_, value, _)| !value.is_empty())
        .find_map(|(field, value, fixed)| {
            let relaxed = PlanRequest {
                fixed,
                ..req.clone()
            };
            let c = *enumerate(&relaxed).first()?;
            let why = format!(
                "fits no configuration of the other dimensions given ({} GPUs, {} layers, batch {}){because}; without it, e.g. {c}",
                req.gpus, req.model.layers(), req.global_batch
            );
            Some(Worded::new(move |name| {
                format!("{} {why}", with(name, field, &value))
            }))
        })
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

fn list(v: &[u32]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    }
}

/// How far from the asked batch [`batch`] looks for one that works, each way.
const NEAR: u64 = 4096;

/// The batch divides among no data-parallel size: the nearest batches that do.
fn batch(req: &PlanRequest) -> Worded {
    let with = |b: u64| {
        !enumerate(&PlanRequest {
            global_batch: b,
            fixed: Fixed::default(),
            ..req.clone()
        })
        .is_empty()
    };
    // Near batches only: a structure nothing divides would otherwise scan every batch.
    let up = (req.global_batch + 1..=req.global_batch.saturating_add(NEAR)).find(|&b| with(b));
    let down = (req.global_batch.saturating_sub(NEAR).max(1)..req.global_batch)
        .rev()
        .find(|&b| with(b));
    let dps: Vec<u64> = divisors(u64::from(req.gpus));
    // The fewest replicas any tp x pp leaves: a batch below it cannot give each one a
    // sequence, whatever the GPU count's divisors.
    let widest_tp = tp_options(&PlanRequest {
        fixed: Fixed::default(),
        ..req.clone()
    });
    let widest = widest_tp
        .iter()
        .copied()
        .flat_map(|tp| {
            divisors(u64::from(req.gpus / tp))
                .into_iter()
                .filter(|&pp| pp <= u64::from(req.model.layers()))
                .map(move |pp| u64::from(tp) * pp)
        })
        .max()
        .unwrap_or(1);
    let least_dp = u64::from(req.gpus) / widest;
    if req.global_batch < least_dp {
        return Worded::plain(format!(
            "global batch {} {unit} is too small for {} GPUs: the widest pipeline they allow is tp x pp = {widest} GPUs, which leaves dp = {least_dp} replicas, each needing at least one; give a batch of at least {least_dp} that dp divides, or fewer GPUs",
            req.global_batch,
            req.gpus,
            unit = req.model.batch_unit()
        ));
    }
    let near = match (down, up) {
        (Some(d), Some(u)) => format!("{d} or {u}"),
        (Some(d), None) => d.to_string(),
        (None, Some(u)) => u.to_string(),
        (None, None) => return no_batch_fits(req, widest_tp.is_empty()),
    };
    let unit = req.model.batch_unit();
    Worded::plain(format!(
        "global batch {} {unit}: no data-parallel size this cluster allows (dp divides {} GPUs: {}; with tp*pp*dp = {} and pp <= {} layers) divides it into microbatches; nearest batch that works: {near}",
        req.global_batch,
        req.gpus,
        dps.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
        req.gpus,
        req.model.layers()
    ))
}

/// No batch near the asked one works: what of the GPUs, layers, heads or profile rules every
/// batch out (`no_tp`: no TP size fits at all).
fn no_batch_fits(req: &PlanRequest, no_tp: bool) -> Worded {
    let Some(shape) = req.model.gpt() else {
        if let Some(p) = req.model.profile().filter(|_| no_tp) {
            if req.gpus % p.tp == 0 && p.tp > req.cluster.gpus_per_node && !req.allow_cross_node_tp
            {
                let (tp, node) = (p.tp, req.cluster.gpus_per_node);
                return Worded::new(move |name| {
                    format!(
                    "the profile was measured at tp {tp} (one TP rank's layers), more than the {node} GPUs of a node: allow cross-node TP ({}), or profile at a tp that divides the node",
                    name("allow_cross_node_tp", None)
                )
                });
            }
            return Worded::plain(format!(
                "the profile was measured at tp {} (one TP rank's layers), which {} GPUs ({} per node) cannot hold: use a GPU count that is a multiple of {}, or profile at another tp",
                p.tp, req.gpus, req.cluster.gpus_per_node, p.tp
            ));
        }
        return Worded::plain(format!(
            "{} GPUs cannot hold {} layers in any PP x DP with microbatches of {} samples: use a GPU count with a divisor of at most {} layers, and a batch that many replicas can split into such microbatches",
            req.gpus,
            req.model.layers(),
            req.fixed.microbatch_size.or(req.model.profile().map(|p| p.microbatch_size)).unwrap_or(1),
            req.model.layers()
        ));
    };
    Worded::plain(format!(
        "{} GPUs cannot hold {} layers with {} heads in any TP x PP x DP: use a GPU count of which some tp*pp (tp dividing the heads, pp at most the layers) is a divisor",
        req.gpus, shape.layers, shape.heads
    ))
}

/// Nothing fits in memory: the state the model needs, how many GPUs of this kind that takes
/// at least, and the memory levers the request fixed off.
pub fn memory(req: &PlanRequest, closest: &Config) -> Result<Worded, PlanError> {
    let cap = req.cluster.memory_bytes();
    let devices = peaks(req, closest)?;
    let peak = worst(&devices);
    let (tp, dp) = (f64::from(closest.tp), f64::from(closest.dp));
    // One replica's unique state (ZeRO-1's optimizer shards times dp).
    let zero_dp = if closest.zero >= 1 { dp } else { 1.0 };
    let state: f64 = devices
        .iter()
        .map(|d| tp * ((d.parameters + d.gradients) as f64 + zero_dp * d.optimizer_state as f64))
        .sum();
    let need = (state / cap as f64).ceil() as u64;
    let more = need.saturating_sub(u64::from(req.gpus));
    let gpu = format!("{} GiB", req.cluster.memory_gib);
    let fix = if more > 0 {
        format!("at least {more} more {gpu} GPUs")
    } else {
        "the model state would fit spread over these GPUs, its activations do not".to_string()
    };
    let levers = levers(req, closest);
    let line = format!(
        "needs {} of model state; the closest configuration ({closest}) peaks at {} per GPU of {gpu}: {fix}",
        gib(state),
        gib(peak as f64),
    );
    Ok(Worded::new(move |name| {
        let levers: Vec<String> = levers.iter().map(|l| l.named(name)).collect();
        match (levers.is_empty(), more > 0) {
            (true, _) => line.clone(),
            (false, true) => format!("{line}, or {}", levers.join(" and ")),
            (false, false) => format!("{line}: try {}", levers.join(" and ")),
        }
    }))
}

/// A memory lever the request fixed off, by its field.
#[derive(Clone, Copy)]
enum Lever {
    /// A field set to a value (`recompute` full).
    Set(&'static str, &'static str),
    /// A switch turned on (`sequence_parallel`).
    On(&'static str),
    /// A microbatch below the profile's.
    SmallerMicrobatch,
    /// Another TP or PP.
    OtherTpPp,
}

impl Lever {
    /// The lever with its fields written as `name` writes them.
    fn named(self, name: FieldName<'_>) -> String {
        match self {
            Lever::Set(field, value) => with(name, field, value),
            Lever::On(field) => name(field, None),
            Lever::SmallerMicrobatch => format!(
                "a {} below the profile's (its activations scale with it)",
                name("microbatch_size", None)
            ),
            Lever::OtherTpPp => format!("other {}/{}", name("tp", None), name("pp", None)),
        }
    }
}

/// The memory levers the request fixed to something other than their most frugal setting.
fn levers(req: &PlanRequest, closest: &Config) -> Vec<Lever> {
    let f = &req.fixed;
    let mut levers = Vec::new();
    if f.recompute.is_some_and(|r| r.as_str() != "full") {
        levers.push(Lever::Set("recompute", "full"));
    }
    if f.zero == Some(0) && closest.dp > 1 {
        levers.push(Lever::Set("zero", "1"));
    }
    if f.sequence_parallel == Some(false) && closest.tp > 1 {
        levers.push(Lever::On("sequence_parallel"));
    }
    if f.microbatch_size.is_some_and(|b| b > 1) {
        levers.push(Lever::Set("microbatch_size", "1"));
    }
    let profiled = req.model.profile().map(|p| p.microbatch_size);
    if f.microbatch_size.is_none() && profiled.is_some_and(|b| b > 1) {
        levers.push(Lever::SmallerMicrobatch);
    }
    if f.pp.is_some() || f.tp.is_some() {
        levers.push(Lever::OtherTpPp);
    }
    levers
}
