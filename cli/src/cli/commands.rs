//! `schedule`, `validate` and `simulate`.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use pipewright::schedule::{
    chrome_trace, lower, validate, validate_with, Report, Semantics, Simulation,
};

use super::args::{CostArgs, SourceArgs, SpecArgs};
use super::checks::{extension, Kind, Output};
use super::console;
use super::io::load_timetable;
use super::memory::{memory_table, MemoryArgs};
use super::outputs::Outputs;
use super::timetable_out::CommsArg;
use pipewright::schedule::memory::MemoryBreakdown;
use pipewright::schedule::simulate::{Simulated, SteadyState};

/// How `schedule` prints a timetable.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimetableFormat {
    /// One row per device, one column per step.
    Grid,
    /// PyTorch pipelining CSV, one row per rank.
    Csv,
    /// pipewright JSON.
    Json,
}

/// Text or JSON.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportFormat {
    /// A table for people.
    Table,
    /// JSON for programs.
    Json,
}

/// Generate a timetable and print or save it.
#[derive(Args, Debug)]
pub struct ScheduleCmd {
    #[command(flatten)]
    spec: SpecArgs,
    /// Output form (default: grid, or with -o the form its extension names: .csv or .json;
    /// the grid is for people and goes to standard output only).
    #[arg(long, value_enum)]
    format: Option<TimetableFormat>,
    /// Add pipewright's sends and receives between devices (SEND_F, RECV_F, SEND_B, RECV_B)
    /// to the grid or JSON. PyTorch's CSV places its own: ask for them with --comms.
    #[arg(long)]
    lower: bool,
    #[command(flatten)]
    comms: CommsArg,
    /// Add a recompute `R` right before each backward of the stages named: `none`, `full`,
    /// `selective`, or per stage (`0:full,1:selective`).
    #[arg(long, default_value = "none", value_name = "POLICY", value_parser = super::args::parse_recompute)]
    recompute: pipewright::schedule::RecomputePlan,
    /// Write to this file (atomically) instead of standard output.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
}

impl ScheduleCmd {
    pub fn run(&self) -> Result<()> {
        let (format, mut outs) = self.format()?;
        let spec = self.spec.spec()?;
        self.spec.fits(1)?;
        let mut tt = pipewright::schedule::generate(&spec);
        if !self.recompute.is_none() {
            self.recompute
                .check(tt.num_stages())
                .map_err(|e| anyhow::anyhow!("--recompute: {e}"))?;
            tt = pipewright::schedule::recompute::insert(&tt, &self.recompute);
        }
        if self.lower {
            tt = lower(&tt)?;
        }
        validate(&tt)?;
        let text = match format {
            TimetableFormat::Grid => format!("{spec}\n{}", tt.grid(None)),
            TimetableFormat::Csv => self.comms.csv(&tt)?,
            TimetableFormat::Json => serde_json::to_string_pretty(&tt)? + "\n",
        };
        if outs.has("-o") {
            outs.stage("-o", text.as_bytes())?;
            return outs.commit();
        }
        console::print(&text)
    }
}

impl ScheduleCmd {
    /// The output form: --format, else -o's extension; a file's extension must name the
    /// form written into it, so that what is written can be read back.
    fn format(&self) -> Result<(TimetableFormat, Outputs)> {
        let Some(path) = &self.output else {
            let format = self.format.unwrap_or(TimetableFormat::Grid);
            self.check_forms(format)?;
            let outs = Outputs::plan([], [])?;
            return Ok((format, outs));
        };
        let by_ext = match extension(path).as_deref() {
            Some("csv") => Some(TimetableFormat::Csv),
            Some("json") => Some(TimetableFormat::Json),
            _ => None,
        };
        if self.format == Some(TimetableFormat::Grid) || extension(path).as_deref() == Some("txt") {
            bail!(
                "-o {}: the grid is for people and nothing reads it back; write a timetable as .csv (PyTorch's form) or .json, or print the grid (--format grid) to standard output",
                path.display()
            );
        }
        let format = match (self.format, by_ext) {
            (Some(f), Some(e)) if f != e => bail!(
                "-o {} holds {:?} but --format {:?} was asked for: use a .{} file name or leave --format out",
                path.display(),
                e,
                f,
                match f {
                    TimetableFormat::Json => "json",
                    _ => "csv",
                }
            ),
            (_, Some(e)) => e,
            (Some(_), None) | (None, None) => bail!(
                "-o {}: use a .csv (PyTorch's form) or .json file name",
                path.display()
            ),
        };
        self.check_forms(format)?;
        let outs = Outputs::plan([], [Output::new("-o", Some(path), Kind::Timetable)])?;
        Ok((format, outs))
    }
}

impl ScheduleCmd {
    /// `--comms` is for CSV; `--lower` is pipewright's own sends and receives, which a CSV
    /// for PyTorch does not carry.
    fn check_forms(&self, format: TimetableFormat) -> Result<()> {
        match format {
            TimetableFormat::Csv if self.lower && !self.comms.comms => bail!(
                "--lower adds pipewright's own sends and receives, which PyTorch does not read: use --comms for PyTorch's compute+comms CSV, or a .json file for pipewright's lowered timetable"
            ),
            TimetableFormat::Csv => Ok(()),
            _ if self.comms.comms => bail!(
                "--comms applies to CSV (PyTorch's compute+comms form): use a .csv file or --format csv, or --lower for pipewright's own sends and receives"
            ),
            _ => Ok(()),
        }
    }
}

/// Check a timetable file.
#[derive(Args, Debug)]
pub struct ValidateCmd {
    /// Timetable: PyTorch CSV (one row per rank, e.g. `0F0,0F1,0B0,0B1`) or pipewright JSON.
    file: PathBuf,
    /// Also require the timetable to run when every send blocks until its receive is posted.
    #[arg(long)]
    rendezvous: bool,
    /// On failure, print the timetable grid with the failing step marked (to stderr).
    #[arg(long)]
    grid: bool,
    /// Output form of the verdict.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
}

impl ValidateCmd {
    pub fn run(&self) -> Result<()> {
        let verdict = self.verdict();
        let text = match (&verdict, self.format) {
            (Ok(v), ReportFormat::Json) => v.to_string(),
            (Ok(v), ReportFormat::Table) => format!(
                "{}: valid: {} devices, {} stages, {} microbatches, {} compute actions{}",
                self.file.display(),
                v["devices"],
                v["stages"],
                v["microbatches"],
                v["compute_actions"],
                if v["lowered"] == true {
                    ", lowered"
                } else {
                    ""
                }
            ),
            // A program reading the verdict gets one on failure too; the error line follows.
            (Err(e), ReportFormat::Json) => serde_json::json!({"valid": false,
                "file": self.file.display().to_string(), "error": console::one_line(e)})
            .to_string(),
            (Err(_), ReportFormat::Table) => return verdict.map(drop),
        };
        console::println(&text)?;
        verdict.map(drop)
    }

    /// The verdict as JSON: the timetable's shape when it is valid.
    fn verdict(&self) -> Result<serde_json::Value> {
        let tt = match load_timetable(&self.file) {
            Ok(tt) => tt,
            Err(e) => {
                if let (true, Some(bad)) =
                    (self.grid, e.downcast_ref::<super::io::InvalidTimetable>())
                {
                    console::note(bad.grid.trim_end());
                }
                return Err(e);
            }
        };
        let semantics = if self.rendezvous {
            Semantics::Rendezvous
        } else {
            Semantics::Buffered
        };
        // Read means validated (buffered); only rendezvous sends need a second look.
        let v = match semantics {
            Semantics::Buffered => tt.facts(),
            Semantics::Rendezvous => validate_with(&tt, semantics)
                .map_err(|e| anyhow::anyhow!("{}: {e}", self.file.display()))?,
        };
        let (p, s, m) = (tt.num_devices(), tt.num_stages(), tt.microbatches);
        Ok(
            serde_json::json!({"valid": true, "devices": p, "stages": s, "microbatches": m,
            "compute_actions": v.compute_actions, "lowered": v.lowered}),
        )
    }
}

/// Simulate one step with real durations.
#[derive(Args, Debug)]
pub struct SimulateCmd {
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    costs: CostArgs,
    /// Output form of the report.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Also write the timeline (every event with start and end) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Also write a Chrome trace (open in Perfetto or chrome://tracing) to this file.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Simulate K steps back to back, unfenced as the runtime trains (each device starts its
    /// next step after its own last action and optimizer step): per-step makespans, the
    /// steady-state period, and the bubble both ways (`single_step`, `steady_state`).
    /// --timeline and --trace then hold all K steps.
    #[arg(long, default_value_t = 1, value_name = "K")]
    steps: u32,
    /// With --format json, add each device's stashed activations over time (`memory`: a
    /// sample at every change, as large as the timeline); without it the JSON is the summary.
    #[arg(long)]
    memory_series: bool,
    #[command(flatten)]
    memory: MemoryArgs,
}

impl SimulateCmd {
    pub fn run(&self) -> Result<()> {
        let mut outs = Outputs::plan(
            self.source
                .inputs()
                .chain(self.costs.inputs())
                .chain(self.memory.inputs()),
            [
                Output::new("--timeline", self.timeline.as_ref(), Kind::Json),
                Output::new("--trace", self.trace.as_ref(), Kind::Json),
            ],
        )?;
        super::steady::check_steps(self.steps)?;
        if self.memory_series && self.format != ReportFormat::Json {
            bail!("--memory-series adds to the JSON report: give --format json too");
        }
        if self.memory_series && self.steps > 1 {
            bail!(
                "--memory-series is a single step's series: leave it out with --steps {}",
                self.steps
            );
        }
        let memory = self.predicted()?;
        // The request decides one step or K; a spinner while K unfenced steps simulate.
        let spinner = (self.steps > 1)
            .then(|| super::progress::working(format!("simulate: {} unfenced steps", self.steps)));
        let simulated = super::steady::simulated(&self.source, &self.costs, self.steps);
        if let Some(spinner) = spinner {
            spinner.finish_and_clear();
        }
        let text = match simulated? {
            Simulated::One(sim) => self.one_step(&sim, memory.as_deref(), &mut outs)?,
            Simulated::Steady(s) => self.steady(&s, memory.as_deref(), &mut outs)?,
        };
        outs.commit()?;
        console::print(&text)
    }

    /// One step: its report, with each device's memory series only when asked for.
    fn one_step(
        &self,
        sim: &Simulation,
        memory: Option<&[MemoryBreakdown]>,
        outs: &mut Outputs,
    ) -> Result<String> {
        self.write_timeline(&sim.timeline, outs)?;
        Ok(match self.format {
            ReportFormat::Json => {
                let mut report = serde_json::to_value(&sim.report)?;
                if !self.memory_series {
                    drop_memory_series(&mut report);
                }
                let report = with_memory(report, memory)?;
                serde_json::to_string_pretty(&report)? + "\n"
            }
            ReportFormat::Table => {
                table(&title(&self.source, sim), &sim.report)
                    + &memory.map(memory_table).unwrap_or_default()
            }
        })
    }

    /// `--steps K` with K > 1: the steady-state report.
    fn steady(
        &self,
        s: &SteadyState,
        memory: Option<&[MemoryBreakdown]>,
        outs: &mut Outputs,
    ) -> Result<String> {
        use super::steady::{steady_json, steady_table};
        self.write_timeline(&s.timeline, outs)?;
        Ok(match self.format {
            ReportFormat::Json => {
                let report = with_memory(steady_json(s), memory)?;
                serde_json::to_string_pretty(&report)? + "\n"
            }
            ReportFormat::Table => {
                steady_table(&title(&self.source, &s.single), s)
                    + &memory.map(memory_table).unwrap_or_default()
            }
        })
    }

    /// Each device's predicted memory, when the model's shape is given.
    fn predicted(&self) -> Result<Option<Vec<MemoryBreakdown>>> {
        if !self.memory.given()? {
            return Ok(None);
        }
        let (tt, _) = self.source.timetable()?;
        self.memory.predict(&tt, &self.source.recompute)
    }

    fn write_timeline(
        &self,
        timeline: &pipewright::schedule::Timeline,
        outs: &mut Outputs,
    ) -> Result<()> {
        if outs.has("--timeline") {
            outs.stage("--timeline", serde_json::to_string(timeline)?.as_bytes())?;
        }
        if outs.has("--trace") {
            let trace = serde_json::to_string(&chrome_trace(timeline))?;
            outs.stage("--trace", trace.as_bytes())?;
        }
        Ok(())
    }
}

/// The summary: each device's figures without its sample of every change in memory.
fn drop_memory_series(report: &mut serde_json::Value) {
    if let Some(devices) = report["devices"].as_array_mut() {
        for d in devices.iter_mut().filter_map(|d| d.as_object_mut()) {
            d.remove("memory");
        }
    }
}

/// `report` with `"predicted_memory"`: one entry per device, when predicted.
fn with_memory(
    mut report: serde_json::Value,
    memory: Option<&[MemoryBreakdown]>,
) -> Result<serde_json::Value> {
    if let (Some(m), Some(obj)) = (memory, report.as_object_mut()) {
        obj.insert("predicted_memory".into(), serde_json::to_value(m)?);
    }
    Ok(report)
}

/// Simulate the timetable the flags name.
pub fn simulation(source: &SourceArgs, costs: &CostArgs) -> Result<Simulation> {
    Ok(match super::steady::simulated(source, costs, 1)? {
        Simulated::One(sim) => sim,
        Simulated::Steady(s) => s.single,
    })
}

fn title(source: &SourceArgs, sim: &Simulation) -> String {
    match (&source.timetable, source.spec.spec()) {
        (None, Ok(spec)) => spec.to_string(),
        _ => {
            let meta = &sim.timeline.meta;
            format!(
                "{} p={} stages={} m={}",
                meta.schedule, meta.devices, meta.stages, meta.microbatches
            )
        }
    }
}

/// The report as a table for people.
pub fn table(title: &str, r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{title}: makespan {:.3}, ideal {:.3}, bubble {}",
        r.makespan,
        r.ideal,
        percent(r.bubble_fraction)
    );
    if r.comm > 0.0 {
        // Costs with all-to-all (f_comm, b_comm): how much of it F&B overlaps hid.
        let _ = writeln!(
            out,
            "communication in actions {:.3}, hidden by F&B overlaps {:.3} ({})",
            r.comm,
            r.comm_hidden,
            percent(r.comm_hidden_share)
        );
    }
    let _ = writeln!(
        out,
        "{:>6} {:>12} {:>8} {:>10} {:>14}",
        "device", "busy", "bubble", "peak act", "peak bytes"
    );
    for d in &r.devices {
        let _ = writeln!(
            out,
            "{:>6} {:>12.3} {:>8} {:>10} {:>14}",
            d.device,
            d.busy,
            if d.bubble_fraction.is_finite() {
                percent(d.bubble_fraction)
            } else {
                "undefined".into()
            },
            d.peak_activations,
            d.peak_activation_bytes
        );
    }
    out
}

/// A fraction as a percentage; a bubble over a step of no time is undefined, not 0%.
fn percent(x: f64) -> String {
    if x.is_finite() {
        format!("{:.2}%", 100.0 * x)
    } else {
        "undefined (the step takes no time)".into()
    }
}
