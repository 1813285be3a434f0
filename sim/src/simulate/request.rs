//! One simulation as either face asks for it: the CLI's `simulate --steps K` and Python's
//! `simulate(timetable, costs, steps=K)` build the same request, so what they accept cannot
//! drift apart (it once did: the CLI capped the steps, Python did not).

use pipewright_schedule::Checked;

use super::cost::CostModel;
use super::steady::{simulate_steps, SteadyError, SteadyState};
use super::{simulate, Simulation};

/// Most steps one simulation may ask for (a K-step timeline holds K times the events).
pub const MAX_STEPS: u32 = 1000;

/// A request a face cannot run, naming the field; each face renders the field in its own words
/// ([`SimulateRequestError::named`]: `--steps` or `steps=`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimulateRequestError {
    /// A step count out of range.
    #[error("steps must be between 1 and {MAX_STEPS} (got {got})")]
    Steps {
        /// What was asked for.
        got: u32,
    },
}

impl SimulateRequestError {
    /// The message with the field called `name` (`--steps` on the command line).
    pub fn named(&self, name: &str) -> String {
        match self {
            SimulateRequestError::Steps { got } => {
                format!("{name} must be between 1 and {MAX_STEPS} (got {got})")
            }
        }
    }
}

/// What to simulate: a timetable under costs, one step or `steps` unfenced steps.
#[derive(Clone, Copy, Debug)]
pub struct SimulateRequest<'a> {
    /// The timetable (compute-only or lowered), validated.
    pub timetable: &'a Checked,
    /// Its costs.
    pub costs: &'a CostModel,
    /// 1: one step; K > 1: K steps back to back, unfenced, and their steady state.
    pub steps: u32,
}

/// A simulation's answer: one step, or K steps with their steady state.
#[derive(Clone, Debug)]
pub enum Simulated {
    /// One step.
    One(Simulation),
    /// K unfenced steps.
    Steady(Box<SteadyState>),
}

impl<'a> SimulateRequest<'a> {
    /// The request, refused when its step count is out of range.
    pub fn new(
        timetable: &'a Checked,
        costs: &'a CostModel,
        steps: u32,
    ) -> Result<Self, SimulateRequestError> {
        check_steps(steps)?;
        Ok(SimulateRequest {
            timetable,
            costs,
            steps,
        })
    }

    /// Simulate it.
    pub fn run(&self) -> Result<Simulated, SteadyError> {
        if self.steps == 1 {
            return Ok(Simulated::One(simulate(self.timetable, self.costs)?));
        }
        let s = simulate_steps(self.timetable, self.costs, self.steps)?;
        Ok(Simulated::Steady(Box::new(s)))
    }
}

/// Check a step count: at least 1 (the plain single step), at most [`MAX_STEPS`].
pub fn check_steps(steps: u32) -> Result<(), SimulateRequestError> {
    if steps == 0 || steps > MAX_STEPS {
        return Err(SimulateRequestError::Steps { got: steps });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::StageCost;
    use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};

    #[test]
    fn steps_out_of_range_are_refused_naming_the_field_in_each_face_s_words() {
        let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap();
        let tt = Checked::new(generate(&spec)).unwrap();
        let costs = CostModel::uniform(2, StageCost::new(1.0, 2.0, None).unwrap());
        for bad in [0, MAX_STEPS + 1] {
            let e = SimulateRequest::new(&tt, &costs, bad).unwrap_err();
            assert_eq!(
                e.named("--steps"),
                format!("--steps must be between 1 and 1000 (got {bad})")
            );
            assert!(e.to_string().starts_with("steps must be"), "{e}");
        }
        let one = SimulateRequest::new(&tt, &costs, 1).unwrap().run().unwrap();
        assert!(matches!(one, Simulated::One(_)));
        let many = SimulateRequest::new(&tt, &costs, MAX_STEPS).unwrap();
        assert_eq!(many.steps, 1000);
    }
}
