//! The work of one layer of a shape whose layers differ ([`ModelShape::is_uniform`] false):
//! a mixture of experts' MoE layers beside its dense ones, and latent attention. One TP rank,
//! one microbatch of `b` sequences, communication not included (the all-to-all is
//! [`super::moe_comm`]'s, charged apart so an overlapped F&B pair may hide it). Backward and
//! element-wise bytes as [`super::work`] counts them for a dense block.
//!
//! Attention: a plain block's projections ([`ModelShape::block_linears`]'s first two), or
//! latent attention's matrices ([`MlaShape::matrices`]): the two down projections run whole
//! on every TP rank (Megatron-Core duplicates them), the up and output projections split
//! column- and row-wise; the core scores over `qk_nope + qk_rope` per head and takes context
//! over `v_head_dim`, `heads / tp` heads a rank.
//!
//! The experts, per GPU. Under parallel folding a stage's `tp x dp` GPUs hold `b s / tp`
//! tokens each (the sequence-parallel slice Megatron-Core's MoE layers take). A GPU's router
//! sends each of its tokens to `top_k` experts; the EP group of `ep` GPUs together holds all
//! `E` experts, `E / ep` each, and receives the copies its members sent: on average, and
//! with a capacity factor `c` for the padding or the busiest rank's excess, each GPU
//! receives `c x (b s / tp) x top_k` copies (as many as it sent, the routing being uniform
//! over the experts). Expert-TP gathers each copy over its `etp` ranks, each computing
//! `1 / etp` of the expert's width: `etp` times the copies at `1 / etp` the width. So a
//! GPU's expert FLOPs are `c x (b s / tp) x top_k x 2 (up + 1) d ffn_e`: its own tokens'
//! share of the active experts' FLOPs, times the capacity factor; `ep` and `etp` change the
//! shapes of the GEMMs (each of the `E / ep` local experts multiplies
//! `c (b s / tp) top_k etp ep / E` rows by `d x ffn_e / etp`), hence their efficiency, not
//! the FLOPs. The router multiplies the GPU's `b s / tp` tokens by `d x E`; the shared
//! experts run as a dense MLP of width `shared x shared_ffn`, split over TP, on all `b s`.

use super::work::{assemble, Device, WorkTimes};
use pipewright_model::memory::moe::ExpertLayout;
use pipewright_model::shape::{AttentionKind, MlaShape, ModelShape, TpSplit};

/// Attention's projections for `tokens` tokens on one of `t` ranks, `(m, n, k)` each.
fn attention_gemms(shape: &ModelShape, tokens: f64, t: f64) -> Vec<(f64, f64, f64)> {
    match &shape.mla {
        Some(m) => mla_gemms(m, shape, tokens, t),
        None => shape.block_linears()[..2]
            .iter()
            .map(|l| {
                let (i, o) = (l.inputs as f64, l.outputs as f64);
                match l.split {
                    TpSplit::Column => (tokens, o / t, i),
                    TpSplit::Row => (tokens, o, i / t),
                }
            })
            .collect(),
    }
}

/// Latent attention's GEMMs: the down projections whole, the rest split (see the module's
/// note). `matrices` lists the query path first (down and up, or one projection), then the
/// keys' and values' down and up projections, and the output projection last.
fn mla_gemms(m: &MlaShape, shape: &ModelShape, tokens: f64, t: f64) -> Vec<(f64, f64, f64)> {
    let mats = m.matrices(shape.d_model, u64::from(shape.heads));
    let d = shape.d_model;
    let last = mats.len() - 1;
    mats.iter()
        .enumerate()
        .map(|(j, &(i, o))| {
            let (fi, fo) = (i as f64, o as f64);
            if j == last {
                (tokens, fo, fi / t)
            } else if i == d && o < d {
                // A down projection into a bottleneck: whole on every rank.
                (tokens, fo, fi)
            } else {
                (tokens, fo / t, fi)
            }
        })
        .collect()
}

/// Layer `i`'s work on one of `tp` ranks for a microbatch of `b` sequences, `run` being
/// `(tp, b, sequence parallelism, attention)` (see the module's note), the experts laid out
/// as `experts` says.
pub fn layer_at(
    shape: &ModelShape,
    i: u32,
    run: (u32, u64, bool, AttentionKind),
    experts: &ExpertLayout,
    dev: &Device,
) -> WorkTimes {
    let (tp, b, sp, attention) = run;
    let t = f64::from(tp.max(1));
    let (s, h) = (shape.seq_len as f64, shape.d_model as f64);
    let tokens = b as f64 * s;
    let heads = (f64::from(shape.heads) / t).max(1.0);
    let (qk, v) = match &shape.mla {
        Some(m) => (m.qk_head_dim() as f64, m.v_head_dim as f64),
        None => (shape.head_dim() as f64, shape.head_dim() as f64),
    };
    let e = dev.act_bytes;
    let hidden = shape.mlp.hidden_tensors() as f64;
    let ups = shape.mlp.up_matrices() as f64;
    let mut gemms = attention_gemms(shape, tokens, t);
    let (experts_s, activation) = match shape.moe.filter(|m| m.is_moe_layer(i)) {
        None => {
            let [_, _, up, down] = shape.block_linears();
            let f = shape.ffn as f64;
            gemms.push((tokens, up.outputs as f64 / t, h));
            gemms.push((tokens, h, down.inputs as f64 / t));
            ((0.0, (0.0, 0.0)), hidden * tokens * f / t * e)
        }
        Some(m) => {
            let (ep, etp) = (f64::from(experts.ep.max(1)), f64::from(experts.etp.max(1)));
            let routed = tokens / t;
            let copies = routed * f64::from(m.top_k) * experts.capacity * etp;
            let local = f64::from(m.experts) / ep;
            let (rows, width) = (copies / local, m.expert_ffn as f64 / etp);
            let shared = f64::from(m.shared_experts) * m.shared_ffn as f64;
            gemms.push((tokens, ups * shared / t, h));
            gemms.push((tokens, h, shared / t));
            // The router stays out of FP8 (DeepSeek-V3 keeps its gating in higher precision).
            let router = dev.matmul_time(routed, f64::from(m.experts), h);
            let (one, (cf, cb)) = dev.linears(&[(rows, ups * width, h), (rows, h, width)]);
            // Quantized once a token before an FP8 dispatch: the up projection's input and
            // the down projection's output gradient, `routed` rows of `h`, not `copies`.
            let once = match dev.dispatch_fp8 {
                true => (copies - routed).max(0.0) * h * dev.cast_bytes / dev.hbm,
                false => 0.0,
            };
            let casts = (local * cf - once, local * cb - once);
            let activation = hidden * (copies * width + tokens * shared / t) * e;
            ((router + local * one, casts), activation)
        }
    };
    finish(
        dev,
        &gemms,
        experts_s,
        (b as f64 * heads, s, qk, v),
        (tokens, h, t, sp, attention),
        activation,
    )
}

/// The layer's times from its GEMMs, `experts` (seconds and casts of the router and expert
/// GEMMs), its attention core (`batch` heads of `s x s` scores over `qk`, context over `v`)
/// and its element-wise bytes.
fn finish(
    dev: &Device,
    gemms: &[(f64, f64, f64)],
    (experts_s, (ecf, ecb)): (f64, (f64, f64)),
    (batch, s, qk, v): (f64, f64, f64, f64),
    (tokens, h, t, sp, attention): (f64, f64, f64, bool, AttentionKind),
    activation: f64,
) -> WorkTimes {
    // A shape without shared experts has GEMMs of width 0: no time.
    let real: Vec<_> = gemms
        .iter()
        .copied()
        .filter(|g| g.1 > 0.0 && g.2 > 0.0)
        .collect();
    let (gemm_s, (cf, cb)) = dev.linears(&real);
    let linear = gemm_s + experts_s;
    let core = batch * (dev.matmul_time(s, s, qk) + dev.matmul_time(s, v, s));
    let replicated = if sp { tokens * h / t } else { tokens * h };
    assemble(
        dev,
        (linear, core),
        (batch, s),
        (replicated, activation),
        (cf + ecf, cb + ecb),
        attention,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::efficiency::Efficiency;
    use pipewright_model::shape::{MlpKind, MoeShape};

    /// A device at its peak for any matmul shape, with memory too fast to count.
    fn ideal() -> Device {
        Device {
            peak: 1e15,
            linear_peak: 1e15,
            cast_bytes: 0.0,
            dispatch_fp8: false,
            hbm: 1e30,
            efficiency: Efficiency {
                peak_fraction: 1.0,
                half_dim: 0.0,
                fused_attention: true,
            },
            act_bytes: 2.0,
        }
    }

    fn mixture() -> ModelShape {
        ModelShape {
            mlp: MlpKind::SwiGlu,
            moe: Some(MoeShape {
                route_groups: None,
                experts: 16,
                top_k: 4,
                expert_ffn: 512,
                shared_experts: 0,
                shared_ffn: 0,
                shared_gate: false,
                router_bias: false,
                dense_layers: 1,
                every: 1,
            }),
            ..ModelShape::gpt(4, 1024, 16, 2048, 1024, 32000)
        }
    }

    #[test]
    fn a_gpu_computes_its_own_tokens_share_of_the_active_experts_times_the_capacity() {
        let (s, dev) = (mixture(), ideal());
        let run = (2, 2, true, AttentionKind::Fused);
        let at = |ep, etp, capacity| {
            let e = ExpertLayout { ep, etp, capacity };
            layer_at(&s, 1, run, &e, &dev).w
        };
        // b s / tp = 1024 tokens a GPU, 4 copies each, 2 x 3 x 1024 x 512 FLOPs a copy.
        let copy = 2.0 * 3.0 * 1024.0 * 512.0;
        let extra = at(4, 1, 1.5) - at(4, 1, 1.0);
        let want = 0.5 * 1024.0 * 4.0 * copy / 1e15;
        assert!((extra / want - 1.0).abs() < 1e-9, "{extra} vs {want}");
        // The layout changes the GEMMs' shapes, not their FLOPs.
        for (ep, etp) in [(1, 1), (2, 1), (2, 2), (4, 1)] {
            let w = at(ep, etp, 1.0);
            assert!((w / at(4, 1, 1.0) - 1.0).abs() < 1e-9, "ep {ep} etp {etp}");
        }
        // The first layer is dense: its MLP, not the experts.
        let dense = layer_at(&s, 0, run, &ExpertLayout::default(), &dev).w;
        assert_ne!(dense, at(1, 1, 1.0));
    }

    /// FP8 halves the experts' GEMMs but not the router's, and an FP8 dispatch quantizes a
    /// token once, not each of its copies.
    #[test]
    fn fp8_speeds_the_experts_not_the_router_and_a_dispatch_quantizes_once() {
        let s = mixture();
        let run = (2, 2, true, AttentionKind::Fused);
        let e = ExpertLayout {
            ep: 4,
            etp: 1,
            capacity: 1.0,
        };
        let bf16 = ideal();
        let fp8 = Device {
            linear_peak: 2.0 * bf16.peak,
            ..bf16
        };
        // W: the router (1024 tokens x 16 experts x 1024) at peak, every other GEMM at
        // twice it; attention's core has no weights.
        let router = 2.0 * 1024.0 * 16.0 * 1024.0 / bf16.peak;
        let (slow, fast) = (
            layer_at(&s, 1, run, &e, &bf16),
            layer_at(&s, 1, run, &e, &fp8),
        );
        let want = router + (slow.w - router) / 2.0;
        assert!((fast.w / want - 1.0).abs() < 1e-9, "{} vs {want}", fast.w);
        // Casts at 3 bytes an element over 1e12 bytes/s; dispatched in FP8, the experts'
        // inputs and their outputs' gradients are cast on 1024 tokens, not 4096 copies.
        let cast = |dispatch_fp8| Device {
            cast_bytes: 3.0,
            hbm: 1e12,
            dispatch_fp8,
            ..fp8
        };
        let (each, once) = (
            layer_at(&s, 1, run, &e, &cast(false)),
            layer_at(&s, 1, run, &e, &cast(true)),
        );
        let saved = (4096.0 - 1024.0) * 1024.0 * 3.0 / 1e12;
        assert!(((each.f - once.f) / saved - 1.0).abs() < 1e-9);
        assert!(((each.i - once.i) / saved - 1.0).abs() < 1e-9);
        assert_eq!(each.w, once.w);
    }
}
