//! What an order-matched transport (NCCL) needs from a timetable: its directed pipeline
//! links, a check that every link's messages are received in the order they are sent, and
//! the list of communicators a mesh needs, in one global order.
//!
//! NCCL has no tags: the k-th receive on a communicator takes the k-th send. The executor
//! sends in row order and posts receives in row order, so a timetable runs correctly over
//! NCCL exactly when, on every directed link, the sender's SEND order equals the receiver's
//! RECV order. A tagged transport would run a timetable that breaks this; NCCL would hand
//! microbatches to the wrong actions, so it is refused before the first step.

use std::collections::BTreeMap;

use pipewright_schedule::{Action, ActionKind, Timetable};

use crate::mesh::{Coord, GroupKind, Mesh};

/// A timetable that an order-matched transport cannot run, or a malformed plan entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("timetable: {0}")]
pub struct LinkError(pub String);

/// A directed pipeline link: messages from device `from` to device `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Link {
    /// Sending device.
    pub from: u32,
    /// Receiving device.
    pub to: u32,
}

/// A message's identity: the sending stage, whether it is an activation, the microbatch.
type MessageId = (u32, bool, u32);

/// The link and identity of a send or receive; `None` for other actions.
fn message(tt: &Timetable, a: Action) -> Option<(Link, MessageId)> {
    let other = a.counterpart()?;
    let device = |stage: u32| tt.stage_device.get(stage as usize).copied();
    let forward = matches!(a.kind, ActionKind::SendF | ActionKind::RecvF);
    let (sender, receiver) = match a.kind {
        ActionKind::SendF | ActionKind::SendB => (a.stage, other.stage),
        _ => (other.stage, a.stage),
    };
    let link = Link {
        from: device(sender)?,
        to: device(receiver)?,
    };
    Some((link, (sender, forward, a.microbatch)))
}

/// Per link, the sends (or the receives) in row order, with the action that does each.
fn per_link(tt: &Timetable, sends: bool) -> BTreeMap<Link, Vec<(MessageId, Action)>> {
    let wanted = |k: ActionKind| match k {
        ActionKind::SendF | ActionKind::SendB => sends,
        ActionKind::RecvF | ActionKind::RecvB => !sends,
        _ => false,
    };
    let mut out: BTreeMap<Link, Vec<(MessageId, Action)>> = BTreeMap::new();
    for a in tt.devices.iter().flatten().filter(|a| wanted(a.kind)) {
        if let Some((link, id)) = message(tt, *a) {
            out.entry(link).or_default().push((id, *a));
        }
    }
    out
}

/// Every directed link the lowered timetable sends over, sorted.
pub fn links(tt: &Timetable) -> Vec<Link> {
    per_link(tt, true).into_keys().collect()
}

/// Refuse a lowered timetable in which some link's receiver takes messages in another order
/// than its sender sends them, naming the link and the first message that differs.
pub fn check_link_order(tt: &Timetable) -> Result<(), LinkError> {
    let (sends, recvs) = (per_link(tt, true), per_link(tt, false));
    let mut all: Vec<Link> = sends.keys().chain(recvs.keys()).copied().collect();
    all.sort();
    all.dedup();
    for link in all {
        let s = sends.get(&link).map_or(&[][..], Vec::as_slice);
        let r = recvs.get(&link).map_or(&[][..], Vec::as_slice);
        let first_bad =
            (0..s.len().max(r.len())).find(|&k| s.get(k).map(|x| x.0) != r.get(k).map(|x| x.0));
        if let Some(k) = first_bad {
            let show =
                |x: Option<&(MessageId, Action)>| x.map_or("nothing".into(), |x| x.1.to_string());
            return Err(LinkError(format!(
                "NCCL matches messages by order, but on the link from device {} to device {} \
                 message {} is sent by {} and received by {} (their orders must be equal)",
                link.from,
                link.to,
                k + 1,
                show(s.get(k)),
                show(r.get(k)),
            )));
        }
    }
    Ok(())
}

/// One communicator of an NCCL run: a name that every rank derives alike, and its ranks in
/// NCCL rank order (the first makes the unique id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommSpec {
    /// Unique within the run, usable in a file name.
    pub name: String,
    /// Global ranks; position is the NCCL rank.
    pub ranks: Vec<usize>,
    /// What it carries.
    pub role: CommRole,
}

/// What one rank does in a communicator of the plan: its NCCL rank and, on a link, which
/// end it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Membership {
    /// This rank's position in [`CommSpec::ranks`] (its NCCL rank).
    pub position: usize,
    /// On a link: whether this rank sends, and the global rank at the other end. `None` for
    /// a group, whose size may be one (a one-rank world has no other end).
    pub link_end: Option<(bool, usize)>,
}

impl CommSpec {
    /// Where `rank` sits in this communicator; errors if it is not a member, or if a link
    /// does not join exactly two distinct ranks (so no rank count can index out of bounds).
    pub fn membership(&self, rank: usize) -> Result<Membership, LinkError> {
        let bad = |why: &str| LinkError(format!("NCCL plan: {}: {why}", self.name));
        let position = self
            .ranks
            .iter()
            .position(|&r| r == rank)
            .ok_or_else(|| bad(&format!("rank {rank} is not a member")))?;
        let link_end = match self.role {
            CommRole::Group(..) => None,
            CommRole::Headers(_) | CommRole::Payloads(_) => match self.ranks[..] {
                // Links list [sender, receiver].
                [from, to] if from != to => {
                    Some((position == 0, if position == 0 { to } else { from }))
                }
                _ => return Err(bad("a link must join two distinct ranks")),
            },
        };
        Ok(Membership { position, link_end })
    }
}

/// What a communicator of an NCCL run carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommRole {
    /// A mesh group's collectives.
    Group(GroupKind, usize),
    /// The headers (tag and shape) of one directed pipeline link between two ranks.
    Headers(Link),
    /// The payloads of that link.
    Payloads(Link),
}

/// Every communicator a run of `tt` on `mesh` needs, in one order that every rank computes
/// alike: creating them in this order (each rank skipping those it is not in) cannot
/// deadlock, since the first communicator not yet made always has all its ranks at it.
/// Groups of one rank need none, except the world (so a one-GPU run still runs NCCL). A link gets two communicators per `(tp, dp)` pair of ranks,
/// so a header can be received before its payload's size is known (see `comm::nccl`).
pub fn nccl_plan(mesh: &Mesh, tt: &Timetable) -> Vec<CommSpec> {
    let mut plan = Vec::new();
    for kind in [
        GroupKind::World,
        GroupKind::Pp,
        GroupKind::Dp,
        GroupKind::Tp,
    ] {
        let mut seen = std::collections::BTreeSet::new();
        for rank in 0..mesh.world_size() {
            let Ok(g) = mesh.group(kind, rank) else {
                continue;
            };
            let needed = g.size() > 1 || kind == GroupKind::World;
            if needed && seen.insert(g.index) {
                plan.push(CommSpec {
                    name: format!("{kind:?}{}", g.index).to_lowercase(),
                    ranks: g.ranks.clone(),
                    role: CommRole::Group(kind, g.index),
                });
            }
        }
    }
    for link in links(tt) {
        for (tp, dp) in (0..mesh.tp).flat_map(|t| (0..mesh.dp).map(move |d| (t, d))) {
            let rank = |pp: u32| {
                mesh.rank(Coord {
                    pp: pp as usize,
                    tp,
                    dp,
                })
            };
            let ranks = vec![rank(link.from), rank(link.to)];
            let name = format!("link{}to{}.tp{tp}.dp{dp}", link.from, link.to);
            plan.push(CommSpec {
                name: format!("{name}.headers"),
                ranks: ranks.clone(),
                role: CommRole::Headers(link),
            });
            plan.push(CommSpec {
                name: format!("{name}.payloads"),
                ranks,
                role: CommRole::Payloads(link),
            });
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::{generate, lower, ScheduleKind, ScheduleSpec};

    fn lowered(kind: ScheduleKind, p: u32, v: u32, m: u32) -> Timetable {
        lower(&generate(&ScheduleSpec::new(kind, p, v, m, None).unwrap())).unwrap()
    }

    #[test]
    fn generated_schedules_keep_link_order() {
        for (kind, v) in [
            (ScheduleKind::OneFOneB, 1),
            (ScheduleKind::GPipe, 1),
            (ScheduleKind::Interleaved1F1B, 2),
        ] {
            let tt = lowered(kind, 4, v, 8);
            check_link_order(&tt).unwrap();
            assert!(links(&tt).contains(&Link { from: 0, to: 1 }));
            assert!(links(&tt).contains(&Link { from: 1, to: 0 }));
        }
    }

    #[test]
    fn swapped_sends_are_refused_naming_the_link() {
        let mut tt = lowered(ScheduleKind::GPipe, 2, 1, 2);
        let row = &mut tt.devices[0];
        let pos = |row: &Vec<Action>, mb| {
            row.iter()
                .position(|a| a.kind == ActionKind::SendF && a.microbatch == mb)
                .unwrap()
        };
        // Send microbatch 0's activation after microbatch 1's.
        let send0 = row.remove(pos(row, 0));
        let at = pos(row, 1) + 1;
        row.insert(at, send0);
        let e = check_link_order(&tt).unwrap_err().to_string();
        assert!(e.contains("from device 0 to device 1"), "{e}");
        assert!(
            e.contains("message 1 is sent by 0SEND_F1 and received by 1RECV_F0"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    /// Every spec of the plan of every mesh up to 8 ranks, for each of its members: the
    /// rank counts the role needs (a group at least one rank, a link two distinct ones), so
    /// setting up communicators cannot index past a one-rank group (the bug of issue 12).
    #[test]
    fn every_mesh_plan_has_the_ranks_each_role_needs() {
        for (pp, tp, dp) in [
            (1, 1, 1),
            (1, 2, 1),
            (1, 1, 2),
            (2, 1, 1),
            (2, 2, 2),
            (4, 1, 2),
        ] {
            let mesh = Mesh::new(pp, tp, dp).unwrap();
            let tt = lowered(ScheduleKind::OneFOneB, pp as u32, 1, 4);
            let plan = nccl_plan(&mesh, &tt);
            assert!(plan
                .iter()
                .any(|c| matches!(c.role, CommRole::Group(GroupKind::World, 0))));
            for spec in &plan {
                assert!(!spec.ranks.is_empty(), "{spec:?}");
                for &rank in &spec.ranks {
                    let m = spec.membership(rank).unwrap();
                    assert_eq!(spec.ranks[m.position], rank);
                    match spec.role {
                        CommRole::Group(..) => assert_eq!(m.link_end, None),
                        _ => {
                            let (sending, other) = m.link_end.unwrap();
                            assert_eq!(spec.ranks.len(), 2, "{spec:?}");
                            assert_ne!(other, rank);
                            assert_eq!(sending, spec.ranks[0] == rank);
                        }
                    }
                }
            }
        }
        // The one-rank world is one one-rank communicator, and its member is rank 0.
        let plan = nccl_plan(
            &Mesh::new(1, 1, 1).unwrap(),
            &lowered(ScheduleKind::OneFOneB, 1, 1, 2),
        );
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].membership(0).unwrap().position, 0);
    }

    #[test]
    fn a_malformed_link_or_a_stranger_is_an_error_not_a_panic() {
        let link = Link { from: 0, to: 1 };
        let spec = |ranks: Vec<usize>| CommSpec {
            name: "link0to1.tp0.dp0.headers".into(),
            ranks,
            role: CommRole::Headers(link),
        };
        let e = spec(vec![3]).membership(3).unwrap_err().to_string();
        assert!(e.contains("a link must join two distinct ranks"), "{e}");
        assert!(spec(vec![3, 3]).membership(3).is_err());
        let e = spec(vec![0, 1]).membership(5).unwrap_err().to_string();
        assert!(e.contains("rank 5 is not a member"), "{e}");
    }

    #[test]
    fn the_plan_is_the_same_everywhere_and_covers_groups_and_links() {
        let mesh = Mesh::new(2, 2, 1).unwrap();
        let tt = lowered(ScheduleKind::OneFOneB, 2, 1, 4);
        let plan = nccl_plan(&mesh, &tt);
        assert_eq!(plan, nccl_plan(&mesh, &tt));
        let names: Vec<&str> = plan.iter().map(|c| c.name.as_str()).collect();
        assert!(names.contains(&"tp0") && names.contains(&"tp1") && names.contains(&"world0"));
        assert!(!names.iter().any(|n| n.starts_with("dp")), "{names:?}");
        // Two directions x two TP ranks x (headers, payloads).
        assert_eq!(names.iter().filter(|n| n.starts_with("link")).count(), 8);
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }
}
