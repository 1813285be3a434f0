//! `search`: the fastest schedule for the user's costs under a memory cap.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pipewright::schedule::search::{
    fmt_units, search_with, Candidate, Objective, Progress, SearchOutcome, SearchRequest,
    SearchSpec,
};
use pipewright::schedule::shape::request::flag_form;
use pipewright::schedule::{measured_costs, ScheduleKind, Timeline};
use pipewright::viz::{
    bubble_chart, pareto_plot, ChartOptions, ChartPanel, ImageFormat, ParetoPoint,
};

use super::args::CostArgs;
use super::checks::{Kind, Output};
use super::commands::ReportFormat;
use super::console;
use super::memory::{memory_table, MemoryArgs};
use super::outputs::Outputs;
use super::timetable_out::CommsArg;
use pipewright::schedule::RecomputePlan;

/// Find the schedule with the smallest simulated step time that fits a memory cap.
#[derive(Args, Debug)]
pub struct SearchCmd {
    /// Pipeline devices p.
    #[arg(long, short = 'p', default_value_t = 4, value_name = "P")]
    stages: u32,
    /// Microbatches m per training step.
    #[arg(long, short = 'm', default_value_t = 8, value_name = "M")]
    microbatches: u32,
    /// Stashed activations a device may hold: a number of microbatches of one device's share
    /// of the model (1F1B needs p, GPipe m), or bytes with a unit (512MiB, 24GB; needs
    /// --activation-bytes or activation sizes in the cost file).
    #[arg(long, value_name = "CAP", allow_hyphen_values = true)]
    memory_cap: String,
    #[command(flatten)]
    costs: CostArgs,
    /// Largest chunks per device v to try (interleaved, looped-bfs, the list scheduler).
    #[arg(long, default_value_t = 4, value_name = "V")]
    max_virtual: u32,
    /// Fixed families to try, comma separated (default: all of them).
    #[arg(long, value_name = "LIST")]
    schedules: Option<String>,
    /// Do not run the search's own list scheduler.
    #[arg(long)]
    no_list: bool,
    /// Try only timetables with a fused backward (B): no zb-h1, zb-h2, zbv, dualpipev, and no
    /// I/W list schedules. For a runtime where I + W costs more than B and the cost file does
    /// not measure both (a file recorded by `pipewright.torch` with its split probe does).
    #[arg(long)]
    no_split_backward: bool,
    /// Most simulations spent improving the best timetable by moving work into its gaps.
    #[arg(long, default_value_t = 200, value_name = "N")]
    improve: usize,
    /// Draw the Pareto front of bubble against peak memory to FILE.svg or FILE.png.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// Write the best timetable to FILE.csv (PyTorch's compute-only form; with --comms its
    /// compute+comms form) or FILE.json, ready for `train --timetable`, `simulate --timetable`
    /// or PyTorch's `_PipelineScheduleRuntime._load_csv`.
    #[arg(long, value_name = "FILE")]
    timetable_out: Option<PathBuf>,
    /// Also write the next K fitting timetables, fastest first, beside --timetable-out FILE as
    /// FILE's name with `.2`, `.3`, ... before its extension (K up to 4): candidates for a
    /// measured tuning step (`pipewright.torch.tune`), which keeps what measures fastest.
    #[arg(
        long,
        value_name = "K",
        default_value_t = 0,
        requires = "timetable_out"
    )]
    runners_up: usize,
    #[command(flatten)]
    comms: CommsArg,
    /// Draw the best timetable's simulated bubble chart to FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
    /// What to minimise: `period`, the steady-state time per step of unfenced training (what
    /// the runtime does, and what throughput follows), or `makespan`, one step on its own
    /// (for runs fenced by a global barrier every step).
    #[arg(long, default_value = "period", value_name = "period|makespan", value_parser = parse_objective)]
    objective: Objective,
    /// Seconds to spend evaluating candidates: when they run out, the best found so far is
    /// returned, and the output says the search was cut short. The default keeps p up to 128
    /// and m up to 512 under 45 s on a 2-core machine.
    #[arg(
        long,
        default_value_t = 30.0,
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    time_budget: f64,
    /// Candidates listed in the table, fastest first.
    #[arg(long, default_value_t = 10, value_name = "N")]
    top: usize,
    /// Output form.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// With a model shape, a cap in bytes bounds each rank's whole predicted memory
    /// (parameters, gradients, optimizer state and activations), not its activations alone.
    #[command(flatten)]
    memory: MemoryArgs,
}

impl SearchCmd {
    /// Flags -> request -> search -> render.
    pub fn run(&self) -> Result<()> {
        let runner_paths: Vec<PathBuf> = (0..self.runners_up)
            .filter_map(|k| self.timetable_out.as_deref().map(|p| runner_path(p, k + 2)))
            .collect();
        let mut outs = self.plan_outputs(&runner_paths)?;
        // Catch bad output names before the work, not after.
        let plot_fmt = image_format(self.output.as_deref())?;
        let chart_fmt = image_format(self.chart.as_deref())?;
        self.comms.check(
            self.timetable_out
                .as_deref()
                .map(|p| ("--timetable-out", p)),
        )?;
        super::checks::at_least("--top", self.top, 1, "candidates listed")?;
        let spec = self.spec()?;
        let started = Instant::now();
        let bar = search_bar();
        let found = search_with(&spec, &mut |p| show_progress(&bar, p));
        bar.finish_and_clear();
        let found = found?;
        let secs = started.elapsed().as_secs_f64();
        // The timetables' text first: what PyTorch cannot run is refused before any output.
        let texts = self.timetable_texts(&found, &runner_paths)?;
        let report = self.report(&found, secs)?;
        if let Some(fmt) = plot_fmt {
            let bytes = pareto_plot(
                &ParetoPoint::of_search(&found),
                Some(found.cap_microbatches),
                &ChartOptions::default(),
                fmt,
            )?;
            outs.stage("-o", &bytes)?;
        }
        if let Some(fmt) = chart_fmt {
            let label = &found.candidates[found.best].label;
            let panel = ChartPanel::new(&found.simulation.timeline).with_label(label.clone());
            let bytes = bubble_chart(&[panel], &ChartOptions::default(), fmt)?;
            outs.stage("--chart", &bytes)?;
        }
        stage_timetables(&mut outs, texts, &runner_paths)?;
        outs.commit()?;
        console::print(&report)
    }

    /// Every file this search writes, checked against its inputs before any work.
    fn plan_outputs(&self, runner_paths: &[PathBuf]) -> Result<Outputs> {
        let runners = runner_paths
            .iter()
            .zip(RUNNER_FLAGS)
            .map(|(p, flag)| Output::new(flag, Some(p), Kind::Timetable));
        Outputs::plan(
            self.costs.inputs().chain(self.memory.inputs()),
            [
                Output::new("-o", self.output.as_ref(), Kind::Image),
                Output::new("--chart", self.chart.as_ref(), Kind::Image),
                Output::new(
                    "--timetable-out",
                    self.timetable_out.as_ref(),
                    Kind::Timetable,
                ),
            ]
            .into_iter()
            .chain(runners),
        )
    }

    /// The flags as the library's [`SearchRequest`] (the one Python builds), checked, with
    /// this machine's memory and the costs and memory model the flags name.
    fn spec(&self) -> Result<SearchSpec> {
        let mut request =
            SearchRequest::new(self.stages, self.microbatches, self.memory_cap.parse()?);
        request.max_virtual = self.max_virtual;
        request.list_scheduler = !self.no_list;
        request.split_backward = !self.no_split_backward;
        request.improve = self.improve;
        request.objective = self.objective;
        request.time_budget = self.time_budget;
        request.runners_up = self.runners_up;
        if let Some(list) = &self.schedules {
            request.families = list
                .split(',')
                .map(|s| s.parse::<ScheduleKind>())
                .collect::<Result<_, _>>()?;
        }
        request.check().map_err(|e| anyhow!(e.named(flag_of)))?;
        let (what, spm, times) = request.footprint();
        super::budget::timetable(&what, spm, times)?;
        let costs = self.costs.model(self.stages, self.stages)?;
        request.memory =
            self.memory
                .config(self.stages, 1, &RecomputePlan::default(), self.microbatches)?;
        request
            .into_spec(costs)
            .map_err(|e| anyhow!(e.named(flag_of)))
    }

    /// The best timetable's text and its runners-up's, for the files that name them.
    fn timetable_texts(
        &self,
        found: &SearchOutcome,
        runner_paths: &[PathBuf],
    ) -> Result<(Option<String>, Vec<String>)> {
        let best = match &self.timetable_out {
            Some(path) => {
                let mut tt = found.timetable.timetable().clone();
                tt.name = format!("search: {}", found.candidates[found.best].label);
                Some(self.comms.text(&tt, path)?)
            }
            None => None,
        };
        let mut runners = Vec::new();
        for ((i, tt), path) in found.runners_up.iter().zip(runner_paths) {
            let mut tt = tt.clone();
            tt.name = format!("search: {}", found.candidates[*i].label);
            runners.push(self.comms.text(&tt, path)?);
        }
        Ok((best, runners))
    }

    /// What stdout shows: the JSON report, or the table with the best's predicted memory.
    fn report(&self, found: &SearchOutcome, secs: f64) -> Result<String> {
        Ok(match self.format {
            ReportFormat::Json => json_report(found, secs).to_string() + "\n",
            ReportFormat::Table => {
                let plan = RecomputePlan::default();
                let memory = self.memory.predict(&found.timetable, &plan)?;
                self.table(found, secs)
                    + &memory.map_or(String::new(), |m| {
                        format!("best timetable's {}", memory_table(&m))
                    })
            }
        })
    }

    fn table(&self, found: &SearchOutcome, secs: f64) -> String {
        let c = &found.candidates;
        let best = &c[found.best];
        let mut out = format!(
            "search p={} m={}, cap {} microbatches per device: {} candidates, {} skipped, {secs:.2} s\n",
            self.stages,
            self.microbatches,
            fmt_units(found.cap_microbatches),
            c.len(),
            found.skipped.len()
        );
        if self.memory.given().unwrap_or(false)
            && found.unit_bytes.is_some()
            && self.memory_cap.chars().any(|c| c.is_ascii_alphabetic())
        {
            out += &format!(
                "the cap ({}) bounds each rank's predicted total: parameters, gradients, optimizer state and activations; peaks in bytes below are that total\n",
                self.memory_cap.trim()
            );
        }
        if let Some(cut) = &found.cut_short {
            out += &format!(
                "cut short by the time budget ({} s): {} of {} candidates evaluated, the best is the best found so far (raise --time-budget to see more)\n",
                cut.budget_seconds, cut.evaluated, cut.total
            );
        }
        out += &format!("best: {}\n", line(best));
        match found.best_fixed {
            Some(i) if i == found.best => out += "the best is a fixed family\n",
            Some(i) => {
                let obj = found.objective;
                let gain = 100.0 * (1.0 - obj.of(best) / obj.of(&c[i]).max(f64::MIN_POSITIVE));
                out += &format!(
                    "best fixed family: {} (the best is {gain:.1}% faster)\n",
                    line(&c[i])
                );
            }
            None => out += "no fixed family fits the cap\n",
        }
        let obj = found.objective;
        let mut order: Vec<&Candidate> = c.iter().filter(|x| x.fits).collect();
        order.sort_by(|a, b| obj.of(a).total_cmp(&obj.of(b)));
        out += &format!(
            "\n{:<48} {:>12} {:>8} {:>12} {:>8} {:>8}\n",
            format!("fitting candidates, by {}", objective_name(obj)),
            "makespan",
            "bubble",
            "period",
            "steady",
            "peak"
        );
        for x in order.iter().take(self.top) {
            out += &format!(
                "{:<48} {:>12.4} {:>7.2}% {:>12.4} {:>7.2}% {:>8}\n",
                x.label,
                x.makespan,
                100.0 * x.bubble.single_step,
                x.period,
                100.0 * x.bubble.steady_state,
                fmt_units(x.peak_microbatches)
            );
        }
        out += &format!("\nPareto front (peak memory -> {}):\n", objective_name(obj));
        for &i in &found.front {
            let x = &c[i];
            let fit = if x.fits { "" } else { "  (over the cap)" };
            out += &format!(
                "  {:>8}  {:>12.4}  {}{fit}\n",
                fmt_units(x.peak_microbatches),
                obj.of(x),
                x.label
            );
        }
        out
    }
}

/// A bar on stderr (drawn only when stderr is a terminal) of the candidates evaluated.
fn search_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(
        "search {bar:30} {pos}/{len} candidates  {elapsed_precise}  {msg}",
    ) {
        bar.set_style(style);
    }
    bar
}

fn show_progress(bar: &ProgressBar, p: &Progress) {
    bar.set_length(p.total as u64);
    bar.set_position(p.done as u64);
    if let (Some(v), Some(label)) = (p.best, &p.best_label) {
        bar.set_message(format!("best so far {v:.4} ({label})"));
    }
}

/// The outputs of `--runners-up`, one name each (an output is named by its flag).
const RUNNER_FLAGS: [&str; 4] = [
    "--runners-up (2nd)",
    "--runners-up (3rd)",
    "--runners-up (4th)",
    "--runners-up (5th)",
];

/// `best.csv` -> `best.2.csv`: the `k`-th fastest beside the best.
fn runner_path(best: &Path, k: usize) -> PathBuf {
    let stem = best
        .file_stem()
        .map_or_else(Default::default, |s| s.to_string_lossy().into_owned());
    let name = match best.extension() {
        Some(ext) => format!("{stem}.{k}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{k}"),
    };
    best.with_file_name(name)
}

/// A request field as the command line names it (`max_virtual` -> `--max-virtual`).
fn flag_of(field: &str) -> String {
    match field {
        "p" => "--stages".into(),
        "m" => "--microbatches".into(),
        f => flag_form(f, None),
    }
}

/// The chart format of an output path, refused before any work when it is neither.
fn image_format(path: Option<&Path>) -> Result<Option<ImageFormat>> {
    Ok(path.map(ImageFormat::from_path).transpose()?)
}

/// Stage `--timetable-out` and the runners-up, saying which runners-up were not found.
fn stage_timetables(
    outs: &mut Outputs,
    (best, runners): (Option<String>, Vec<String>),
    runner_paths: &[PathBuf],
) -> Result<()> {
    if let Some(text) = best {
        outs.stage("--timetable-out", text.as_bytes())?;
    }
    for (text, flag) in runners.iter().zip(RUNNER_FLAGS) {
        outs.stage(flag, text.as_bytes())?;
    }
    for path in runner_paths.iter().skip(runners.len()) {
        // Said, so that an older file of that name is not taken for this search's.
        console::note(&format!(
            "note: only {} fitting timetables after the best: {} not written",
            runners.len(),
            path.display()
        ));
    }
    Ok(())
}

fn parse_objective(s: &str) -> Result<Objective, String> {
    s.parse()
}

fn objective_name(o: Objective) -> &'static str {
    match o {
        Objective::Period => "steady-state period",
        Objective::Makespan => "single-step makespan",
    }
}

fn line(c: &Candidate) -> String {
    format!(
        "{}: period {:.4} (steady-state bubble {:.2}%), makespan {:.4} (single-step bubble {:.2}%), peak {} microbatches{}",
        c.label,
        c.period,
        100.0 * c.bubble.steady_state,
        c.makespan,
        100.0 * c.bubble.single_step,
        fmt_units(c.peak_microbatches),
        c.peak_bytes
            .map_or(String::new(), |b| format!(" ({b} bytes)"))
    )
}

fn json_report(found: &SearchOutcome, secs: f64) -> serde_json::Value {
    serde_json::json!({
        "seconds": secs,
        "objective": found.objective,
        "cap_microbatches": found.cap_microbatches,
        "unit_bytes": found.unit_bytes,
        "best": found.candidates[found.best],
        "best_fixed": found.best_fixed.map(|i| &found.candidates[i]),
        "front": found.front.iter().map(|&i| &found.candidates[i]).collect::<Vec<_>>(),
        "candidates": found.candidates,
        "skipped": found.skipped,
        "cut_short": found.cut_short,
    })
}

/// Stage the per-stage costs and the hand-off latency measured over `steps` (the first is
/// left out as warm-up when there are more) as `--costs-out`, a cost file for `simulate
/// --cost-file` and `search --cost-file`.
pub fn stage_measured_costs(outs: &mut Outputs, steps: &[Timeline]) -> Result<()> {
    let Some(path) = outs.path("--costs-out").map(|p| p.display().to_string()) else {
        return Ok(());
    };
    let used: Vec<&Timeline> = steps.iter().skip(usize::from(steps.len() > 1)).collect();
    let raw = measured_costs(&used)?;
    let unit = raw.time_unit.as_deref().unwrap_or("?");
    let hand_off = raw.p2p_latency.map_or(String::new(), |t| {
        format!(", hand-off latency {t:.3} {unit}")
    });
    let note = format!(
        "wrote {path} (per-stage costs in {unit}, median of {} steps{hand_off})",
        used.len()
    );
    let text = serde_json::to_string_pretty(&raw)? + "\n";
    outs.stage_noted("--costs-out", text.as_bytes(), Some(note))
}
