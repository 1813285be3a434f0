//! Bubble charts, sweep plots and terminal charts of `Timeline`s.
//!
//! Not built yet: see issue 3.
#![deny(missing_docs)]
