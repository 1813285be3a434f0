//! A GPT with mixtures of experts trains under pipeline schedules, with TP and DP, equal to
//! one device: same losses and final parameters within 1e-5, with every rank holding all of a
//! stage's experts (EP 1) or expert parallelism folded over the data-parallel replicas.

use crate::whole;
use pipewright_schedule::Checked;

use pipewright_kernels::gpt::{GptConfig, MoeSpec};
use pipewright_runtime::{train_gpt, Mesh, RunOptions, TrainConfig};
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec};
use whole::{check_params, close, single_device};

const STEPS: u64 = 3;

/// 4 blocks, the first dense, then mixtures of 4 experts (top-2) with a shared expert and
/// a load-balancing loss.
fn config(mesh: Mesh) -> TrainConfig {
    let moe = MoeSpec {
        shared_d_ff: 8,
        dense_first: 1,
        aux_coef: 0.05,
        ..MoeSpec::new(4, 2, 16)
    };
    TrainConfig {
        mesh,
        model: GptConfig {
            moe: Some(moe),
            ..GptConfig::new(16, 8, 16, 2, 4)
        },
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 11,
        run: RunOptions {
            steps: STEPS,
            ..RunOptions::default()
        },
    }
}

fn check(kind: ScheduleKind, v: u32, m: u32, mesh: (usize, usize, usize)) {
    check_recompute(kind, v, m, mesh, "none")
}

fn check_recompute(
    kind: ScheduleKind,
    v: u32,
    m: u32,
    mesh: (usize, usize, usize),
    recompute: &str,
) {
    check_ep(kind, v, m, mesh, 1, recompute)
}

fn check_ep(
    kind: ScheduleKind,
    v: u32,
    m: u32,
    (pp, tp, dp): (usize, usize, usize),
    ep: usize,
    recompute: &str,
) {
    let spec = ScheduleSpec::new(kind, pp as u32, v, m, None).unwrap();
    let what = format!("moe {spec} tp={tp} dp={dp} ep={ep} recompute {recompute}");
    let mut cfg = config(Mesh::new(pp, tp, dp).unwrap().with_ep(ep).unwrap());
    cfg.run.recompute = recompute.parse().unwrap();
    let tt = generate(&spec);
    let mut losses = Vec::new();
    let params = train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
        losses.push(s.loss.unwrap())
    })
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (want, whole) = single_device(&cfg, m, STEPS);
    assert_eq!(losses.len(), want.len());
    for (step, (a, b)) in losses.iter().zip(&want).enumerate() {
        assert!(close(*a, *b), "{what}: step {step} loss {a} vs {b}");
    }
    assert!(
        want[STEPS as usize - 1] < want[0],
        "the run trains: {want:?}"
    );
    check_params(&cfg, tt.num_stages() as usize, &params, &whole, &what);
}

const MESHES: [(usize, usize, usize); 4] = [(2, 1, 1), (2, 2, 1), (2, 1, 2), (2, 2, 2)];

#[test]
fn moe_gpt_on_1f1b_interleaved_and_dualpipev_equals_one_device() {
    for mesh in MESHES {
        check(ScheduleKind::OneFOneB, 1, 4, mesh);
        check(ScheduleKind::Interleaved1F1B, 2, 4, mesh);
        check(ScheduleKind::DualPipeV, 2, 4, mesh);
    }
}

/// Expert parallelism folded over data parallelism: pp 2 x ep 2 (dp 2, every replica half
/// the experts) and pp 2 x ep 2 x dp 2 (dp 4: two EP groups, each expert on two replicas).
#[test]
fn moe_gpt_with_expert_parallelism_equals_one_device() {
    for dp in [2, 4] {
        check_ep(ScheduleKind::OneFOneB, 1, 4, (2, 1, dp), 2, "none");
        check_ep(ScheduleKind::Interleaved1F1B, 2, 4, (2, 1, dp), 2, "none");
        check_ep(ScheduleKind::DualPipeV, 2, 4, (2, 1, dp), 2, "none");
    }
}

#[test]
fn moe_gpt_with_expert_parallelism_and_recomputation_equals_one_device() {
    // A recomputed forward runs the mixtures' all-to-all again, on every EP rank alike.
    for policy in ["selective", "full"] {
        check_ep(ScheduleKind::OneFOneB, 1, 4, (2, 1, 2), 2, policy);
    }
}

/// What expert parallelism does not run with is refused in one line naming `ep`.
#[test]
fn expert_parallelism_refuses_what_it_cannot_run() {
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap();
    let tt = generate(&spec);
    let mesh = Mesh::new(2, 1, 2).unwrap().with_ep(2).unwrap();
    let mut zero = config(mesh);
    zero.run.zero = pipewright_runtime::Zero::One;
    let err = train_gpt(&zero, &Checked::new(tt.clone()).unwrap(), |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("ep = 2 does not run with ZeRO-1"), "{err}");
    let mut dense = config(mesh);
    dense.model.moe = None;
    let err = train_gpt(&dense, &Checked::new(tt.clone()).unwrap(), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ep = 2 shards the experts of mixtures, but the model has none"),
        "{err}"
    );
    let four = Mesh::new(2, 1, 4).unwrap().with_ep(4).unwrap();
    let mut six = config(four);
    if let Some(m) = six.model.moe.as_mut() {
        m.experts = 6;
    }
    let err = train_gpt(&six, &Checked::new(tt.clone()).unwrap(), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ep = 4 must divide the model's 6 experts"),
        "{err}"
    );
}

#[test]
fn moe_gpt_with_recomputation_equals_one_device() {
    for policy in ["full", "selective", "every:2"] {
        check_recompute(ScheduleKind::OneFOneB, 1, 4, (2, 1, 1), policy);
    }
}

/// Each rank's measured parameters, gradients and AdamW state are 4, 4 and 8 bytes per
/// parameter of its stage, experts included (every expert on every rank at EP 1); the
/// figures for two tiny mixtures print with `--nocapture` for the memory model.
#[test]
fn measured_memory_counts_every_expert_of_the_stage() {
    use pipewright_kernels::gpt::GptStage;
    use pipewright_kernels::layers::{Parameters, TpShard};
    let gated = {
        let mut c = config(Mesh::new(2, 1, 1).unwrap());
        c.model.mlp = pipewright_kernels::gpt::MlpKind::SwiGlu;
        c.model.moe = Some(MoeSpec::new(8, 2, 8));
        c
    };
    for (name, cfg) in [
        ("gelu-4x16-shared8", config(Mesh::new(2, 1, 1).unwrap())),
        ("swiglu-8x8", gated),
    ] {
        let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap();
        let mut steps = Vec::new();
        train_gpt(&cfg, &Checked::new(generate(&spec)).unwrap(), |s| {
            steps.push(s.clone())
        })
        .unwrap();
        let last = steps.last().unwrap();
        let mut total = 0;
        for s in 0..2 {
            let n = GptStage::new(&cfg.model, cfg.seed, s, 2, TpShard::SINGLE)
                .unwrap()
                .num_params() as u64;
            total += n;
            let m = &last.memory[s];
            assert_eq!(m.peak.parameters, 4 * n, "{name} stage {s}");
            assert_eq!(m.peak.gradients, 4 * n, "{name} stage {s}");
            assert_eq!(m.max.optimizer_state, 8 * n, "{name} stage {s}");
            println!(
                "{name} stage {s}: params {} grads {} adamw {} activations {} buffers {} peak total {}",
                m.peak.parameters, m.peak.gradients, m.max.optimizer_state, m.max.activations,
                m.max.buffers, m.peak.total()
            );
        }
        assert_eq!(total, cfg.model.num_params() as u64, "{name}");
    }
}

/// Under ep 2 each replica holds half of every mixture's experts: its measured parameters
/// are its stage's with half the experts, not the whole stage's.
#[test]
fn each_expert_parallel_replica_holds_its_share_of_the_experts() {
    use pipewright_kernels::gpt::GptStage;
    use pipewright_kernels::layers::{Parameters, TpShard};
    let mesh = Mesh::new(2, 1, 2).unwrap().with_ep(2).unwrap();
    let mut cfg = config(mesh);
    cfg.run.steps = 1;
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap();
    let mut steps = Vec::new();
    train_gpt(&cfg, &Checked::new(generate(&spec)).unwrap(), |s| {
        steps.push(s.clone())
    })
    .unwrap();
    let last = steps.last().unwrap();
    for rank in 0..mesh.world_size() {
        let c = mesh.coord(rank).unwrap();
        let mut st = GptStage::new(&cfg.model, cfg.seed, c.pp, 2, TpShard::SINGLE).unwrap();
        let whole = st.num_params();
        st.shard_experts(TpShard::new(c.dp, 2).unwrap()).unwrap();
        let share = st.num_params();
        assert!(share < whole, "rank {rank}: {share} of {whole}");
        assert_eq!(
            last.memory[rank].peak.parameters,
            4 * share as u64,
            "rank {rank}"
        );
    }
}

/// Under expert parallelism the EP ranks' experts differ by design; everything else is
/// replicated, so a `make` that seeds the replicas apart is refused before step 0 (before,
/// with ep = dp, no replica was compared with another and each trained its own dense part).
#[test]
fn expert_parallel_replicas_must_start_from_the_same_dense_weights() {
    use pipewright_kernels::layers::TpShard;
    use pipewright_runtime::{gpt_data, run, Coord, GptModule, ModuleError};
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, None).unwrap());
    let cfg = config(Mesh::new(2, 1, 2).unwrap().with_ep(2).unwrap());
    let make = |seed: fn(Coord) -> u64| {
        let cfg = &cfg;
        move |c: Coord, stage: u32| -> Result<GptModule, ModuleError> {
            let one = TpShard::new(0, 1)?;
            let mut m = GptModule::new(&cfg.model, seed(c), stage as usize, 2, one)?;
            m.stage.shard_experts(TpShard::new(c.dp % 2, 2)?)?;
            Ok(m)
        }
    };
    let data = |id| Ok(gpt_data(&cfg, id));
    let same = run(
        cfg.mesh,
        &Checked::new(tt.clone()).unwrap(),
        make(|_| 11),
        data,
        &cfg.run,
        |_| {},
    );
    assert!(same.is_ok(), "{:?}", same.err());
    let apart = run(
        cfg.mesh,
        &Checked::new(tt.clone()).unwrap(),
        make(|c| 11 + c.dp as u64),
        data,
        &cfg.run,
        |_| {},
    );
    let err = apart.expect_err("replicas seeded apart").to_string();
    assert!(err.contains("data-parallel replicas 0 and 1"), "{err}");
}
