//! A plan as a user asks for it: `pipewright plan`'s fields (the CLI's flags and Python's `plan`
//! keywords name them alike), nothing checked yet. Both faces fill a [`RawPlanRequest`] and
//! call [`RawPlanRequest::build`], so a request is checked once, and refused in one set of
//! words: each error names the fields, and each face writes them its way
//! ([`PlanRequestError::named`]: `--zero 2` on the command line, `zero=2` in Python).
//!
//! Nothing here reads a file: a face hands over a config's, a profile's or a cluster file's
//! text.

use pipewright_model::layer_profile::{LayerProfile, ProfileError};
use pipewright_model::shape::request::{flag_form, FieldName};
use pipewright_model::shape::{AttentionKind, HfNote, Named, ShapeRequest, ShapeRequestError};
use pipewright_schedule::recompute::Recompute;
use pipewright_schedule::spec::ScheduleKind;

use super::cluster::{Cluster, Precision};
use super::config::{Fixed, PlanRequest};
use super::model::PlanModel;
use super::moe_comm::Dispatcher;
use super::PlanError;

/// `--vocab`'s default.
pub const DEFAULT_VOCAB: u64 = 51200;

/// `pipewright plan`'s request as given (the calibration and output flags aside).
#[derive(Clone, Debug, PartialEq)]
pub struct RawPlanRequest {
    /// A GPT's shape (sizes and kinds, or a Hugging Face config); `--vocab` defaults to
    /// [`DEFAULT_VOCAB`].
    pub shape: ShapeRequest,
    /// A layer-list model's profile instead of a GPT (`--profile`).
    pub profile: Option<Named>,
    /// GPUs to use, all of them (`--gpus`).
    pub gpus: Option<u32>,
    /// Sequences (a profile's samples) per step (`--global-batch`).
    pub global_batch: Option<u64>,
    /// A preset's name or a cluster file's (`--cluster`).
    pub cluster: String,
    /// The text of the file `cluster` names, where it names no preset and the file exists
    /// (the face reads it).
    pub cluster_file: Option<String>,
    /// Number format (`--precision`).
    pub precision: Precision,
    /// How the run computes attention (`--attention`) [default: the cluster's].
    pub attention: Option<AttentionKind>,
    /// Dimensions fixed by hand (`--tp`, `--pp`, `--v`, `--microbatch-size`, `--schedule`,
    /// `--recompute`, `--zero`, `--sequence-parallel` / `--no-sequence-parallel`).
    pub fixed: Fixed,
    /// Let TP groups span nodes (`--allow-cross-node-tp`).
    pub allow_cross_node_tp: bool,
    /// Rows kept (`--top`).
    pub top: usize,
    /// Largest chunks per device tried (`--max-virtual`; a fixed `--v` above it is honoured).
    pub max_virtual: u32,
    /// Largest microbatch size tried (`--max-microbatch-size`).
    pub max_microbatch_size: u64,
    /// Most configurations simulated (`--max-simulated`).
    pub max_simulated: usize,
    /// Shapes of the ranking searched (`--max-searched`).
    pub max_searched: usize,
    /// A mixture's capacity factor (`--capacity-factor`), at least 1.
    pub capacity_factor: f64,
    /// How a mixture's tokens reach their experts (`--dispatcher`).
    pub dispatcher: Dispatcher,
    /// The linear layers' GEMMs in FP8 (`--fp8`).
    pub fp8: bool,
}

impl Default for RawPlanRequest {
    /// The CLI's defaults.
    fn default() -> Self {
        RawPlanRequest {
            shape: ShapeRequest::default(),
            profile: None,
            gpus: None,
            global_batch: None,
            cluster: "a100-80g".into(),
            cluster_file: None,
            precision: Precision::Bf16,
            attention: None,
            fixed: Fixed::default(),
            allow_cross_node_tp: false,
            top: 5,
            max_virtual: 8,
            max_microbatch_size: 16,
            max_simulated: 200,
            max_searched: 2,
            capacity_factor: 1.0,
            dispatcher: Dispatcher::AllToAll,
            fp8: false,
        }
    }
}

/// Why a plan request is refused before any work; each names the fields, which each face
/// writes its way ([`PlanRequestError::named`]). `Display` is the command line's.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanRequestError {
    /// The model's shape.
    #[error(transparent)]
    Shape(#[from] ShapeRequestError),
    /// A count that was not given (its field).
    #[error("{}", self.named(&flag_form))]
    Required(&'static str),
    /// A count of 0 (its field).
    #[error("{}", self.named(&flag_form))]
    Zero(&'static str),
    /// No simulation allowed (`max_simulated` 0).
    #[error("{}", self.named(&flag_form))]
    NoSimulation,
    /// A fixed mesh dimension (`tp`, `pp`, `v`) of 0.
    #[error("{}", self.named(&flag_form))]
    FixedZero,
    /// A fixed expert dimension of 0 (`ep`, `etp`).
    #[error("{}", self.named(&flag_form))]
    ExpertZero,
    /// An expert dimension (`ep`, `etp`) for a model without experts.
    #[error("{}", self.named(&flag_form))]
    NoExperts(&'static str),
    /// `ep` that does not divide the experts.
    #[error("{}", self.named(&flag_form))]
    EpExperts {
        /// The EP asked for.
        ep: u32,
        /// Routed experts of the model.
        experts: u32,
    },
    /// A capacity factor below 1 (`capacity_factor`).
    #[error("{}", self.named(&flag_form))]
    Capacity(f64),
    /// A ZeRO level (`zero`) the plan does not model.
    #[error("{}", self.named(&flag_form))]
    Zero23(u8),
    /// `v` against a family (`schedule`) with a fixed v.
    #[error("{}", self.named(&flag_form))]
    VFixed {
        /// The v asked for.
        v: u32,
        /// The family.
        kind: ScheduleKind,
        /// Its v.
        fixed: u32,
    },
    /// `v` above 1 against a family of one stage per device.
    #[error("{}", self.named(&flag_form))]
    VUnsupported {
        /// The v asked for.
        v: u32,
        /// The family.
        kind: ScheduleKind,
    },
    /// A family other than 1F1B on one device (`pp` 1).
    #[error("{}", self.named(&flag_form))]
    OneDevice(ScheduleKind),
    /// Selective recomputation (`recompute`) of a layer-list model.
    #[error("{}", self.named(&flag_form))]
    ProfileRecompute(Recompute),
    /// A profile (`profile`) that is not one.
    #[error("{}", self.named(&flag_form))]
    Profile {
        /// The profile's name.
        name: String,
        /// Why.
        error: ProfileError,
    },
    /// A GPT's field beside a profile.
    #[error("{}", self.named(&flag_form))]
    BesideProfile {
        /// The profile's name.
        name: String,
        /// The field given beside it.
        field: &'static str,
    },
    /// `cluster` names neither a preset nor a file.
    #[error("{}", self.named(&flag_form))]
    NoCluster(String),
    /// `fp8` where it cannot run.
    #[error("{}", self.named(&flag_form))]
    Fp8(Fp8Error),
    /// A cluster file that is not one.
    #[error("{}", self.named(&flag_form))]
    Cluster {
        /// The file's name.
        arg: String,
        /// Why.
        error: PlanError,
    },
}

impl PlanRequestError {
    /// The message with each field written as `name` writes it (the CLI's `--ep 3`,
    /// Python's `ep=3`).
    pub fn named(&self, name: FieldName<'_>) -> String {
        let with = |f: &str, v: &dyn std::fmt::Display| name(f, Some(v.to_string()));
        match self {
            PlanRequestError::Shape(e) => e.named(name),
            PlanRequestError::Required(field) => format!("{} is required", name(field, None)),
            PlanRequestError::Zero(field) => format!("{} must be at least 1", name(field, None)),
            PlanRequestError::NoSimulation => format!(
                "{}: at least 1 configuration must be simulated to rank any",
                with("max_simulated", &0)
            ),
            PlanRequestError::FixedZero => format!(
                "{}, {} and {} must be at least 1",
                name("tp", None),
                name("pp", None),
                name("v", None)
            ),
            PlanRequestError::ExpertZero => format!(
                "{} and {} must be at least 1",
                name("ep", None),
                name("etp", None)
            ),
            PlanRequestError::NoExperts(field) => format!(
                "{} applies to a mixture of experts; the model has no routed experts",
                name(field, None)
            ),
            PlanRequestError::EpExperts { ep, experts } => format!(
                "{} must divide the model's {experts} routed experts",
                with("ep", ep)
            ),
            PlanRequestError::Capacity(c) => format!(
                "{}: must be a finite number at least 1 (1: even routing)",
                with("capacity_factor", c)
            ),
            PlanRequestError::Zero23(z) => format!(
                "{}: the ZeRO level is 0 or 1 (ZeRO-2/3 do not fit a pipeline)",
                with("zero", z)
            ),
            PlanRequestError::VFixed { v, kind, fixed } => format!(
                "{} contradicts {}, which places exactly {fixed} stages on each device",
                with("v", v),
                with("schedule", kind)
            ),
            PlanRequestError::VUnsupported { v, kind } => format!(
                "{} contradicts {}, which places one stage on each device (interleaved-1f1b and looped-bfs take v > 1)",
                with("v", v),
                with("schedule", kind)
            ),
            PlanRequestError::OneDevice(kind) => format!(
                "{} with {}: one device runs every schedule as the same sequence of forwards and backwards; leave {} out, or give {} or more",
                with("schedule", kind),
                with("pp", &1),
                name("schedule", None),
                with("pp", &2)
            ),
            PlanRequestError::ProfileRecompute(r) => format!(
                "{}: a layer-list model recomputes fully or not at all (its layers' stashes are opaque); use none or full",
                with("recompute", r)
            ),
            PlanRequestError::Profile { name: n, error } => {
                format!("{}: {error}", with("profile", n))
            }
            PlanRequestError::BesideProfile { name: n, field } => format!(
                "{} plans a layer-list model at the tp and sizes it was measured at: leave out {}",
                with("profile", n),
                name(field, None)
            ),
            PlanRequestError::NoCluster(arg) => format!(
                "{}: neither a preset ({}) nor a file",
                with("cluster", arg),
                Cluster::PRESETS.join(", ")
            ),
            PlanRequestError::Cluster { arg, error } => {
                format!("{}: {error}", with("cluster", arg))
            }
            PlanRequestError::Fp8(e) => e.named(name),
        }
    }
}

/// Why `fp8` cannot run, naming the fields (see [`PlanRequestError::named`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Fp8Error {
    /// A cluster without an FP8 peak (its name).
    Cluster(String),
    /// A `precision` other than bf16.
    Precision(Precision),
}

impl Fp8Error {
    /// Whether `fp8` can run: a bf16 `precision` on a `cluster` with an FP8 peak (named
    /// `cluster_arg` as it was given). Both the request's faces and `plan` itself ask this.
    pub fn check(
        fp8: bool,
        precision: Precision,
        cluster: &Cluster,
        cluster_arg: &str,
    ) -> Result<(), Fp8Error> {
        if !fp8 {
            Ok(())
        } else if precision != Precision::Bf16 {
            Err(Fp8Error::Precision(precision))
        } else if cluster.fp8_flops().is_none() {
            Err(Fp8Error::Cluster(cluster_arg.to_string()))
        } else {
            Ok(())
        }
    }

    /// The message with each field written as `name` writes it.
    pub fn named(&self, name: FieldName<'_>) -> String {
        let with = |f: &str, v: &dyn std::fmt::Display| name(f, Some(v.to_string()));
        match self {
            Fp8Error::Cluster(c) => format!(
                "{} on {}: the cluster has no FP8 peak (give peak_tflops.fp8 in a cluster file)",
                name("fp8", None),
                with("cluster", c)
            ),
            Fp8Error::Precision(p) => format!(
                "{} runs the linear layers' GEMMs in FP8 beside bf16 activations: it takes {}, not {}",
                name("fp8", None),
                with("precision", &"bf16"),
                with("precision", p)
            ),
        }
    }
}

/// `--recompute`'s policy for a plan, fixed on every stage: none, selective or full, the
/// policies the plan searches (not `every:N` or a per-stage list, which `simulate` takes).
pub fn parse_policy(s: &str) -> Result<Recompute, String> {
    match s {
        "none" => Ok(Recompute::None),
        "selective" => Ok(Recompute::Selective),
        "full" => Ok(Recompute::Full),
        _ => Err(format!("`{s}`: expected none, selective or full")),
    }
}

/// A planned request, with notes on how a config.json was read (for after the work
/// succeeded; each face writes them its way, [`HfNote::named`]).
pub type Built = (PlanRequest, Vec<HfNote>);

impl RawPlanRequest {
    /// The checked request, or the first thing wrong with it.
    pub fn build(&self) -> Result<Built, PlanRequestError> {
        let (model, notes) = match &self.profile {
            Some(profile) => (self.profile_model(profile)?, Vec::new()),
            None => {
                let mut shape = self.shape.clone();
                if shape.hf_config.is_none() {
                    shape.vocab = shape.vocab.or(Some(DEFAULT_VOCAB));
                }
                let r = shape.resolve()?;
                (PlanModel::Gpt(r.shape), r.notes)
            }
        };
        let (gpus, global_batch) = self.counts()?;
        let cluster = self.cluster()?;
        let mut req = match model {
            PlanModel::Gpt(shape) => PlanRequest::new(shape, cluster, gpus, global_batch),
            PlanModel::Layers(p) => PlanRequest::from_profile(p, cluster, gpus, global_batch),
        };
        req.precision = self.precision;
        if let Some(a) = self.attention {
            req.attention = a;
        }
        req.fixed = self.fixed.clone();
        req.allow_cross_node_tp = self.allow_cross_node_tp;
        req.top = self.top;
        req.max_microbatch_size = self.max_microbatch_size;
        self.check_fixed()?;
        // A fixed v is honoured even above the largest v the search would try by itself.
        req.max_virtual = self.max_virtual.max(self.fixed.v.unwrap_or(0));
        req.max_simulated = self.max_simulated;
        req.max_searched = self.max_searched;
        req.capacity_factor = self.capacity_factor;
        req.dispatcher = self.dispatcher;
        self.check_experts(&req.model)?;
        Fp8Error::check(self.fp8, self.precision, &req.cluster, &self.cluster)
            .map_err(PlanRequestError::Fp8)?;
        req.fp8 = self.fp8;
        Ok((req, notes))
    }

    /// The profile's model, with nothing of a GPT beside it.
    fn profile_model(&self, profile: &Named) -> Result<PlanModel, PlanRequestError> {
        let s = &self.shape;
        let beside = s
            .sizes()
            .iter()
            .filter(|x| x.1.is_some())
            .map(|x| x.0)
            .chain(s.kinds.given())
            .chain(s.hf_config.as_ref().map(|_| "hf_config"))
            .chain(self.attention.map(|_| "attention"))
            .chain(self.fp8.then_some("fp8"))
            .chain(self.fixed.tp.map(|_| "tp"))
            .chain((self.fixed.sequence_parallel == Some(true)).then_some("sequence_parallel"))
            .next();
        if let Some(field) = beside {
            return Err(PlanRequestError::BesideProfile {
                name: profile.name.clone(),
                field,
            });
        }
        if let Some(r) = self
            .fixed
            .recompute
            .filter(|r| !matches!(r, Recompute::None | Recompute::Full))
        {
            return Err(PlanRequestError::ProfileRecompute(r));
        }
        let p =
            LayerProfile::from_json(&profile.text).map_err(|error| PlanRequestError::Profile {
                name: profile.name.clone(),
                error,
            })?;
        Ok(PlanModel::Layers(p))
    }

    /// The GPUs and the batch, each at least 1, and the other counts checked likewise.
    fn counts(&self) -> Result<(u32, u64), PlanRequestError> {
        let gpus = self.gpus.ok_or(PlanRequestError::Required("gpus"))?;
        let global_batch = self
            .global_batch
            .ok_or(PlanRequestError::Required("global_batch"))?;
        for (field, v) in [
            ("gpus", u64::from(gpus)),
            ("global_batch", global_batch),
            ("top", self.top as u64),
            ("max_virtual", u64::from(self.max_virtual)),
            ("max_microbatch_size", self.max_microbatch_size),
            ("microbatch_size", self.fixed.microbatch_size.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(PlanRequestError::Zero(field));
            }
        }
        Ok((gpus, global_batch))
    }

    /// The preset, or the cluster file the face read.
    fn cluster(&self) -> Result<Cluster, PlanRequestError> {
        cluster_of(&self.cluster, self.cluster_file.as_deref())
    }

    /// The expert layout's flags against the model: a fixed EP divides its experts.
    fn check_experts(&self, model: &PlanModel) -> Result<(), PlanRequestError> {
        let f = &self.fixed;
        if !(self.capacity_factor.is_finite() && self.capacity_factor >= 1.0) {
            return Err(PlanRequestError::Capacity(self.capacity_factor));
        }
        if f.ep == Some(0) || f.etp == Some(0) {
            return Err(PlanRequestError::ExpertZero);
        }
        let Some(moe) = model.gpt().and_then(|s| s.moe) else {
            let given = [("ep", f.ep), ("etp", f.etp)];
            return match given.iter().find(|(_, x)| x.is_some_and(|x| x > 1)) {
                Some((field, _)) => Err(PlanRequestError::NoExperts(field)),
                None if self.dispatcher != Dispatcher::AllToAll => {
                    Err(PlanRequestError::NoExperts("dispatcher"))
                }
                None => Ok(()),
            };
        };
        match f.ep {
            Some(ep) if moe.experts % ep != 0 => Err(PlanRequestError::EpExperts {
                ep,
                experts: moe.experts,
            }),
            _ => Ok(()),
        }
    }

    /// Fixed dimensions that contradict each other, and counts of 0, refused by name before
    /// the search (a fixed dimension is honoured, or the request is refused).
    fn check_fixed(&self) -> Result<(), PlanRequestError> {
        let f = &self.fixed;
        if self.max_simulated == 0 {
            return Err(PlanRequestError::NoSimulation);
        }
        if f.v == Some(0) || f.pp == Some(0) || f.tp == Some(0) {
            return Err(PlanRequestError::FixedZero);
        }
        if let Some(z) = f.zero.filter(|&z| z > 1) {
            return Err(PlanRequestError::Zero23(z));
        }
        let Some(kind) = f.schedule else {
            return Ok(());
        };
        match (kind.fixed_virtual(), f.v) {
            (Some(fixed), Some(v)) if v != fixed => {
                return Err(PlanRequestError::VFixed { v, kind, fixed })
            }
            (None, Some(v)) if v > 1 && !kind.supports_virtual() => {
                return Err(PlanRequestError::VUnsupported { v, kind })
            }
            _ => {}
        }
        if f.pp == Some(1) && kind != ScheduleKind::OneFOneB {
            return Err(PlanRequestError::OneDevice(kind));
        }
        Ok(())
    }
}

/// What `--cluster ARG` names: a preset, or the cluster file of that name whose text `file`
/// holds (`None`: there is no such file).
pub fn cluster_of(arg: &str, file: Option<&str>) -> Result<Cluster, PlanRequestError> {
    if let Some(c) = Cluster::preset(arg) {
        return Ok(c);
    }
    let Some(text) = file else {
        return Err(PlanRequestError::NoCluster(arg.to_string()));
    };
    Cluster::from_json(text).map_err(|error| PlanRequestError::Cluster {
        arg: arg.to_string(),
        error,
    })
}
