//! Candidates a check refused: each is dropped from the search, never the whole plan, and
//! counted here by reason, so `--explain` can say how many went and why, and a plan that has
//! none left can name the commonest reason.

use serde::Serialize;

use super::config::Config;

/// Distinct reasons kept (the rest are only counted): the checks that can refuse a candidate
/// are few, and their messages differ only in the sizes they name.
const MAX_REASONS: usize = 16;

/// One reason, how many candidates it refused, and the first of them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reason {
    /// The check's message.
    pub message: String,
    /// Candidates it refused.
    pub count: usize,
    /// The first it refused.
    pub example: Config,
}

/// Refused candidates, by reason.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Refusals {
    /// Candidates refused in all.
    pub total: usize,
    /// Reasons, in the order first seen (at most [`MAX_REASONS`]).
    pub reasons: Vec<Reason>,
}

impl Refusals {
    /// Count `cfg` as refused with `message`.
    pub fn note(&mut self, cfg: &Config, message: impl std::fmt::Display) {
        self.total += 1;
        let message = message.to_string();
        if let Some(r) = self.reasons.iter_mut().find(|r| r.message == message) {
            r.count += 1;
        } else if self.reasons.len() < MAX_REASONS {
            self.reasons.push(Reason {
                message,
                count: 1,
                example: *cfg,
            });
        }
    }

    /// The reason that refused the most candidates (the first seen among equals).
    pub fn most_common(&self) -> Option<&Reason> {
        self.reasons.iter().rev().max_by_key(|r| r.count)
    }

    /// One line: how many were refused and the commonest reason; `None` when none was.
    pub fn line(&self) -> Option<String> {
        let r = self.most_common()?;
        let others = if self.reasons.len() > 1 {
            format!(" ({} other reasons)", self.reasons.len() - 1)
        } else {
            String::new()
        };
        Some(format!(
            "{} candidate configuration{} refused by a check and dropped; most often ({} of them): {} (e.g. {}){others}",
            self.total,
            if self.total == 1 { " was" } else { "s were" },
            r.count,
            r.message,
            r.example
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewright_schedule::recompute::Recompute;
    use pipewright_schedule::spec::ScheduleKind;

    fn cfg(tp: u32) -> Config {
        Config {
            tp,
            pp: 2,
            dp: 1,
            v: 1,
            microbatch_size: 1,
            microbatches: 4,
            schedule: ScheduleKind::OneFOneB,
            recompute: Recompute::None,
            recompute_devices: 2,
            zero: 0,
            sequence_parallel: true,
            ep: 1,
            etp: 1,
        }
    }

    #[test]
    fn the_commonest_reason_is_named_with_its_count_and_first_example() {
        let mut r = Refusals::default();
        assert_eq!(r.line(), None);
        r.note(&cfg(1), "a");
        r.note(&cfg(2), "b");
        r.note(&cfg(4), "b");
        let line = r.line().unwrap();
        assert!(
            line.starts_with("3 candidate configurations were refused"),
            "{line}"
        );
        assert!(line.contains("(2 of them): b (e.g. tp 2 "), "{line}");
        assert!(line.ends_with("(1 other reasons)"), "{line}");
    }
}
