//! PyTorch pipelining's CSV forms: one row per rank, one action per cell (`0F0`, `1SEND_F0`).
//!
//! The reader takes all three forms ([`CsvForm`]) and says which it found: PyTorch's
//! compute-only rows; PyTorch's compute+comms rows, whose sends, receives and the actions
//! PyTorch adds (`WAIT_SEND_*`, `UNSHARD`, `RESHARD`, `REDUCE_GRAD`, `WAIT_REDUCE_GRAD`) are
//! checked as PyTorch checks them (every send has one wait after it), and as its runtime will
//! run them (each hand-off between devices has its send after the action that makes it and
//! its receive before the action that uses it, and no other send or receive is there), then
//! left out, so the compute order comes back as written; and pipewright's own lowered rows,
//! kept as they are. Reading is linear in the file's length.
//!
//! Empty cells (PyTorch's idle slots) are skipped. The stage-to-device map is read off the
//! rows: a stage lives on the device whose row names it. A UTF-8 byte-order mark and trailing
//! blank lines are accepted; a blank row between rows is refused, since it would be a device
//! with no work (most often a row deleted by mistake).

use super::comms::{check_handoffs, Reductions, Sends};
pub use super::error::CsvError;
use super::form::CsvForm;
use crate::action::{Action, ActionKind, ParseActionError};
use crate::spec::MAX_ACTIONS;
use crate::timetable::Timetable;

/// Write a timetable's rows as they are, one per device: PyTorch's compute-only form for a
/// compute-only timetable, pipewright's own for a lowered one. [`write_csv`](super::write_csv)
/// writes each of PyTorch's forms from any timetable, or says why it cannot.
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

/// Where each action of an imported timetable was in the file, to report errors there, and
/// which form the file was in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvSource {
    cells: Vec<Vec<(usize, usize)>>,
    form: CsvForm,
}

impl CsvSource {
    /// The form the file was in.
    pub fn form(&self) -> CsvForm {
        self.form
    }

    /// 1-based (line, column) a validation error points at: its action's cell, or the start
    /// of its device's row; `None` when it names no device.
    pub fn locate(&self, e: &crate::validate::ValidationError) -> Option<(usize, usize)> {
        let at = e.at?;
        at.step
            .and_then(|(s, _)| self.line_col(at.device, s))
            .or(Some((at.device as usize + 1, 1)))
    }

    /// 1-based (line, column) of the action at (device, step).
    pub fn line_col(&self, device: u32, step: u32) -> Option<(usize, usize)> {
        self.cells.get(device as usize)?.get(step as usize).copied()
    }
}

/// Read a CSV timetable in any of its forms ([`CsvSource::form`] says which). The result is
/// parsed, not validated: run [`validate`](crate::validate()) on it, and map errors to lines
/// with [`CsvSource`].
pub fn from_csv(text: &str) -> Result<(Timetable, CsvSource), CsvError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rows: Vec<&str> = text.trim_end().lines().collect();
    let mut read = Rows::new(text, rows.len());
    for (d, row) in rows.iter().enumerate() {
        read.row(d, row)?;
    }
    read.finish()
}

/// What a CSV file's rows hold, read one row (device) at a time.
struct Rows {
    devices: Vec<Vec<Action>>,
    cells: Vec<Vec<(usize, usize)>>,
    /// (device, line) of each stage's first appearance.
    owner: Owners,
    max_stage: u32,
    max_mb: u32,
    /// PyTorch's compute+comms form: an action only it has was seen.
    pytorch_comms: bool,
    /// The first send of any row that no wait followed.
    unwaited: Option<(Action, (usize, usize))>,
}

impl Rows {
    fn new(text: &str, rows: usize) -> Self {
        Rows {
            devices: Vec::with_capacity(rows),
            cells: Vec::with_capacity(rows),
            owner: Owners {
                slots: Vec::new(),
                // Each stage needs a cell of at least 3 bytes (`0F0`) and a separator, so a
                // stage number past this bound leaves a stage below it on no row: refused
                // before the table is sized by it (a 12-byte file must not allocate by a
                // stage number of 2^28).
                most: (text.len() + 1) / 4,
                bytes: text.len(),
            },
            max_stage: 0,
            max_mb: 0,
            pytorch_comms: false,
            unwaited: None,
        }
    }

    /// Reads row `d` (line `d + 1`): its actions and their cells, each stage claimed for
    /// device `d`.
    fn row(&mut self, d: usize, row: &str) -> Result<(), CsvError> {
        let line = d + 1;
        let mut actions = Vec::new();
        let mut places = Vec::new();
        let mut sends = Sends::default();
        let mut reductions = Reductions::default();
        for (column, token) in cells_of(row) {
            let at = (line, column);
            if let Some(extra) = Extra::parse(token).map_err(|source| CsvError::Token {
                line,
                column,
                source,
            })? {
                self.extra(&extra, token, d, at, (&mut sends, &mut reductions))?;
                continue;
            }
            let a: Action = token.parse().map_err(|source| CsvError::Token {
                line,
                column,
                source,
            })?;
            // An overlap names two stages and two microbatches: each counts.
            for part in a.parts() {
                claim(&mut self.owner, part, d as u32, at)?;
                self.max_stage = self.max_stage.max(part.stage);
                self.max_mb = self.max_mb.max(part.microbatch);
            }
            if matches!(a.kind, ActionKind::SendF | ActionKind::SendB) {
                sends.send(a, at);
            }
            actions.push(a);
            places.push(at);
        }
        if actions.is_empty() {
            return Err(CsvError::BlankRow { line });
        }
        reductions.end()?;
        self.unwaited = self.unwaited.or(sends.first_unwaited());
        self.devices.push(actions);
        self.cells.push(places);
        Ok(())
    }

    /// One of the actions only PyTorch's compute+comms form has, at `at` of row `d`: it
    /// claims its stage, and a wait must follow its send in the row.
    fn extra(
        &mut self,
        extra: &Extra,
        token: &str,
        d: usize,
        at: (usize, usize),
        (sends, reductions): (&mut Sends, &mut Reductions),
    ) -> Result<(), CsvError> {
        self.pytorch_comms = true;
        claim(&mut self.owner, extra.stage_action(), d as u32, at)?;
        self.max_stage = self.max_stage.max(extra.stage);
        reductions.see((extra.name, extra.stage), token, at)?;
        if let Some(waited) = extra.waits_for() {
            if !sends.wait(waited) {
                let (line, column) = at;
                return Err(CsvError::WaitWithoutSend {
                    line,
                    column,
                    token: token.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The timetable the rows make, once every row is read: each stage on the device where
    /// it first appears, and the file's form.
    fn finish(mut self) -> Result<(Timetable, CsvSource), CsvError> {
        if self.owner.slots.is_empty() {
            return Err(CsvError::Empty);
        }
        if let (true, Some((send, (line, column)))) = (self.pytorch_comms, self.unwaited) {
            return Err(CsvError::SendWithoutWait { line, column, send });
        }
        let max_stage = self.max_stage;
        let stage_device = self
            .owner
            .slots
            .iter()
            .enumerate()
            .map(|(s, o)| {
                o.map(|(d, _)| d).ok_or(CsvError::MissingStage {
                    stage: s as u32,
                    max: max_stage,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let form = self.form(&stage_device)?;
        let tt = Timetable {
            name: "custom".to_string(),
            microbatches: self.max_mb + 1,
            stage_device,
            devices: self.devices,
        };
        Ok((
            tt,
            CsvSource {
                cells: self.cells,
                form,
            },
        ))
    }

    /// The file's form. A compute+comms file's hand-offs are checked, then its sends and
    /// receives dropped: the compute order is what the file says; PyTorch's sends and
    /// receives are a function of it (checked to be in place), placed again when the
    /// timetable is written in this form.
    fn form(&mut self, stage_device: &[u32]) -> Result<CsvForm, CsvError> {
        if self.pytorch_comms {
            check_handoffs(&self.devices, &self.cells, stage_device, self.max_mb + 1)?;
            for (actions, places) in self.devices.iter_mut().zip(self.cells.iter_mut()) {
                let keep: Vec<bool> = actions.iter().map(|a| a.kind.is_compute()).collect();
                let mut k = keep.iter();
                actions.retain(|_| *k.next().unwrap_or(&true));
                let mut k = keep.iter();
                places.retain(|_| *k.next().unwrap_or(&true));
            }
            Ok(CsvForm::ComputeComms)
        } else if self.devices.iter().flatten().any(|a| a.kind.is_comm()) {
            Ok(CsvForm::Lowered)
        } else {
            Ok(CsvForm::ComputeOnly)
        }
    }
}

/// A cell of PyTorch's compute+comms form that pipewright has no action for.
struct Extra {
    stage: u32,
    name: &'static str,
    microbatch: Option<u32>,
}

impl Extra {
    /// Longest first, as PyTorch's own regex tries them.
    const NAMES: [&'static str; 6] = [
        "WAIT_REDUCE_GRAD",
        "WAIT_SEND_F",
        "WAIT_SEND_B",
        "REDUCE_GRAD",
        "UNSHARD",
        "RESHARD",
    ];

    /// `Some` when `token` is one of these, `None` when it is anything else.
    fn parse(token: &str) -> Result<Option<Extra>, ParseActionError> {
        let digits = token.bytes().take_while(u8::is_ascii_digit).count();
        let rest = &token[digits..];
        let Some(name) = Self::NAMES.into_iter().find(|n| rest.starts_with(n)) else {
            return Ok(None);
        };
        let too_large = || ParseActionError::TooLarge(token.to_string());
        if digits == 0 {
            return Err(ParseActionError::NoStage(token.to_string()));
        }
        let stage = token[..digits].parse().map_err(|_| too_large())?;
        let mb = &rest[name.len()..];
        let microbatch = match mb {
            "" if !name.starts_with("WAIT_SEND") => None,
            _ if !mb.is_empty() && mb.bytes().all(|b| b.is_ascii_digit()) => {
                Some(mb.parse().map_err(|_| too_large())?)
            }
            _ => return Err(ParseActionError::NoMicrobatch(token.to_string())),
        };
        Ok(Some(Extra {
            stage,
            name,
            microbatch,
        }))
    }

    /// An action standing for this cell's stage (and microbatch), to claim its device.
    fn stage_action(&self) -> Action {
        Action::new(self.stage, ActionKind::F, self.microbatch.unwrap_or(0))
    }

    /// The send a `WAIT_SEND_*` waits for.
    fn waits_for(&self) -> Option<Action> {
        let kind = match self.name {
            "WAIT_SEND_F" => ActionKind::SendF,
            "WAIT_SEND_B" => ActionKind::SendB,
            _ => return None,
        };
        Some(Action::new(self.stage, kind, self.microbatch?))
    }
}

/// (device, line) of each stage's first appearance, and how many stages the file can hold.
struct Owners {
    slots: Vec<Option<(u32, usize)>>,
    most: usize,
    bytes: usize,
}

/// Record that `a`'s stage lives on device `d` (first seen at `line`), or say where it clashes.
fn claim(
    owner: &mut Owners,
    a: Action,
    d: u32,
    (line, column): (usize, usize),
) -> Result<(), CsvError> {
    if (u64::from(a.stage) + 1) * (u64::from(a.microbatch) + 1) > MAX_ACTIONS {
        return Err(CsvError::TooLarge { line, column });
    }
    let slot = a.stage as usize;
    if slot >= owner.most {
        return Err(CsvError::StageBeyondFile {
            stage: a.stage,
            bytes: owner.bytes,
            most: owner.most,
            line,
            column,
        });
    }
    if owner.slots.len() <= slot {
        owner.slots.resize(slot + 1, None);
    }
    match owner.slots[slot] {
        None => owner.slots[slot] = Some((d, line)),
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

/// Non-empty cells of a row with their 1-based columns (in characters); quotes and spaces
/// around cells dropped. Each character is counted once, so a row reads in linear time.
fn cells_of(row: &str) -> impl Iterator<Item = (usize, &str)> {
    let ascii = row.is_ascii();
    let width = move |s: &str| if ascii { s.len() } else { s.chars().count() };
    // Characters before the current cell.
    let mut before = 0;
    row.split(',').filter_map(move |cell| {
        let start = before;
        before += width(cell) + 1;
        let lead = width(&cell[..cell.len() - cell.trim_start().len()]);
        let token = cell.trim().trim_matches('"').trim();
        (!token.is_empty()).then_some((start + lead + 1, token))
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
    fn pytorchs_compute_comms_rows_read_as_their_compute_order_and_waits_are_checked() {
        let text = "0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD\n\
                    1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1RESHARD,1WAIT_SEND_B0\n";
        let (tt, src) = from_csv(text).unwrap();
        assert_eq!(src.form(), CsvForm::ComputeComms);
        assert_eq!(crate::to_csv(&tt), "0F0,0B0\n1F0,1B0\n");
        // Positions are those of the actions kept.
        assert_eq!(src.line_col(1, 1), Some((2, 23)));
        let err = from_csv(&text.replace(",1WAIT_SEND_B0", "")).unwrap_err();
        assert_eq!(err.to_string(), "line 2, column 27: `1SEND_B0` has no WAIT_SEND after it in its row: PyTorch's compute+comms form needs one wait per send (PyTorch refuses it)");
        let err = from_csv(&text.replace("0F0,0SEND_F0", "0F0,0WAIT_SEND_F1")).unwrap_err();
        assert!(
            matches!(
                err,
                CsvError::WaitWithoutSend {
                    line: 1,
                    column: 14,
                    ..
                }
            ),
            "{err}"
        );
        let err = from_csv("0F0,0WAIT_SEND_F,0B0\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("does not end with a microbatch number"),
            "{err}"
        );
    }

    #[test]
    fn pytorchs_compute_comms_rows_need_their_own_sends_and_receives_in_place() {
        // PyTorch runs a compute+comms file's hand-offs as written: a receive missing or after
        // its use fails its runtime's assertion, and a send missing leaves the receiver
        // waiting for ever. `validate` must not call such a file valid.
        let text = "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,\
                    0WAIT_SEND_F1,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD\n\
                    1UNSHARD,1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1REDUCE_GRAD,\
                    1WAIT_REDUCE_GRAD,1RESHARD,1WAIT_SEND_B0,1WAIT_SEND_B1\n";
        from_csv(text).unwrap();
        let err = |t: &str| from_csv(t).unwrap_err().to_string();
        assert_eq!(
            err(&text.replace("1RECV_F1,", "")),
            "line 2, column 36: `1F1` uses what `0F1` sends, but no `1RECV_F1` comes before it in its row (PyTorch's runtime refuses to compute before receiving)"
        );
        assert_eq!(
            err(&text.replace("1RECV_F1,1B0,1SEND_B0,1F1", "1B0,1SEND_B0,1F1,1RECV_F1")),
            "line 2, column 36: `1F1` uses what `0F1` sends, but no `1RECV_F1` comes before it in its row (PyTorch's runtime refuses to compute before receiving)"
        );
        assert_eq!(
            err(&text.replace("0SEND_F1,", "").replace("0WAIT_SEND_F1,", "")),
            "line 1, column 23: `0F1` hands its output to device 1, but no `0SEND_F1` follows it in its row (the receiver would wait for it for ever)"
        );
        assert_eq!(
            err(&text.replace("0F0,0SEND_F0", "0SEND_F0,0F0")),
            "line 1, column 19: `0F0` hands its output to device 1, but no `0SEND_F0` follows it in its row (the receiver would wait for it for ever)"
        );
        // A backward's hand-off likewise, and a hand-off no action makes.
        assert!(err(&text.replace("0RECV_B1,", "")).starts_with("line 1, column "));
        // A receive posted twice would take the next step's message.
        assert_eq!(
            err(&text.replace("1RECV_F1,", "1RECV_F1,1RECV_F1,")),
            "line 2, column 32: `1RECV_F1` is posted twice (PyTorch would pair the second with another message)"
        );
        let extra = text.replace("1UNSHARD,", "1UNSHARD,1RECV_B0,");
        assert_eq!(
            err(&extra),
            "line 2, column 10: `1RECV_B0` is no hand-off of this timetable (stage 1 is the last; PyTorch would wait for it for ever)"
        );
    }

    #[test]
    fn gradient_reductions_pair_as_pytorch_requires_when_it_loads_the_file() {
        // `_load_csv(format="compute_comms")` refuses a REDUCE_GRAD without its
        // WAIT_REDUCE_GRAD, a wait without its reduction, and two reductions pending at once.
        let text = "0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD\n\
                    1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1RESHARD,1WAIT_SEND_B0\n";
        from_csv(text).unwrap();
        let err = |t: &str| from_csv(t).unwrap_err().to_string();
        assert_eq!(
            err(&text.replace("0WAIT_REDUCE_GRAD,", "")),
            "line 1, column 50: `0REDUCE_GRAD` has no WAIT_REDUCE_GRAD after it in its row (PyTorch refuses it)"
        );
        assert_eq!(
            err(&text.replace("1REDUCE_GRAD,", "")),
            "line 2, column 36: `1WAIT_REDUCE_GRAD` waits for a reduction its row has not started (PyTorch refuses it)"
        );
        // Two stages on one row.
        let swapped = "0F0,1F0,1B0,1REDUCE_GRAD,0B0,0WAIT_REDUCE_GRAD,1WAIT_REDUCE_GRAD\n";
        assert_eq!(
            err(swapped),
            "line 1, column 30: `0WAIT_REDUCE_GRAD`, but stage 1's reduction is the one pending (PyTorch refuses it)"
        );
        let two = "0F0,1F0,1B0,1REDUCE_GRAD,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,1WAIT_REDUCE_GRAD\n";
        assert_eq!(
            err(two),
            "line 1, column 30: `0REDUCE_GRAD` while stage 1's reduction is pending: PyTorch keeps at most one pending a rank (wait for it first)"
        );
    }

    #[test]
    fn pipewrights_lowered_rows_are_kept_as_they_are() {
        let (tt, src) = from_csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n").unwrap();
        assert_eq!(src.form(), CsvForm::Lowered);
        assert_eq!(tt.len(), 8);
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        // A no-break space is two bytes, one character.
        let (_, src) = from_csv("0F0,\u{a0},0B0\n").unwrap();
        assert_eq!(src.line_col(0, 1), Some((1, 7)));
    }

    #[test]
    fn a_stage_number_past_what_the_file_can_hold_is_refused_before_sizing_by_it() {
        let err = from_csv("268435455F0\n").unwrap_err();
        assert!(
            matches!(
                err,
                CsvError::StageBeyondFile {
                    stage: 268435455,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("line 1, column 1: stage 268435455"),
            "{err}"
        );
        // The tightest file that holds stage 2: three rows of one cell each.
        let (tt, _) = from_csv("0F0\n1F0\n2F0").unwrap();
        assert_eq!(tt.num_stages(), 3);
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
