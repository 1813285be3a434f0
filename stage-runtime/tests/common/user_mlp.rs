//! A user's own model for the tests: a list of dense layers (runtime::split::Layer) with an
//! MSE loss, as `LayerStage`s; a pure function of its layer count.

use std::ops::Range;

use pipewright_kernels::init::normal_tensor;
use pipewright_kernels::layers::{Linear, Parameters};
use pipewright_kernels::Tensor;
use pipewright_runtime::split::{BoxedLayer, Layer, LayerStage, LossFn};
use pipewright_runtime::{MicrobatchId, ModuleError};

/// A dense layer with an optional ReLU, as a user would write it.
#[derive(Parameters)]
#[parameters(lin)]
pub struct Dense {
    lin: Linear,
    relu: bool,
}

pub fn dense(k: usize, i: usize, o: usize, relu: bool) -> BoxedLayer {
    let w = normal_tensor(&[i, o], (1.0 / i as f32).sqrt(), 5, &format!("w{k}"));
    let lin = Linear::new(&format!("l{k}"), w, Some(Tensor::zeros(&[o]))).unwrap();
    Box::new(Dense { lin, relu })
}

impl Layer for Dense {
    /// Input and output.
    type Stash = (Tensor, Tensor);
    /// Input and output gradient.
    type WeightStash = (Tensor, Tensor);

    fn forward(&mut self, x: &Tensor) -> Result<(Tensor, Self::Stash), ModuleError> {
        let mut y = self.lin.forward(x)?;
        if self.relu {
            y.data_mut().iter_mut().for_each(|v| *v = v.max(0.0));
        }
        Ok((y.clone(), (x.clone(), y)))
    }

    fn backward_input(
        &mut self,
        (x, y): Self::Stash,
        dy: &Tensor,
    ) -> Result<(Tensor, Self::WeightStash), ModuleError> {
        let mut dy = dy.clone();
        if self.relu {
            let mask = y.data().iter().map(|&v| f32::from(v > 0.0));
            dy.data_mut()
                .iter_mut()
                .zip(mask)
                .for_each(|(d, m)| *d *= m);
        }
        Ok((self.lin.backward_input(&dy)?, (x, dy)))
    }

    fn backward_weight(&mut self, (x, dy): Self::WeightStash) -> Result<(), ModuleError> {
        Ok(self.lin.backward_weight(&x, &dy)?)
    }
}

/// Layer `k` of `n`: widths vary so parameters and times differ between layers.
pub fn layer(k: usize, n: usize) -> BoxedLayer {
    let width = |k: usize| if k == 0 { 4 } else { 8 + 8 * (k % 3) };
    let out = if k + 1 == n { 1 } else { width(k + 1) };
    dense(k, width(k), out, k + 1 < n)
}

pub fn model(n: usize) -> Vec<BoxedLayer> {
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
    Box::new(|out: &Tensor, rows: &Rows| {
        let s = 1.0 / rows.1.len() as f32;
        let err: Vec<f32> = out.data().iter().zip(&rows.1).map(|(p, t)| p - t).collect();
        let loss = s * err.iter().map(|e| e * e).sum::<f32>();
        let grad = Tensor::new(out.shape(), err.iter().map(|e| 2.0 * s * e).collect())?;
        Ok((loss, grad))
    })
}

pub fn stage(range: Range<usize>, n: usize) -> LayerStage<Rows> {
    let first = range.start == 0;
    let last = range.end == n;
    let input = first.then(|| Box::new(|r: &Rows| Ok(r.0.clone())) as Box<_>);
    let layers = range.map(|k| layer(k, n)).collect();
    LayerStage::new(layers, input, last.then(mse))
}
