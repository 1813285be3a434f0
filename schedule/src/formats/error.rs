//! Why a CSV cannot be read as a timetable: the one error of the CSV reader and the hand-off
//! checks it calls ([`super::comms`]), kept apart so both import it and neither imports the other.

use crate::action::{Action, ParseActionError};
use crate::spec::MAX_ACTIONS;

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
    /// A `WAIT_SEND_*` with no earlier send of the same stage and microbatch in its row.
    #[error("line {line}, column {column}: `{token}` waits for a send its row has not made before it (PyTorch refuses it: each WAIT_SEND follows its send)")]
    WaitWithoutSend {
        /// Line.
        line: usize,
        /// Column.
        column: usize,
        /// The wait.
        token: String,
    },
    /// A send of PyTorch's compute+comms form with no wait after it in its row.
    #[error("line {line}, column {column}: `{send}` has no WAIT_SEND after it in its row: PyTorch's compute+comms form needs one wait per send (PyTorch refuses it)")]
    SendWithoutWait {
        /// Line.
        line: usize,
        /// Column.
        column: usize,
        /// The send.
        send: Action,
    },
    /// A hand-off of PyTorch's compute+comms form missing or out of place (PyTorch runs the
    /// file's sends and receives as written).
    #[error("line {line}, column {column}: {message}")]
    Handoff {
        /// Line.
        line: usize,
        /// Column.
        column: usize,
        /// What is missing or misplaced, and why PyTorch cannot run it.
        message: String,
    },
    /// A gradient reduction of PyTorch's compute+comms form not paired with its wait, as
    /// PyTorch requires when it loads the file.
    #[error("line {line}, column {column}: {message}")]
    Reduction {
        /// Line.
        line: usize,
        /// Column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A stage number the file is too short to hold every stage below it for.
    #[error("line {line}, column {column}: stage {stage}, but a file of {bytes} bytes holds at most {most} stages (every stage from 0 to {stage} must be on some row)")]
    StageBeyondFile {
        /// The stage named.
        stage: u32,
        /// Bytes in the file.
        bytes: usize,
        /// Most stages a file of this length can name.
        most: usize,
        /// Line.
        line: usize,
        /// Column.
        column: usize,
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
