//! Gated linear units (Shazeer 2020, "GLU Variants Improve Transformer"): the
//! gated MLP's activation, `a = act(gate) * up`, with SiLU (SwiGLU, as in
//! Llama, Mistral and Qwen) or GeLU (GeGLU, in its tanh form as in Gemma).
//!
//! Layout: the fused pre-activation `h` is `[.., 2 * f]`, each row holding the
//! gate columns then the up columns (`[gate_0 .. gate_{f-1} | up_0 ..]`); the
//! output is `[.., f]`. The gated MLP computes `h` with one matmul of a fused
//! `[d, 2 * f]` weight, so this one op sits between its two linears.

use super::elementwise::{gelu_slope, gelu_value};
use crate::error::{shape_err, Result};
use crate::tensor::Tensor;

/// Which activation gates the up projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluKind {
    /// `silu(g) * u`, `silu(g) = g * sigmoid(g)`.
    SwiGlu,
    /// `gelu(g) * u` (tanh form, as [`gelu`](super::gelu)).
    GeGlu,
}

impl GluKind {
    /// The activation of one gate value and its derivative.
    #[inline]
    fn act(self, g: f32) -> (f32, f32) {
        match self {
            GluKind::SwiGlu => {
                let s = 1.0 / (1.0 + (-g).exp());
                (g * s, s * (1.0 + g * (1.0 - s)))
            }
            GluKind::GeGlu => (gelu_value(g), gelu_slope(g)),
        }
    }

    /// The kernels' code of the kind (`act` of the CUDA source).
    pub fn code(self) -> i32 {
        match self {
            GluKind::SwiGlu => 0,
            GluKind::GeGlu => 1,
        }
    }
}

/// Width `f` of the output rows of a fused `[.., 2f]` pre-activation.
pub fn half_width(op: &'static str, shape: &[usize]) -> Result<usize> {
    let cols = shape.last().copied().unwrap_or(0);
    if shape.is_empty() || cols % 2 != 0 {
        return Err(shape_err(
            op,
            format!("{shape:?} is not [.., gate | up] of two equal halves"),
        ));
    }
    Ok(cols / 2)
}

/// `act(gate) * up` per row of the fused `h` (`[.., 2f]` in, `[.., f]` out).
pub fn glu(h: &Tensor, kind: GluKind) -> Result<Tensor> {
    let f = half_width("glu", h.shape())?;
    let mut out = Vec::with_capacity(h.numel() / 2);
    if f > 0 {
        for row in h.data().chunks_exact(2 * f) {
            let (gate, up) = row.split_at(f);
            out.extend(gate.iter().zip(up).map(|(&g, &u)| kind.act(g).0 * u));
        }
    }
    let mut shape = h.shape().to_vec();
    *shape.last_mut().expect("checked non-empty") = f;
    Ok(Tensor::from_parts(shape, out))
}

/// The gradient of the fused `h` from the output gradient `da`:
/// `dgate = da * up * act'(gate)`, `dup = da * act(gate)`.
pub fn glu_backward(h: &Tensor, da: &Tensor, kind: GluKind) -> Result<Tensor> {
    let f = half_width("glu_backward", h.shape())?;
    if da.numel() * 2 != h.numel() || da.shape().last() != Some(&f) {
        return Err(shape_err(
            "glu_backward",
            format!(
                "gradient {:?} for pre-activation {:?}",
                da.shape(),
                h.shape()
            ),
        ));
    }
    let mut dh = vec![0.0f32; h.numel()];
    if f > 0 {
        let rows = h.data().chunks_exact(2 * f).zip(da.data().chunks_exact(f));
        for ((row, d), out) in rows.zip(dh.chunks_exact_mut(2 * f)) {
            let (gate, up) = row.split_at(f);
            let (dgate, dup) = out.split_at_mut(f);
            for j in 0..f {
                let (a, slope) = kind.act(gate[j]);
                dgate[j] = d[j] * up[j] * slope;
                dup[j] = d[j] * a;
            }
        }
    }
    Ok(Tensor::from_parts(h.shape().to_vec(), dh))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_known_values_and_shapes() {
        // Rows [g0 g1 | u0 u1]: silu(0) = 0, silu(1) = 0.731059, silu(-2) = -0.238406.
        let h = Tensor::new(&[2, 4], vec![0.0, 1.0, 5.0, 2.0, -2.0, 1.0, 1.0, -1.0]).unwrap();
        let a = glu(&h, GluKind::SwiGlu).unwrap();
        assert_eq!(a.shape(), &[2, 2]);
        let want = [0.0, 2.0 * 0.731_059, -0.238_406, -0.731_059];
        for (x, w) in a.data().iter().zip(want) {
            assert!((x - w).abs() < 1e-5, "{x} vs {w}");
        }
        assert!(glu(&Tensor::zeros(&[2, 3]), GluKind::GeGlu).is_err());
        assert!(glu_backward(&h, &Tensor::zeros(&[2, 3]), GluKind::SwiGlu).is_err());
    }
}
