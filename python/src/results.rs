//! Typed result records (issue 34): what `search`, `sweep`, `simulate` and `plan` hand back
//! inside their results, as classes with typed attributes instead of dicts. Each keeps the
//! library's own record and gives `to_dict()` (the dict these results were before, the JSON
//! the CLI prints) and, for code written against those dicts, `r["key"]` and `r == dict`.

use pipewright_model::memory::MemoryBreakdown;
use pipewright_plan::row::PlanRow as RsPlanRow;
use pipewright_plan::Config;
use pipewright_search::{Candidate as RsCandidate, CutShort as RsCutShort, Skipped as RsSkipped};
use pipewright_sim::simulate::{Bubbles as RsBubbles, DeviceReport as RsDevice};
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::Serialize;

use crate::to_py;

/// A serde value's JSON string form (a unit enum's name, as the dict gives it).
fn serde_str<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(e) => e.to_string(),
    }
}

/// A bool as Python writes it in a repr.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// A record class over a library record `$inner`: one getter per listed attribute (computed
/// from the record bound to `$r`), `to_dict` (the JSON of `$dict`), `__getitem__`, `__eq__`
/// and `__repr__`. One macro, so that every record answers the same four ways.
macro_rules! record {
    (
        $(#[$doc:meta])*
        $name:ident($inner:ty) |$r:ident, $py:ident| {
            $($(#[$fdoc:meta])* $field:ident: $fty:ty = $get:expr;)*
        }
        dict = $dict:expr;
        repr = $repr:expr;
    ) => {
        $(#[$doc])*
        #[pyclass(module = "pipewright", frozen)]
        pub struct $name {
            pub(crate) inner: $inner,
        }

        impl $name {
            fn dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
                let $r = &self.inner;
                to_py(py, &$dict)
            }
        }

        #[pymethods]
        impl $name {
            $(
                $(#[$fdoc])*
                #[getter]
                #[allow(unused_variables)]
                fn $field(&self, $py: Python<'_>) -> $fty {
                    let $r = &self.inner;
                    $get
                }
            )*

            /// The record as the dict it was before it was a class (the CLI's JSON).
            fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
                self.dict(py)
            }

            /// `r["key"]`, kept for code written when this was a dict: `to_dict()[key]`.
            fn __getitem__(&self, py: Python<'_>, key: &str) -> PyResult<Py<PyAny>> {
                let dict = self.dict(py)?;
                match dict.bind(py).cast::<PyDict>()?.get_item(key)? {
                    Some(value) => Ok(value.unbind()),
                    None => Err(PyKeyError::new_err(format!(
                        "{}: no key {key:?} (its keys are its attributes)",
                        stringify!($name)
                    ))),
                }
            }

            /// Equal records, or a dict equal to `to_dict()` (as when this was a dict).
            fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
                if let Ok(o) = other.cast::<Self>() {
                    return Ok(o.get().inner == self.inner);
                }
                if other.is_instance_of::<PyDict>() {
                    return self.dict(py)?.bind(py).eq(other);
                }
                Ok(false)
            }

            fn __repr__(&self) -> String {
                let $r = &self.inner;
                $repr
            }
        }
    };
}

record! {
    /// Bubble fractions, each `1 - ideal / time` for one notion of a step's time.
    Bubbles(RsBubbles) |r, py| {
        /// Against the single-step makespan (steps fenced by a barrier).
        single_step: f64 = r.single_step;
        /// Against the steady-state period (unfenced steps, as training runs).
        steady_state: f64 = r.steady_state;
        /// Against the largest per-device span of one step.
        largest_span: f64 = r.largest_span;
    }
    dict = r;
    repr = format!(
        "Bubbles(single_step={:.4}, steady_state={:.4}, largest_span={:.4})",
        r.single_step, r.steady_state, r.largest_span
    );
}

record! {
    /// One timetable `search` evaluated.
    Candidate(RsCandidate) |r, py| {
        /// What made it, e.g. `interleaved-1f1b v=2` or `list v=1 loop, I/W, cap 8`.
        label: String = r.label.clone();
        /// Family name, or `list`.
        family: String = r.family.clone();
        /// Chunks per device.
        virtual_stages: u32 = r.virtual_stages;
        /// Simulated time of one step on its own.
        makespan: f64 = r.makespan;
        /// `1 - ideal / makespan`.
        bubble_fraction: f64 = r.bubble_fraction;
        /// Steady-state time per step.
        period: f64 = r.period;
        /// Bubbles against the makespan, the period and the largest span.
        bubble: Bubbles = Bubbles { inner: r.bubble };
        /// Peak stashed activations of the fullest device, in microbatch units.
        peak_microbatches: f64 = r.peak_microbatches;
        /// The same in bytes (with a shape and a cap in bytes, the predicted total), if known.
        peak_bytes: Option<u64> = r.peak_bytes;
        /// Whether it fits the cap.
        fits: bool = r.fits;
        /// `R` actions the cap forced.
        recomputes: u32 = r.recomputes;
    }
    dict = r;
    repr = format!(
        "Candidate({:?}, period={}, makespan={}, peak_microbatches={}, fits={})",
        r.label, r.period, r.makespan, r.peak_microbatches, py_bool(r.fits)
    );
}

record! {
    /// A shape `search` could not try, and why.
    Skipped(RsSkipped) |r, py| {
        /// What it would have been.
        label: String = r.label.clone();
        /// Why not.
        reason: String = r.reason.clone();
    }
    dict = r;
    repr = format!("Skipped({:?}: {})", r.label, r.reason);
}

record! {
    /// A search its time budget stopped early: the best is the best of those evaluated.
    CutShort(RsCutShort) |r, py| {
        /// The budget, seconds.
        budget_seconds: f64 = r.budget_seconds;
        /// Candidates evaluated.
        evaluated: usize = r.evaluated;
        /// Candidates there were.
        total: usize = r.total;
    }
    dict = r;
    repr = format!(
        "CutShort(budget_seconds={}, evaluated={}, total={})",
        r.budget_seconds, r.evaluated, r.total
    );
}

/// A memory peak's dict: bytes by category and their `total`.
fn peak_value(m: &MemoryBreakdown) -> serde_json::Value {
    let mut v = serde_json::to_value(m).unwrap_or_default();
    v["total"] = m.total().into();
    v
}

record! {
    /// One device's memory, bytes by category and their `total` (a predicted peak).
    MemoryPeak(MemoryBreakdown) |r, py| {
        /// Parameter values (master weights included).
        parameters: u64 = r.parameters;
        /// Accumulated gradients.
        gradients: u64 = r.gradients;
        /// Optimizer state (under ZeRO-1 the rank's shard).
        optimizer_state: u64 = r.optimizer_state;
        /// Activations stashed for backwards.
        activations: u64 = r.activations;
        /// Communication buffers.
        buffers: u64 = r.buffers;
        /// Scratch of the compute itself.
        workspace: u64 = r.workspace;
        /// Every category together.
        total: u64 = r.total();
    }
    dict = peak_value(r);
    repr = format!("MemoryPeak(total={}, activations={})", r.total(), r.activations);
}

/// Each device's memory peak as a `MemoryPeak`.
pub(crate) fn peaks(memory: &[MemoryBreakdown]) -> Vec<MemoryPeak> {
    memory.iter().map(|&inner| MemoryPeak { inner }).collect()
}

record! {
    /// One device's figures in a simulated step.
    DeviceReport(RsDevice) |r, py| {
        /// Device index.
        device: u32 = r.device;
        /// Time in compute actions (communication inside them included).
        busy: f64 = r.busy;
        /// `1 - busy / makespan`.
        bubble_fraction: f64 = r.bubble_fraction;
        /// Most microbatch-stages with stashed activations at once.
        peak_activations: u32 = r.peak_activations;
        /// Most stashed activation bytes at once.
        peak_activation_bytes: u64 = r.peak_activation_bytes;
        /// Stashed activations over time, a step function: `(time, count, bytes)` each.
        memory: Vec<(f64, u32, u64)> = r.memory.iter().map(|s| (s.time, s.count, s.bytes)).collect();
        /// Communication inside its actions (0 for dense costs).
        comm: f64 = r.comm;
        /// Of `comm`, what overlaps hid.
        comm_hidden: f64 = r.comm_hidden;
        /// `comm_hidden / comm` (0 with no communication).
        comm_hidden_share: f64 = r.comm_hidden_share;
    }
    dict = r;
    repr = format!(
        "DeviceReport(device={}, busy={}, bubble_fraction={:.4}, peak_activations={})",
        r.device, r.busy, r.bubble_fraction, r.peak_activations
    );
}

record! {
    /// One configuration of a plan: how the GPUs are split and the schedule run.
    PlanConfig(Config) |r, py| {
        /// Tensor-parallel ranks per stage.
        tp: u32 = r.tp;
        /// Pipeline devices.
        pp: u32 = r.pp;
        /// Data-parallel replicas.
        dp: u32 = r.dp;
        /// Model chunks per pipeline device.
        v: u32 = r.v;
        /// Sequences (a profile's samples) per microbatch.
        microbatch_size: u64 = r.microbatch_size;
        /// Microbatches per step per replica.
        microbatches: u32 = r.microbatches;
        /// Schedule family.
        schedule: String = serde_str(&r.schedule);
        /// Recomputation (`none`, `selective`, `full`).
        recompute: String = serde_str(&r.recompute);
        /// Pipeline devices, from the first, whose stages recompute.
        recompute_devices: u32 = r.recompute_devices;
        /// ZeRO level (0 or 1).
        zero: u8 = r.zero;
        /// Sequence parallelism in the TP group.
        sequence_parallel: bool = r.sequence_parallel;
    }
    dict = r;
    repr = format!(
        "PlanConfig(tp={}, pp={}, dp={}, {} v={}, microbatch_size={}, microbatches={}, recompute={})",
        r.tp, r.pp, r.dp, serde_str(&r.schedule), r.v, r.microbatch_size, r.microbatches,
        serde_str(&r.recompute)
    );
}

/// A plan row's part still given as JSON (`terms`, `limit`, `searched`), or None.
fn json_part<T: Serialize>(py: Python<'_>, value: Option<&T>) -> PyResult<Option<Py<PyAny>>> {
    value.map(|v| to_py(py, v)).transpose()
}

record! {
    /// One ranked configuration of a plan with its predicted figures.
    PlanRow(RsPlanRow) |r, py| {
        /// The configuration.
        config: PlanConfig = PlanConfig { inner: r.config };
        /// Predicted time per training step (steady-state period), seconds.
        step_time_s: f64 = r.step_time_s;
        /// Tokens per second over the cluster (None for a profile).
        tokens_per_s: Option<f64> = r.tokens_per_s;
        /// Sequences (a profile's samples) per second over the cluster.
        samples_per_s: f64 = r.samples_per_s;
        /// Achieved TFLOP/s per GPU (None for a profile without FLOPs).
        tflops_per_gpu: Option<f64> = r.tflops_per_gpu;
        /// Model FLOPs utilisation (None for a profile without FLOPs).
        mfu: Option<f64> = r.mfu;
        /// Peak memory of the fullest GPU, bytes.
        peak_memory_bytes: u64 = r.peak_memory_bytes;
        /// GPU memory minus that peak (negative: does not fit).
        headroom_bytes: i64 = r.headroom_bytes;
        /// Per pipeline device, the memory model's peak by category.
        memory: Vec<MemoryPeak> = peaks(&r.memory);
        /// Fraction of the step the busiest device idles.
        bubble: f64 = r.bubble;
        /// The closed-form lower bound the search ordered it by, seconds.
        bound_s: f64 = r.bound_s;
        /// Where the step time goes, as a dict (top rows only; else None).
        terms: PyResult<Option<Py<PyAny>>> = json_part(py, r.terms.as_ref());
        /// What limits it, as a dict (top rows only; else None).
        limit: PyResult<Option<Py<PyAny>>> = json_part(py, r.limit.as_ref());
        /// Set when its timetable came from `search`: its label and the best fixed family
        /// beside it, as a dict; else None.
        searched: PyResult<Option<Py<PyAny>>> = json_part(py, r.searched.as_deref());
    }
    dict = r;
    repr = format!(
        "PlanRow(tp={} pp={} dp={} {} v={} m={}, step_time_s={:.4}, peak_memory_bytes={})",
        r.config.tp, r.config.pp, r.config.dp, serde_str(&r.config.schedule), r.config.v,
        r.config.microbatches, r.step_time_s, r.peak_memory_bytes
    );
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Bubbles>()?;
    m.add_class::<Candidate>()?;
    m.add_class::<Skipped>()?;
    m.add_class::<CutShort>()?;
    m.add_class::<MemoryPeak>()?;
    m.add_class::<DeviceReport>()?;
    m.add_class::<PlanConfig>()?;
    m.add_class::<PlanRow>()?;
    Ok(())
}
