//! CSV reader: Databento's CSV export and generic OHLCV CSV, plain, gzip or zstd.

use std::io::Read;
use std::path::Path;

use super::timestamp::parse_ts;
use super::{BarTime, Collector, LoadOptions, Outcome};
use crate::bar::Bar;
use crate::error::{DataError, Location, Result, excerpt};

/// Column positions of one file.
struct Columns {
    ts: usize,
    ohlcv: [usize; 5],
    symbol: Option<usize>,
    /// Databento exports without `pretty_px` write prices as 1e-9 fixed-point integers.
    fixed_point: bool,
    /// Databento exports without `map_symbols` carry only the instrument id.
    instrument_id: Option<usize>,
    /// Fields of every row: the header's, or the first row's in a file without one.
    width: usize,
    /// Where `width` comes from, for the error of a row with another.
    width_from: &'static str,
}

const TS_NAMES: [&str; 8] = [
    "ts_event",
    "timestamp",
    "timestamp_utc",
    "datetime",
    "date_time",
    "time",
    "date",
    "ts",
];

pub(super) fn read(
    path: &Path,
    bytes: &[u8],
    opts: &LoadOptions,
    collector: &mut Collector<'_>,
) -> Result<Outcome> {
    let text = decompress(path, bytes)?;
    let source = collector.source(path, None, false);
    let default_symbol = symbol_from_file_name(path);
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(::csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(text.as_slice());
    let mut record = ::csv::StringRecord::new();
    let mut columns: Option<Columns> = None;
    let shift = match opts.bar_time {
        BarTime::Start => 0,
        BarTime::End => opts.bar_seconds * 1_000_000_000,
    };
    loop {
        let line = reader.position().line();
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                return Err(collector.format_error(
                    source,
                    line.max(1),
                    format!("cannot parse CSV: {e}"),
                ));
            }
        }
        let line = record.position().map_or(line, |p| p.line());
        if record.iter().all(str::is_empty) {
            continue;
        }
        let cols = match &columns {
            Some(c) => c,
            None => {
                let first = record.get(0).unwrap_or_default();
                if parse_ts(first, &opts.tz).is_err() {
                    columns = Some(
                        header_columns(&record)
                            .map_err(|m| collector.format_error(source, line, m))?,
                    );
                    continue;
                }
                columns.insert(
                    positional_columns(&record)
                        .map_err(|m| collector.format_error(source, line, m))?,
                )
            }
        };
        if record.len() != cols.width {
            return Err(collector.format_error(
                source,
                line,
                format!(
                    "{} fields where {} has {}",
                    record.len(),
                    cols.width_from,
                    cols.width
                ),
            ));
        }
        let field = |i: usize| record.get(i).unwrap_or("");
        let symbol = match (cols.symbol, cols.instrument_id) {
            (Some(i), _) if !field(i).is_empty() => field(i),
            (_, Some(i)) => field(i),
            _ => default_symbol.as_str(),
        };
        let Some(slot) = collector.slot(symbol) else {
            continue;
        };
        let ts = parse_ts(field(cols.ts), &opts.tz)
            .map_err(|m| collector.format_error(source, line, m))?
            - shift;
        let mut v = [0.0f64; 5];
        for (k, &i) in cols.ohlcv.iter().enumerate() {
            let s = field(i);
            let parsed = if cols.fixed_point && k < 4 && !s.contains('.') {
                s.parse::<i64>().map(|p| p as f64 / 1e9).ok()
            } else {
                s.parse::<f64>().ok()
            };
            v[k] = parsed.ok_or_else(|| {
                collector.format_error(
                    source,
                    line,
                    format!(
                        "{} {} is not a number",
                        ["open", "high", "low", "close", "volume"][k],
                        excerpt(s)
                    ),
                )
            })?;
        }
        match Bar::new_raw(ts, v[0], v[1], v[2], v[3], v[4]) {
            Ok(bar) => collector.push(slot, source, line, bar)?,
            Err(problem) => return Err(collector.invalid_bar(source, line, symbol, problem)),
        }
    }
    Ok(Outcome::Read)
}

fn decompress(path: &Path, bytes: &[u8]) -> Result<Vec<u8>> {
    let name = path.to_string_lossy().to_ascii_lowercase();
    let fail = |kind: &str, e: std::io::Error| DataError::Format {
        path: path.to_path_buf(),
        location: Location::File,
        message: format!("bad {kind} compression: {e}"),
    };
    if name.ends_with(".gz") {
        let mut out = Vec::with_capacity(bytes.len() * 4);
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| fail("gzip", e))?;
        Ok(out)
    } else if name.ends_with(".zst") {
        zstd::stream::decode_all(bytes).map_err(|e| fail("zstd", e))
    } else {
        Ok(bytes.to_vec())
    }
}

/// `6EH4.XCME_1min_bars_....csv.gz` -> `6EH4`: files without a symbol column are usually named
/// after their contract.
fn symbol_from_file_name(path: &Path) -> String {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("UNKNOWN");
    let end = name.find(['.', '_', '-', ' ']).unwrap_or(name.len());
    if end == 0 {
        "UNKNOWN".to_owned()
    } else {
        name[..end].to_owned()
    }
}

fn header_columns(header: &::csv::StringRecord) -> std::result::Result<Columns, String> {
    let names: Vec<String> = header
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let shown = excerpt(&names.join(","));
    let find = |cands: &[&str]| cands.iter().find_map(|c| names.iter().position(|n| n == c));
    let ts = find(&TS_NAMES).ok_or_else(|| {
        format!(
            "header has no timestamp column (looked for {}); header is: {shown}",
            TS_NAMES.join(", "),
        )
    })?;
    let mut ohlcv = [0usize; 5];
    for (k, name) in ["open", "high", "low", "close", "volume"]
        .iter()
        .enumerate()
    {
        let short = &name[..1];
        ohlcv[k] = find(&[name, short])
            .ok_or_else(|| format!("header has no {name} column; header is: {shown}"))?;
    }
    let databento = names.iter().any(|n| n == "rtype" || n == "publisher_id");
    Ok(Columns {
        ts,
        ohlcv,
        symbol: find(&["symbol", "raw_symbol"]),
        fixed_point: databento,
        instrument_id: if databento {
            find(&["instrument_id"])
        } else {
            None
        },
        width: names.len(),
        width_from: "the header",
    })
}

fn positional_columns(first: &::csv::StringRecord) -> std::result::Result<Columns, String> {
    match first.len() {
        6 | 7 => Ok(Columns {
            ts: 0,
            ohlcv: [1, 2, 3, 4, 5],
            symbol: (first.len() == 7).then_some(6),
            fixed_point: false,
            instrument_id: None,
            width: first.len(),
            width_from: "the first row",
        }),
        n => Err(format!(
            "headerless CSV must have 6 columns (timestamp,open,high,low,close,volume) or 7 (...,symbol); found {n}"
        )),
    }
}
