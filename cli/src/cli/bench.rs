//! `bench`: synthetic stages of exact durations run through the runtime, measured against
//! the simulator.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use pipewright::runtime::split::LayerCost;
use pipewright::runtime::{
    run, Coord, FinalParams, Mesh, MicrobatchId, ModuleError, RunOptions, StepRecord,
    SyntheticModule,
};
use pipewright::schedule::{simulate, Checked, CostModel, Simulation, Timetable};
use pipewright::viz::{bubble_chart, ChartOptions, ChartPanel, ImageFormat};

use super::args::{mpi_universe, CostArgs, SourceArgs, Transport};
use super::checks::{at_least, Kind, Output};
use super::commands::ReportFormat;
use super::console;
use super::outputs::Outputs;
use super::progress::{oversubscription_json, warn_oversubscribed, working};
use super::search::stage_measured_costs;
use super::steady::{bench_periods, period_compare, period_json};

/// Run a timetable with synthetic stages of exact durations and compare with the simulator.
#[derive(Args, Debug)]
pub struct BenchCmd {
    #[command(flatten)]
    source: SourceArgs,
    /// Durations in milliseconds: the cost flags' units are milliseconds here.
    #[command(flatten)]
    costs: CostArgs,
    /// Steps to run; the report is the median step.
    #[arg(long, default_value_t = 5)]
    steps: u64,
    /// `local`: every device a thread of this process; `mpi`: one process per device
    /// (`mpirun -np <p>`; rank 0 reports).
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    transport: Transport,
    /// Write the median step's measured timeline (JSON).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Draw the median measured step next to the simulated one (FILE.svg or FILE.png).
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
    /// Output form.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Write the measured per-stage times and the hand-off latency between devices in ms as a
    /// cost file (median over the steps after the first).
    #[arg(long, value_name = "FILE")]
    costs_out: Option<PathBuf>,
}

impl BenchCmd {
    pub fn run(&self) -> Result<()> {
        let mut outs = Outputs::plan(
            self.source.inputs().chain(self.costs.inputs()),
            [
                Output::new("--trace", self.trace.as_ref(), Kind::Json),
                Output::new("--chart", self.chart.as_ref(), Kind::Image),
                Output::new("--costs-out", self.costs_out.as_ref(), Kind::Json),
            ],
        )?;
        let chart_format = self
            .chart
            .as_deref()
            .map(ImageFormat::from_path)
            .transpose()?;
        at_least(
            "--steps",
            self.steps as usize,
            1,
            "steps to run and measure",
        )?;
        let (tt, _) = self.source.timetable()?;
        // Each step's timeline is kept, on top of the runtime's own per-action state.
        let spm = u64::from(tt.num_stages()) * u64::from(tt.microbatches);
        super::budget::timetable("bench", spm, self.steps.saturating_mul(2).saturating_add(8))?;
        let model = self.costs.model(tt.num_stages(), tt.num_devices())?;
        let sim = simulate(&tt, &model)?;
        let Some(mut steps) = self.measure(&tt, &model)? else {
            return Ok(()); // an MPI rank other than 0: rank 0 reports
        };
        let (measured_period, simulated_period) = bench_periods(&tt, &model, &steps)?;
        steps.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        let median = &steps[steps.len() / 2];
        let report = self.report(&tt, &sim, median, (measured_period, simulated_period));
        if outs.has("--trace") {
            outs.stage(
                "--trace",
                serde_json::to_string(&median.timeline)?.as_bytes(),
            )?;
        }
        let mut ordered: Vec<&StepRecord> = steps.iter().collect();
        ordered.sort_by_key(|s| s.step);
        let timelines: Vec<_> = ordered.iter().map(|s| s.timeline.clone()).collect();
        stage_measured_costs(&mut outs, &timelines)?;
        if let Some(fmt) = chart_format {
            let mut simulated = sim.timeline.clone();
            simulated.meta.time_unit = "ms".into();
            let panels = [
                ChartPanel::new(&median.timeline).with_label("measured"),
                ChartPanel::new(&simulated).with_label("simulated"),
            ];
            let bytes = bubble_chart(&panels, &ChartOptions::default(), fmt)?;
            outs.stage("--chart", &bytes)?;
        }
        outs.commit()?;
        console::println(&report)
    }

    /// Run the steps over the transport; `None` on an MPI rank other than 0.
    fn measure(&self, tt: &Checked, model: &CostModel) -> Result<Option<Vec<StepRecord>>> {
        let mesh = Mesh::new(tt.num_devices() as usize, 1, 1)?;
        let last = tt.num_stages() - 1;
        let make = |_: Coord, s: u32| {
            let c = &model.stages[s as usize];
            let (f, i, w) = (c.f, c.i, c.w);
            Ok(SyntheticModule::from_ms(&LayerCost { f, i, w }, s == last))
        };
        // Synthetic stages read no data.
        let data = |_| Ok(());
        let opts = RunOptions {
            steps: self.steps,
            ..RunOptions::default()
        };
        let mut steps = Vec::new();
        let on_step = |s: &StepRecord| steps.push(s.clone());
        match self.transport {
            Transport::Local => {
                warn_oversubscribed(mesh.world_size());
                let spinner = working(format!("bench: {} steps of {}", opts.steps, tt.name));
                let r = run(mesh, tt, make, data, &opts, on_step);
                spinner.finish_and_clear();
                r?;
            }
            Transport::Nccl => {
                bail!("bench runs synthetic stages on host tensors: use --transport local or mpi")
            }
            Transport::Mpi => {
                let describe = format!("{model:?}");
                let u = mpi_universe()?;
                if bench_mpi(u, mesh, tt, make, data, &opts, &describe, on_step)?.is_none() {
                    return Ok(None);
                }
            }
        }
        Ok(Some(steps))
    }

    /// The median step against the simulated one, as JSON or one table line.
    fn report(
        &self,
        tt: &Timetable,
        sim: &Simulation,
        median: &StepRecord,
        (measured_period, simulated_period): (Option<f64>, f64),
    ) -> String {
        let measured = median.seconds * 1e3;
        let predicted = sim.report.makespan;
        let actions = tt.len();
        let overhead_us = (measured - predicted) * 1e3 / actions as f64;
        let threads = tt.num_devices() as usize;
        match self.format {
            ReportFormat::Json => serde_json::json!({"measured_ms": measured, "simulated_ms": predicted, "ratio": (predicted > 0.0).then(|| measured / predicted),
                    "compute_actions": actions, "overhead_us_per_action": overhead_us,
                    "measured_bubble": median.bubble_fraction(), "simulated_bubble": sim.report.bubble_fraction,
                    "steady_state": period_json(measured_period, simulated_period),
                    "threads": (self.transport == Transport::Local).then(|| oversubscription_json(threads))}).to_string(),
            ReportFormat::Table => format!(
                "{}: measured {measured:.3} ms, simulated {predicted:.3} ms ({}), {actions} compute actions, {overhead_us:.2} us overhead per action; bubble measured {:.2}% vs simulated {:.2}%\n{}",
                tt.name,
                if predicted > 0.0 { format!("{:+.2}%", 100.0 * (measured / predicted - 1.0)) } else { "no simulated time".into() },
                100.0 * median.bubble_fraction(),
                100.0 * sim.report.bubble_fraction,
                period_compare(measured_period, simulated_period)
            ),
        }
    }
}

#[cfg(feature = "mpi")]
#[allow(clippy::too_many_arguments)]
fn bench_mpi(
    u: pipewright::runtime::comm::mpi::Universe,
    mesh: Mesh,
    tt: &Checked,
    make: impl Fn(Coord, u32) -> Result<SyntheticModule, pipewright::runtime::ModuleError>,
    data: impl Fn(MicrobatchId) -> Result<(), ModuleError>,
    opts: &RunOptions,
    describe: &str,
    on_step: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    pipewright::runtime::run_mpi(u, mesh, tt, make, data, opts, describe, on_step)
        .map_err(super::train::launch_hint)
}

#[cfg(not(feature = "mpi"))]
#[allow(clippy::too_many_arguments)]
fn bench_mpi(
    u: std::convert::Infallible,
    _: Mesh,
    _: &Checked,
    _: impl Fn(Coord, u32) -> Result<SyntheticModule, pipewright::runtime::ModuleError>,
    _: impl Fn(MicrobatchId) -> Result<(), ModuleError>,
    _: &RunOptions,
    _: &str,
    _: impl FnMut(&StepRecord),
) -> Result<Option<FinalParams>> {
    match u {}
}
