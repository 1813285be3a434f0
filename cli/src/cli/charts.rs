//! `viz` and `sweep`: bubble charts of timelines and chunk-count sweeps.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use pipewright::schedule::search::MemoryCap;
use pipewright::schedule::simulate::{SimulateRequest, Simulated};
use pipewright::schedule::sweep::{SweepRequest, SweepRequestError, SWEEP_STEPS};
use pipewright::schedule::{
    best, generate, parse_counts, simulate, sweep, Checked, Report, ScheduleKind, ScheduleSpec,
    SweepGrid, SweepRow, Timeline,
};
use pipewright::viz::{
    bubble_chart, drawable, sweep_plot, terminal_chart, ChartOptions, ChartPanel, ImageFormat,
    SweepPoint, SweepSeries, MIN_TERM_COLUMNS as MIN_COLUMNS,
};

use super::args::{checked, spec_flag, CostArgs, FileShape, SourceArgs};
use super::checks::{Kind, Output};
use super::commands::simulation;
use super::console;
use super::outputs::{Input, Outputs};

/// Where a chart goes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VizFormat {
    /// Text on the terminal.
    Term,
    /// An image file (needs -o FILE.svg or FILE.png).
    Image,
}

/// Widest terminal chart drawn.
const MAX_COLUMNS: usize = 65535;

/// Image size flags.
#[derive(Args, Debug, Clone)]
pub struct ImageArgs {
    /// Image width in pixels.
    #[arg(long, default_value_t = 1200)]
    width: u32,
    /// Image height in pixels (default: fit the content).
    #[arg(long)]
    height: Option<u32>,
    /// Chart title (default: the schedule and its parameters).
    #[arg(long)]
    title: Option<String>,
}

impl ImageArgs {
    fn options(&self, memory_cap: Option<u64>) -> ChartOptions {
        ChartOptions {
            width: self.width,
            height: self.height,
            title: self.title.clone(),
            memory_cap,
        }
    }
}

/// Draw a bubble chart of a simulated or recorded step.
#[derive(Args, Debug)]
pub struct VizCmd {
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    costs: CostArgs,
    /// Draw several schedules (e.g. gpipe,1f1b,interleaved-1f1b) for the same p and m on one
    /// time axis; --virtual applies to those that interleave, the others use v=1.
    #[arg(long, value_name = "A,B,..", conflicts_with_all = ["from", "timetable"])]
    compare: Option<String>,
    /// Draw this timeline JSON (from `simulate --timeline` or a recorded run) instead.
    #[arg(long, value_name = "TIMELINE.json", conflicts_with = "timetable")]
    from: Option<PathBuf>,
    /// Add a panel of stashed activations over time per device.
    #[arg(long)]
    memory: bool,
    /// Write the chart to FILE.svg or FILE.png (format from the extension).
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// `term` prints the chart as text (the default without -o).
    #[arg(long, value_enum)]
    format: Option<VizFormat>,
    /// Width of the terminal chart in columns (24 to 65535).
    #[arg(long, default_value_t = 100)]
    columns: usize,
    /// Draw K consecutive unfenced steps on one time axis (as `simulate --steps K` runs
    /// them): how each step's start overlaps the previous step's end.
    #[arg(long, default_value_t = 1, value_name = "K", conflicts_with = "from")]
    steps: u32,
    #[command(flatten)]
    image: ImageArgs,
}

impl VizCmd {
    pub fn run(&self) -> Result<()> {
        let mut outs = Outputs::plan(
            self.source
                .inputs()
                .chain(self.costs.inputs())
                .chain([Input::new("--from", self.from.as_ref())]),
            [Output::new("-o", self.output.as_ref(), Kind::Image)],
        )?;
        if self.compare.is_some() && self.source.given("schedule") {
            bail!("--schedule does not apply with --compare, which names the schedules: leave --schedule out");
        }
        super::steady::check_steps(self.steps)?;
        if !(MIN_COLUMNS..=MAX_COLUMNS).contains(&self.columns) {
            bail!(
                "--columns {}: the terminal chart takes {MIN_COLUMNS} to {MAX_COLUMNS} columns",
                self.columns
            );
        }
        let runs = self.timelines()?;
        for (tl, _) in &runs {
            drawable(tl)?;
        }
        let to_term = match (self.format, &self.output) {
            (Some(VizFormat::Term), _) | (None, None) => true,
            (Some(VizFormat::Image), None) => bail!("--format image needs -o FILE.svg or FILE.png"),
            (_, Some(_)) => false,
        };
        if to_term && self.memory {
            bail!("--memory adds a panel to the image: give -o FILE.svg or FILE.png too");
        }
        if to_term {
            for (tl, _) in &runs {
                console::println(&terminal_chart(tl, self.columns))?;
            }
        }
        let Some(path) = &self.output else {
            return Ok(());
        };
        let fmt = ImageFormat::from_path(path)?;
        // Memory tracks are copied out of the reports only when the panel is asked for.
        let memory: Vec<_> = if self.memory {
            runs.iter().map(|(_, r)| memory_of(r)).collect()
        } else {
            Vec::new()
        };
        let panels: Vec<ChartPanel> = runs
            .iter()
            .enumerate()
            .map(|(i, (tl, _))| match memory.get(i) {
                Some(mem) => ChartPanel::new(tl).with_memory(mem),
                None => ChartPanel::new(tl),
            })
            .collect();
        let bytes = bubble_chart(&panels, &self.image.options(None), fmt)?;
        outs.stage("-o", &bytes)?;
        outs.commit()
    }

    /// The timelines to draw, each with its report (for memory).
    fn timelines(&self) -> Result<Vec<(Timeline, Report)>> {
        self.flags_apply()?;
        if let Some(path) = &self.from {
            let tl = read_timeline(path)?;
            let meta = &tl.meta;
            let shape = FileShape {
                devices: meta.devices,
                stages: meta.stages,
                microbatches: meta.microbatches,
                schedule: meta.schedule.clone(),
            };
            self.source.agree_with(path, &shape)?;
            let model = self.costs.model(tl.meta.stages, tl.meta.devices)?;
            let report = Report::new(&tl, &model);
            return Ok(vec![(tl, report)]);
        }
        let Some(list) = &self.compare else {
            if self.steps > 1 {
                let (tt, _) = self.source.timetable()?;
                return Ok(vec![self.steady(&tt)?]);
            }
            let sim = simulation(&self.source, &self.costs)?;
            return Ok(vec![(sim.timeline, sim.report)]);
        };
        let s = &self.source.spec;
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let kind: ScheduleKind = name.parse()?;
            let v = if kind.supports_virtual() {
                s.virtual_stages
            } else {
                1
            };
            let group = if kind.supports_virtual() {
                s.group_size
            } else {
                None
            };
            let spec = ScheduleSpec::new(kind, s.stages, v, s.microbatches, group)
                .map_err(|e| anyhow!(e.named(spec_flag)))
                .with_context(|| format!("--compare {name}"))?;
            super::budget::timetable(
                &format!("--compare {name}"),
                u64::from(spec.stages()) * u64::from(s.microbatches),
                u64::from(self.steps),
            )?;
            if self.steps > 1 {
                out.push(self.steady(&checked(generate(&spec))?)?);
                continue;
            }
            let model = self.costs.model(spec.stages(), spec.devices())?;
            let sim = simulate(&checked(generate(&spec))?, &model)?;
            out.push((sim.timeline, sim.report));
        }
        if out.is_empty() {
            bail!("--compare `{list}` names no schedule");
        }
        Ok(out)
    }
}

impl VizCmd {
    /// Refuse a flag that would change nothing: times beside a timeline (whose times are
    /// given), recomputation beside one (its R's are in it), sizes without a memory panel.
    fn flags_apply(&self) -> Result<()> {
        if let Some(path) = &self.from {
            let from = path.display();
            if let Some(flag) = self.costs.time_flags().first() {
                bail!("{flag} does not apply with --from {from}: a timeline's times are measured or simulated already; leave {flag} out");
            }
            if !self.source.recompute.is_none() {
                bail!("--recompute does not apply with --from {from}: a timeline holds its R actions already; leave --recompute out");
            }
        }
        let sizes = self.costs.size_flags();
        let only_sizes = sizes
            .iter()
            .find(|f| **f != "--cost-file" || self.from.is_some());
        if let (false, Some(flag)) = (self.memory, only_sizes) {
            bail!("{flag} sizes the activations of the memory panel: add --memory, or leave {flag} out");
        }
        Ok(())
    }

    /// `--steps K` of one timetable: its K-step timeline and a report over all of it, through
    /// the library's request (the one `simulate --steps` and Python's `simulate` build).
    fn steady(&self, tt: &Checked) -> Result<(Timeline, Report)> {
        super::steady::fits_steps(tt, self.steps)?;
        let model = self.costs.model(tt.num_stages(), tt.num_devices())?;
        let request = SimulateRequest::new(tt, &model, self.steps)
            .map_err(|e| anyhow::anyhow!(e.named("--steps")))?;
        Ok(match request.run()? {
            Simulated::Steady(s) => super::steady::steady_chart(*s, &model),
            Simulated::One(sim) => (sim.timeline, sim.report),
        })
    }
}

fn memory_of(r: &Report) -> Vec<Vec<pipewright::schedule::MemorySample>> {
    r.devices.iter().map(|d| d.memory.clone()).collect()
}

fn read_timeline(path: &Path) -> Result<Timeline> {
    super::io::load_timeline(path)
}

/// Output of a sweep.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepFormat {
    /// A table for people.
    Table,
    /// JSON rows.
    Json,
    /// CSV rows with a header.
    Csv,
}

/// Simulate schedules over chunk counts and compare bubble, throughput and memory.
#[derive(Args, Debug)]
pub struct SweepCmd {
    /// Schedule families, comma separated.
    #[arg(
        long,
        default_value = "gpipe,1f1b,interleaved-1f1b",
        value_name = "A,B,.."
    )]
    schedules: String,
    /// Pipeline devices p.
    #[arg(long, short = 'p', default_value_t = 4)]
    stages: u32,
    /// Chunks per device to try for interleaved-1f1b, e.g. 1,2,4 (the others run at v=1).
    #[arg(
        long = "virtual",
        short = 'v',
        default_value = "2",
        value_name = "V[,V2..]"
    )]
    virtual_stages: String,
    /// Microbatch counts: a list (4,8,16) or ranges (4..64:x2, 1..16, 2..32:+2).
    #[arg(long, short = 'm', default_value = "4..64:x2", value_name = "LIST")]
    microbatches: String,
    /// Most stashed activations a device may hold, as in `search`: microbatches of one
    /// device's share of the model (e.g. 4) or bytes with a unit (e.g. 512MiB, 24GB); both
    /// need activation sizes. The best combination that fits is named.
    #[arg(long, value_name = "CAP", allow_hyphen_values = true)]
    memory_cap: Option<String>,
    #[command(flatten)]
    costs: CostArgs,
    /// Output form.
    #[arg(long, value_enum, default_value_t = SweepFormat::Table)]
    format: SweepFormat,
    /// Also plot bubble, throughput and peak memory against m to FILE.svg or FILE.png.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    image: ImageArgs,
}

impl SweepCmd {
    pub fn run(&self) -> Result<()> {
        let mut outs = Outputs::plan(
            self.costs.inputs(),
            [Output::new("-o", self.output.as_ref(), Kind::Image)],
        )?;
        let grid = self.grid()?;
        let spinner = super::progress::working("sweep: simulating the grid");
        let rows = sweep(&grid, |stages, devices| {
            self.costs
                .model(stages, devices)
                .map_err(|e| format!("{e:#}"))
        });
        spinner.finish_and_clear();
        let text = match self.format {
            SweepFormat::Json => serde_json::to_string_pretty(&rows)? + "\n",
            SweepFormat::Csv => csv_rows(&rows),
            SweepFormat::Table => table(&rows, grid.memory_cap),
        };
        if let Some(path) = &self.output {
            if rows.iter().all(|r| r.error.is_some()) {
                bail!(
                    "-o {}: nothing to plot, no combination ran (see the table)",
                    path.display()
                );
            }
            let fmt = ImageFormat::from_path(path)?;
            let bytes = sweep_plot(&series(&rows), &self.image.options(grid.memory_cap), fmt)?;
            outs.stage("-o", &bytes)?;
        }
        outs.commit()?;
        console::print(&text)
    }

    /// The flags as the library's [`SweepRequest`] (the one Python builds), checked, as the
    /// grid to simulate.
    fn grid(&self) -> Result<SweepGrid> {
        let schedules = self
            .schedules
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<ScheduleKind>, _>>()?;
        let request = SweepRequest {
            schedules,
            p: self.stages,
            v: parse_counts(&self.virtual_stages).context("--virtual")?,
            m: parse_counts(&self.microbatches).context("--microbatches")?,
            memory_cap: (self.memory_cap.as_deref())
                .map(str::parse::<MemoryCap>)
                .transpose()?,
        };
        let named = |e: SweepRequestError| anyhow!(e.named(spec_flag));
        request.check().map_err(named)?;
        // The costs are the same for every combination: a bad file is refused once, here.
        let costs = self.costs.model(self.stages, self.stages)?;
        let grid = request.into_grid(Some(&costs)).map_err(named)?;
        self.bounded(&grid)?;
        Ok(grid)
    }

    /// Refuse a grid whose largest simulation this machine cannot hold, or whose
    /// simulations together would run for longer than a sweep should (Python's too).
    fn bounded(&self, grid: &SweepGrid) -> Result<()> {
        let narrow = "--microbatches, --virtual or --schedules";
        let sizes = grid.stage_microbatches();
        Ok(pipewright::input::sweep_fits(&sizes, SWEEP_STEPS, narrow)?)
    }
}

/// A sweep request field as the command line names it (`v` -> `--virtual`).
fn table(rows: &[SweepRow], cap: Option<u64>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<18} {:>3} {:>5} {:>10} {:>8} {:>10} {:>8} {:>11} {:>9} {:>12}{}",
        "schedule",
        "v",
        "m",
        "makespan",
        "bubble",
        "period",
        "steady",
        "throughput",
        "peak act",
        "peak bytes",
        if cap.is_some() { "  fits" } else { "" }
    );
    for r in rows {
        let _ = write!(
            out,
            "{:<18} {:>3} {:>5} ",
            r.schedule, r.virtual_stages, r.microbatches
        );
        match (&r.error, r.makespan, r.bubble_fraction, r.throughput) {
            (None, Some(mk), Some(b), Some(t)) => {
                let _ = write!(
                    out,
                    "{mk:>10.3} {:>7.2}% {:>10.3} {:>7.2}% {t:>11.4} {:>9} {:>12}",
                    100.0 * b,
                    r.period.unwrap_or(f64::NAN),
                    100.0 * r.bubble.map_or(f64::NAN, |b| b.steady_state),
                    r.peak_activations.unwrap_or(0),
                    r.peak_activation_bytes.unwrap_or(0)
                );
                if let Some(f) = r.fits {
                    let _ = write!(out, "  {}", if f { "yes" } else { "no" });
                }
                out.push('\n');
            }
            (err, ..) => {
                let _ = writeln!(out, "cannot run: {}", err.as_deref().unwrap_or("unknown"));
            }
        }
    }
    match (cap, best(rows)) {
        (Some(c), Some(b)) => {
            let _ = writeln!(
                out,
                "best under the cap of {c} bytes: {} v={} m={} (throughput {:.4}, peak {} bytes)",
                b.schedule,
                b.virtual_stages,
                b.microbatches,
                b.throughput.unwrap_or(0.0),
                b.peak_activation_bytes.unwrap_or(0)
            );
        }
        (Some(c), None) => {
            let _ = writeln!(out, "no combination fits the cap of {c} bytes");
        }
        _ => {}
    }
    out
}

fn csv_rows(rows: &[SweepRow]) -> String {
    let mut out = String::from(
        "schedule,virtual_stages,microbatches,makespan,bubble_fraction,period,steady_state_bubble,throughput,peak_activations,peak_activation_bytes,fits,error\n",
    );
    let opt = |x: Option<String>| x.unwrap_or_default();
    for r in rows {
        let err = r
            .error
            .as_deref()
            .map(|e| format!("\"{}\"", e.replace('"', "\"\"")))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            r.schedule,
            r.virtual_stages,
            r.microbatches,
            opt(r.makespan.map(|x| x.to_string())),
            opt(r.bubble_fraction.map(|x| x.to_string())),
            opt(r.period.map(|x| x.to_string())),
            opt(r.bubble.map(|b| b.steady_state.to_string())),
            opt(r.throughput.map(|x| x.to_string())),
            opt(r.peak_activations.map(|x| x.to_string())),
            opt(r.peak_activation_bytes.map(|x| x.to_string())),
            opt(r.fits.map(|x| x.to_string())),
            err
        );
    }
    out
}

/// One plot line per (schedule, v) that ran at least once.
fn series(rows: &[SweepRow]) -> Vec<SweepSeries> {
    let mut out: Vec<SweepSeries> = Vec::new();
    for r in rows.iter().filter(|r| r.error.is_none()) {
        let label = format!("{} v={}", r.schedule, r.virtual_stages);
        let point = SweepPoint {
            microbatches: r.microbatches,
            bubble_fraction: r.bubble_fraction.unwrap_or(0.0),
            throughput: r.throughput.unwrap_or(0.0),
            peak_memory_bytes: r.peak_activation_bytes.unwrap_or(0),
        };
        match out.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push(point),
            None => out.push(SweepSeries {
                label,
                points: vec![point],
            }),
        }
    }
    out
}
