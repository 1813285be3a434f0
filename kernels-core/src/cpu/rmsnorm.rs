//! RMS normalisation over the last dimension (Zhang and Sennrich 2019): no
//! mean is removed and there is no shift, `y = x / rms(x) * gamma` with
//! `rms(x) = sqrt(mean(x^2) + eps)`. Its stash has LayerNorm's form: the
//! normalised input `x̂ = x / rms(x)` and `1 / rms(x)` per row.

use super::layernorm::{check_params, LayerNormStash};
use crate::error::{shape_err, Result};
use crate::tensor::Tensor;

/// `y = x * rstd * gamma` per row, `rstd = 1 / sqrt(mean(x^2) + eps)`
/// (accumulated in f64, as [`layer_norm`](super::layer_norm)).
pub fn rms_norm(x: &Tensor, gamma: &Tensor, eps: f32) -> Result<(Tensor, LayerNormStash)> {
    check_params("rms_norm", x, gamma)?;
    let n = x.cols();
    let mut xhat = vec![0.0f32; x.numel()];
    let mut y = vec![0.0f32; x.numel()];
    let mut rstd = Vec::with_capacity(x.rows());
    if n > 0 {
        let rows = x.data().chunks_exact(n).zip(xhat.chunks_exact_mut(n));
        for ((row, xh), yr) in rows.zip(y.chunks_exact_mut(n)) {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
            let r = (1.0 / (ms + eps as f64).sqrt()) as f32;
            for (j, &v) in row.iter().enumerate() {
                xh[j] = v * r;
                yr[j] = xh[j] * gamma.data()[j];
            }
            rstd.push(r);
        }
    }
    let shape = x.shape().to_vec();
    let stash = LayerNormStash {
        xhat: Tensor::from_parts(shape.clone(), xhat),
        rstd,
    };
    Ok((Tensor::from_parts(shape, y), stash))
}

/// Input gradient (I): `dx = rstd * (g - xhat * mean(g * xhat))` with
/// `g = dy * gamma`, from the stash's two parts.
pub fn rms_norm_backward_input_from(
    dy: &Tensor,
    gamma: &Tensor,
    xhat: &Tensor,
    rstd: &[f32],
) -> Result<Tensor> {
    check_params("rms_norm_backward_input", dy, gamma)?;
    dy.check_same("rms_norm_backward_input", xhat)?;
    if rstd.len() != dy.rows() {
        return Err(shape_err(
            "rms_norm_backward_input",
            format!("{} row statistics for {} rows", rstd.len(), dy.rows()),
        ));
    }
    let n = dy.cols();
    let mut dx = vec![0.0f32; dy.numel()];
    if n == 0 {
        return Ok(Tensor::from_parts(dy.shape().to_vec(), dx));
    }
    let rows = dy.data().chunks_exact(n).zip(xhat.data().chunks_exact(n));
    for (((dyr, xh), dxr), &r) in rows.zip(dx.chunks_exact_mut(n)).zip(rstd) {
        let sum_gx: f64 = (0..n)
            .map(|j| (dyr[j] * gamma.data()[j]) as f64 * xh[j] as f64)
            .sum();
        let mgx = (sum_gx / n as f64) as f32;
        for j in 0..n {
            dxr[j] = r * (dyr[j] * gamma.data()[j] - xh[j] * mgx);
        }
    }
    Ok(Tensor::from_parts(dy.shape().to_vec(), dx))
}

/// Weight gradient (W): `dgamma += sum(dy * xhat)` over rows.
pub fn rms_norm_backward_weight(dy: &Tensor, xhat: &Tensor, dgamma: &mut Tensor) -> Result<()> {
    dy.check_same("rms_norm_backward_weight", xhat)?;
    check_params("rms_norm_backward_weight", dy, dgamma)?;
    let n = dy.cols();
    if n == 0 {
        return Ok(());
    }
    let dg = dgamma.data_mut();
    for (dyr, xh) in dy.data().chunks_exact(n).zip(xhat.data().chunks_exact(n)) {
        for j in 0..n {
            dg[j] += dyr[j] * xh[j];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_unit_root_mean_square() {
        let x = Tensor::new(&[2, 4], vec![1.0, 2.0, 3.0, 4.0, -5.0, 5.0, -5.0, 5.0]).unwrap();
        let g = Tensor::new(&[4], vec![1.0; 4]).unwrap();
        let (y, s) = rms_norm(&x, &g, 0.0).unwrap();
        for row in y.data().chunks(4) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 4.0;
            assert!((ms - 1.0).abs() < 1e-5);
        }
        assert_eq!(s.rstd[1], 0.2);
        assert!(rms_norm(&x, &Tensor::zeros(&[3]), 1e-5).is_err());
    }
}
