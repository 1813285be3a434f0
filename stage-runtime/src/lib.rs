//! Per-device async stage runtime: mesh, communicators, executor, reference model.
//!
//! Not built yet: see issue 5.
#![deny(missing_docs)]
