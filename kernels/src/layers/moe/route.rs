//! The router's host arithmetic: softmax over the experts, top-k, the renormalised gates,
//! the load-balancing loss, and the gradient of the router's logits.
//!
//! Gates follow Mixtral: softmax over all `E` experts, keep the `k` largest, renormalise
//! them to sum to one. That equals a softmax over the `k` chosen logits, so the gates'
//! gradient reaches the chosen logits only; the choice itself (top-k) is not differentiable.
//!
//! The load-balancing loss is Switch/GShard's, normalised as Megatron-Core's:
//! `coef * E * sum_e f_e * P_e` with `f_e` the share of the `T * k` assignments that went
//! to expert `e` (a count: no gradient) and `P_e` the mean over tokens of the full softmax's
//! probability of `e`. Perfect balance gives `coef`.

use crate::error::{shape_err, Result};
use crate::footprint::{Footprint, F32};
use crate::tensor::Tensor;

/// One forward's routing of `T` tokens to `k` of `E` experts.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    experts: usize,
    top_k: usize,
    /// `[T, E]`: the softmax over all experts.
    probs: Vec<f32>,
    /// `[T, k]`: chosen experts, most probable first (ties: the lower index).
    chosen: Vec<usize>,
    /// `[T, k]`: their renormalised gates.
    gates: Vec<f32>,
}

impl Footprint for Routing {
    fn bytes(&self) -> usize {
        (self.probs.len() + self.gates.len()) * F32
            + self.chosen.len() * std::mem::size_of::<usize>()
    }
}

impl Routing {
    /// Routes each row of `logits` (`[.., E]`) to its `top_k` experts.
    pub fn new(logits: &Tensor, top_k: usize) -> Result<Self> {
        let experts = logits.cols();
        if top_k == 0 || top_k > experts {
            return Err(shape_err(
                "Routing::new",
                format!("top-{top_k} of {experts} experts"),
            ));
        }
        let mut probs = logits.data().to_vec();
        let (mut chosen, mut gates) = (Vec::new(), Vec::new());
        for row in probs.chunks_mut(experts) {
            softmax_in_place(row);
            let mut order: Vec<usize> = (0..experts).collect();
            // Stable sort: equal probabilities keep the lower index first.
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            order.truncate(top_k);
            let sum: f32 = order.iter().map(|&e| row[e]).sum();
            gates.extend(order.iter().map(|&e| row[e] / sum));
            chosen.extend(order);
        }
        Ok(Self {
            experts,
            top_k,
            probs,
            chosen,
            gates,
        })
    }

    /// Tokens routed.
    pub fn tokens(&self) -> usize {
        self.gates.len() / self.top_k
    }

    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// The softmax over all experts, `[T, E]` row-major.
    pub fn probs(&self) -> &[f32] {
        &self.probs
    }

    /// The chosen experts, `[T, k]` row-major.
    pub fn chosen(&self) -> &[usize] {
        &self.chosen
    }

    /// The renormalised gates, `[T, k]` row-major.
    pub fn gates(&self) -> &[f32] {
        &self.gates
    }

    /// The `(token, slot)` pairs routed to `expert`, in token order: slot `s` of token
    /// `t` is `chosen[t * k + s]`. This order is the rows of the expert's input.
    pub fn assigned(&self, expert: usize) -> Vec<(usize, usize)> {
        let k = self.top_k;
        (0..self.chosen.len())
            .filter(|&i| self.chosen[i] == expert)
            .map(|i| (i / k, i % k))
            .collect()
    }

    /// `f_e`: the share of the `T * k` assignments that went to each expert.
    pub fn load(&self) -> Vec<f32> {
        let mut f = vec![0.0f32; self.experts];
        self.chosen.iter().for_each(|&e| f[e] += 1.0);
        let n = self.chosen.len().max(1) as f32;
        f.iter_mut().for_each(|v| *v /= n);
        f
    }

    /// The load-balancing loss `coef * E * sum_e f_e * P_e`.
    pub fn aux_loss(&self, coef: f32) -> f32 {
        let t = self.tokens().max(1) as f32;
        let load = self.load();
        let mut p = vec![0.0f32; self.experts];
        for row in self.probs.chunks(self.experts) {
            p.iter_mut().zip(row).for_each(|(a, &b)| *a += b);
        }
        let sum: f32 = load.iter().zip(&p).map(|(f, p)| f * p / t).sum();
        coef * self.experts as f32 * sum
    }

    /// The gradient of the logits `[T, E]` from the gates' gradient `dgates` (`[T, k]`)
    /// plus that of `coef` times the load-balancing loss.
    pub fn dlogits(&self, dgates: &[f32], coef: f32) -> Result<Vec<f32>> {
        let (e, k) = (self.experts, self.top_k);
        if dgates.len() != self.gates.len() {
            return Err(shape_err(
                "Routing::dlogits",
                format!("{} gate gradients for {}", dgates.len(), self.gates.len()),
            ));
        }
        let t = self.tokens().max(1) as f32;
        // d(aux)/dP[t, e] = coef * E * f_e / T, the same for every token.
        let a: Vec<f32> = self
            .load()
            .iter()
            .map(|f| coef * e as f32 * f / t)
            .collect();
        let mut out = vec![0.0f32; self.probs.len()];
        for tok in 0..self.tokens() {
            let dz = &mut out[tok * e..(tok + 1) * e];
            // Softmax over the chosen logits: dz_j = g_j (dg_j - sum_i g_i dg_i).
            let (g, dg) = (&self.gates[tok * k..][..k], &dgates[tok * k..][..k]);
            let dot: f32 = g.iter().zip(dg).map(|(a, b)| a * b).sum();
            for s in 0..k {
                dz[self.chosen[tok * k + s]] += g[s] * (dg[s] - dot);
            }
            if coef != 0.0 {
                let p = &self.probs[tok * e..][..e];
                let pa: f32 = p.iter().zip(&a).map(|(p, a)| p * a).sum();
                dz.iter_mut()
                    .zip(p.iter().zip(&a))
                    .for_each(|(d, (p, a))| *d += p * (a - pa));
            }
        }
        Ok(out)
    }
}

fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    row.iter_mut().for_each(|v| *v = (*v - max).exp());
    let sum: f32 = row.iter().sum();
    row.iter_mut().for_each(|v| *v /= sum);
}

/// The rows `rows` of the matrix `x` (`[.., d]`) stacked into `[rows.len(), d]`.
pub(crate) fn gather_rows(x: &Tensor, rows: impl Iterator<Item = usize>) -> Tensor {
    let d = x.cols();
    let mut data = Vec::new();
    for r in rows {
        data.extend_from_slice(&x.data()[r * d..(r + 1) * d]);
    }
    let n = data.len() / d.max(1);
    Tensor::from_parts(vec![n, d], data)
}
