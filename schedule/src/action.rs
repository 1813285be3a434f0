//! Actions: the atoms of a timetable, and their PyTorch text form (`0F0`, `1SEND_F0`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What an action does. Compute kinds run a stage's math; communication kinds are added by
/// [`lower`](crate::lower) and move one tensor between two devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ActionKind {
    /// Forward of one stage on one microbatch.
    F,
    /// Full backward (input and weight gradients together).
    B,
    /// Backward for the stage's input gradient only.
    I,
    /// Backward for the stage's weight gradients only; needs the matching `I` first.
    W,
    /// Recompute of one stage on one microbatch: rebuild what its forward did not keep
    /// (see [`Recompute`](crate::Recompute)), after that F and before its backward, on
    /// the stage's device. Text form `2R3`.
    R,
    /// Send a stage's forward output to the next stage's device.
    #[serde(rename = "SEND_F")]
    SendF,
    /// Receive a stage's forward input from the previous stage's device.
    #[serde(rename = "RECV_F")]
    RecvF,
    /// Send a stage's input gradient to the previous stage's device.
    #[serde(rename = "SEND_B")]
    SendB,
    /// Receive a stage's output gradient from the next stage's device.
    #[serde(rename = "RECV_B")]
    RecvB,
    /// DualPipe's F&B: the forward of the action's own (stage, microbatch) run together with
    /// the full backward `B` of (`b_stage`, `b_microbatch`), both stages on this device, so
    /// that one's communication hides behind the other's compute. It satisfies, and needs,
    /// what its F and its B each would. Text form (PyTorch's): `(2F5;9B3)OVERLAP_F_B`.
    #[serde(rename = "OVERLAP_F_B")]
    Overlap {
        /// Stage of the backward part.
        b_stage: u32,
        /// Microbatch of the backward part.
        b_microbatch: u32,
    },
}

impl ActionKind {
    /// All kinds, in the order their text forms must be tried when parsing (longest first).
    pub const ALL: [ActionKind; 9] = [
        ActionKind::SendF,
        ActionKind::RecvF,
        ActionKind::SendB,
        ActionKind::RecvB,
        ActionKind::F,
        ActionKind::B,
        ActionKind::I,
        ActionKind::W,
        ActionKind::R,
    ];

    /// The text PyTorch's pipelining uses for this kind.
    pub const fn as_str(self) -> &'static str {
        match self {
            ActionKind::F => "F",
            ActionKind::B => "B",
            ActionKind::I => "I",
            ActionKind::W => "W",
            ActionKind::R => "R",
            ActionKind::SendF => "SEND_F",
            ActionKind::RecvF => "RECV_F",
            ActionKind::SendB => "SEND_B",
            ActionKind::RecvB => "RECV_B",
            ActionKind::Overlap { .. } => "OVERLAP_F_B",
        }
    }

    /// True for F, B, I, W, R and the F&B overlap.
    pub const fn is_compute(self) -> bool {
        matches!(
            self,
            ActionKind::F
                | ActionKind::B
                | ActionKind::I
                | ActionKind::W
                | ActionKind::R
                | ActionKind::Overlap { .. }
        )
    }

    /// True for the four send and receive kinds.
    pub const fn is_comm(self) -> bool {
        !self.is_compute()
    }

    /// True for the kinds that compute an input gradient (B or I): these are what the
    /// previous stage's backward waits for.
    pub const fn is_input_backward(self) -> bool {
        matches!(self, ActionKind::B | ActionKind::I)
    }

    /// Index for dense per-kind tables. An overlap has none of its own: tables index its
    /// F and B parts (see [`Action::parts`]); it shares F's slot if asked.
    pub(crate) const fn index(self) -> usize {
        match self {
            ActionKind::F | ActionKind::Overlap { .. } => 0,
            ActionKind::B => 1,
            ActionKind::I => 2,
            ActionKind::W => 3,
            ActionKind::SendF => 4,
            ActionKind::RecvF => 5,
            ActionKind::SendB => 6,
            ActionKind::RecvB => 7,
            ActionKind::R => 8,
        }
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of a timetable: `kind` applied to (`stage`, `microbatch`).
///
/// For communication kinds, `stage` is the stage on *this* device: `1SEND_F0` sends stage 1's
/// forward output of microbatch 0 onward to stage 2; `2RECV_F0` receives it as stage 2's input.
/// `2SEND_B0` sends stage 2's input gradient back to stage 1; `1RECV_B0` receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Action {
    /// Stage (model chunk) index, `0..S`.
    pub stage: u32,
    /// What to do.
    pub kind: ActionKind,
    /// Microbatch index, `0..m`.
    pub microbatch: u32,
}

impl Action {
    /// Build an action.
    pub const fn new(stage: u32, kind: ActionKind, microbatch: u32) -> Self {
        Action {
            stage,
            kind,
            microbatch,
        }
    }
}

impl Action {
    /// DualPipe's F&B: `F(f_stage, f_microbatch)` together with `B(b_stage, b_microbatch)`.
    pub const fn overlap(f_stage: u32, f_microbatch: u32, b_stage: u32, b_microbatch: u32) -> Self {
        Action::new(
            f_stage,
            ActionKind::Overlap {
                b_stage,
                b_microbatch,
            },
            f_microbatch,
        )
    }

    /// For a send or receive, the action on the neighbouring stage that pairs with it:
    /// `sSEND_F m` with `(s+1)RECV_F m`, `sSEND_B m` with `(s-1)RECV_B m`, and back. `None` for
    /// compute actions and for comm actions that point past either end of the pipeline.
    pub fn counterpart(self) -> Option<Action> {
        let (stage, kind) = match self.kind {
            ActionKind::SendF => (self.stage.checked_add(1)?, ActionKind::RecvF),
            ActionKind::RecvF => (self.stage.checked_sub(1)?, ActionKind::SendF),
            ActionKind::SendB => (self.stage.checked_sub(1)?, ActionKind::RecvB),
            ActionKind::RecvB => (self.stage.checked_add(1)?, ActionKind::SendB),
            _ => return None,
        };
        Some(Action::new(stage, kind, self.microbatch))
    }

    /// The simple actions this one runs: itself, or an overlap's F and then its B.
    pub fn parts(self) -> impl Iterator<Item = Action> {
        let (first, second) = match self.kind {
            ActionKind::Overlap {
                b_stage,
                b_microbatch,
            } => (
                Action::new(self.stage, ActionKind::F, self.microbatch),
                Some(Action::new(b_stage, ActionKind::B, b_microbatch)),
            ),
            _ => (self, None),
        };
        std::iter::once(first).chain(second)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ActionKind::Overlap {
                b_stage,
                b_microbatch,
            } => write!(
                f,
                "({}F{};{}B{}){}",
                self.stage, self.microbatch, b_stage, b_microbatch, self.kind
            ),
            _ => write!(f, "{}{}{}", self.stage, self.kind, self.microbatch),
        }
    }
}

/// Why a token is not an action.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseActionError {
    /// The token does not start with a stage number.
    #[error("`{0}` does not start with a stage number (expected e.g. `0F0`, `1SEND_F3`)")]
    NoStage(String),
    /// The text after the stage number is not a known kind.
    #[error("`{0}` has no known action kind after its stage (one of F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B)")]
    UnknownKind(String),
    /// The token has no microbatch number after its kind.
    #[error("`{0}` does not end with a microbatch number")]
    NoMicrobatch(String),
    /// A parenthesised group that is not PyTorch's `(sF m;sB m)OVERLAP_F_B`.
    #[error("`{0}` is not an overlap `(<stage>F<mb>;<stage>B<mb>)OVERLAP_F_B`: one forward, then one full backward")]
    BadOverlap(String),
    /// A number does not fit in 32 bits.
    #[error("`{0}` has a number too large")]
    TooLarge(String),
}

impl FromStr for Action {
    type Err = ParseActionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.starts_with('(') {
            return parse_overlap(t);
        }
        let digits = t.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(ParseActionError::NoStage(t.to_string()));
        }
        let stage = t[..digits]
            .parse()
            .map_err(|_| ParseActionError::TooLarge(t.to_string()))?;
        let rest = &t[digits..];
        let kind = ActionKind::ALL
            .into_iter()
            .find(|k| rest.starts_with(k.as_str()))
            .ok_or_else(|| ParseActionError::UnknownKind(t.to_string()))?;
        let mb = &rest[kind.as_str().len()..];
        if mb.is_empty() || !mb.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseActionError::NoMicrobatch(t.to_string()));
        }
        let microbatch = mb
            .parse()
            .map_err(|_| ParseActionError::TooLarge(t.to_string()))?;
        Ok(Action::new(stage, kind, microbatch))
    }
}

/// PyTorch's `(2F5;9B3)OVERLAP_F_B`: exactly one F, then one B.
fn parse_overlap(t: &str) -> Result<Action, ParseActionError> {
    let bad = || ParseActionError::BadOverlap(t.to_string());
    let inner = t
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(")OVERLAP_F_B"))
        .ok_or_else(bad)?;
    let (f, b) = inner.split_once(';').ok_or_else(bad)?;
    let (f, b): (Action, Action) = (f.parse()?, b.parse()?);
    if f.kind != ActionKind::F || b.kind != ActionKind::B {
        return Err(bad());
    }
    Ok(Action::overlap(
        f.stage,
        f.microbatch,
        b.stage,
        b.microbatch,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        for s in [
            "0F0",
            "4B1",
            "2I3",
            "2W3",
            "1SEND_F0",
            "3RECV_B12",
            "10RECV_F7",
            "(2F5;9B3)OVERLAP_F_B",
        ] {
            let a: Action = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
    }

    #[test]
    fn bad_tokens_are_rejected_with_reason() {
        assert!(matches!(
            "F0".parse::<Action>(),
            Err(ParseActionError::NoStage(_))
        ));
        assert!(matches!(
            "0X0".parse::<Action>(),
            Err(ParseActionError::UnknownKind(_))
        ));
        assert!(matches!(
            "0F".parse::<Action>(),
            Err(ParseActionError::NoMicrobatch(_))
        ));
        assert!(matches!(
            "0F1x".parse::<Action>(),
            Err(ParseActionError::NoMicrobatch(_))
        ));
        for bad in ["(0F1;1I0)OVERLAP_F_B", "(0F1)OVERLAP_F_B", "(0F1;1B0)"] {
            assert!(
                matches!(bad.parse::<Action>(), Err(ParseActionError::BadOverlap(_))),
                "{bad}"
            );
        }
    }
}
