//! The simulator's costs as a user gives them, the same for the CLI's cost flags and the
//! Python package's keywords: one device's share of the model per microbatch (split over its
//! chunks), or a cost file, then the link and held-for-W overrides.

use super::cost::{CostError, CostModel, Place, StageCost};

/// Where the per-stage costs come from.
#[derive(Clone, Debug, PartialEq)]
pub enum CostSource {
    /// One device's share per microbatch (`--cost F,B[,W]`, `--activation-bytes`,
    /// `--p2p-bytes`); each of a device's `v` chunks costs 1/v of it.
    Uniform(StageCost),
    /// A cost file's model (`--cost-file`), per stage.
    Model(CostModel),
}

/// Costs and their overrides, resolved for a timetable by [`CostOptions::model`].
#[derive(Clone, Debug, PartialEq)]
pub struct CostOptions {
    /// The per-stage costs.
    pub source: CostSource,
    /// Fixed time of each point-to-point transfer (overrides the file's).
    pub p2p_latency: Option<f64>,
    /// Link bandwidth in bytes per cost unit (overrides the file's; `None`: infinite).
    pub bandwidth: Option<f64>,
    /// Fraction of a stage's activations held from its I until its W, for every stage.
    pub w_memory: Option<f64>,
}

impl CostOptions {
    /// Uniform costs: forward `f`, full backward `b` and its weight part `w` (default b/2)
    /// of one device's share, with its stashed and handed-off bytes per microbatch.
    pub fn uniform(
        f: f64,
        b: f64,
        w: Option<f64>,
        activation_bytes: u64,
        p2p_bytes: u64,
    ) -> Result<Self, CostError> {
        let mut cost = StageCost::new(f, b, w)?;
        cost.activation_bytes = activation_bytes;
        cost.p2p_bytes = p2p_bytes;
        Ok(Self::from(CostSource::Uniform(cost)))
    }

    /// The cost model for a timetable of `stages` stages over `devices` devices.
    pub fn model(&self, stages: u32, devices: u32) -> Result<CostModel, CostError> {
        let mut model = match &self.source {
            CostSource::Model(m) => m.clone(),
            CostSource::Uniform(cost) => {
                let v = if devices == 0 {
                    1
                } else {
                    stages.div_ceil(devices)
                };
                CostModel::uniform(stages, cost.split(v))
            }
        };
        if let Some(fraction) = self.w_memory {
            if !(0.0..=1.0).contains(&fraction) {
                return Err(CostError::WMemory {
                    place: Place::Field("w_memory"),
                    value: fraction,
                });
            }
            for stage in &mut model.stages {
                stage.w_memory = fraction;
            }
        }
        let latency = self.p2p_latency.unwrap_or(model.p2p_latency);
        let bandwidth = self.bandwidth.or(model.bandwidth);
        model.with_link(latency, bandwidth)
    }
}

impl From<CostSource> for CostOptions {
    fn from(source: CostSource) -> Self {
        CostOptions {
            source,
            p2p_latency: None,
            bandwidth: None,
            w_memory: None,
        }
    }
}
