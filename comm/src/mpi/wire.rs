//! How a point-to-point message is named on the MPI wire: the MPI tag a [`Tag`] packs into
//! ([`TagLayout`]), and the header (the full tag and the shape) that travels before the
//! payload and is checked on arrival.

use std::os::raw::c_int;

use crate::{CommError, Direction, Tag};

/// How a [`Tag`] packs into an MPI tag: bit 0 tells header from payload, bit 1 the direction,
/// then the stage, the microbatch, and the low bits of the step in what is left below
/// `MPI_TAG_UB`. Messages of steps `2^step_bits` apart would share a tag; the executor has at
/// most two steps in flight between two ranks, and the header check catches any mix-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagLayout {
    stage_bits: u32,
    microbatch_bits: u32,
    step_bits: u32,
}

fn bits_for(count: u32) -> u32 {
    u32::BITS - count.saturating_sub(1).leading_zeros()
}

impl TagLayout {
    /// The layout for `stages` stages and `microbatches` microbatches under `tag_ub`.
    pub fn new(stages: u32, microbatches: u32, tag_ub: i32) -> Result<TagLayout, CommError> {
        let usable = u32::BITS - 1 - (tag_ub.max(0) as u32).leading_zeros();
        let (stage_bits, microbatch_bits) = (bits_for(stages), bits_for(microbatches));
        let fixed = 2 + stage_bits + microbatch_bits;
        if usable < fixed + 2 {
            return Err(CommError::Invalid(format!(
                "{stages} stages x {microbatches} microbatches do not fit this MPI's tags \
                 (MPI_TAG_UB = {tag_ub})"
            )));
        }
        Ok(TagLayout {
            stage_bits,
            microbatch_bits,
            step_bits: (usable - fixed).min(16),
        })
    }

    pub(super) fn encode(&self, tag: Tag, payload: bool) -> Result<c_int, CommError> {
        let fits = |v: u32, bits: u32| u64::from(v) < (1u64 << bits);
        if !fits(tag.stage, self.stage_bits) || !fits(tag.microbatch, self.microbatch_bits) {
            return Err(CommError::Invalid(format!(
                "{tag} is outside this run's stages or microbatches"
            )));
        }
        let step = tag.step & ((1u64 << self.step_bits) - 1);
        let mut v = step;
        v = (v << self.microbatch_bits) | u64::from(tag.microbatch);
        v = (v << self.stage_bits) | u64::from(tag.stage);
        v = (v << 1) | u64::from(tag.dir == Direction::Backward);
        v = (v << 1) | u64::from(payload);
        c_int::try_from(v).map_err(|_| CommError::Invalid(format!("tag of {tag} overflows")))
    }
}

/// The header announcing a tensor of `shape` for `tag`.
pub(super) fn header(tag: Tag, shape: &[usize]) -> Vec<u64> {
    let dir = u64::from(tag.dir == Direction::Backward);
    let mut h = vec![
        tag.step,
        dir,
        u64::from(tag.stage),
        u64::from(tag.microbatch),
        shape.len() as u64,
    ];
    h.extend(shape.iter().map(|&d| d as u64));
    h
}

/// The shape a header announces, after checking it is the message that was asked for.
pub(super) fn parse_header(h: &[u64], want: Tag, src: usize) -> Result<Vec<usize>, CommError> {
    let expect = header(want, &[]);
    if h.len() < 5 || h[..4] != expect[..4] || h.len() != 5 + h[4] as usize {
        return Err(CommError::Invalid(format!(
            "rank {src} sent a message that is not {want} (header {h:?}): the ranks disagree \
             on the timetable"
        )));
    }
    Ok(h[5..].iter().map(|&d| d as usize).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(step: u64, dir: Direction, stage: u32, microbatch: u32) -> Tag {
        Tag {
            step,
            dir,
            stage,
            microbatch,
        }
    }

    #[test]
    fn distinct_messages_get_distinct_tags_under_the_bound() {
        let l = TagLayout::new(8, 16, 32767).unwrap();
        let mut seen = std::collections::HashSet::new();
        for step in 0..4 {
            for dir in [Direction::Forward, Direction::Backward] {
                for stage in 0..8 {
                    for mb in 0..16 {
                        for payload in [false, true] {
                            let t = l.encode(tag(step, dir, stage, mb), payload).unwrap();
                            assert!((0..=32767).contains(&t));
                            assert!(seen.insert(t), "tag {t} reused");
                        }
                    }
                }
            }
        }
        assert!(l.encode(tag(0, Direction::Forward, 8, 0), false).is_err());
    }

    #[test]
    fn a_layout_that_cannot_fit_is_refused() {
        let e = TagLayout::new(1024, 4096, 32767).unwrap_err();
        assert!(e.to_string().contains("MPI_TAG_UB = 32767"), "{e}");
    }

    #[test]
    fn headers_round_trip_and_catch_a_wrong_message() {
        let t = tag(3, Direction::Backward, 1, 2);
        let h = header(t, &[2, 8]);
        assert_eq!(parse_header(&h, t, 1).unwrap(), [2, 8]);
        let other = tag(5, Direction::Backward, 1, 2);
        assert!(parse_header(&h, other, 1)
            .unwrap_err()
            .to_string()
            .contains("disagree"));
    }
}
