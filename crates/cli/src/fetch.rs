//! `foxhunt data fetch`: minute bars from Databento's historical API into daily `.dbn.zst`
//! files that `--data-dir` reads as they are, through Databento's own client (the `databento`
//! crate). Prints the API's cost estimate first and asks for `--yes` above `--max-cost`;
//! resumable: a day whose file is complete (it decodes to its end) is not fetched again, and a
//! download in progress never has the final name.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use databento::HistoricalClient;
use databento::dbn::{SType, Schema};
use databento::historical::metadata::GetCostParams;
use databento::historical::timeseries::GetRangeToFileParams;
use jiff::civil::Date;

/// The environment variable holding the user's API key.
pub const KEY_ENV: &str = "DATABENTO_API_KEY";

/// `foxhunt data fetch` options.
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Symbol: a parent (`ES.FUT`: every ES contract, as the bundled data) or a raw symbol
    /// (`ESH4`).
    #[arg(long)]
    pub symbol: String,
    /// First day, YYYY-MM-DD (UTC).
    #[arg(long)]
    pub start: Date,
    /// Day after the last, YYYY-MM-DD (UTC): the range is start..end.
    #[arg(long)]
    pub end: Date,
    /// Directory for the daily files (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Databento dataset.
    #[arg(long, default_value = "GLBX.MDP3")]
    pub dataset: String,
    /// Record schema.
    #[arg(long, default_value = "ohlcv-1m")]
    pub schema: String,
    /// Largest estimated cost in USD downloaded without --yes.
    #[arg(long, default_value_t = 0.0)]
    pub max_cost: f64,
    /// Download whatever the estimated cost.
    #[arg(long)]
    pub yes: bool,
    /// The API's base URL (a proxy, or a local stand-in for tests).
    #[arg(long, hide = true)]
    pub api_url: Option<String>,
}

/// The symbology of `symbol`: `ROOT.FUT` (or `.OPT`, `.SPOT`) is a parent symbol.
fn stype_of(symbol: &str) -> SType {
    let parent = symbol.rsplit_once('.').is_some_and(|(root, kind)| {
        !root.is_empty() && kind.chars().all(|c| c.is_ascii_uppercase())
    });
    if parent {
        SType::Parent
    } else {
        SType::RawSymbol
    }
}

/// A day's file name, as Databento names a batch job's daily files:
/// `glbx-mdp3-20230103.ohlcv-1m.dbn.zst`.
fn file_name(dataset: &str, schema: Schema, day: Date) -> String {
    format!(
        "{}-{}.{}.dbn.zst",
        dataset.to_ascii_lowercase().replace('.', "-"),
        day.strftime("%Y%m%d"),
        schema
    )
}

/// Whether `path` is a whole DBN file: it decodes, records and all, to its end. Returns the
/// number of records.
fn complete(path: &Path) -> Result<usize, String> {
    use databento::dbn::decode::{DecodeRecordRef, DynDecoder};
    let mut d = DynDecoder::from_file(path, databento::dbn::VersionUpgradePolicy::AsIs)
        .map_err(|e| e.to_string())?;
    let mut n = 0;
    while d.decode_record_ref().map_err(|e| e.to_string())?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// One line for an error of the client: what went wrong and what to do about it.
fn explain(e: databento::Error, args: &FetchArgs, url: &str) -> anyhow::Error {
    use databento::Error as E;
    match e {
        E::Api(api) => {
            let code = api.status_code.as_u16();
            let msg = api.message.trim().to_owned();
            match code {
                401 | 403 => anyhow!(
                    "authentication failed (HTTP {code}): {msg}; check the key in {KEY_ENV}"
                ),
                429 => anyhow!(
                    "rate limited by the API (HTTP {code}): {msg}; the files finished so far are \
                     kept: run the same command again later"
                ),
                400..=499 => anyhow!(
                    "the API refused the request for {} in {} ({}) (HTTP {code}): {msg}",
                    args.symbol,
                    args.dataset,
                    args.schema
                ),
                _ => anyhow!("the API failed (HTTP {code}): {msg}; try again later"),
            }
        }
        E::Http(h) if h.is_connect() || h.is_timeout() => {
            anyhow!("cannot reach the API at {url}: {h}")
        }
        E::Http(h) => anyhow!("the connection to the API failed: {h}"),
        E::Io(io) => anyhow!("the download broke off: {io}"),
        other => anyhow!("{other}"),
    }
}

/// Runs `foxhunt data fetch`.
pub fn run(args: &FetchArgs) -> Result<()> {
    if args.end <= args.start {
        bail!(
            "--end {} must be after --start {} (the range is start..end)",
            args.end,
            args.start
        );
    }
    if args.max_cost.is_nan() || args.max_cost < 0.0 {
        bail!("--max-cost must be a cost in USD, 0 or more");
    }
    let schema: Schema = args
        .schema
        .parse()
        .map_err(|_| anyhow!("--schema {}: not a Databento schema name", args.schema))?;
    let key = std::env::var(KEY_ENV)
        .ok()
        .filter(|k| !k.trim().is_empty())
        .ok_or_else(|| {
            anyhow!("{KEY_ENV} is not set: put your Databento API key in it to download data")
        })?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;

    let mut days = Vec::new();
    let mut day = args.start;
    while day < args.end {
        days.push(day);
        day = day.tomorrow().context("a day past the calendar's end")?;
    }
    let mut todo = Vec::new();
    for &d in &days {
        let path = args.out.join(file_name(&args.dataset, schema, d));
        if path.exists() {
            match complete(&path) {
                Ok(_) => continue,
                Err(why) => {
                    eprintln!(
                        "{} is incomplete or damaged ({why}): fetching it again",
                        path.display()
                    );
                }
            }
        }
        todo.push((d, path));
    }
    println!(
        "{} of {} days already in {}",
        days.len() - todo.len(),
        days.len(),
        args.out.display()
    );
    if todo.is_empty() {
        return Ok(());
    }

    // rustls needs one cryptography provider per process; the client's TLS uses it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the HTTP client's runtime")?;
    let url = args
        .api_url
        .clone()
        .unwrap_or_else(|| "the Databento historical gateway".into());
    let mut builder = HistoricalClient::builder()
        .key(key)
        .map_err(|e| anyhow!("{KEY_ENV}: {e}"))?;
    if let Some(u) = &args.api_url {
        let parsed = u
            .parse()
            .map_err(|e| anyhow!("--api-url {u}: not a URL: {e}"))?;
        builder = builder.base_url(parsed);
    }
    let mut client = builder.build().map_err(|e| explain(e, args, &url))?;
    let stype = stype_of(&args.symbol);
    let range = |from: Date, to: Date| -> Result<databento::historical::DateTimeRange> {
        let ts = |d: Date| -> Result<time::OffsetDateTime> {
            let secs = d
                .to_zoned_datetime(jiff::tz::TimeZone::UTC)?
                .timestamp()
                .as_second();
            Ok(time::OffsetDateTime::from_unix_timestamp(secs)?)
        };
        Ok((ts(from)?..ts(to)?).into())
    };

    let (first, last) = (todo[0].0, todo[todo.len() - 1].0);
    let cost = rt
        .block_on(
            client.metadata().get_cost(
                &GetCostParams::builder()
                    .dataset(&args.dataset)
                    .symbols(args.symbol.as_str())
                    .schema(schema)
                    .stype_in(stype)
                    .date_time_range(range(first, last.tomorrow()?)?)
                    .build(),
            ),
        )
        .map_err(|e| explain(e, args, &url))?;
    println!(
        "estimated cost of the {} days to fetch ({} to {}): ${cost:.2} (the API's estimate)",
        todo.len(),
        first,
        last
    );
    if cost > args.max_cost && !args.yes {
        bail!(
            "the estimated cost ${cost:.2} is above --max-cost ${:.2}: nothing was downloaded; \
             add --yes to download it",
            args.max_cost
        );
    }

    for (n, (d, path)) in todo.iter().enumerate() {
        let name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Not a data file name until it is complete: `--data-dir` passes it over.
        let part = path.with_file_name(format!(".{name}.partial-{}", std::process::id()));
        let params = GetRangeToFileParams::builder()
            .dataset(&args.dataset)
            .symbols(args.symbol.as_str())
            .schema(schema)
            .stype_in(stype)
            .date_time_range(range(*d, d.tomorrow()?)?)
            .path(part.clone())
            .build();
        let got = rt.block_on(client.timeseries().get_range_to_file(&params));
        if let Err(e) = got {
            let _ = std::fs::remove_file(&part);
            return Err(explain(e, args, &url).context(format!(
                "fetching {} ({} of {}); the days before it are complete, run the same command \
                 again to go on",
                d,
                n + 1,
                todo.len()
            )));
        }
        let records = match complete(&part) {
            Ok(r) => r,
            Err(why) => {
                let _ = std::fs::remove_file(&part);
                bail!("{d}: the file received does not decode ({why}); run again to retry it");
            }
        };
        std::fs::rename(&part, path).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{} ({records} records)", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_and_raw_symbols_and_daily_names() {
        assert_eq!(stype_of("ES.FUT"), SType::Parent);
        assert_eq!(stype_of("ESH4"), SType::RawSymbol);
        assert_eq!(stype_of(".FUT"), SType::RawSymbol);
        assert_eq!(
            file_name("GLBX.MDP3", Schema::Ohlcv1M, jiff::civil::date(2023, 1, 3)),
            "glbx-mdp3-20230103.ohlcv-1m.dbn.zst"
        );
    }
}
