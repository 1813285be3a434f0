//! Which GPU a process of a multi-process run uses: one process per GPU, each taking the GPU
//! of its rank among the processes on its machine.
//!
//! Plain Rust, no CUDA, so the choice is tested on any machine.

/// The variable OpenMPI's `mpirun` sets to a process's rank among those on its machine.
pub const LOCAL_RANK_VAR: &str = "OMPI_COMM_WORLD_LOCAL_RANK";

/// Why no GPU could be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GpuChoiceError {
    /// The machine has no GPU this process can see.
    #[error("no GPU is visible to rank {rank} (CUDA reports 0 devices)")]
    NoGpu {
        /// The process's global rank.
        rank: usize,
    },
    /// The local rank is not a number.
    #[error("{LOCAL_RANK_VAR}={value:?} is not a rank")]
    BadLocalRank {
        /// What the variable held.
        value: String,
    },
    /// More processes on this machine than GPUs.
    #[error("local rank {local} needs GPU {local}, but this machine shows {devices} GPU(s): launch at most {devices} process(es) per machine (one per GPU)")]
    TooFewGpus {
        /// The process's rank on its machine.
        local: usize,
        /// GPUs visible to it.
        devices: usize,
    },
}

/// The GPU of the process with global rank `rank` on a machine showing `devices` GPUs:
/// its local rank when the launcher gives one (`local_rank`, the value of
/// [`LOCAL_RANK_VAR`]), else `rank % devices` (right when every machine runs as many
/// processes as it has GPUs and ranks fill machines in order).
///
/// A local rank beyond the GPUs is an error, not a wrap-around: two processes sharing a GPU
/// would run, slowly, and hide a launch mistake.
pub fn choose_gpu(
    local_rank: Option<&str>,
    rank: usize,
    devices: usize,
) -> Result<usize, GpuChoiceError> {
    if devices == 0 {
        return Err(GpuChoiceError::NoGpu { rank });
    }
    let Some(value) = local_rank else {
        return Ok(rank % devices);
    };
    let local = value
        .trim()
        .parse::<usize>()
        .map_err(|_| GpuChoiceError::BadLocalRank {
            value: value.to_string(),
        })?;
    if local >= devices {
        return Err(GpuChoiceError::TooFewGpus { local, devices });
    }
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_rank_picks_the_gpu() {
        assert_eq!(choose_gpu(Some("0"), 5, 4), Ok(0));
        assert_eq!(choose_gpu(Some("3"), 7, 4), Ok(3));
        assert_eq!(choose_gpu(Some(" 1\n"), 9, 2), Ok(1));
    }

    #[test]
    fn without_a_local_rank_the_rank_wraps_over_the_gpus() {
        assert_eq!(choose_gpu(None, 0, 4), Ok(0));
        assert_eq!(choose_gpu(None, 6, 4), Ok(2));
        assert_eq!(choose_gpu(None, 3, 1), Ok(0));
    }

    #[test]
    fn impossible_choices_are_errors_naming_why() {
        assert_eq!(
            choose_gpu(None, 2, 0),
            Err(GpuChoiceError::NoGpu { rank: 2 })
        );
        assert_eq!(
            choose_gpu(Some("x"), 0, 2),
            Err(GpuChoiceError::BadLocalRank { value: "x".into() })
        );
        let e = choose_gpu(Some("4"), 4, 4).unwrap_err();
        assert_eq!(
            e,
            GpuChoiceError::TooFewGpus {
                local: 4,
                devices: 4
            }
        );
        assert!(e.to_string().contains("at most 4 process(es) per machine"));
    }
}
