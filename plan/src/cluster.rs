//! A cluster: nodes of GPUs, what one GPU computes and holds, and the links between GPUs.
//!
//! A cluster file is JSON in people's units (the presets are the same struct):
//!
//! ```json
//! { "name": "my-a100", "gpus_per_node": 8, "memory_gib": 80,
//!   "peak_tflops": { "bf16": 312, "tf32": 156, "f32": 19.5 },
//!   "memory_bandwidth_gbs": 2039,
//!   "intra_node": { "bandwidth_gbs": 240, "latency_us": 5 },
//!   "inter_node": { "bandwidth_gbs": 23, "latency_us": 10 },
//!   "efficiency": { "peak_fraction": 0.8, "half_dim": 128, "fused_attention": false } }
//! ```
//!
//! Bandwidths are what one GPU moves in one direction over its share of the link, as a ring
//! collective achieves it (NCCL's "bus bandwidth"), not the marketing bidirectional figure.
//! `efficiency` is optional (see [`Efficiency`]; default: the A100 preset's curve).

use serde::{Deserialize, Serialize};

use super::efficiency::Efficiency;
use super::PlanError;

/// Peak dense (no sparsity) matmul throughput of one GPU per number format, in TFLOP/s.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakTflops {
    /// bf16 (and fp16) tensor cores, f32 accumulation.
    pub bf16: f64,
    /// TF32 tensor cores.
    pub tf32: f64,
    /// Plain f32 (no tensor cores).
    pub f32: f64,
    /// FP8 tensor cores (E4M3/E5M2 inputs, higher-precision accumulation), for `plan --fp8`;
    /// absent on GPUs without them (an A100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<f64>,
}

/// One kind of link: what a GPU achieves on it in one direction, and the fixed cost of a
/// message (or of one step of a ring).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Achievable bandwidth per GPU per direction, GB/s (10^9 bytes per second).
    pub bandwidth_gbs: f64,
    /// Latency of one message or ring step, microseconds.
    pub latency_us: f64,
}

impl Link {
    /// Bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bandwidth_gbs * 1e9
    }
    /// Seconds.
    pub fn latency_s(&self) -> f64 {
        self.latency_us * 1e-6
    }
    /// Time to send `bytes` point to point: latency plus bytes over bandwidth.
    pub fn p2p(&self, bytes: f64) -> f64 {
        if bytes <= 0.0 {
            0.0
        } else {
            self.latency_s() + bytes / self.bytes_per_s()
        }
    }
}

/// A cluster of identical nodes (see the module docs for the file form).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// Name, for people.
    pub name: String,
    /// GPUs in one node (sharing the intra-node link).
    pub gpus_per_node: u32,
    /// Memory of one GPU, GiB (2^30 bytes).
    pub memory_gib: f64,
    /// Peak dense throughput per format.
    pub peak_tflops: PeakTflops,
    /// HBM bandwidth of one GPU, GB/s: what element-wise work and the optimizer step run at.
    pub memory_bandwidth_gbs: f64,
    /// NVLink (or whatever joins the GPUs of a node).
    pub intra_node: Link,
    /// InfiniBand (or whatever joins nodes), per GPU: each GPU has its own NIC.
    pub inter_node: Link,
    /// How close to peak matmuls of a given shape run.
    #[serde(default)]
    pub efficiency: Efficiency,
    /// Where the figures come from, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// Number format of the matmuls (what peak applies): defined once in `pipewright-kinds`,
/// shared with the kernels; the memory model converts it (`MemPrecision: From<Precision>`).
pub use pipewright_kinds::Precision;

impl Cluster {
    /// Peak FLOP/s of one GPU in `precision`.
    pub fn peak_flops(&self, precision: Precision) -> f64 {
        1e12 * match precision {
            Precision::Bf16 => self.peak_tflops.bf16,
            Precision::Tf32 => self.peak_tflops.tf32,
            Precision::F32 => self.peak_tflops.f32,
        }
    }

    /// Peak FP8 FLOP/s of one GPU, where it has FP8 tensor cores.
    pub fn fp8_flops(&self) -> Option<f64> {
        self.peak_tflops.fp8.map(|t| 1e12 * t)
    }

    /// Memory of one GPU in bytes.
    pub fn memory_bytes(&self) -> u64 {
        (self.memory_gib * (1u64 << 30) as f64) as u64
    }

    /// HBM bytes per second.
    pub fn memory_bandwidth(&self) -> f64 {
        self.memory_bandwidth_gbs * 1e9
    }

    /// A preset by name (`a100-80g`, `h100-80g`).
    pub fn preset(name: &str) -> Option<Cluster> {
        match name {
            "a100-80g" => Some(a100_80g()),
            "h100-80g" => Some(h100_80g()),
            _ => None,
        }
    }

    /// Names of the presets, for messages.
    pub const PRESETS: [&'static str; 2] = ["a100-80g", "h100-80g"];

    /// Read and check a cluster file.
    pub fn from_json(text: &str) -> Result<Cluster, PlanError> {
        let c: Cluster = serde_json::from_str(text).map_err(|e| PlanError::ClusterFile {
            line: e.line(),
            column: e.column(),
            message: pipewright_schedule::formats::without_position(&e),
        })?;
        c.check()?;
        Ok(c)
    }

    /// Every figure within [`RANGES`] (what a real device can have, with room to spare), so
    /// a figure in the wrong unit (memory in bytes) or a typo's exponent is refused by name,
    /// not planned into a headroom of -0.0% or a step of 300 digits.
    pub fn check(&self) -> Result<(), PlanError> {
        let figures = [
            self.memory_gib,
            self.peak_tflops.bf16,
            self.peak_tflops.tf32,
            self.peak_tflops.f32,
            self.memory_bandwidth_gbs,
            self.intra_node.bandwidth_gbs,
            self.inter_node.bandwidth_gbs,
            self.intra_node.latency_us,
            self.inter_node.latency_us,
            f64::from(self.gpus_per_node),
        ];
        let fp8 = self.peak_tflops.fp8.map(|v| (v, &FP8_RANGE));
        let ranged = figures.into_iter().zip(RANGES.iter()).chain(fp8);
        for (v, &(what, lo, hi, range)) in ranged {
            if !(v.is_finite() && v >= lo && v <= hi) {
                return Err(PlanError::ClusterRange {
                    what,
                    value: v,
                    range,
                });
            }
        }
        self.efficiency.check()
    }
}

/// Each figure of a cluster file with the range it must lie in, in the order
/// [`Cluster::check`] reads them: `(field, least, most, the range in words)`. The ends are
/// far outside any device built (an H100 has 80 GiB, 989 bf16 TFLOP/s, 3350 GB/s of HBM,
/// 450 GB/s of NVLink a direction), and low enough for a CPU core's share that
/// `plan --calibrate` measures.
pub const RANGES: [(&str, f64, f64, &str); 10] = [
    (
        "memory_gib",
        1.0 / 1024.0,
        65536.0,
        "1/1024 to 65536 GiB (1 MiB to 64 TiB; a figure in bytes is far above it)",
    ),
    ("peak_tflops.bf16", 1e-4, 1e5, "1e-4 to 1e5 TFLOP/s"),
    ("peak_tflops.tf32", 1e-4, 1e5, "1e-4 to 1e5 TFLOP/s"),
    ("peak_tflops.f32", 1e-4, 1e5, "1e-4 to 1e5 TFLOP/s"),
    ("memory_bandwidth_gbs", 1e-3, 1e6, "1e-3 to 1e6 GB/s"),
    ("intra_node.bandwidth_gbs", 1e-3, 1e6, "1e-3 to 1e6 GB/s"),
    ("inter_node.bandwidth_gbs", 1e-3, 1e6, "1e-3 to 1e6 GB/s"),
    (
        "intra_node.latency_us",
        0.0,
        1e6,
        "0 to 1e6 us (one second)",
    ),
    (
        "inter_node.latency_us",
        0.0,
        1e6,
        "0 to 1e6 us (one second)",
    ),
    ("gpus_per_node", 1.0, 4096.0, "1 to 4096"),
];

/// `peak_tflops.fp8`'s range, where a cluster file gives it.
pub const FP8_RANGE: (&str, f64, f64, &str) = ("peak_tflops.fp8", 1e-4, 1e5, "1e-4 to 1e5 TFLOP/s");

/// NVIDIA DGX A100 (80 GB SXM4 GPUs), the machine of Narayanan et al. (SC'21).
///
/// - 8 GPUs per node; 80 GiB HBM2e each (nvidia-smi: 81920 MiB).
/// - Peak dense: bf16 312, TF32 156, FP32 19.5 TFLOP/s (NVIDIA A100 datasheet).
/// - HBM2e 2039 GB/s (A100 80GB SXM datasheet).
/// - NVLink 3 + NVSwitch: 600 GB/s per GPU bidirectional, 300 per direction (datasheet);
///   taken as 240 GB/s achievable ring bandwidth (NCCL all_reduce_perf bus bandwidth on a
///   DGX A100 is typically 230-240 GB/s).
/// - InfiniBand: one ConnectX-6 HDR NIC (200 Gb/s = 25 GB/s per direction) per GPU (DGX A100
///   user guide); taken as 23 GB/s achievable.
/// - Latencies: 5 us per NVLink ring step, 10 us per InfiniBand message (NCCL's small-message
///   latencies are of this order; they matter only for tiny messages here).
pub fn a100_80g() -> Cluster {
    Cluster {
        name: "a100-80g".into(),
        gpus_per_node: 8,
        memory_gib: 80.0,
        peak_tflops: PeakTflops {
            bf16: 312.0,
            tf32: 156.0,
            f32: 19.5,
            fp8: None,
        },
        memory_bandwidth_gbs: 2039.0,
        intra_node: Link {
            bandwidth_gbs: 240.0,
            latency_us: 5.0,
        },
        inter_node: Link {
            bandwidth_gbs: 23.0,
            latency_us: 10.0,
        },
        efficiency: Efficiency::a100(),
        source: Some(
            "NVIDIA A100 datasheet and DGX A100 user guide; achievable link figures as NCCL \
             tests report them (see plan/src/cluster.rs)"
                .into(),
        ),
    }
}

/// NVIDIA DGX H100 (80 GB SXM5 GPUs).
///
/// - 8 GPUs per node; 80 GiB HBM3 each (nvidia-smi: 81559 MiB, taken as 79.6 GiB).
/// - Peak dense: bf16 989, TF32 494, FP32 67, FP8 1979 TFLOP/s (NVIDIA H100 SXM datasheet;
///   its 1979 bf16 and 3958 FP8 figures are with 2:4 sparsity).
/// - HBM3 3350 GB/s (datasheet).
/// - NVLink 4 + NVSwitch: 900 GB/s bidirectional, 450 per direction; taken as 360 GB/s
///   achievable ring bandwidth (80% of nominal, as for the A100).
/// - InfiniBand: one ConnectX-7 NDR NIC (400 Gb/s = 50 GB/s) per GPU (DGX H100 user guide);
///   taken as 45 GB/s achievable.
/// - Latencies as the A100 preset.
pub fn h100_80g() -> Cluster {
    Cluster {
        name: "h100-80g".into(),
        gpus_per_node: 8,
        memory_gib: 79.6,
        peak_tflops: PeakTflops {
            bf16: 989.0,
            tf32: 494.0,
            f32: 67.0,
            fp8: Some(1979.0),
        },
        memory_bandwidth_gbs: 3350.0,
        intra_node: Link {
            bandwidth_gbs: 360.0,
            latency_us: 5.0,
        },
        inter_node: Link {
            bandwidth_gbs: 45.0,
            latency_us: 10.0,
        },
        efficiency: Efficiency::h100(),
        source: Some(
            "NVIDIA H100 SXM datasheet and DGX H100 user guide; achievable link figures at \
             80-90% of nominal (see plan/src/cluster.rs)"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_round_trip_through_the_file_form() {
        for name in Cluster::PRESETS {
            let c = Cluster::preset(name).unwrap();
            let text = serde_json::to_string(&c).unwrap();
            assert_eq!(Cluster::from_json(&text).unwrap(), c);
        }
    }

    #[test]
    fn a_bad_figure_is_named() {
        let mut c = a100_80g();
        c.intra_node.bandwidth_gbs = 0.0;
        let text = serde_json::to_string(&c).unwrap();
        let e = Cluster::from_json(&text).unwrap_err().to_string();
        assert!(e.contains("intra_node.bandwidth_gbs"), "{e}");
        let e = Cluster::from_json("{\"name\": 1}").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
    }
}
