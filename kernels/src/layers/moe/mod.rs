//! The mixture-of-experts layer: a top-k softmax router, `E` routed experts (each an
//! [`Mlp`] of the block's kind), an optional shared expert always added to the output,
//! and the load-balancing loss ([`route`] has the conventions: Mixtral's renormalised
//! gates, Switch/GShard's auxiliary loss).
//!
//! `y[t] = sum_{s < k} gate[t, s] * expert_{chosen[t, s]}(x[t]) + shared(x[t])`.
//!
//! The routing, the dispatch of tokens to experts and the weighted combine run on the
//! host: on the CPU backend that costs nothing, on a GPU it downloads the router's logits,
//! the input and each expert's output, and uploads each expert's rows (a documented host
//! fallback until the backend has gather and scatter ops). The experts' and the router's
//! matmuls run on the backend.
//!
//! The load-balancing loss is not an output: as Megatron-Core's `MoEAuxLossAutoScaler`,
//! the forward records its value ([`MoeStash::aux_loss`]) and the input backward adds its
//! gradient to the router's. Its coefficient is per forward call, so a caller that scales
//! its loss (by `1 / microbatches`, say) scales the coefficient alike ([`Moe::set_aux_coef`]).
//! The experts run with the caller's TP group: every rank routes alike (the router and the
//! input are replicated), so every rank's shard of an expert sees the same rows.

pub mod route;

use super::mlp::{Mlp, MlpStash, MlpWeightStash};
use super::{cpu_backend, Linear, Parameters, TpReduce};
use crate::backend::{Backend, Shaped};
use crate::cpu::Cpu;
use crate::error::{shape_err, KernelError, Result};
use crate::footprint::Footprint;
use crate::tensor::Tensor;
use route::{gather_rows, Routing};
use std::sync::Arc;

/// The routing hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts each token goes to.
    pub top_k: usize,
    /// Coefficient of the load-balancing loss (0 turns it off; Switch uses 0.01).
    pub aux_coef: f32,
}

/// A mixture of experts (all of them: no expert parallelism).
#[derive(Debug, Parameters)]
#[parameters(tensor = B::Storage, router, experts, shared)]
pub struct Moe<B: Backend = Cpu> {
    /// `[d, E]`, no bias.
    pub router: Linear<B>,
    /// The routed experts, in router column order.
    pub experts: Vec<Mlp<B>>,
    /// The always-on expert, if any.
    pub shared: Option<Mlp<B>>,
    cfg: MoeConfig,
}

super::clone_if_tensors_clone!(Moe {
    router,
    experts,
    shared,
    cfg
});

/// One expert's forward: the rows it saw and what its backward needs.
#[derive(Debug)]
struct ExpertPass<B: Backend> {
    mlp: MlpStash<B>,
    /// Its output `[n_e, d]`, for the gates' gradient `dy[t] . y_e[row]`.
    y: Tensor,
}

super::clone_if_tensors_clone!(ExpertPass { mlp, y });

impl<B: Backend> Footprint for ExpertPass<B> {
    fn bytes(&self) -> usize {
        self.mlp.bytes() + self.y.bytes()
    }
}

/// What the MoE layer's input backward needs.
#[derive(Debug)]
pub struct MoeStash<B: Backend = Cpu> {
    x: B::Kept,
    routing: Routing,
    experts: Vec<Option<ExpertPass<B>>>,
    shared: Option<MlpStash<B>>,
    aux: f32,
}

super::clone_if_tensors_clone!(MoeStash {
    x,
    routing,
    experts,
    shared,
    aux
});

impl<B: Backend> Footprint for MoeStash<B> {
    fn bytes(&self) -> usize {
        self.x.bytes() + self.routing.bytes() + self.experts.bytes() + self.shared.bytes()
    }
}

impl<B: Backend> MoeStash<B> {
    /// The load-balancing loss of this forward (its coefficient included).
    pub fn aux_loss(&self) -> f32 {
        self.aux
    }

    /// How tokens were routed.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }
}

/// What the MoE layer's weight backward needs.
#[derive(Debug)]
pub struct MoeWeightStash<B: Backend = Cpu> {
    x: B::Kept,
    dlogits: B::Kept,
    experts: Vec<Option<MlpWeightStash<B>>>,
    shared: Option<MlpWeightStash<B>>,
}

super::clone_if_tensors_clone!(MoeWeightStash {
    x,
    dlogits,
    experts,
    shared
});
super::footprint_of!(MoeWeightStash {
    x,
    dlogits,
    experts,
    shared
});

impl Moe {
    /// A host MoE layer; see [`Moe::on`].
    pub fn new(
        name: &str,
        router: &Tensor,
        experts: Vec<Mlp>,
        shared: Option<Mlp>,
        cfg: MoeConfig,
    ) -> Result<Self> {
        Self::on(&cpu_backend(), name, router, experts, shared, cfg)
    }
}

impl<B: Backend> Moe<B> {
    /// The layer with router weight `router` (`[d, E]`, named `{name}.router.weight`) and
    /// its experts, built by the caller (so any [`Mlp`] kind and TP shard).
    pub fn on(
        be: &Arc<B>,
        name: &str,
        router: &Tensor,
        experts: Vec<Mlp<B>>,
        shared: Option<Mlp<B>>,
        cfg: MoeConfig,
    ) -> Result<Self> {
        let (d, e) = match router.shape() {
            [d, e] => (*d, *e),
            s => return Err(shape_err("Moe::on", format!("router {s:?} is not [d, E]"))),
        };
        if e != experts.len() {
            return Err(shape_err(
                "Moe::on",
                format!("router of {e} columns for {} experts", experts.len()),
            ));
        }
        if cfg.top_k == 0 || cfg.top_k > e {
            return Err(KernelError::Config(format!(
                "{name}: top_k {} must be 1..={e} (the number of experts)",
                cfg.top_k
            )));
        }
        let bad = experts
            .iter()
            .chain(&shared)
            .find(|m| m.fc1.local.in_features() != d);
        if let Some(m) = bad {
            return Err(shape_err(
                "Moe::on",
                format!(
                    "expert of input {} for d_model {d}",
                    m.fc1.local.in_features()
                ),
            ));
        }
        Ok(Self {
            router: Linear::on(be, &format!("{name}.router"), router, None)?,
            experts,
            shared,
            cfg,
        })
    }

    /// The routing hyper-parameters.
    pub fn config(&self) -> MoeConfig {
        self.cfg
    }

    /// Sets the load-balancing loss's coefficient (e.g. scaled by a microbatch count).
    pub fn set_aux_coef(&mut self, coef: f32) {
        self.cfg.aux_coef = coef;
    }

    /// Forward of `x` (`[.., d]`): route, run each expert on its rows, combine.
    pub fn forward(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, MoeStash<B>)> {
        let be = self.router.backend().clone();
        let shape = x.shape().to_vec();
        let xh = be.download(&x)?;
        let logits = be.download(&self.router.forward_no_bias(&x)?)?;
        let routing = Routing::new(&logits, self.cfg.top_k)?;
        let (k, d) = (self.cfg.top_k, xh.cols());
        let mut y = Tensor::zeros(&[xh.rows(), d]);
        let mut passes = Vec::with_capacity(self.experts.len());
        for (e, expert) in self.experts.iter().enumerate() {
            let rows = routing.assigned(e);
            if rows.is_empty() {
                passes.push(None);
                continue;
            }
            let xe = be.upload(&gather_rows(&xh, rows.iter().map(|r| r.0)))?;
            let (ye, mlp) = expert.forward(xe, tp)?;
            let ye = be.download(&ye)?;
            for (r, &(t, s)) in rows.iter().enumerate() {
                let g = routing.gates()[t * k + s];
                let (dst, src) = (&mut y.data_mut()[t * d..][..d], &ye.data()[r * d..][..d]);
                dst.iter_mut().zip(src).for_each(|(a, b)| *a += g * b);
            }
            passes.push(Some(ExpertPass { mlp, y: ye }));
        }
        let mut y = be.upload(&y.reshape(&shape)?)?;
        let shared = match &self.shared {
            Some(m) => {
                let (ys, st) = m.forward(be.copy(&x)?, tp)?;
                be.add_assign(&mut y, &ys)?;
                Some(st)
            }
            None => None,
        };
        let aux = routing.aux_loss(self.cfg.aux_coef);
        let stash = MoeStash {
            x: be.keep(x)?,
            routing,
            experts: passes,
            shared,
            aux,
        };
        Ok((y, stash))
    }

    /// Input backward (I): the input gradient through the experts, the gates (into the
    /// router) and the shared expert, plus the load-balancing loss's through the router.
    pub fn backward_input(
        &self,
        stash: MoeStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, MoeWeightStash<B>)> {
        let be = self.router.backend().clone();
        let shape = dy.shape().to_vec();
        let dyh = be.download(&dy)?;
        let (k, d) = (self.cfg.top_k, dyh.cols());
        let routing = &stash.routing;
        let mut dx = Tensor::zeros(&[dyh.rows(), d]);
        let mut dgates = vec![0.0f32; routing.gates().len()];
        let mut wstashes = Vec::with_capacity(self.experts.len());
        for (e, pass) in stash.experts.into_iter().enumerate() {
            let Some(pass) = pass else {
                wstashes.push(None);
                continue;
            };
            let rows = routing.assigned(e);
            let mut dye = gather_rows(&dyh, rows.iter().map(|r| r.0));
            for (r, &(t, s)) in rows.iter().enumerate() {
                let row = &mut dye.data_mut()[r * d..][..d];
                let ye = &pass.y.data()[r * d..][..d];
                dgates[t * k + s] = row.iter().zip(ye).map(|(a, b)| a * b).sum();
                let g = routing.gates()[t * k + s];
                row.iter_mut().for_each(|v| *v *= g);
            }
            let (dxe, ws) = self.experts[e].backward_input(pass.mlp, be.upload(&dye)?, tp)?;
            let dxe = be.download(&dxe)?;
            for (r, &(t, _)) in rows.iter().enumerate() {
                let (dst, src) = (&mut dx.data_mut()[t * d..][..d], &dxe.data()[r * d..][..d]);
                dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
            }
            wstashes.push(Some(ws));
        }
        let mut logits_shape = shape.clone();
        *logits_shape.last_mut().expect("dy has a feature axis") = self.experts.len();
        let dlogits = routing.dlogits(&dgates, self.cfg.aux_coef)?;
        let dlogits = be.upload(&Tensor::new(&logits_shape, dlogits)?)?;
        let mut dx = be.upload(&dx.reshape(&shape)?)?;
        be.add_assign(&mut dx, &self.router.backward_input(&dlogits)?)?;
        let shared = match (&self.shared, stash.shared) {
            (Some(m), Some(st)) => {
                let (dxs, ws) = m.backward_input(st, dy, tp)?;
                be.add_assign(&mut dx, &dxs)?;
                Some(ws)
            }
            _ => None,
        };
        let ws = MoeWeightStash {
            x: stash.x,
            dlogits: be.keep(dlogits)?,
            experts: wstashes,
            shared,
        };
        Ok((dx, ws))
    }

    /// Weight backward (W): accumulates the router's, the experts' and the shared expert's
    /// gradients.
    pub fn backward_weight(&mut self, ws: MoeWeightStash<B>) -> Result<()> {
        let be = self.router.backend().clone();
        let (x, dl) = (be.restore(&ws.x)?, be.restore(&ws.dlogits)?);
        self.router.backward_weight(&x, &dl)?;
        for (expert, w) in self.experts.iter_mut().zip(ws.experts) {
            if let Some(w) = w {
                expert.backward_weight(w)?;
            }
        }
        match (&mut self.shared, ws.shared) {
            (Some(m), Some(w)) => m.backward_weight(w),
            _ => Ok(()),
        }
    }
}
