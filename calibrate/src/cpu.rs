//! The CPU as a cluster. What is measured (a GPU is measured by [`crate::cuda`] instead):
//! - matmul rates of the kernels' own `matmul_into` over a grid of shapes, fitted to the
//!   efficiency curve (`schedule::plan::efficiency::fit`): the peak a large matmul reaches and
//!   the dimension that halves it;
//! - memory bandwidth: copying a 64 MiB buffer (bytes read plus written over the time), and
//!   the rate element-wise work moves bytes (GeLU: compute-bound on a CPU), the lower of
//!   which is the cluster's `memory_bandwidth_gbs`;
//! - the in-process hand-off: a round trip between two threads over a channel (latency), and
//!   the copy bandwidth (an in-process send moves a tensor's bytes once).
//!
//! One in-process device per core: the cluster is one node of `available_parallelism` GPUs,
//! each with the machine's memory divided among them. bf16 and tf32 are emulated by rounding
//! on the CPU, no faster than f32, so all three peaks are the measured one.

use std::sync::mpsc;

use pipewright_kernels_core::cpu::{gelu, matmul_into};
use pipewright_kernels_core::Tensor;
use pipewright_plan::efficiency::{fit, MatmulSample};
use pipewright_plan::{Cluster, Efficiency, Link, PeakTflops};

use super::timing::{expected, fastest, matmul_grid};
use super::{CalibrateError, Calibration};

type Result<T> = std::result::Result<T, CalibrateError>;

fn matmuls() -> Result<Vec<MatmulSample>> {
    matmul_grid(&[16, 64, 256, 768], 256, |m, n, k| {
        let x = Tensor::new(&[m, k], vec![0.5; m * k])?;
        let w = Tensor::new(&[k, n], vec![0.25; k * n])?;
        let mut y = Tensor::zeros(&[m, n]);
        let secs = fastest(|| {
            // The result is checked below, so the work cannot be skipped.
            let _ = matmul_into(&x, &w, &mut y);
        });
        if y.data().first() != Some(&expected(k)) {
            return Err(CalibrateError::WrongResult {
                what: "matmul".into(),
            });
        }
        Ok(secs)
    })
}

/// Bytes per second of a large copy (read and write both count).
fn copy_bandwidth() -> f64 {
    let len = 16 << 20; // f32s: 64 MiB
    let src = vec![1.0f32; len];
    let mut dst = vec![0.0f32; len];
    let secs = fastest(|| dst.copy_from_slice(&src));
    std::hint::black_box(&dst);
    2.0 * 4.0 * len as f64 / secs
}

/// Bytes per second element-wise work moves on this CPU: GeLU (an `exp` per element) over a
/// 16 MiB tensor, read plus written. On a GPU element-wise kernels run at HBM bandwidth; on
/// a CPU they are compute-bound well below the copy rate, and the plan charges them bytes over
/// this rate.
fn elementwise_bandwidth() -> Result<f64> {
    let len = 4 << 20;
    let x = Tensor::new(&[len], vec![0.5; len])?;
    let mut y = None;
    let secs = fastest(|| y = Some(gelu(&x)));
    std::hint::black_box(&y);
    Ok(2.0 * 4.0 * len as f64 / secs)
}

/// Seconds of one hand-off between two threads (half a round trip).
fn hand_off_latency() -> f64 {
    let (to, from_main) = mpsc::channel::<u32>();
    let (back, from_peer) = mpsc::channel::<u32>();
    let peer = std::thread::spawn(move || {
        while let Ok(x) = from_main.recv() {
            if back.send(x).is_err() {
                break;
            }
        }
    });
    let secs = fastest(|| {
        for i in 0..100 {
            let _ = to.send(i);
            let _ = from_peer.recv();
        }
    });
    drop(to);
    let _ = peer.join();
    secs / 200.0
}

fn memory_gib() -> f64 {
    match pipewright_input::machine_memory() {
        u64::MAX => 0.0, // unknown
        bytes => bytes as f64 / f64::from(1u32 << 30),
    }
}

/// The CPU as a cluster of one node, one in-process device per core, and a line saying what
/// was measured. Takes about a second.
pub fn cpu() -> Result<Calibration> {
    let samples = matmuls()?;
    let (peak, half_dim) =
        fit(&samples).ok_or_else(|| CalibrateError::NoRate { what: "CPU".into() })?;
    let copy = copy_bandwidth();
    let elementwise = elementwise_bandwidth()?.min(copy);
    let latency = hand_off_latency();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let memory = (memory_gib() / f64::from(cores)).max(0.1);
    let tflops = peak / 1e12;
    let link = Link {
        // An in-process send copies the tensor once: half the read-plus-write copy rate.
        bandwidth_gbs: copy / 2.0 / 1e9,
        latency_us: latency * 1e6,
    };
    let cluster = Cluster {
        name: "local-cpu".into(),
        gpus_per_node: cores,
        memory_gib: (memory * 10.0).round() / 10.0,
        peak_tflops: PeakTflops {
            bf16: tflops,
            tf32: tflops,
            f32: tflops,
            fp8: None,
        },
        memory_bandwidth_gbs: elementwise / 1e9,
        intra_node: link,
        inter_node: link,
        efficiency: Efficiency {
            peak_fraction: 1.0,
            half_dim,
            fused_attention: false,
        },
        source: Some(format!(
            "pipewright calibration of the CPU: {} matmul shapes fitted, a 64 MiB copy, a thread round trip",
            samples.len()
        )),
    };
    let summary = format!(
        "matmul: peak {:.1} GFLOP/s, half rate at dimension {:.0} ({} shapes); copy {:.1} GB/s, element-wise {:.1} GB/s; hand-off {:.1} us, {:.1} GB/s; {} devices of {:.1} GiB",
        peak / 1e9,
        half_dim,
        samples.len(),
        copy / 1e9,
        elementwise / 1e9,
        latency * 1e6,
        link.bandwidth_gbs,
        cores,
        cluster.memory_gib
    );
    Ok(Calibration { cluster, summary })
}
