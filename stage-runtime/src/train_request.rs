//! [`TrainRequest`]: one training run of the reference GPT as a face asks for it (the CLI's
//! `train` flags), checked here, in the library, before any work: a bad value fails in one
//! line naming its field instead of inside step 0 or as a NaN loss. Errors name fields in the
//! library's words (`seq_len`); each face renders them in its own ([`TrainRequestError::named`]:
//! `--seq-len` on the command line).

use std::time::Duration;

use pipewright_kernels::gpt::GptConfig;
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::{KernelError, Precision};
use pipewright_model::shape::{ModelShape, ShapeKinds, ShapeRequestError};
use pipewright_schedule::{RecomputePlan, Timetable};

use crate::error::RuntimeError;
use crate::mesh::{Mesh, MeshError};
use crate::options::RunOptions;
use crate::shape::gpt_config;
use crate::train::TrainConfig;
use crate::zero::{Zero, ZeroError};

/// What to train: the reference GPT of `shape` over a timetable, on a `tp x dp` mesh per
/// pipeline device.
#[derive(Clone, Debug)]
pub struct TrainRequest {
    /// Transformer blocks.
    pub layers: u32,
    /// Width of the residual stream.
    pub d_model: u64,
    /// Attention heads.
    pub heads: u32,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// The model's kinds beyond its sizes.
    pub kinds: ShapeKinds,
    /// Tensor-parallel ranks per stage.
    pub tp: usize,
    /// Data-parallel replicas.
    pub dp: usize,
    /// Expert-parallel ranks, folded over the `dp` replicas (1: every rank holds every
    /// expert; more needs a mixture of experts, `ep` dividing `dp` and the experts, tp 1, ZeRO 0).
    pub ep: usize,
    /// ZeRO level (0 or 1 with a pipeline).
    pub zero: u32,
    /// Sequence parallelism in the TP group.
    pub sequence_parallel: bool,
    /// Sequences per microbatch.
    pub microbatch_size: usize,
    /// Training steps.
    pub steps: u64,
    /// Seed of the weights and the generated data.
    pub seed: u64,
    /// AdamW's learning rate.
    pub lr: f32,
    /// Seconds a receive or collective may wait.
    pub timeout: f64,
    /// Matmul inputs and stored activations.
    pub precision: Precision,
    /// What each stage keeps for its backward.
    pub recompute: RecomputePlan,
    /// Train on through a non-finite loss or gradient.
    pub allow_non_finite: bool,
}

/// A training request that cannot run, naming its field.
#[derive(Debug)]
pub enum TrainRequestError {
    /// A number outside `(low, high]`.
    Range {
        /// The field.
        field: &'static str,
        /// What was asked for, as given.
        got: String,
        /// Exclusive lower bound.
        low: f64,
        /// Inclusive upper bound.
        high: f64,
        /// What the number is.
        why: &'static str,
    },
    /// A count below its least.
    TooFew {
        /// The field.
        field: &'static str,
        /// What was asked for.
        got: u64,
        /// The least it may be.
        min: u64,
        /// What the count is.
        why: &'static str,
    },
    /// Sizes and kinds that make no model.
    Shape(ShapeRequestError),
    /// A model kind the reference GPT lacks (tied embeddings, a mixture of experts), with the
    /// field that asked for it.
    Kind {
        /// The field that asked for the kind.
        field: &'static str,
        /// Why the reference cannot build it (boxed: it is large).
        source: Box<RuntimeError>,
    },
    /// Sizes the reference GPT cannot be built with (heads that do not divide, ...).
    Sizes(KernelError),
    /// Fewer layers than stages.
    Layers {
        /// Layers asked for.
        layers: u32,
        /// The timetable's stages.
        stages: u32,
    },
    /// A mesh that cannot be built.
    Mesh(MeshError),
    /// A ZeRO level this pipeline cannot run.
    Zero {
        /// The level asked for.
        level: u32,
        /// Why not.
        source: ZeroError,
    },
    /// Expert parallelism the model or the ZeRO level cannot take.
    Ep {
        /// The degree asked for.
        ep: usize,
        /// Why not.
        why: String,
    },
    /// Sequence parallelism over a sequence that does not split evenly.
    SeqParallel {
        /// Tokens per sequence.
        seq_len: u64,
        /// Tensor-parallel ranks.
        tp: usize,
    },
}

impl std::fmt::Display for TrainRequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.named(&str::to_string))
    }
}

impl std::error::Error for TrainRequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The message carries each source's words already: only typed access is added.
        match self {
            TrainRequestError::Shape(e) => e.source(),
            TrainRequestError::Sizes(e) => e.source(),
            TrainRequestError::Mesh(e) => e.source(),
            _ => None,
        }
    }
}

impl TrainRequestError {
    /// The message with each field called what `name` calls it (`--seq-len` on the command
    /// line).
    pub fn named(&self, name: &dyn Fn(&str) -> String) -> String {
        match self {
            TrainRequestError::Range {
                field,
                got,
                low,
                high,
                why,
            } => format!(
                "{} {got}: must be a finite number above {low} and at most {high} ({why})",
                name(field)
            ),
            TrainRequestError::TooFew {
                field,
                got,
                min,
                why,
            } => format!("{} {got}: must be at least {min} ({why})", name(field)),
            TrainRequestError::Kind { field, source } => format!("{}: {source}", name(field)),
            TrainRequestError::Shape(e) => e.to_string(),
            TrainRequestError::Sizes(e) => e.to_string(),
            TrainRequestError::Layers { layers, stages } => format!(
                "{} {layers}: {stages} stages need at least {stages} layers (one or more per stage)",
                name("layers")
            ),
            TrainRequestError::Mesh(e) => e.to_string(),
            TrainRequestError::Zero { level, source } => {
                format!("{} {level}: {source}", name("zero"))
            }
            TrainRequestError::Ep { ep, why } => format!("{} {ep}: {why}", name("ep")),
            TrainRequestError::SeqParallel { seq_len, tp } => format!(
                "{}: {} {seq_len} is not divisible by {} {tp} (each TP rank keeps a slice of seq-len / tp positions)",
                name("sequence_parallel"),
                name("seq_len"),
                name("tp")
            ),
        }
    }
}

impl TrainRequest {
    /// Hyperparameters and sizes, checked before any work.
    pub fn check(&self) -> Result<(), TrainRequestError> {
        let range = |field, got: f64, shown: String, high: f64, why| {
            if got.is_finite() && got > 0.0 && got <= high {
                return Ok(());
            }
            Err(TrainRequestError::Range {
                field,
                got: shown,
                low: 0.0,
                high,
                why,
            })
        };
        range(
            "lr",
            f64::from(self.lr),
            self.lr.to_string(),
            1.0,
            "AdamW's learning rate; the default is 3e-3",
        )?;
        let timeout = self.timeout;
        range(
            "timeout",
            timeout,
            timeout.to_string(),
            1e6,
            "seconds a receive may wait",
        )?;
        for (field, got, min, why) in [
            (
                "vocab",
                self.vocab,
                2,
                "a next-token task needs two tokens or more",
            ),
            ("seq_len", self.seq_len, 1, "tokens per sequence"),
            (
                "microbatch_size",
                self.microbatch_size as u64,
                1,
                "sequences per microbatch",
            ),
            ("heads", u64::from(self.heads), 1, "attention heads"),
            ("d_model", self.d_model, 1, "width of the residual stream"),
            ("tp", self.tp as u64, 1, "tensor-parallel ranks"),
            ("dp", self.dp as u64, 1, "data-parallel replicas"),
            ("ep", self.ep as u64, 1, "expert-parallel ranks"),
            ("steps", self.steps, 1, "training steps"),
        ] {
            if got < min {
                return Err(TrainRequestError::TooFew {
                    field,
                    got,
                    min,
                    why,
                });
            }
        }
        let model = reference(&self.shape()?)?;
        model.validate(self.tp).map_err(TrainRequestError::Sizes)
    }

    /// The model's shape: the sizes with the kinds, checked.
    pub fn shape(&self) -> Result<ModelShape, TrainRequestError> {
        (self.kinds)
            .shape(
                self.layers,
                self.d_model,
                self.heads,
                self.seq_len,
                self.vocab,
            )
            .map_err(TrainRequestError::Shape)
    }

    /// The checked run over `tt`: its mesh, ZeRO level and options.
    pub fn config(&self, tt: &Timetable) -> Result<TrainConfig, TrainRequestError> {
        self.check()?;
        let stages = tt.num_stages();
        if self.layers < stages {
            return Err(TrainRequestError::Layers {
                layers: self.layers,
                stages,
            });
        }
        let mesh = Mesh::new(tt.num_devices() as usize, self.tp, self.dp)
            .map_err(TrainRequestError::Mesh)?;
        let mesh = self.expert_mesh(mesh)?;
        let zero =
            Zero::from_level(self.zero, mesh.pp).map_err(|source| TrainRequestError::Zero {
                level: self.zero,
                source,
            })?;
        if self.sequence_parallel && self.seq_len % mesh.tp as u64 != 0 {
            return Err(TrainRequestError::SeqParallel {
                seq_len: self.seq_len,
                tp: mesh.tp,
            });
        }
        Ok(TrainConfig {
            mesh,
            model: reference(&self.shape()?)?,
            microbatch_size: self.microbatch_size,
            sequence_parallel: self.sequence_parallel,
            seed: self.seed,
            run: RunOptions {
                steps: self.steps,
                timeout: Duration::from_secs_f64(self.timeout),
                adamw: AdamWConfig {
                    lr: self.lr,
                    ..AdamWConfig::default()
                },
                // The timetable carries the R actions; the plan says what each stage keeps.
                recompute: self.recompute.clone(),
                precision: self.precision,
                zero,
                check_finite: !self.allow_non_finite,
                ..RunOptions::default()
            },
        })
    }
}

impl TrainRequest {
    /// `mesh` with `ep`, refused in one line naming `ep` where it does not fold over the
    /// replicas, the model has no mixture or its experts do not split, or ZeRO-1 is asked.
    fn expert_mesh(&self, mesh: Mesh) -> Result<Mesh, TrainRequestError> {
        let ep = self.ep;
        if ep < 2 {
            return Ok(mesh);
        }
        let refuse = |why: String| Err(TrainRequestError::Ep { ep, why });
        let experts = self.shape()?.moe.map(|m| m.experts);
        match experts {
            None => return refuse("shards the experts of a mixture; the model has none".into()),
            Some(e) if e as usize % ep != 0 => {
                return refuse(format!("must divide the {e} experts"))
            }
            Some(_) => {}
        }
        if self.zero > 0 {
            return refuse("does not run with ZeRO-1 yet".into());
        }
        mesh.with_ep(ep).or_else(|e| match e {
            MeshError::Ep { why, .. } => refuse(why),
            other => Err(TrainRequestError::Mesh(other)),
        })
    }
}

/// The reference GPT of `shape`, or the kind it lacks, named by the field that asked for it.
fn reference(shape: &ModelShape) -> Result<GptConfig, TrainRequestError> {
    let field = if shape.moe.is_some() {
        "experts"
    } else {
        "tied_embeddings"
    };
    gpt_config(shape).map_err(|source| TrainRequestError::Kind {
        field,
        source: Box::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

    fn request() -> TrainRequest {
        TrainRequest {
            layers: 4,
            d_model: 64,
            heads: 4,
            seq_len: 16,
            vocab: 64,
            kinds: ShapeKinds::default(),
            tp: 1,
            dp: 1,
            ep: 1,
            zero: 0,
            sequence_parallel: false,
            microbatch_size: 4,
            steps: 2,
            seed: 0,
            lr: 3e-3,
            timeout: 60.0,
            precision: Precision::F32,
            recompute: RecomputePlan::default(),
            allow_non_finite: false,
        }
    }

    type Spoil = fn(&mut TrainRequest);

    #[test]
    fn each_bad_field_is_refused_naming_it_in_each_face_s_words() {
        let flag = |f: &str| pipewright_model::shape::request::flag_form(f, None);
        let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
        let cases: [(Spoil, &str); 7] = [
            (|r| r.lr = -1.0, "--lr -1: must be a finite number above 0 and at most 1 (AdamW's learning rate; the default is 3e-3)"),
            (|r| r.timeout = f64::NAN, "--timeout NaN: must be a finite number above 0 and at most 1000000"),
            (|r| r.vocab = 1, "--vocab 1: must be at least 2 (a next-token task needs two tokens or more)"),
            (|r| r.steps = 0, "--steps 0: must be at least 1 (training steps)"),
            (|r| r.layers = 1, "--layers 1: 2 stages need at least 2 layers (one or more per stage)"),
            (|r| r.zero = 2, "--zero 2: "),
            (|r| (r.tp, r.seq_len, r.sequence_parallel) = (4, 18, true), "--sequence-parallel: --seq-len 18 is not divisible by --tp 4"),
        ];
        for (spoil, want) in cases {
            let mut r = request();
            spoil(&mut r);
            let e = r.config(&tt).unwrap_err();
            assert!(e.named(&flag).starts_with(want), "{}", e.named(&flag));
        }
        let cfg = request().config(&tt).unwrap();
        assert_eq!((cfg.mesh.pp, cfg.run.steps), (2, 2));
    }

    #[test]
    fn expert_parallelism_is_refused_naming_ep() {
        let flag = |f: &str| pipewright_model::shape::request::flag_form(f, None);
        let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
        let dense = TrainRequest {
            ep: 2,
            dp: 2,
            ..request()
        };
        let e = dense.config(&tt).unwrap_err().named(&flag);
        assert_eq!(
            e,
            "--ep 2: shards the experts of a mixture; the model has none"
        );
        let mut moe = dense.clone();
        moe.kinds.moe = pipewright_model::shape::MoeKinds {
            experts: Some(4),
            top_k: Some(2),
            ..Default::default()
        };
        moe.kinds.bias = Some(pipewright_model::shape::BiasKind::None);
        assert_eq!(moe.config(&tt).unwrap().mesh.ep, 2);
        moe.dp = 3;
        let e = moe.config(&tt).unwrap_err().named(&flag);
        assert!(e.starts_with("--ep 2: must divide dp = 3"), "{e}");
        moe.ep = 3;
        let e = moe.config(&tt).unwrap_err().named(&flag);
        assert_eq!(e, "--ep 3: must divide the 4 experts");
    }
}
