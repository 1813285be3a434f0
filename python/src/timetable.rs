//! `Timetable`, `generate`, `validate`: the timetable IR and its text forms.

use pipewright_input::{expect_kind, timetable_fits, FileKind};
use pipewright_schedule::{
    from_csv, generate as gen, lower, recompute, validate_with, write_csv, CsvForm, CsvSource,
    RawSpec, RecomputePlan, ScheduleSpec, Semantics, Timetable as Tt,
};
use pyo3::prelude::*;

use crate::{err, read_file};

/// A form's Python name.
pub(crate) fn form_name(f: CsvForm) -> &'static str {
    match f {
        CsvForm::ComputeOnly => "compute_only",
        CsvForm::ComputeComms => "compute_comms",
        CsvForm::Lowered => "lowered",
    }
}

fn parse_form(s: &str) -> PyResult<CsvForm> {
    match s {
        "compute_only" => Ok(CsvForm::ComputeOnly),
        "compute_comms" => Ok(CsvForm::ComputeComms),
        "lowered" => Ok(CsvForm::Lowered),
        _ => Err(err(format!(
            "form `{s}`: expected compute_only (PyTorch's default), compute_comms (PyTorch's format=\"compute_comms\") or lowered (pipewright's own rows)"
        ))),
    }
}

/// A complete plan of one training step: for each device, the actions it runs, in order.
#[pyclass(module = "pipewright", frozen)]
#[derive(Clone)]
pub struct Timetable {
    pub(crate) inner: Tt,
    /// The CSV form it was read from, if it was.
    form: Option<CsvForm>,
    /// The recompute policy `generate` inserted (or a plan's best runs), for the memory
    /// model of `simulate` (as the CLI's `--recompute` reaches it); none for a timetable read
    /// from text, whose `R` actions the model takes as full recomputation.
    pub(crate) recompute: RecomputePlan,
}

impl Timetable {
    pub(crate) fn new(inner: Tt) -> Self {
        Timetable {
            inner,
            form: None,
            recompute: RecomputePlan::default(),
        }
    }

    /// `inner`, derived from this timetable, keeping its recompute policy.
    fn derived(&self, inner: Tt) -> Self {
        Timetable {
            recompute: self.recompute.clone(),
            ..Timetable::new(inner)
        }
    }
}

/// Parse timetable text (CSV in any form, or JSON when it starts with `{`), and with `check`
/// validate it, naming `name` and for CSV the line and column, as the CLI does.
fn parse(text: &str, name: &str, check: bool) -> PyResult<Timetable> {
    let (tt, source): (Tt, Option<CsvSource>) = if text.trim_start().starts_with(['{', '[']) {
        // A timeline or a cost file given as a timetable is named for what it is, as the CLI.
        expect_kind(name, text, FileKind::Timetable).map_err(crate::input_err)?;
        let tt = serde_json::from_str(text).map_err(|e| err(format!("{name}: {e}")))?;
        (tt, None)
    } else {
        let (tt, src) = from_csv(text).map_err(|e| err(format!("{name}: {e}")))?;
        (tt, Some(src))
    };
    // Validating and simulating cost memory per action: refused here when they would not
    // fit, as the CLI's reader refuses it.
    timetable_fits(name, (tt.compute_len() / 2) as u64, 1).map_err(err)?;
    if check {
        if let Err(e) = validate_with(&tt, Semantics::Buffered) {
            return Err(match source.as_ref().and_then(|s| s.locate(&e)) {
                Some((line, col)) => err(format!("{name}:{line}:{col}: {e}")),
                None => err(format!("{name}: {e}")),
            });
        }
    }
    Ok(Timetable {
        form: source.map(|s| s.form()),
        ..Timetable::new(tt)
    })
}

#[pymethods]
impl Timetable {
    /// Read a timetable from CSV text: PyTorch's compute-only or compute+comms form, or
    /// pipewright's lowered rows. Validated unless `validate=False`.
    #[staticmethod]
    #[pyo3(signature = (text, validate = true))]
    fn from_csv(text: &str, validate: bool) -> PyResult<Self> {
        parse(
            text.strip_prefix('\u{feff}').unwrap_or(text),
            "csv",
            validate,
        )
    }

    /// Read a timetable from pipewright's JSON. Validated unless `validate=False`.
    #[staticmethod]
    #[pyo3(signature = (text, validate = true))]
    fn from_json(text: &str, validate: bool) -> PyResult<Self> {
        parse(text, "json", validate)
    }

    /// Read a timetable file (CSV in any form, or JSON), as `pipewright validate` does.
    #[staticmethod]
    #[pyo3(signature = (path, validate = true))]
    fn read(path: std::path::PathBuf, validate: bool) -> PyResult<Self> {
        let name = path.display().to_string();
        parse(&read_file(&path)?, &name, validate)
    }

    /// The timetable as CSV: `form="compute_only"` (PyTorch's `_load_csv` default and
    /// torchtitan's), `"compute_comms"` (PyTorch's `format="compute_comms"`, waits included)
    /// or `"lowered"` (pipewright's own rows). PyTorch's forms refuse what PyTorch cannot run.
    #[pyo3(signature = (form = "compute_only"))]
    fn to_csv(&self, form: &str) -> PyResult<String> {
        let form = parse_form(form)?;
        // The lowered form is the rows with their sends and receives: lowered here when the
        // timetable is not yet, rather than written without them.
        if form == CsvForm::Lowered && !self.inner.is_lowered() {
            let lowered = lower(&self.inner).map_err(err)?;
            return write_csv(&lowered, form).map_err(err);
        }
        write_csv(&self.inner, form).map_err(err)
    }

    /// The timetable as pipewright's JSON (what `schedule -o x.json` writes).
    fn to_json(&self) -> PyResult<String> {
        Ok(serde_json::to_string_pretty(&self.inner).map_err(err)? + "\n")
    }

    /// Write to `path`: `.csv` in PyTorch's compute-only form (compute+comms with
    /// `comms=True`), `.json` in pipewright's. The file is replaced whole or not at all.
    #[pyo3(signature = (path, comms = false))]
    fn write(&self, path: std::path::PathBuf, comms: bool) -> PyResult<()> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let name = path.display();
        let text = match (ext.as_deref(), comms) {
            (Some("csv"), c) => self.to_csv(if c { "compute_comms" } else { "compute_only" })?,
            (Some("json"), false) => self.to_json()?,
            (Some("json"), true) => return Err(err(format!("{name}: comms=True applies to a .csv timetable (PyTorch's compute+comms form); a .json timetable is pipewright's own: lower() it for its sends and receives"))),
            _ => return Err(err(format!("{name}: use a .csv (PyTorch's form) or .json file name, so that the file can be read back"))),
        };
        write_atomic(&path, text.as_bytes())
    }

    /// The same timetable with pipewright's sends and receives (`SEND_F`, `RECV_F`, ...).
    fn lower(&self) -> PyResult<Self> {
        Ok(self.derived(lower(&self.inner).map_err(err)?))
    }

    /// The same timetable without sends and receives.
    fn compute_only(&self) -> Self {
        self.derived(self.inner.compute_only())
    }

    /// A readable grid: one row per device, one column per step.
    fn grid(&self) -> String {
        self.inner.grid(None)
    }

    /// Name of the schedule that made it (`custom` for a CSV).
    #[getter]
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    /// Microbatches per step, m.
    #[getter]
    fn microbatches(&self) -> u32 {
        self.inner.microbatches
    }

    /// Devices (pipeline ranks), p.
    #[getter]
    fn devices(&self) -> u32 {
        self.inner.num_devices()
    }

    /// Stages (model chunks), S.
    #[getter]
    fn stages(&self) -> u32 {
        self.inner.num_stages()
    }

    /// Device of each stage (its rank in PyTorch's pipeline group).
    #[getter]
    fn stage_device(&self) -> Vec<u32> {
        self.inner.stage_device.clone()
    }

    /// Each device's actions, as text (`0F0`, `1SEND_F0`, `(0F1;1B0)OVERLAP_F_B`).
    #[getter]
    fn rows(&self) -> Vec<Vec<String>> {
        self.inner
            .devices
            .iter()
            .map(|r| r.iter().map(ToString::to_string).collect())
            .collect()
    }

    /// Whether it carries sends and receives.
    #[getter]
    fn lowered(&self) -> bool {
        self.inner.is_lowered()
    }

    /// The CSV form it was read from (`compute_only`, `compute_comms`, `lowered`), or None.
    #[getter]
    fn csv_form(&self) -> Option<&'static str> {
        self.form.map(form_name)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Equal content: microbatches, stage placement and every device's actions in order. The
    /// name (the schedule that made it, `custom` once read from a file) is a label, not
    /// content, so a timetable equals itself read back from its own CSV.
    fn __eq__(&self, other: &Self) -> bool {
        self.inner.same_content(&other.inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "Timetable({:?}, devices={}, stages={}, microbatches={}, actions={}{})",
            self.inner.name,
            self.inner.num_devices(),
            self.inner.num_stages(),
            self.inner.microbatches,
            self.inner.len(),
            if self.inner.is_lowered() {
                ", lowered"
            } else {
                ""
            }
        )
    }
}

/// Write `bytes` to `path` through a temporary file beside it, then a rename: the file is
/// replaced whole or left as it was.
pub(crate) fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> PyResult<()> {
    use std::io::Write;
    let name = path.display();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| err(format!("cannot write in {}: {e}", dir.display())))?;
    tmp.write_all(bytes)
        .and_then(|()| keep_permissions(tmp.as_file(), path))
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| err(format!("cannot write {name}: {e}")))?;
    tmp.persist(path)
        .map_err(|e| err(format!("cannot write {name}: {}", e.error)))?;
    Ok(())
}

/// A replaced file keeps its mode; a new one gets the usual 0644, not the temporary file's
/// private 0600.
fn keep_permissions(tmp: &std::fs::File, path: &std::path::Path) -> std::io::Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) => tmp.set_permissions(meta.permissions()),
        #[cfg(unix)]
        Err(_) => {
            use std::os::unix::fs::PermissionsExt;
            tmp.set_permissions(std::fs::Permissions::from_mode(0o644))
        }
        #[cfg(not(unix))]
        Err(_) => Ok(()),
    }
}

/// Generate a timetable of a schedule family.
#[pyfunction]
#[pyo3(signature = (schedule = "1f1b", p = 4, v = 1, m = 8, group_size = None, recompute = "none"))]
fn generate(
    schedule: &str,
    #[pyo3(from_py_with = crate::args::whole)] p: u32,
    #[pyo3(from_py_with = crate::args::whole)] v: u32,
    #[pyo3(from_py_with = crate::args::whole)] m: u32,
    #[pyo3(from_py_with = crate::args::opt_whole)] group_size: Option<u32>,
    recompute: &str,
) -> PyResult<Timetable> {
    let raw = RawSpec {
        schedule: schedule.to_string(),
        devices: p,
        virtual_stages: v,
        microbatches: m,
        group_size,
    };
    let spec = ScheduleSpec::from_raw(&raw).map_err(err)?;
    // What the machine cannot hold is refused before it is built, as `schedule` refuses it.
    let spm = u64::from(p) * u64::from(v) * u64::from(m);
    timetable_fits(&format!("p={p} v={v} m={m}"), spm, 1).map_err(err)?;
    let mut tt = gen(&spec);
    let plan: RecomputePlan = recompute
        .parse()
        .map_err(|e| err(format!("recompute: {e}")))?;
    if !plan.is_none() {
        plan.check(tt.num_stages())
            .map_err(|e| err(format!("recompute: {e}")))?;
        tt = recompute::insert(&tt, &plan);
    }
    Ok(Timetable {
        recompute: plan,
        ..Timetable::new(tt)
    })
}

/// What `validate` proved.
#[pyclass(module = "pipewright", frozen, get_all)]
pub struct Validated {
    /// Compute actions in the timetable.
    compute_actions: usize,
    /// Whether it carries sends and receives.
    lowered: bool,
}

#[pymethods]
impl Validated {
    fn __repr__(&self) -> String {
        format!(
            "Validated(compute_actions={}, lowered={})",
            self.compute_actions,
            if self.lowered { "True" } else { "False" }
        )
    }
}

/// Check a timetable: complete, ordered, paired, deadlock-free (with `rendezvous=True`,
/// also when every send blocks until its receive is posted).
#[pyfunction]
#[pyo3(signature = (timetable, rendezvous = false))]
fn validate(timetable: &Timetable, rendezvous: bool) -> PyResult<Validated> {
    let semantics = if rendezvous {
        Semantics::Rendezvous
    } else {
        Semantics::Buffered
    };
    let v = validate_with(&timetable.inner, semantics).map_err(err)?;
    Ok(Validated {
        compute_actions: v.compute_actions,
        lowered: v.lowered,
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Timetable>()?;
    m.add_class::<Validated>()?;
    m.add_function(wrap_pyfunction!(generate, m)?)?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    Ok(())
}
