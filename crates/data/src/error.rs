//! The data layer's error type: every variant names the file and record a user must look at.

use std::fmt;
use std::path::PathBuf;

use crate::bar::BarError;
use crate::read::format_ts;

/// Where in a file a problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The whole file (its compression, its kind, what it holds).
    File,
    /// The file's header (DBN metadata).
    Header,
    /// A byte offset into a binary file's decompressed stream, where records cannot be counted
    /// (a record length that breaks the framing).
    Byte(u64),
    /// The n-th record of a binary file, counted from 1.
    Record(u64),
    /// A line of a text file, counted from 1 (the header is line 1 when present).
    Line(u64),
    /// A line of one member of an archive.
    Member {
        /// The member's name inside the archive.
        name: String,
        /// Line in that member, from 1.
        line: u64,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File => f.write_str("file"),
            Location::Header => f.write_str("file header"),
            Location::Byte(n) => write!(f, "byte {n}"),
            Location::Record(n) => write!(f, "record {n}"),
            Location::Line(n) => write!(f, "line {n}"),
            Location::Member { name, line } => write!(f, "member {name}, line {line}"),
        }
    }
}

/// Errors of foxhunt-data. Each carries what a user needs to find and fix the input.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file or directory could not be read.
    #[error("{}: cannot read: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error (part of the message, so not also a `source`).
        error: std::io::Error,
    },
    /// The file is not in the format expected (corrupt, truncated, bad compression, bad header).
    #[error("{}: {location}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// Where in it.
        location: Location,
        /// What is wrong.
        message: String,
    },
    /// A record parsed but its values are not a valid bar.
    #[error("{}: {location}: {symbol}: invalid bar: {problem}", path.display())]
    InvalidBar {
        /// The file.
        path: PathBuf,
        /// Where in it.
        location: Location,
        /// The contract's symbol.
        symbol: String,
        /// What is wrong with the bar.
        problem: BarError,
    },
    /// A bar the data-quality check finds implausible (see `read::outliers`).
    #[error(
        "{}: {location}: {symbol}: implausible bar: {message}; fix the data or pass --allow-outliers to keep it",
        path.display()
    )]
    Implausible {
        /// The file.
        path: PathBuf,
        /// Where in it.
        location: Location,
        /// The contract's symbol.
        symbol: String,
        /// What is implausible.
        message: String,
    },
    /// A contract's timestamps go backwards within a file.
    #[error(
        "{}: {location}: {symbol}: timestamp {} is before the previous bar's {}; bars must be in time order",
        path.display(), format_ts(*ts), format_ts(*previous)
    )]
    OutOfOrder {
        /// The file.
        path: PathBuf,
        /// Where in it.
        location: Location,
        /// The contract's symbol.
        symbol: String,
        /// The offending timestamp (ns UTC).
        ts: i64,
        /// The previous bar's timestamp (ns UTC).
        previous: i64,
    },
    /// Two bars of one contract have the same timestamp.
    #[error(
        "{}: {location}: {symbol}: duplicate bar at {} (first seen in {}, {})",
        path.display(), format_ts(*ts), first.0.display(), first.1
    )]
    Duplicate {
        /// The file with the second bar.
        path: PathBuf,
        /// Where in it.
        location: Location,
        /// The contract's symbol.
        symbol: String,
        /// The duplicated timestamp (ns UTC).
        ts: i64,
        /// The file with the first bar and where in it (boxed: errors stay small on the hot path).
        first: Box<(PathBuf, Location)>,
    },
    /// The requested symbol is not in the data.
    #[error("symbol {wanted} not found in {}; symbols present: {}", dir.display(), list_or_none(available))]
    UnknownSymbol {
        /// What the user asked for.
        wanted: String,
        /// The data directory or file.
        dir: PathBuf,
        /// Every symbol seen in the data.
        available: Vec<String>,
    },
    /// The selection matched no bars at all (no files, or files without bars).
    #[error("{}: {message}", dir.display())]
    Empty {
        /// The data directory or file.
        dir: PathBuf,
        /// What was looked for.
        message: String,
    },
    /// An option given by the user is not valid (time zone, symbol syntax, window plan...).
    #[error("{0}")]
    InvalidOption(String),
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(", ")
    }
}

/// Result alias for foxhunt-data.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// At most the first 40 characters of `text`, quoted, with how much more there is: how an error
/// quotes a user's bad input (a 200 MB line must not become a 200 MB message).
pub(crate) fn excerpt(text: &str) -> String {
    const MAX: usize = 40;
    match text.char_indices().nth(MAX) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes in all)", &text[..end], text.len()),
    }
}
