//! QuantConnect Lean futures minute zips: `YYYYMMDD_trade.zip` holding one headerless CSV per
//! listed expiry (`YYYYMMDD_<root>_minute_trade_<YYYYMM>.csv`; milliseconds since midnight,
//! open, high, low, close, volume). Lean stores futures bars in UTC, stamped at the bar's start.

use std::io::Read;
use std::path::Path;

use jiff::civil::Date;

use super::timestamp::parse_ts;
use super::{Collector, LoadOptions, Outcome};
use crate::bar::Bar;
use crate::error::{DataError, Location, Result};
use crate::symbol::ContractCode;

pub(super) fn read(
    path: &Path,
    bytes: &[u8],
    opts: &LoadOptions,
    collector: &mut Collector<'_>,
) -> Result<Outcome> {
    let zip_error = |message: String| DataError::Format {
        path: path.to_path_buf(),
        location: Location::File,
        message,
    };
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| zip_error(format!("not a readable zip archive: {e}")))?;
    let mut names: Vec<String> = archive
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| zip_error(format!("unreadable member name: {e}")))?;
    names.sort();
    let mut text = String::new();
    for name in names {
        let Some((date, root, year, month)) = parse_member_name(&name) else {
            tracing::debug!(file = %path.display(), member = %name, "skipping member that is not a minute trade file");
            continue;
        };
        let symbol = ContractCode::format(&root, year, month);
        let source = collector.source(path, Some(name.clone()), false);
        let Some(slot) = collector.slot(&symbol) else {
            continue;
        };
        text.clear();
        archive
            .by_name(&name)
            .map_err(|e| zip_error(format!("member {name}: {e}")))?
            .read_to_string(&mut text)
            .map_err(|e| zip_error(format!("member {name}: cannot decompress: {e}")))?;
        let midnight = parse_ts(&date.to_string(), &opts.tz)
            .map_err(|m| collector.format_error(source, 0, m))?;
        for (i, line) in text.lines().enumerate() {
            let line_no = i as u64 + 1;
            if line.trim().is_empty() {
                continue;
            }
            let mut fields = line.split(',').map(str::trim);
            let mut next = |what: &str| {
                fields.next().ok_or_else(|| {
                    collector.format_error(
                        source,
                        line_no,
                        format!("missing {what} (expected ms,open,high,low,close,volume)"),
                    )
                })
            };
            let ms_field = next("milliseconds")?;
            let ms: i64 = ms_field.parse().map_err(|_| {
                collector.format_error(
                    source,
                    line_no,
                    format!("milliseconds {ms_field:?} is not an integer"),
                )
            })?;
            let mut v = [0.0f64; 5];
            for (k, what) in ["open", "high", "low", "close", "volume"]
                .iter()
                .enumerate()
            {
                let s = next(what)?;
                v[k] = s.parse().map_err(|_| {
                    collector.format_error(source, line_no, format!("{what} {s:?} is not a number"))
                })?;
            }
            let ts = midnight + ms * 1_000_000;
            match Bar::new_raw(ts, v[0], v[1], v[2], v[3], v[4]) {
                Ok(bar) => collector.push(slot, source, line_no, bar)?,
                Err(problem) => {
                    return Err(collector.invalid_bar(source, line_no, &symbol, problem));
                }
            }
        }
    }
    Ok(Outcome::Read)
}

/// `20131007_es_minute_trade_201312.csv` -> (2013-10-07, "ES", 2013, 12).
fn parse_member_name(name: &str) -> Option<(Date, String, i32, u8)> {
    let stem = name.strip_suffix(".csv")?;
    let parts: Vec<&str> = stem.split('_').collect();
    let [date, root, "minute", "trade", expiry] = parts.as_slice() else {
        return None;
    };
    if date.len() != 8 || expiry.len() != 6 {
        return None;
    }
    let d = Date::new(
        date[..4].parse().ok()?,
        date[4..6].parse().ok()?,
        date[6..].parse().ok()?,
    )
    .ok()?;
    let year: i32 = expiry[..4].parse().ok()?;
    let month: u8 = expiry[4..].parse().ok()?;
    if !(1..=12).contains(&month) || root.is_empty() {
        return None;
    }
    Some((d, root.to_ascii_uppercase(), year, month))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names() {
        let (d, root, y, m) =
            parse_member_name("20131007_es_minute_trade_201312.csv").expect("parses");
        assert_eq!(
            (d.to_string().as_str(), root.as_str(), y, m),
            ("2013-10-07", "ES", 2013, 12)
        );
        assert!(parse_member_name("20131007_es_minute_openinterest_201312.csv").is_none());
        assert!(parse_member_name("readme.txt").is_none());
    }
}
