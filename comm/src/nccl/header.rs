//! The fixed-size header of an NCCL point-to-point message: the full tag, the payload's
//! element format and the shape, so the receiver can allocate before the payload arrives.

use pipewright_kernels::DType;

use crate::{CommError, Direction, Tag};

/// Most dimensions a point-to-point tensor may have (the header has a fixed size).
pub(super) const MAX_DIMS: usize = 8;
/// Header: step, direction, stage, microbatch, payload format, number of dimensions, the
/// dimensions.
pub(super) const HEADER: usize = 6 + MAX_DIMS;

/// A point-to-point header: the full tag, the payload's format (f32, or bf16 for a bf16
/// run's hand-offs) and the shape.
pub(super) fn encode(tag: Tag, wire: DType, shape: &[usize]) -> Result<[u64; HEADER], CommError> {
    if shape.len() > MAX_DIMS {
        return Err(CommError::Invalid(format!(
            "{tag}: {} dimensions, NCCL messages carry at most {MAX_DIMS}",
            shape.len()
        )));
    }
    let wire_code = match wire {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => {
            return Err(CommError::Invalid(format!(
                "{tag}: f16 is not an NCCL payload format here (f32 or bf16)"
            )))
        }
    };
    let mut h = [0u64; HEADER];
    h[0] = tag.step;
    h[1] = u64::from(tag.dir == Direction::Backward);
    h[2] = u64::from(tag.stage);
    h[3] = u64::from(tag.microbatch);
    h[4] = wire_code;
    h[5] = shape.len() as u64;
    for (slot, &d) in h[6..].iter_mut().zip(shape) {
        *slot = d as u64;
    }
    Ok(h)
}

/// The tag, payload format and shape of a received header.
pub(super) fn decode(h: &[u64]) -> Result<(Tag, DType, Vec<usize>), CommError> {
    let bad = || CommError::Invalid("malformed NCCL message header".into());
    if h.len() != HEADER || h[1] > 1 || h[4] > 1 || h[5] as usize > MAX_DIMS {
        return Err(bad());
    }
    let tag = Tag {
        step: h[0],
        dir: if h[1] == 0 {
            Direction::Forward
        } else {
            Direction::Backward
        },
        stage: u32::try_from(h[2]).map_err(|_| bad())?,
        microbatch: u32::try_from(h[3]).map_err(|_| bad())?,
    };
    let wire = if h[4] == 0 { DType::F32 } else { DType::BF16 };
    let shape = h[6..6 + h[5] as usize]
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    Ok((tag, wire, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_refuse_garbage() {
        let tag = Tag {
            step: 1 << 40,
            dir: Direction::Backward,
            stage: 3,
            microbatch: 7,
        };
        for wire in [DType::F32, DType::BF16] {
            let h = encode(tag, wire, &[2, 16, 64]).unwrap();
            assert_eq!(decode(&h).unwrap(), (tag, wire, vec![2, 16, 64]));
        }
        assert!(encode(tag, DType::F32, &[1; MAX_DIMS + 1]).is_err());
        assert!(encode(tag, DType::F16, &[1]).is_err());
        let h = encode(tag, DType::F32, &[2, 16, 64]).unwrap();
        let mut bad = h;
        bad[5] = 99;
        assert!(decode(&bad).is_err());
        let mut bad = h;
        bad[4] = 2;
        assert!(decode(&bad).is_err(), "an unknown payload format");
        assert!(decode(&h[..4]).is_err());
    }
}
