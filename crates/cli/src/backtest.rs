//! `foxhunt backtest`: a baseline strategy over a date range, with costs, as metrics.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use foxhunt_data::session::date_to_day;
use foxhunt_env::{BacktestReport, Baseline, Costs, EnvConfig, Execution, MarketData, SpecTable};
use serde::Serialize;

use foxhunt::args::LoaderArgs;

/// `--strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Strategy {
    /// Never trade.
    Flat,
    /// Long one contract from the first fill to the end, held across sessions.
    BuyAndHold,
    /// A seeded random target each bar.
    Random,
    /// Sign of the last 30 bars' price change.
    Momentum,
    /// All four, side by side.
    All,
}

/// `foxhunt backtest` options.
#[derive(Debug, Args)]
pub struct BacktestArgs {
    #[command(flatten)]
    loader: LoaderArgs,
    /// Strategy to run.
    #[arg(long, value_enum)]
    strategy: Strategy,
    /// First trading day included (YYYY-MM-DD); default: the first in the data.
    #[arg(long)]
    from: Option<String>,
    /// First trading day excluded (YYYY-MM-DD); default: after the last in the data.
    #[arg(long)]
    to: Option<String>,
    /// Commission per contract per side, in the contract's currency.
    #[arg(long, default_value_t = Costs::default().commission)]
    commission: f64,
    /// Slippage per side in ticks against the trader.
    #[arg(long, default_value_t = Costs::default().slippage_ticks)]
    slippage_ticks: f64,
    /// Capital that returns and drawdown fractions are stated on.
    #[arg(long, default_value_t = 100_000.0)]
    capital: f64,
    /// Seed of the random strategy.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// TOML file of contract specs laid over the built-in ones.
    #[arg(long)]
    specs: Option<PathBuf>,
    /// Print JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Output<'a> {
    strategy: &'a str,
    #[serde(flatten)]
    metrics: &'a foxhunt_env::Metrics,
}

/// Runs `foxhunt backtest`.
pub fn run(args: &BacktestArgs) -> Result<()> {
    for (name, v) in [
        ("--commission", args.commission),
        ("--slippage-ticks", args.slippage_ticks),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            bail!("{name} must be zero or more, got {v}");
        }
    }
    let specs = match &args.specs {
        Some(p) => SpecTable::with_overrides(p)?,
        None => SpecTable::default(),
    };
    let data = args.loader.load()?;
    let root = data.series.root.clone();
    let spec = specs.get(&root)?;
    let days = data.series.row_days();
    let day = |s: &Option<String>, default: i32| -> Result<i32> {
        match s {
            Some(s) => {
                Ok(date_to_day(s.parse().with_context(|| {
                    format!("{s:?} is not a date (YYYY-MM-DD)")
                })?))
            }
            None => Ok(default),
        }
    };
    let (from, to) = (day(&args.from, i32::MIN)?, day(&args.to, i32::MAX)?);
    let rows = days.partition_point(|&d| d < from)..days.partition_point(|&d| d < to);
    if rows.len() < 2 {
        bail!(
            "the range {} .. {} holds {} bars of {root}; a backtest needs at least 2",
            args.from.as_deref().unwrap_or("start"),
            args.to.as_deref().unwrap_or("end"),
            rows.len()
        );
    }
    // Baselines read prices only; features are passed through unnormalized.
    let market = MarketData::from_features(&data.features, 0..data.features.rows, None)?;
    let exec = Execution::new(
        spec,
        Costs {
            commission: args.commission,
            slippage_ticks: args.slippage_ticks,
        },
    );
    let cfg = EnvConfig::default();
    let chosen: &[Baseline] = match args.strategy {
        Strategy::Flat => &[Baseline::Flat],
        Strategy::BuyAndHold => &[Baseline::BuyAndHold],
        Strategy::Random => &[Baseline::Random],
        Strategy::Momentum => &[Baseline::Momentum],
        Strategy::All => &Baseline::ALL,
    };
    let reports = chosen
        .iter()
        .map(|b| b.run(&market, &exec, &cfg, rows.clone(), args.capital, args.seed))
        .collect::<Result<Vec<BacktestReport>, _>>()?;
    if args.json {
        let out: Vec<Output<'_>> = reports
            .iter()
            .map(|r| Output {
                strategy: &r.policy,
                metrics: &r.metrics,
            })
            .collect();
        let text = if out.len() == 1 {
            serde_json::to_string_pretty(&out[0])?
        } else {
            serde_json::to_string_pretty(&out)?
        };
        println!("{text}");
    } else {
        println!(
            "{root}: {} bars, {} .. {} (trading days), {} per side + {} tick(s) slippage, capital {}",
            rows.len(),
            foxhunt_data::session::day_to_date(days[rows.start]),
            foxhunt_data::session::day_to_date(days[rows.end - 1]),
            args.commission,
            args.slippage_ticks,
            args.capital
        );
        print!("{}", table(&reports));
    }
    Ok(())
}

/// Reports side by side, one row per strategy.
pub fn table(reports: &[BacktestReport]) -> String {
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
    let mut s = format!(
        "{:<14} {:>12} {:>8} {:>8} {:>12} {:>8} {:>7} {:>7} {:>10} {:>10}\n",
        "strategy",
        "total_pnl",
        "sharpe",
        "sortino",
        "max_drawdown",
        "calmar",
        "trades",
        "hit",
        "costs",
        "turnover/d"
    );
    for r in reports {
        let m = &r.metrics;
        s.push_str(&format!(
            "{:<14} {:>12.2} {:>8} {:>8} {:>12.2} {:>8} {:>7} {:>7} {:>10.2} {:>10.1}\n",
            r.policy,
            m.total_pnl,
            opt(m.sharpe),
            opt(m.sortino),
            m.max_drawdown,
            opt(m.calmar),
            m.trades,
            opt(m.hit_rate),
            m.total_costs,
            m.turnover_per_day
        ));
    }
    s
}
