//! What a user hands pipewright, read within this machine's limits, the same from every face
//! (the CLI and the Python package call this crate, so a file is refused in the same words
//! whichever reads it):
//! - [`read_text`]: a text file of at most [`MAX_INPUT`] bytes whose text and what is parsed
//!   from it fit this machine's memory; folders, devices and non-UTF-8 bytes refused; a
//!   byte-order mark dropped.
//! - [`FileKind`]: what a JSON file is, judged from its keys, so a file given where another
//!   kind is wanted is named for what it is.
//! - [`timeline_from_text`]: a timeline read and checked ([`Timeline::check`]) before
//!   anything is drawn or measured from it.
//! - [`machine_memory`], [`fits`] and [`timetable_fits`]: a request's estimate against this
//!   machine's memory.
//!
//! `pipewright-schedule` stays pure (no IO); the reading and the machine's figures live here.

use std::path::Path;

use pipewright_schedule::timeline::TimelineError;
use pipewright_schedule::{Timeline, Timetable};

mod kind;

pub use kind::{flag_hint, FileKind, Hint};

/// Largest file pipewright reads: far beyond any timetable, timeline, cost, cluster or
/// profile file it writes (a timeline of a million events is about 120 MB).
pub const MAX_INPUT: u64 = 1 << 30;

/// Bytes that reading a text costs per byte of it: the text, and what is parsed from it,
/// held at once.
pub const READ_FACTOR: u64 = 8;

/// Why an input is refused; each names the file (or what the text was called).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file system refused.
    #[error("cannot read {name}: {why}")]
    Cannot {
        /// The file.
        name: String,
        /// The system's words.
        why: String,
    },
    /// A folder where a file is wanted.
    #[error("{0} is a folder, not a file")]
    Folder(String),
    /// A device (such as /dev/zero) where a file is wanted.
    #[error("{0} is a device, not a file")]
    Device(String),
    /// More than [`MAX_INPUT`] bytes.
    #[error("{name} is {size}, more than the {limit} pipewright reads", limit = human(MAX_INPUT))]
    TooLarge {
        /// The file.
        name: String,
        /// Its size, for people.
        size: String,
    },
    /// A pipe that went on past [`MAX_INPUT`] bytes.
    #[error("{0} goes on past the {limit} pipewright reads", limit = human(MAX_INPUT))]
    GoesOn(String),
    /// Bytes that are not UTF-8.
    #[error("{name} is not a text file (not UTF-8 at byte {at})")]
    NotText {
        /// The file.
        name: String,
        /// The first byte that is not.
        at: usize,
    },
    /// More than this machine's memory.
    #[error("{what} needs about {need} of memory, more than this machine's {have}", need = human(*.need), have = human(*.have))]
    Memory {
        /// What needs it.
        what: String,
        /// Bytes needed.
        need: u64,
        /// Bytes this machine has.
        have: u64,
    },
    /// JSON of another kind than the one wanted; its hint is the CLI's
    /// ([`InputError::named`] writes another face's).
    #[error("{name} is {}, not {want}", .kind.describe())]
    WrongKind {
        /// The file.
        name: String,
        /// What it is.
        kind: FileKind,
        /// What was wanted, with its article.
        want: &'static str,
    },
    /// A sweep whose simulations together would run for longer than a sweep should.
    #[error("the sweep simulates {shapes} combinations of {total} stage-microbatches in all ({steps} steps each), more than the {SWEEP_WORK} a sweep takes (minutes here): narrow {narrow}")]
    SweepWork {
        /// Combinations in the grid.
        shapes: usize,
        /// Their stage-microbatches together.
        total: u64,
        /// Steps simulated per combination.
        steps: u64,
        /// What the user narrows, in their face's words (flags or keywords).
        narrow: &'static str,
    },
    /// Not a timeline's JSON.
    #[error("{name} is not a timeline JSON: {why}")]
    NotTimeline {
        /// The file.
        name: String,
        /// serde's words.
        why: String,
    },
    /// A timeline that contradicts itself.
    #[error("{name}: {error}")]
    Timeline {
        /// The file.
        name: String,
        /// Its first contradiction.
        error: TimelineError,
    },
}

impl InputError {
    /// The message with a wrong kind's hint written as `hint` writes it (Python's
    /// `read it with Costs.read`); every other message is its `Display`.
    pub fn named(&self, hint: kind::Hint<'_>) -> String {
        match self {
            InputError::WrongKind { name, kind, want } => {
                format!("{name} is {}, not {want}", kind.describe_named(hint))
            }
            e => e.to_string(),
        }
    }
}

/// Bytes for people: EiB down to KiB with two decimals, or bytes.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        n if n >= 1 << 60 => format!("{:.2} EiB", b / (1u64 << 60) as f64),
        n if n >= 1 << 50 => format!("{:.2} PiB", b / (1u64 << 50) as f64),
        n if n >= 1 << 40 => format!("{:.2} TiB", b / (1u64 << 40) as f64),
        n if n >= 1 << 30 => format!("{:.2} GiB", b / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{:.2} MiB", b / f64::from(1u32 << 20)),
        n if n >= 1 << 10 => format!("{:.2} KiB", b / 1024.0),
        n => format!("{n} B"),
    }
}

/// This machine's memory: the physical memory, or the control group's limit when lower.
pub fn machine_memory() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map(|kib| kib.saturating_mul(1024));
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    match (total, cgroup) {
        (Some(t), Some(c)) => t.min(c),
        (Some(t), None) => t,
        (None, Some(c)) => c,
        // Not Linux: assume a large machine rather than refuse what may fit.
        (None, None) => u64::MAX,
    }
}

/// Refuse `what` when it needs more than this machine's memory.
pub fn fits(what: &str, need: u64) -> Result<(), InputError> {
    let have = machine_memory();
    if need > have {
        return Err(InputError::Memory {
            what: what.to_string(),
            need,
            have,
        });
    }
    Ok(())
}

/// Bytes one stage-microbatch (its F and backward, their sends and receives) costs a face
/// that builds, validates and simulates a timetable and keeps its timeline: measured at
/// about 1 KiB (`simulate --timeline` at p = 64, m = 2048), doubled.
pub const PER_STAGE_MICROBATCH: u64 = 2048;

/// Refuse `steps` unfenced steps of `tt` whose simulation would not fit this machine (the
/// CLI's `simulate --steps` and `viz --steps`, Python's `simulate(steps=)`).
pub fn steps_fit(tt: &Timetable, steps: u32) -> Result<(), InputError> {
    let spm = u64::from(tt.num_stages()) * u64::from(tt.microbatches);
    timetable_fits(
        &format!("{steps} steps of {}", tt.name),
        spm,
        u64::from(steps),
    )
}

/// Refuse a timetable of `spm` stage-microbatches (p * v * m), `times` over (steps,
/// panels), called `what`, when simulating it would not fit this machine.
pub fn timetable_fits(what: &str, spm: u64, times: u64) -> Result<(), InputError> {
    let need = spm
        .saturating_mul(times.max(1))
        .saturating_mul(PER_STAGE_MICROBATCH);
    let times = if times > 1 {
        format!(" x {times}")
    } else {
        String::new()
    };
    fits(&format!("{what} ({spm} stage-microbatches{times})"), need)
}

/// Most stage-microbatch steps one sweep simulates: about two minutes on one core at the
/// simulator's rate of about 400,000 a second (`simulate` at p = 64, m = 2048).
pub const SWEEP_WORK: u64 = 1 << 26;

/// Refuse a sweep whose largest simulation this machine cannot hold, or whose simulations
/// together would run past [`SWEEP_WORK`]. `sizes` holds each combination's stage-microbatches
/// (p * v * m, `SweepGrid::stage_microbatches`), each simulated for `steps` steps; `narrow`
/// names what the user narrows (`--microbatches, --virtual or --schedules`, or Python's
/// keywords).
pub fn sweep_fits(sizes: &[u64], steps: u32, narrow: &'static str) -> Result<(), InputError> {
    let steps = u64::from(steps);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    timetable_fits("the sweep's largest combination", largest, steps)?;
    let total = sizes.iter().copied().fold(0u64, u64::saturating_add);
    if total.saturating_mul(steps) > SWEEP_WORK {
        return Err(InputError::SweepWork {
            shapes: sizes.len(),
            total,
            steps,
            narrow,
        });
    }
    Ok(())
}

/// Refuse a text of `len` bytes called `name` that pipewright would not read from a file:
/// more than [`MAX_INPUT`], or more than this machine holds once parsed.
pub fn text_fits(name: &str, len: u64) -> Result<(), InputError> {
    if len > MAX_INPUT {
        return Err(InputError::TooLarge {
            name: name.to_string(),
            size: human(len),
        });
    }
    fits(&format!("reading {name}"), len.saturating_mul(READ_FACTOR))
}

/// A text file's content without a UTF-8 byte-order mark; refused naming the file when it
/// cannot be read, is not text, is not a file (a folder, a device such as /dev/zero), or is
/// larger than [`MAX_INPUT`] (a pipe is read up to that much, then refused).
pub fn read_text(path: &Path) -> Result<String, InputError> {
    use std::io::Read;
    let name = path.display().to_string();
    let cannot = |e: std::io::Error| InputError::Cannot {
        name: name.clone(),
        why: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(cannot)?;
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err(InputError::Folder(name));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() || kind.is_block_device() || kind.is_socket() {
            return Err(InputError::Device(name));
        }
    }
    if meta.is_file() && meta.len() > MAX_INPUT {
        return Err(InputError::TooLarge {
            name,
            size: human(meta.len()),
        });
    }
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    file.take(MAX_INPUT + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_INPUT {
        return Err(InputError::GoesOn(name));
    }
    text_fits(&name, bytes.len() as u64)?;
    let text = String::from_utf8(bytes).map_err(|e| InputError::NotText {
        name: name.clone(),
        at: e.utf8_error().valid_up_to(),
    })?;
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    })
}

/// Refuse JSON text of another kind than `want`, naming what it is.
pub fn expect_kind(name: &str, text: &str, want: FileKind) -> Result<(), InputError> {
    match FileKind::of(text) {
        k if k == want || k == FileKind::OtherJson || k == FileKind::Text => Ok(()),
        kind => Err(InputError::WrongKind {
            name: name.to_string(),
            kind,
            want: want.with_article(),
        }),
    }
}

/// A timeline from its JSON text called `name` (`simulate --timeline`, `train --trace`,
/// `pipewright.torch`'s recorder): within the reading limits, of the timeline kind, and
/// checked as strictly as a timetable ([`Timeline::check`]) before anything is drawn or
/// measured from it.
pub fn timeline_from_text(name: &str, text: &str) -> Result<Timeline, InputError> {
    text_fits(name, text.len() as u64)?;
    expect_kind(name, text, FileKind::Timeline)?;
    let tl: Timeline = serde_json::from_str(text).map_err(|e| InputError::NotTimeline {
        name: name.to_string(),
        why: e.to_string(),
    })?;
    tl.check().map_err(|error| InputError::Timeline {
        name: name.to_string(),
        error,
    })?;
    Ok(tl)
}

/// A timeline file, read and checked as [`timeline_from_text`].
pub fn read_timeline(path: &Path) -> Result<Timeline, InputError> {
    let text = read_text(path)?;
    timeline_from_text(&path.display().to_string(), &text)
}

#[cfg(test)]
mod tests;
