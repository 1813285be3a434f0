//! Run a timetable with one process per rank over MPI (feature `mpi`).
//!
//! Every process runs its own rank exactly as a thread of the in-process run does
//! (`run_rank`); rank 0 also gathers what the in-process driver sees: each step's outcome
//! from every rank (sent on a communicator of their own as they finish, so gathering never
//! fences the pipeline) and the final parameters. At start the ranks agree on a fingerprint
//! of the run, and a shared epoch makes their events one timeline.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::time::Instant;

use mpi::collective::CommunicatorCollectives;
use mpi::environment::Universe;
use mpi::topology::Communicator as _;
use pipewright_kernels::PrecisionExt;
use pipewright_schedule::{Checked, Event, Timetable};

use crate::batch::MicrobatchId;
use crate::comm::mpi::MpiComm;
use crate::comm::{CommError, Communicator};
use crate::error::RuntimeError;
use crate::executor::StepOutcome;
use crate::mesh::{Coord, Mesh, MeshError};
use crate::module::{ModuleError, StageModule};
use crate::options::RunOptions;
use crate::run::{prepare, run_rank, Assembler, FinalParams, RankContext, StepRecord};

const STEP_TAG: c_int = 1;
const PARAMS_TAG: c_int = 2;

/// Run `opts.steps` steps of `tt` over `mesh`, this process being one rank of the MPI world
/// (whose size must be the mesh's). Same arguments as [`run()`](crate::run()), plus
/// `describe`: what else every rank must agree on (model, seed), folded into the start-up
/// fingerprint. `on_step` runs on rank 0 only; rank 0 returns every stage's final parameters,
/// the other ranks `None`. On failure every rank returns an error: its own, or the one that
/// stopped it.
// The in-process `run`'s arguments plus the universe and the description.
#[allow(clippy::too_many_arguments)]
pub fn run_mpi<M, MF, DF, CB>(
    universe: Universe,
    mesh: Mesh,
    tt: &Checked,
    make: MF,
    data: DF,
    opts: &RunOptions,
    describe: &str,
    on_step: CB,
) -> Result<Option<FinalParams>, RuntimeError>
where
    M: StageModule<Tensor = pipewright_kernels::Tensor>,
    MF: Fn(Coord, u32) -> Result<M, ModuleError>,
    DF: Fn(MicrobatchId) -> Result<M::Data, ModuleError>,
    CB: FnMut(&StepRecord),
{
    let (comm, tt) = start(universe, mesh, tt, opts, describe)?;
    let ctx = RankContext {
        mesh,
        coord: mesh.coord(comm.rank())?,
        tt: &tt,
        opts,
        epoch: time_zero(&comm),
    };
    let comm = Rc::new(comm);
    let result = guarded(&comm, ctx.coord, || {
        let mut gather = Gather::new(&comm, &ctx, on_step);
        let params = run_rank(Rc::clone(&comm), &ctx, &make, &data, |step, outcome| {
            gather.outcome(step, outcome)
        })?;
        gather.finish(params)
    });
    end(comm, result)
}

/// The start-up every MPI-launched run shares, whatever carries its tensors: the world must
/// be the mesh's size, the timetable is lowered and checked, and the ranks must agree on a
/// fingerprint of the run. Returns this rank's MPI communicator (records, abort notices,
/// liveness) and the prepared timetable.
pub(crate) fn start(
    universe: Universe,
    mesh: Mesh,
    tt: &Checked,
    opts: &RunOptions,
    describe: &str,
) -> Result<(MpiComm, Checked), RuntimeError> {
    let world_size = universe.world().size() as usize;
    if world_size != mesh.world_size() {
        return Err(RuntimeError::Mesh(MeshError::WorldSize {
            pp: mesh.pp,
            tp: mesh.tp,
            dp: mesh.dp,
            product: mesh.world_size(),
            world: world_size,
        }));
    }
    let tt = prepare(tt, &mesh)?;
    let comm = MpiComm::new(
        universe,
        mesh,
        tt.num_stages(),
        tt.microbatches,
        opts.timeout,
    )
    .map_err(|e| RuntimeError::Transport(e.to_string()))?
    .with_wire(opts.precision.activation_dtype());
    check_fingerprint(&comm, fingerprint(&tt, &mesh, opts, describe))?;
    Ok((comm, tt))
}

/// Every rank's time zero: leaving one barrier together aligns the ranks' clocks to within
/// the barrier's skew (microseconds on one host), so their events make one timeline.
pub(crate) fn time_zero(comm: &MpiComm) -> Instant {
    comm.world().barrier();
    Instant::now()
}

/// Runs `body`, turning a panic into this rank's error rather than a process that dies
/// without telling the others.
pub(crate) fn guarded<T>(
    comm: &MpiComm,
    coord: Coord,
    body: impl FnOnce() -> Result<T, RuntimeError>,
) -> Result<T, RuntimeError> {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        let rank = comm.rank();
        Err(RuntimeError::device(
            rank,
            coord,
            0,
            None,
            "rank panicked".into(),
        ))
    })
}

/// The end of an MPI-launched rank: after a failure, tell every other rank (so they stop
/// with this error rather than wait out their timeouts) and skip `MPI_Finalize`.
pub(crate) fn end<T>(
    comm: Rc<MpiComm>,
    result: Result<T, RuntimeError>,
) -> Result<T, RuntimeError> {
    if let Err(e) = &result {
        comm.abort(&e.to_string());
        // No MPI_Finalize after a failure: it waits for every rank, a dead one included, and
        // hangs. The process ends without it (mpirun reports that, after our error line).
        std::mem::forget(comm);
    }
    result
}

/// Gathers step outcomes and final parameters on rank 0 over the MPI communicator's record
/// channel, whatever transport carried the tensors. Other ranks send theirs as each step
/// ends; rank 0 takes what has arrived without waiting, so gathering never fences the
/// pipeline, and `on_step` sees each step once every rank's part of it is in.
pub(crate) struct Gather<'a, CB> {
    comm: &'a MpiComm,
    mesh: Mesh,
    coord: Coord,
    steps: u64,
    assembler: Assembler,
    emitted: u64,
    on_step: CB,
}

impl<'a, CB: FnMut(&StepRecord)> Gather<'a, CB> {
    /// Gathering for this rank of `ctx`'s run.
    pub(crate) fn new(comm: &'a MpiComm, ctx: &RankContext<'_>, on_step: CB) -> Self {
        Gather {
            comm,
            mesh: ctx.mesh,
            coord: ctx.coord,
            steps: ctx.opts.steps,
            assembler: Assembler::new(ctx.tt, ctx.mesh),
            emitted: 0,
            on_step,
        }
    }

    /// How a record failure at `step` reads: this rank's error.
    fn fail(&self, step: u64) -> impl Fn(CommError) -> RuntimeError {
        let (rank, coord) = (self.comm.rank(), self.coord);
        move |e| RuntimeError::device(rank, coord, step, None, e.to_string())
    }

    /// This rank's outcome of `step`: sent to rank 0, or (on rank 0) added with whatever
    /// the other ranks have sent so far.
    pub(crate) fn outcome(&mut self, step: u64, outcome: StepOutcome) -> Result<(), RuntimeError> {
        if self.comm.rank() != 0 {
            return self
                .comm
                .send_record(STEP_TAG, encode_outcome(step, &outcome))
                .map_err(self.fail(step));
        }
        self.add(step, 0, outcome)?;
        while let Some((src, bytes)) = self.comm.try_record(STEP_TAG).map_err(self.fail(step))? {
            let (s, o) = decode_outcome(&bytes).map_err(self.fail(step))?;
            self.add(s, src, o)?;
        }
        Ok(())
    }

    fn add(&mut self, step: u64, from: usize, outcome: StepOutcome) -> Result<(), RuntimeError> {
        if let Some(record) = self.assembler.add(self.mesh.coord(from)?, step, outcome) {
            (self.on_step)(&record);
            self.emitted += 1;
        }
        Ok(())
    }

    /// After this rank's last step: other ranks send their final parameters and return
    /// `None`; rank 0 waits for every step record and every rank's parameters and returns
    /// all of them.
    pub(crate) fn finish(
        mut self,
        params: FinalParams,
    ) -> Result<Option<FinalParams>, RuntimeError> {
        let fail = self.fail(self.steps);
        if self.comm.rank() != 0 {
            self.comm
                .send_record(PARAMS_TAG, encode_params(&params))
                .map_err(&fail)?;
            self.comm.flush().map_err(fail)?;
            return Ok(None);
        }
        while self.emitted < self.steps {
            let (src, bytes) = self.comm.record(STEP_TAG).map_err(&fail)?;
            let (s, o) = decode_outcome(&bytes).map_err(&fail)?;
            self.add(s, src, o)?;
        }
        let mut all = params;
        for _ in 1..self.mesh.world_size() {
            let (_, bytes) = self.comm.record(PARAMS_TAG).map_err(&fail)?;
            all.extend(decode_params(&bytes).map_err(&fail)?);
        }
        self.comm.flush().map_err(fail)?;
        Ok(Some(all))
    }
}

/// FNV-1a of everything the ranks must agree on: the lowered timetable, the mesh, the run
/// options that shape the work, and the caller's description (model, seed).
fn fingerprint(tt: &Timetable, mesh: &Mesh, opts: &RunOptions, describe: &str) -> u64 {
    let text = format!(
        "{}|{mesh:?}|steps {}|{:?}|{}|zero {}|{describe}",
        serde_json::to_string(tt).unwrap_or_default(),
        opts.steps,
        opts.adamw,
        opts.precision,
        opts.zero.level()
    );
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn check_fingerprint(comm: &MpiComm, mine: u64) -> Result<(), RuntimeError> {
    let mut all = vec![0u64; comm.world_size()];
    comm.world().all_gather_into(&mine, &mut all[..]);
    match all.iter().position(|&f| f != all[0]) {
        Some(rank) => Err(RuntimeError::Disagree {
            rank,
            ours: all[0],
            theirs: all[rank],
        }),
        None => Ok(()),
    }
}

fn bad(what: &str) -> CommError {
    CommError::Invalid(format!("malformed {what} record from another rank"))
}

/// Step outcome on the wire: JSON of the events (their times need no bit-exactness) with the
/// loss as its bits (it must arrive exact).
fn encode_outcome(step: u64, o: &StepOutcome) -> Vec<u8> {
    let v = serde_json::json!({
        "step": step,
        "loss": o.loss.map(f32::to_bits),
        "peak": o.peak_stash,
        "peak_bytes": o.peak_stash_bytes,
        "kept": o.kept_per_microbatch,
        "optimizer_bytes": o.optimizer_state_bytes,
        "memory": o.memory,
        "events": o.events,
    });
    v.to_string().into_bytes()
}

fn decode_outcome(bytes: &[u8]) -> Result<(u64, StepOutcome), CommError> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| bad("step"))?;
    let step = v["step"].as_u64().ok_or_else(|| bad("step"))?;
    let loss = match &v["loss"] {
        serde_json::Value::Null => None,
        x => Some(f32::from_bits(
            x.as_u64()
                .and_then(|b| u32::try_from(b).ok())
                .ok_or_else(|| bad("step"))?,
        )),
    };
    let peak_stash = v["peak"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(|| bad("step"))?;
    let bytes = |key: &str| v[key].as_u64().ok_or_else(|| bad("step"));
    let optimizer_state_bytes = v["optimizer_bytes"].as_u64().ok_or_else(|| bad("step"))?;
    let events: Vec<Event> =
        serde_json::from_value(v["events"].clone()).map_err(|_| bad("step"))?;
    let memory = serde_json::from_value(v["memory"].clone()).map_err(|_| bad("step"))?;
    Ok((
        step,
        StepOutcome {
            loss,
            events,
            peak_stash,
            peak_stash_bytes: bytes("peak_bytes")?,
            kept_per_microbatch: bytes("kept")?,
            optimizer_state_bytes,
            memory,
        },
    ))
}

/// Parameters on the wire, exact: per entry stage, TP rank, length, then the f32s.
fn encode_params(p: &FinalParams) -> Vec<u8> {
    let mut out = Vec::new();
    for (&(stage, tp), values) in p {
        out.extend((stage as u64).to_le_bytes());
        out.extend((tp as u64).to_le_bytes());
        out.extend((values.len() as u64).to_le_bytes());
        values.iter().for_each(|v| out.extend(v.to_le_bytes()));
    }
    out
}

fn decode_params(mut bytes: &[u8]) -> Result<FinalParams, CommError> {
    let mut out = FinalParams::new();
    let word = |b: &mut &[u8]| -> Result<u64, CommError> {
        let (head, rest) = b.split_first_chunk::<8>().ok_or_else(|| bad("parameter"))?;
        *b = rest;
        Ok(u64::from_le_bytes(*head))
    };
    while !bytes.is_empty() {
        let stage = u32::try_from(word(&mut bytes)?).map_err(|_| bad("parameter"))?;
        let tp = word(&mut bytes)? as usize;
        let n = word(&mut bytes)? as usize;
        let len = n
            .checked_mul(4)
            .filter(|&l| l <= bytes.len())
            .ok_or_else(|| bad("parameter"))?;
        let (data, rest) = bytes.split_at(len);
        let values = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.insert((stage, tp), values);
        bytes = rest;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::{Action, ActionKind};

    #[test]
    fn records_round_trip_exactly() {
        let mut p = FinalParams::new();
        p.insert((1, 0), vec![0.1, -3.5e-8, f32::MAX]);
        p.insert((0, 1), vec![]);
        assert_eq!(decode_params(&encode_params(&p)).unwrap(), p);
        assert!(decode_params(&encode_params(&p)[..20]).is_err());
        let o = StepOutcome {
            loss: Some(0.123_456_79),
            events: vec![Event {
                device: 1,
                action: Action::new(2, ActionKind::F, 3),
                start: 1.5,
                end: 2.25,
            }],
            peak_stash: 4,
            peak_stash_bytes: 1 << 40,
            kept_per_microbatch: 96,
            optimizer_state_bytes: 1 << 40,
            memory: crate::memory::RankMemory {
                peak: pipewright_model::memory::MemoryBreakdown {
                    parameters: 1 << 41,
                    buffers: 3,
                    ..Default::default()
                },
                max: Default::default(),
                device: Some(crate::memory::DeviceMemory { free: 5, total: 9 }),
            },
        };
        let (step, back) = decode_outcome(&encode_outcome(7, &o)).unwrap();
        assert_eq!(step, 7);
        assert_eq!(back.loss.map(f32::to_bits), o.loss.map(f32::to_bits));
        assert_eq!(back.events, o.events);
        assert_eq!(back.peak_stash, 4);
        assert_eq!(
            (back.peak_stash_bytes, back.kept_per_microbatch),
            (1 << 40, 96)
        );
        assert_eq!(back.optimizer_state_bytes, 1 << 40);
        assert_eq!(back.memory, o.memory);
    }
}
