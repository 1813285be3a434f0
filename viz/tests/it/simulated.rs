//! Charts of timelines from the project's own generator and simulator (issue 3's test case).

use pipewright_schedule::Checked;
use pipewright_schedule::{generate, MemorySample, ScheduleKind, ScheduleSpec};
use pipewright_sim::{simulate, CostModel, Simulation, StageCost};
use pipewright_viz::{bubble_chart, ChartOptions, ChartPanel, ImageFormat};

fn sim(kind: ScheduleKind, p: u32, v: u32, m: u32) -> Simulation {
    let spec = ScheduleSpec::new(kind, p, v, m, None).unwrap();
    // Costs per chunk shrink with v, so every schedule does the same total work.
    let cost = StageCost::new(1.0, 2.0, None).unwrap().split(v);
    let costs = CostModel::uniform(spec.stages(), cost)
        .with_link(0.1, None)
        .unwrap();
    simulate(&Checked::new(generate(&spec)).unwrap(), &costs).unwrap()
}

#[test]
fn interleaved_p4_v2_m8_has_one_box_per_compute_action_at_simulated_widths() {
    let s = sim(ScheduleKind::Interleaved1F1B, 4, 2, 8);
    let tl = &s.timeline;
    let svg = String::from_utf8(
        bubble_chart(
            &[ChartPanel::new(tl)],
            &ChartOptions::default(),
            ImageFormat::Svg,
        )
        .unwrap(),
    )
    .unwrap();
    // One `<title>dev D SkM [start, end]</title>` per compute action, naming exactly it.
    let compute: Vec<_> = tl.compute_events().collect();
    assert_eq!(compute.len(), 2 * 8 * 8, "S * m pairs, an F and a B each");
    let boxes: Vec<&str> = svg
        .lines()
        .filter(|l| {
            l.starts_with("<rect class=\"act F\"") || l.starts_with("<rect class=\"act B\"")
        })
        .collect();
    assert_eq!(boxes.len(), compute.len());
    let width = |l: &str| -> f64 {
        let w = &l[l.find(" width=\"").unwrap() + 8..];
        w[..w.find('"').unwrap()].parse().unwrap()
    };
    let mut ratio = None;
    for e in &compute {
        let title = format!(
            "<title>dev {} {} [{}, {}]</title>",
            e.device, e.action, e.start, e.end
        );
        let hits: Vec<&&str> = boxes.iter().filter(|l| l.contains(&title)).collect();
        assert_eq!(hits.len(), 1, "{title}");
        let r = width(hits[0]) / e.duration();
        let r0 = *ratio.get_or_insert(r);
        assert!(
            (r - r0).abs() / r0 < 1e-4,
            "width not proportional for {title}"
        );
    }
}

#[test]
fn comparison_with_simulated_memory_renders() {
    let sims: Vec<Simulation> = [
        (ScheduleKind::GPipe, 1),
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved1F1B, 2),
    ]
    .into_iter()
    .map(|(k, v)| sim(k, 4, v, 8))
    .collect();
    let mems: Vec<Vec<Vec<MemorySample>>> = sims
        .iter()
        .map(|s| s.report.devices.iter().map(|d| d.memory.clone()).collect())
        .collect();
    let panels: Vec<ChartPanel<'_>> = sims
        .iter()
        .zip(&mems)
        .map(|(s, m)| ChartPanel::new(&s.timeline).with_memory(m))
        .collect();
    let png = bubble_chart(&panels, &ChartOptions::default(), ImageFormat::Png).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    if let Ok(dir) = std::env::var("VIZ_EXAMPLES") {
        std::fs::write(
            std::path::Path::new(&dir).join("simulated-compare.png"),
            png,
        )
        .unwrap();
    }
}
