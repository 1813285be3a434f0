//! AdamW on one shard of a module's flat parameters (ZeRO-1): each data-parallel rank keeps
//! the moments of a contiguous range of the flat view ([`crate::params::flat_grads`]'s
//! layout) and updates only those values.
//!
//! A range cuts through parameters, so the shard is held as pieces, one per parameter it
//! overlaps, each with its own decay flag: the update of every value is [`super::AdamW`]'s,
//! with the same scalars, so the values it produces are the whole optimizer's to the bit.
//!
//! Mixed precision fits here without changing the runtime: a module whose parameters are
//! stored in bf16 would keep an f32 master copy of its range beside the moments (made from
//! the values on the first step), update that, and hand back the shard in storage precision
//! for the all-gather; the master weights are then sharded too.

use std::ops::Range;

use crate::backend::{Backend, Shaped};
use crate::error::{KernelError, Result};
use crate::layers::Parameters;
use crate::optim::AdamWConfig;

/// The part of one parameter a shard covers.
#[derive(Debug)]
struct Piece<S> {
    /// Which parameter, in visit order.
    param: usize,
    /// Offset of the piece inside its parameter.
    within: usize,
    /// Offset of the piece inside the shard.
    at: usize,
    len: usize,
    decay: bool,
    m: S,
    v: S,
}

/// AdamW's state for `range` of a module's flat parameters, on any backend.
#[derive(Debug)]
pub struct ShardedAdamW<B: Backend> {
    /// Hyper-parameters.
    pub cfg: AdamWConfig,
    range: Range<usize>,
    numel: usize,
    step: u32,
    pieces: Vec<Piece<B::Storage>>,
}

impl<B: Backend> ShardedAdamW<B> {
    /// Zero moments on `be` for `range` of `model`'s flat parameters.
    pub fn new<P: Parameters<B::Storage> + ?Sized>(
        be: &B,
        model: &P,
        range: Range<usize>,
        cfg: AdamWConfig,
    ) -> Result<Self> {
        let numel = model.num_params();
        if range.start > range.end || range.end > numel {
            return Err(KernelError::Config(format!(
                "optimizer shard {range:?} of a module of {numel} parameters"
            )));
        }
        let mut spans = Vec::new();
        let (mut off, mut param) = (0, 0);
        model.visit(&mut |p| {
            let n = p.value.numel();
            let (lo, hi) = (off.max(range.start), (off + n).min(range.end));
            if lo < hi {
                spans.push((param, lo - off, lo - range.start, hi - lo, p.decay));
            }
            off += n;
            param += 1;
        });
        let pieces = spans
            .into_iter()
            .map(|(param, within, at, len, decay)| {
                Ok(Piece {
                    param,
                    within,
                    at,
                    len,
                    decay,
                    m: be.zeros(&[len])?,
                    v: be.zeros(&[len])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg,
            range,
            numel,
            step: 0,
            pieces,
        })
    }

    /// The range of the flat parameters this shard updates.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u32 {
        self.step
    }

    /// Values of optimizer state held: two moments per value of the range.
    pub fn state_len(&self) -> usize {
        self.pieces.iter().map(|p| 2 * p.len).sum()
    }

    /// One update of the range from `grads`, the reduced gradients of the range alone (flat,
    /// `range.len()` values). The module's parameters are read, not written: the updated
    /// values of the range come back flat, for the all-gather that sets every replica's
    /// ([`crate::params::set_flat_params`]).
    pub fn step<P: Parameters<B::Storage> + ?Sized>(
        &mut self,
        be: &B,
        model: &P,
        grads: &B::Storage,
    ) -> Result<B::Storage> {
        let n = self.range.len();
        if grads.numel() != n || model.num_params() != self.numel {
            return Err(KernelError::Config(format!(
                "optimizer shard {:?} of {} parameters got {} gradients for a module of {}",
                self.range,
                self.numel,
                grads.numel(),
                model.num_params()
            )));
        }
        let mut values = Vec::with_capacity(self.pieces.len());
        let (mut next, mut param) = (0, 0);
        model.visit(&mut |p| {
            if let Some(piece) = self.pieces.get(next).filter(|pc| pc.param == param) {
                let x = be.zeros(&[piece.len]);
                values.push(x.and_then(|mut x| {
                    be.copy_from_offset(&p.value, piece.within, &mut x)
                        .map(|()| x)
                }));
                next += 1;
            }
            param += 1;
        });
        let values = values.into_iter().collect::<Result<Vec<_>>>()?;
        self.step += 1;
        let mut out = be.zeros(&[n])?;
        for (piece, mut x) in self.pieces.iter_mut().zip(values) {
            let mut g = be.zeros(&[piece.len])?;
            be.copy_from_offset(grads, piece.at, &mut g)?;
            let h = self.cfg.update(self.step, piece.decay);
            be.adamw_step(&mut x, &g, &mut piece.m, &mut piece.v, &h)?;
            be.copy_to_offset(&x, &mut out, piece.at)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::{GptConfig, GptStage};
    use crate::optim::AdamW;
    use crate::{params, Cpu, Tensor};

    /// Every cut of 2, 3 and 4 shards (uneven ones included) steps to the whole AdamW's
    /// parameters, to the bit, over three steps; the state held is the range's two moments.
    #[test]
    fn shards_step_to_the_whole_optimizers_bits() {
        let cfg = GptConfig::new(11, 4, 8, 2, 1);
        let adam = AdamWConfig::default();
        for d in 2..=4 {
            let mut whole = GptStage::whole(&cfg, 3).unwrap();
            let mut sharded = GptStage::whole(&cfg, 3).unwrap();
            let n = whole.num_params();
            let chunk = n.div_ceil(d);
            let ranges: Vec<_> = (0..d)
                .map(|r| (r * chunk).min(n)..((r + 1) * chunk).min(n))
                .collect();
            let mut reference = AdamW::new(n, adam);
            let mut shards: Vec<_> = ranges
                .iter()
                .map(|r| ShardedAdamW::new(&Cpu, &sharded, r.clone(), adam).unwrap())
                .collect();
            let held: usize = shards.iter().map(ShardedAdamW::state_len).sum();
            assert_eq!(held, 2 * n);
            for step in 0..3 {
                let g: Vec<f32> = (0..n)
                    .map(|i| ((i * 7 + step * 13) % 17) as f32 / 17.0 - 0.4)
                    .collect();
                whole.set_flat_grads(&g).unwrap();
                reference.step(&mut whole).unwrap();
                let mut flat = Vec::with_capacity(n);
                for (opt, r) in shards.iter_mut().zip(&ranges) {
                    let gs = Tensor::new(&[r.len()], g[r.clone()].to_vec()).unwrap();
                    flat.extend(opt.step(&Cpu, &sharded, &gs).unwrap().into_data());
                }
                let flat = Tensor::new(&[n], flat).unwrap();
                params::set_flat_params(&Cpu, &mut sharded, &flat).unwrap();
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                assert_eq!(
                    bits(whole.flat_params()),
                    bits(sharded.flat_params()),
                    "d = {d}, step {step}"
                );
            }
        }
    }

    #[test]
    fn a_range_outside_the_module_or_wrong_gradients_are_refused() {
        let cfg = GptConfig::new(11, 4, 8, 2, 1);
        let m = GptStage::whole(&cfg, 3).unwrap();
        let n = m.num_params();
        let adam = AdamWConfig::default();
        assert!(ShardedAdamW::new(&Cpu, &m, 0..n + 1, adam).is_err());
        let mut opt = ShardedAdamW::new(&Cpu, &m, 2..5, adam).unwrap();
        assert!(opt.step(&Cpu, &m, &Tensor::zeros(&[4])).is_err());
    }
}
