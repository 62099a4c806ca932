//! What loading found wrong: each problem with its subject and JSON pointer, all of them at once,
//! and the sink the loader collects them in.

use super::closure::escape_segment;
use std::fmt;
use std::path::PathBuf;

/// What a problem is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    /// The file as a whole (syntax, top-level keys).
    File,
    /// A tool, by the name written.
    Tool(String),
    /// A role, by the name written.
    Role(String),
    /// A provider, by the name written.
    Provider(String),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File => f.write_str("file"),
            Self::Tool(n) => write!(f, "tool {n}"),
            Self::Role(n) => write!(f, "role {n}"),
            Self::Provider(n) => write!(f, "provider {n}"),
        }
    }
}

/// One reason a registry was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file (or source name) it was found in.
    pub source: String,
    /// The tool, role or provider it is about.
    pub subject: Subject,
    /// JSON pointer inside the subject's definition (`""` is the whole definition).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(
            f,
            "{}: {} at {path}: {}",
            self.source, self.subject, self.message
        )
    }
}

/// Every problem found, one per line when displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "registry refused, {} problem(s):", self.0.len())?;
        for p in &self.0 {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

/// Why a registry did not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or folder could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// What was being read.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The registry broke rules; every problem is listed.
    #[error("{0}")]
    Invalid(Problems),
}

impl LoadError {
    /// The problems, when the registry was read but refused.
    pub fn problems(&self) -> &[Problem] {
        match self {
            Self::Io { .. } => &[],
            Self::Invalid(p) => &p.0,
        }
    }
}

/// Collects problems for one subject of one source.
pub(crate) struct Sink<'a> {
    pub(crate) problems: &'a mut Vec<Problem>,
    pub(crate) source: &'a str,
    pub(crate) subject: Subject,
}

impl Sink<'_> {
    pub(crate) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            source: self.source.to_string(),
            subject: self.subject.clone(),
            path: path.into(),
            message: message.into(),
        });
    }
}

pub(crate) fn ptr(base: &str, segment: &str) -> String {
    format!("{base}/{}", escape_segment(segment))
}
