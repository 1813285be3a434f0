//! Issue 32's CLI classes: a plan that one refused candidate used to end, shape sizes that
//! wrapped, absurd cluster and profile figures, readers given the wrong kind of file, and the
//! launch line's quoting.

mod common;

use common::plan::{ok, refused};

const LLAMA_8B: [&str; 8] = [
    "--layers",
    "32",
    "--d-model",
    "4096",
    "--heads",
    "32",
    "--gpus",
    "8",
];

/// Class 5: a candidate a check refuses (sequence parallelism over a sequence TP cannot split;
/// two chunks per device with fewer microbatches than devices) is dropped, not the plan.
#[test]
fn a_refused_candidate_is_dropped_not_the_plan() {
    let mut args = LLAMA_8B.to_vec();
    args.extend(["--seq-len", "1", "--global-batch", "64", "--explain"]);
    let out = ok(&args);
    assert!(out.contains("refused by a check and dropped"), "{out}");
    assert!(out.contains("tp (2) must divide seq_len (1)"), "{out}");
    assert!(out.contains("mpirun -np 8 pipewright train"), "{out}");

    let mut args = LLAMA_8B.to_vec();
    args.extend(["--seq-len", "3", "--tp", "1", "--global-batch", "64"]);
    assert!(ok(&args).contains("mpirun -np 8 pipewright train"));

    // A fixed flag under which every candidate is refused is named, with the reason.
    let mut args = LLAMA_8B.to_vec();
    args.extend(["--seq-len", "1", "--global-batch", "64"]);
    args.extend(["--tp", "2", "--sequence-parallel"]);
    refused(&args, &["--tp 2 fits no configuration", "must divide seq_len (1)"]);
}
