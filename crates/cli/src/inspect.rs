//! `foxhunt data inspect`: what was loaded, how it was rolled, and which windows a plan gives.

use anyhow::Result;
use clap::Args;
use foxhunt_data::continuous::Gap;
use foxhunt_data::read::format_ts;
use foxhunt_data::session::day_to_date;
use foxhunt_data::walkforward::{Plan, plan};
use foxhunt_data::{Dataset, Roll};
use serde::Serialize;

use foxhunt::args::{LoaderArgs, WindowArgs};

/// Gaps inside a session shorter than this (or than two bars) are ordinary quiet minutes.
const GAP_MINUTES: i64 = 30;
/// Longer lists are cut in the text output; --json has them whole.
const LIST_LIMIT: usize = 20;

/// `foxhunt data inspect` options.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    loader: LoaderArgs,
    #[command(flatten)]
    windows: WindowArgs,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ContractReport {
    symbol: String,
    bars: usize,
    first: String,
    last: String,
}

#[derive(Serialize)]
struct Report {
    source: String,
    files_read: usize,
    files_skipped: Vec<(String, String)>,
    notes: Vec<(String, String)>,
    symbol: String,
    symbols_available: Vec<String>,
    contracts: Vec<ContractReport>,
    bars: usize,
    first: String,
    last: String,
    sessions: usize,
    first_session: String,
    last_session: String,
    adjustment: foxhunt_data::Adjustment,
    rolls: Vec<Roll>,
    gap_threshold_minutes: i64,
    gaps: Vec<Gap>,
    features: Vec<String>,
    windows: Option<Plan>,
}

fn build(args: &InspectArgs, data: &Dataset) -> Result<Report> {
    let series = &data.series;
    let plan = match args.windows.config()? {
        Some(cfg) => Some(plan(&series.row_days(), &cfg)?),
        None => None,
    };
    let gap_minutes = GAP_MINUTES.max(2 * args.loader.bar_seconds / 60);
    let day = |d: Option<&i32>| d.map(|&d| day_to_date(d).to_string()).unwrap_or_default();
    Ok(Report {
        source: data.raw.source.display().to_string(),
        files_read: data.raw.files.len(),
        files_skipped: data
            .raw
            .skipped_files
            .iter()
            .map(|(p, why)| (p.display().to_string(), why.clone()))
            .collect(),
        notes: data
            .raw
            .notes
            .iter()
            .map(|(p, note)| (p.display().to_string(), note.clone()))
            .collect(),
        symbol: args.loader.symbol.clone(),
        symbols_available: data.raw.available.clone(),
        contracts: data
            .raw
            .contracts
            .iter()
            .map(|c| ContractReport {
                symbol: c.symbol.clone(),
                bars: c.bars.len(),
                first: c
                    .bars
                    .first()
                    .map(|b| format_ts(b.ts()))
                    .unwrap_or_default(),
                last: c.bars.last().map(|b| format_ts(b.ts())).unwrap_or_default(),
            })
            .collect(),
        bars: series.len(),
        first: series
            .raw
            .first()
            .map(|b| format_ts(b.ts()))
            .unwrap_or_default(),
        last: series
            .raw
            .last()
            .map(|b| format_ts(b.ts()))
            .unwrap_or_default(),
        sessions: series.session_days.len(),
        first_session: day(series.session_days.first()),
        last_session: day(series.session_days.last()),
        adjustment: series.adjustment,
        rolls: series.rolls.clone(),
        gap_threshold_minutes: gap_minutes,
        gaps: series.gaps(gap_minutes),
        features: data.features.names.clone(),
        windows: plan,
    })
}

/// Runs `foxhunt data inspect`.
pub fn run(args: &InspectArgs) -> Result<()> {
    // Check window flags before the (possibly long) load, so a typo fails at once.
    args.windows.config()?;
    let data = args.loader.load()?;
    let report = build(args, &data)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    Ok(())
}

fn text(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "source      {} ({} files read, {} skipped)",
        r.source,
        r.files_read,
        r.files_skipped.len()
    );
    for (file, why) in &r.files_skipped {
        let _ = writeln!(s, "  skipped {file}: {why}");
    }
    for (file, note) in &r.notes {
        let _ = writeln!(s, "  note    {file}: {note}");
    }
    let _ = writeln!(
        s,
        "symbol      {} (present: {})",
        r.symbol,
        r.symbols_available.join(" ")
    );
    let _ = writeln!(s, "contracts   {}", r.contracts.len());
    for c in &r.contracts {
        let _ = writeln!(
            s,
            "  {:<12} {:>8} bars  {} .. {}",
            c.symbol, c.bars, c.first, c.last
        );
    }
    let _ = writeln!(s, "continuous  {} bars, {} .. {}", r.bars, r.first, r.last);
    let _ = writeln!(
        s,
        "sessions    {} trading days, {} .. {}",
        r.sessions, r.first_session, r.last_session
    );
    let _ = writeln!(s, "adjustment  {:?}", r.adjustment);
    let _ = writeln!(s, "rolls       {}", r.rolls.len());
    for roll in &r.rolls {
        let _ = writeln!(
            s,
            "  {}  {} -> {}  at {}: {} -> {} (difference {}, ratio {:.6})",
            roll.session,
            roll.from,
            roll.to,
            roll.reference_time,
            price(roll.from_price),
            price(roll.to_price),
            price(roll.difference()),
            roll.ratio()
        );
        if let Some(days) = roll.break_days {
            let _ = writeln!(
                s,
                "    after {days} days without data: a new segment, not adjusted across (no move booked across the hole)"
            );
        }
    }
    let _ = writeln!(
        s,
        "gaps        {} inside sessions longer than {} minutes",
        r.gaps.len(),
        r.gap_threshold_minutes
    );
    for g in r.gaps.iter().take(LIST_LIMIT) {
        let _ = writeln!(s, "  {} -> {} ({} min)", g.from, g.to, g.minutes);
    }
    if r.gaps.len() > LIST_LIMIT {
        let _ = writeln!(s, "  ... {} more (see --json)", r.gaps.len() - LIST_LIMIT);
    }
    let _ = writeln!(
        s,
        "features    {}: {}",
        r.features.len(),
        r.features.join(" ")
    );
    if let Some(plan) = &r.windows {
        let _ = writeln!(
            s,
            "windows     {} usable, {} skipped for too few bars, {} empty (inside a hole in the data)",
            plan.windows.len(),
            plan.skipped.len(),
            plan.empty
        );
        for w in &plan.windows {
            let _ = writeln!(
                s,
                "  #{:<3} train {}..{} ({} bars)  val {}..{} ({})  test {}..{} ({})",
                w.index,
                w.train.start,
                w.train.end,
                w.train.rows.len(),
                w.val.start,
                w.val.end,
                w.val.rows.len(),
                w.test.start,
                w.test.end,
                w.test.rows.len()
            );
        }
        for k in plan.skipped.iter().take(LIST_LIMIT) {
            let _ = writeln!(
                s,
                "  #{:<3} skipped: {} (train {}..{}, val {}..{}, test {}..{})",
                k.window.index,
                k.reason,
                k.window.train.start,
                k.window.train.end,
                k.window.val.start,
                k.window.val.end,
                k.window.test.start,
                k.window.test.end
            );
        }
        if plan.skipped.len() > LIST_LIMIT {
            let _ = writeln!(
                s,
                "  ... {} more skipped (see --json)",
                plan.skipped.len() - LIST_LIMIT
            );
        }
    }
    s
}

/// A price for people: at most 6 decimals, no float noise such as 286.5999999999999.
fn price(p: f64) -> String {
    let s = format!("{p:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}
