use pipewright_schedule::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind: ScheduleKind = args[1].parse().unwrap();
    let v: u32 = args[2].parse().unwrap();
    for p in [1u32, 2, 3, 4, 5, 8] {
        let mut line = format!("p={p}:");
        for m in [1u32, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 17, 24] {
            let spec = match ScheduleSpec::new(kind, p, v, m, None) {
                Ok(s) => s,
                Err(_) => {
                    line += " -";
                    continue;
                }
            };
            let tt = generate(&spec);
            let f: f64 = std::env::var("F")
                .map(|x| x.parse().unwrap())
                .unwrap_or(1.0);
            let i: f64 = std::env::var("I")
                .map(|x| x.parse().unwrap())
                .unwrap_or(1.0);
            let w: f64 = std::env::var("W")
                .map(|x| x.parse().unwrap())
                .unwrap_or(1.0);
            let lat: f64 = std::env::var("C")
                .map(|x| x.parse().unwrap())
                .unwrap_or(0.0);
            let mut c = StageCost::new(f, i + w, Some(w)).unwrap();
            c.activation_bytes = 1;
            let costs = CostModel::uniform(spec.stages(), c)
                .with_link(lat, None)
                .unwrap();
            match simulate(&tt, &costs) {
                Ok(s) => {
                    let r = s.report;
                    line += &format!(
                        " m{m}:{}|{}",
                        r.makespan - r.ideal,
                        r.devices
                            .iter()
                            .map(|d| d.peak_activations.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    );
                }
                Err(e) => {
                    line += &format!(" m{m}:ERR");
                    if args.len() > 3 {
                        eprintln!("{spec}: {e}");
                    }
                }
            }
        }
        println!("{line}");
    }
}
