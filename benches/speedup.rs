//! Pipeline speed-up on this machine, measured as ratios within one run (issue 5's target:
//! pp=2 at least 1.6x one device on the reference GPT, m=8; 1F1B's ideal is 2m/(m+1) = 1.78x).
//!
//! The machine is a shared VM whose speed drifts by 10-40% over seconds, which swamps a
//! comparison of two separately timed benchmarks. So this bench alternates: each round runs
//! one device, then pp=2 with each schedule (1F1B, interleaved 1F1B with v=2, zb-h1, zbv),
//! then one device again, and divides the mean of the two single-device times by each pp=2
//! time; the figure per schedule is the median ratio over the rounds.
//!
//! `cargo bench --bench speedup -- [ROUNDS] [STEPS]` (defaults 8 rounds of 3 timed steps per
//! run, each after one warm-up step).

#[path = "common/gpt_steps.rs"]
mod common;
use common::{gpt_steps, gpt_timetable};
use pipewright::schedule::{Checked, ScheduleKind};

fn arg(i: usize, default: u64) -> u64 {
    // `cargo bench` passes `--bench`; only bare numbers are ours.
    let nums: Vec<u64> = std::env::args().filter_map(|a| a.parse().ok()).collect();
    nums.get(i).copied().unwrap_or(default)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn main() {
    let (rounds, steps) = (arg(0, 8).max(1), arg(1, 3).max(1));
    let ms = |tt: &Checked| gpt_steps(tt, 1, steps).as_secs_f64() * 1e3 / steps as f64;
    let one = gpt_timetable(ScheduleKind::OneFOneB, 1, 1);
    let two: Vec<(String, Checked)> = [
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved1F1B, 2),
        (ScheduleKind::ZbH1, 1),
        (ScheduleKind::Zbv, 2),
    ]
    .into_iter()
    .map(|(kind, v)| (format!("{} v={v}", kind.name()), gpt_timetable(kind, 2, v)))
    .collect();
    println!("reference GPT (4 layers, d=256, seq 64), m=8 of 4 sequences, {steps} steps per run");
    print!("{:>5} {:>8}", "round", "pp=1 ms");
    for (name, _) in &two {
        print!(" {name:>22}");
    }
    println!();
    let mut ratios = vec![Vec::new(); two.len()];
    for round in 0..rounds {
        let before = ms(&one);
        let times: Vec<f64> = two.iter().map(|(_, tt)| ms(tt)).collect();
        let base = (before + ms(&one)) / 2.0;
        print!("{round:>5} {base:>8.1}");
        for (k, t) in times.iter().enumerate() {
            ratios[k].push(base / t);
            print!(" {t:>12.1} ms {:>6.3}x", base / t);
        }
        println!();
    }
    for ((name, _), mut r) in two.iter().zip(ratios) {
        r.sort_by(f64::total_cmp);
        println!(
            "pp=2 {name:<22} speed-up: median {:.3}, quartiles {:.3} .. {:.3}, range {:.3} .. {:.3}",
            quantile(&r, 0.5),
            quantile(&r, 0.25),
            quantile(&r, 0.75),
            r[0],
            r[r.len() - 1],
        );
    }
}
