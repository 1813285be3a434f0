//! Activation recomputation as a per-stage policy: what a stage keeps of a microbatch from
//! its forward until its backward. Stages differ in memory (the first stage of 1F1B holds p
//! microbatches, the last holds one), so the policy is a property of a stage, not of a model.
//! [`insert`] writes the recomputation into a timetable as `R` actions, which the validator,
//! the simulator and the runtime all understand.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod insert;

pub use insert::{insert, kept_whole, recomputed};

/// What one stage keeps of a microbatch until its backward (Korthikanti et al., 2022).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Everything the backward needs.
    #[default]
    None,
    /// Only the stage's input; the forward runs again before the backward.
    Full,
    /// Everything but the attention probabilities; the attention core runs again.
    Selective,
    /// `every:N`, Megatron's block method: the stage's first `N` layers run again from the
    /// kept stage input (their stashes are dropped), the rest keep everything; `N` at or
    /// above the stage's layer count recomputes every layer. A dial between none and full
    /// whose cost is N layers' forward.
    Every(u32),
}

impl Recompute {
    /// The policy's name, without `every`'s count.
    pub const fn as_str(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Full => "full",
            Recompute::Selective => "selective",
            Recompute::Every(_) => "every",
        }
    }
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recompute::Every(n) => write!(f, "every:{n}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// Why a recompute policy could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecomputeError {
    /// A policy name that is not one of ours.
    #[error("unknown recompute policy '{0}' (none, full, selective, every:N, or per stage as 0:full,1:selective)")]
    Unknown(String),
    /// `every:N` with an `N` that is not a whole number of at least 1.
    #[error("recompute policy '{0}': every:N recomputes the first N layers of each stage, so N is a whole number of at least 1 (every:0 would recompute nothing: that is none)")]
    BadEvery(String),
    /// A `stage:policy` pair whose stage is not a number.
    #[error("recompute '{0}': the stage before ':' must be a number")]
    BadStage(String),
    /// One stage given two policies.
    #[error("recompute names stage {0} twice")]
    Twice(u32),
    /// A stage the timetable does not have.
    #[error("recompute names stage {stage}, but the timetable has {stages} stages")]
    NoSuchStage {
        /// The stage named.
        stage: u32,
        /// Stages of the timetable.
        stages: u32,
    },
}

impl FromStr for Recompute {
    type Err = RecomputeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "none" => Ok(Recompute::None),
            "full" => Ok(Recompute::Full),
            "selective" => Ok(Recompute::Selective),
            other => match other.strip_prefix("every:").map(str::parse::<u32>) {
                Some(Ok(n)) if n > 0 => Ok(Recompute::Every(n)),
                Some(_) => Err(RecomputeError::BadEvery(other.to_string())),
                None => Err(RecomputeError::Unknown(other.to_string())),
            },
        }
    }
}

/// A policy for every stage: one for all (`full`), or one per stage named
/// (`0:full,1:selective`, the rest `none`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecomputePlan {
    /// The policy of stages not named in `stages`.
    pub all: Recompute,
    /// Policies of named stages.
    pub stages: BTreeMap<u32, Recompute>,
}

impl RecomputePlan {
    /// The same policy on every stage.
    pub fn uniform(policy: Recompute) -> Self {
        RecomputePlan {
            all: policy,
            stages: BTreeMap::new(),
        }
    }

    /// The policy of `stage`.
    pub fn of(&self, stage: u32) -> Recompute {
        self.stages.get(&stage).copied().unwrap_or(self.all)
    }

    /// True when no stage recomputes.
    pub fn is_none(&self) -> bool {
        self.all == Recompute::None && self.stages.values().all(|&r| r == Recompute::None)
    }

    /// Refuses a plan naming a stage past `stages`.
    pub fn check(&self, stages: u32) -> Result<(), RecomputeError> {
        match self.stages.keys().find(|&&s| s >= stages) {
            Some(&stage) => Err(RecomputeError::NoSuchStage { stage, stages }),
            None => Ok(()),
        }
    }
}

impl FromStr for RecomputePlan {
    type Err = RecomputeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !s.contains(':') || s.trim().starts_with("every") {
            // One policy for every stage; its own error names what is wrong with it.
            return s.parse().map(RecomputePlan::uniform);
        }
        let mut plan = RecomputePlan::default();
        for pair in s.split(',') {
            let (stage, policy) = pair
                .split_once(':')
                .ok_or_else(|| RecomputeError::Unknown(pair.trim().to_string()))?;
            let stage: u32 = stage
                .trim()
                .parse()
                .map_err(|_| RecomputeError::BadStage(pair.trim().to_string()))?;
            if plan.stages.insert(stage, policy.parse()?).is_some() {
                return Err(RecomputeError::Twice(stage));
            }
        }
        Ok(plan)
    }
}

impl fmt::Display for RecomputePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.stages.is_empty() {
            return write!(f, "{}", self.all);
        }
        let pairs: Vec<String> = self
            .stages
            .iter()
            .map(|(s, r)| format!("{s}:{r}"))
            .collect();
        f.write_str(&pairs.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_uniform_and_per_stage_and_refuse_bad_values_by_name() {
        let p: RecomputePlan = "full".parse().unwrap();
        assert_eq!((p.of(0), p.of(7)), (Recompute::Full, Recompute::Full));
        let p: RecomputePlan = "0:full, 2:selective".parse().unwrap();
        assert_eq!(
            (p.of(0), p.of(1), p.of(2)),
            (Recompute::Full, Recompute::None, Recompute::Selective)
        );
        assert_eq!(p.to_string(), "0:full,2:selective");
        assert!(p.check(3).is_ok());
        let e = p.check(2).unwrap_err().to_string();
        assert_eq!(e, "recompute names stage 2, but the timetable has 2 stages");
        let e = "most".parse::<RecomputePlan>().unwrap_err().to_string();
        assert!(e.starts_with("unknown recompute policy 'most'"), "{e}");
        let e = "x:full".parse::<RecomputePlan>().unwrap_err().to_string();
        assert!(e.contains("'x:full'") && e.contains("number"), "{e}");
        let e = "0:full,0:none".parse::<RecomputePlan>().unwrap_err();
        assert_eq!(e, RecomputeError::Twice(0));
        assert!("0:sometimes".parse::<RecomputePlan>().is_err());
        let p: RecomputePlan = "every:2".parse().unwrap();
        assert_eq!(
            (p.of(3), p.to_string()),
            (Recompute::Every(2), "every:2".into())
        );
        let p: RecomputePlan = "0:every:1,1:full".parse().unwrap();
        assert_eq!((p.of(0), p.of(1)), (Recompute::Every(1), Recompute::Full));
        for bad in ["every:0", "every:x", "every", "1:every:-1"] {
            assert!(bad.parse::<RecomputePlan>().is_err(), "{bad}");
        }
        for bad in ["every:0", "1:every:0", "every:x"] {
            let e = bad.parse::<RecomputePlan>().unwrap_err().to_string();
            assert!(e.contains("at least 1") && !e.contains("unknown"), "{e}");
        }
    }
}
