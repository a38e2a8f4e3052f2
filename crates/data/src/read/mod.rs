//! Reading bars from files: DBN (plain or zstd), CSV (Databento export or generic OHLCV) and
//! QuantConnect Lean minute zips, many files per directory, merged in time and validated.

mod csv;
mod dbn;
mod lean;
mod timestamp;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use jiff::tz::TimeZone;
use serde::Serialize;

use crate::bar::Bar;
use crate::error::{DataError, Location, Result};
use crate::symbol::SymbolSelector;

pub use timestamp::{format_ts, parse_time_zone};

/// File formats foxhunt reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Decide per file from its name: `.dbn`, `.dbn.zst`; `.csv`, `.csv.gz`, `.csv.zst`; `.zip`.
    #[default]
    Auto,
    /// Databento Binary Encoding, plain or zstd.
    Dbn,
    /// Databento CSV export or generic OHLCV CSV, plain, gzip or zstd.
    Csv,
    /// QuantConnect Lean futures minute zips (`YYYYMMDD_trade.zip`, one CSV per expiry).
    Lean,
}

/// What a CSV timestamp marks; DBN and Lean bars are always stamped at their start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum BarTime {
    /// The timestamp is the bar's open (Databento's and Lean's convention).
    #[default]
    Start,
    /// The timestamp is the bar's close; foxhunt subtracts the bar length.
    End,
}

/// How to read files.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// File format, `Auto` by default.
    pub format: Format,
    /// Time zone of timestamps without an offset (CSV date-times, Lean files). Default UTC.
    pub tz: TimeZone,
    /// What CSV timestamps mark. Default `Start`.
    pub bar_time: BarTime,
    /// Bar length in seconds. Turns CSV bar-end stamps into bar-start, and picks which DBN files
    /// of a directory are read (ohlcv-1m for 60): bars of different lengths never mix. Default 60.
    pub bar_seconds: i64,
    /// Keep bars the data-quality check finds implausible ([`outliers`]), listing them in the
    /// load's notes, instead of refusing the data. Default false.
    pub allow_outliers: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            format: Format::Auto,
            tz: TimeZone::UTC,
            bar_time: BarTime::Start,
            bar_seconds: 60,
            allow_outliers: false,
        }
    }
}

/// The bars of one contract, strictly increasing in time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContractSeries {
    /// Raw symbol (`ESZ3`), or `ROOT.FUT#<instrument id>` for parent-symbology DBN files.
    pub symbol: String,
    /// Bars, strictly increasing `ts`.
    pub bars: Vec<Bar>,
}

/// Everything read for one selection.
#[derive(Debug, Clone, Serialize)]
pub struct RawData {
    /// The directory or file that was read.
    pub source: PathBuf,
    /// Files read, in the order read.
    pub files: Vec<PathBuf>,
    /// Files of the directory not read, each with the reason (name matches no format asked
    /// for, or a DBN file of a schema without bars, such as definitions or trades).
    pub skipped_files: Vec<(PathBuf, String)>,
    /// What was read past without failing, per file: records of types that carry no bars
    /// (counted by type), in the order read.
    pub notes: Vec<(PathBuf, String)>,
    /// Every symbol present in the files, selected or not, sorted.
    pub available: Vec<String>,
    /// The selected contracts, sorted by symbol.
    pub contracts: Vec<ContractSeries>,
}

impl RawData {
    /// Total number of bars over all selected contracts.
    pub fn bar_count(&self) -> usize {
        self.contracts.iter().map(|c| c.bars.len()).sum()
    }
}

/// Reads every file of `path` (a directory, not recursive, or one file) and returns the selected
/// contracts' bars, validated, merged across files in time, with duplicates rejected.
pub fn load_path(path: &Path, selector: &SymbolSelector, opts: &LoadOptions) -> Result<RawData> {
    let io_err = |error| DataError::Io {
        path: path.to_path_buf(),
        error,
    };
    let meta = std::fs::metadata(path).map_err(io_err)?;
    let mut candidates = Vec::new();
    let mut skipped = Vec::new();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            // Symbolic links are followed (metadata, not the entry's own type); a link that
            // loops or points nowhere cannot be followed and is listed with the reason.
            let file = entry.path();
            match std::fs::metadata(&file) {
                Ok(m) if m.is_file() => candidates.push(file),
                Ok(m) if m.is_dir() => skipped.push((
                    file,
                    "a directory (the data directory's subdirectories are not read)".to_owned(),
                )),
                Ok(_) => skipped.push((file, "not a regular file".to_owned())),
                Err(e) => skipped.push((file, format!("cannot be followed or read: {e}"))),
            }
        }
        // Name order is time order for Databento and Lean daily files; it also makes runs
        // reproducible whatever order the file system lists entries in.
        candidates.sort();
    } else {
        candidates.push(path.to_path_buf());
    }
    let mut to_read = Vec::with_capacity(candidates.len());
    for file in candidates {
        match format_of(&file, opts.format) {
            Some(format) => to_read.push((file, format)),
            None => skipped.push((
                file,
                "not a data file name (.dbn, .dbn.zst, .csv[.gz|.zst], .zip)".to_owned(),
            )),
        }
    }
    // Files are independent: decode them in parallel (a year of daily files uses every core),
    // each into its own collector, then merge in name order. The result, and which error is
    // reported when several files are bad (the first in name order), are those of reading the
    // files one after another.
    use rayon::prelude::*;
    let decoded: Vec<Result<(PathBuf, Outcome, Collector<'_>)>> = to_read
        .into_par_iter()
        .map(|(file, format)| {
            let bytes = std::fs::read(&file).map_err(|error| DataError::Io {
                path: file.clone(),
                error,
            })?;
            let mut c = Collector::new(selector);
            let outcome = read_bytes(&file, &bytes, format, opts, &mut c)?;
            Ok((file, outcome, c))
        })
        .collect();
    let mut collector = Collector::new(selector);
    for result in decoded {
        let (file, outcome, c) = result?;
        match outcome {
            Outcome::Read => collector.absorb(c),
            // A directory may hold definitions, trades or other bar sizes beside the bars: skip
            // those; a file named on its own must hold the bars asked for.
            Outcome::Skipped(reason) if meta.is_dir() => skipped.push((file, reason)),
            Outcome::Skipped(reason) => {
                return Err(DataError::Format {
                    path: file,
                    location: Location::File,
                    message: reason,
                });
            }
        }
    }
    skipped.sort();
    let mut data = collector
        .finish(path, opts.allow_outliers)
        .map_err(|e| match e {
            // Nothing read is clearer with what was passed over, and why.
            DataError::Empty { dir, message } if !skipped.is_empty() => {
                // Grouped by reason, with one file as an example: a year of daily files of another
                // bar size is one line, not 250.
                let mut reasons: Vec<(&str, usize, &Path)> = Vec::new();
                for (f, why) in &skipped {
                    match reasons.iter_mut().find(|r| r.0 == why) {
                        Some(r) => r.1 += 1,
                        None => reasons.push((why, 1, f)),
                    }
                }
                let listed: Vec<String> = reasons
                    .iter()
                    .map(|(why, n, f)| match n {
                        1 => format!("{}: {why}", f.display()),
                        n => format!("{n} files ({} and others): {why}", f.display()),
                    })
                    .collect();
                DataError::Empty {
                    dir,
                    message: format!("{message}; not read: {}", listed.join("; ")),
                }
            }
            e => e,
        })?;
    data.skipped_files = skipped;
    Ok(data)
}

/// Parses one file already in memory; `name` picks the format when `opts.format` is `Auto` and
/// names the file in errors. The fuzz targets call this.
pub fn load_bytes(
    name: &Path,
    bytes: &[u8],
    selector: &SymbolSelector,
    opts: &LoadOptions,
) -> Result<RawData> {
    let format = format_of(name, opts.format).ok_or_else(|| DataError::Format {
        path: name.to_path_buf(),
        location: Location::File,
        message: "cannot tell the format from the file name; pass --format".into(),
    })?;
    let mut collector = Collector::new(selector);
    if let Outcome::Skipped(message) = read_bytes(name, bytes, format, opts, &mut collector)? {
        return Err(DataError::Format {
            path: name.to_path_buf(),
            location: Location::File,
            message,
        });
    }
    collector.finish(name, opts.allow_outliers)
}

fn read_bytes(
    path: &Path,
    bytes: &[u8],
    format: Format,
    opts: &LoadOptions,
    collector: &mut Collector<'_>,
) -> Result<Outcome> {
    collector.files.push(path.to_path_buf());
    match format {
        Format::Dbn => dbn::read(path, bytes, opts.bar_seconds, collector),
        Format::Csv => csv::read(path, bytes, opts, collector),
        Format::Lean => lean::read(path, bytes, opts, collector),
        Format::Auto => unreachable!("format_of resolves Auto"),
    }
}

/// What reading one file gave.
pub(crate) enum Outcome {
    /// Its bars (if any were selected) are in the collector.
    Read,
    /// A valid file without the bars asked for (a DBN file of another schema or bar size), and why.
    Skipped(String),
}

/// The format a file is read as, or `None` to skip it.
fn format_of(path: &Path, wanted: Format) -> Option<Format> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let by_name = if name.ends_with(".dbn") || name.ends_with(".dbn.zst") {
        Format::Dbn
    } else if [".csv", ".csv.gz", ".csv.zst", ".txt.gz"]
        .iter()
        .any(|e| name.ends_with(e))
    {
        Format::Csv
    } else if name.ends_with(".zip") {
        Format::Lean
    } else {
        return None;
    };
    (wanted == Format::Auto || wanted == by_name).then_some(by_name)
}

/// One contract's bars as read, with where each came from (kept until duplicates are checked).
/// Sources are read one after another, so each source's bars form one run of indices: a run
/// list plus a 4-byte position per bar is all the provenance needs.
#[derive(Default)]
struct Accumulator {
    bars: Vec<Bar>,
    positions: Vec<u32>,
    /// (source, index of its first bar), in increasing index order.
    runs: Vec<(u32, usize)>,
    /// Last timestamp per source, to catch out-of-order bars within one file.
    last: Option<(u32, i64)>,
}

impl Accumulator {
    fn provenance(&self, index: usize) -> (u32, u64) {
        let run = self.runs.partition_point(|&(_, start)| start <= index) - 1;
        (self.runs[run].0, u64::from(self.positions[index]))
    }
}

/// A source is a file or one member of an archive; `member` is its name inside the archive.
struct Source {
    path: PathBuf,
    member: Option<String>,
    binary: bool,
}

impl Source {
    fn location(&self, position: u64) -> Location {
        match (&self.member, self.binary) {
            _ if position == 0 => Location::File,
            (Some(name), _) => Location::Member {
                name: name.clone(),
                line: position,
            },
            (None, true) => Location::Record(position),
            (None, false) => Location::Line(position),
        }
    }
}

/// Gathers the bars of selected symbols from many sources.
pub(crate) struct Collector<'a> {
    selector: &'a SymbolSelector,
    files: Vec<PathBuf>,
    sources: Vec<Source>,
    slots: Vec<(String, Accumulator)>,
    slot_of: HashMap<String, Option<usize>>,
    notes: Vec<(PathBuf, String)>,
}

impl<'a> Collector<'a> {
    fn new(selector: &'a SymbolSelector) -> Self {
        Self {
            selector,
            files: Vec::new(),
            sources: Vec::new(),
            slots: Vec::new(),
            slot_of: HashMap::new(),
            notes: Vec::new(),
        }
    }

    /// Records something read past without failing (see [`RawData::notes`]).
    pub(crate) fn note(&mut self, path: &Path, message: String) {
        self.notes.push((path.to_path_buf(), message));
    }

    /// Registers a source and returns its id for [`Collector::push`].
    pub(crate) fn source(&mut self, path: &Path, member: Option<String>, binary: bool) -> u32 {
        self.sources.push(Source {
            path: path.to_path_buf(),
            member,
            binary,
        });
        u32::try_from(self.sources.len() - 1).expect("fewer than 4 billion sources")
    }

    /// The slot for `symbol` if it is selected; records the symbol as seen either way.
    pub(crate) fn slot(&mut self, symbol: &str) -> Option<usize> {
        if let Some(slot) = self.slot_of.get(symbol) {
            return *slot;
        }
        let slot = self.selector.matches(symbol).then(|| {
            self.slots.push((symbol.to_owned(), Accumulator::default()));
            self.slots.len() - 1
        });
        self.slot_of.insert(symbol.to_owned(), slot);
        slot
    }

    /// Adds a validated bar to a slot; rejects a bar older than the previous one of the same
    /// source and contract.
    pub(crate) fn push(&mut self, slot: usize, source: u32, position: u64, bar: Bar) -> Result<()> {
        let (symbol, acc) = &mut self.slots[slot];
        if let Some((last_source, last_ts)) = acc.last
            && last_source == source
            && bar.ts() < last_ts
        {
            let src = &self.sources[source as usize];
            return Err(DataError::OutOfOrder {
                path: src.path.clone(),
                location: src.location(position),
                symbol: symbol.clone(),
                ts: bar.ts(),
                previous: last_ts,
            });
        }
        if acc.last.is_none_or(|(s, _)| s != source) {
            acc.runs.push((source, acc.bars.len()));
        }
        acc.last = Some((source, bar.ts()));
        acc.bars.push(bar);
        // Positions past 4 billion saturate: such a file is far beyond any bar file.
        acc.positions
            .push(u32::try_from(position).unwrap_or(u32::MAX));
        Ok(())
    }

    /// Appends everything `other` read (its files come after this one's).
    fn absorb(&mut self, other: Collector<'_>) {
        let base = u32::try_from(self.sources.len()).expect("fewer than 4 billion sources");
        self.files.extend(other.files);
        self.sources.extend(other.sources);
        self.notes.extend(other.notes);
        for symbol in other.slot_of.keys() {
            self.slot(symbol); // records the symbol as available, selected or not
        }
        for (symbol, acc) in other.slots {
            let slot = self
                .slot(&symbol)
                .expect("a symbol selected in one file is selected in all");
            let dst = &mut self.slots[slot].1;
            for (k, &(source, start)) in acc.runs.iter().enumerate() {
                let end = acc.runs.get(k + 1).map_or(acc.bars.len(), |r| r.1);
                dst.runs.push((source + base, dst.bars.len()));
                dst.bars.extend_from_slice(&acc.bars[start..end]);
                dst.positions.extend_from_slice(&acc.positions[start..end]);
            }
            dst.last = acc.last.map(|(source, ts)| (source + base, ts));
        }
    }

    /// The error for a record whose values do not make a bar.
    pub(crate) fn invalid_bar(
        &self,
        source: u32,
        position: u64,
        symbol: &str,
        problem: crate::BarError,
    ) -> DataError {
        let src = &self.sources[source as usize];
        DataError::InvalidBar {
            path: src.path.clone(),
            location: src.location(position),
            symbol: symbol.to_owned(),
            problem,
        }
    }

    /// A format error at a position of a source.
    pub(crate) fn format_error(&self, source: u32, position: u64, message: String) -> DataError {
        let src = &self.sources[source as usize];
        DataError::Format {
            path: src.path.clone(),
            location: src.location(position),
            message,
        }
    }

    fn finish(mut self, root: &Path, allow_outliers: bool) -> Result<RawData> {
        let available: Vec<String> = self
            .slot_of
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if self.slots.is_empty() {
            if available.is_empty() {
                return Err(DataError::Empty {
                    dir: root.to_path_buf(),
                    message: format!(
                        "no bars found ({} file(s) read); expected .dbn, .dbn.zst, .csv, .csv.gz, .csv.zst or Lean .zip files",
                        self.files.len()
                    ),
                });
            }
            return Err(DataError::UnknownSymbol {
                wanted: self.selector.to_string(),
                dir: root.to_path_buf(),
                available,
            });
        }
        let mut contracts = Vec::with_capacity(self.slots.len());
        for (symbol, acc) in std::mem::take(&mut self.slots) {
            let order = merge_sorted(&self.sources, &symbol, &acc)?;
            let bars: Vec<Bar> = order.iter().map(|&i| acc.bars[i]).collect();
            let found = outliers(&bars);
            if let Some(first) = found.first() {
                let (source, position) = acc.provenance(order[first.row]);
                let src = &self.sources[source as usize];
                if !allow_outliers {
                    return Err(DataError::Implausible {
                        path: src.path.clone(),
                        location: src.location(position),
                        symbol,
                        message: format!("{} ({} such bars in all)", first.why, found.len()),
                    });
                }
                let note = format!(
                    "{symbol}: {} implausible bars kept (--allow-outliers), the first at {}: {}",
                    found.len(),
                    src.location(position),
                    first.why
                );
                let path = src.path.clone();
                self.notes.push((path, note));
            }
            contracts.push(ContractSeries { symbol, bars });
        }
        contracts.sort_by(|a, b| a.symbol.cmp(&b.symbol));
        Ok(RawData {
            source: root.to_path_buf(),
            files: self.files,
            skipped_files: Vec::new(),
            notes: self.notes,
            available,
            contracts,
        })
    }
}

/// An implausible bar: its row in the contract's merged bars, and why.
#[derive(Debug, Clone)]
pub struct Outlier {
    /// Row in the contract's bars (time order).
    pub row: usize,
    /// What is implausible, with the numbers.
    pub why: String,
}

/// A bar moving more than this fraction of the reference price away from it is implausible
/// (exchange price limits stop index futures well inside 20% in a day, let alone a bar)...
const OUTLIER_FRACTION: f64 = 0.2;
/// ... unless the contract's typical move allows it: this many median close-to-close moves.
const OUTLIER_MEDIAN_MOVES: f64 = 50.0;

/// The data-quality check: bars whose high or low lies further from the reference price (the
/// previous close; the next close for the first bar) than both 20% of that price and 50 of
/// the contract's median close-to-close moves. Catches a high of 1e308 among bars near 4000 or
/// a price written in other units, and passes real fast markets.
pub fn outliers(bars: &[Bar]) -> Vec<Outlier> {
    if bars.len() < 2 {
        return Vec::new();
    }
    let mut moves: Vec<f64> = bars
        .windows(2)
        .map(|w| (w[1].close() - w[0].close()).abs())
        .filter(|&m| m > 0.0)
        .collect();
    let median = if moves.is_empty() {
        0.0
    } else {
        let mid = moves.len() / 2;
        *moves.select_nth_unstable_by(mid, f64::total_cmp).1
    };
    let mut out = Vec::new();
    for (t, bar) in bars.iter().enumerate() {
        let reference = if t == 0 {
            bars[1].close()
        } else {
            bars[t - 1].close()
        };
        let limit = (OUTLIER_FRACTION * reference.abs()).max(OUTLIER_MEDIAN_MOVES * median);
        let far = (bar.high() - reference)
            .abs()
            .max((bar.low() - reference).abs());
        if far > limit {
            out.push(Outlier {
                row: t,
                why: format!(
                    "high {} / low {} lie {} from the {} close {}, beyond the plausible {} (20% \
                     of the price, or 50 median moves of {})",
                    show(bar.high()),
                    show(bar.low()),
                    show(far),
                    if t == 0 { "next" } else { "previous" },
                    show(reference),
                    show(limit),
                    show(median)
                ),
            });
        }
    }
    out
}

/// A price for a message: exponent form when huge, else rounded to 1e-6.
fn show(v: f64) -> String {
    if v.abs() >= 1e9 {
        format!("{v:e}")
    } else {
        format!("{}", (v * 1e6).round() / 1e6)
    }
}

/// Orders one contract's bars from all sources in time and rejects duplicates: the indices of
/// `acc.bars` in time order.
fn merge_sorted(sources: &[Source], symbol: &str, acc: &Accumulator) -> Result<Vec<usize>> {
    let sorted = acc.bars.windows(2).all(|w| w[0].ts() < w[1].ts());
    if sorted {
        return Ok((0..acc.bars.len()).collect());
    }
    let mut order: Vec<usize> = (0..acc.bars.len()).collect();
    // Stable, so that of two equal stamps the one read first is reported as the original.
    order.sort_by_key(|&i| acc.bars[i].ts());
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        if acc.bars[a].ts() == acc.bars[b].ts() {
            let ((fsrc, fpos), (ssrc, spos)) = (acc.provenance(a), acc.provenance(b));
            let (fs, ss) = (&sources[fsrc as usize], &sources[ssrc as usize]);
            return Err(DataError::Duplicate {
                path: ss.path.clone(),
                location: ss.location(spos),
                symbol: symbol.to_owned(),
                ts: acc.bars[b].ts(),
                first: Box::new((fs.path.clone(), fs.location(fpos))),
            });
        }
    }
    Ok(order)
}
