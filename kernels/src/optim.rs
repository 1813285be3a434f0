//! Optimizers over the flat view of a module's parameters.
//!
//! The state (momentum, Adam moments) is one flat vector indexed like
//! [`Parameters::flat_params`]: parameters are visited in their fixed order
//! and each occupies the next `numel` slots. Updates are elementwise and in
//! a fixed order, so they are deterministic and the same on every replica.

pub mod shard;

pub use crate::backend::AdamWUpdate;
pub use shard::ShardedAdamW;

use crate::backend::{Backend, Shaped};
use crate::cpu::adamw::adamw_update;
use crate::error::{shape_err, KernelError, Result};
use crate::layers::{Param, Parameters};

/// Visits parameters with their offset in the flat view; errors if the
/// parameter count differs from the optimizer state's.
fn visit_flat(
    model: &mut dyn Parameters,
    state_len: usize,
    f: &mut dyn FnMut(usize, &mut Param),
) -> Result<()> {
    let n = model.num_params();
    if n != state_len {
        return Err(KernelError::Config(format!(
            "optimizer state holds {state_len} values, model has {n} parameters"
        )));
    }
    let mut off = 0;
    model.visit_mut(&mut |p| {
        f(off, p);
        off += p.value.numel();
    });
    Ok(())
}

/// SGD with momentum, as PyTorch: `v = mu v + g (+ wd p)`, `p -= lr v`.
#[derive(Clone, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum `mu` (0 for plain SGD).
    pub momentum: f32,
    /// L2 weight decay added to the gradient of decayed parameters.
    pub weight_decay: f32,
    velocity: Vec<f32>,
}

impl Sgd {
    /// An optimizer for a model of `num_params` parameters.
    pub fn new(num_params: usize, lr: f32, momentum: f32) -> Self {
        Self {
            lr,
            momentum,
            weight_decay: 0.0,
            velocity: vec![0.0; num_params],
        }
    }

    /// One update from the accumulated gradients (which it leaves alone).
    pub fn step(&mut self, model: &mut dyn Parameters) -> Result<()> {
        let (lr, mu, wd) = (self.lr, self.momentum, self.weight_decay);
        let vel = &mut self.velocity;
        visit_flat(model, vel.len(), &mut |off, p| {
            let wd = if p.decay { wd } else { 0.0 };
            let v = &mut vel[off..off + p.value.numel()];
            for ((x, &g), v) in p.value.data_mut().iter_mut().zip(p.grad.data()).zip(v) {
                *v = mu * *v + g + wd * *x;
                *x -= lr * *v;
            }
        })
    }
}

/// Hyper-parameters of [`AdamW`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the root of the second moment.
    pub eps: f32,
    /// Decoupled weight decay, for parameters with `decay` set.
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// AdamW (Loshchilov & Hutter) with bias correction, as PyTorch:
/// `p *= 1 - lr wd`, then `p -= lr m_hat / (sqrt(v_hat) + eps)`.
#[derive(Clone, Debug)]
pub struct AdamW {
    /// Hyper-parameters.
    pub cfg: AdamWConfig,
    step: u32,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl AdamW {
    /// An optimizer for a model of `num_params` parameters.
    pub fn new(num_params: usize, cfg: AdamWConfig) -> Self {
        Self {
            cfg,
            step: 0,
            m: vec![0.0; num_params],
            v: vec![0.0; num_params],
        }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u32 {
        self.step
    }

    /// Values of optimizer state held (both moments of every parameter).
    pub fn state_len(&self) -> usize {
        self.m.len() + self.v.len()
    }

    /// One update from the accumulated gradients (which it leaves alone).
    pub fn step(&mut self, model: &mut dyn Parameters) -> Result<()> {
        self.step += 1;
        let (cfg, step) = (self.cfg, self.step);
        let (ms, vs) = (&mut self.m, &mut self.v);
        visit_flat(model, ms.len(), &mut |off, p| {
            let n = p.value.numel();
            let h = cfg.update(step, p.decay);
            let (m, v) = (&mut ms[off..off + n], &mut vs[off..off + n]);
            adamw_update(p.value.data_mut(), p.grad.data(), m, v, &h);
        })
    }
}

// `AdamWUpdate` is the backends' word (`backend.rs` in `pipewright-kernels-core`, which knows
// nothing of the optimizer); its constructor from the optimizer's hyper-parameters lives here,
// with them (a method of the config: the orphan rule keeps inherent impls in the type's crate).
impl AdamWConfig {
    /// The update of step `step` (1-based) for a parameter with `decay` set or not.
    pub fn update(&self, step: u32, decay: bool) -> AdamWUpdate {
        let c = self;
        AdamWUpdate {
            lr: c.lr,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            shrink: if decay {
                1.0 - c.lr * c.weight_decay
            } else {
                1.0
            },
            bc1: 1.0 - c.beta1.powi(step as i32),
            bc2: 1.0 - c.beta2.powi(step as i32),
        }
    }
}

/// AdamW on any backend: [`AdamW`]'s update, with the moments kept next to
/// the parameters (one pair of tensors per parameter, on the device) and
/// each step run by [`Backend::adamw_step`]. On [`crate::Cpu`] it matches
/// [`AdamW`] to the bit.
#[derive(Debug)]
pub struct DeviceAdamW<B: Backend> {
    /// Hyper-parameters.
    pub cfg: AdamWConfig,
    step: u32,
    moments: Vec<(B::Storage, B::Storage)>,
}

impl<B: Backend> DeviceAdamW<B> {
    /// Zero moments on `be` for every parameter of `model`.
    pub fn new<P: Parameters<B::Storage> + ?Sized>(
        be: &B,
        model: &P,
        cfg: AdamWConfig,
    ) -> Result<Self> {
        let mut moments = Vec::new();
        let mut err = None;
        model.visit(&mut |p| {
            let pair = be
                .zeros(p.value.shape())
                .and_then(|m| Ok((m, be.zeros(p.value.shape())?)));
            match pair {
                Ok(pair) => moments.push(pair),
                Err(e) => err = err.take().or(Some(e)),
            }
        });
        err.map_or(Ok(()), Err)?;
        Ok(Self {
            cfg,
            step: 0,
            moments,
        })
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u32 {
        self.step
    }

    /// Values of optimizer state held (both moments of every parameter).
    pub fn state_len(&self) -> usize {
        self.moments
            .iter()
            .map(|(m, v)| m.numel() + v.numel())
            .sum()
    }

    /// One update from the accumulated gradients (which it leaves alone);
    /// errors if `model` is not the one the optimizer was made for.
    pub fn step<P: Parameters<B::Storage> + ?Sized>(
        &mut self,
        be: &B,
        model: &mut P,
    ) -> Result<()> {
        let mut count = 0;
        model.visit(&mut |_| count += 1);
        if count != self.moments.len() {
            return Err(KernelError::Config(format!(
                "optimizer state holds {} tensors, model has {count} parameters",
                self.moments.len()
            )));
        }
        self.step += 1;
        let (cfg, step) = (self.cfg, self.step);
        let mut state = self.moments.iter_mut();
        let mut err = None;
        model.visit_mut(&mut |p| {
            let Some((m, v)) = state.next() else { return };
            let h = cfg.update(step, p.decay);
            let r = if m.shape() == p.value.shape() {
                be.adamw_step(&mut p.value, &p.grad, m, v, &h)
            } else {
                Err(shape_err(
                    "DeviceAdamW::step",
                    format!("{} changed shape", p.name),
                ))
            };
            if let (None, Err(e)) = (&err, r) {
                err = Some(e);
            }
        });
        err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::Linear;
    use crate::tensor::Tensor;

    fn one_weight(v: f32, g: f32) -> Linear {
        let mut l = Linear::new("l", Tensor::new(&[1, 1], vec![v]).unwrap(), None).unwrap();
        l.weight.grad.data_mut()[0] = g;
        l
    }

    #[test]
    fn sgd_momentum_matches_hand_computation() {
        let mut l = one_weight(1.0, 0.5);
        let mut opt = Sgd::new(1, 0.1, 0.9);
        opt.step(&mut l).unwrap(); // v = 0.5, p = 0.95
        opt.step(&mut l).unwrap(); // v = 0.95, p = 0.855
        assert!((l.weight.value.data()[0] - 0.855).abs() < 1e-6);
    }

    #[test]
    fn adamw_first_step_moves_by_lr() {
        // With bias correction the first step is lr * sign(g) (eps aside),
        // after the decoupled decay p *= 1 - lr wd.
        let mut l = one_weight(2.0, -3.0);
        let cfg = AdamWConfig {
            lr: 0.1,
            weight_decay: 0.5,
            ..Default::default()
        };
        let mut opt = AdamW::new(1, cfg);
        opt.step(&mut l).unwrap();
        let want = 2.0 * (1.0 - 0.05) + 0.1;
        assert!((l.weight.value.data()[0] - want).abs() < 1e-5);
        assert!(AdamW::new(2, cfg).step(&mut l).is_err());
    }
}
