//! How the ranks of an NCCL communicator agree on its unique id: its first rank makes the id
//! and the others read it, over MPI (a broadcast from that rank, feature `mpi`) or through
//! files in a directory every rank can see (one machine's /tmp, or a shared filesystem).
//!
//! Plain Rust, no NCCL: the id is 128 opaque bytes here, so the file exchange and its
//! timeout are tested on any machine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::links::CommSpec;
use super::CommError;

/// Size of an NCCL unique id (`ncclUniqueId`).
pub const ID_BYTES: usize = 128;
/// An NCCL unique id as bytes.
pub type IdBytes = [u8; ID_BYTES];

/// A way for the ranks of a communicator to share its id.
pub trait Rendezvous {
    /// Called by every rank for every communicator of the run's plan, in plan order. The
    /// communicator's first rank calls `make` and publishes its id; other members wait for
    /// it; ranks outside the communicator get `None` (an MPI broadcast still needs them).
    fn share(
        &mut self,
        spec: &CommSpec,
        me: usize,
        make: &mut dyn FnMut() -> Result<IdBytes, CommError>,
    ) -> Result<Option<IdBytes>, CommError>;
}

/// Ids through files: `<dir>/<run>.<communicator>.ncclid`, written atomically (a temporary
/// file, then a rename) so a reader never sees half an id. Give every run a fresh directory
/// or its own `run` key: an id left by an earlier run would be read as this run's.
#[derive(Clone, Debug)]
pub struct FileRendezvous {
    dir: PathBuf,
    run: String,
    timeout: Duration,
}

impl FileRendezvous {
    /// Ids in `dir` under the key `run` (letters, digits, `-`, `_`), waited for at most
    /// `timeout` each.
    pub fn new(dir: &Path, run: &str, timeout: Duration) -> Result<Self, CommError> {
        let ok = !run.is_empty()
            && run
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(CommError::Invalid(format!(
                "rendezvous run key {run:?}: use letters, digits, '-' and '_'"
            )));
        }
        if !dir.is_dir() {
            return Err(CommError::Invalid(format!(
                "rendezvous directory {} does not exist",
                dir.display()
            )));
        }
        Ok(FileRendezvous {
            dir: dir.to_path_buf(),
            run: run.to_string(),
            timeout,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{}.{name}.ncclid", self.run))
    }

    fn publish(&self, name: &str, id: &IdBytes) -> Result<(), CommError> {
        let path = self.path(name);
        let tmp = self.dir.join(format!(
            ".{}.{name}.ncclid.{}.tmp",
            self.run,
            std::process::id()
        ));
        let io = |e: std::io::Error| {
            CommError::Invalid(format!("writing NCCL id file {}: {e}", path.display()))
        };
        std::fs::write(&tmp, id).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }

    fn await_id(&self, name: &str, leader: usize) -> Result<IdBytes, CommError> {
        let path = self.path(name);
        let deadline = Instant::now() + self.timeout;
        loop {
            match std::fs::read(&path) {
                Ok(bytes) => {
                    return IdBytes::try_from(bytes.as_slice()).map_err(|_| {
                        CommError::Invalid(format!(
                            "NCCL id file {} holds {} bytes, not {ID_BYTES}",
                            path.display(),
                            bytes.len()
                        ))
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(CommError::Invalid(format!(
                        "reading NCCL id file {}: {e}",
                        path.display()
                    )))
                }
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    what: format!(
                        "NCCL id file {} from rank {leader} (is it running, with the same \
                         rendezvous directory and run key?)",
                        path.display()
                    ),
                    secs: self.timeout.as_secs_f64(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Rendezvous for FileRendezvous {
    fn share(
        &mut self,
        spec: &CommSpec,
        me: usize,
        make: &mut dyn FnMut() -> Result<IdBytes, CommError>,
    ) -> Result<Option<IdBytes>, CommError> {
        match spec.ranks.iter().position(|&r| r == me) {
            None => Ok(None),
            Some(0) => {
                let id = make()?;
                self.publish(&spec.name, &id)?;
                Ok(Some(id))
            }
            Some(_) => self.await_id(&spec.name, spec.ranks[0]).map(Some),
        }
    }
}

/// Ids over MPI: a broadcast from the communicator's first rank over the whole world (every
/// rank takes part in every broadcast, in plan order).
#[cfg(feature = "mpi")]
pub struct MpiRendezvous<'a> {
    world: &'a mpi::topology::SimpleCommunicator,
}

#[cfg(feature = "mpi")]
impl<'a> MpiRendezvous<'a> {
    /// Broadcasts over `world`.
    pub fn new(world: &'a mpi::topology::SimpleCommunicator) -> Self {
        MpiRendezvous { world }
    }
}

#[cfg(feature = "mpi")]
impl Rendezvous for MpiRendezvous<'_> {
    fn share(
        &mut self,
        spec: &CommSpec,
        me: usize,
        make: &mut dyn FnMut() -> Result<IdBytes, CommError>,
    ) -> Result<Option<IdBytes>, CommError> {
        use mpi::topology::Communicator as _;
        use mpi::traits::Root as _;
        let leader = *spec
            .ranks
            .first()
            .ok_or_else(|| CommError::Invalid(format!("communicator {} is empty", spec.name)))?;
        let mut id = if me == leader { make()? } else { [0; ID_BYTES] };
        let root = i32::try_from(leader)
            .map_err(|_| CommError::Invalid(format!("rank {leader} exceeds MPI's ranks")))?;
        self.world.process_at_rank(root).broadcast_into(&mut id[..]);
        Ok(spec.ranks.contains(&me).then_some(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::links::CommRole;
    use crate::mesh::GroupKind;

    fn spec(ranks: Vec<usize>) -> CommSpec {
        CommSpec {
            name: "tp0".into(),
            ranks,
            role: CommRole::Group(GroupKind::Tp, 0),
        }
    }

    fn id(b: u8) -> IdBytes {
        [b; ID_BYTES]
    }

    #[test]
    fn members_read_the_leaders_id_and_others_skip() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(vec![2, 5]);
        let mut r = FileRendezvous::new(dir.path(), "run-1", Duration::from_secs(10)).unwrap();
        let reader = {
            let (mut r, s) = (r.clone(), s.clone());
            std::thread::spawn(move || r.share(&s, 5, &mut || panic!("only rank 2 makes it")))
        };
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(r.share(&s, 2, &mut || Ok(id(7))).unwrap(), Some(id(7)));
        assert_eq!(reader.join().unwrap().unwrap(), Some(id(7)));
        let outsider = r.share(&s, 0, &mut || panic!("not a member"));
        assert_eq!(outsider.unwrap(), None);
        // Only the id file is left: the temporary was renamed.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_missing_leader_times_out_naming_the_file_and_the_rank() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = FileRendezvous::new(dir.path(), "r", Duration::from_millis(50)).unwrap();
        let e = r
            .share(&spec(vec![3, 4]), 4, &mut || Ok(id(1)))
            .unwrap_err();
        assert!(matches!(e, CommError::Timeout { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("r.tp0.ncclid") && msg.contains("rank 3"),
            "{msg}"
        );
    }

    #[test]
    fn bad_keys_directories_and_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(FileRendezvous::new(dir.path(), "../x", Duration::ZERO).is_err());
        assert!(FileRendezvous::new(&dir.path().join("nope"), "x", Duration::ZERO).is_err());
        std::fs::write(dir.path().join("x.tp0.ncclid"), b"short").unwrap();
        let mut r = FileRendezvous::new(dir.path(), "x", Duration::from_secs(1)).unwrap();
        let e = r
            .share(&spec(vec![0, 1]), 1, &mut || Ok(id(0)))
            .unwrap_err();
        assert!(e.to_string().contains("holds 5 bytes"), "{e}");
    }
}
