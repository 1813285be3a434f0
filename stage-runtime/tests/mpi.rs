//! The MPI transport against the in-process one (feature `mpi`; needs OpenMPI's `mpirun`).
//!
//! Each test launches this same test binary under `mpirun`, one process per rank, with
//! `PIPEWRIGHT_MPI_CHILD` set; in that mode the test body is the rank's program. The parent
//! checks what the ranks printed and how mpirun ended.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use pipewright_kernels::gpt::{GptConfig, MoeSpec};
use pipewright_kernels::{Precision, PrecisionExt, Tensor};
use pipewright_runtime::comm::mpi::{self, MpiComm};
use pipewright_runtime::split::uniform;
use pipewright_runtime::{
    run, run_mpi, shard_range, train_gpt, train_gpt_mpi, Communicator, Coord, FinalParams,
    GroupKind, LocalWorld, Mesh, ReduceOp, RunOptions, TrainConfig, Zero,
};
use pipewright_schedule::{generate, Checked, ScheduleKind, ScheduleSpec};

#[allow(dead_code)]
#[path = "common/user_mlp.rs"]
mod user_mlp;
#[allow(dead_code)]
#[path = "common/whole.rs"]
mod whole;

const CHILD: &str = "PIPEWRIGHT_MPI_CHILD";

fn config(mesh: Mesh, steps: u64, timeout: Duration) -> TrainConfig {
    TrainConfig {
        mesh,
        model: GptConfig::new(16, 8, 16, 2, 8),
        microbatch_size: 2,
        sequence_parallel: false,
        seed: 11,
        run: RunOptions {
            steps,
            timeout,
            ..RunOptions::default()
        },
    }
}

fn timetable(kind: ScheduleKind, v: u32) -> Checked {
    let tt = generate(&ScheduleSpec::new(kind, 2, v, 4, None).expect("a valid spec"));
    Checked::new(tt).expect("a generated timetable is valid")
}

/// `mpirun -np n` of this test binary running only `test`, as a rank.
fn mpirun(n: usize, test: &str, extra: &[&str]) -> Command {
    let exe = std::env::current_exe().expect("the test binary");
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &n.to_string(),
    ])
    .args(extra)
    .args(["-x", CHILD])
    .arg(exe)
    .args([test, "--exact", "--nocapture", "--test-threads=1"])
    .env(CHILD, "1");
    c
}

fn run_to_end(mut c: Command) -> Output {
    c.output()
        .expect("mpirun runs (install openmpi-bin, or run .ci/mpi-tests)")
}

/// The rest of the first line holding `tag`. mpirun forwards each rank's output in chunks,
/// not lines, so another rank's test-harness text may precede the tag on its line.
fn marked<'a>(stdout: &'a str, tag: &str) -> Option<&'a str> {
    stdout.lines().find_map(|l| l.find(tag).map(|i| &l[i..]))
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs())
}

fn compare_params(mpi: &FinalParams, local: &FinalParams) -> Result<f32, String> {
    if mpi.keys().collect::<Vec<_>>() != local.keys().collect::<Vec<_>>() {
        return Err("different parameter sets".into());
    }
    let mut worst = 0.0f32;
    for (k, a) in mpi {
        let b = &local[k];
        if a.len() != b.len() {
            return Err(format!("{k:?}: {} vs {} values", a.len(), b.len()));
        }
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            if !close(x, y) {
                return Err(format!("{k:?}[{i}]: {x} vs {y}"));
            }
            worst = worst.max((x - y).abs());
        }
    }
    Ok(worst)
}

/// Rank program: train over MPI; rank 0 then trains in-process and compares.
fn equality_child(kind: ScheduleKind, v: u32, precision: Precision) {
    let universe = mpi::init().expect("MPI starts");
    let mut cfg = config(Mesh::new(2, 2, 2).unwrap(), 3, Duration::from_secs(60));
    cfg.run.precision = precision;
    let tt = timetable(kind, v);
    let mut losses = Vec::new();
    let got = train_gpt_mpi(universe, &cfg, &tt, |s| losses.push(s.loss.unwrap()))
        .unwrap_or_else(|e| panic!("MPI run: {e}"));
    let Some(params) = got else { return };
    let mut want = Vec::new();
    let local = train_gpt(&cfg, &tt, |s| want.push(s.loss.unwrap())).expect("local run");
    assert_eq!(losses.len(), want.len());
    for (step, (a, b)) in losses.iter().zip(&want).enumerate() {
        assert!(close(*a, *b), "step {step}: MPI loss {a} vs local {b}");
    }
    let worst = compare_params(&params, &local).unwrap_or_else(|e| panic!("parameters: {e}"));
    println!(
        "MPI-EQUAL {} losses {losses:?}, {} parameter sets, largest difference {worst:e}",
        tt.name,
        params.len()
    );
}

fn check_equal(test: &str) {
    let out = run_to_end(mpirun(8, test, &[]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mpirun failed:\n{stdout}\n{stderr}");
    let line = marked(&stdout, "MPI-EQUAL");
    assert!(
        line.is_some(),
        "rank 0 did not compare:\n{stdout}\n{stderr}"
    );
    eprintln!("{}", line.unwrap_or_default());
}

#[test]
fn mpi_1f1b_pp2_tp2_dp2_equals_in_process() {
    if std::env::var_os(CHILD).is_some() {
        return equality_child(ScheduleKind::OneFOneB, 1, Precision::F32);
    }
    check_equal("mpi_1f1b_pp2_tp2_dp2_equals_in_process");
}

/// bf16: pipeline payloads cross MPI as bf16 bytes (half of f32's), and the run still equals
/// the in-process one, which hands over the same bf16-rounded values as f32s.
#[test]
fn mpi_bf16_pp2_tp2_dp2_equals_in_process() {
    if std::env::var_os(CHILD).is_some() {
        return equality_child(ScheduleKind::OneFOneB, 1, Precision::Bf16);
    }
    check_equal("mpi_bf16_pp2_tp2_dp2_equals_in_process");
}

#[test]
fn mpi_interleaved_pp2_tp2_dp2_equals_in_process() {
    if std::env::var_os(CHILD).is_some() {
        return equality_child(ScheduleKind::Interleaved1F1B, 2, Precision::F32);
    }
    check_equal("mpi_interleaved_pp2_tp2_dp2_equals_in_process");
}

/// Rank program: a mixture of experts with expert parallelism folded over data parallelism
/// (pp 2 x ep 2 x dp 2: mesh pp 2, dp 4, ep 2) over MPI, whose mixtures all-to-all over MPI;
/// rank 0 then compares with one device training the whole global batch (within 1e-5).
fn ep_child() {
    let universe = mpi::init().expect("MPI starts");
    let mesh = Mesh::new(2, 1, 4).unwrap().with_ep(2).unwrap();
    let mut cfg = config(mesh, 3, Duration::from_secs(60));
    cfg.model.moe = Some(MoeSpec {
        shared_d_ff: 8,
        dense_first: 1,
        aux_coef: 0.05,
        ..MoeSpec::new(4, 2, 16)
    });
    let tt = timetable(ScheduleKind::OneFOneB, 1);
    let mut losses = Vec::new();
    let got = train_gpt_mpi(universe, &cfg, &tt, |s| losses.push(s.loss.unwrap()))
        .unwrap_or_else(|e| panic!("MPI run: {e}"));
    let Some(params) = got else { return };
    let (want, whole) = whole::single_device(&cfg, tt.microbatches, 3);
    assert_eq!(losses.len(), want.len());
    for (step, (a, b)) in losses.iter().zip(&want).enumerate() {
        assert!(
            whole::close(*a, *b),
            "step {step}: MPI loss {a} vs one device {b}"
        );
    }
    whole::check_params(&cfg, tt.num_stages() as usize, &params, &whole, "MPI ep 2");
    println!(
        "MPI-EQUAL {} ep 2 equals one device: losses {losses:?}, {} parameter sets",
        tt.name,
        params.len()
    );
}

#[test]
fn mpi_expert_parallel_pp2_ep2_dp2_equals_one_device() {
    if std::env::var_os(CHILD).is_some() {
        return ep_child();
    }
    check_equal("mpi_expert_parallel_pp2_ep2_dp2_equals_one_device");
}

/// Rank program: ZeRO-1 over MPI (an all-to-all reduce-scatter, sharded AdamW, an
/// all-gather of shards); rank 0 then trains without ZeRO in-process and compares losses
/// and parameters to the bit.
fn zero_child(kind: ScheduleKind, v: u32) {
    let universe = mpi::init().expect("MPI starts");
    let mut cfg = config(Mesh::new(2, 2, 2).unwrap(), 3, Duration::from_secs(60));
    cfg.run.zero = Zero::One;
    let tt = timetable(kind, v);
    let mut losses = Vec::new();
    let got = train_gpt_mpi(universe, &cfg, &tt, |s| {
        losses.push(s.loss.map(f32::to_bits))
    })
    .unwrap_or_else(|e| panic!("MPI run: {e}"));
    let Some(params) = got else { return };
    cfg.run.zero = Zero::Off;
    let mut want = Vec::new();
    let local = train_gpt(&cfg, &tt, |s| want.push(s.loss.map(f32::to_bits))).expect("local run");
    assert_eq!(
        losses, want,
        "ZeRO-1 over MPI: losses differ from ZeRO-0 in-process"
    );
    assert_eq!(
        params, local,
        "ZeRO-1 over MPI: parameters differ from ZeRO-0 in-process"
    );
    println!(
        "MPI-EQUAL {} ZeRO-1 to the bit, {} parameter sets",
        tt.name,
        params.len()
    );
}

#[test]
fn mpi_zero1_1f1b_pp2_tp2_dp2_equals_zero0_in_process_to_the_bit() {
    if std::env::var_os(CHILD).is_some() {
        return zero_child(ScheduleKind::OneFOneB, 1);
    }
    check_equal("mpi_zero1_1f1b_pp2_tp2_dp2_equals_zero0_in_process_to_the_bit");
}

#[test]
fn mpi_zero1_interleaved_pp2_tp2_dp2_equals_zero0_in_process_to_the_bit() {
    if std::env::var_os(CHILD).is_some() {
        return zero_child(ScheduleKind::Interleaved1F1B, 2);
    }
    check_equal("mpi_zero1_interleaved_pp2_tp2_dp2_equals_zero0_in_process_to_the_bit");
}

/// Rank program: a user's own model (a layer list with its own data type) over MPI; rank 0
/// then trains it in-process and compares losses and parameters to the bit.
fn user_model_child() {
    let universe = mpi::init().expect("MPI starts");
    let (mesh, n) = (Mesh::new(2, 1, 2).unwrap(), 6);
    let tt = timetable(ScheduleKind::Interleaved1F1B, 2);
    let cuts = uniform(n, tt.num_stages() as usize).unwrap();
    let opts = RunOptions {
        steps: 3,
        ..RunOptions::default()
    };
    let make = |_: Coord, s: u32| Ok(user_mlp::stage(cuts[s as usize].clone(), n));
    let bits = |s: &pipewright_runtime::StepRecord| s.loss.map(f32::to_bits);
    let mut losses = Vec::new();
    let got = run_mpi(
        universe,
        mesh,
        &tt,
        make,
        user_mlp::rows,
        &opts,
        "user mlp",
        |s| losses.push(bits(s)),
    )
    .unwrap_or_else(|e| panic!("MPI run: {e}"));
    let Some(params) = got else { return };
    let mut want = Vec::new();
    let local = run(mesh, &tt, make, user_mlp::rows, &opts, |s| {
        want.push(bits(s))
    })
    .expect("local run");
    assert_eq!(losses, want, "MPI losses differ from in-process");
    assert_eq!(params, local, "MPI parameters differ from in-process");
    let losses: Vec<f32> = losses.into_iter().flatten().map(f32::from_bits).collect();
    println!("MPI-USER-EQUAL {} losses {losses:?}", tt.name);
}

#[test]
fn mpi_user_model_pp2_dp2_equals_in_process_to_the_bit() {
    let name = "mpi_user_model_pp2_dp2_equals_in_process_to_the_bit";
    if std::env::var_os(CHILD).is_some() {
        return user_model_child();
    }
    let out = run_to_end(mpirun(4, name, &[]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mpirun failed:\n{stdout}\n{stderr}");
    let line = marked(&stdout, "MPI-USER-EQUAL");
    assert!(
        line.is_some(),
        "rank 0 did not compare:\n{stdout}\n{stderr}"
    );
    eprintln!("{}", line.unwrap_or_default());
}

/// What every rank computes with the collectives, as bits: sums and means over 4 ranks of
/// values whose sum depends on the order of addition, an empty all-reduce, an all-gather of
/// different shapes, a reduce-scatter, an uneven reduce-scatter (63 values over 4) whose
/// shards gather back into the all-reduce's bits, and a barrier.
fn collectives<C: Communicator<Tensor = Tensor>>(c: &C, mesh: Mesh) -> Vec<u32> {
    let rank = c.rank();
    let g = mesh.group(GroupKind::Tp, rank).unwrap();
    let values: Vec<f32> = (0..64)
        .map(|i| ((rank * 64 + i) as f32 * 0.7359).sin() * 10f32.powi((i % 7) as i32 - 3))
        .collect();
    let mut out = Vec::new();
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        let mut t = Tensor::new(&[8, 8], values.clone()).unwrap();
        c.all_reduce(&g, &mut t, op).unwrap();
        assert_eq!(t.shape(), [8, 8]);
        out.extend(t.data().iter().map(|v| v.to_bits()));
    }
    let mut empty = Tensor::zeros(&[0]);
    c.all_reduce(&g, &mut empty, ReduceOp::Sum).unwrap();
    assert_eq!(empty.numel(), 0);
    let mine = Tensor::new(&[rank + 1], values[..rank + 1].to_vec()).unwrap();
    for (i, t) in c.all_gather(&g, &mine).unwrap().iter().enumerate() {
        assert_eq!(t.shape(), [i + 1]);
        out.extend(t.data().iter().map(|v| v.to_bits()));
    }
    let rs = c
        .reduce_scatter(
            &g,
            &Tensor::new(&[64], values.clone()).unwrap(),
            ReduceOp::Sum,
        )
        .unwrap();
    out.extend(rs.data().iter().map(|v| v.to_bits()));
    let odd = Tensor::new(&[63], values[..63].to_vec()).unwrap();
    let mut whole = odd.clone();
    c.all_reduce(&g, &mut whole, ReduceOp::Sum).unwrap();
    let p = c.start_reduce_scatter(&g, odd, ReduceOp::Sum).unwrap();
    let shard = c.wait_reduce_scatter(p).unwrap();
    let r = shard_range(63, 4, g.position(rank).unwrap());
    assert_eq!(shard.data(), &whole.data()[r]);
    let back = c.all_gather_shards(&g, shard, 63).unwrap();
    assert_eq!(back.data(), whole.data());
    out.extend(back.data().iter().map(|v| v.to_bits()));
    c.barrier(&g).unwrap();
    out
}

#[test]
fn mpi_collectives_equal_the_local_transport_to_the_bit() {
    let mesh = Mesh::new(1, 4, 1).unwrap();
    if std::env::var_os(CHILD).is_none() {
        let out = run_to_end(mpirun(
            4,
            "mpi_collectives_equal_the_local_transport_to_the_bit",
            &[],
        ));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "mpirun failed:\n{stdout}\n{stderr}");
        assert_eq!(
            stdout.matches("COLLECTIVES-EQUAL").count(),
            4,
            "{stdout}\n{stderr}"
        );
        return;
    }
    let timeout = Duration::from_secs(30);
    let comm = MpiComm::new(mpi::init().unwrap(), mesh, 1, 1, timeout).unwrap();
    let got = collectives(&comm, mesh);
    // The same on threads of this process, for this rank.
    let world = LocalWorld::new(4, timeout);
    let want = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|r| {
                let c = world.comm(r);
                s.spawn(move || collectives(&c, mesh))
            })
            .collect();
        let mut all: Vec<Vec<u32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        all.swap_remove(comm.rank())
    });
    assert!(
        got == want,
        "rank {}: MPI and local collectives differ",
        comm.rank()
    );
    println!("COLLECTIVES-EQUAL rank {}", comm.rank());
}

/// Polls `f` until it is ready (MPI receives poll and yield; nothing needs waking).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
    fn raw() -> RawWaker {
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(|_| raw(), |_| {}, |_| {}, |_| {});
    // SAFETY: the vtable's functions do nothing with the (null) data pointer.
    let waker = unsafe { Waker::from_raw(raw()) };
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// A bf16 wire carries bf16 bytes: what arrives is the sent tensor rounded to bf16 (an f32
/// wire would deliver it unrounded), and the receiver takes exactly 2 bytes per element.
#[test]
fn mpi_bf16_wire_delivers_bf16_values() {
    let test = "mpi_bf16_wire_delivers_bf16_values";
    if std::env::var_os(CHILD).is_none() {
        let out = run_to_end(mpirun(2, test, &[]));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "mpirun failed:\n{stdout}\n{stderr}");
        assert!(stdout.contains("BF16-WIRE-OK"), "{stdout}\n{stderr}");
        return;
    }
    let mesh = Mesh::new(2, 1, 1).unwrap();
    let comm = MpiComm::new(mpi::init().unwrap(), mesh, 2, 1, Duration::from_secs(30))
        .unwrap()
        .with_wire(pipewright_kernels::DType::BF16);
    let sent = Tensor::new(&[3, 4], (0..12).map(|i| 1.0 + 0.001 * i as f32).collect()).unwrap();
    let tag = pipewright_runtime::Tag {
        step: 0,
        dir: pipewright_runtime::Direction::Forward,
        stage: 0,
        microbatch: 0,
    };
    if comm.rank() == 0 {
        comm.send(1, tag, sent).unwrap();
        // Sends complete as the receiver takes them; keep the communicator until then.
        comm.barrier(&mesh.group(GroupKind::World, comm.rank()).unwrap())
            .unwrap();
        return;
    }
    let got = block_on(comm.recv(0, tag)).unwrap();
    let mut want = sent.clone();
    Precision::Bf16.round_activation(want.data_mut());
    assert_ne!(want, sent);
    assert_eq!(got, want);
    comm.barrier(&mesh.group(GroupKind::World, comm.rank()).unwrap())
        .unwrap();
    println!("BF16-WIRE-OK");
}

/// Rank program: announce its pid, then train for far longer than the test waits.
fn doomed_child(dir: &Path) {
    let universe = mpi::init().expect("MPI starts");
    let rank = mpi::world_rank(&universe);
    std::fs::write(
        dir.join(format!("rank{rank}.pid")),
        std::process::id().to_string(),
    )
    .expect("pid file");
    let cfg = config(
        Mesh::new(2, 1, 2).unwrap(),
        100_000,
        Duration::from_secs(30),
    );
    let tt = timetable(ScheduleKind::OneFOneB, 1);
    let r = train_gpt_mpi(universe, &cfg, &tt, |s| println!("STEP {}", s.step));
    match r {
        Ok(_) => println!("rank {rank} finished"),
        Err(e) => {
            // One write, so that mpirun does not interleave it with other ranks' lines.
            let line = format!("RANK-ERROR {rank}: {e}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            std::process::exit(1);
        }
    }
}

#[test]
fn killing_a_rank_mid_step_ends_the_others_with_an_error_naming_it() {
    let dir = std::env::var_os("PIPEWRIGHT_MPI_DIR").map(PathBuf::from);
    if std::env::var_os(CHILD).is_some() {
        return doomed_child(&dir.expect("PIPEWRIGHT_MPI_DIR"));
    }
    // With --enable-recovery mpirun lets the survivors run on when a rank dies: each must end
    // by itself with an error naming the lost rank (OpenMPI 4.1's mpirun then exits 0
    // whatever the ranks' statuses). Rank 1 feeds the last stage; rank 3 holds one.
    kill_mid_run(1, true);
    kill_mid_run(3, true);
    // By default mpirun ends the job itself (SIGTERM, then SIGKILL to the others; exit 137)
    // naming the dead rank, and stops forwarding output: a survivor's line may be cut, and
    // may name a rank that mpirun's own teardown killed first. The whole must end, non-zero,
    // without a hang, and every line printed must name a lost rank.
    kill_mid_run(1, false);
}

fn kill_mid_run(victim: usize, recovery: bool) {
    let dir = std::env::temp_dir().join(format!(
        "pipewright-mpi-kill-{}-{victim}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let test = "killing_a_rank_mid_step_ends_the_others_with_an_error_naming_it";
    let mut flags = vec!["-x", "PIPEWRIGHT_MPI_DIR"];
    if recovery {
        flags.push("--enable-recovery");
    }
    let mut c = mpirun(4, test, &flags);
    c.env("PIPEWRIGHT_MPI_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("mpirun runs");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    // Let a few steps run, so the kill lands in the middle of the run.
    let steps = lines
        .by_ref()
        .map_while(Result::ok)
        .filter(|l| l.contains("STEP"))
        .take(3)
        .count();
    assert_eq!(steps, 3, "the run did not start");
    let pid = std::fs::read_to_string(dir.join(format!("rank{victim}.pid"))).expect("pid");
    let killed = Command::new("kill").args(["-9", pid.trim()]).status();
    assert!(
        killed.is_ok_and(|s| s.success()),
        "kill rank {victim} (pid {pid})"
    );
    let started = Instant::now();
    // A hang must fail the test, not stall it: give mpirun 30 s, then stop it.
    let deadline = started + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let hung = child.try_wait().ok().flatten().is_none();
    if hung {
        let _ = child.kill();
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = child.wait_with_output().expect("mpirun ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let secs = started.elapsed().as_secs_f64();
    eprintln!("rank {victim} killed; mpirun ended {secs:.1} s later\n{stderr}");
    assert!(!hung, "the survivors of rank {victim} hung:\n{stderr}");
    assert!(
        recovery || !out.status.success(),
        "mpirun succeeded after rank {victim} died"
    );
    assert!(
        !rest.iter().any(|l| l.contains("finished")),
        "a rank finished: {rest:?}"
    );
    let named = format!("lost peer rank {victim}");
    for rank in (0..4).filter(|&r| r != victim) {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("RANK-ERROR {rank}:")));
        match line {
            Some(line) if recovery => assert!(line.contains(&named), "rank {rank}: {line}"),
            Some(line) => assert!(line.contains("lost peer rank"), "rank {rank}: {line}"),
            None => assert!(!recovery, "rank {rank} reported no error:\n{stderr}"),
        }
    }
    if !recovery {
        let noticed = format!("process rank {victim} with PID");
        assert!(
            stderr.contains(&noticed),
            "mpirun did not name rank {victim}:\n{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
