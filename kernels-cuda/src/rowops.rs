//! Row-wise and gather/scatter kernels, compiled once per backend with NVRTC
//! (source: `rowops.cu`, each kernel's grid and block mapping stated there):
//! LayerNorm, RMSNorm, softmax cross-entropy, column sums (norm weights,
//! biases) and embedding.
//!
//! A row is one block of `ROW_THREADS` threads, reduced with warp shuffles
//! and shared memory, read as float4 where the row length allows, in f32.
//! Every reduction has a fixed order (no float atomics), so a run repeats to
//! the bit; the embedding gradient even adds in the CPU's order (same bits).
//! Callers check every shape before launching: the kernels trust them.

use super::{cuda_err, CudaTensor};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchArgs, LaunchConfig, PushKernelArg,
};
use pipewright_kernels_core::error::{KernelError, Result};
use std::sync::Arc;

pub(super) const SOURCE: &str = include_str!("rowops.cu");

/// The kernels loaded from [`SOURCE`], in [`RowKernels`]' field order.
pub(super) const NAMES: &[&str] = &[
    "ln_fwd",
    "ln_bwd_input",
    "rms_fwd",
    "rms_bwd_input",
    "col_part2",
    "col_part1",
    "col_finish",
    "ce_fwd",
    "ce_bwd",
    "emb_fwd",
    "emb_bwd_tok",
    "emb_bwd_pos",
];

/// `ROW_THREADS` of the source.
const ROW_THREADS: u32 = 256;
/// `COL_X`, `COL_Y` of the source.
const COL: (u32, u32) = (32, 8);
/// At most this many row chunks in a column sum (partials: chunks x cols).
const MAX_CHUNKS: usize = 128;
/// At least this many rows per chunk, so small inputs take one chunk.
const MIN_CHUNK: usize = 32;

#[derive(Clone)]
pub(super) struct RowKernels {
    ln_fwd: CudaFunction,
    ln_bwd_input: CudaFunction,
    rms_fwd: CudaFunction,
    rms_bwd_input: CudaFunction,
    col_part2: CudaFunction,
    col_part1: CudaFunction,
    col_finish: CudaFunction,
    ce_fwd: CudaFunction,
    ce_bwd: CudaFunction,
    emb_fwd: CudaFunction,
    emb_bwd_tok: CudaFunction,
    emb_bwd_pos: CudaFunction,
}

/// A count as the kernels' `int`.
pub(super) fn int(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| KernelError::Cuda(format!("{n} exceeds a kernel's int")))
}

fn dim(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| KernelError::Cuda(format!("{n} blocks exceed a grid")))
}

/// One block of `ROW_THREADS` per row (`rows` > 0).
fn per_row(rows: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (dim(rows)?, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Enough 1024-thread blocks for `n` threads (at least one block).
fn per_elem(n: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig::for_num_elems(dim(n.max(1))?))
}

/// Launches `b` with `cfg`.
///
/// # Safety
/// The arguments pushed on `b` must match the kernel's signature, and every
/// buffer must hold what the kernel indexes under `cfg`.
unsafe fn launch(mut b: LaunchArgs<'_>, cfg: LaunchConfig) -> Result<()> {
    // SAFETY: forwarded to the caller.
    unsafe { b.launch(cfg) }.map(drop).map_err(cuda_err)
}

/// Row chunks of a column sum over `rows`: (chunks, rows per chunk).
fn chunking(rows: usize) -> (usize, usize) {
    let chunks = rows.div_ceil(MIN_CHUNK).clamp(1, MAX_CHUNKS);
    (chunks, rows.div_ceil(chunks))
}

/// Distinct tokens of `ids` with the rows holding each, ascending: token
/// list, CSR offsets (one more than tokens) and rows, for `emb_bwd_tok`.
fn rows_by_token(ids: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    // Stable: rows of one token stay ascending, the CPU's order.
    order.sort_by_key(|&r| ids[r as usize]);
    let (mut tok, mut start) = (Vec::new(), Vec::new());
    for (k, &r) in order.iter().enumerate() {
        let id = ids[r as usize];
        if tok.last() != Some(&id) {
            tok.push(id);
            start.push(k as u32);
        }
    }
    start.push(order.len() as u32);
    (tok, start, order)
}

impl RowKernels {
    pub(super) fn compile(ctx: &Arc<CudaContext>) -> Result<Self> {
        let mut f = super::nvrtc::load(ctx, SOURCE, NAMES)?.into_iter();
        let mut next = || f.next().expect("one function per name");
        Ok(Self {
            ln_fwd: next(),
            ln_bwd_input: next(),
            rms_fwd: next(),
            rms_bwd_input: next(),
            col_part2: next(),
            col_part1: next(),
            col_finish: next(),
            ce_fwd: next(),
            ce_bwd: next(),
            emb_fwd: next(),
            emb_bwd_tok: next(),
            emb_bwd_pos: next(),
        })
    }

    /// `x`, `y`, `xhat` are `[rows, n]`; `gamma`, `beta` `[n]`; `rstd` `[rows]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer_norm(
        &self,
        s: &Arc<CudaStream>,
        x: &CudaTensor,
        gamma: &CudaTensor,
        beta: &CudaTensor,
        eps: f32,
        y: &mut CudaTensor,
        xhat: &mut CudaTensor,
        rstd: &mut CudaTensor,
    ) -> Result<()> {
        if x.rows() == 0 || x.cols() == 0 {
            return Ok(());
        }
        let n = int(x.cols())?;
        let mut b = s.launch_builder(&self.ln_fwd);
        b.arg(&mut y.data).arg(&mut xhat.data).arg(&mut rstd.data);
        b.arg(&x.data).arg(&gamma.data).arg(&beta.data);
        b.arg(&n).arg(&eps);
        // SAFETY: shapes checked by the caller; block r touches row r only.
        unsafe { launch(b, per_row(x.rows())?) }
    }

    /// RMSNorm: `x`, `y`, `xhat` are `[rows, n]`; `gamma` `[n]`; `rstd` `[rows]`.
    pub(super) fn rms_norm(
        &self,
        s: &Arc<CudaStream>,
        x: &CudaTensor,
        gamma: &CudaTensor,
        eps: f32,
        out: (&mut CudaTensor, &mut CudaTensor, &mut CudaTensor),
    ) -> Result<()> {
        if x.rows() == 0 || x.cols() == 0 {
            return Ok(());
        }
        let (y, xhat, rstd) = out;
        let n = int(x.cols())?;
        let mut b = s.launch_builder(&self.rms_fwd);
        b.arg(&mut y.data).arg(&mut xhat.data).arg(&mut rstd.data);
        b.arg(&x.data).arg(&gamma.data).arg(&n).arg(&eps);
        // SAFETY: shapes checked by the caller; block r touches row r only.
        unsafe { launch(b, per_row(x.rows())?) }
    }

    /// RMSNorm's input gradient: `dy`, `xhat`, `dx` are `[rows, n]`; `gamma` `[n]`;
    /// `rstd` `[rows]`.
    pub(super) fn rms_norm_backward_input(
        &self,
        s: &Arc<CudaStream>,
        dy: &CudaTensor,
        gamma: &CudaTensor,
        stash: (&CudaTensor, &CudaTensor),
        dx: &mut CudaTensor,
    ) -> Result<()> {
        if dy.rows() == 0 || dy.cols() == 0 {
            return Ok(());
        }
        let (xhat, rstd) = stash;
        let n = int(dy.cols())?;
        let mut b = s.launch_builder(&self.rms_bwd_input);
        b.arg(&mut dx.data).arg(&dy.data).arg(&gamma.data);
        b.arg(&xhat.data).arg(&rstd.data).arg(&n);
        // SAFETY: shapes checked by the caller; block r touches row r only.
        unsafe { launch(b, per_row(dy.rows())?) }
    }

    /// `dy`, `xhat`, `dx` are `[rows, n]`; `gamma` `[n]`; `rstd` `[rows]`.
    pub(super) fn layer_norm_backward_input(
        &self,
        s: &Arc<CudaStream>,
        dy: &CudaTensor,
        gamma: &CudaTensor,
        xhat: &CudaTensor,
        rstd: &CudaTensor,
        dx: &mut CudaTensor,
    ) -> Result<()> {
        if dy.rows() == 0 || dy.cols() == 0 {
            return Ok(());
        }
        let n = int(dy.cols())?;
        let mut b = s.launch_builder(&self.ln_bwd_input);
        b.arg(&mut dx.data).arg(&dy.data).arg(&gamma.data);
        b.arg(&xhat.data).arg(&rstd.data).arg(&n);
        // SAFETY: shapes checked by the caller; block r touches row r only.
        unsafe { launch(b, per_row(dy.rows())?) }
    }

    /// `dy`, `xhat` are `[rows, n]`; `dgamma`, `dbeta` `[n]` (accumulated; an RMSNorm has
    /// no `dbeta`: its column sums are left out).
    pub(super) fn layer_norm_backward_weight(
        &self,
        s: &Arc<CudaStream>,
        dy: &CudaTensor,
        xhat: &CudaTensor,
        dgamma: &mut CudaTensor,
        dbeta: Option<&mut CudaTensor>,
    ) -> Result<()> {
        let (rows, n) = (dy.rows(), dy.cols());
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let (chunks, chunk) = chunking(rows);
        let mut part_p = s.alloc_zeros::<f32>(chunks * n).map_err(cuda_err)?;
        let mut part_s = s.alloc_zeros::<f32>(chunks * n).map_err(cuda_err)?;
        let (ri, ni, ci) = (int(rows)?, int(n)?, int(chunk)?);
        let mut b = s.launch_builder(&self.col_part2);
        b.arg(&mut part_p)
            .arg(&mut part_s)
            .arg(&dy.data)
            .arg(&xhat.data);
        b.arg(&ri).arg(&ni).arg(&ci);
        // SAFETY: dy and xhat hold rows * n floats (checked by the caller),
        // the partials chunks * n; rows beyond `rows` and columns beyond `n`
        // are guarded in the kernel.
        unsafe { launch(b, col_grid(n, chunks)?) }?;
        self.col_finish(s, dgamma, &part_p, chunks, n)?;
        match dbeta {
            Some(dbeta) => self.col_finish(s, dbeta, &part_s, chunks, n),
            None => Ok(()),
        }
    }

    /// `acc += column sums of dy` (`[rows, n]`, `acc` `[n]`), the bias gradient.
    pub(super) fn bias_grad_acc(
        &self,
        s: &Arc<CudaStream>,
        dy: &CudaTensor,
        acc: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, n) = (dy.rows(), dy.cols());
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let (chunks, chunk) = chunking(rows);
        let mut part = s.alloc_zeros::<f32>(chunks * n).map_err(cuda_err)?;
        let (ri, ni, ci) = (int(rows)?, int(n)?, int(chunk)?);
        let mut b = s.launch_builder(&self.col_part1);
        b.arg(&mut part).arg(&dy.data).arg(&ri).arg(&ni).arg(&ci);
        // SAFETY: as in `layer_norm_backward_weight`.
        unsafe { launch(b, col_grid(n, chunks)?) }?;
        self.col_finish(s, acc, &part, chunks, n)
    }

    fn col_finish(
        &self,
        s: &Arc<CudaStream>,
        acc: &mut CudaTensor,
        part: &CudaSlice<f32>,
        chunks: usize,
        n: usize,
    ) -> Result<()> {
        let (ci, ni) = (int(chunks)?, int(n)?);
        let mut b = s.launch_builder(&self.col_finish);
        b.arg(&mut acc.data).arg(part).arg(&ci).arg(&ni);
        // SAFETY: acc holds n floats, part chunks * n; guarded by j < n.
        unsafe { launch(b, per_elem(n)?) }
    }

    /// `logits`, `probs` are `[rows, v]`; `targets` and `row_loss` `[rows]`,
    /// every target below `v` (checked by the caller).
    pub(super) fn cross_entropy(
        &self,
        s: &Arc<CudaStream>,
        logits: &CudaTensor,
        targets: &CudaSlice<u32>,
        probs: &mut CudaTensor,
        row_loss: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if logits.rows() == 0 || logits.cols() == 0 {
            return Ok(());
        }
        let v = int(logits.cols())?;
        let mut b = s.launch_builder(&self.ce_fwd);
        b.arg(&mut probs.data).arg(row_loss).arg(&logits.data);
        b.arg(targets).arg(&v);
        // SAFETY: shapes and target range checked by the caller; block r
        // touches row r only.
        unsafe { launch(b, per_row(logits.rows())?) }
    }

    /// `probs` is `[rows, v]` and becomes the gradient; `targets` `[rows]`.
    pub(super) fn cross_entropy_backward(
        &self,
        s: &Arc<CudaStream>,
        probs: &mut CudaTensor,
        targets: &CudaSlice<u32>,
        k: f32,
    ) -> Result<()> {
        if probs.rows() == 0 || probs.cols() == 0 {
            return Ok(());
        }
        let v = int(probs.cols())?;
        let rows = probs.rows();
        let mut b = s.launch_builder(&self.ce_bwd);
        b.arg(&mut probs.data).arg(targets).arg(&v).arg(&k);
        // SAFETY: shapes checked by the caller; block r touches row r only.
        unsafe { launch(b, per_row(rows)?) }
    }

    /// `ids` `[rows]` (each below the vocabulary, checked by the caller),
    /// tables `[vocab, d]` and, if the model has one, `[positions >= seq, d]`, `out`
    /// `[rows, d]`.
    pub(super) fn embedding(
        &self,
        s: &Arc<CudaStream>,
        ids: &CudaSlice<u32>,
        seq: usize,
        (wte, wpe): (&CudaTensor, Option<&CudaTensor>),
        out: &mut CudaTensor,
    ) -> Result<()> {
        let (numel, d, seq) = (out.numel(), int(out.cols())?, int(seq)?);
        let n = int(numel)?;
        let has_pos = i32::from(wpe.is_some());
        // Without a table the kernel reads no position: any buffer stands in for it.
        let wpe = wpe.unwrap_or(wte);
        let mut b = s.launch_builder(&self.emb_fwd);
        b.arg(&mut out.data).arg(ids).arg(&wte.data).arg(&wpe.data);
        b.arg(&n).arg(&d).arg(&seq).arg(&has_pos);
        // SAFETY: shapes and ids checked by the caller; guarded by i < n.
        unsafe { launch(b, per_elem(numel)?) }
    }

    /// Adds `dy` (`[rows, d]`, rows in whole sequences of `seq`) into the
    /// rows of `dwte` named by `ids` and into `dwpe`'s first `seq` rows, if there is one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn embedding_backward_weight(
        &self,
        s: &Arc<CudaStream>,
        ids: &[u32],
        seq: usize,
        dy: &CudaTensor,
        dwte: &mut CudaTensor,
        dwpe: Option<&mut CudaTensor>,
    ) -> Result<()> {
        let d = dwte.cols();
        if ids.is_empty() || d == 0 {
            return Ok(());
        }
        let (tok, start, rows_of) = rows_by_token(ids);
        let up = |v: &[u32]| s.clone_htod(v).map_err(cuda_err);
        let (tok_d, start_d, rows_d) = (up(&tok)?, up(&start)?, up(&rows_of)?);
        let di = int(d)?;
        let mut b = s.launch_builder(&self.emb_bwd_tok);
        b.arg(&mut dwte.data).arg(&dy.data).arg(&tok_d);
        b.arg(&start_d).arg(&rows_d).arg(&di);
        // SAFETY: ids checked below the vocabulary and dy of ids.len() rows
        // by the caller; block u reads start[u], start[u + 1] (tok.len() + 1
        // entries) and writes row tok[u] only, each token once.
        unsafe { launch(b, per_row(tok.len())?) }?;
        let Some(dwpe) = dwpe else {
            return Ok(());
        };
        let (nseq, seqi) = (int(ids.len() / seq)?, int(seq)?);
        let mut b = s.launch_builder(&self.emb_bwd_pos);
        b.arg(&mut dwpe.data)
            .arg(&dy.data)
            .arg(&nseq)
            .arg(&seqi)
            .arg(&di);
        // SAFETY: seq <= positions (checked by the caller); block t writes
        // row t of dwpe only and reads rows b * seq + t < ids.len() of dy.
        unsafe { launch(b, per_row(seq)?) }
    }
}

/// `ceil(n / 32) x chunks` blocks of `COL`.
fn col_grid(n: usize, chunks: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (dim(n.div_ceil(COL.0 as usize))?, dim(chunks)?, 1),
        block_dim: (COL.0, COL.1, 1),
        shared_mem_bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_by_token_keeps_each_tokens_rows_ascending() {
        let (tok, start, rows) = rows_by_token(&[3, 1, 3, 0, 1, 3]);
        assert_eq!(tok, [0, 1, 3]);
        assert_eq!(start, [0, 1, 3, 6]);
        assert_eq!(rows, [3, 1, 4, 0, 2, 5]);
    }

    #[test]
    fn chunks_cover_every_row() {
        for rows in [1, 31, 32, 33, 1000, 16384, 100_000] {
            let (chunks, chunk) = chunking(rows);
            assert!((1..=MAX_CHUNKS).contains(&chunks));
            assert!(
                chunks * chunk >= rows && (chunks - 1) * chunk < rows,
                "{rows}"
            );
        }
    }
}
