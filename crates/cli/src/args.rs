//! Command-line options shared by several subcommands: where the data is and how to read it,
//! and the walk-forward window flags.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use foxhunt_data::{
    Adjustment, BarTime, FeatureConfig, Format, LoadOptions, Period, SessionCalendar,
    SymbolSelector, TrainMode, WalkForwardConfig, read::parse_time_zone,
};

/// `--format`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// From each file's name.
    Auto,
    /// Databento DBN (.dbn, .dbn.zst).
    Dbn,
    /// CSV (.csv, .csv.gz, .csv.zst).
    Csv,
    /// QuantConnect Lean minute zips.
    Lean,
}

/// `--bar-time`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BarTimeArg {
    /// Timestamps mark the bar's open.
    Start,
    /// Timestamps mark the bar's close.
    End,
}

/// `--adjustment`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum AdjustmentArg {
    /// Raw prices.
    None,
    /// Panama: add the roll gap to earlier prices.
    Difference,
    /// Multiply earlier prices by the roll ratio.
    Ratio,
}

/// Where the data is and how to read it.
#[derive(Debug, Clone, Args)]
pub struct LoaderArgs {
    /// Directory of data files (or one file).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// ES.FUT for every ES outright (continuous front month), or one raw symbol such as ESZ3.
    #[arg(long)]
    pub symbol: String,
    /// File format.
    #[arg(long, value_enum, default_value = "auto")]
    pub format: FormatArg,
    /// IANA time zone of CSV/Lean timestamps that carry no offset.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// What CSV timestamps mark.
    #[arg(long, value_enum, default_value = "start")]
    pub bar_time: BarTimeArg,
    /// Bar length in seconds (turns bar-end stamps into bar-start).
    #[arg(long, default_value_t = 60)]
    pub bar_seconds: i64,
    /// Back-adjustment of the continuous series.
    #[arg(long, value_enum, default_value = "difference")]
    pub adjustment: AdjustmentArg,
}

impl LoaderArgs {
    /// Loads the data set these options describe.
    pub fn load(&self) -> Result<foxhunt_data::Dataset> {
        let selector = SymbolSelector::parse(&self.symbol)?;
        if self.bar_seconds <= 0 {
            bail!("--bar-seconds must be positive, got {}", self.bar_seconds);
        }
        let opts = LoadOptions {
            format: match self.format {
                FormatArg::Auto => Format::Auto,
                FormatArg::Dbn => Format::Dbn,
                FormatArg::Csv => Format::Csv,
                FormatArg::Lean => Format::Lean,
            },
            tz: parse_time_zone(&self.tz)?,
            bar_time: match self.bar_time {
                BarTimeArg::Start => BarTime::Start,
                BarTimeArg::End => BarTime::End,
            },
            bar_seconds: self.bar_seconds,
        };
        let adjustment = match self.adjustment {
            AdjustmentArg::None => Adjustment::None,
            AdjustmentArg::Difference => Adjustment::Difference,
            AdjustmentArg::Ratio => Adjustment::Ratio,
        };
        Ok(foxhunt_data::Dataset::load(
            &self.data_dir,
            &selector,
            &opts,
            &SessionCalendar::cme(),
            adjustment,
            &FeatureConfig::default(),
        )?)
    }
}

/// Walk-forward window flags: each period in months, weeks or days.
#[derive(Debug, Clone, Default, Args)]
pub struct WindowArgs {
    /// Train period in months.
    #[arg(long)]
    pub train_months: Option<u32>,
    /// Train period in weeks.
    #[arg(long)]
    pub train_weeks: Option<u32>,
    /// Train period in days.
    #[arg(long)]
    pub train_days: Option<u32>,
    /// Validation period in months.
    #[arg(long)]
    pub val_months: Option<u32>,
    /// Validation period in weeks.
    #[arg(long)]
    pub val_weeks: Option<u32>,
    /// Validation period in days.
    #[arg(long)]
    pub val_days: Option<u32>,
    /// Test period in months.
    #[arg(long)]
    pub test_months: Option<u32>,
    /// Test period in weeks.
    #[arg(long)]
    pub test_weeks: Option<u32>,
    /// Test period in days.
    #[arg(long)]
    pub test_days: Option<u32>,
    /// Step between windows in months.
    #[arg(long)]
    pub step_months: Option<u32>,
    /// Step between windows in weeks.
    #[arg(long)]
    pub step_weeks: Option<u32>,
    /// Step between windows in days.
    #[arg(long)]
    pub step_days: Option<u32>,
    /// Days left out between train and validation and between validation and test.
    #[arg(long, default_value_t = 0)]
    pub gap_days: u32,
    /// Anchored (expanding) train instead of rolling.
    #[arg(long)]
    pub anchored: bool,
    /// Minimum bars in each split; windows with fewer are reported and skipped.
    #[arg(long, default_value_t = 100)]
    pub min_bars: usize,
}

fn period(
    name: &str,
    months: Option<u32>,
    weeks: Option<u32>,
    days: Option<u32>,
) -> Result<Option<Period>> {
    Ok(match (months, weeks, days) {
        (None, None, None) => None,
        (Some(m), None, None) => Some(Period::Months(m)),
        (None, Some(w), None) => Some(Period::Weeks(w)),
        (None, None, Some(d)) => Some(Period::Days(d)),
        _ => bail!("give the {name} period once: --{name}-months, --{name}-weeks or --{name}-days"),
    })
}

impl WindowArgs {
    /// The plan's configuration, `None` when no window flag was given.
    pub fn config(&self) -> Result<Option<WalkForwardConfig>> {
        let parts = [
            period(
                "train",
                self.train_months,
                self.train_weeks,
                self.train_days,
            )?,
            period("val", self.val_months, self.val_weeks, self.val_days)?,
            period("test", self.test_months, self.test_weeks, self.test_days)?,
            period("step", self.step_months, self.step_weeks, self.step_days)?,
        ];
        match parts {
            [None, None, None, None] => Ok(None),
            [Some(train), Some(val), Some(test), Some(step)] => Ok(Some(WalkForwardConfig {
                gap: Period::Days(self.gap_days),
                mode: if self.anchored {
                    TrainMode::Anchored
                } else {
                    TrainMode::Rolling
                },
                min_bars: self.min_bars,
                ..WalkForwardConfig::new(train, val, test, step)
            })),
            _ => bail!(
                "walk-forward windows need all four periods: train, val, test and step (e.g. --train-months 3 --val-months 1 --test-months 1 --step-months 1)"
            ),
        }
    }
}
