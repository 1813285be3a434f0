//! What to generate: a raw spec as a user writes it, and the validated spec generators take.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The schedule families pipewright can generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScheduleKind {
    /// All forwards, then all backwards.
    #[serde(rename = "gpipe")]
    GPipe,
    /// Warm-up forwards, then one forward and one backward in turn.
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Megatron's interleaved 1F1B with `v` model chunks per device.
    #[serde(rename = "interleaved-1f1b")]
    Interleaved1F1B,
    /// Looped breadth-first: `v` chunks per device, every microbatch of a chunk before the next.
    #[serde(rename = "looped-bfs")]
    LoopedBfs,
    /// Zero-bubble H1: 1F1B's memory, weight gradients deferred into the bubbles.
    #[serde(rename = "zb-h1")]
    ZbH1,
    /// Zero-bubble H2: extra warm-up forwards and a deferred tail of weight gradients.
    #[serde(rename = "zb-h2")]
    ZbH2,
    /// Zero-bubble V: two chunks per device placed in a V, with split backwards.
    #[serde(rename = "zbv")]
    Zbv,
    /// DeepSeek's DualPipeV: a V of two chunks per device with forward-backward overlap.
    #[serde(rename = "dualpipev")]
    DualPipeV,
}

impl ScheduleKind {
    /// Every kind, in the order `--help` lists them.
    pub const ALL: [ScheduleKind; 8] = [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved1F1B,
        ScheduleKind::LoopedBfs,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbH2,
        ScheduleKind::Zbv,
        ScheduleKind::DualPipeV,
    ];

    /// The name used on the command line and in files.
    pub const fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::OneFOneB => "1f1b",
            ScheduleKind::Interleaved1F1B => "interleaved-1f1b",
            ScheduleKind::LoopedBfs => "looped-bfs",
            ScheduleKind::ZbH1 => "zb-h1",
            ScheduleKind::ZbH2 => "zb-h2",
            ScheduleKind::Zbv => "zbv",
            ScheduleKind::DualPipeV => "dualpipev",
        }
    }

    /// Whether the family places a free number `v` of chunks per device.
    pub const fn supports_virtual(self) -> bool {
        matches!(
            self,
            ScheduleKind::Interleaved1F1B | ScheduleKind::LoopedBfs
        )
    }

    /// The one `v` a family is defined for, if it is fixed: 2 for the V shapes.
    pub const fn fixed_virtual(self) -> Option<u32> {
        match self {
            ScheduleKind::Zbv | ScheduleKind::DualPipeV => Some(2),
            _ => None,
        }
    }

    /// How stages map to devices: "v" for the V shapes, "loop" otherwise.
    pub const fn placement(self) -> Placement {
        match self {
            ScheduleKind::Zbv | ScheduleKind::DualPipeV => Placement::V,
            _ => Placement::Loop,
        }
    }

    /// Names of all kinds, comma separated (for error messages).
    pub fn known_names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScheduleKind {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let want = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|k| k.name() == want)
            .ok_or_else(|| SpecError::UnknownSchedule(s.to_string()))
    }
}

/// How stages map to devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Stage `s` on device `s % p` (Megatron's interleaving).
    #[default]
    Loop,
    /// Zig-zag: stage `s` on device `s` for `s < p`, else `2p - 1 - s` (and so on for more chunks).
    V,
}

impl Placement {
    /// Device of stage `stage` with `p` devices.
    pub const fn device_of(self, stage: u32, p: u32) -> u32 {
        match self {
            Placement::Loop => stage % p,
            Placement::V => {
                let (chunk, r) = (stage / p, stage % p);
                if chunk % 2 == 0 {
                    r
                } else {
                    p - 1 - r
                }
            }
        }
    }
}

/// A schedule request as a user writes it: nothing checked yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpec {
    /// Schedule family name, e.g. `1f1b`.
    pub schedule: String,
    /// Pipeline devices `p` (pipeline-parallel size).
    #[serde(alias = "stages")]
    pub devices: u32,
    /// Model chunks per device `v`.
    #[serde(default = "one", rename = "virtual")]
    pub virtual_stages: u32,
    /// Microbatches per step `m`.
    pub microbatches: u32,
    /// Microbatch group size `g` of interleaved 1F1B (default `p`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u32>,
}

fn one() -> u32 {
    1
}

/// Most compute actions a spec may ask for: keeps indices in `u32` and memory sane.
pub const MAX_ACTIONS: u64 = 1 << 28;

/// Why a spec cannot be scheduled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The name is not a schedule family.
    #[error("unknown schedule `{0}` (known: {known})", known = ScheduleKind::known_names())]
    UnknownSchedule(String),
    /// A count is zero (its field: `p`, `v`, `m` or `group_size`).
    #[error("{}", self.named(str::to_string))]
    Zero(&'static str),
    /// `v > 1` asked of a family with one chunk per device.
    #[error("{}", self.named(str::to_string))]
    VirtualUnsupported {
        /// The family.
        kind: ScheduleKind,
        /// The `v` asked for.
        v: u32,
    },
    /// Interleaving needs the first microbatch back at device 0 before it runs dry.
    #[error("interleaved-1f1b with v={v} needs at least p={p} microbatches (got m={m}): with fewer, device 0 finishes its first chunk before any microbatch comes back around for the next one; use 1f1b, or m >= p")]
    TooFewMicrobatches {
        /// Devices.
        p: u32,
        /// Chunks per device.
        v: u32,
        /// Microbatches asked for.
        m: u32,
    },
    /// The group size is below `p`, so chunks would wait on the wrap-around.
    #[error("group size {g} is below p={p}: a group's next chunk would be due on device 0 before the group has come around the ring, and the interleaved order deadlocks; use a group size of at least p")]
    GroupTooSmall {
        /// Group size asked for.
        g: u32,
        /// Devices.
        p: u32,
    },
    /// A V-shaped family asked for a `v` other than 2.
    #[error("{}", self.named(str::to_string))]
    VShapeNeedsTwo {
        /// The family.
        kind: ScheduleKind,
        /// The `v` asked for.
        v: u32,
    },
    /// DualPipeV needs enough microbatches to fill both arms of the V before its steady phase.
    #[error("dualpipev needs m >= 2p = {need} microbatches (got m={m}): device 0 runs 2p-1 chunk-0 forwards before its first backward arrives, and the steady phase of overlapped forward-backward pairs starts only once every device holds a microbatch in each direction; with fewer, use zbv")]
    DualPipeTooFewMicrobatches {
        /// `2p`.
        need: u32,
        /// Microbatches asked for.
        m: u32,
    },
    /// `group_size` given to a family without groups.
    #[error("{}", self.named(str::to_string))]
    GroupSizeUnsupported(ScheduleKind),
    /// The timetable would be too large.
    #[error("p*v*m = {0} stage-microbatches is too many (limit {MAX_ACTIONS})")]
    TooLarge(u64),
}

impl SpecError {
    /// The message with each field (`p`, `v`, `m`, `group_size`) written as `name` writes it:
    /// the command line's `--stages`, or the field itself (`Display`, Python's keywords). A
    /// face that writes a count otherwise than its letter gets the letter beside it
    /// (`--stages (devices p)`), so the docs' p, v and m still find it.
    pub fn named(&self, name: impl Fn(&str) -> String) -> String {
        match self {
            SpecError::Zero(field) => {
                let written = name(field);
                let letter = match *field {
                    "p" => "devices p",
                    "v" => "chunks per device v",
                    "m" => "m",
                    _ => "",
                };
                if written == *field || letter.is_empty() {
                    format!("{written} must be at least 1")
                } else {
                    format!("{written} ({letter}) must be at least 1")
                }
            }
            SpecError::VirtualUnsupported { kind, v } => format!(
                "{kind} places one stage per device, so {} must be 1 (got {v}); use interleaved-1f1b or looped-bfs for v > 1",
                name("v")
            ),
            SpecError::VShapeNeedsTwo { kind, v } => format!(
                "{kind} places exactly two stages per device, in a V (stage s and 2p-1-s on device s), so {} must be 2 (got {v})",
                name("v")
            ),
            SpecError::GroupSizeUnsupported(kind) => format!(
                "{} applies to interleaved-1f1b only, not {kind}",
                name("group_size")
            ),
            e => e.to_string(),
        }
    }
}

/// A spec whose counts are known to be schedulable by its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ScheduleSpec {
    kind: ScheduleKind,
    p: u32,
    v: u32,
    m: u32,
    g: u32,
}

impl ScheduleSpec {
    /// Check a raw spec.
    pub fn from_raw(raw: &RawSpec) -> Result<Self, SpecError> {
        let kind: ScheduleKind = raw.schedule.parse()?;
        Self::new(
            kind,
            raw.devices,
            raw.virtual_stages,
            raw.microbatches,
            raw.group_size,
        )
    }

    /// Check counts for a family; `group_size` applies to interleaved 1F1B only.
    pub fn new(
        kind: ScheduleKind,
        p: u32,
        v: u32,
        m: u32,
        group_size: Option<u32>,
    ) -> Result<Self, SpecError> {
        for (value, field) in [(p, "p"), (v, "v"), (m, "m")] {
            if value == 0 {
                return Err(SpecError::Zero(field));
            }
        }
        let total = u64::from(p) * u64::from(v) * u64::from(m);
        if total > MAX_ACTIONS {
            return Err(SpecError::TooLarge(total));
        }
        match kind.fixed_virtual() {
            Some(fixed) if v != fixed => return Err(SpecError::VShapeNeedsTwo { kind, v }),
            Some(_) => {}
            None if v > 1 && !kind.supports_virtual() => {
                return Err(SpecError::VirtualUnsupported { kind, v })
            }
            None => {}
        }
        if kind == ScheduleKind::DualPipeV && m < 2 * p {
            return Err(SpecError::DualPipeTooFewMicrobatches { need: 2 * p, m });
        }
        if group_size.is_some() && kind != ScheduleKind::Interleaved1F1B {
            return Err(SpecError::GroupSizeUnsupported(kind));
        }
        if kind == ScheduleKind::Interleaved1F1B && v > 1 && m < p {
            return Err(SpecError::TooFewMicrobatches { p, v, m });
        }
        // A group larger than m is one group of m: clamp rather than reject.
        let g = group_size.unwrap_or(p).min(m);
        if g == 0 {
            return Err(SpecError::Zero("group_size"));
        }
        if kind == ScheduleKind::Interleaved1F1B && v > 1 && g < p {
            return Err(SpecError::GroupTooSmall { g, p });
        }
        Ok(ScheduleSpec { kind, p, v, m, g })
    }

    /// Family.
    pub const fn kind(&self) -> ScheduleKind {
        self.kind
    }
    /// Devices `p`.
    pub const fn devices(&self) -> u32 {
        self.p
    }
    /// Chunks per device `v`.
    pub const fn virtual_stages(&self) -> u32 {
        self.v
    }
    /// Stages `S = p * v`.
    pub const fn stages(&self) -> u32 {
        self.p * self.v
    }
    /// Microbatches `m`.
    pub const fn microbatches(&self) -> u32 {
        self.m
    }
    /// Microbatch group size `g` (interleaved 1F1B), clamped to `m`.
    pub const fn group_size(&self) -> u32 {
        self.g
    }
    /// Stage placement used by the family.
    pub const fn placement(&self) -> Placement {
        self.kind.placement()
    }
}

impl fmt::Display for ScheduleSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} p={} v={} m={}", self.kind, self.p, self.v, self.m)?;
        if self.kind == ScheduleKind::Interleaved1F1B && self.v > 1 {
            write!(f, " g={}", self.g)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec's refusal names its fields: the command line writes them as its flags, with the
    /// docs' letter beside a count it calls otherwise; Python's keywords are the fields.
    #[test]
    fn a_refusal_names_fields_each_face_writes_its_way() {
        let flag = |f: &str| match f {
            "p" => "--stages".to_string(),
            "v" => "--virtual".to_string(),
            "m" => "--microbatches".to_string(),
            f => format!("--{}", f.replace('_', "-")),
        };
        let cases = [
            (
                ScheduleSpec::new(ScheduleKind::OneFOneB, 0, 1, 4, None),
                "--stages (devices p) must be at least 1",
                "p must be at least 1",
            ),
            (
                ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 0, None),
                "--microbatches (m) must be at least 1",
                "m must be at least 1",
            ),
            (
                ScheduleSpec::new(ScheduleKind::GPipe, 2, 2, 4, None),
                "gpipe places one stage per device, so --virtual must be 1 (got 2); use interleaved-1f1b or looped-bfs for v > 1",
                "gpipe places one stage per device, so v must be 1 (got 2); use interleaved-1f1b or looped-bfs for v > 1",
            ),
            (
                ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 4, Some(2)),
                "--group-size applies to interleaved-1f1b only, not 1f1b",
                "group_size applies to interleaved-1f1b only, not 1f1b",
            ),
        ];
        for (spec, cli, fields) in cases {
            let e = spec.unwrap_err();
            assert_eq!(e.named(flag), cli);
            assert_eq!(e.to_string(), fields);
        }
    }
}
