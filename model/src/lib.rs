//! What a model is and what it keeps: the one description of a transformer's shape
//! ([`shape`], read from Hugging Face configs too), the memory model that predicts each
//! rank's peak by category ([`memory`]), and measured per-layer profiles of a user's own
//! model ([`layer_profile`]).
//!
//! Invariants: no time in it (nothing here simulates or knows a cluster's speed; that is
//! `pipewright-sim` and `pipewright-plan`), and no IO beyond (de)serialisation.
#![deny(missing_docs)]

pub mod layer_profile;
pub mod memory;
pub mod shape;

pub use layer_profile::{LayerProfile, ProfileError, RawLayerProfile};
