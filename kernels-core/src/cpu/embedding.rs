//! Token embedding plus, where the model has one, a learned positional embedding (a model
//! with rotary positions has no table: its positions enter in attention, see [`super::rotary`]).
//!
//! Token ids are not differentiable, so the backward has only a weight part.

use crate::error::{shape_err, KernelError, Result};
use crate::tensor::Tensor;

/// Checks ids and table shapes before any work (shared with the CUDA
/// backend, which must validate before launching a kernel).
pub fn check(ids: &[u32], seq: usize, wte: &[usize], wpe: Option<&[usize]>) -> Result<()> {
    let d = wte.last().copied().unwrap_or(1);
    if seq == 0 || ids.len() % seq != 0 {
        return Err(shape_err(
            "embedding",
            format!("{} ids are not whole sequences of {seq}", ids.len()),
        ));
    }
    if wte.len() != 2 || wpe.is_some_and(|p| p.len() != 2 || p[1] != d) {
        return Err(shape_err(
            "embedding",
            format!("tables {wte:?} and {wpe:?}"),
        ));
    }
    if let Some(&[positions, _]) = wpe {
        if seq > positions {
            return Err(shape_err(
                "embedding",
                format!("sequence of {seq} beyond {positions} positions"),
            ));
        }
    }
    let vocab = wte[0];
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(&id) => Err(KernelError::TokenOutOfRange { id, vocab }),
        None => Ok(()),
    }
}

/// `out[b, t] = wte[ids[b, t]] + wpe[t]` for ids of shape `[batch, seq]`
/// (flattened), or `wte[ids[b, t]]` without a position table; the result is
/// `[batch, seq, d]`.
pub fn embedding(ids: &[u32], seq: usize, wte: &Tensor, wpe: Option<&Tensor>) -> Result<Tensor> {
    check(ids, seq, wte.shape(), wpe.map(Tensor::shape))?;
    let d = wte.cols();
    let mut out = vec![0.0f32; ids.len() * d];
    for (i, (row, &id)) in out.chunks_exact_mut(d).zip(ids).enumerate() {
        let tok = &wte.data()[id as usize * d..][..d];
        match wpe {
            Some(wpe) => {
                let pos = &wpe.data()[(i % seq) * d..][..d];
                for ((o, a), b) in row.iter_mut().zip(tok).zip(pos) {
                    *o = a + b;
                }
            }
            None => row.copy_from_slice(tok),
        }
    }
    Ok(Tensor::from_parts(vec![ids.len() / seq, seq, d], out))
}

/// Weight gradient: `dwte[ids[i]] += dy[i]`, and `dwpe[i % seq] += dy[i]` where the model
/// has a position table.
pub fn embedding_backward_weight(
    ids: &[u32],
    seq: usize,
    dy: &Tensor,
    dwte: &mut Tensor,
    mut dwpe: Option<&mut Tensor>,
) -> Result<()> {
    check(ids, seq, dwte.shape(), dwpe.as_deref().map(Tensor::shape))?;
    let d = dwte.cols();
    if dy.numel() != ids.len() * d {
        return Err(shape_err(
            "embedding_backward_weight",
            format!(
                "gradient {:?} for {} ids of width {d}",
                dy.shape(),
                ids.len()
            ),
        ));
    }
    for (i, (g, &id)) in dy.data().chunks_exact(d).zip(ids).enumerate() {
        let tok = &mut dwte.data_mut()[id as usize * d..][..d];
        tok.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        if let Some(dwpe) = dwpe.as_deref_mut() {
            let pos = &mut dwpe.data_mut()[(i % seq) * d..][..d];
            pos.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_and_scatters() {
        let wte = Tensor::new(&[3, 2], vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]).unwrap();
        let wpe = Tensor::new(&[2, 2], vec![0.5, 0.5, 0.25, 0.25]).unwrap();
        let y = embedding(&[2, 1, 1, 1], 2, &wte, Some(&wpe)).unwrap();
        assert_eq!(y.shape(), &[2, 2, 2]);
        assert_eq!(
            y.data(),
            &[20.5, 21.5, 10.25, 11.25, 10.5, 11.5, 10.25, 11.25]
        );
        let (mut dwte, mut dwpe) = (Tensor::zeros(&[3, 2]), Tensor::zeros(&[2, 2]));
        let dy = Tensor::new(&[2, 2, 2], vec![1.0; 8]).unwrap();
        embedding_backward_weight(&[2, 1, 1, 1], 2, &dy, &mut dwte, Some(&mut dwpe)).unwrap();
        assert_eq!(dwte.data(), &[0.0, 0.0, 3.0, 3.0, 1.0, 1.0]);
        assert_eq!(dwpe.data(), &[2.0, 2.0, 2.0, 2.0]);
        // Without a position table (rotary positions): the token rows alone.
        let y = embedding(&[2, 1, 1, 1], 2, &wte, None).unwrap();
        assert_eq!(y.data(), &[20.0, 21.0, 10.0, 11.0, 10.0, 11.0, 10.0, 11.0]);
        embedding_backward_weight(&[2, 1, 1, 1], 2, &dy, &mut dwte, None).unwrap();
        assert_eq!(dwte.data(), &[0.0, 0.0, 6.0, 6.0, 2.0, 2.0]);
    }

    #[test]
    fn rejects_bad_ids_and_lengths() {
        let wte = Tensor::zeros(&[3, 2]);
        let wpe = Tensor::zeros(&[2, 2]);
        assert!(matches!(
            embedding(&[0, 3], 2, &wte, Some(&wpe)),
            Err(KernelError::TokenOutOfRange { id: 3, .. })
        ));
        assert!(embedding(&[0, 1, 2], 2, &wte, Some(&wpe)).is_err());
        assert!(embedding(&[0, 1, 2], 3, &wte, Some(&wpe)).is_err());
        assert!(embedding(&[0, 1, 2], 3, &wte, None).is_ok());
    }
}
