//! `Checked`: a timetable the validator passed, the one form consumers take.
//!
//! Its fields are private and [`Checked::new`] is its only constructor, so a `Checked` is
//! never built from an unvalidated timetable: the simulator, the memory model and the runtime
//! take `&Checked` and do not validate again.

use std::borrow::Cow;
use std::ops::Deref;

use crate::timetable::{lower, LowerError, Timetable};
use crate::validate::{validate, Validated, ValidationError};

/// A timetable that passed [`validate`] (buffered sends): complete, ordered, paired and
/// deadlock-free. It reads as the [`Timetable`] it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    tt: Timetable,
    facts: Validated,
}

impl Checked {
    /// Validate `tt` (with [`Semantics::Buffered`](crate::Semantics)) and keep it as checked.
    pub fn new(tt: Timetable) -> Result<Self, ValidationError> {
        Checked::new_or_back(tt).map_err(|bad| bad.0)
    }

    /// [`Checked::new`], giving the timetable back beside the error (to show it with the
    /// failing step marked: [`ValidationError::grid`]).
    pub fn new_or_back(tt: Timetable) -> Result<Self, Box<(ValidationError, Timetable)>> {
        match validate(&tt) {
            Ok(facts) => Ok(Checked { tt, facts }),
            Err(e) => Err(Box::new((e, tt))),
        }
    }

    /// What the validator established.
    pub fn facts(&self) -> Validated {
        self.facts
    }

    /// The timetable.
    pub fn timetable(&self) -> &Timetable {
        &self.tt
    }

    /// The timetable, given back.
    pub fn into_timetable(self) -> Timetable {
        self.tt
    }

    /// This timetable with its sends and receives: itself when it has them, else [`lower`]ed.
    ///
    /// Lowering keeps a valid timetable valid, so the result is not validated again: `lower`
    /// puts each receive right before the action that consumes it and each send right after
    /// the action that produces it, and under buffered sends a receive waits exactly as long
    /// as the consumer waited on its producer in the compute-only timetable. The debug check
    /// below and `lowering_keeps_every_family_valid` (every generator) hold it to that.
    /// Its facts say `lowered` only when it has a send or receive (not on one device).
    pub fn lowered(&self) -> Result<Cow<'_, Checked>, LowerError> {
        if self.facts.lowered {
            return Ok(Cow::Borrowed(self));
        }
        let tt = lower(&self.tt)?;
        // On one device (or with every stage on one), there is nothing to send: still not
        // `lowered` by the validator's measure, and the same actions.
        let facts = Validated {
            lowered: tt.is_lowered(),
            ..self.facts
        };
        debug_assert_eq!(
            validate(&tt),
            Ok(facts),
            "lowering a valid timetable gave an invalid one"
        );
        Ok(Cow::Owned(Checked { tt, facts }))
    }
}

impl Deref for Checked {
    type Target = Timetable;

    fn deref(&self) -> &Timetable {
        &self.tt
    }
}

impl AsRef<Timetable> for Checked {
    fn as_ref(&self) -> &Timetable {
        &self.tt
    }
}

impl TryFrom<Timetable> for Checked {
    type Error = ValidationError;

    fn try_from(tt: Timetable) -> Result<Self, ValidationError> {
        Checked::new(tt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recompute::{insert, Recompute, RecomputePlan};
    use crate::{generate, ActionKind, ScheduleKind, ScheduleSpec};

    fn spec(kind: ScheduleKind, p: u32, v: u32, m: u32) -> Option<ScheduleSpec> {
        ScheduleSpec::new(kind, p, v, m, None).ok()
    }

    const SIZES: [(u32, u32, u32); 8] = [
        (1, 1, 1),
        (2, 1, 4),
        (2, 2, 4),
        (4, 2, 8),
        (3, 2, 5),
        (8, 2, 24),
        (4, 1, 3),
        (4, 2, 12),
    ];

    /// Every family at several sizes, with and without full recompute: its lowered form
    /// passes the validator, so `lowered` needs no second check.
    #[test]
    fn lowering_keeps_every_family_valid() {
        let mut seen = 0;
        for kind in ScheduleKind::ALL {
            for (p, v, m) in SIZES {
                let Some(spec) = spec(kind, p, v, m) else {
                    continue;
                };
                let plain = generate(&spec);
                let with_r = insert(&plain, &RecomputePlan::uniform(Recompute::Full));
                for tt in [plain, with_r] {
                    let checked = Checked::new(tt).unwrap_or_else(|e| panic!("{spec}: {e}"));
                    let low = lower(&checked).unwrap();
                    let facts = validate(&low).unwrap_or_else(|e| panic!("{spec} lowered: {e}"));
                    assert_eq!(facts.lowered, p > 1, "{spec}");
                    assert_eq!(*checked.lowered().unwrap(), Checked::new(low).unwrap());
                    seen += 1;
                }
            }
        }
        assert!(seen > 60, "only {seen} timetables checked");
    }

    #[test]
    fn a_lowered_checked_is_itself() {
        let spec = spec(ScheduleKind::OneFOneB, 4, 1, 8).unwrap();
        let low = Checked::new(lower(&generate(&spec)).unwrap()).unwrap();
        assert!(matches!(low.lowered().unwrap(), Cow::Borrowed(_)));
        assert!(low.facts().lowered);
    }

    #[test]
    fn an_invalid_timetable_is_refused_with_the_validators_error() {
        let spec = spec(ScheduleKind::OneFOneB, 2, 1, 2).unwrap();
        let mut tt = generate(&spec);
        let dropped = tt.devices[1].iter().position(|a| a.kind == ActionKind::B);
        tt.devices[1].remove(dropped.unwrap());
        let want = validate(&tt).unwrap_err();
        assert_eq!(Checked::new(tt).unwrap_err(), want);
    }
}
