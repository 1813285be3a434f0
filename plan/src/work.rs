//! The work of one transformer layer (and of the embedding and LM head) on one TP rank for
//! one microbatch: its matmuls, with their shapes, and the bytes its element-wise parts move.
//!
//! The matmuls are the shape's own ([`ModelShape::block_linears`]: QKV with its key/value
//! width, the projection, the MLP's up projection, one or two matrices wide, and its down
//! projection), so parameters, FLOPs ([`ModelShape::block_flops`], Narayanan et al. SC'21
//! eq. 3 at GPT-3's shape) and times agree on one derivation. Each is split over `tp` ranks
//! (column- or row-parallel). Backward is twice the forward: a linear layer's input gradient
//! (I) and weight gradient (W) are each a matmul of the forward's FLOPs and of the same three
//! dimensions (so the same efficiency); attention's score and context matmuls have no
//! weights, so their backward is all I.
//!
//! Element-wise bytes per layer forward (Korthikanti et al. 2022 count the same tensors for
//! memory), with `e` bytes per activation and `T = b s` tokens: two norms and two residual
//! adds (read and write, `4Th e` and `6Th e`), two dropouts (read, write, 1-byte mask:
//! `4Th e + 2Th`), the MLP's activation over its `ffn`-wide tensors (GeLU reads its input and
//! writes its output, a gated MLP reads gate and up and writes their product:
//! `MlpKind::hidden_tensors` of them, `T ffn e / tp` each). The `T h` terms are replicated
//! on every TP rank unless sequence parallelism splits them by `tp`. Materialized attention
//! adds mask, softmax and dropout over the `b (a/tp) s^2` scores (`6e + 1` bytes each);
//! fused attention keeps them on chip. Backward moves about twice the forward's bytes.
//!
//! Selective recomputation reruns what the memory model's selective policy drops
//! (`pipewright_model::memory`'s Megatron accounting): under materialized attention the attention
//! core, its two batched matmuls and the scores' element-wise passes; under fused attention
//! the norms and the MLP's activation, element-wise only.

use super::efficiency::Efficiency;
use pipewright_model::shape::{AttentionKind, ModelShape, TpSplit};

/// Seconds of one piece of a layer's work on one TP rank, per microbatch, communication not
/// included.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkTimes {
    /// Forward.
    pub f: f64,
    /// Input-gradient backward.
    pub i: f64,
    /// Weight-gradient backward.
    pub w: f64,
    /// Selective recomputation (the attention core's forward again).
    pub selective: f64,
}

impl std::ops::Add for WorkTimes {
    type Output = WorkTimes;
    fn add(self, o: WorkTimes) -> WorkTimes {
        WorkTimes {
            f: self.f + o.f,
            i: self.i + o.i,
            w: self.w + o.w,
            selective: self.selective + o.selective,
        }
    }
}

impl std::ops::Mul<f64> for WorkTimes {
    type Output = WorkTimes;
    fn mul(self, k: f64) -> WorkTimes {
        WorkTimes {
            f: self.f * k,
            i: self.i * k,
            w: self.w * k,
            selective: self.selective * k,
        }
    }
}

/// What a GPU is, for timing work: peak FLOP/s, HBM bytes per second, its efficiency curve,
/// bytes per activation, and whether the linear layers' GEMMs run in FP8.
#[derive(Clone, Copy, Debug)]
pub struct Device {
    /// Peak FLOP/s in the run's precision.
    pub peak: f64,
    /// Peak FLOP/s of the linear layers' GEMMs (projections, MLPs, experts): `peak`, or the
    /// FP8 peak where they run in FP8. Attention's core, the router and the LM head stay at
    /// `peak`, as DeepSeek-V3 and Transformer Engine keep them.
    pub linear_peak: f64,
    /// HBM bytes per second.
    pub hbm: f64,
    /// The matmul efficiency curve.
    pub efficiency: Efficiency,
    /// Bytes of one activation element.
    pub act_bytes: f64,
    /// Bytes one element's quantization moves before an FP8 GEMM (read at `act_bytes`,
    /// write one byte; the per-tile scales are under 1%), 0 without FP8.
    pub cast_bytes: f64,
    /// The experts' inputs (and their output gradients) are quantized once a token, before
    /// DeepEP dispatches them in FP8, not once a copy after (DeepSeek-V3 §3.3.2).
    pub dispatch_fp8: bool,
}

impl Device {
    /// Seconds of an `(m x k)(k x n)` matmul at the curve's efficiency for its shape.
    pub fn matmul_time(&self, m: f64, n: f64, k: f64) -> f64 {
        self.matmul(m, n, k)
    }

    fn matmul(&self, m: f64, n: f64, k: f64) -> f64 {
        self.gemm(self.peak, (m, n, k))
    }

    /// Seconds of a linear layer's `(m x k)(k x n)` GEMM, at [`Device::linear_peak`].
    pub fn linear_time(&self, m: f64, n: f64, k: f64) -> f64 {
        self.gemm(self.linear_peak, (m, n, k))
    }

    /// Seconds of an `(m x k)(k x n)` GEMM at `peak`, on the curve's efficiency.
    fn gemm(&self, peak: f64, (m, n, k): (f64, f64, f64)) -> f64 {
        self.efficiency
            .matmul_time(2.0 * m * n * k, (m, n, k), peak)
    }

    /// Seconds of an FP8 GEMM's quantization, `(forward, backward)`: its `m x k` input in
    /// the forward, the gradient of its `m x n` output in the input-gradient backward (the
    /// weight gradient reuses both). Zero without FP8.
    pub fn cast_time(&self, m: f64, n: f64, k: f64) -> (f64, f64) {
        let per = self.cast_bytes / self.hbm;
        (m * k * per, m * n * per)
    }

    /// The linear GEMMs `(m, n, k)` of a layer: `(seconds, casts)`, as
    /// [`Device::linear_time`] and [`Device::cast_time`] sum them.
    pub fn linears(&self, gemms: &[(f64, f64, f64)]) -> (f64, (f64, f64)) {
        gemms
            .iter()
            .fold((0.0, (0.0, 0.0)), |(t, (cf, cb)), &(m, n, k)| {
                let (f, b) = self.cast_time(m, n, k);
                (t + self.linear_time(m, n, k), (cf + f, cb + b))
            })
    }
}

/// Forward FLOPs of one layer for `b` sequences, whole (before the TP split).
pub fn layer_flops(shape: &ModelShape, b: f64) -> f64 {
    shape.block_flops(b)
}

/// Model FLOPs of one training step of `sequences` sequences: forward and backward (3x the
/// forward), no recomputation, as MFU counts them.
pub fn model_flops(shape: &ModelShape, sequences: f64) -> f64 {
    shape.model_flops(sequences)
}

/// One transformer layer on one of `tp` ranks for a microbatch of `b` sequences, with
/// attention computed as `attention` says.
pub fn layer(
    shape: &ModelShape,
    tp: u32,
    b: u64,
    sp: bool,
    attention: AttentionKind,
    dev: &Device,
) -> WorkTimes {
    let t = tp as f64;
    let (s, h, ffn) = (shape.seq_len as f64, shape.d_model as f64, shape.ffn as f64);
    let tokens = b as f64 * s;
    let heads = (shape.heads as f64 / t).max(1.0);
    let dh = shape.head_dim() as f64;
    let gemms: Vec<_> = shape
        .block_linears()
        .iter()
        .map(|l| {
            let (i, o) = (l.inputs as f64, l.outputs as f64);
            match l.split {
                TpSplit::Column => (tokens, o / t, i),
                TpSplit::Row => (tokens, o, i / t),
            }
        })
        .collect();
    let (linear, cast) = dev.linears(&gemms);
    // Scores (s x dh)(dh x s) and context (s x s)(s x dh), batched over b * heads/tp.
    let batch = b as f64 * heads;
    let core = batch * (dev.matmul(s, s, dh) + dev.matmul(s, dh, s));
    let replicated = if sp { tokens * h / t } else { tokens * h };
    let activation = shape.mlp.hidden_tensors() as f64 * tokens * ffn / t * dev.act_bytes;
    assemble(
        dev,
        (linear, core),
        (batch, s),
        (replicated, activation),
        cast,
        attention,
    )
}

/// A layer's times from its matmuls (`linear`) and attention core (`core`, over `batch`
/// heads of `s x s` scores), and its element-wise work: the `replicated` elements the norms
/// and residuals read and write, the MLP's `activation` bytes, and the FP8 GEMMs' `cast`s
/// (forward, backward; [`Device::cast_time`]). Dense and MoE layers ([`super::work_moe`])
/// alike.
pub(super) fn assemble(
    dev: &Device,
    (linear, core): (f64, f64),
    (batch, s): (f64, f64),
    (replicated, activation): (f64, f64),
    (cast_f, cast_b): (f64, f64),
    attention: AttentionKind,
) -> WorkTimes {
    let e = dev.act_bytes;
    let bytes = (replicated * (14.0 * e + 2.0) + activation) / dev.hbm;
    let (scores, selective) = match attention {
        AttentionKind::Materialized => {
            let scores = batch * s * s * (6.0 * e + 1.0) / dev.hbm;
            (scores, core + scores)
        }
        // The two norms (read and write each) and the activation again.
        AttentionKind::Fused => (0.0, (4.0 * replicated * e + activation) / dev.hbm),
    };
    WorkTimes {
        f: linear + core + bytes + scores + cast_f,
        i: linear + 2.0 * core + bytes + 2.0 * scores + cast_b,
        w: linear + bytes,
        selective,
    }
}

/// The LM head and its cross-entropy on one of `tp` ranks (vocabulary split).
pub fn head(shape: &ModelShape, tp: u32, b: u64, dev: &Device) -> WorkTimes {
    let t = tp as f64;
    let tokens = b as f64 * shape.seq_len as f64;
    let (h, v) = (shape.d_model as f64, shape.vocab as f64);
    let matmul = dev.matmul(tokens, v / t, h);
    // Softmax and loss over the logits in f32: read, exponentiate and write, read back.
    let logits = 3.0 * tokens * v / t * 4.0 / dev.hbm;
    WorkTimes {
        f: matmul + logits,
        i: matmul + logits,
        w: matmul,
        selective: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt3() -> ModelShape {
        ModelShape::gpt(96, 12288, 96, 4 * 12288, 2048, 51200)
    }

    fn a100() -> Device {
        Device {
            peak: 312e12,
            linear_peak: 312e12,
            hbm: 2.0e12,
            efficiency: Efficiency::a100(),
            act_bytes: 2.0,
            cast_bytes: 0.0,
            dispatch_fp8: false,
        }
    }

    #[test]
    fn backward_is_about_twice_the_forward() {
        let dev = a100();
        let m = AttentionKind::Materialized;
        let w = layer(&gpt3(), 8, 1, false, m, &dev);
        let ratio = (w.i + w.w) / w.f;
        assert!((1.9..2.1).contains(&ratio), "{ratio}");
        // TP thins every matmul: 8 ranks take more than an eighth of one rank's time.
        let one = layer(&gpt3(), 1, 1, false, m, &dev);
        assert!(w.f > one.f / 8.0);
    }

    #[test]
    fn fused_attention_moves_no_scores_and_recomputes_only_element_wise_work() {
        let dev = a100();
        let shape = ModelShape {
            seq_len: 8192,
            ..gpt3()
        };
        let m = layer(&shape, 8, 1, true, AttentionKind::Materialized, &dev);
        let f = layer(&shape, 8, 1, true, AttentionKind::Fused, &dev);
        assert!(f.f < m.f && f.i < m.i);
        assert_eq!(f.w, m.w);
        // Materialized selective reruns the core's matmuls; fused reruns a few passes over
        // memory, a small fraction of the forward.
        assert!(f.selective < 0.05 * f.f, "{} of {}", f.selective, f.f);
        assert!(m.selective > 0.1 * m.f, "{} of {}", m.selective, m.f);
    }

    #[test]
    fn fp8_halves_the_linear_gemms_and_pays_their_casts() {
        let bf16 = Device {
            efficiency: Efficiency {
                peak_fraction: 1.0,
                half_dim: 0.0,
                fused_attention: true,
            },
            ..a100()
        };
        let fp8 = Device {
            linear_peak: 2.0 * bf16.peak,
            cast_bytes: 3.0,
            ..bf16
        };
        let a = AttentionKind::Fused;
        let (slow, fast) = (
            layer(&gpt3(), 8, 1, false, a, &bf16),
            layer(&gpt3(), 8, 1, false, a, &fp8),
        );
        // The linear GEMMs on 2048 tokens, tp 8: QKV 3h/8 x h, projection h x h/8, up
        // 4h/8 x h, down h x 4h/8; at full efficiency, FLOPs over peak. FP8 halves them.
        let (h, tokens) = (12288.0, 2048.0);
        let linear = 2.0 * tokens * 12.0 * h * h / 8.0 / bf16.peak;
        let same = |a: f64, b: f64| (a - b).abs() < 1e-9 * b;
        assert!(same(slow.w - fast.w, linear / 2.0), "{} {}", fast.w, slow.w);
        // F pays each linear's input cast, 3 bytes an element: QKV and the MLP's up read h
        // wide inputs, the projection h/8 and the down projection 4h/8; I pays the outputs'
        // gradients' casts: 3h/8, h, 4h/8 and h.
        let cast_f = tokens * (h + h / 8.0 + h + h / 2.0) * 3.0 / bf16.hbm;
        let cast_b = tokens * (3.0 * h / 8.0 + h + h / 2.0 + h) * 3.0 / bf16.hbm;
        assert!(same(fast.f, slow.f - linear / 2.0 + cast_f));
        assert!(same(fast.i, slow.i - linear / 2.0 + cast_b));
    }

    #[test]
    fn gqa_thins_only_the_qkv_matmul() {
        let dev = a100();
        let a = AttentionKind::Fused;
        let mha = layer(&gpt3(), 8, 1, false, a, &dev);
        let gqa = layer(
            &ModelShape {
                kv_heads: 8,
                ..gpt3()
            },
            8,
            1,
            false,
            a,
            &dev,
        );
        let saved = mha.w - gqa.w;
        // K and V shrink from h to h/12 of 2 x 2bsh^2 FLOPs: about 15% of the linear work.
        assert!(
            saved > 0.1 * mha.w && saved < 0.2 * mha.w,
            "{saved} of {}",
            mha.w
        );
    }
}
