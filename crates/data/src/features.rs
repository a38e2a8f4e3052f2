//! Causal features: row t is computed from bars at or before t of t's own session only.

use serde::Serialize;

use crate::continuous::ContinuousSeries;
use crate::session::SessionCalendar;

/// Which features to compute. Defaults: returns over 1, 5, 15 and 60 bars; realized volatility
/// over 15 and 60 bars; volume z-score over 60 bars; time encodings on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FeatureConfig {
    /// Log-return horizons in bars.
    pub return_horizons: Vec<usize>,
    /// Realized-volatility windows in bars.
    pub vol_windows: Vec<usize>,
    /// Window of the log-volume z-score, in bars.
    pub volume_window: usize,
    /// Add time-of-day and day-of-week sin/cos and the session age.
    pub time_encodings: bool,
}

impl Default for FeatureConfig {
    fn default() -> Self {
        Self {
            return_horizons: vec![1, 5, 15, 60],
            vol_windows: vec![15, 60],
            volume_window: 60,
            time_encodings: true,
        }
    }
}

impl FeatureConfig {
    /// Column names in order.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .return_horizons
            .iter()
            .map(|h| format!("ret_{h}"))
            .collect();
        names.extend(self.vol_windows.iter().map(|w| format!("rvol_{w}")));
        names.push("range".into());
        names.push(format!("volume_z_{}", self.volume_window));
        if self.time_encodings {
            names.extend(
                ["tod_sin", "tod_cos", "dow_sin", "dow_cos", "session_age"].map(String::from),
            );
        }
        names
    }
}

/// The feature matrix of a continuous series and the price columns the environment needs.
///
/// `values` is row-major `[rows, cols]` f32. `open`/`close` are the traded prices (f64, exact
/// tick arithmetic) of each row, [`ContinuousSeries::traded_bars`]: raw moves within a
/// contract, joined at rolls, the same under every adjustment; `session` is the session index
/// per row.
#[derive(Debug, Clone, Serialize)]
pub struct FeatureMatrix {
    /// Column names, `[cols]`.
    pub names: Vec<String>,
    /// Number of rows T.
    pub rows: usize,
    /// Number of columns F.
    pub cols: usize,
    /// Row-major values, `[rows * cols]`.
    pub values: Vec<f32>,
    /// Bar start per row, ns UTC, `[rows]`.
    pub ts: Vec<i64>,
    /// Traded open per row, `[rows]`.
    pub open: Vec<f64>,
    /// Traded close per row, `[rows]`.
    pub close: Vec<f64>,
    /// Session index per row, `[rows]`.
    pub session: Vec<u32>,
    /// Front contract per row (index into the series' contracts), `[rows]`: a change marks a roll.
    pub contract: Vec<u16>,
}

impl FeatureMatrix {
    /// Row t, `[cols]`.
    pub fn row(&self, t: usize) -> &[f32] {
        &self.values[t * self.cols..(t + 1) * self.cols]
    }
}

/// Computes the features of `series`.
///
/// Look-back never crosses a session boundary: a horizon reaching before the session's first
/// bar is cut there, and the reference price becomes that bar's open. Prices are the raw prices
/// of the front contract (one contract per session), so adjustment does not change features.
pub fn compute_features(
    series: &ContinuousSeries,
    calendar: &SessionCalendar,
    cfg: &FeatureConfig,
) -> FeatureMatrix {
    assert!(
        cfg.return_horizons
            .iter()
            .chain(&cfg.vol_windows)
            .all(|&h| h > 0)
            && cfg.volume_window > 0,
        "feature horizons and windows must be positive"
    );
    let names = cfg.names();
    let (rows, cols) = (series.len(), names.len());
    let mut values = vec![0f32; rows * cols];
    // Features never look across a session boundary, so sessions can be computed independently:
    // split the rows at a session boundary near the middle and use two threads on large inputs.
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(2);
    let split = if threads > 1 && rows > 50_000 {
        let mid = series.session[rows / 2];
        series.session.partition_point(|&s| s < mid)
    } else {
        rows
    };
    let (head, tail) = values.split_at_mut(split * cols);
    std::thread::scope(|scope| {
        if !tail.is_empty() {
            scope.spawn(|| fill_rows(series, calendar, cfg, split..rows, tail));
        }
        fill_rows(series, calendar, cfg, 0..split, head);
    });
    // PnL is booked on the traded prices, never the display adjustment: results do not
    // depend on --adjustment.
    let (open, close) = series.traded_bars().map(|b| (b.open(), b.close())).unzip();
    FeatureMatrix {
        names,
        rows,
        cols,
        values,
        ts: series.raw.iter().map(|b| b.ts()).collect(),
        open,
        close,
        session: series.session.clone(),
        contract: series.contract.clone(),
    }
}

/// Fills `out` (row-major, `[range.len() * cols]`) with the features of rows `range`, which must
/// start at a session's first row.
fn fill_rows(
    series: &ContinuousSeries,
    calendar: &SessionCalendar,
    cfg: &FeatureConfig,
    range: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let cols = out.len() / range.len().max(1);
    let rows = range.len();
    let raw = &series.raw[range.clone()];
    let session = &series.session[range];
    let values = out;
    // Prefix sums (f64) of squared 1-bar returns, log volume and its square; reset per session.
    let mut p_r2 = vec![0f64; rows + 1];
    let mut p_v = vec![0f64; rows + 1];
    let mut p_v2 = vec![0f64; rows + 1];
    let mut ln_close = vec![0f64; rows];
    let mut ln_session_open = 0.0;
    let mut cursor = calendar.cursor();
    // sin/cos tables: minutes of the day and weekdays take few values, and trig per row is
    // most of the cost of this function otherwise.
    let tod: Vec<(f32, f32)> = (0..1440)
        .map(|m| unit_circle(f64::from(m) / 1440.0))
        .collect();
    let dow: Vec<(f32, f32)> = (0..5).map(|d| unit_circle(f64::from(d) / 5.0)).collect();
    let age_scale = 1.0 / 1440f64.ln();
    let mut s0 = 0usize;
    for t in 0..rows {
        if t > 0 && session[t] != session[t - 1] {
            s0 = t;
        }
        // Log prices once per row; every return is then a difference of logs.
        ln_close[t] = raw[t].close().ln();
        if t == s0 {
            ln_session_open = raw[s0].open().ln();
        }
        let reference = |h: usize| {
            if t >= s0 + h {
                ln_close[t - h]
            } else {
                ln_session_open
            }
        };
        let r1 = ln_close[t] - reference(1);
        let lv = raw[t].volume().ln_1p();
        p_r2[t + 1] = p_r2[t] + r1 * r1;
        p_v[t + 1] = p_v[t] + lv;
        p_v2[t + 1] = p_v2[t] + lv * lv;
        let row = &mut values[t * cols..(t + 1) * cols];
        let mut c = 0;
        for &h in &cfg.return_horizons {
            row[c] = (ln_close[t] - reference(h)) as f32;
            c += 1;
        }
        for &w in &cfg.vol_windows {
            let a = (t + 1).saturating_sub(w).max(s0);
            let n = (t + 1 - a) as f64;
            row[c] = ((p_r2[t + 1] - p_r2[a]) / n).max(0.0).sqrt() as f32;
            c += 1;
        }
        row[c] = (raw[t].high() / raw[t].low()).ln() as f32;
        c += 1;
        let a = (t + 1).saturating_sub(cfg.volume_window).max(s0);
        let n = (t + 1 - a) as f64;
        let mean = (p_v[t + 1] - p_v[a]) / n;
        let var = (p_v2[t + 1] - p_v2[a]) / n - mean * mean;
        row[c] = if n >= 2.0 && var > 1e-12 {
            ((lv - mean) / var.sqrt()) as f32
        } else {
            0.0
        };
        c += 1;
        if cfg.time_encodings {
            let p = cursor.locate(raw[t].ts());
            let (ts, tc) = tod[usize::from(p.minute_of_day)];
            let (ds, dc) = dow[usize::from(p.weekday)];
            row[c..c + 4].copy_from_slice(&[ts, tc, ds, dc]);
            row[c + 4] = (((t - s0) as f64).ln_1p() * age_scale) as f32;
        }
    }
}

fn unit_circle(fraction: f64) -> (f32, f32) {
    let angle = std::f64::consts::TAU * fraction;
    (angle.sin() as f32, angle.cos() as f32)
}

/// Per-column mean and standard deviation fitted on one range of rows (a window's train split)
/// and applied to any rows, so validation and test never inform the scaling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Normalizer {
    /// Column means, `[cols]`.
    pub mean: Vec<f32>,
    /// Column standard deviations (floored at 1e-6), `[cols]`.
    pub std: Vec<f32>,
}

impl Normalizer {
    /// Fits on rows `range` of `m`. Panics on an empty range (a programmer error: windows with
    /// too few bars are skipped by the planner).
    pub fn fit(m: &FeatureMatrix, range: std::ops::Range<usize>) -> Self {
        assert!(
            !range.is_empty() && range.end <= m.rows,
            "normalizer needs a non-empty range of rows"
        );
        let n = range.len() as f64;
        let mut sum = vec![0f64; m.cols];
        let mut sum2 = vec![0f64; m.cols];
        for t in range {
            for (c, &v) in m.row(t).iter().enumerate() {
                sum[c] += f64::from(v);
                sum2[c] += f64::from(v) * f64::from(v);
            }
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
        let std = sum2
            .iter()
            .zip(&mean)
            .map(|(s2, m)| ((s2 / n - m * m).max(0.0).sqrt().max(1e-6)) as f32)
            .collect();
        Self {
            mean: mean.into_iter().map(|m| m as f32).collect(),
            std,
        }
    }

    /// Normalized copy of rows `range`, row-major `[range.len() * cols]`.
    pub fn apply(&self, m: &FeatureMatrix, range: std::ops::Range<usize>) -> Vec<f32> {
        let mut out = Vec::with_capacity(range.len() * m.cols);
        for t in range {
            out.extend(
                m.row(t)
                    .iter()
                    .zip(self.mean.iter().zip(&self.std))
                    .map(|(v, (mu, sd))| (v - mu) / sd),
            );
        }
        out
    }
}
