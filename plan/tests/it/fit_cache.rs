//! The plan's cached memory walks (one per timetable, replayed per configuration) give every
//! configuration the peaks the memory model's own walk gives.

use pipewright_model::shape::{ModelShape, MoeShape};
use pipewright_plan::fit::{peaks, BoundCache};
use pipewright_plan::space::enumerate;
use pipewright_plan::{Cluster, Config, PlanRequest};

/// 8 layers of d 1024, seq 2048; with `moe`, 16 experts of width 1024, 4 a token, after one
/// dense layer.
fn shape(moe: bool) -> ModelShape {
    ModelShape {
        moe: moe.then_some(MoeShape {
            route_groups: None,
            experts: 16,
            top_k: 4,
            expert_ffn: 1024,
            shared_experts: 1,
            shared_ffn: 1024,
            shared_gate: false,
            router_bias: false,
            dense_layers: 1,
            every: 1,
        }),
        ..ModelShape::gpt(8, 1024, 16, 4096, 2048, 32000)
    }
}

#[test]
fn cached_walks_give_every_configuration_the_walk_s_peaks() {
    for moe in [false, true] {
        let req = PlanRequest::new(shape(moe), Cluster::preset("h100-80g").unwrap(), 8, 32);
        // With recomputation on the first devices only, as the plan tries for its best.
        let configs: Vec<Config> = enumerate(&req)
            .into_iter()
            .flat_map(|c| {
                (1..=c.pp).map(move |d| Config {
                    recompute_devices: d,
                    ..c
                })
            })
            .collect();
        assert!(configs.len() > 500, "{} configurations", configs.len());
        let mut cache = BoundCache::default();
        let mut walked = 0;
        for cfg in &configs {
            let want = peaks(&req, cfg).ok();
            assert_eq!(cache.peaks(&req, cfg).ok(), want, "{cfg}");
            walked += usize::from(want.is_some());
        }
        assert!(
            walked * 10 > configs.len() * 9,
            "{walked} of {}",
            configs.len()
        );
    }
}
