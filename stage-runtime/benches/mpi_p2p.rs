//! MPI point-to-point of a 4 MiB tensor between two local processes: through `MpiComm`
//! (header + payload, polled receive) against a plain rsmpi blocking send/receive of the same
//! bytes into a reused buffer. `cargo bench -p pipewright-runtime --features mpi --bench
//! mpi_p2p` launches itself under `mpirun -np 2`; rank 0 prints the medians.
//!
//! A binary rather than criterion: both processes must run the same iterations in lockstep,
//! which criterion's adaptive sampling (decided per process) does not promise.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use mpi::point_to_point::{Destination, Source};
use mpi::topology::Communicator as _;
use pipewright_kernels::Tensor;
use pipewright_runtime::comm::mpi::{init, MpiComm};
use pipewright_runtime::{Communicator, Direction, Mesh, Tag};

const CHILD: &str = "PIPEWRIGHT_MPI_CHILD";
const FLOATS: usize = 1 << 20; // 4 MiB
const WARMUP: usize = 10;
const ITERS: usize = 100;

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_none() {
        return relaunch();
    }
    match child() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn relaunch() -> ExitCode {
    let Ok(exe) = std::env::current_exe() else {
        return ExitCode::FAILURE;
    };
    let status = Command::new("mpirun")
        .args(["--allow-run-as-root", "-np", "2", "-x", CHILD])
        .arg(exe)
        .env(CHILD, "1")
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: cannot run mpirun ({e}); install openmpi-bin");
            ExitCode::FAILURE
        }
    }
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn child() -> Result<(), Box<dyn std::error::Error>> {
    let comm = MpiComm::new(init()?, Mesh::new(2, 1, 1)?, 2, 1, Duration::from_secs(60))?;
    let rank = comm.rank();
    let peer = 1 - rank;
    let plain = plain_rsmpi(&comm, rank, peer);
    let ours = through_mpi_comm(&comm, rank, peer)?;
    comm.flush()?;
    if rank == 0 {
        let gbs = |ms: f64| (FLOATS * 4) as f64 / (ms / 1e3) / 1e9;
        println!(
            "4 MiB one-way (median of {ITERS} round trips / 2): plain rsmpi {plain:.3} ms ({:.2} GB/s), \
             MpiComm {ours:.3} ms ({:.2} GB/s): {:+.1}%",
            gbs(plain),
            gbs(ours),
            100.0 * (ours / plain - 1.0)
        );
    }
    Ok(())
}

/// Blocking rsmpi ping-pong into a buffer allocated once.
fn plain_rsmpi(comm: &MpiComm, rank: usize, peer: usize) -> f64 {
    let world = comm.world().duplicate();
    let other = world.process_at_rank(peer as i32);
    let mut buf = vec![1.0f32; FLOATS];
    let mut times = Vec::new();
    for i in 0..WARMUP + ITERS {
        let t0 = Instant::now();
        if rank == 0 {
            other.send_with_tag(&buf[..], 7);
            other.receive_into_with_tag(&mut buf[..], 7);
        } else {
            other.receive_into_with_tag(&mut buf[..], 7);
            other.send_with_tag(&buf[..], 7);
        }
        if i >= WARMUP {
            times.push(t0.elapsed() / 2);
        }
    }
    median(times)
}

/// The same ping-pong through the transport the executor uses: a tensor moves in, a new
/// tensor comes out (received into its own fresh buffer).
fn through_mpi_comm(
    comm: &MpiComm,
    rank: usize,
    peer: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let tag = |step: usize, dir| Tag {
        step: step as u64,
        dir,
        stage: 0,
        microbatch: 0,
    };
    let mut t = Tensor::new(&[FLOATS], vec![1.0; FLOATS])?;
    let mut times = Vec::new();
    for i in 0..WARMUP + ITERS {
        let t0 = Instant::now();
        let (there, back) = (tag(i, Direction::Forward), tag(i, Direction::Backward));
        if rank == 0 {
            comm.send(peer, there, t)?;
            t = rt.block_on(comm.recv(peer, back))?;
        } else {
            let got = rt.block_on(comm.recv(peer, there))?;
            comm.send(peer, back, got)?;
        }
        if i >= WARMUP {
            times.push(t0.elapsed() / 2);
        }
    }
    Ok(median(times))
}
