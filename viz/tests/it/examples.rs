//! Writes example charts to $VIZ_EXAMPLES (if set) for people to look at.
use crate::common;

use pipewright_viz::{bubble_chart, terminal_chart, ChartOptions, ChartPanel, ImageFormat};

#[test]
fn write_examples() {
    let Ok(dir) = std::env::var("VIZ_EXAMPLES") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let tl = common::timeline("interleaved-1f1b", 4, 2, 8, true);
    let mem = common::memory(&tl);
    let opts = ChartOptions::default();
    let png = bubble_chart(
        &[ChartPanel::new(&tl).with_memory(&mem)],
        &opts,
        ImageFormat::Png,
    )
    .unwrap();
    std::fs::write(dir.join("interleaved.png"), png).unwrap();
    let svg = bubble_chart(
        &[ChartPanel::new(&tl).with_memory(&mem)],
        &opts,
        ImageFormat::Svg,
    )
    .unwrap();
    std::fs::write(dir.join("interleaved.svg"), svg).unwrap();
    let g = common::timeline("gpipe", 4, 1, 8, false);
    let o = common::timeline("1f1b", 4, 1, 8, false);
    let i = common::timeline("interleaved-1f1b", 4, 2, 8, false);
    let z = common::timeline("1f1b-iw", 4, 1, 8, false);
    let (gm, om, im) = (common::memory(&g), common::memory(&o), common::memory(&i));
    let panels = [
        ChartPanel::new(&g).with_memory(&gm),
        ChartPanel::new(&o).with_memory(&om),
        ChartPanel::new(&i).with_memory(&im),
        ChartPanel::new(&z),
    ];
    let opts = ChartOptions {
        memory_cap: Some(6 << 20),
        ..ChartOptions::default()
    };
    std::fs::write(
        dir.join("compare.png"),
        bubble_chart(&panels, &opts, ImageFormat::Png).unwrap(),
    )
    .unwrap();
    let narrow = ChartOptions {
        width: 560,
        height: Some(420),
        ..ChartOptions::default()
    };
    let png = bubble_chart(
        &[
            ChartPanel::new(&z).with_label("zb-like"),
            ChartPanel::new(&i),
        ],
        &narrow,
        ImageFormat::Png,
    )
    .unwrap();
    std::fs::write(dir.join("narrow.png"), png).unwrap();
    println!("{}", terminal_chart(&i, 100));
}

/// Crop `(x, y, w, h)` of a PNG and scale it up `k` times (nearest), to inspect text.
#[allow(dead_code)]
fn zoom(src: &std::path::Path, dst: &std::path::Path, (x, y, w, h): (u32, u32, u32, u32), k: u32) {
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(src).unwrap()));
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    let mut out = Vec::with_capacity((w * h * k * k * 3) as usize);
    for oy in 0..h * k {
        for ox in 0..w * k {
            let i = (((y + oy / k) * info.width + x + ox / k) * 3) as usize;
            out.extend_from_slice(&buf[i..i + 3]);
        }
    }
    let f = std::fs::File::create(dst).unwrap();
    let mut e = png::Encoder::new(std::io::BufWriter::new(f), w * k, h * k);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    e.write_header().unwrap().write_image_data(&out).unwrap();
}

#[test]
fn zoom_examples() {
    let Ok(dir) = std::env::var("VIZ_ZOOM") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    zoom(
        &dir.join("interleaved.png"),
        &dir.join("zoom1.png"),
        (60, 55, 560, 60),
        3,
    );
    zoom(
        &dir.join("interleaved.png"),
        &dir.join("zoom2.png"),
        (900, 55, 299, 60),
        3,
    );
}

#[test]
fn write_sweep_example() {
    use pipewright_viz::{sweep_plot, SweepPoint, SweepSeries};
    let Ok(dir) = std::env::var("VIZ_EXAMPLES") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut series = Vec::new();
    for (name, v) in [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)] {
        let mut points = Vec::new();
        for m in [4u32, 8, 16, 32, 64] {
            let tl = common::timeline(name, 4, v, m, false);
            let peak = common::memory(&tl)
                .iter()
                .flatten()
                .map(|s| s.bytes)
                .max()
                .unwrap();
            points.push(SweepPoint {
                microbatches: m,
                bubble_fraction: tl.bubble_fraction(),
                throughput: f64::from(m) / tl.makespan(),
                peak_memory_bytes: peak,
            });
        }
        series.push(SweepSeries {
            label: format!("{name} v={v}"),
            points,
        });
    }
    let opts = pipewright_viz::ChartOptions {
        memory_cap: Some(24 << 20),
        ..Default::default()
    };
    let png = sweep_plot(&series, &opts, ImageFormat::Png).unwrap();
    std::fs::write(dir.join("sweep.png"), png).unwrap();
}

#[test]
fn write_large_example() {
    let Ok(dir) = std::env::var("VIZ_LARGE") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let tl = common::timeline("1f1b", 8, 1, 6_250, true);
    let t = std::time::Instant::now();
    let svg = bubble_chart(
        &[ChartPanel::new(&tl)],
        &ChartOptions::default(),
        ImageFormat::Svg,
    )
    .unwrap();
    println!("svg {} bytes in {:?}", svg.len(), t.elapsed());
    std::fs::write(dir.join("large.svg"), svg).unwrap();
    let png = bubble_chart(
        &[ChartPanel::new(&tl)],
        &ChartOptions::default(),
        ImageFormat::Png,
    )
    .unwrap();
    std::fs::write(dir.join("large.png"), png).unwrap();
    let tl = common::timeline("1f1b", 4, 1, 400, true);
    let png = bubble_chart(
        &[ChartPanel::new(&tl)],
        &ChartOptions::default(),
        ImageFormat::Png,
    )
    .unwrap();
    std::fs::write(dir.join("medium.png"), png).unwrap();
}
