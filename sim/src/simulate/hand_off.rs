//! The hand-off time between devices, read from recorded steps: what the simulator's
//! `p2p_latency` stands for (a send's time from the producer's compute end to the data being
//! there for the consumer), measured where a step shows it.
//!
//! A hand-off shows only where the consumer was waiting for it. Its compute then starts when
//! the data is there, so `consumer start - producer end` is the hand-off time. Where the
//! consumer was busy when the data came, its start says only that the data came earlier: such
//! a hand-off is not a sample (it would be an upper bound, not a measurement). The test uses
//! compute events only, which every timeline has in one meaning (the simulator's, pipewright's
//! runtime's and `pipewright.torch`'s recorder's alike; their SEND and RECV events mean three
//! different things): the consumer was waiting if its previous compute on its device ended no
//! later than the producer's compute. A consumer that became free between the producer's end
//! and the data's arrival waited too, but its compute events cannot tell it from one that was
//! busy past the arrival; it is left out, which costs samples, not accuracy.

use std::collections::HashMap;

use pipewright_schedule::action::{Action, ActionKind};
use pipewright_schedule::timeline::Timeline;

/// One hand-off between devices that a waiting consumer shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HandOff {
    /// The compute action that waited (F, B or I).
    pub consumer: Action,
    /// Its device.
    pub device: u32,
    /// The producing stage (`consumer.stage - 1` for an F, `+ 1` for a backward).
    pub from_stage: u32,
    /// The producer's device.
    pub from_device: u32,
    /// Consumer's compute start minus producer's compute end, in the timeline's unit.
    pub time: f64,
}

/// Where and when each (stage, microbatch)'s F and input-gradient backward ended.
#[derive(Default)]
struct Ends {
    /// (stage, microbatch) -> (device, end) of its F.
    forward: HashMap<(u32, u32), (u32, f64)>,
    /// (stage, microbatch) -> (device, end) of its B or I.
    backward: HashMap<(u32, u32), (u32, f64)>,
}

impl Ends {
    fn of(tl: &Timeline) -> Self {
        let mut ends = Ends::default();
        for e in tl.compute_events() {
            // An F&B overlap sends both parts' outputs once it is done.
            for part in e.action.parts() {
                let key = (part.stage, part.microbatch);
                match part.kind {
                    ActionKind::F => ends.forward.insert(key, (e.device, e.end)),
                    ActionKind::B | ActionKind::I => ends.backward.insert(key, (e.device, e.end)),
                    _ => None,
                };
            }
        }
        ends
    }

    /// The stage, device and end of what `a` needs from another stage, if it needs anything.
    fn producer(&self, a: Action) -> Option<(u32, u32, f64)> {
        let (from, table) = match a.kind {
            ActionKind::F => (a.stage.checked_sub(1)?, &self.forward),
            ActionKind::B | ActionKind::I => (a.stage.checked_add(1)?, &self.backward),
            _ => return None,
        };
        let &(device, end) = table.get(&(from, a.microbatch))?;
        Some((from, device, end))
    }
}

/// Every hand-off between devices in `tl` whose consumer was waiting for it (see the module's
/// note), in no particular order.
///
/// An F&B overlap as consumer gives no sample: it needs two inputs, and runtimes differ in
/// which it waits for (pipewright's waits for both before it starts, PyTorch's for the F's,
/// then runs the F, then waits for the B's), so its start does not say which hand-off held it.
/// It is a producer like any other.
pub fn hand_offs(tl: &Timeline) -> Vec<HandOff> {
    let ends = Ends::of(tl);
    let mut per_device: Vec<Vec<_>> = vec![Vec::new(); tl.meta.devices as usize];
    for e in tl.compute_events() {
        if let Some(list) = per_device.get_mut(e.device as usize) {
            list.push(e);
        }
    }
    let mut out = Vec::new();
    for events in &mut per_device {
        events.sort_by(|a, b| a.start.total_cmp(&b.start));
        let mut free = f64::NEG_INFINITY;
        for e in events.iter() {
            let previous_end = free;
            free = free.max(e.end);
            let Some((from_stage, from_device, end)) = ends.producer(e.action) else {
                continue;
            };
            if from_device == e.device || previous_end > end {
                continue;
            }
            out.push(HandOff {
                consumer: e.action,
                device: e.device,
                from_stage,
                from_device,
                time: e.start - end,
            });
        }
    }
    out
}

/// The median hand-off time over every waiting consumer of `timelines` (at least 0: a
/// consumer that starts before its producer ends is a clock's skew), with the number of
/// samples; `None` where no consumer waited for a hand-off between devices.
pub fn measured_latency(timelines: &[&Timeline]) -> Option<(f64, usize)> {
    let mut times: Vec<f64> = timelines
        .iter()
        .flat_map(|tl| hand_offs(tl))
        .map(|h| h.time)
        .collect();
    let n = times.len();
    median(&mut times).map(|t| (t.max(0.0), n))
}

/// The median of `v` (sorted in place; the mean of the middle two for an even count).
pub(super) fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{measured_costs, simulate, CostModel, StageCost};
    use pipewright_schedule::timeline::{Event, TimelineMeta, TimelineSource};
    use pipewright_schedule::Checked;
    use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

    fn event(device: u32, action: &str, start: f64, end: f64) -> Event {
        Event {
            device,
            action: action.parse().unwrap(),
            start,
            end,
        }
    }

    fn timeline(devices: u32, stages: u32, events: Vec<Event>) -> Timeline {
        Timeline {
            meta: TimelineMeta {
                schedule: "custom".into(),
                devices,
                stages,
                microbatches: 2,
                source: TimelineSource::Measured,
                time_unit: "ms".into(),
            },
            events,
        }
    }

    #[test]
    fn a_waiting_consumer_shows_the_hand_off_and_a_busy_one_does_not() {
        // Two devices, one stage each, two microbatches, hand-offs of 0.5, 0.7 and 0.6 ms
        // where device 1 waits, and one it was too busy to see.
        let tl = timeline(
            2,
            2,
            vec![
                event(0, "0F0", 0.0, 1.0),
                event(0, "0F1", 1.0, 2.0),
                event(1, "1F0", 1.5, 2.5), // waited from the start: 0.5
                // Device 1 was busy until 2.5 when 0F1 ended at 2.0: no sample.
                event(1, "1F1", 2.6, 3.6),
                event(1, "1B0", 3.6, 5.6),
                event(0, "0B0", 6.3, 8.3), // device 0 free since 2.0: 0.7
                event(1, "1B1", 5.6, 7.6),
                event(0, "0B1", 8.3, 10.3), // busy until 8.3, past 1B1's end (7.6): no sample
                // (a send event is no compute and plays no part)
                event(0, "0SEND_F0", 1.0, 1.1),
            ],
        );
        let mut got: Vec<(String, u32, f64)> = hand_offs(&tl)
            .iter()
            .map(|h| (h.consumer.to_string(), h.from_stage, h.time))
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let want = [("0B0", 1, 0.7), ("1F0", 0, 0.5)];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for ((name, from, t), (w_name, w_from, w_t)) in got.iter().zip(want) {
            assert_eq!((name.as_str(), *from), (w_name, w_from));
            assert!((t - w_t).abs() < 1e-12, "{name}: {t} against {w_t}");
        }
        // Another step of the same run with a 0.6 hand-off: the median of 0.5, 0.6, 0.7.
        let other = timeline(
            2,
            2,
            vec![event(0, "0F0", 0.0, 1.0), event(1, "1F0", 1.6, 2.6)],
        );
        let (t, n) = measured_latency(&[&tl, &other]).unwrap();
        assert_eq!(n, 3);
        assert!((t - 0.6).abs() < 1e-12);
        // One device: no hand-off to measure, and the cost file says nothing of it.
        let alone = timeline(
            1,
            2,
            vec![event(0, "0F0", 0.0, 1.0), event(0, "1F0", 1.0, 2.0)],
        );
        assert_eq!(measured_latency(&[&alone]), None);
    }

    #[test]
    fn an_overlap_produces_but_gives_no_sample_as_consumer() {
        // Device 1 runs an F&B overlap whose F waits for device 0's F; device 0's backward
        // then waits for the overlap's B part.
        let tl = timeline(
            2,
            2,
            vec![
                event(0, "0F0", 0.0, 1.0),
                event(0, "0F1", 1.0, 2.0),
                event(1, "1F0", 1.4, 2.4),
                event(1, "(1F1;1B0)OVERLAP_F_B", 2.4, 5.4), // no sample as consumer
                event(0, "0B0", 5.9, 7.9),                  // 0.5 after the overlap's end
            ],
        );
        let mut got: Vec<_> = hand_offs(&tl)
            .iter()
            .map(|h| (h.consumer.to_string(), h.time))
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!((got[0].0.as_str(), got[1].0.as_str()), ("0B0", "1F0"));
        assert!((got[0].1 - 0.5).abs() < 1e-9 && (got[1].1 - 0.4).abs() < 1e-9);
    }

    /// Simulate with hand-off latency `l`, measure the costs back from the simulated step,
    /// simulate again: the same latency and the same makespan.
    fn round_trip(spec: ScheduleSpec, l: f64) {
        let tt = Checked::new(generate(&spec)).unwrap();
        let mut cost = StageCost::new(1.0, 2.0, Some(0.75)).unwrap();
        cost.p2p_time = None;
        let mut costs = CostModel::uniform(spec.stages(), cost);
        costs.stages[1].f = 1.5;
        let costs = costs.with_link(l, None).unwrap();
        let first = simulate(&tt, &costs).unwrap();
        let raw = measured_costs(&[&first.timeline]).unwrap();
        let got = raw.p2p_latency.unwrap();
        assert!(
            (got - l).abs() < 1e-9,
            "{}: latency {got}, simulated with {l}",
            tt.name
        );
        let again = simulate(&tt, &raw.resolve(spec.stages()).unwrap()).unwrap();
        let (a, b) = (first.report.makespan, again.report.makespan);
        assert!(
            (a - b).abs() < 1e-9,
            "{}: makespan {b} against {a}",
            tt.name
        );
    }

    #[test]
    fn a_simulated_latency_measures_back_and_simulates_the_same_step() {
        use ScheduleKind::*;
        for (kind, v, l) in [
            (OneFOneB, 1, 0.3),
            (OneFOneB, 1, 2.5), // a latency longer than an F: the sends queue on the link
            (Interleaved1F1B, 2, 0.4),
            (ZbH1, 1, 0.2),
            (Zbv, 2, 0.3),
            (DualPipeV, 2, 0.3),
            (DualPipeV, 2, 2.5),
        ] {
            round_trip(ScheduleSpec::new(kind, 4, v, 8, None).unwrap(), l);
        }
    }

    #[test]
    fn one_device_measures_no_latency_and_the_cost_file_says_so() {
        // A link latency that one device never pays: nothing to measure, and a cost file
        // that claims a latency of 0 would be a guess.
        let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 1, 1, 4, None).unwrap();
        let costs = CostModel::uniform(1, StageCost::new(1.0, 2.0, None).unwrap())
            .with_link(0.5, None)
            .unwrap();
        let sim = simulate(&Checked::new(generate(&spec)).unwrap(), &costs).unwrap();
        let raw = measured_costs(&[&sim.timeline]).unwrap();
        assert_eq!(raw.p2p_latency, None);
        let source = raw.source.unwrap();
        assert!(
            source.ends_with("no hand-off between devices that a device waited for"),
            "{source}"
        );
    }
}
