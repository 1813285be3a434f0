//! A user's own model for the tests: a list of dense layers (runtime::split::Layer) with an
//! MSE loss, as `LayerStage`s; a pure function of its layer count.

use std::ops::Range;

use pipewright_kernels::init::normal_tensor;
use pipewright_kernels::layers::{Linear, Param, Parameters};
use pipewright_kernels::Tensor;
use pipewright_runtime::split::{Layer, LayerStage, LayerStash, LossFn};
use pipewright_runtime::{MicrobatchId, ModuleError};

/// A dense layer with an optional ReLU, as a user would write it.
pub struct Dense {
    lin: Linear,
    relu: bool,
}

pub fn dense(k: usize, i: usize, o: usize, relu: bool) -> Box<dyn Layer> {
    let w = normal_tensor(&[i, o], (1.0 / i as f32).sqrt(), 5, &format!("w{k}"));
    let lin = Linear::new(&format!("l{k}"), w, Some(Tensor::zeros(&[o]))).unwrap();
    Box::new(Dense { lin, relu })
}

impl Parameters for Dense {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        self.lin.visit(f)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Param)) {
        self.lin.visit_mut(f)
    }
}

impl Layer for Dense {
    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, LayerStash), ModuleError> {
        let mut y = self.lin.forward(x)?;
        if self.relu {
            y.data_mut().iter_mut().for_each(|v| *v = v.max(0.0));
        }
        Ok((y.clone(), Box::new((x.clone(), y))))
    }

    fn backward_input(
        &mut self,
        stash: LayerStash,
        dy: &Tensor,
    ) -> Result<(Tensor, LayerStash), ModuleError> {
        let (x, y) = *stash.downcast::<(Tensor, Tensor)>().map_err(|_| "stash")?;
        let mut dy = dy.clone();
        if self.relu {
            let mask = y.data().iter().map(|&v| f32::from(v > 0.0));
            dy.data_mut()
                .iter_mut()
                .zip(mask)
                .for_each(|(d, m)| *d *= m);
        }
        Ok((self.lin.backward_input(&dy)?, Box::new((x, dy))))
    }

    fn backward_weight(&mut self, stash: LayerStash) -> Result<(), ModuleError> {
        let (x, dy) = *stash.downcast::<(Tensor, Tensor)>().map_err(|_| "stash")?;
        Ok(self.lin.backward_weight(&x, &dy)?)
    }
}

/// Layer `k` of `n`: widths vary so parameters and times differ between layers.
pub fn layer(k: usize, n: usize) -> Box<dyn Layer> {
    let width = |k: usize| if k == 0 { 4 } else { 8 + 8 * (k % 3) };
    let out = if k + 1 == n { 1 } else { width(k + 1) };
    dense(k, width(k), out, k + 1 < n)
}

pub fn model(n: usize) -> Vec<Box<dyn Layer>> {
    (0..n).map(|k| layer(k, n)).collect()
}

/// Features and targets of one microbatch.
pub struct Rows(Tensor, Vec<f32>);

pub fn rows(id: MicrobatchId) -> Result<Rows, ModuleError> {
    let x = normal_tensor(&[8, 4], 1.0, id.step, &format!("x{}", id.global()));
    let y = x.data().chunks(4).map(|r| r[0] * r[1] - r[2]).collect();
    Ok(Rows(x, y))
}

pub fn mse() -> Box<LossFn<Rows>> {
    Box::new(|out: &Tensor, rows: &Rows, scale: f32| {
        let s = scale / rows.1.len() as f32;
        let err: Vec<f32> = out.data().iter().zip(&rows.1).map(|(p, t)| p - t).collect();
        let loss = s * err.iter().map(|e| e * e).sum::<f32>();
        let grad = Tensor::new(out.shape(), err.iter().map(|e| 2.0 * s * e).collect())?;
        Ok((loss, grad))
    })
}

pub fn stage(range: Range<usize>, n: usize) -> LayerStage<Rows> {
    let first = range.start == 0;
    let last = range.end == n;
    let input = first.then(|| Box::new(|r: &Rows| r.0.clone()) as Box<_>);
    let layers = range.map(|k| layer(k, n)).collect();
    LayerStage::new(layers, input, last.then(mse))
}
