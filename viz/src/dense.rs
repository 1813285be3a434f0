//! Sub-pixel actions that survive same-colour merging (in 1F1B's steady state F and B
//! alternate, so nothing merges) are drawn per pixel column instead: the lane is split
//! vertically in proportion to each colour's share of that column's time, and neighbouring
//! columns that look the same are joined. Every action stays in the column where it ran,
//! the F:B:idle proportions stay true, and a 100,000-action chart stays a few thousand
//! rectangles.

use std::collections::BTreeMap;

use crate::canvas::BoxTag;
use crate::lanes::LaneBox;
use crate::style::Rgb;

/// Vertical resolution of the shares: sixteenths of the lane height.
const LEVELS: f64 = 16.0;

/// One colour's share of a run of columns.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub fill: Rgb,
    /// Fraction of the lane height, a multiple of `1 / LEVELS`, at least one step.
    pub share: f64,
    /// Kind, first action, time span and `count` of the actions behind this piece.
    pub tag: BoxTag,
}

/// A run of pixel columns `[x, x + w)` with the same composition.
#[derive(Clone, Debug)]
pub(crate) struct DenseRun {
    pub x: f64,
    pub w: f64,
    pub pieces: Vec<Piece>,
}

/// Per-column tallies of one colour: covered fraction of the column, and its actions.
struct Acc {
    cover: f64,
    fill: Rgb,
    tag: BoxTag,
}

/// Keep boxes at least a pixel wide as they are; turn the rest into dense column runs.
pub(crate) fn split_dense(boxes: Vec<LaneBox>) -> (Vec<LaneBox>, Vec<DenseRun>) {
    let (wide, thin): (Vec<LaneBox>, Vec<LaneBox>) = boxes.into_iter().partition(|b| b.w >= 1.0);
    if thin.is_empty() {
        return (wide, Vec::new());
    }
    let mut cols: BTreeMap<i64, Vec<Acc>> = BTreeMap::new();
    for b in &thin {
        add(&mut cols, b);
    }
    (wide, runs(cols))
}

/// Spread one thin box's coverage over the (one or two) columns it touches; its actions are
/// counted in the column where it starts.
fn add(cols: &mut BTreeMap<i64, Vec<Acc>>, b: &LaneBox) {
    let first = b.x.floor() as i64;
    let last = ((b.x + b.w).ceil() as i64 - 1).max(first);
    for col in first..=last {
        let c = col as f64;
        let cover = ((b.x + b.w).min(c + 1.0) - b.x.max(c)).max(0.0);
        let count = if col == first { b.tag.count } else { 0 };
        let accs = cols.entry(col).or_default();
        match accs.iter_mut().find(|a| a.fill == b.fill) {
            Some(a) => {
                a.cover += cover;
                a.tag.count += count;
                a.tag.end = a.tag.end.max(b.tag.end);
            }
            None => accs.push(Acc {
                cover,
                fill: b.fill,
                tag: BoxTag { count, ..b.tag },
            }),
        }
    }
}

/// Quantised composition of one column, in a fixed order so equal columns compare equal.
fn compose(mut accs: Vec<Acc>) -> Vec<Piece> {
    accs.sort_by_key(|a| (a.tag.kind, a.fill.0, a.fill.1, a.fill.2));
    let total: f64 = accs.iter().map(|a| a.cover).sum();
    // Concurrent comm events can cover a column more than once; shares never exceed it.
    let norm = if total > 1.0 { total } else { 1.0 };
    accs.into_iter()
        .map(|a| Piece {
            fill: a.fill,
            share: ((a.cover / norm * LEVELS).round().max(1.0)) / LEVELS,
            tag: a.tag,
        })
        .collect()
}

/// Join neighbouring columns with identical compositions into runs.
fn runs(cols: BTreeMap<i64, Vec<Acc>>) -> Vec<DenseRun> {
    let mut out: Vec<DenseRun> = Vec::new();
    for (col, accs) in cols {
        let pieces = compose(accs);
        if let Some(last) = out.last_mut() {
            let adjacent = (last.x + last.w - col as f64).abs() < 0.5;
            let same = last.pieces.len() == pieces.len()
                && last
                    .pieces
                    .iter()
                    .zip(&pieces)
                    .all(|(a, b)| a.fill == b.fill && a.share == b.share);
            if adjacent && same {
                last.w += 1.0;
                for (a, b) in last.pieces.iter_mut().zip(&pieces) {
                    a.tag.count += b.tag.count;
                    a.tag.end = a.tag.end.max(b.tag.end);
                }
                continue;
            }
        }
        out.push(DenseRun {
            x: col as f64,
            w: 1.0,
            pieces,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::ActionKind;

    fn lb(x: f64, w: f64, kind: ActionKind, fill: Rgb) -> LaneBox {
        LaneBox {
            x,
            w,
            fill,
            tag: BoxTag {
                panel: 0,
                device: 0,
                stage: 0,
                kind,
                microbatch: 0,
                start: x,
                end: x + w,
                count: 1,
            },
        }
    }

    #[test]
    fn alternating_thin_boxes_become_proportional_columns() {
        let (f, b) = (Rgb(1, 1, 1), Rgb(2, 2, 2));
        // 10 columns, each with F for 0.25 px then B for 0.5 px, then 0.25 px idle.
        let mut boxes = Vec::new();
        for c in 0..10 {
            let x = 100.0 + f64::from(c);
            boxes.push(lb(x, 0.25, ActionKind::F, f));
            boxes.push(lb(x + 0.25, 0.5, ActionKind::B, b));
        }
        boxes.push(lb(200.0, 5.0, ActionKind::F, f));
        let (wide, dense) = split_dense(boxes);
        assert_eq!(wide.len(), 1);
        assert_eq!(dense.len(), 1, "identical columns join");
        let run = &dense[0];
        assert_eq!((run.x, run.w), (100.0, 10.0));
        let shares: Vec<f64> = run.pieces.iter().map(|p| p.share).collect();
        assert_eq!(shares, vec![0.25, 0.5]);
        let counts: u32 = run.pieces.iter().map(|p| p.tag.count).sum();
        assert_eq!(counts, 20, "no action is lost");
    }
}
