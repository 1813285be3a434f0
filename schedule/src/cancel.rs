//! A flag another thread sets to stop a long computation (a search, a sweep) early: the
//! Python face sets it on Ctrl-C while the work runs with the interpreter released.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Shared stop flag; clones see the same flag. Never set unless [`Cancel::cancel`] is called.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Ask the work holding a clone of this flag to stop at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`Cancel::cancel`] was called on this flag or a clone of it.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Any two flags are equal: a flag says how to stop a search, not what it searches, so two
/// specs of the same search compare equal whatever flag each holds.
impl PartialEq for Cancel {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
