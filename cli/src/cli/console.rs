//! Standard output and standard error without panics.
//!
//! `println!` panics when its write fails: a reader that went away (`pipewright schedule |
//! head`) or a full disk (`> /dev/full`). Every line the binary prints goes through
//! [`print`] instead: a closed pipe becomes [`ClosedPipe`], which `main` ends on quietly
//! with exit 0 as Unix tools do; any other failure is one `error:` line. Notes on stderr go
//! through [`note`], which never fails: there is nowhere left to report that.

use std::io::Write;

use anyhow::{anyhow, Result};

/// The reader of standard output went away: stop, quietly.
#[derive(Debug)]
pub struct ClosedPipe;

impl std::fmt::Display for ClosedPipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for ClosedPipe {}

/// Write `text` to standard output and flush it.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => anyhow!(ClosedPipe),
            _ => anyhow!("cannot write to standard output: {e}"),
        })
}

/// Write `text` and a newline to standard output.
pub fn println(text: &str) -> Result<()> {
    print(&format!("{text}\n"))
}

/// Whether an error is standard output's reader going away.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<ClosedPipe>())
}

/// A line on standard error (a note, a warning, `wrote FILE`), in one write so that lines of
/// several processes do not interleave; a failure is ignored.
pub fn note(text: &str) {
    let _ = std::io::stderr().write_all(format!("{text}\n").as_bytes());
}

/// Prints lines one by one, remembering the first failure instead of stopping: for a
/// callback that cannot return an error (`train`'s per-step lines). After a failure it
/// prints nothing more.
#[derive(Default)]
pub struct Lines {
    failed: Option<anyhow::Error>,
}

impl Lines {
    /// Print `text` and a newline unless an earlier line failed.
    pub fn line(&mut self, text: &str) {
        if self.failed.is_none() {
            self.failed = println(text).err();
        }
    }

    /// Print the line `text` makes, or remember why it could not be made.
    pub fn try_line<E: Into<anyhow::Error>>(&mut self, text: Result<String, E>) {
        match text {
            Ok(t) => self.line(&t),
            Err(e) => {
                self.failed.get_or_insert(e.into());
            }
        }
    }

    /// The first failure, if any.
    pub fn finish(self) -> Result<()> {
        self.failed.map_or(Ok(()), Err)
    }
}

/// Longest word an error line repeats whole; a longer one (a 20 MB cell of a file) is cut.
const LONGEST_WORD: usize = 300;

/// An error as one line: its causes outermost first, joined by `: `, each line break a
/// space, and every word longer than [`LONGEST_WORD`] characters cut to its start and end
/// with its length between, so that an error quoting a huge token stays readable.
pub fn one_line(e: &anyhow::Error) -> String {
    let chain: Vec<String> = e.chain().map(ToString::to_string).collect();
    words_cut(&chain.join(": ").replace(['\n', '\r'], " "))
}

/// `text` with every word longer than [`LONGEST_WORD`] characters cut.
pub fn words_cut(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(4096));
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out += &shorten(word);
    }
    out
}

/// `word`, or its first and last characters with how many there are between.
fn shorten(word: &str) -> String {
    let n = word.chars().count();
    if n <= LONGEST_WORD {
        return word.to_string();
    }
    let head: String = word.chars().take(100).collect();
    let tail: String = word.chars().skip(n - 40).collect();
    format!("{head}...({} characters)...{tail}", n - 140)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_word_is_cut_and_the_rest_kept() {
        let token = "7".repeat(20_000_000);
        let e = anyhow!("x.csv: line 1, column 1: `{token}` is not an action");
        let line = one_line(&e);
        assert!(line.len() < 300, "{}", line.len());
        assert!(line.starts_with("x.csv: line 1, column 1: `777"), "{line}");
        assert!(line.contains("(19999862 characters)") && line.ends_with("is not an action"));
        let short = anyhow!("a\nb").context("outer");
        assert_eq!(one_line(&short), "outer: a b");
    }
}
