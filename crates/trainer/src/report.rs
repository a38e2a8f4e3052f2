//! The run's reports: per-window results, the aggregate over all test periods beside the
//! baselines, the out-of-sample equity curve (CSV and PNG), the phase breakdowns, and the
//! summary table `foxhunt report` prints. Every file is written atomically.

use std::fmt::Write as _;
use std::path::Path;

use foxhunt_data::walkforward::Split;
use foxhunt_env::BacktestReport;
use foxhunt_env::Metrics;
use foxhunt_env::metrics::MetricInputs;
use foxhunt_memory::PoolStats;
use serde::{Deserialize, Serialize};

use crate::TrainError;
use crate::phase::PhaseTimes;

/// One epoch's learning statistics and validation result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochSummary {
    /// Epoch within the window.
    pub epoch: usize,
    /// Mean loss over the epoch's updates (None before the first update).
    pub loss: Option<f32>,
    /// Mean Q of the chosen actions over the updates.
    pub mean_q: Option<f32>,
    /// Mean |TD error| over the updates.
    pub td_abs_mean: Option<f32>,
    /// Mean gradient norm (before clipping) over the updates.
    pub grad_norm: Option<f32>,
    /// Exploration rate at the epoch's end.
    pub epsilon: f64,
    /// Net PnL of the greedy policy on the validation split.
    pub val_pnl: f64,
}

/// How a window ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "status")]
pub enum WindowStatus {
    /// Trained, validated and tested.
    Ok,
    /// Abandoned; the run went on with the next window.
    Failed {
        /// Why.
        error: String,
    },
}

/// A policy's metrics over a period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// `agent`, `flat`, `buy-and-hold`, `random` or `momentum`.
    pub policy: String,
    /// Its metrics.
    pub metrics: Metrics,
}

/// One window's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowReport {
    /// Index in the walk-forward plan.
    pub index: usize,
    /// Train split (dates and rows of the series).
    pub train: Split,
    /// Validation split.
    pub val: Split,
    /// Test split.
    pub test: Split,
    /// Outcome.
    #[serde(flatten)]
    pub status: WindowStatus,
    /// Epoch whose weights scored best on validation.
    pub best_epoch: Option<usize>,
    /// The best epoch's validation metrics.
    pub validation: Option<Metrics>,
    /// The best epoch's agent on the test split, then the baselines on the same split.
    pub test_results: Vec<PolicyResult>,
    /// Per epoch statistics (of the selected agent, in a population).
    pub epochs: Vec<EpochSummary>,
    /// A population's members on validation, the one selected and the vote (absent for one
    /// agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<crate::population::PopulationReport>,
}

/// A policy's raw test-period results, kept so that the aggregate is computed from the pieces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// Policy name.
    pub policy: String,
    /// (bar start ns UTC, equity) after each bar, starting at 0.
    pub equity: Vec<(i64, f64)>,
    /// Net PnL per trading day.
    pub daily_pnl: Vec<f64>,
    /// Closed trades (net PnL, bars held).
    pub trades: Vec<(f64, usize)>,
    /// Contracts traded.
    pub contracts_traded: u64,
    /// Costs paid.
    pub total_costs: f64,
    /// Bars in the period.
    pub bars: usize,
}

impl Curve {
    /// The pieces of a backtest.
    pub fn from_backtest(name: &str, r: &BacktestReport) -> Self {
        Self {
            policy: name.to_owned(),
            equity: r.equity.clone(),
            daily_pnl: r.daily_pnl.clone(),
            trades: r.trades.clone(),
            contracts_traded: r.contracts_traded,
            total_costs: r.metrics.total_costs,
            bars: r.metrics.bars,
        }
    }
}

/// A window skipped by the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// Index in the plan.
    pub index: usize,
    /// Why.
    pub reason: String,
}

/// The whole run's report (`report.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// `cpu` or `cuda`.
    pub device: String,
    /// Milliseconds to open the device (CUDA context, library checks) before the first window;
    /// the first epoch of the run is this plus that epoch's own breakdown.
    #[serde(default)]
    pub device_open_ms: f64,
    /// Wall time of training and testing this process's windows (ms; 0 for an aggregate).
    #[serde(default)]
    pub train_ms: f64,
    /// Windows trained (or failed), in order.
    pub windows: Vec<WindowReport>,
    /// Windows the plan skipped.
    pub skipped: Vec<Skipped>,
    /// Windows wholly inside holes in the data.
    pub empty_windows: usize,
    /// Over all test periods of the windows that finished: the agent, then the baselines.
    pub aggregate: Vec<PolicyResult>,
    /// Every epoch's phase breakdown.
    pub phases: Vec<PhaseTimes>,
    /// The window-data pool's bookkeeping.
    pub pool: PoolStats,
}

impl RunReport {
    /// What the report holds as results, apart from what the process that wrote it measured
    /// (timings, device, pool): the windows, the skipped and empty ones, the aggregate. A
    /// sharded or multi-worker run equals a one-process run in these.
    pub fn results(&self) -> serde_json::Value {
        serde_json::json!({
            "windows": self.windows,
            "skipped": self.skipped,
            "empty_windows": self.empty_windows,
            "aggregate": self.aggregate,
        })
    }

    /// Whether any window finished with a result: a run where none did (every window failed)
    /// has no out-of-sample result, and `foxhunt train` exits non-zero.
    pub fn has_result(&self) -> bool {
        self.windows.iter().any(|w| w.status == WindowStatus::Ok)
    }
}

/// Writes `value` as pretty JSON with its checksum (`foxhunt_fs::to_sealed_json`), atomically:
/// every JSON file of a run directory is read back only through [`read_json`], which checks it.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), TrainError> {
    Ok(foxhunt_fs::write_atomic(path, &sealed_json(path, value)?)?)
}

/// The bytes [`write_json`] writes to `path` for `value` (for a writer on another thread).
pub fn sealed_json<T: Serialize>(path: &Path, value: &T) -> Result<Vec<u8>, TrainError> {
    foxhunt_fs::to_sealed_json(value).map_err(|e| TrainError::file(path, e))
}

/// Reads JSON written by [`write_json`]; a file whose content changed since is refused.
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, TrainError> {
    let bytes =
        std::fs::read(path).map_err(|e| TrainError::file(path, format!("cannot read: {e}")))?;
    Ok(foxhunt_fs::from_sealed_json(path, &bytes)?)
}

/// One policy's equity over several periods, each period starting where the previous ended.
pub fn chained_equity(curves: &[&Curve]) -> Vec<f64> {
    let mut offset = 0.0;
    let mut out = Vec::new();
    for c in curves {
        out.extend(c.equity.iter().map(|&(_, e)| offset + e));
        offset += c.equity.last().map_or(0.0, |&(_, e)| e);
    }
    out
}

/// Metrics over several periods, from their pieces: daily PnL and trades concatenated, equity
/// chained (each period starts where the previous ended).
pub fn aggregate(curves: &[&Curve], capital: f64) -> Metrics {
    let mut daily = Vec::new();
    let mut equity = vec![0.0];
    equity.extend(chained_equity(curves));
    let mut trades = Vec::new();
    let (mut contracts, mut costs, mut bars) = (0, 0.0, 0);
    for c in curves {
        daily.extend_from_slice(&c.daily_pnl);
        trades.extend_from_slice(&c.trades);
        contracts += c.contracts_traded;
        costs += c.total_costs;
        bars += c.bars;
    }
    Metrics::compute(&MetricInputs {
        daily_pnl: &daily,
        equity: &equity,
        trades: &trades,
        capital,
        contracts_traded: contracts,
        total_costs: costs,
        bars,
    })
}

/// The out-of-sample equity curve over all test periods as CSV: one row per bar of the agent's
/// curve, every policy's equity chained across windows (a policy's value at a time is its
/// latest point at or before it).
pub fn equity_csv(windows: &[(usize, Vec<Curve>)]) -> String {
    let Some((_, first)) = windows.first() else {
        return "time,window\n".into();
    };
    let names: Vec<&str> = first.iter().map(|c| c.policy.as_str()).collect();
    let mut out = format!("time,window,{}\n", names.join(","));
    let mut offsets = vec![0.0; names.len()];
    for (w, curves) in windows {
        let agent = &curves[0];
        for &(ts, _) in &agent.equity {
            let time = jiff::Timestamp::from_nanosecond(i128::from(ts))
                .map(|t| t.to_string())
                .unwrap_or_else(|_| ts.to_string());
            let _ = write!(out, "{time},{w}");
            for (c, off) in curves.iter().zip(&offsets) {
                let at = c.equity.partition_point(|&(t, _)| t <= ts);
                let v = if at == 0 { 0.0 } else { c.equity[at - 1].1 };
                let _ = write!(out, ",{:.2}", off + v);
            }
            out.push('\n');
        }
        for (c, off) in curves.iter().zip(offsets.iter_mut()) {
            *off += c.equity.last().map_or(0.0, |&(_, e)| e);
        }
    }
    out
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The summary table `foxhunt train` ends with and `foxhunt report` prints.
pub fn summary(r: &RunReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "device {}; {} windows trained, {} failed, {} skipped, {} empty",
        r.device,
        r.windows
            .iter()
            .filter(|w| w.status == WindowStatus::Ok)
            .count(),
        r.windows
            .iter()
            .filter(|w| w.status != WindowStatus::Ok)
            .count(),
        r.skipped.len(),
        r.empty_windows
    );
    let _ = writeln!(
        s,
        "\n{:>6}  {:<10} {:<10}  {:>4}  {:>12} {:>12} {:>12}",
        "window", "test from", "test to", "best", "agent pnl", "buy&hold", "flat"
    );
    for w in &r.windows {
        let pnl = |name: &str| {
            w.test_results
                .iter()
                .find(|p| p.policy == name)
                .map_or("-".into(), |p| format!("{:.2}", p.metrics.total_pnl))
        };
        match &w.status {
            WindowStatus::Ok => {
                let _ = writeln!(
                    s,
                    "{:>6}  {:<10} {:<10}  {:>4}  {:>12} {:>12} {:>12}",
                    w.index,
                    w.test.start,
                    w.test.end,
                    w.best_epoch.map_or("-".into(), |e| e.to_string()),
                    pnl("agent"),
                    pnl("buy-and-hold"),
                    pnl("flat")
                );
            }
            WindowStatus::Failed { error } => {
                let _ = writeln!(s, "{:>6}  FAILED: {error}", w.index);
            }
        }
        if let Some(p) = &w.population
            && w.status == WindowStatus::Ok
        {
            let m = &p.members[p.selected];
            let failed = p
                .members
                .iter()
                .filter(|m| m.status != WindowStatus::Ok)
                .count();
            let _ = writeln!(
                s,
                "{:>6}  agent {} of {} selected on validation ({}, seed {}){}{}",
                "",
                p.selected,
                p.members.len(),
                crate::population::describe(&m.settings),
                m.seed,
                if failed > 0 {
                    format!("; {failed} failed")
                } else {
                    String::new()
                },
                if p.ensemble.is_empty() {
                    String::new()
                } else {
                    format!("; vote of agents {:?}", p.ensemble)
                }
            );
        }
    }
    if !r.aggregate.is_empty() {
        let _ = writeln!(
            s,
            "\nout of sample, all test periods:\n{:<14} {:>12} {:>8} {:>8} {:>12} {:>8} {:>8}",
            "policy", "net pnl", "sharpe", "sortino", "max dd", "trades", "days"
        );
        for p in &r.aggregate {
            let m = &p.metrics;
            let _ = writeln!(
                s,
                "{:<14} {:>12.2} {:>8} {:>8} {:>12.2} {:>8} {:>8}",
                p.policy,
                m.total_pnl,
                fmt_opt(m.sharpe),
                fmt_opt(m.sortino),
                m.max_drawdown,
                m.trades,
                m.days
            );
        }
    }
    if let Some([init, collect, train, sync, eval, total]) = PhaseTimes::means(&r.phases) {
        let _ = writeln!(
            s,
            "\nmean phase times per epoch (ms): init {init:.3} collect {collect:.3} train {train:.3} sync {sync:.3} eval {eval:.3} total {total:.3}",
        );
    }
    s
}
