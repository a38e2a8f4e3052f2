//! Walk-forward windows: train, validation and test periods cut on trading days and moved
//! forward by a step; rolling or anchored train; optional gaps (purge/embargo) between periods.

use std::ops::Range;

use jiff::Span;
use jiff::civil::Date;
use serde::Serialize;

use crate::error::{DataError, Result};
use crate::session::{date_to_day, day_to_date};

/// A calendar length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// Calendar days.
    Days(u32),
    /// Weeks of 7 calendar days.
    Weeks(u32),
    /// Calendar months (a month after Jan 31 is the last day of February).
    Months(u32),
}

impl Period {
    fn is_zero(self) -> bool {
        matches!(self, Period::Days(0) | Period::Weeks(0) | Period::Months(0))
    }

    /// `times` periods as a span, or an error where that is beyond the calendar's range (a
    /// user can type periods of billions of months).
    fn span(self, times: u32) -> Result<Span> {
        let (n, unit) = match self {
            Period::Days(n) => (n, "days"),
            Period::Weeks(n) => (n, "weeks"),
            Period::Months(n) => (n, "months"),
        };
        let count = i64::from(n) * i64::from(times);
        let span = match self {
            Period::Days(_) => Span::new().try_days(count),
            Period::Weeks(_) => Span::new().try_weeks(count),
            Period::Months(_) => Span::new().try_months(count),
        };
        span.map_err(|_| {
            DataError::InvalidOption(format!(
                "walk-forward period of {count} {unit} is beyond the calendar's range"
            ))
        })
    }
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Period::Days(n) => write!(f, "{n}d"),
            Period::Weeks(n) => write!(f, "{n}w"),
            Period::Months(n) => write!(f, "{n}m"),
        }
    }
}

/// Whether each window's train period slides or grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainMode {
    /// Train is always `train` long and moves with the step.
    #[default]
    Rolling,
    /// Train always starts at the first day (expanding window).
    Anchored,
}

/// A walk-forward plan's parameters (a run's config.json records them; `foxhunt resume` reads
/// them back).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct WalkForwardConfig {
    /// Train period length.
    pub train: Period,
    /// Validation period length.
    pub val: Period,
    /// Test period length.
    pub test: Period,
    /// How far each window moves from the previous one.
    pub step: Period,
    /// Gap left out between train and validation and between validation and test (purge /
    /// embargo), so that labels near a boundary cannot leak. `Days(0)` for none.
    pub gap: Period,
    /// Rolling or anchored train.
    pub mode: TrainMode,
    /// Each split needs at least this many bars, or the window is skipped and reported.
    pub min_bars: usize,
}

impl WalkForwardConfig {
    /// A rolling plan with no gap and `min_bars = 100`.
    pub fn new(train: Period, val: Period, test: Period, step: Period) -> Self {
        Self {
            train,
            val,
            test,
            step,
            gap: Period::Days(0),
            mode: TrainMode::Rolling,
            min_bars: 100,
        }
    }
}

/// Dates of one split, `[start, end)` as YYYY-MM-DD trading days, and its rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Split {
    /// First trading day included.
    pub start: String,
    /// First trading day after the split.
    pub end: String,
    /// Rows of the feature matrix.
    pub rows: Range<usize>,
}

/// One walk-forward window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Window {
    /// Index in the plan, counting skipped windows too.
    pub index: usize,
    /// Train split.
    pub train: Split,
    /// Validation split.
    pub val: Split,
    /// Test split.
    pub test: Split,
}

/// A window left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SkippedWindow {
    /// The window as cut.
    pub window: Window,
    /// Why it is not trained on.
    pub reason: String,
}

/// The windows a plan produces over a data set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Plan {
    /// Windows with enough bars in every split.
    pub windows: Vec<Window>,
    /// Windows skipped for too few bars in some split.
    pub skipped: Vec<SkippedWindow>,
    /// Windows that fall wholly inside a hole in the data (no bar in any split): counted, not
    /// listed, so a data set with a years-long hole does not print hundreds of windows.
    pub empty: usize,
}

/// Cuts the rows of a series into walk-forward windows. `row_days` is the trading day of each
/// row (days since 1970-01-01, non-decreasing). Splits are cut on trading days, so a session
/// is never split between train and test.
pub fn plan(row_days: &[i32], cfg: &WalkForwardConfig) -> Result<Plan> {
    for (name, p) in [
        ("train", cfg.train),
        ("validation", cfg.val),
        ("test", cfg.test),
        ("step", cfg.step),
    ] {
        if p.is_zero() {
            return Err(DataError::InvalidOption(format!(
                "walk-forward {name} period must be longer than zero"
            )));
        }
    }
    assert!(
        row_days.windows(2).all(|w| w[0] <= w[1]),
        "row_days must be non-decreasing"
    );
    let (Some(&first), Some(&last)) = (row_days.first(), row_days.last()) else {
        return Ok(Plan {
            windows: Vec::new(),
            skipped: Vec::new(),
            empty: 0,
        });
    };
    let origin = day_to_date(first);
    let add = |d: Date, span: Result<Span>| -> Result<Date> {
        d.checked_add(span?)
            .map_err(|e| DataError::InvalidOption(format!("walk-forward dates out of range: {e}")))
    };
    let rows_of = |a: Date, b: Date| {
        let (da, db) = (date_to_day(a), date_to_day(b));
        Split {
            start: a.to_string(),
            end: b.to_string(),
            rows: row_days.partition_point(|&d| d < da)..row_days.partition_point(|&d| d < db),
        }
    };
    let mut windows = Vec::new();
    let mut skipped = Vec::new();
    let mut empty = 0;
    for k in 0u32.. {
        let shift = add(origin, cfg.step.span(k))?;
        let train_start = match cfg.mode {
            TrainMode::Rolling => shift,
            TrainMode::Anchored => origin,
        };
        let train_end = add(shift, cfg.train.span(1))?;
        let val_start = add(train_end, cfg.gap.span(1))?;
        let val_end = add(val_start, cfg.val.span(1))?;
        let test_start = add(val_end, cfg.gap.span(1))?;
        let test_end = add(test_start, cfg.test.span(1))?;
        if date_to_day(test_start) > last {
            break;
        }
        let window = Window {
            index: k as usize,
            train: rows_of(train_start, train_end),
            val: rows_of(val_start, val_end),
            test: rows_of(test_start, test_end),
        };
        let short: Vec<String> = [
            ("train", &window.train),
            ("validation", &window.val),
            ("test", &window.test),
        ]
        .iter()
        // An empty split is never usable, whatever min_bars says (0 included).
        .filter(|(_, s)| s.rows.len() < cfg.min_bars.max(1))
        .map(|(n, s)| format!("{n} has {} bars", s.rows.len()))
        .collect();
        if short.is_empty() {
            windows.push(window);
        } else if window.train.rows.is_empty()
            && window.val.rows.is_empty()
            && window.test.rows.is_empty()
        {
            empty += 1;
        } else {
            skipped.push(SkippedWindow {
                window,
                reason: format!(
                    "{} (need at least {})",
                    short.join(", "),
                    cfg.min_bars.max(1)
                ),
            });
        }
    }
    Ok(Plan {
        windows,
        skipped,
        empty,
    })
}
