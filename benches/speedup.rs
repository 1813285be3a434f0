//! Pipeline speed-up on this machine, measured as a ratio within one run (issue 5's target:
//! pp=2 at least 1.6x one device on the reference GPT, m=8; ideal 2m/(m+1) = 1.78x).
//!
//! The machine is a shared VM whose speed drifts by 10-40% over seconds, which swamps a
//! comparison of two separately timed benchmarks. So this bench alternates: each pair runs
//! pp=1 and pp=2 back to back (the order flips every pair, so a drift favours neither) and
//! takes the ratio of their step times; the figure is the median ratio over the pairs.
//!
//! `cargo bench --bench speedup -- [PAIRS] [STEPS]` (defaults 12 pairs of 3 timed steps,
//! each after one warm-up step).

#[path = "common/gpt_steps.rs"]
mod common;
use common::gpt_steps;

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
    let (pairs, steps) = (arg(0, 12).max(1), arg(1, 3).max(1));
    println!(
        "reference GPT (4 layers, d=256, seq 64), 1F1B, m=8 of 4 sequences; {steps} steps each"
    );
    println!(
        "{:>4} {:>12} {:>12} {:>7}",
        "pair", "pp=1 ms/step", "pp=2 ms/step", "ratio"
    );
    let mut ratios = Vec::new();
    for pair in 0..pairs {
        let time = |pp| gpt_steps(pp, 1, steps).as_secs_f64() * 1e3 / steps as f64;
        let (one, two) = if pair % 2 == 0 {
            let one = time(1);
            (one, time(2))
        } else {
            let two = time(2);
            (time(1), two)
        };
        ratios.push(one / two);
        println!("{pair:>4} {one:>12.1} {two:>12.1} {:>7.3}", one / two);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "speed-up pp=2 / pp=1: median {:.3}, quartiles {:.3} .. {:.3}, range {:.3} .. {:.3} \
         (ideal 1.778, target 1.6)",
        quantile(&ratios, 0.5),
        quantile(&ratios, 0.25),
        quantile(&ratios, 0.75),
        ratios[0],
        ratios[ratios.len() - 1],
    );
}
