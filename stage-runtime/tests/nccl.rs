//! A one-rank NCCL communicator on GPU 0: its all-reduce (sum and mean) leaves the tensor as
//! it is, through NCCL. Without a GPU or the NCCL library the test prints `skipped: <why>`
//! and passes.

use std::sync::Arc;
use std::time::Duration;

use pipewright_kernels::cuda::gpu_for_tests;
use pipewright_kernels::{Backend, Tensor};
use pipewright_runtime::comm::nccl::{missing_library, NcclComm, NcclSetup};
use pipewright_runtime::comm::rendezvous::FileRendezvous;
use pipewright_runtime::{Communicator, GroupKind, Mesh, ReduceOp};
use pipewright_schedule::{generate, lower, ScheduleKind, ScheduleSpec};

#[test]
fn one_rank_all_reduce_through_nccl() {
    if let Some(why) = missing_library() {
        println!("skipped: {why}");
        return;
    }
    let Some(backend) = gpu_for_tests(0).map(Arc::new) else {
        return;
    };
    let mesh = Mesh::new(1, 1, 1).unwrap();
    let spec = ScheduleSpec::new(ScheduleKind::OneFOneB, 1, 1, 2, None).unwrap();
    let tt = lower(&generate(&spec)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut ids = FileRendezvous::new(dir.path(), "test", Duration::from_secs(30)).unwrap();
    let setup = NcclSetup {
        mesh,
        tt: &tt,
        rank: 0,
        backend: Arc::clone(&backend),
        timeout: Duration::from_secs(30),
    };
    let comm = NcclComm::new(setup, &mut ids).unwrap();
    let world = mesh.group(GroupKind::World, 0).unwrap();
    let host = Tensor::new(&[3, 5], (0..15).map(|i| i as f32 * 0.25 - 1.0).collect()).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        let mut t = backend.upload(&host).unwrap();
        comm.all_reduce(&world, &mut t, op).unwrap();
        assert_eq!(backend.download(&t).unwrap(), host);
    }
    comm.barrier(&world).unwrap();
}
