//! Every problem found in a configuration file, each with its line.

use std::fmt;
use std::ops::Range;

/// One problem, located in the file when it can be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) line: Option<usize>,
    pub(crate) message: String,
}

/// Collects problems while a file is read, so that all of them are reported at once.
#[derive(Debug)]
pub(crate) struct Problems<'s> {
    src: &'s str,
    pub(crate) list: Vec<Problem>,
}

impl<'s> Problems<'s> {
    pub(crate) fn new(src: &'s str) -> Problems<'s> {
        Problems {
            src,
            list: Vec::new(),
        }
    }

    /// The 1-based line of a byte offset.
    pub(crate) fn line_of(&self, span: Option<Range<usize>>) -> Option<usize> {
        let start = span?.start.min(self.src.len());
        Some(
            self.src.as_bytes()[..start]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
                + 1,
        )
    }

    pub(crate) fn at(&mut self, span: Option<Range<usize>>, message: impl Into<String>) {
        let line = self.line_of(span);
        self.list.push(Problem {
            line,
            message: message.into(),
        });
    }

    pub(crate) fn at_line(&mut self, line: Option<usize>, message: impl Into<String>) {
        self.list.push(Problem {
            line,
            message: message.into(),
        });
    }
}

/// The configuration file could not be used; every problem is listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub(crate) file: String,
    pub(crate) problems: Vec<Problem>,
}

impl ConfigError {
    /// Each problem as (`file:line`, message).
    pub fn located(&self) -> Vec<(String, String)> {
        self.problems
            .iter()
            .map(|p| match p.line {
                Some(l) => (format!("{}:{l}", self.file), p.message.clone()),
                None => (self.file.clone(), p.message.clone()),
            })
            .collect()
    }

    /// `file:line: message` for each problem.
    pub fn lines(&self) -> Vec<String> {
        self.problems
            .iter()
            .map(|p| match p.line {
                Some(l) => format!("{}:{l}: {}", self.file, p.message),
                None => format!("{}: {}", self.file, p.message),
            })
            .collect()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        writeln!(
            f,
            "{} has {n} problem{}:",
            self.file,
            if n == 1 { "" } else { "s" }
        )?;
        for l in self.lines() {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// The closest of `candidates` to `word`, if close enough to be a likely typo.
pub(crate) fn suggest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (levenshtein(word, c), *c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let keys = ["coalesce", "max_wait", "workers"];
        assert_eq!(suggest("colaesce", &keys), Some("coalesce"));
        assert_eq!(suggest("maxwait", &keys), Some("max_wait"));
        assert_eq!(suggest("database", &keys), None);
    }

    #[test]
    fn lines_are_one_based() {
        let p = Problems::new("a\nb\nc");
        assert_eq!(p.line_of(Some(0..1)), Some(1));
        assert_eq!(p.line_of(Some(4..5)), Some(3));
    }
}
