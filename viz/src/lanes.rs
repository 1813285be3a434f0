//! From events to drawable boxes: split a timeline into lanes (compute and comm per device),
//! map times to pixels, and merge runs of sub-pixel boxes.

use pipewright_schedule::{Event, Timeline};

use crate::canvas::BoxTag;
use crate::style::{action_fill, Rgb};

/// Maps a panel's times to x pixels: its own start at `x0`, `px_per_unit` shared by all
/// panels of a chart so that equal durations have equal widths everywhere.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TimeScale {
    pub t0: f64,
    pub x0: f64,
    pub px_per_unit: f64,
}

impl TimeScale {
    pub fn x(&self, t: f64) -> f64 {
        self.x0 + (t - self.t0) * self.px_per_unit
    }
}

/// One box to draw on a lane.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneBox {
    pub x: f64,
    pub w: f64,
    pub fill: Rgb,
    pub tag: BoxTag,
}

/// Events of one device, split by stream, each sorted by start.
#[derive(Default)]
pub(crate) struct DeviceLanes<'a> {
    pub compute: Vec<&'a Event>,
    pub comm: Vec<&'a Event>,
}

/// Number of device rows: the declared device count, or more if events name higher devices.
pub(crate) fn row_count(tl: &Timeline) -> u32 {
    let seen = tl.events.iter().map(|e| e.device.saturating_add(1)).max();
    tl.meta.devices.max(seen.unwrap_or(0))
}

/// Model chunks per device, `v = S / p`, at least 1.
pub(crate) fn chunks_per_device(tl: &Timeline) -> u32 {
    tl.meta
        .stages
        .checked_div(tl.meta.devices)
        .unwrap_or(1)
        .max(1)
}

/// Group events by device and stream; `rows` must be at least [`row_count`].
pub(crate) fn split_lanes(tl: &Timeline, rows: u32) -> Vec<DeviceLanes<'_>> {
    let mut lanes: Vec<DeviceLanes<'_>> = (0..rows).map(|_| DeviceLanes::default()).collect();
    for e in &tl.events {
        if let Some(l) = lanes.get_mut(e.device as usize) {
            if e.action.kind.is_compute() {
                l.compute.push(e);
            } else {
                l.comm.push(e);
            }
        }
    }
    for l in &mut lanes {
        l.compute.sort_by(|a, b| a.start.total_cmp(&b.start));
        l.comm.sort_by(|a, b| a.start.total_cmp(&b.start));
    }
    lanes
}

/// Boxes of one lane. A box narrower than a pixel is merged into its neighbour when both
/// have the same fill and the gap between them is under half a pixel (invisible anyway):
/// the merged box spans exactly from the first start to the last end, so nothing moves.
/// Boxes of different colours are never merged, so no colour is invented or lost.
pub(crate) fn lane_boxes(
    events: &[&Event],
    scale: &TimeScale,
    devices: u32,
    chunks: u32,
) -> Vec<LaneBox> {
    let mut out: Vec<LaneBox> = Vec::with_capacity(events.len().min(1 << 16));
    for e in events {
        let chunk = e.action.stage.checked_div(devices).unwrap_or(0);
        let fill = action_fill(e.action.kind, chunk, chunks);
        let x = scale.x(e.start);
        let w = (scale.x(e.end) - x).max(0.0);
        if let Some(last) = out.last_mut() {
            let last_end = last.x + last.w;
            let thin = last.w < 1.0 || w < 1.0;
            if thin && last.fill == fill && x - last_end < 0.5 {
                last.w = (x + w).max(last_end) - last.x;
                last.tag.count += 1;
                last.tag.end = last.tag.end.max(e.end);
                continue;
            }
        }
        out.push(LaneBox {
            x,
            w,
            fill,
            tag: BoxTag {
                panel: 0,
                device: e.device,
                stage: e.action.stage,
                kind: e.action.kind,
                microbatch: e.action.microbatch,
                start: e.start,
                end: e.end,
                count: 1,
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::{Action, ActionKind};

    fn ev(kind: ActionKind, mb: u32, start: f64, end: f64) -> Event {
        Event {
            device: 0,
            action: Action::new(0, kind, mb),
            start,
            end,
        }
    }

    #[test]
    fn thin_same_colour_boxes_merge_without_moving() {
        let evs: Vec<Event> = (0..100)
            .map(|i| ev(ActionKind::F, i, f64::from(i), f64::from(i) + 1.0))
            .collect();
        let refs: Vec<&Event> = evs.iter().collect();
        // 100 units onto 10 px: every box is a tenth of a pixel.
        let s = TimeScale {
            t0: 0.0,
            x0: 50.0,
            px_per_unit: 0.1,
        };
        let boxes = lane_boxes(&refs, &s, 1, 1);
        assert_eq!(boxes.len(), 1);
        assert_eq!(boxes[0].tag.count, 100);
        assert!((boxes[0].x - 50.0).abs() < 1e-9 && (boxes[0].w - 10.0).abs() < 1e-9);
    }

    #[test]
    fn wide_boxes_and_visible_gaps_are_kept() {
        let evs = [
            ev(ActionKind::F, 0, 0.0, 1.0),
            ev(ActionKind::F, 1, 1.0, 2.0),
            ev(ActionKind::F, 2, 30.0, 30.1),
            ev(ActionKind::B, 2, 30.1, 30.2),
        ];
        let refs: Vec<&Event> = evs.iter().collect();
        let s = TimeScale {
            t0: 0.0,
            x0: 0.0,
            px_per_unit: 10.0,
        };
        let boxes = lane_boxes(&refs, &s, 1, 1);
        assert_eq!(boxes.len(), 4);
        assert!((boxes[2].x - 300.0).abs() < 1e-9);
    }
}
