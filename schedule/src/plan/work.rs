//! The work of one transformer layer (and of the embedding and LM head) on one TP rank for
//! one microbatch: its matmuls, with their shapes, and the bytes its element-wise parts move.
//!
//! FLOPs follow Narayanan et al. (SC'21, Megatron-LM), eq. 3: a layer's forward is
//! `24 b s h^2 (1 + s / 6h)` with `ffn = 4h` (QKV `6bsh^2`, attention scores and context
//! `4bs^2h`, projection `2bsh^2`, MLP `16bsh^2`), here with any `ffn`; the LM head adds
//! `2 b s h V`. Each is split over `tp` ranks. Backward is twice the forward: a linear layer's
//! input gradient (I) and weight gradient (W) are each a matmul of the forward's FLOPs and of
//! the same three dimensions (so the same efficiency); attention's score and context matmuls
//! have no weights, so their backward is all I.
//!
//! Element-wise bytes per layer forward (Korthikanti et al. 2022 count the same tensors for
//! memory), with `e` bytes per activation and `T = b s` tokens: two layer norms and two
//! residual adds (read and write, `4Th e` and `6Th e`), two dropouts (read, write, 1-byte
//! mask: `4Th e + 2Th`), GeLU over the MLP's hidden (`2 T ffn e / tp`). The `T h` terms are
//! replicated on every TP rank unless sequence parallelism splits them by `tp`. Unfused
//! attention adds mask, softmax and dropout over the `b (a/tp) s^2` scores (`6e + 1` bytes
//! each). Backward moves about twice the forward's bytes.

use super::efficiency::Efficiency;
use crate::memory::ModelShape;

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
/// bytes per activation.
#[derive(Clone, Copy, Debug)]
pub struct Device {
    /// Peak FLOP/s in the run's precision.
    pub peak: f64,
    /// HBM bytes per second.
    pub hbm: f64,
    /// The matmul efficiency curve.
    pub efficiency: Efficiency,
    /// Bytes of one activation element.
    pub act_bytes: f64,
}

impl Device {
    fn matmul(&self, m: f64, n: f64, k: f64) -> f64 {
        self.efficiency
            .matmul_time(2.0 * m * n * k, (m, n, k), self.peak)
    }
}

/// Forward FLOPs of one layer for `b` sequences, whole (before the TP split).
pub fn layer_flops(shape: &ModelShape, b: f64) -> f64 {
    let (s, h, f) = (shape.seq_len as f64, shape.d_model as f64, shape.ffn as f64);
    2.0 * b * s * (4.0 * h * h + 2.0 * h * f) + 4.0 * b * s * s * h
}

/// Forward FLOPs of the LM head for `b` sequences, whole.
pub fn head_flops(shape: &ModelShape, b: f64) -> f64 {
    2.0 * b * shape.seq_len as f64 * shape.d_model as f64 * shape.vocab as f64
}

/// Model FLOPs of one training step of `sequences` sequences: forward and backward (3x the
/// forward), no recomputation, as MFU counts them.
pub fn model_flops(shape: &ModelShape, sequences: f64) -> f64 {
    3.0 * (shape.layers as f64 * layer_flops(shape, sequences) + head_flops(shape, sequences))
}

/// One transformer layer on one of `tp` ranks for a microbatch of `b` sequences.
pub fn layer(shape: &ModelShape, tp: u32, b: u64, sp: bool, dev: &Device) -> WorkTimes {
    let t = tp as f64;
    let (s, h, ffn) = (shape.seq_len as f64, shape.d_model as f64, shape.ffn as f64);
    let tokens = b as f64 * s;
    let heads = (shape.heads as f64 / t).max(1.0);
    let dh = h / shape.heads as f64;
    let linear = dev.matmul(tokens, 3.0 * h / t, h)
        + dev.matmul(tokens, h, h / t)
        + dev.matmul(tokens, ffn / t, h)
        + dev.matmul(tokens, h, ffn / t);
    // Scores (s x dh)(dh x s) and context (s x s)(s x dh), batched over b * heads/tp.
    let batch = b as f64 * heads;
    let core = batch * (dev.matmul(s, s, dh) + dev.matmul(s, dh, s));
    let e = dev.act_bytes;
    let replicated = if sp { tokens * h / t } else { tokens * h };
    let mut bytes = replicated * (14.0 * e + 2.0) + 2.0 * tokens * ffn / t * e;
    let scores = if dev.efficiency.fused_attention {
        0.0
    } else {
        batch * s * s * (6.0 * e + 1.0) / dev.hbm
    };
    bytes /= dev.hbm;
    WorkTimes {
        f: linear + core + bytes + scores,
        i: linear + 2.0 * core + bytes + 2.0 * scores,
        w: linear + bytes,
        selective: core + scores,
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
        ModelShape {
            layers: 96,
            d_model: 12288,
            heads: 96,
            ffn: 4 * 12288,
            seq_len: 2048,
            vocab: 51200,
        }
    }

    #[test]
    fn flops_are_megatrons_formula() {
        // Narayanan et al. eq. 3 is 96 B s l h^2 (1 + s/6h + V/16lh): layers 4 forwards'
        // worth (one recomputed), the LM head (6 B s h V) 3. Without recomputation the
        // layers count 3 forwards: 72 B s l h^2 (1 + s/6h) + 6 B s h V.
        let m = gpt3();
        let (b, s, l, h, v) = (1536.0, 2048.0, 96.0, 12288.0, 51200.0);
        let want = 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h)) + 6.0 * b * s * h * v;
        let got = model_flops(&m, b);
        assert!((got / want - 1.0).abs() < 1e-12, "{got} vs {want}");
    }

    #[test]
    fn backward_is_about_twice_the_forward() {
        let dev = Device {
            peak: 312e12,
            hbm: 2.0e12,
            efficiency: Efficiency::a100(),
            act_bytes: 2.0,
        };
        let w = layer(&gpt3(), 8, 1, false, &dev);
        let ratio = (w.i + w.w) / w.f;
        assert!((1.9..2.1).contains(&ratio), "{ratio}");
        // TP thins every matmul: 8 ranks take more than an eighth of one rank's time.
        let one = layer(&gpt3(), 1, 1, false, &dev);
        assert!(w.f > one.f / 8.0);
    }
}
