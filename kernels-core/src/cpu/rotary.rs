//! Rotary position embeddings (RoPE; Su et al. 2021, "RoFormer"), applied in place to the
//! query and key heads of a fused `qkv` (layout of [`super::attention`]).
//!
//! Pairing: "rotate half", as Hugging Face's Llama, Mistral, Qwen2 and GPT-NeoX
//! (`apply_rotary_pos_emb`): in a head of width `dh`, dimension `i < dh/2` pairs with
//! `i + dh/2`, and the pair at position `p` turns by the angle `p * theta^(-2i/dh)`:
//!
//! ```text
//! y[i]        = x[i] cos - x[i + dh/2] sin
//! y[i + dh/2] = x[i + dh/2] cos + x[i] sin
//! ```
//!
//! Meta's reference Llama code pairs adjacent dimensions `(2i, 2i + 1)` instead; Hugging
//! Face's conversion permutes the Q and K projections' rows so that rotate-half on its
//! checkpoints is the same model. The configs `plan --hf-config` reads are Hugging Face's,
//! so their weights (and any model a user brings from them) expect rotate-half.
//!
//! The rotation of every pair is orthogonal, so the backward is the inverse rotation (the
//! angle negated), with no stashed activation: the gradient of `x` from that of `y` needs
//! only the positions.
//!
//! The angles' cosines and sines come from a table ([`rotary_table`]) computed in f64 and
//! rounded once to f32, the same numbers on every backend (Hugging Face computes the angles
//! in f32, within about `p * 2^-24` radians of these). Each output is `a * c - b * s` or
//! `a * c + b * s`: two rounded products and a rounded sum, no fused multiply-add, so a GPU
//! kernel written the same way returns the same bits.

use super::attention::AttnShape;
use crate::error::{shape_err, KernelError, Result};
use crate::tensor::Tensor;

/// The default base of the angles (`rope_theta`), Su et al.'s and Llama 2's.
pub const DEFAULT_THETA: f64 = 10_000.0;

/// Which way [`rotate`] turns: by the positions' angles (forward) or back (backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// By `+angle`: the forward.
    Forward,
    /// By `-angle`: the inverse, which is the backward (the rotation is orthogonal).
    Inverse,
}

/// Errors unless `theta` is a finite base above 0 and `head_dim` is even and positive.
pub fn check_config(head_dim: usize, theta: f64) -> Result<()> {
    if !(theta.is_finite() && theta > 0.0) {
        return Err(KernelError::Config(format!(
            "rotary positions need a finite base (rope_theta) above 0, got {theta}"
        )));
    }
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(KernelError::Config(format!(
            "rotary positions turn pairs of a head's dimensions: the head width {head_dim} is not even"
        )));
    }
    Ok(())
}

/// The table of `positions` rows `[cos_0 .. cos_{dh/2-1} | sin_0 .. sin_{dh/2-1}]`, shape
/// `[positions, head_dim]`: row `p` holds the cosines and sines of `p * theta^(-2i/dh)`.
pub fn rotary_table(positions: usize, head_dim: usize, theta: f64) -> Result<Tensor> {
    check_config(head_dim, theta)?;
    let half = head_dim / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| theta.powf(-((2 * i) as f64) / head_dim as f64))
        .collect();
    let mut data = vec![0.0f32; positions * head_dim];
    for (p, row) in data.chunks_exact_mut(head_dim).enumerate() {
        let (cos, sin) = row.split_at_mut(half);
        for (i, f) in inv_freq.iter().enumerate() {
            let angle = p as f64 * f;
            cos[i] = angle.cos() as f32;
            sin[i] = angle.sin() as f32;
        }
    }
    Tensor::new(&[positions, head_dim], data)
}

/// Checks a fused qkv of `shape` and a table of `table` for `sh` (shared with the CUDA
/// backend, which checks before it launches).
pub fn check(op: &'static str, shape: &[usize], table: &[usize], sh: AttnShape) -> Result<()> {
    sh.check(op, shape)?;
    if sh.head_dim % 2 != 0 {
        return Err(shape_err(
            op,
            format!("odd head width {} for {sh:?}", sh.head_dim),
        ));
    }
    match *table {
        [rows, dh] if dh == sh.head_dim && rows >= sh.seq => Ok(()),
        _ => Err(shape_err(
            op,
            format!(
                "table {table:?} for {} positions of width {}",
                sh.seq, sh.head_dim
            ),
        )),
    }
}

/// One pair turned: `(a c - b s, b c + a s)` forward, `(a c + b s, b c - a s)` back.
#[inline]
fn turn(a: f32, b: f32, c: f32, s: f32, dir: Turn) -> (f32, f32) {
    match dir {
        Turn::Forward => (a * c - b * s, b * c + a * s),
        Turn::Inverse => (a * c + b * s, b * c - a * s),
    }
}

/// Turns the query heads and the key heads of every row of `qkv` (`[batch * seq, ...]`,
/// fused as `sh` says) by their position's angles, in place; the values are untouched.
/// Position `p` is the row's place in its sequence (`row % seq`).
pub fn rotate(qkv: &mut Tensor, table: &Tensor, sh: AttnShape, dir: Turn) -> Result<()> {
    check("rotary", qkv.shape(), table.shape(), sh)?;
    let (dh, w3) = (sh.head_dim, sh.qkv_width());
    let half = dh / 2;
    // Query heads then key heads: contiguous at the start of every row.
    let turned = (sh.heads + sh.kv_heads) * dh;
    for (r, row) in qkv.data_mut().chunks_exact_mut(w3).enumerate() {
        let angles = &table.data()[(r % sh.seq) * dh..][..dh];
        let (cos, sin) = angles.split_at(half);
        for head in row[..turned].chunks_exact_mut(dh) {
            let (x0, x1) = head.split_at_mut(half);
            let pairs = x0.iter_mut().zip(x1.iter_mut());
            for ((a, b), (&c, &s)) in pairs.zip(cos.iter().zip(sin)) {
                (*a, *b) = turn(*a, *b, c, s, dir);
            }
        }
    }
    Ok(())
}

/// The forward: [`rotate`] by the angles.
pub fn rotary(qkv: &mut Tensor, table: &Tensor, sh: AttnShape) -> Result<()> {
    rotate(qkv, table, sh, Turn::Forward)
}

/// The backward, in place on the gradient of the rotated `qkv`: the inverse rotation turns
/// it into the gradient of the unrotated one (the values' columns pass through).
pub fn rotary_backward(dqkv: &mut Tensor, table: &Tensor, sh: AttnShape) -> Result<()> {
    rotate(dqkv, table, sh, Turn::Inverse)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds_each_position_s_angles() {
        let t = rotary_table(3, 4, 100.0).unwrap();
        // Frequencies 1 and 100^(-1/2) = 0.1; position 2 turns by 2 and 0.2.
        let row = &t.data()[8..12];
        let want = [2f64.cos(), 0.2f64.cos(), 2f64.sin(), 0.2f64.sin()];
        for (g, w) in row.iter().zip(want) {
            assert_eq!(*g, w as f32);
        }
        assert_eq!(
            &t.data()[..4],
            &[1.0, 1.0, 0.0, 0.0],
            "position 0 does not turn"
        );
        assert!(rotary_table(3, 5, 100.0).is_err());
        assert!(rotary_table(3, 4, f64::NAN).is_err());
        assert!(rotary_table(3, 4, 0.0).is_err());
    }

    #[test]
    fn the_inverse_undoes_the_rotation_and_values_pass_through() {
        let sh = AttnShape {
            batch: 2,
            seq: 3,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let data: Vec<f32> = (0..6 * sh.qkv_width())
            .map(|i| (i as f32 * 0.7).sin())
            .collect();
        let x = Tensor::new(&[6, sh.qkv_width()], data).unwrap();
        let table = rotary_table(5, 4, 10_000.0).unwrap();
        let mut y = x.clone();
        rotary(&mut y, &table, sh).unwrap();
        assert!(y.max_abs_diff(&x).unwrap() > 0.1);
        // V (the last 4 columns) is untouched, as is every head at position 0.
        for (a, b) in y.data().chunks(16).zip(x.data().chunks(16)) {
            assert_eq!(&a[12..], &b[12..]);
        }
        assert_eq!(&y.data()[..16], &x.data()[..16]);
        rotary_backward(&mut y, &table, sh).unwrap();
        assert!(y.max_abs_diff(&x).unwrap() < 1e-6);
        let short = rotary_table(2, 4, 10_000.0).unwrap();
        assert!(
            rotary(&mut y, &short, sh).is_err(),
            "3 positions, a table of 2"
        );
    }
}
