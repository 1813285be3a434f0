//! Layer normalisation over the last dimension, with the backward split into
//! an input part (I) and a weight part (W).

use crate::error::{shape_err, Result};
use crate::footprint::{Footprint, F32};
use crate::tensor::Tensor;

/// What the backward passes need from a [`layer_norm`] forward.
#[derive(Clone, Debug)]
pub struct LayerNormStash {
    /// The normalised input `(x - mean) * rstd`, shape of `x`.
    pub xhat: Tensor,
    /// `1 / sqrt(var + eps)` per row.
    pub rstd: Vec<f32>,
}

impl Footprint for LayerNormStash {
    fn bytes(&self) -> usize {
        self.xhat.bytes() + self.rstd.len() * F32
    }
}

pub(super) fn check_params(op: &'static str, x: &Tensor, gamma: &Tensor) -> Result<()> {
    if gamma.shape() != [x.cols()] {
        return Err(shape_err(
            op,
            format!("gamma {:?} for rows of {:?}", gamma.shape(), x.shape()),
        ));
    }
    Ok(())
}

/// `y = (x - mean) / sqrt(var + eps) * gamma + beta`, per row of `x`
/// (biased variance, as PyTorch). Statistics are accumulated in f64 so that
/// large-mean rows do not lose precision.
pub fn layer_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<(Tensor, LayerNormStash)> {
    check_params("layer_norm", x, gamma)?;
    check_params("layer_norm", x, beta)?;
    let n = x.cols();
    let mut xhat = vec![0.0f32; x.numel()];
    let mut y = vec![0.0f32; x.numel()];
    let mut rstd = Vec::with_capacity(x.rows());
    for ((row, xh), yr) in x
        .data()
        .chunks_exact(n)
        .zip(xhat.chunks_exact_mut(n))
        .zip(y.chunks_exact_mut(n))
    {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let r = (1.0 / (var + eps as f64).sqrt()) as f32;
        let mean = mean as f32;
        for (j, &v) in row.iter().enumerate() {
            xh[j] = (v - mean) * r;
            yr[j] = xh[j] * gamma.data()[j] + beta.data()[j];
        }
        rstd.push(r);
    }
    let shape = x.shape().to_vec();
    let stash = LayerNormStash {
        xhat: Tensor::from_parts(shape.clone(), xhat),
        rstd,
    };
    Ok((Tensor::from_parts(shape, y), stash))
}

/// Input gradient (I):
/// `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` with `g = dy * gamma`.
pub fn layer_norm_backward_input(
    dy: &Tensor,
    gamma: &Tensor,
    stash: &LayerNormStash,
) -> Result<Tensor> {
    layer_norm_backward_input_from(dy, gamma, &stash.xhat, &stash.rstd)
}

/// [`layer_norm_backward_input`] from the stash's two parts, wherever they are kept (a
/// backend may hold `xhat` in a narrower format and widen it for the backward).
pub fn layer_norm_backward_input_from(
    dy: &Tensor,
    gamma: &Tensor,
    xhat: &Tensor,
    rstd: &[f32],
) -> Result<Tensor> {
    check_params("layer_norm_backward_input", dy, gamma)?;
    dy.check_same("layer_norm_backward_input", xhat)?;
    if rstd.len() != dy.rows() {
        return Err(shape_err(
            "layer_norm_backward_input",
            format!("{} row statistics for {} rows", rstd.len(), dy.rows()),
        ));
    }
    let n = dy.cols();
    let mut dx = vec![0.0f32; dy.numel()];
    let rows = dy.data().chunks_exact(n).zip(xhat.data().chunks_exact(n));
    for (((dyr, xh), dxr), &r) in rows.zip(dx.chunks_exact_mut(n)).zip(rstd) {
        let (mut sum_g, mut sum_gx) = (0.0f64, 0.0f64);
        for j in 0..n {
            let g = (dyr[j] * gamma.data()[j]) as f64;
            sum_g += g;
            sum_gx += g * xh[j] as f64;
        }
        let (mg, mgx) = ((sum_g / n as f64) as f32, (sum_gx / n as f64) as f32);
        for j in 0..n {
            dxr[j] = r * (dyr[j] * gamma.data()[j] - mg - xh[j] * mgx);
        }
    }
    Ok(Tensor::from_parts(dy.shape().to_vec(), dx))
}

/// Weight gradient (W): `dgamma += sum(dy * xhat)`, `dbeta += sum(dy)` over rows.
pub fn layer_norm_backward_weight(
    dy: &Tensor,
    xhat: &Tensor,
    dgamma: &mut Tensor,
    dbeta: &mut Tensor,
) -> Result<()> {
    dy.check_same("layer_norm_backward_weight", xhat)?;
    check_params("layer_norm_backward_weight", dy, dgamma)?;
    check_params("layer_norm_backward_weight", dy, dbeta)?;
    let n = dy.cols();
    let (dg, db) = (dgamma.data_mut(), dbeta.data_mut());
    for (dyr, xh) in dy.data().chunks_exact(n).zip(xhat.data().chunks_exact(n)) {
        for j in 0..n {
            dg[j] += dyr[j] * xh[j];
            db[j] += dyr[j];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_rows() {
        let x = Tensor::new(&[2, 4], vec![1.0, 2.0, 3.0, 4.0, -5.0, 5.0, -5.0, 5.0]).unwrap();
        let g = Tensor::new(&[4], vec![1.0; 4]).unwrap();
        let b = Tensor::zeros(&[4]);
        let (y, _) = layer_norm(&x, &g, &b, 0.0).unwrap();
        for row in y.data().chunks(4) {
            let mean: f32 = row.iter().sum::<f32>() / 4.0;
            let var: f32 = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
            assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5);
        }
        assert!(layer_norm(&x, &Tensor::zeros(&[3]), &b, 1e-5).is_err());
    }
}
