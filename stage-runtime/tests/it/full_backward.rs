//! Modules with only a full backward (most autograd frameworks): every timetable without I/W
//! actions trains them to the same bits as the split module; one with I or W is refused
//! before the first step, in one line naming the schedule, the action and the stage.

use pipewright_kernels::gpt::{GptConfig, StageOutput};
use pipewright_kernels::layers::{TpReduce, TpShard};
use pipewright_kernels::optim::AdamWConfig;
use pipewright_kernels::Tensor;
use pipewright_runtime::{
    gpt_data, run, train_gpt, Coord, GptModule, Mesh, MicrobatchData, ModuleError, RunOptions,
    RuntimeError, StageModule, TokenBatch, TrainConfig,
};
use pipewright_schedule::Checked;
use pipewright_schedule::{generate, ScheduleKind, ScheduleSpec, Timetable};

/// The reference GPT stage seen through a framework that backpropagates in one piece: it
/// implements `backward` only and declares that it cannot split it.
struct FullOnly(GptModule);

impl StageModule for FullOnly {
    type Tensor = Tensor;
    type Data = TokenBatch;
    type Stash = <GptModule as StageModule>::Stash;
    type WeightStash = ();

    fn forward(
        &mut self,
        mb: &MicrobatchData<'_, TokenBatch>,
        input: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<(StageOutput, Self::Stash), ModuleError> {
        self.0.forward(mb, input, tp)
    }

    fn splits_backward(&self) -> bool {
        false
    }

    fn backward(
        &mut self,
        stash: Self::Stash,
        grad_out: Option<Tensor>,
        tp: &mut dyn TpReduce,
    ) -> Result<Option<Tensor>, ModuleError> {
        self.0.backward(stash, grad_out, tp)
    }

    fn flat_grads(&mut self) -> Result<Option<Tensor>, ModuleError> {
        self.0.flat_grads()
    }

    fn set_flat_grads(&mut self, grads: Tensor) -> Result<(), ModuleError> {
        self.0.set_flat_grads(grads)
    }

    fn optimizer_step(&mut self, cfg: &AdamWConfig) -> Result<(), ModuleError> {
        self.0.optimizer_step(cfg)
    }

    fn flat_params(&mut self) -> Result<Option<Vec<f32>>, ModuleError> {
        self.0.flat_params()
    }
}

fn config(mesh: Mesh) -> TrainConfig {
    TrainConfig {
        mesh,
        model: GptConfig::new(16, 8, 16, 2, 4),
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 3,
        run: RunOptions {
            steps: 2,
            ..RunOptions::default()
        },
    }
}

fn timetable(kind: ScheduleKind, v: u32) -> Timetable {
    generate(&ScheduleSpec::new(kind, 2, v, 4, None).unwrap())
}

/// Train `tt` with full-backward-only stages; losses as bits and the steps finished.
fn train_full_only(
    cfg: &TrainConfig,
    tt: &Timetable,
) -> (Result<Vec<Option<u32>>, RuntimeError>, usize) {
    let stages = tt.num_stages() as usize;
    let make = |c: Coord, stage: u32| -> Result<FullOnly, ModuleError> {
        let shard = TpShard::new(c.tp, cfg.mesh.tp)?;
        let m = GptModule::new(&cfg.model, cfg.seed, stage as usize, stages, shard)?;
        Ok(FullOnly(m))
    };
    let mut losses = Vec::new();
    let r = run(
        cfg.mesh,
        &Checked::new(tt.clone()).unwrap(),
        make,
        |id| Ok(gpt_data(cfg, id)),
        &cfg.run,
        |s| losses.push(s.loss.map(f32::to_bits)),
    );
    let finished = losses.len();
    (r.map(|_| losses), finished)
}

#[test]
fn schedules_without_a_split_backward_train_full_backward_modules_to_the_same_bits() {
    let cfg = config(Mesh::new(2, 2, 2).unwrap());
    for (kind, v) in [
        (ScheduleKind::GPipe, 1),
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved1F1B, 2),
        (ScheduleKind::LoopedBfs, 2),
    ] {
        let tt = timetable(kind, v);
        let mut want = Vec::new();
        train_gpt(&cfg, &Checked::new(tt.clone()).unwrap(), |s| {
            want.push(s.loss.map(f32::to_bits))
        })
        .unwrap();
        let (got, _) = train_full_only(&cfg, &tt);
        assert_eq!(got.unwrap(), want, "{}", tt.name);
    }
}

#[test]
fn a_split_schedule_is_refused_before_the_first_step_naming_schedule_action_and_stage() {
    let cfg = config(Mesh::new(2, 1, 1).unwrap());
    for (kind, v) in [
        (ScheduleKind::ZbH1, 1),
        (ScheduleKind::ZbH2, 1),
        (ScheduleKind::Zbv, 2),
        (ScheduleKind::DualPipeV, 2),
    ] {
        let tt = timetable(kind, v);
        let (got, finished) = train_full_only(&cfg, &tt);
        let e = got.unwrap_err();
        let RuntimeError::NoSplitBackward { stage, action, .. } = &e else {
            panic!("{}: {e}", tt.name)
        };
        assert_eq!(finished, 0, "{}: no step ran", tt.name);
        assert_eq!(action.stage, *stage);
        let want = format!(
            "schedule {} splits the backward into input and weight parts (action {action}), \
             but stage {stage}'s module has only a full backward: use a schedule without I/W \
             actions (gpipe, 1f1b, interleaved-1f1b, looped-bfs)",
            tt.name
        );
        assert_eq!(e.to_string(), want);
        assert!(!e.to_string().contains('\n'));
    }
}
