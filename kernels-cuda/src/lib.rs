//! The CUDA backend of pipewright's kernels (`pipewright_kernels::cuda` with the feature
//! `cuda`): device tensors, explicit copies,
//! cuBLAS matmuls, NVRTC-compiled elementwise and row kernels (LayerNorm,
//! cross-entropy, column sums, embedding) and fused flash-style causal
//! attention (`attention.rs`).
//!
//! cudarc loads the CUDA libraries at run time and panics if one is missing,
//! so [`CudaBackend::new`] first checks that the driver, NVRTC and cuBLAS
//! libraries are present and returns [`KernelError::CudaUnavailable`]
//! otherwise; tests use that to skip with a message on machines without a GPU.
//!
//! # Invariants
//! - No layer, model or optimizer lives here: it depends on `pipewright-kernels-core` only
//!   (the [`Backend`](pipewright_kernels_core::Backend) trait, the host ops it matches and
//!   their shape checks), never on `pipewright-kernels`.
//! - No implicit copy: host and device meet only in `upload`, `download` and [`interop`].
//! - No CUDA library is touched before [`CudaBackend::new`] has found it.
#![deny(missing_docs)]
// Empty without its feature, so a default workspace build does not compile cudarc.
#![cfg(feature = "cuda")]

mod attention;
mod blas;
mod device;
pub mod interop;
mod kept;
mod kernels;
pub use tensor::CudaKept;
mod mixed;
mod nvrtc;
mod rotary;
mod rowops;
mod tensor;
pub use device::{device_count, gpu_for_tests, missing_library, CudaBackend};
pub use tensor::{CudaAttnStash, CudaNormStash, CudaTensor};

use pipewright_kernels_core::backend::{check_range, AdamWUpdate, Backend, Restored};
use pipewright_kernels_core::cpu::rotary::Turn;
use pipewright_kernels_core::cpu::{self, AttnShape, GluKind};
use pipewright_kernels_core::error::{shape_err, KernelError, Result};
use pipewright_kernels_core::precision::Precision;
use pipewright_kernels_core::tensor::Tensor;

fn cuda_err(e: impl std::fmt::Debug) -> KernelError {
    KernelError::Cuda(format!("{e:?}"))
}

fn same_shape(op: &'static str, a: &CudaTensor, b: &CudaTensor) -> Result<()> {
    if a.shape != b.shape {
        return Err(shape_err(op, format!("{:?} vs {:?}", a.shape, b.shape)));
    }
    Ok(())
}

fn bias_shape(op: &'static str, x: &CudaTensor, b: &CudaTensor) -> Result<()> {
    if b.shape != [x.cols()] {
        return Err(shape_err(
            op,
            format!("bias {:?} for {:?}", b.shape, x.shape),
        ));
    }
    Ok(())
}

/// LayerNorm's gamma or beta (or their gradients) must be `[cols of x]`;
/// the message is the CPU op's.
fn param_shape(op: &'static str, x: &CudaTensor, p: &CudaTensor) -> Result<()> {
    if p.shape != [x.cols()] {
        return Err(shape_err(
            op,
            format!("gamma {:?} for rows of {:?}", p.shape, x.shape),
        ));
    }
    Ok(())
}

impl Backend for CudaBackend {
    type Storage = CudaTensor;
    type NormStash = CudaNormStash;
    type AttnStash = CudaAttnStash;
    type Kept = CudaKept;

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn device_memory(&self) -> Result<Option<(usize, usize)>> {
        let info = self.stream.context().mem_get_info().map_err(cuda_err)?;
        Ok(Some(info))
    }

    fn round_activation(&self, t: &mut CudaTensor) -> Result<()> {
        match self.precision {
            Precision::Bf16 => self.mixed.round_bf16(&self.stream, t),
            Precision::F32 | Precision::Tf32 => Ok(()),
        }
    }

    fn upload(&self, t: &Tensor) -> Result<CudaTensor> {
        if t.numel() == 0 {
            return self.zeros(t.shape());
        }
        let data = self.stream.clone_htod(t.data()).map_err(cuda_err)?;
        Ok(CudaTensor {
            shape: t.shape().to_vec(),
            data,
        })
    }

    fn download(&self, t: &CudaTensor) -> Result<Tensor> {
        let mut data = self.stream.clone_dtoh(&t.data).map_err(cuda_err)?;
        self.synchronize()?;
        // Drops the placeholder element of an empty tensor.
        data.truncate(t.numel());
        Tensor::new(&t.shape, data)
    }

    fn zeros(&self, shape: &[usize]) -> Result<CudaTensor> {
        CudaBackend::zeros(self, shape)
    }

    fn copy(&self, t: &CudaTensor) -> Result<CudaTensor> {
        let data = self.stream.clone_dtod(&t.data).map_err(cuda_err)?;
        Ok(CudaTensor {
            shape: t.shape.clone(),
            data,
        })
    }

    fn add_assign(&self, a: &mut CudaTensor, b: &CudaTensor) -> Result<()> {
        same_shape("add_assign", a, b)?;
        self.kernels.add_assign(&self.stream, a, b)
    }

    fn scale(&self, t: &mut CudaTensor, s: f32) -> Result<()> {
        self.kernels.scale(&self.stream, t, s)
    }

    fn fill_zero(&self, t: &mut CudaTensor) -> Result<()> {
        self.stream.memset_zeros(&mut t.data).map_err(cuda_err)
    }

    fn copy_to_offset(&self, src: &CudaTensor, dst: &mut CudaTensor, offset: usize) -> Result<()> {
        let n = src.numel();
        check_range("copy_to_offset", offset, n, dst.numel())?;
        if n == 0 {
            return Ok(()); // no zero-length views (see `CudaTensor`)
        }
        let mut to = dst.data.slice_mut(offset..offset + n);
        self.stream
            .memcpy_dtod(&src.data.slice(0..n), &mut to)
            .map_err(cuda_err)
    }

    fn copy_from_offset(
        &self,
        src: &CudaTensor,
        offset: usize,
        dst: &mut CudaTensor,
    ) -> Result<()> {
        let n = dst.numel();
        check_range("copy_from_offset", offset, n, src.numel())?;
        if n == 0 {
            return Ok(());
        }
        let mut to = dst.data.slice_mut(0..n);
        self.stream
            .memcpy_dtod(&src.data.slice(offset..offset + n), &mut to)
            .map_err(cuda_err)
    }

    fn adamw_step(
        &self,
        x: &mut CudaTensor,
        g: &CudaTensor,
        m: &mut CudaTensor,
        v: &mut CudaTensor,
        h: &AdamWUpdate,
    ) -> Result<()> {
        same_shape("adamw_step", x, g)?;
        same_shape("adamw_step", x, m)?;
        same_shape("adamw_step", x, v)?;
        self.kernels.adamw(&self.stream, x, g, (m, v), h)
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        if w.shape.len() != 2 || x.cols() != w.shape[0] {
            return Err(shape_err(
                "matmul",
                format!("{:?} @ {:?}", x.shape, w.shape),
            ));
        }
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("x has a dim") = w.cols();
        let mut out = self.zeros(&shape)?;
        self.with_reads(x, w, |r| {
            blas::matmul(&self.blas, &self.stream, (x, w), r, &mut out)
        })?;
        Ok(out)
    }

    fn matmul_nt(&self, dy: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        if w.shape.len() != 2 || dy.cols() != w.cols() {
            return Err(shape_err(
                "matmul_nt",
                format!("{:?} @ {:?}^T", dy.shape, w.shape),
            ));
        }
        let mut shape = dy.shape.clone();
        *shape.last_mut().expect("dy has a dim") = w.shape[0];
        let mut out = self.zeros(&shape)?;
        self.with_reads(dy, w, |r| {
            blas::matmul_nt(&self.blas, &self.stream, (dy, w), r, &mut out)
        })?;
        Ok(out)
    }

    fn matmul_tn_acc(&self, x: &CudaTensor, dy: &CudaTensor, acc: &mut CudaTensor) -> Result<()> {
        if x.rows() != dy.rows() || acc.shape != [x.cols(), dy.cols()] {
            return Err(shape_err(
                "matmul_tn_acc",
                format!("{:?}^T @ {:?} into {:?}", x.shape, dy.shape, acc.shape),
            ));
        }
        self.with_reads(x, dy, |r| {
            blas::matmul_tn_acc(&self.blas, &self.stream, (x, dy), r, acc)
        })
    }

    fn add_bias(&self, x: &mut CudaTensor, b: &CudaTensor) -> Result<()> {
        bias_shape("add_bias", x, b)?;
        self.kernels.add_bias(&self.stream, x, b)
    }

    fn bias_grad_acc(&self, dy: &CudaTensor, acc: &mut CudaTensor) -> Result<()> {
        bias_shape("bias_grad_acc", dy, acc)?;
        self.rows.bias_grad_acc(&self.stream, dy, acc)
    }

    fn gelu(&self, x: &CudaTensor) -> Result<CudaTensor> {
        let mut out = self.zeros(&x.shape)?;
        self.kernels.gelu(&self.stream, x, &mut out)?;
        Ok(out)
    }

    fn gelu_backward(&self, x: &CudaTensor, dy: &CudaTensor) -> Result<CudaTensor> {
        same_shape("gelu_backward", x, dy)?;
        let mut out = self.zeros(&x.shape)?;
        self.kernels.gelu_backward(&self.stream, x, dy, &mut out)?;
        Ok(out)
    }

    fn glu(&self, h: &CudaTensor, kind: GluKind) -> Result<CudaTensor> {
        let f = cpu::glu::half_width("glu", &h.shape)?;
        let mut shape = h.shape.clone();
        *shape.last_mut().expect("half_width checked a dim") = f;
        let mut out = self.zeros(&shape)?;
        self.kernels.glu(&self.stream, h, kind.code(), &mut out)?;
        Ok(out)
    }

    fn glu_backward(&self, h: &CudaTensor, da: &CudaTensor, kind: GluKind) -> Result<CudaTensor> {
        let f = cpu::glu::half_width("glu_backward", &h.shape)?;
        if da.numel() * 2 != h.numel() || da.cols() != f {
            return Err(shape_err(
                "glu_backward",
                format!("gradient {:?} for pre-activation {:?}", da.shape, h.shape),
            ));
        }
        let mut dh = self.zeros(&h.shape)?;
        self.kernels
            .glu_backward(&self.stream, h, da, kind.code(), &mut dh)?;
        Ok(dh)
    }

    fn add(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        same_shape("add", a, b)?;
        let mut out = self.zeros(&a.shape)?;
        self.kernels.add(&self.stream, a, b, &mut out)?;
        Ok(out)
    }

    fn keep(&self, t: CudaTensor) -> Result<CudaKept> {
        self.keep_tensor(t)
    }

    fn restore<'a>(&self, k: &'a CudaKept) -> Result<Restored<'a, CudaTensor>> {
        self.restore_tensor(k)
    }

    fn restore_owned(&self, k: CudaKept) -> Result<CudaTensor> {
        self.restore_tensor_owned(k)
    }

    fn layer_norm(
        &self,
        x: &CudaTensor,
        gamma: &CudaTensor,
        beta: &CudaTensor,
        eps: f32,
    ) -> Result<(CudaTensor, CudaNormStash)> {
        param_shape("layer_norm", x, gamma)?;
        param_shape("layer_norm", x, beta)?;
        let mut y = self.zeros(&x.shape)?;
        let mut xhat = self.zeros(&x.shape)?;
        let mut rstd = self.zeros(&[x.rows()])?;
        self.rows.layer_norm(
            &self.stream,
            x,
            gamma,
            beta,
            eps,
            &mut y,
            &mut xhat,
            &mut rstd,
        )?;
        let xhat = self.keep_tensor(xhat)?;
        Ok((y, CudaNormStash { xhat, rstd }))
    }

    fn layer_norm_backward_input(
        &self,
        dy: &CudaTensor,
        gamma: &CudaTensor,
        stash: &CudaNormStash,
    ) -> Result<CudaTensor> {
        let xhat = self.norm_stash_for("layer_norm_backward_input", dy, gamma, stash)?;
        let mut dx = self.zeros(&dy.shape)?;
        self.rows.layer_norm_backward_input(
            &self.stream,
            dy,
            gamma,
            &xhat,
            &stash.rstd,
            &mut dx,
        )?;
        Ok(dx)
    }

    fn layer_norm_backward_weight(
        &self,
        dy: &CudaTensor,
        stash: &CudaNormStash,
        dgamma: &mut CudaTensor,
        dbeta: &mut CudaTensor,
    ) -> Result<()> {
        const OP: &str = "layer_norm_backward_weight";
        let xhat = self.restore_tensor(&stash.xhat)?;
        same_shape(OP, dy, &xhat)?;
        param_shape(OP, dy, dgamma)?;
        param_shape(OP, dy, dbeta)?;
        self.rows
            .layer_norm_backward_weight(&self.stream, dy, &xhat, dgamma, Some(dbeta))
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        gamma: &CudaTensor,
        eps: f32,
    ) -> Result<(CudaTensor, CudaNormStash)> {
        param_shape("rms_norm", x, gamma)?;
        let mut y = self.zeros(&x.shape)?;
        let mut xhat = self.zeros(&x.shape)?;
        let mut rstd = self.zeros(&[x.rows()])?;
        let out = (&mut y, &mut xhat, &mut rstd);
        self.rows.rms_norm(&self.stream, x, gamma, eps, out)?;
        let xhat = self.keep_tensor(xhat)?;
        Ok((y, CudaNormStash { xhat, rstd }))
    }

    fn rms_norm_backward_input(
        &self,
        dy: &CudaTensor,
        gamma: &CudaTensor,
        stash: &CudaNormStash,
    ) -> Result<CudaTensor> {
        let xhat = self.norm_stash_for("rms_norm_backward_input", dy, gamma, stash)?;
        let mut dx = self.zeros(&dy.shape)?;
        let stash = (&*xhat, &stash.rstd);
        self.rows
            .rms_norm_backward_input(&self.stream, dy, gamma, stash, &mut dx)?;
        Ok(dx)
    }

    fn rms_norm_backward_weight(
        &self,
        dy: &CudaTensor,
        stash: &CudaNormStash,
        dgamma: &mut CudaTensor,
    ) -> Result<()> {
        const OP: &str = "rms_norm_backward_weight";
        let xhat = self.restore_tensor(&stash.xhat)?;
        same_shape(OP, dy, &xhat)?;
        param_shape(OP, dy, dgamma)?;
        self.rows
            .layer_norm_backward_weight(&self.stream, dy, &xhat, dgamma, None)
    }

    fn cross_entropy(
        &self,
        logits: &CudaTensor,
        targets: &[u32],
        scale: f32,
    ) -> Result<(f32, CudaTensor)> {
        cpu::loss::check_targets(&logits.shape, targets)?;
        let ids = self.upload_ids(targets)?;
        let mut probs = self.zeros(&logits.shape)?;
        let mut row_loss = self
            .stream
            .alloc_zeros::<f32>(targets.len().max(1))
            .map_err(cuda_err)?;
        self.rows
            .cross_entropy(&self.stream, logits, &ids, &mut probs, &mut row_loss)?;
        let row_loss = self.stream.clone_dtoh(&row_loss).map_err(cuda_err)?;
        self.synchronize()?;
        // Summed in row order in f64, then scaled, as the CPU op.
        let total: f64 = row_loss[..targets.len()].iter().map(|&l| l as f64).sum();
        let n = targets.len().max(1) as f64;
        Ok(((total / n * scale as f64) as f32, probs))
    }

    fn cross_entropy_backward(
        &self,
        mut probs: CudaTensor,
        targets: &[u32],
        scale: f32,
    ) -> Result<CudaTensor> {
        cpu::loss::check_targets(&probs.shape, targets)?;
        let ids = self.upload_ids(targets)?;
        // The CPU op's factor, computed the same way (in f32).
        let k = scale / targets.len().max(1) as f32;
        self.rows
            .cross_entropy_backward(&self.stream, &mut probs, &ids, k)?;
        Ok(probs)
    }

    fn embedding(
        &self,
        ids: &[u32],
        seq: usize,
        wte: &CudaTensor,
        wpe: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        cpu::embedding::check(ids, seq, &wte.shape, wpe.map(|p| &p.shape[..]))?;
        let dev_ids = self.upload_ids(ids)?;
        let mut out = self.zeros(&[ids.len() / seq, seq, wte.cols()])?;
        self.rows
            .embedding(&self.stream, &dev_ids, seq, (wte, wpe), &mut out)?;
        Ok(out)
    }

    fn embedding_backward_weight(
        &self,
        ids: &[u32],
        seq: usize,
        dy: &CudaTensor,
        dwte: &mut CudaTensor,
        dwpe: Option<&mut CudaTensor>,
    ) -> Result<()> {
        let positions = dwpe.as_ref().map(|p| &p.shape[..]);
        cpu::embedding::check(ids, seq, &dwte.shape, positions)?;
        let d = dwte.cols();
        if dy.numel() != ids.len() * d {
            return Err(shape_err(
                "embedding_backward_weight",
                format!("gradient {:?} for {} ids of width {d}", dy.shape, ids.len()),
            ));
        }
        self.rows
            .embedding_backward_weight(&self.stream, ids, seq, dy, dwte, dwpe)
    }

    fn rotary(
        &self,
        qkv: &mut CudaTensor,
        table: &CudaTensor,
        sh: AttnShape,
        dir: Turn,
    ) -> Result<()> {
        cpu::rotary::check("rotary", &qkv.shape, &table.shape, sh)?;
        self.rotary.rotate(&self.stream, qkv, table, sh, dir)
    }

    fn causal_attention(
        &self,
        qkv: &CudaTensor,
        sh: AttnShape,
    ) -> Result<(CudaTensor, CudaAttnStash)> {
        sh.check("causal_attention", &qkv.shape)?;
        self.attn.check("causal_attention", sh)?;
        let mut out = self.zeros(&[sh.batch, sh.seq, sh.width()])?;
        let mut lse = self.zeros(&[sh.batch, sh.heads, sh.seq])?;
        self.attn
            .forward(&self.stream, qkv, sh, &mut out, &mut lse)?;
        Ok((out, CudaAttnStash { lse }))
    }

    fn causal_attention_backward(
        &self,
        qkv: &CudaTensor,
        out: &CudaTensor,
        stash: &CudaAttnStash,
        dout: &CudaTensor,
        sh: AttnShape,
    ) -> Result<CudaTensor> {
        const OP: &str = "causal_attention_backward";
        sh.check(OP, &qkv.shape)?;
        self.attn.check(OP, sh)?;
        let rows = sh.batch * sh.seq * sh.width();
        if out.numel() != rows
            || dout.numel() != rows
            || stash.lse.shape != [sh.batch, sh.heads, sh.seq]
        {
            return Err(shape_err(
                OP,
                format!(
                    "out {:?}, lse {:?}, dout {:?} for {sh:?}",
                    out.shape, stash.lse.shape, dout.shape
                ),
            ));
        }
        let mut dqkv = self.zeros(&qkv.shape)?;
        self.attn
            .backward(&self.stream, qkv, out, &stash.lse, dout, sh, &mut dqkv)?;
        Ok(dqkv)
    }
}
