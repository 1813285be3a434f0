//! Bias add, GeLU and residual add, with their backward passes.

use crate::error::{shape_err, Result};
use crate::tensor::Tensor;

fn check_bias(op: &'static str, x: &Tensor, b: &Tensor) -> Result<()> {
    if b.shape() != [x.cols()] {
        return Err(shape_err(
            op,
            format!("bias {:?} for rows of {:?}", b.shape(), x.shape()),
        ));
    }
    Ok(())
}

/// Adds `b` (`[n]`) to every row of `x` (`[.., n]`), in place.
///
/// Backward: the input gradient is the output gradient unchanged; the bias
/// gradient is [`bias_grad_acc`].
pub fn add_bias(x: &mut Tensor, b: &Tensor) -> Result<()> {
    check_bias("add_bias", x, b)?;
    let n = x.cols();
    if n == 0 {
        return Ok(());
    }
    for row in x.data_mut().chunks_exact_mut(n) {
        for (v, bi) in row.iter_mut().zip(b.data()) {
            *v += bi;
        }
    }
    Ok(())
}

/// `acc += column sums of dy`: the bias gradient of [`add_bias`].
pub fn bias_grad_acc(dy: &Tensor, acc: &mut Tensor) -> Result<()> {
    check_bias("bias_grad_acc", dy, acc)?;
    let n = dy.cols();
    if n == 0 {
        return Ok(());
    }
    let acc = acc.data_mut();
    for row in dy.data().chunks_exact(n) {
        for (a, g) in acc.iter_mut().zip(row) {
            *a += g;
        }
    }
    Ok(())
}

/// sqrt(2 / pi), the constant of the tanh approximation.
const GELU_C: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh approximation.
const GELU_A: f32 = 0.044_715;

/// `tanh` through one `exp`: `1 - 2 / (e^{2u} + 1)`. libm's `tanhf` is
/// several times slower and GeLU runs on every MLP hidden unit; the absolute
/// error here is below 2e-7, and the limits (+-1) come out exactly.
#[inline]
fn fast_tanh(u: f32) -> f32 {
    1.0 - 2.0 / ((2.0 * u).exp() + 1.0)
}

/// GeLU by the tanh approximation (as in GPT-2 and PyTorch's
/// `approximate="tanh"`): `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
/// It differs from the exact erf form by under 1e-3 and is cheaper.
pub fn gelu(x: &Tensor) -> Tensor {
    let data = x.data().iter().map(|&v| gelu_value(v)).collect();
    Tensor::from_parts(x.shape().to_vec(), data)
}

/// GeLU of one value (the tanh form of [`gelu`]).
#[inline]
pub(crate) fn gelu_value(v: f32) -> f32 {
    0.5 * v * (1.0 + fast_tanh(GELU_C * (v + GELU_A * v * v * v)))
}

/// The derivative of [`gelu_value`] at `v`.
#[inline]
pub(crate) fn gelu_slope(v: f32) -> f32 {
    let t = fast_tanh(GELU_C * (v + GELU_A * v * v * v));
    let dt = (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * v * v);
    0.5 * (1.0 + t) + 0.5 * v * dt
}

/// Input gradient of [`gelu`]: `dy * gelu'(x)`, with `x` the forward input.
pub fn gelu_backward(x: &Tensor, dy: &Tensor) -> Result<Tensor> {
    x.check_same("gelu_backward", dy)?;
    let data = x
        .data()
        .iter()
        .zip(dy.data())
        .map(|(&v, &g)| g * gelu_slope(v))
        .collect();
    Ok(Tensor::from_parts(x.shape().to_vec(), data))
}

/// Residual add `a + b`. Its backward sends the output gradient to both
/// inputs unchanged, so it needs no function of its own.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mut out = a.clone();
    out.add_assign(b)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_known_values() {
        let x = Tensor::new(&[3], vec![0.0, 1.0, -3.0]).unwrap();
        let y = gelu(&x);
        // Reference values of the tanh form (PyTorch, approximate="tanh").
        let want = [0.0, 0.841_192, -0.003_637_4];
        for (a, b) in y.data().iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn fast_tanh_matches_libm() {
        for i in -2000..=2000 {
            let u = i as f32 * 0.01;
            assert!((fast_tanh(u) - u.tanh()).abs() < 2e-7, "{u}");
        }
        assert_eq!((fast_tanh(100.0), fast_tanh(-100.0)), (1.0, -1.0));
    }

    #[test]
    fn bias_round_trip() {
        let mut x = Tensor::zeros(&[2, 3]);
        let b = Tensor::new(&[3], vec![1.0, 2.0, 3.0]).unwrap();
        add_bias(&mut x, &b).unwrap();
        assert_eq!(x.data(), &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
        let mut acc = Tensor::zeros(&[3]);
        bias_grad_acc(&x, &mut acc).unwrap();
        assert_eq!(acc.data(), &[2.0, 4.0, 6.0]);
        assert!(add_bias(&mut x, &Tensor::zeros(&[2])).is_err());
    }
}
