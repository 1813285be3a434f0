//! A GPU as a cluster (feature `cuda`).
//!
//! Measured on the GPU, through the kernels' CUDA backend that `train --device cuda` uses:
//! - matmul rates in each precision (f32, TF32 on the f32 operands, bf16 with its operand
//!   conversions, as the runtime runs them) over a grid of shapes, each fitted to the
//!   efficiency curve; the bf16 fit's half-rate dimension is the cluster's (bf16 is what the
//!   plan assumes unless told otherwise);
//! - HBM bandwidth: a 256 MiB device copy (read plus written), and the rate of an
//!   element-wise kernel (GeLU), the lower of which is `memory_bandwidth_gbs`;
//! - the GPU's memory (the driver's total) and how many GPUs the node has.
//!
//! One GPU cannot measure NVLink or InfiniBand: the links are those of `--cluster`'s preset,
//! and the cluster file's `source` says so. The attention kernels are tiled with an online
//! softmax (nothing of size seq x seq in memory), so `fused_attention` is on.

use pipewright_kernels_core::{Backend, KernelError, Precision, Tensor};
use pipewright_kernels_cuda::{device_count, CudaBackend, CudaTensor};
use pipewright_plan::efficiency::{fit, MatmulSample};
use pipewright_plan::{Cluster, Efficiency, PeakTflops};

use super::timing::{expected, fastest, matmul_grid};
use super::{CalibrateError, Calibration};

type Result<T> = std::result::Result<T, CalibrateError>;

/// Matmul dimensions tried (each pair of them as m and n) and the inner dimension: from
/// launch-bound to a tensor-core-saturating 8192 x 8192 x 4096.
const DIMS: [usize; 4] = [128, 512, 2048, 8192];
const K: usize = 4096;

/// Time `f` (which queues GPU work) to completion, fastest of several runs; its first error
/// ends the measurement.
fn timed(gpu: &CudaBackend, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut failed = None;
    let secs = fastest(|| {
        if failed.is_none() {
            failed = f().and_then(|()| Ok(gpu.synchronize()?)).err();
        }
    });
    failed.map_or(Ok(secs), Err)
}

fn matmuls(gpu: &CudaBackend) -> Result<Vec<MatmulSample>> {
    matmul_grid(&DIMS, K, |m, n, k| {
        let x = gpu.upload(&Tensor::new(&[m, k], vec![0.5; m * k])?)?;
        let w = gpu.upload(&Tensor::new(&[k, n], vec![0.25; k * n])?)?;
        let mut y: Option<CudaTensor> = None;
        let secs = timed(gpu, || {
            y = Some(gpu.matmul(&x, &w)?);
            Ok(())
        })?;
        let wrong = || CalibrateError::WrongResult {
            what: format!("matmul {m}x{k}x{n} on the GPU"),
        };
        let host = gpu.download(&y.ok_or_else(wrong)?)?;
        if host.data().first() != Some(&expected(k)) || host.data().last() != Some(&expected(k)) {
            return Err(wrong());
        }
        Ok(secs)
    })
}

/// Bytes per second of a device copy and of GeLU over 64 Mi f32s (read plus written).
fn bandwidths(gpu: &CudaBackend) -> Result<(f64, f64)> {
    let len = 64 << 20;
    let t = gpu.upload(&Tensor::new(&[len], vec![0.5; len])?)?;
    let bytes = 2.0 * 4.0 * len as f64;
    let copy = timed(gpu, || gpu.copy(&t).map(drop).map_err(Into::into))?;
    let gelu = timed(gpu, || gpu.gelu(&t).map(drop).map_err(Into::into))?;
    Ok((bytes / copy, bytes / gelu))
}

/// GPU `ordinal` as a cluster of one node of this machine's GPUs, with `links`' links, and a
/// line saying what was measured.
pub fn cuda(ordinal: usize, links: &Cluster) -> Result<Calibration> {
    let unavailable = |e: KernelError| match e {
        KernelError::CudaUnavailable(why) => CalibrateError::NoGpu { ordinal, why },
        e => CalibrateError::Kernel(e),
    };
    let gpus = device_count().map_err(unavailable)?;
    let mut gpu = CudaBackend::new(ordinal).map_err(unavailable)?;
    let name = gpu.device_name()?;
    let mut peaks = [0.0; 3];
    let mut half_dim = 0.0;
    for (i, p) in [Precision::F32, Precision::Tf32, Precision::Bf16]
        .into_iter()
        .enumerate()
    {
        gpu = gpu.with_precision(p);
        let samples = matmuls(&gpu)?;
        let (peak, half) = fit(&samples).ok_or_else(|| CalibrateError::NoRate {
            what: format!("{p:?}"),
        })?;
        peaks[i] = peak / 1e12;
        half_dim = half;
    }
    gpu = gpu.with_precision(Precision::F32);
    let (copy, elementwise) = bandwidths(&gpu)?;
    let total = gpu.device_memory()?.map_or(0, |(_, total)| total);
    let memory_gib = total as f64 / f64::from(1u32 << 30);
    let cluster = Cluster {
        name: format!("local-{}", name.to_lowercase().replace(' ', "-")),
        gpus_per_node: gpus.max(1) as u32,
        memory_gib: (memory_gib * 10.0).floor() / 10.0,
        peak_tflops: PeakTflops {
            f32: peaks[0],
            tf32: peaks[1],
            bf16: peaks[2],
            fp8: None,
        },
        memory_bandwidth_gbs: copy.min(elementwise) / 1e9,
        intra_node: links.intra_node,
        inter_node: links.inter_node,
        efficiency: Efficiency {
            peak_fraction: 1.0,
            half_dim,
            fused_attention: true,
        },
        source: Some(format!(
            "pipewright calibration of cuda:{ordinal}, {name}: {n} matmul shapes per precision fitted, a 256 MiB device copy, GeLU; links from the {} preset (not measured)",
            links.name,
            n = DIMS.len() * DIMS.len()
        )),
    };
    let summary = format!(
        "{name}: matmul peaks f32 {:.1}, tf32 {:.1}, bf16 {:.1} TFLOP/s (bf16 half rate at dimension {half_dim:.0}); copy {:.0} GB/s, element-wise {:.0} GB/s; {gpus} GPUs of {:.1} GiB; links from {}",
        peaks[0],
        peaks[1],
        peaks[2],
        copy / 1e9,
        elementwise / 1e9,
        cluster.memory_gib,
        links.name
    );
    Ok(Calibration { cluster, summary })
}
