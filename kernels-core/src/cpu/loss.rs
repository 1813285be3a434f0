//! Softmax cross-entropy with integer targets.

use crate::error::{shape_err, KernelError, Result};
use crate::tensor::Tensor;

/// Checks targets against logits of shape `shape` before any work (shared
/// with the CUDA backend, which must validate before launching a kernel).
pub fn check_targets(shape: &[usize], targets: &[u32]) -> Result<()> {
    let vocab = shape.last().copied().unwrap_or(1);
    let rows = shape
        .iter()
        .product::<usize>()
        .checked_div(vocab)
        .unwrap_or(0);
    if rows != targets.len() {
        return Err(shape_err(
            "cross_entropy",
            format!("{} targets for logits {shape:?}", targets.len()),
        ));
    }
    match targets.iter().find(|&&t| t as usize >= vocab) {
        Some(&id) => Err(KernelError::TokenOutOfRange { id, vocab }),
        None => Ok(()),
    }
}

/// Loss `scale * mean_i(-log softmax(logits_i)[targets_i])` over the rows of
/// `logits` (`[.., vocab]`), and the softmax probabilities the backward needs.
///
/// `scale` lets a pipeline accumulate microbatches into a whole-batch loss:
/// with `m` equal microbatches, `scale = 1/m` makes the sum of their losses
/// (and of their gradients) equal the loss of the whole batch.
pub fn cross_entropy(logits: &Tensor, targets: &[u32], scale: f32) -> Result<(f32, Tensor)> {
    check_targets(logits.shape(), targets)?;
    let v = logits.cols();
    let mut probs = vec![0.0f32; logits.numel()];
    let mut total = 0.0f64;
    for ((row, p), &t) in logits
        .data()
        .chunks_exact(v)
        .zip(probs.chunks_exact_mut(v))
        .zip(targets)
    {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f64;
        for (pj, &z) in p.iter_mut().zip(row) {
            *pj = (z - max).exp();
            sum += *pj as f64;
        }
        let inv = (1.0 / sum) as f32;
        p.iter_mut().for_each(|pj| *pj *= inv);
        // log-sum-exp form keeps the loss finite even when p underflows.
        total += sum.ln() + (max - row[t as usize]) as f64;
    }
    let n = targets.len().max(1) as f64;
    let loss = (total / n * scale as f64) as f32;
    Ok((loss, Tensor::from_parts(logits.shape().to_vec(), probs)))
}

/// Gradient of the [`cross_entropy`] loss with respect to the logits:
/// `scale / n * (probs - onehot(targets))`, computed in place in `probs`.
pub fn cross_entropy_backward(mut probs: Tensor, targets: &[u32], scale: f32) -> Result<Tensor> {
    check_targets(probs.shape(), targets)?;
    let v = probs.cols();
    let k = scale / targets.len().max(1) as f32;
    for (row, &t) in probs.data_mut().chunks_exact_mut(v).zip(targets) {
        row[t as usize] -= 1.0;
        row.iter_mut().for_each(|g| *g *= k);
    }
    Ok(probs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_give_log_vocab() {
        let logits = Tensor::zeros(&[3, 8]);
        let (loss, probs) = cross_entropy(&logits, &[0, 3, 7], 1.0).unwrap();
        assert!((loss - 8f32.ln()).abs() < 1e-6);
        assert!((probs.data()[5] - 0.125).abs() < 1e-7);
        let (half, _) = cross_entropy(&logits, &[0, 3, 7], 0.5).unwrap();
        assert!((half - 0.5 * loss).abs() < 1e-7);
    }

    #[test]
    fn bad_targets_are_errors() {
        let logits = Tensor::zeros(&[2, 4]);
        assert!(matches!(
            cross_entropy(&logits, &[0, 4], 1.0),
            Err(KernelError::TokenOutOfRange { id: 4, vocab: 4 })
        ));
        assert!(cross_entropy(&logits, &[0], 1.0).is_err());
    }

    #[test]
    fn huge_logits_stay_finite() {
        let logits = Tensor::new(&[1, 2], vec![1000.0, -1000.0]).unwrap();
        let (loss, _) = cross_entropy(&logits, &[1], 1.0).unwrap();
        assert!((loss - 2000.0).abs() < 1e-2);
    }
}
