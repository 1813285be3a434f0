//! Training data the project generates itself: arithmetic progressions modulo the vocabulary.
//!
//! Each sequence starts at a random token and steps by a random stride; after two tokens the
//! rest is determined, so a small GPT learns it in a few dozen steps and the loss falls far
//! below its starting `ln(vocab)`. Every sequence is a pure function of (seed, step, index).

/// One microbatch of the reference GPT's data: the GPT module's
/// [`Data`](crate::StageModule::Data).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenBatch {
    /// Input token ids (`batch * seq`), read by the first stage.
    pub tokens: Vec<u32>,
    /// Target ids, read by the last stage.
    pub targets: Vec<u32>,
}

/// Deterministic 64-bit mixer (SplitMix64).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `batch` sequences of `seq` tokens (and their next-token targets) for global microbatch
/// `index` of training step `step`.
pub fn progression_batch(
    seed: u64,
    step: u64,
    index: u64,
    batch: usize,
    seq: usize,
    vocab: usize,
) -> (Vec<u32>, Vec<u32>) {
    let vocab = vocab.max(2) as u64;
    let mut tokens = Vec::with_capacity(batch * seq);
    let mut targets = Vec::with_capacity(batch * seq);
    for b in 0..batch as u64 {
        let h = mix(mix(mix(seed) ^ step) ^ mix(index.wrapping_mul(1 << 20) ^ b));
        let start = h % vocab;
        let stride = 1 + (h >> 32) % (vocab - 1).min(7);
        for i in 0..seq as u64 {
            tokens.push(((start + i * stride) % vocab) as u32);
            targets.push(((start + (i + 1) * stride) % vocab) as u32);
        }
    }
    (tokens, targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_are_progressions_and_targets_are_the_next_token() {
        let (t, y) = progression_batch(1, 2, 3, 4, 8, 50);
        assert_eq!(t.len(), 32);
        for s in 0..4 {
            let row = &t[s * 8..s * 8 + 8];
            let d = (row[1] + 50 - row[0]) % 50;
            assert!(row.windows(2).all(|w| (w[1] + 50 - w[0]) % 50 == d));
            assert_eq!(&t[s * 8 + 1..s * 8 + 8], &y[s * 8..s * 8 + 7]);
        }
        assert_eq!(progression_batch(1, 2, 3, 4, 8, 50), (t, y));
        assert_ne!(
            progression_batch(1, 2, 4, 4, 8, 50).0,
            progression_batch(1, 2, 3, 4, 8, 50).0
        );
    }
}
