//! PyTorch pipelining's CSV form: one row per rank, one action per cell (`0F0`, `1SEND_F0`).
//!
//! Empty cells (PyTorch's idle slots) are skipped. The stage-to-device map is read off the
//! rows: a stage lives on the device whose row names it. A UTF-8 byte-order mark and trailing
//! blank lines are accepted; a blank row between rows is refused, since it would be a device
//! with no work (most often a row deleted by mistake).

use crate::action::{Action, ParseActionError};
use crate::spec::MAX_ACTIONS;
use crate::timetable::Timetable;

/// Write a timetable as CSV, one row per device.
pub fn to_csv(tt: &Timetable) -> String {
    let mut out = String::with_capacity(tt.len() * 6);
    for actions in &tt.devices {
        for (i, a) in actions.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&a.to_string());
        }
        out.push('\n');
    }
    out
}

/// Where each action of an imported timetable was in the file, to report errors there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsvSource {
    cells: Vec<Vec<(usize, usize)>>,
}

impl CsvSource {
    /// 1-based (line, column) of the action at (device, step).
    pub fn line_col(&self, device: u32, step: u32) -> Option<(usize, usize)> {
        self.cells.get(device as usize)?.get(step as usize).copied()
    }
}

/// Why a CSV cannot be read as a timetable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CsvError {
    /// A cell is not an action.
    #[error("line {line}, column {column}: {source}")]
    Token {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong with it.
        source: ParseActionError,
    },
    /// A blank row before the last row: it would be a device with no work.
    #[error("line {line} is blank: every line is one device's row of actions (remove the blank line, or give that device its actions)")]
    BlankRow {
        /// 1-based line.
        line: usize,
    },
    /// No action at all.
    #[error("no actions: expected one row of actions (like `0F0,0F1,0B0`) per device")]
    Empty,
    /// A stage on two rows.
    #[error("line {line}, column {column}: stage {stage} is already on device {device} (line {first_line}); a stage lives on one device")]
    StageOnTwoDevices {
        /// Stage.
        stage: u32,
        /// Device (row) that named it first.
        device: u32,
        /// Line of that row.
        first_line: usize,
        /// Line of the conflicting cell.
        line: usize,
        /// Column of the conflicting cell.
        column: usize,
    },
    /// A stage number no row names.
    #[error("stage {stage} appears in no row, but stage {max} does: stages must be numbered 0..S with each on some device")]
    MissingStage {
        /// Stage nobody names.
        stage: u32,
        /// Highest stage named.
        max: u32,
    },
    /// Numbers too large to hold.
    #[error(
        "line {line}, column {column}: stages x microbatches exceeds the limit of {MAX_ACTIONS}"
    )]
    TooLarge {
        /// Line.
        line: usize,
        /// Column.
        column: usize,
    },
}

/// Read a CSV timetable (compute-only or lowered). The result is parsed, not validated:
/// run [`validate`](crate::validate()) on it, and map errors to lines with [`CsvSource`].
pub fn from_csv(text: &str) -> Result<(Timetable, CsvSource), CsvError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rows: Vec<&str> = text.trim_end().lines().collect();
    let mut devices = Vec::with_capacity(rows.len());
    let mut cells = Vec::with_capacity(rows.len());
    // (device, line) of each stage's first appearance.
    let mut owner: Vec<Option<(u32, usize)>> = Vec::new();
    let (mut max_stage, mut max_mb) = (0u32, 0u32);
    for (d, row) in rows.iter().enumerate() {
        let line = d + 1;
        let mut actions = Vec::new();
        let mut places = Vec::new();
        for (column, token) in cells_of(row) {
            let a: Action = token.parse().map_err(|source| CsvError::Token {
                line,
                column,
                source,
            })?;
            // An overlap names two stages and two microbatches: each counts.
            for part in a.parts() {
                claim(&mut owner, part, d as u32, (line, column))?;
                max_stage = max_stage.max(part.stage);
                max_mb = max_mb.max(part.microbatch);
            }
            actions.push(a);
            places.push((line, column));
        }
        if actions.is_empty() {
            return Err(CsvError::BlankRow { line });
        }
        devices.push(actions);
        cells.push(places);
    }
    if owner.is_empty() {
        return Err(CsvError::Empty);
    }
    let stage_device = owner
        .iter()
        .enumerate()
        .map(|(s, o)| {
            o.map(|(d, _)| d).ok_or(CsvError::MissingStage {
                stage: s as u32,
                max: max_stage,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tt = Timetable {
        name: "custom".to_string(),
        microbatches: max_mb + 1,
        stage_device,
        devices,
    };
    Ok((tt, CsvSource { cells }))
}

/// Record that `a`'s stage lives on device `d` (first seen at `line`), or say where it clashes.
fn claim(
    owner: &mut Vec<Option<(u32, usize)>>,
    a: Action,
    d: u32,
    (line, column): (usize, usize),
) -> Result<(), CsvError> {
    if (u64::from(a.stage) + 1) * (u64::from(a.microbatch) + 1) > MAX_ACTIONS {
        return Err(CsvError::TooLarge { line, column });
    }
    let slot = a.stage as usize;
    if owner.len() <= slot {
        owner.resize(slot + 1, None);
    }
    match owner[slot] {
        None => owner[slot] = Some((d, line)),
        Some((device, first_line)) if device != d => {
            return Err(CsvError::StageOnTwoDevices {
                stage: a.stage,
                device,
                first_line,
                line,
                column,
            })
        }
        Some(_) => {}
    }
    Ok(())
}

/// Non-empty cells of a row with their 1-based columns; quotes and spaces around cells dropped.
fn cells_of(row: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut offset = 0;
    row.split(',').filter_map(move |cell| {
        let start = offset;
        offset += cell.len() + 1;
        let lead = cell.len() - cell.trim_start().len();
        let token = cell.trim().trim_matches('"').trim();
        (!token.is_empty()).then(|| (row[..start + lead].chars().count() + 1, token))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pytorch_rows_with_idle_cells() {
        let (tt, src) = from_csv("0F0,,0B0\r\n1F0,1B0\r\n").unwrap();
        assert_eq!(tt.stage_device, vec![0, 1]);
        assert_eq!(tt.microbatches, 1);
        assert_eq!(tt.devices[0].len(), 2);
        assert_eq!(src.line_col(0, 1), Some((1, 6)));
    }

    #[test]
    fn bad_cell_names_line_and_column() {
        let err = from_csv("0F0,0B0\n1F0, 1Q0\n").unwrap_err();
        assert!(
            matches!(
                err,
                CsvError::Token {
                    line: 2,
                    column: 6,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn blank_rows_are_refused_with_their_line_but_trailing_newlines_and_bom_are_fine() {
        let err = from_csv("0F0,0B0\n\n1F0,1B0\n").unwrap_err();
        assert_eq!(err, CsvError::BlankRow { line: 2 });
        let err = from_csv("0F0,0B0\n , ,\n1F0,1B0\n").unwrap_err();
        assert_eq!(err, CsvError::BlankRow { line: 2 });
        let (tt, src) = from_csv("\u{feff}0F0,0B0\n1F0,1B0\n\n\n").unwrap();
        assert_eq!(tt.num_devices(), 2);
        assert_eq!(src.line_col(0, 1), Some((1, 5)));
    }

    #[test]
    fn stage_on_two_rows_is_rejected() {
        let err = from_csv("0F0\n0B0\n").unwrap_err();
        assert!(
            err.to_string().contains("stage 0 is already on device 0"),
            "{err}"
        );
    }
}
