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
//! input are replicated), so every rank's shard of an expert sees the same rows. With
//! expert parallelism ([`ep`]) a rank holds a contiguous share of the experts, and
//! [`Moe::forward_ep`] sends rows to the rank holding their expert and back.

pub mod ep;
pub mod route;

use super::mlp::{Mlp, MlpStash, MlpWeightStash};
use super::shard::TpShard;
use super::{cpu_backend, Linear, Parameters, TpReduce};
use crate::backend::{Backend, Shaped};
use crate::cpu::Cpu;
use crate::error::{shape_err, KernelError, Result};
use crate::footprint::Footprint;
use crate::tensor::Tensor;
use ep::{assemble, counts_of, split_back, ExpertExchange, NoEp, Sent};
use route::Routing;
use std::sync::Arc;

/// The routing hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts each token goes to.
    pub top_k: usize,
    /// Coefficient of the load-balancing loss (0 turns it off; Switch uses 0.01).
    pub aux_coef: f32,
}

/// A mixture of experts: all of them, or an expert-parallel rank's share.
#[derive(Debug, Parameters)]
#[parameters(tensor = B::Storage, router, experts, shared)]
pub struct Moe<B: Backend = Cpu> {
    /// `[d, E]`, no bias (every rank holds it whole).
    pub router: Linear<B>,
    /// This rank's routed experts, in router column order.
    pub experts: Vec<Mlp<B>>,
    /// The always-on expert, if any (every rank holds it).
    pub shared: Option<Mlp<B>>,
    cfg: MoeConfig,
    ep: TpShard,
}

super::clone_if_tensors_clone!(Moe {
    router,
    experts,
    shared,
    cfg,
    ep
});

/// What the MoE layer's input backward needs.
#[derive(Debug)]
pub struct MoeStash<B: Backend = Cpu> {
    x: B::Kept,
    routing: Routing,
    /// Where this rank's rows went.
    sent: Sent,
    /// The expert outputs they came back as, per destination, for the gates' gradient.
    back: Vec<Tensor>,
    /// How many rows each source sent each local expert.
    counts: Vec<Vec<usize>>,
    /// Each local expert's stash (`None`: it got no rows).
    experts: Vec<Option<MlpStash<B>>>,
    shared: Option<MlpStash<B>>,
    aux: f32,
}

super::clone_if_tensors_clone!(MoeStash {
    x,
    routing,
    sent,
    back,
    counts,
    experts,
    shared,
    aux
});

impl<B: Backend> Footprint for MoeStash<B> {
    fn bytes(&self) -> usize {
        let word = std::mem::size_of::<usize>();
        let layout = self
            .sent
            .rows
            .iter()
            .map(|r| r.len() * 2 * word)
            .sum::<usize>()
            + (self.sent.counts.len() + self.counts.len()) * self.experts.len() * word;
        self.x.bytes()
            + self.routing.bytes()
            + self.back.bytes()
            + layout
            + self.experts.bytes()
            + self.shared.bytes()
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
    /// all its experts, built by the caller (so any [`Mlp`] kind and TP shard).
    pub fn on(
        be: &Arc<B>,
        name: &str,
        router: &Tensor,
        experts: Vec<Mlp<B>>,
        shared: Option<Mlp<B>>,
        cfg: MoeConfig,
    ) -> Result<Self> {
        Self::on_ep(be, name, router, experts, shared, cfg, TpShard::SINGLE)
    }

    /// Expert-parallel rank `ep`'s share of the layer: `experts` are its `E / ep.size`
    /// experts (from `ep.rank * E / ep.size` on); the router is whole.
    pub fn on_ep(
        be: &Arc<B>,
        name: &str,
        router: &Tensor,
        experts: Vec<Mlp<B>>,
        shared: Option<Mlp<B>>,
        cfg: MoeConfig,
        ep: TpShard,
    ) -> Result<Self> {
        let (d, e) = match router.shape() {
            [d, e] => (*d, *e),
            s => return Err(shape_err("Moe::on", format!("router {s:?} is not [d, E]"))),
        };
        if e % ep.size != 0 {
            return Err(KernelError::Config(format!(
                "{name}: expert-parallel size {} must divide the {e} experts",
                ep.size
            )));
        }
        if e / ep.size != experts.len() {
            return Err(shape_err(
                "Moe::on",
                format!(
                    "router of {e} columns for {} experts on each of {} ranks",
                    experts.len(),
                    ep.size
                ),
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
            ep,
        })
    }

    /// Keeps expert-parallel rank `ep`'s share of the experts of a layer that holds all of
    /// them (the same numbers as [`Moe::on_ep`] given that share).
    pub fn shard_experts(&mut self, ep: TpShard) -> Result<()> {
        let e = self.experts.len();
        if self.ep.size != 1 || e % ep.size != 0 {
            return Err(KernelError::Config(format!(
                "expert-parallel size {} must divide the {e} experts of a whole mixture",
                ep.size
            )));
        }
        let local = e / ep.size;
        self.experts = self
            .experts
            .drain(ep.rank * local..(ep.rank + 1) * local)
            .collect();
        self.ep = ep;
        Ok(())
    }

    /// The routing hyper-parameters.
    pub fn config(&self) -> MoeConfig {
        self.cfg
    }

    /// Sets the load-balancing loss's coefficient (e.g. scaled by a microbatch count).
    pub fn set_aux_coef(&mut self, coef: f32) {
        self.cfg.aux_coef = coef;
    }

    fn check_ep(&self, ep: &dyn ExpertExchange) -> Result<()> {
        if (ep.rank(), ep.size()) != (self.ep.rank, self.ep.size) {
            return Err(KernelError::Config(format!(
                "an expert-parallel group at rank {} of {} for a layer built as rank {} of {}",
                ep.rank(),
                ep.size(),
                self.ep.rank,
                self.ep.size
            )));
        }
        Ok(())
    }

    /// Forward of `x` (`[.., d]`) with all experts on this rank.
    /// With the expert-parallel exchange `tp` offers ([`TpReduce::expert_exchange`]), if any.
    pub fn forward(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, MoeStash<B>)> {
        self.forward_core(x, &mut ViaTp { tp, none: NoEp })
    }

    /// Forward with the experts spread over `ep`: route, send each expert's rows to its
    /// rank, run the local experts on what arrives, send the outputs back, combine.
    pub fn forward_ep(
        &self,
        x: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        ep: &mut dyn ExpertExchange,
    ) -> Result<(B::Storage, MoeStash<B>)> {
        self.forward_core(x, &mut Pair { tp, ep })
    }

    fn forward_core(
        &self,
        x: B::Storage,
        c: &mut dyn Comms<B::Storage>,
    ) -> Result<(B::Storage, MoeStash<B>)> {
        self.check_ep(c.ep())?;
        let be = self.router.backend().clone();
        let shape = x.shape().to_vec();
        let xh = be.download(&x)?;
        let logits = be.download(&self.router.forward_no_bias(&x)?)?;
        let routing = Routing::new(&logits, self.cfg.top_k)?;
        let (k, d, local) = (self.cfg.top_k, xh.cols(), self.experts.len());
        let sent = Sent::plan(&routing, c.ep().size(), local);
        let counts = counts_of(&c.ep().all_to_all(sent.count_messages())?, local)?;
        let recv = c.ep().all_to_all(sent.gather(&xh))?;
        check_rows(&recv, counts.iter().map(|c| c.iter().sum()), d)?;
        let (mut outs, mut stashes) = (Vec::with_capacity(local), Vec::with_capacity(local));
        for (j, expert) in self.experts.iter().enumerate() {
            let xe = assemble(&recv, &counts, j, d);
            if xe.rows() == 0 {
                outs.push(None);
                stashes.push(None);
                continue;
            }
            let (ye, st) = expert.forward(be.upload(&xe)?, c.tp())?;
            outs.push(Some(be.download(&ye)?));
            stashes.push(Some(st));
        }
        let back = c.ep().all_to_all(split_back(&outs, &counts, d))?;
        check_rows(&back, sent.rows.iter().map(Vec::len), d)?;
        // Summed expert by expert in index order, whatever the ranks.
        let mut y = Tensor::zeros(&[xh.rows(), d]);
        for (rows, out) in sent.rows.iter().zip(&back) {
            for (r, &(t, s)) in rows.iter().enumerate() {
                let g = routing.gates()[t * k + s];
                let (dst, src) = (&mut y.data_mut()[t * d..][..d], &out.data()[r * d..][..d]);
                dst.iter_mut().zip(src).for_each(|(a, b)| *a += g * b);
            }
        }
        let mut y = be.upload(&y.reshape(&shape)?)?;
        let shared = match &self.shared {
            Some(m) => {
                let (ys, st) = m.forward(be.copy(&x)?, c.tp())?;
                be.add_assign(&mut y, &ys)?;
                Some(st)
            }
            None => None,
        };
        let aux = routing.aux_loss(self.cfg.aux_coef);
        let stash = MoeStash {
            x: be.keep(x)?,
            routing,
            sent,
            back,
            counts,
            experts: stashes,
            shared,
            aux,
        };
        Ok((y, stash))
    }

    /// Input backward (I) of [`Moe::forward`].
    pub fn backward_input(
        &self,
        stash: MoeStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
    ) -> Result<(B::Storage, MoeWeightStash<B>)> {
        self.backward_core(stash, dy, &mut ViaTp { tp, none: NoEp })
    }

    /// Input backward (I) of [`Moe::forward_ep`] over the same group: the input gradient
    /// through the experts (the output gradients travel to the experts' ranks and the
    /// input gradients back), the gates (into the router) and the shared expert, plus the
    /// load-balancing loss's through the router.
    pub fn backward_input_ep(
        &self,
        stash: MoeStash<B>,
        dy: B::Storage,
        tp: &mut dyn TpReduce<B::Storage>,
        ep: &mut dyn ExpertExchange,
    ) -> Result<(B::Storage, MoeWeightStash<B>)> {
        self.backward_core(stash, dy, &mut Pair { tp, ep })
    }

    fn backward_core(
        &self,
        stash: MoeStash<B>,
        dy: B::Storage,
        c: &mut dyn Comms<B::Storage>,
    ) -> Result<(B::Storage, MoeWeightStash<B>)> {
        self.check_ep(c.ep())?;
        let be = self.router.backend().clone();
        let shape = dy.shape().to_vec();
        let dyh = be.download(&dy)?;
        let (k, d) = (self.cfg.top_k, dyh.cols());
        let (routing, sent) = (&stash.routing, &stash.sent);
        let mut dgates = vec![0.0f32; routing.gates().len()];
        let mut msgs = sent.gather(&dyh);
        for ((msg, rows), out) in msgs.iter_mut().zip(&sent.rows).zip(&stash.back) {
            for (r, &(t, s)) in rows.iter().enumerate() {
                let row = &mut msg.data_mut()[r * d..][..d];
                let ye = &out.data()[r * d..][..d];
                dgates[t * k + s] = row.iter().zip(ye).map(|(a, b)| a * b).sum();
                let g = routing.gates()[t * k + s];
                row.iter_mut().for_each(|v| *v *= g);
            }
        }
        let recv = c.ep().all_to_all(msgs)?;
        check_rows(&recv, stash.counts.iter().map(|c| c.iter().sum()), d)?;
        let mut outs = Vec::with_capacity(self.experts.len());
        let mut wstashes = Vec::with_capacity(self.experts.len());
        for (j, st) in stash.experts.into_iter().enumerate() {
            let Some(st) = st else {
                outs.push(None);
                wstashes.push(None);
                continue;
            };
            let dye = be.upload(&assemble(&recv, &stash.counts, j, d))?;
            let (dxe, ws) = self.experts[j].backward_input(st, dye, c.tp())?;
            outs.push(Some(be.download(&dxe)?));
            wstashes.push(Some(ws));
        }
        let back = c.ep().all_to_all(split_back(&outs, &stash.counts, d))?;
        check_rows(&back, sent.rows.iter().map(Vec::len), d)?;
        let mut dx = Tensor::zeros(&[dyh.rows(), d]);
        for (rows, out) in sent.rows.iter().zip(&back) {
            for (r, &(t, _)) in rows.iter().enumerate() {
                let (dst, src) = (&mut dx.data_mut()[t * d..][..d], &out.data()[r * d..][..d]);
                dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
            }
        }
        let mut logits_shape = shape.clone();
        *logits_shape.last_mut().expect("dy has a feature axis") = self.router.out_features();
        let dlogits = routing.dlogits(&dgates, self.cfg.aux_coef)?;
        let dlogits = be.upload(&Tensor::new(&logits_shape, dlogits)?)?;
        let mut dx = be.upload(&dx.reshape(&shape)?)?;
        be.add_assign(&mut dx, &self.router.backward_input(&dlogits)?)?;
        let shared = match (&self.shared, stash.shared) {
            (Some(m), Some(st)) => {
                let (dxs, ws) = m.backward_input(st, dy, c.tp())?;
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

/// Errors unless the exchange returned one message per rank of `want[r]` rows of width `d`
/// (a transport that lost or cut a message is refused here, not read out of bounds).
fn check_rows(msgs: &[Tensor], want: impl ExactSizeIterator<Item = usize>, d: usize) -> Result<()> {
    let n = want.len();
    let bad = msgs.len() != n || msgs.iter().zip(want).any(|(m, rows)| m.numel() != rows * d);
    if bad {
        return Err(shape_err(
            "expert all-to-all",
            format!(
                "{} messages do not hold the rows sent for {n} ranks",
                msgs.len()
            ),
        ));
    }
    Ok(())
}

/// A mixture's two groups: its experts' TP group and its expert-parallel one.
trait Comms<S> {
    fn tp(&mut self) -> &mut dyn TpReduce<S>;
    fn ep(&mut self) -> &mut dyn ExpertExchange;
}

/// The groups given apart.
struct Pair<'a, S> {
    tp: &'a mut dyn TpReduce<S>,
    ep: &'a mut dyn ExpertExchange,
}

impl<S> Comms<S> for Pair<'_, S> {
    fn tp(&mut self) -> &mut dyn TpReduce<S> {
        self.tp
    }
    fn ep(&mut self) -> &mut dyn ExpertExchange {
        self.ep
    }
}

/// The TP group, with the exchange it offers or a group of one.
struct ViaTp<'a, S> {
    tp: &'a mut dyn TpReduce<S>,
    none: NoEp,
}

impl<S> Comms<S> for ViaTp<'_, S> {
    fn tp(&mut self) -> &mut dyn TpReduce<S> {
        self.tp
    }
    fn ep(&mut self) -> &mut dyn ExpertExchange {
        match self.tp.expert_exchange() {
            Some(e) => e,
            None => &mut self.none,
        }
    }
}
