//! The memory model as a user asks for it beside a timetable (`simulate` and `search`'s
//! memory flags, Python's keywords of the same names): a shape, the mesh, the formats and
//! whose accounting, each optional. Both faces fill a [`MemoryRequest`]; a mesh or format
//! given without a shape, or a shape given in part, is refused in the flags' words.

use crate::shape::request::{flag_form, FieldName};
use crate::shape::{AttentionKind, ShapeRequest, ShapeRequestError};
use pipewright_schedule::recompute::RecomputePlan;
use pipewright_schedule::timetable::Timetable;

use super::{predict, Accounting, MemPrecision, MemoryBreakdown, MemoryConfig, MemoryError};

/// The memory model's inputs as given; `None` takes the default the flag's help names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryRequest {
    /// The model (five sizes together with their kinds, or a config).
    pub shape: ShapeRequest,
    /// How the run computes attention [default: materialized].
    pub attention: Option<AttentionKind>,
    /// Sequences per microbatch [default: 4, train's].
    pub microbatch_size: Option<u64>,
    /// Tensor-parallel ranks per stage [default: 1].
    pub tp: Option<u32>,
    /// Data-parallel replicas [default: 1].
    pub dp: Option<u32>,
    /// ZeRO level [default: 0].
    pub zero: Option<u8>,
    /// Sequence parallelism with TP.
    pub sequence_parallel: bool,
    /// Number formats [default: f32].
    pub precision: Option<MemPrecision>,
    /// Whose activations are counted [default: pipewright's].
    pub accounting: Option<Accounting>,
}

/// Why the memory model cannot answer the request; each names the fields, which each face
/// writes its way ([`MemoryRequestError::named`]). `Display` is the command line's.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MemoryRequestError {
    /// A field of the memory model without the whole shape.
    #[error("{}", self.named(&flag_form))]
    NeedsShape {
        /// The first field given.
        field: &'static str,
        /// The sizes missing.
        missing: Vec<&'static str>,
    },
    /// A shape that is not one.
    #[error(transparent)]
    Shape(#[from] ShapeRequestError),
    /// A configuration the model refuses.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// Sizes whose figures pass what 64-bit counts hold.
    #[error("the memory model's figures for {layers} layers of d_model {d_model} (ffn {ffn}, vocab {vocab}, seq-len {seq_len}, {microbatch_size} sequences per microbatch) pass 2^60 bytes (about {rough:.1e}): check the sizes")]
    TooLarge {
        /// Blocks.
        layers: u32,
        /// Width.
        d_model: u64,
        /// MLP width.
        ffn: u64,
        /// Vocabulary.
        vocab: u64,
        /// Sequence.
        seq_len: u64,
        /// Sequences per microbatch.
        microbatch_size: u64,
        /// The rough bound, bytes.
        rough: f64,
    },
}

impl MemoryRequestError {
    /// The message with each field written as `name` writes it (the CLI's `--tp`, Python's
    /// `tp=`).
    pub fn named(&self, name: FieldName<'_>) -> String {
        match self {
            MemoryRequestError::NeedsShape { field, missing } => {
                let missing: Vec<String> = missing.iter().map(|f| name(f, None)).collect();
                format!(
                    "{} is for the memory model, which needs the model's shape: also give {} (or {})",
                    name(field, None),
                    missing.join(", "),
                    name("hf_config", None)
                )
            }
            MemoryRequestError::Shape(e) => e.named(name),
            e => e.to_string(),
        }
    }
}

impl MemoryRequest {
    /// The fields given other than the shape's.
    fn mesh_given(&self) -> [(&'static str, bool); 8] {
        [
            ("microbatch_size", self.microbatch_size.is_some()),
            ("tp", self.tp.is_some()),
            ("dp", self.dp.is_some()),
            ("zero", self.zero.is_some()),
            ("sequence_parallel", self.sequence_parallel),
            ("precision", self.precision.is_some()),
            ("accounting", self.accounting.is_some()),
            ("attention", self.attention.is_some()),
        ]
    }

    /// The memory model's configuration for `pp` devices and `v` chunks each, if a shape is
    /// given (`None` when nothing of the memory model is); not yet checked.
    pub fn config(
        &self,
        pp: u32,
        v: u32,
        recompute: &RecomputePlan,
    ) -> Result<Option<MemoryConfig>, MemoryRequestError> {
        let shape = if self.shape.hf_config.is_some() {
            self.shape.resolve()?.shape
        } else {
            let sizes = self.shape.sizes();
            let missing: Vec<&str> = sizes
                .iter()
                .filter(|s| s.1.is_none())
                .map(|s| s.0)
                .collect();
            let given = sizes
                .iter()
                .map(|s| (s.0, s.1.is_some()))
                .chain(self.mesh_given())
                .find(|f| f.1)
                .map(|f| f.0)
                .or(self.shape.kinds.given().first().copied());
            match (given, missing.is_empty()) {
                (None, _) => return Ok(None),
                (Some(field), false) => {
                    return Err(MemoryRequestError::NeedsShape { field, missing })
                }
                (Some(_), true) => self.shape.resolve()?.shape,
            }
        };
        Ok(Some(MemoryConfig {
            shape,
            precision: self.precision.unwrap_or_default(),
            accounting: self.accounting.unwrap_or(Accounting::Pipewright),
            pp,
            tp: self.tp.unwrap_or(1),
            dp: self.dp.unwrap_or(1),
            v,
            microbatch_size: self.microbatch_size.unwrap_or(4),
            sequence_parallel: self.sequence_parallel,
            zero: self.zero.unwrap_or(0),
            recompute: recompute.clone(),
            attention: self.attention.unwrap_or_default(),
            experts: Default::default(),
        }))
    }

    /// [`MemoryRequest::config`], checked, with figures that fit 64-bit counts for
    /// `microbatches` in flight.
    pub fn checked(
        &self,
        pp: u32,
        v: u32,
        recompute: &RecomputePlan,
        microbatches: u32,
    ) -> Result<Option<MemoryConfig>, MemoryRequestError> {
        let Some(cfg) = self.config(pp, v, recompute)? else {
            return Ok(None);
        };
        cfg.check()?;
        representable(&cfg, microbatches)?;
        Ok(Some(cfg))
    }

    /// Each device's predicted memory for `tt`, if a shape is given.
    pub fn predict(
        &self,
        tt: &Timetable,
        recompute: &RecomputePlan,
    ) -> Result<Option<Vec<MemoryBreakdown>>, MemoryRequestError> {
        let p = tt.num_devices().max(1);
        let v = (tt.num_stages() / p).max(1);
        let Some(cfg) = self.checked(p, v, recompute, tt.microbatches)? else {
            return Ok(None);
        };
        Ok(Some(predict(&cfg, tt)?))
    }
}

/// Refuse a model shape whose memory figures pass 2^60 bytes: the memory model counts in
/// 64-bit integers, and a prediction that wrapped would print totals smaller than their
/// parts.
pub fn representable(cfg: &MemoryConfig, microbatches: u32) -> Result<(), MemoryRequestError> {
    let rough = rough_bytes(cfg, microbatches);
    if rough > (1u64 << 60) as f64 {
        let s = &cfg.shape;
        return Err(MemoryRequestError::TooLarge {
            layers: s.layers,
            d_model: s.d_model,
            ffn: s.ffn,
            vocab: s.vocab,
            seq_len: s.seq_len,
            microbatch_size: cfg.microbatch_size,
            rough,
        });
    }
    Ok(())
}

/// Bytes of a GPT's training in the large, in floating point so that no size overflows:
/// f32 parameters with gradients and AdamW moments (16 bytes each) and every microbatch's
/// activations held at once, per replica. A generous upper bound, for refusing what cannot
/// fit before the model's integer arithmetic sees it.
pub fn rough_bytes(cfg: &MemoryConfig, microbatches: u32) -> f64 {
    let s = &cfg.shape;
    let (l, d, v, seq) = (
        f64::from(s.layers),
        s.d_model as f64,
        s.vocab as f64,
        s.seq_len as f64,
    );
    let (b, a, f) = (cfg.microbatch_size as f64, f64::from(s.heads), s.ffn as f64);
    let params = l * (4.0 * d * d + 2.0 * d * f + 13.0 * d) + 2.0 * v * d + seq * d;
    let per_microbatch = b * seq * (l * (16.0 * d + 2.0 * f + a * seq) + 2.0 * v) * 4.0;
    (16.0 * params + per_microbatch * f64::from(microbatches)) * f64::from(cfg.dp)
}
