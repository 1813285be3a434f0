//! One search as either face asks for it: the CLI's `search` and Python's `search(...)` build
//! the same [`SearchRequest`] and take its checks, so what they accept cannot drift apart (it
//! had: the CLI refused a time budget of 0 and more than 4 runners-up, Python did not).

use std::time::Duration;

use pipewright_model::memory::MemoryConfig;
use pipewright_schedule::timeline::MAX_DEVICES;
use pipewright_schedule::ScheduleKind;

use super::{MemoryCap, Objective, SearchSpec, MAX_TIME_BUDGET};
use pipewright_sim::simulate::CostModel;

/// Most timetables a search keeps beside the best (`--runners-up`, `timetables(k)`).
pub const MAX_RUNNERS_UP: usize = 4;

/// A search request a face cannot run, naming the field; each face renders the field in its
/// own words ([`SearchRequestError::named`]: `--max-virtual` or `max_virtual`).
#[derive(Clone, Debug, PartialEq)]
pub enum SearchRequestError {
    /// A count below 1.
    TooFew {
        /// The field (`p`, `m`, `max_virtual`).
        field: &'static str,
        /// What was asked for.
        got: u32,
        /// What the count is.
        why: &'static str,
    },
    /// More pipeline devices than a timeline can hold.
    TooManyDevices {
        /// What was asked for.
        got: u32,
    },
    /// A time budget that is not a finite number of seconds in range.
    TimeBudget {
        /// What was asked for.
        got: f64,
    },
    /// More runners-up than the search keeps.
    RunnersUp {
        /// What was asked for.
        got: usize,
    },
}

impl std::fmt::Display for SearchRequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message(self.field()))
    }
}

impl std::error::Error for SearchRequestError {}

impl SearchRequestError {
    /// The request's field at fault, in the library's words (`max_virtual`).
    pub fn field(&self) -> &'static str {
        match self {
            SearchRequestError::TooFew { field, .. } => field,
            SearchRequestError::TooManyDevices { .. } => "p",
            SearchRequestError::TimeBudget { .. } => "time_budget",
            SearchRequestError::RunnersUp { .. } => "runners_up",
        }
    }

    /// The message with the field called what `name` calls it (`--max-virtual` on the
    /// command line).
    pub fn named(&self, name: impl Fn(&str) -> String) -> String {
        self.message(&name(self.field()))
    }

    fn message(&self, name: &str) -> String {
        match self {
            SearchRequestError::TooFew { got, why, .. } => {
                format!("{name} {got}: must be at least 1 ({why})")
            }
            SearchRequestError::TooManyDevices { got } => {
                format!("{name} {got}: must be at most {MAX_DEVICES} (pipeline devices)")
            }
            SearchRequestError::TimeBudget { got } => format!(
                "{name} {got}: must be a finite number above 0 and at most {MAX_TIME_BUDGET} (seconds to spend evaluating candidates)"
            ),
            SearchRequestError::RunnersUp { got } => format!(
                "{name} {got}: give at most {MAX_RUNNERS_UP} (the search keeps that many beside the best)"
            ),
        }
    }
}

/// What to search: the fastest timetable on `p` devices with `m` microbatches under `cap`.
#[derive(Clone, Debug)]
pub struct SearchRequest {
    /// Pipeline devices.
    pub p: u32,
    /// Microbatches per step.
    pub m: u32,
    /// The memory cap.
    pub cap: MemoryCap,
    /// Largest chunks per device to try.
    pub max_virtual: u32,
    /// Fixed families to try.
    pub families: Vec<ScheduleKind>,
    /// Whether the search's own list scheduler runs.
    pub list_scheduler: bool,
    /// Whether timetables with a split backward (I and W) are tried.
    pub split_backward: bool,
    /// Most simulations spent improving the best.
    pub improve: usize,
    /// What to minimise.
    pub objective: Objective,
    /// Seconds to spend evaluating candidates.
    pub time_budget: f64,
    /// Fitting timetables kept beside the best.
    pub runners_up: usize,
    /// With a model shape: the memory model that bounds each rank's whole memory.
    pub memory: Option<MemoryConfig>,
}

impl SearchRequest {
    /// A request with both faces' defaults: every family, `v` up to 4, the list scheduler,
    /// 200 improving simulations, the period, 30 s, no runners-up, no memory model.
    pub fn new(p: u32, m: u32, cap: MemoryCap) -> Self {
        SearchRequest {
            p,
            m,
            cap,
            max_virtual: 4,
            families: ScheduleKind::ALL.to_vec(),
            list_scheduler: true,
            split_backward: true,
            improve: 200,
            objective: Objective::Period,
            time_budget: 30.0,
            runners_up: 0,
            memory: None,
        }
    }

    /// Refuse what no search can run, naming the field.
    pub fn check(&self) -> Result<(), SearchRequestError> {
        let t = self.time_budget;
        if !(t.is_finite() && t > 0.0 && t <= MAX_TIME_BUDGET) {
            return Err(SearchRequestError::TimeBudget { got: t });
        }
        for (field, got, why) in [
            ("p", self.p, "pipeline devices"),
            ("m", self.m, "microbatches per step"),
            ("max_virtual", self.max_virtual, "chunks per device"),
        ] {
            if got == 0 {
                return Err(SearchRequestError::TooFew { field, got, why });
            }
        }
        if self.p > MAX_DEVICES {
            return Err(SearchRequestError::TooManyDevices { got: self.p });
        }
        if self.runners_up > MAX_RUNNERS_UP {
            return Err(SearchRequestError::RunnersUp {
                got: self.runners_up,
            });
        }
        Ok(())
    }

    /// What the search holds at once, for the faces' check of this machine's memory: its
    /// description, the stage-microbatches of a candidate at the largest `v`, and how many
    /// such timetables (one simulated over a few steps, and the best kept beside it).
    pub fn footprint(&self) -> (String, u64, u64) {
        let top_v = self.max_virtual.max(2);
        (
            format!("search p={} m={} up to v={top_v}", self.p, self.m),
            u64::from(self.p) * u64::from(self.m) * u64::from(top_v),
            2,
        )
    }

    /// The checked request as the search's spec, at `costs` for `p` stages on `p` devices
    /// (each face reads its own cost source, once [`SearchRequest::check`] has passed).
    pub fn into_spec(self, costs: CostModel) -> Result<SearchSpec, SearchRequestError> {
        self.check()?;
        let mut spec = SearchSpec::new(self.p, self.m, costs, self.cap);
        spec.max_virtual = self.max_virtual;
        spec.families = self.families;
        spec.list_scheduler = self.list_scheduler;
        spec.split_backward = self.split_backward;
        spec.improve_budget = self.improve;
        spec.objective = self.objective;
        spec.time_budget = Some(Duration::from_secs_f64(self.time_budget));
        spec.runners_up = self.runners_up;
        spec.memory = self.memory;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What makes a good request bad.
    type Spoil<R> = fn(&mut R);
    use pipewright_sim::simulate::StageCost;

    fn costs() -> CostModel {
        CostModel::uniform(2, StageCost::new(1.0, 2.0, None).unwrap())
    }

    fn request() -> SearchRequest {
        SearchRequest::new(2, 4, MemoryCap::Microbatches(2.0))
    }

    #[test]
    fn each_bad_field_is_refused_naming_it_in_each_face_s_words() {
        let flag = |f: &str| pipewright_model::shape::request::flag_form(f, None);
        let cases: [(Spoil<SearchRequest>, &str); 6] = [
            (|r| r.time_budget = f64::NAN, "--time-budget NaN: must be a finite number above 0 and at most 3600 (seconds to spend evaluating candidates)"),
            (|r| r.time_budget = 0.0, "--time-budget 0: must be a finite number above 0"),
            (|r| r.max_virtual = 0, "--max-virtual 0: must be at least 1 (chunks per device)"),
            (|r| r.m = 0, "--m 0: must be at least 1 (microbatches per step)"),
            (|r| r.p = MAX_DEVICES + 1, "--p 65537: must be at most 65536 (pipeline devices)"),
            (|r| r.runners_up = 5, "--runners-up 5: give at most 4 (the search keeps that many beside the best)"),
        ];
        for (spoil, want) in cases {
            let mut r = request();
            spoil(&mut r);
            let e = r.into_spec(costs()).unwrap_err();
            assert!(e.named(flag).starts_with(want), "{}", e.named(flag));
            assert!(e.to_string().starts_with(e.field()), "{e}");
        }
        let spec = request().into_spec(costs()).unwrap();
        assert_eq!(spec.time_budget, Some(Duration::from_secs(30)));
        assert_eq!(spec.runners_up, 0);
    }
}
