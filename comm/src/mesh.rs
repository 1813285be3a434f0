//! `Mesh { pp, tp, dp }`: which rank does what, in Megatron's order (TP fastest, then DP, then PP).
//!
//! Groups are derived from the mesh, never listed by hand: a rank's TP group is the ranks that
//! share its PP and DP coordinates, and so on.
//!
//! Expert parallelism folds over data parallelism, as Megatron-Core's parallel folding does
//! with an expert TP of 1: `ep` ranks hold a mixture's experts between them, and they are `ep`
//! adjacent DP replicas of one stage ([`GroupKind::Ep`]); the replicas holding the same experts
//! ([`GroupKind::ExpertDp`], `dp / ep` of them) sum those experts' gradients. `ep` adds no
//! ranks: the world is still `pp x tp x dp`.

use serde::{Deserialize, Serialize};

/// Why degrees do not make a mesh.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// A degree is zero.
    #[error("mesh degree {0} must be at least 1")]
    Zero(&'static str),
    /// Degrees do not multiply to the world size.
    #[error("pp {pp} x tp {tp} x dp {dp} = {product} ranks, but the world has {world}")]
    WorldSize {
        /// Pipeline degree.
        pp: usize,
        /// Tensor degree.
        tp: usize,
        /// Data degree.
        dp: usize,
        /// Their product.
        product: usize,
        /// Ranks available.
        world: usize,
    },
    /// An expert-parallel degree that does not fold over the data-parallel one.
    #[error("ep = {ep} {why}")]
    Ep {
        /// Expert-parallel degree asked for.
        ep: usize,
        /// Why it does not fit.
        why: String,
    },
    /// A rank outside the mesh.
    #[error("rank {rank} is outside a mesh of {world} ranks")]
    NoSuchRank {
        /// Rank asked for.
        rank: usize,
        /// World size.
        world: usize,
    },
}

/// Degrees of pipeline, tensor and data parallelism.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mesh {
    /// Pipeline stages (devices in the timetable).
    pub pp: usize,
    /// Tensor-parallel ranks inside each stage.
    pub tp: usize,
    /// Data-parallel replicas.
    pub dp: usize,
    /// Expert-parallel ranks, folded over the `dp` replicas (1: every rank holds every
    /// expert). Set with [`Mesh::with_ep`].
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ep: usize,
}

fn one() -> usize {
    1
}

/// A mesh without expert parallelism writes the three fields it always had.
fn is_one(ep: &usize) -> bool {
    *ep == 1
}

/// A rank's coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Coord {
    /// Pipeline index (the timetable's device).
    pub pp: usize,
    /// Tensor-parallel index.
    pub tp: usize,
    /// Data-parallel index.
    pub dp: usize,
}

/// Which kind of group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupKind {
    /// Ranks sharing PP and DP: one stage's tensor-parallel shards.
    Tp,
    /// Ranks sharing PP and TP: replicas of one shard.
    Dp,
    /// Ranks sharing TP and DP: one pipeline.
    Pp,
    /// Every rank.
    World,
    /// Ranks sharing PP and TP whose DP indices fall in one block of `ep`: the expert-parallel
    /// group whose all-to-all moves a mixture's rows.
    Ep,
    /// Ranks sharing PP, TP and the position in their EP group: the replicas of one share of
    /// the experts, which sum its gradients.
    ExpertDp,
}

/// A set of ranks that run collectives together.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Group {
    /// Kind.
    pub kind: GroupKind,
    /// Index among the groups of its kind (its key with `kind`).
    pub index: usize,
    /// Member ranks, ascending.
    pub ranks: Vec<usize>,
}

impl Group {
    /// Position of `rank` in the group.
    pub fn position(&self, rank: usize) -> Option<usize> {
        self.ranks.iter().position(|&r| r == rank)
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }
}

impl Mesh {
    /// A mesh; every degree at least 1.
    pub fn new(pp: usize, tp: usize, dp: usize) -> Result<Mesh, MeshError> {
        for (d, what) in [(pp, "pp"), (tp, "tp"), (dp, "dp")] {
            if d == 0 {
                return Err(MeshError::Zero(what));
            }
        }
        Ok(Mesh { pp, tp, dp, ep: 1 })
    }

    /// This mesh with its experts sharded over `ep` ranks, folded over the data-parallel
    /// replicas: `ep` must divide `dp`, and (for now) TP must be 1.
    pub fn with_ep(self, ep: usize) -> Result<Mesh, MeshError> {
        let why = if ep == 0 {
            Some("must be at least 1".to_string())
        } else if self.dp % ep != 0 {
            Some(format!(
                "must divide dp = {}: expert parallelism folds over the data-parallel replicas",
                self.dp
            ))
        } else if ep > 1 && self.tp > 1 {
            Some(format!(
                "needs tp = 1 (here tp = {}): experts are not yet sharded over tensor-parallel ranks",
                self.tp
            ))
        } else {
            None
        };
        match why {
            Some(why) => Err(MeshError::Ep { ep, why }),
            None => Ok(Mesh { ep, ..self }),
        }
    }

    /// A mesh that must fill a world of `world` ranks exactly.
    pub fn for_world(world: usize, pp: usize, tp: usize, dp: usize) -> Result<Mesh, MeshError> {
        let mesh = Mesh::new(pp, tp, dp)?;
        if mesh.world_size() != world {
            let product = mesh.world_size();
            return Err(MeshError::WorldSize {
                pp,
                tp,
                dp,
                product,
                world,
            });
        }
        Ok(mesh)
    }

    /// `pp * tp * dp`.
    pub fn world_size(&self) -> usize {
        self.pp * self.tp * self.dp
    }

    /// Rank of a coordinate: TP fastest, then DP, then PP.
    pub fn rank(&self, c: Coord) -> usize {
        (c.pp * self.dp + c.dp) * self.tp + c.tp
    }

    /// Coordinates of a rank.
    pub fn coord(&self, rank: usize) -> Result<Coord, MeshError> {
        if rank >= self.world_size() {
            return Err(MeshError::NoSuchRank {
                rank,
                world: self.world_size(),
            });
        }
        Ok(Coord {
            tp: rank % self.tp,
            dp: (rank / self.tp) % self.dp,
            pp: rank / (self.tp * self.dp),
        })
    }

    /// The group of `kind` that holds `rank`.
    pub fn group(&self, kind: GroupKind, rank: usize) -> Result<Group, MeshError> {
        let c = self.coord(rank)?;
        if matches!(kind, GroupKind::Ep | GroupKind::ExpertDp) && self.ep > 1 {
            // A mesh built by hand or read from JSON skipped `with_ep`'s checks.
            Mesh { ep: 1, ..*self }.with_ep(self.ep)?;
        }
        let (index, ranks): (usize, Vec<usize>) = match kind {
            GroupKind::Tp => (
                c.pp * self.dp + c.dp,
                (0..self.tp)
                    .map(|tp| self.rank(Coord { tp, ..c }))
                    .collect(),
            ),
            GroupKind::Dp => (
                c.pp * self.tp + c.tp,
                (0..self.dp)
                    .map(|dp| self.rank(Coord { dp, ..c }))
                    .collect(),
            ),
            GroupKind::Pp => (
                c.dp * self.tp + c.tp,
                (0..self.pp)
                    .map(|pp| self.rank(Coord { pp, ..c }))
                    .collect(),
            ),
            GroupKind::World => (0, (0..self.world_size()).collect()),
            GroupKind::Ep => {
                let (ep, first) = (self.ep.max(1), c.dp - c.dp % self.ep.max(1));
                (
                    (c.pp * self.tp + c.tp) * self.dp + first,
                    (first..first + ep)
                        .map(|dp| self.rank(Coord { dp, ..c }))
                        .collect(),
                )
            }
            GroupKind::ExpertDp => {
                let ep = self.ep.max(1);
                (
                    (c.pp * self.tp + c.tp) * ep + c.dp % ep,
                    (c.dp % ep..self.dp)
                        .step_by(ep)
                        .map(|dp| self.rank(Coord { dp, ..c }))
                        .collect(),
                )
            }
        };
        Ok(Group { kind, index, ranks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_order_tp_fastest_then_dp_then_pp() {
        let m = Mesh::new(2, 2, 2).unwrap();
        assert_eq!(
            m.coord(0).unwrap(),
            Coord {
                pp: 0,
                tp: 0,
                dp: 0
            }
        );
        assert_eq!(
            m.coord(1).unwrap(),
            Coord {
                pp: 0,
                tp: 1,
                dp: 0
            }
        );
        assert_eq!(
            m.coord(2).unwrap(),
            Coord {
                pp: 0,
                tp: 0,
                dp: 1
            }
        );
        assert_eq!(
            m.coord(4).unwrap(),
            Coord {
                pp: 1,
                tp: 0,
                dp: 0
            }
        );
        for r in 0..8 {
            assert_eq!(m.rank(m.coord(r).unwrap()), r);
        }
        assert_eq!(m.group(GroupKind::Tp, 5).unwrap().ranks, [4, 5]);
        assert_eq!(m.group(GroupKind::Dp, 5).unwrap().ranks, [5, 7]);
        assert_eq!(m.group(GroupKind::Pp, 5).unwrap().ranks, [1, 5]);
    }

    #[test]
    fn groups_of_a_kind_partition_the_world() {
        let m = Mesh::new(3, 2, 2).unwrap();
        for kind in [GroupKind::Tp, GroupKind::Dp, GroupKind::Pp] {
            let mut seen = vec![0; m.world_size()];
            for r in 0..m.world_size() {
                let g = m.group(kind, r).unwrap();
                assert!(g.position(r).is_some());
                if g.ranks[0] == r {
                    g.ranks.iter().for_each(|&x| seen[x] += 1);
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{kind:?}");
        }
    }

    #[test]
    fn degrees_that_do_not_fill_the_world_are_rejected() {
        let e = Mesh::for_world(8, 2, 2, 3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pp 2 x tp 2 x dp 3 = 12 ranks, but the world has 8"
        );
        assert_eq!(Mesh::new(0, 1, 1).unwrap_err(), MeshError::Zero("pp"));
    }

    #[test]
    fn experts_fold_over_adjacent_data_parallel_replicas() {
        let m = Mesh::new(2, 1, 4).unwrap().with_ep(2).unwrap();
        assert_eq!(m.world_size(), 8);
        assert_eq!(m.group(GroupKind::Ep, 5).unwrap().ranks, [4, 5]);
        assert_eq!(m.group(GroupKind::Ep, 6).unwrap().ranks, [6, 7]);
        assert_eq!(m.group(GroupKind::ExpertDp, 5).unwrap().ranks, [5, 7]);
        assert_eq!(m.group(GroupKind::ExpertDp, 0).unwrap().ranks, [0, 2]);
        for kind in [GroupKind::Ep, GroupKind::ExpertDp] {
            let mut seen = vec![0; m.world_size()];
            for r in 0..m.world_size() {
                let g = m.group(kind, r).unwrap();
                if g.ranks[0] == r {
                    g.ranks.iter().for_each(|&x| seen[x] += 1);
                    // Keys are unique among the groups of a kind.
                    let other = (0..m.world_size())
                        .map(|o| m.group(kind, o).unwrap())
                        .filter(|o| o.index == g.index)
                        .all(|o| o.ranks == g.ranks);
                    assert!(other, "{kind:?} {r}");
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{kind:?}");
        }
        let one = Mesh::new(2, 2, 2).unwrap();
        assert_eq!(one.group(GroupKind::Ep, 3).unwrap().ranks, [3]);
        assert_eq!(one.group(GroupKind::ExpertDp, 3).unwrap().ranks, [1, 3]);
    }

    #[test]
    fn an_expert_degree_that_does_not_fold_is_refused() {
        let e = Mesh::new(2, 1, 4).unwrap().with_ep(3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ep = 3 must divide dp = 4: expert parallelism folds over the data-parallel replicas"
        );
        // A mesh that skipped `with_ep` (a literal, or JSON) gets no group that crosses a
        // stage or names a rank that does not exist.
        let bad = Mesh {
            ep: 2,
            ..Mesh::new(2, 1, 3).unwrap()
        };
        let e = bad.group(GroupKind::Ep, 2).unwrap_err();
        assert!(
            e.to_string().starts_with("ep = 2 must divide dp = 3"),
            "{e}"
        );
        let json = serde_json::to_string(&Mesh::new(2, 1, 4).unwrap()).unwrap();
        assert_eq!(json, r#"{"pp":2,"tp":1,"dp":4}"#);
        let e = Mesh::new(2, 2, 2).unwrap().with_ep(2).unwrap_err();
        assert!(e.to_string().starts_with("ep = 2 needs tp = 1"), "{e}");
        assert!(Mesh::new(2, 2, 2).unwrap().with_ep(1).is_ok());
    }
}
