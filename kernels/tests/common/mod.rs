//! Helpers shared by the integration tests: random tensors, finite
//! differences, and a thread-based TP all-reduce that emulates a group.
#![allow(dead_code)]

use pipewright_kernels::init::normal_tensor;
use pipewright_kernels::layers::{Param, Parameters, TpReduce};
use pipewright_kernels::{Result, Tensor};
use std::sync::{Arc, Barrier, Mutex};

/// A random normal tensor; `tag` picks the stream.
pub fn randn(shape: &[usize], tag: &str) -> Tensor {
    normal_tensor(shape, 1.0, 1234, tag)
}

/// `sum(y * r)` in f64: a scalar loss whose gradient with respect to `y` is `r`.
pub fn dot(y: &Tensor, r: &Tensor) -> f64 {
    assert_eq!(y.shape(), r.shape());
    y.data()
        .iter()
        .zip(r.data())
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum()
}

/// Step of the central differences. Inputs are O(1), forwards run in f32:
/// roundoff in the loss is ~1e-6, so the derivative error is ~1e-4, and the
/// truncation error h^2 f''' / 6 is of the same order.
pub const H: f32 = 1e-2;

/// Asserts `|analytic - numeric| <= 2e-3 + 2e-2 * max(|a|, |n|)`.
pub fn assert_close(what: &str, analytic: f32, numeric: f64) {
    let (a, n) = (analytic as f64, numeric);
    let tol = 2e-3 + 2e-2 * a.abs().max(n.abs());
    assert!(
        (a - n).abs() <= tol,
        "{what}: analytic {a:.6} vs numeric {n:.6}"
    );
}

/// Indices `0..len` spread evenly, at most `k` of them.
pub fn sample(len: usize, k: usize) -> Vec<usize> {
    if len <= k {
        (0..len).collect()
    } else {
        (0..k)
            .map(|i| i * len / k + (i * 7919) % (len / k))
            .collect()
    }
}

/// Checks the gradient `analytic` of `loss` at `x` by central differences on
/// up to `k` coordinates.
pub fn check_input(
    what: &str,
    x: &Tensor,
    analytic: &Tensor,
    k: usize,
    mut loss: impl FnMut(&Tensor) -> f64,
) {
    assert_eq!(x.shape(), analytic.shape(), "{what}: gradient shape");
    for i in sample(x.numel(), k) {
        let mut xp = x.clone();
        xp.data_mut()[i] += H;
        let lp = loss(&xp);
        xp.data_mut()[i] -= 2.0 * H;
        let lm = loss(&xp);
        let numeric = (lp - lm) / (2.0 * H as f64);
        assert_close(&format!("{what}[{i}]"), analytic.data()[i], numeric);
    }
}

/// Checks the accumulated gradient of every parameter of `m` (up to `k`
/// coordinates each) against central differences of `loss`.
/// Returns how many coordinates were checked.
pub fn check_params<M: Parameters + Clone>(m: &M, k: usize, loss: impl Fn(&M) -> f64) -> usize {
    let mut params: Vec<Param> = Vec::new();
    m.visit(&mut |p| params.push(p.clone()));
    let mut checked = 0;
    for (pi, p) in params.iter().enumerate() {
        for i in sample(p.value.numel(), k) {
            let shifted = |delta: f32| {
                let mut c = m.clone();
                let mut j = 0;
                c.visit_mut(&mut |q| {
                    if j == pi {
                        q.value.data_mut()[i] += delta;
                    }
                    j += 1;
                });
                loss(&c)
            };
            let numeric = (shifted(H) - shifted(-H)) / (2.0 * H as f64);
            assert_close(&format!("{}[{i}]", p.name), p.grad.data()[i], numeric);
            checked += 1;
        }
    }
    checked
}

/// All (name, gradient) pairs of a module, in visit order.
pub fn grads<M: Parameters>(m: &M) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    m.visit(&mut |p| out.push((p.name.clone(), p.grad.clone())));
    out
}

struct Slots {
    parts: Mutex<Vec<Vec<f32>>>,
    barrier: Barrier,
}

/// One rank's handle on an in-process TP group of threads. Sums in rank
/// order, so every rank gets bit-identical results.
pub struct ThreadReduce {
    rank: usize,
    slots: Arc<Slots>,
}

impl ThreadReduce {
    /// Handles for a group of `size` threads.
    pub fn group(size: usize) -> Vec<ThreadReduce> {
        let slots = Arc::new(Slots {
            parts: Mutex::new(vec![Vec::new(); size]),
            barrier: Barrier::new(size),
        });
        (0..size)
            .map(|rank| ThreadReduce {
                rank,
                slots: slots.clone(),
            })
            .collect()
    }
}

impl TpReduce for ThreadReduce {
    fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<()> {
        self.slots.parts.lock().unwrap()[self.rank] = t.data().to_vec();
        self.slots.barrier.wait();
        {
            let parts = self.slots.parts.lock().unwrap();
            let out = t.data_mut();
            out.copy_from_slice(&parts[0]);
            for p in &parts[1..] {
                out.iter_mut().zip(p).for_each(|(o, v)| *o += v);
            }
        }
        // Nobody may overwrite a slot until every rank has read them all.
        self.slots.barrier.wait();
        Ok(())
    }

    fn all_gather(&mut self, t: &Tensor) -> Result<Vec<Tensor>> {
        self.slots.parts.lock().unwrap()[self.rank] = t.data().to_vec();
        self.slots.barrier.wait();
        let out = {
            let parts = self.slots.parts.lock().unwrap();
            parts
                .iter()
                .map(|p| Tensor::new(t.shape(), p.clone()))
                .collect::<Result<Vec<_>>>()
        };
        self.slots.barrier.wait();
        out
    }

    fn reduce_scatter_sum(&mut self, t: &Tensor) -> Result<Tensor> {
        // The all-reduce's sums, cut: the same bits.
        let mut whole = t.clone();
        self.all_reduce_sum(&mut whole)?;
        let n = whole.numel() / self.slots.barrier_size();
        let mine = whole.data()[self.rank * n..(self.rank + 1) * n].to_vec();
        Tensor::new(&[n], mine)
    }
}

impl Slots {
    fn barrier_size(&self) -> usize {
        self.parts.lock().unwrap().len()
    }
}
