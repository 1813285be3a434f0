//! The CUDA-local transport against the CPU transport: point-to-point and every collective,
//! four ranks sharing GPU 0, each on its own stream. Without a GPU (or its libraries) the
//! tests print `skipped: <why>` and pass.

use std::sync::Arc;
use std::time::Duration;

use pipewright_kernels::cuda::{gpu_for_tests, CudaBackend, CudaTensor};
use pipewright_kernels::{Backend, Tensor};
use pipewright_runtime::comm::cuda_local::{CudaLocalWorld, CudaOps};
use pipewright_runtime::{Communicator, Direction, GroupKind, LocalWorld, Mesh, ReduceOp, Tag};

const RANKS: usize = 4;

/// Values whose sum depends on the order it is taken in.
fn values(rank: usize) -> Vec<f32> {
    (0..64)
        .map(|i| ((rank * 64 + i) as f32 * 0.37).sin() * 10f32.powi(rank as i32 * 2 - 3))
        .collect()
}

/// What one rank sees: a received tensor, an all-reduce, an all-gather, a reduce-scatter.
/// `up` and `down` move tensors between the host and the transport's type.
fn exercise<C: Communicator>(
    c: &C,
    up: &dyn Fn(&Tensor) -> C::Tensor,
    down: &dyn Fn(&C::Tensor) -> Vec<f32>,
) -> Vec<Vec<f32>> {
    let r = c.rank();
    let g = Mesh::new(1, RANKS, 1)
        .unwrap()
        .group(GroupKind::Tp, r)
        .unwrap();
    let tag = |from: usize| Tag {
        step: 0,
        dir: Direction::Forward,
        stage: from as u32,
        microbatch: 0,
    };
    let mine = Tensor::new(&[8, 8], values(r)).unwrap();
    c.send((r + 1) % RANKS, tag(r), up(&mine)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let src = (r + RANKS - 1) % RANKS;
    let got = rt.block_on(c.recv(src, tag(src))).unwrap();
    let mut sum = up(&mine);
    c.all_reduce(&g, &mut sum, ReduceOp::Sum).unwrap();
    let mut mean = up(&mine);
    c.all_reduce(&g, &mut mean, ReduceOp::Mean).unwrap();
    let gathered = c.all_gather(&g, &up(&mine)).unwrap();
    let scattered = c.reduce_scatter(&g, &up(&mine), ReduceOp::Sum).unwrap();
    c.barrier(&g).unwrap();
    let mut out = vec![down(&got), down(&sum), down(&mean), down(&scattered)];
    out.extend(gathered.iter().map(down));
    out
}

fn on_threads<T: Send>(f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..RANKS).map(|r| s.spawn(move || f(r))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn cuda_local_equals_the_cpu_transport_to_the_bit() {
    let Some(base) = gpu_for_tests(0) else { return };
    let host = LocalWorld::new(RANKS, Duration::from_secs(30));
    let want = on_threads(|r| exercise(&host.comm(r), &|t| t.clone(), &|t| t.data().to_vec()));
    let world = CudaLocalWorld::with_payload(RANKS, Duration::from_secs(30));
    let backends: Vec<Arc<CudaBackend>> = (0..RANKS)
        .map(|_| Arc::new(base.on_new_stream().unwrap()))
        .collect();
    let got = on_threads(|r| {
        let b = Arc::clone(&backends[r]);
        let comm = world.comm_with(r, CudaOps::new(Arc::clone(&b)));
        let up = |t: &Tensor| b.upload(t).unwrap();
        let down = |t: &CudaTensor| b.download(t).unwrap().into_data();
        exercise(&comm, &up, &down)
    });
    let bits = |v: &Vec<Vec<Vec<f32>>>| -> Vec<Vec<Vec<u32>>> {
        v.iter()
            .map(|r| {
                r.iter()
                    .map(|t| t.iter().map(|x| x.to_bits()).collect())
                    .collect()
            })
            .collect()
    };
    assert_eq!(bits(&got), bits(&want));
}
