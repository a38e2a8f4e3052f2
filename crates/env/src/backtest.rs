//! Deterministic backtests of a policy over a split, and the baseline policies every report
//! shows beside the agent.

use std::ops::Range;

use serde::Serialize;

use crate::error::EnvError;
use crate::exec::{Execution, SessionRule, next_entry, transition};
use crate::market::MarketData;
use crate::metrics::{MetricInputs, Metrics};
use crate::vec_env::{EnvConfig, mix64, observe};

/// What a policy sees at a decision: the close of bar `t`.
pub struct Decision<'a> {
    /// Current bar (row of the market data).
    pub t: usize,
    /// Position held now (contracts).
    pub position: i32,
    /// The observation, laid out as [`EnvConfig::obs_dim`] says.
    pub obs: &'a [f32],
    /// The market data, for rule-based baselines; a policy must read no row after `t`.
    pub market: &'a MarketData,
}

/// A trading policy: a target position for each decision.
pub trait Policy {
    /// Name in reports.
    fn name(&self) -> String;
    /// Target position in contracts (clamped to +-max_position by the backtest).
    fn target(&mut self, d: &Decision<'_>) -> i32;
    /// Whether [`Decision::obs`] is read; a policy that decides without it (decisions made
    /// elsewhere, rules on the market data) saves the backtest building it at every bar.
    fn observes(&self) -> bool {
        true
    }
}

/// Always flat.
pub struct Flat;
impl Policy for Flat {
    fn name(&self) -> String {
        "flat".into()
    }
    fn observes(&self) -> bool {
        false
    }
    fn target(&mut self, _: &Decision<'_>) -> i32 {
        0
    }
}

/// Long one contract from the first fill to the end (run it with [`SessionRule::Hold`]).
pub struct BuyAndHold;
impl Policy for BuyAndHold {
    fn name(&self) -> String {
        "buy-and-hold".into()
    }
    fn observes(&self) -> bool {
        false
    }
    fn target(&mut self, _: &Decision<'_>) -> i32 {
        1
    }
}

/// A uniformly random target each decision, seeded.
pub struct Random {
    seed: u64,
    max_position: u8,
}
impl Random {
    /// Random targets in `-max_position..=max_position`.
    pub fn new(seed: u64, max_position: u8) -> Self {
        Self { seed, max_position }
    }
}
impl Policy for Random {
    fn name(&self) -> String {
        "random".into()
    }
    fn observes(&self) -> bool {
        false
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        let n = 2 * u64::from(self.max_position) + 1;
        (mix64(self.seed ^ mix64(d.t as u64)) % n) as i32 - i32::from(self.max_position)
    }
}

/// Long after a rise, short after a fall: the sign of close[t] - close[t - lookback], flat when
/// the look-back would reach before the session's first bar.
pub struct Momentum {
    /// Bars to look back.
    pub lookback: usize,
}
impl Policy for Momentum {
    fn name(&self) -> String {
        format!("momentum-{}", self.lookback)
    }
    fn observes(&self) -> bool {
        false
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        let m = d.market;
        if d.t < self.lookback || m.session()[d.t - self.lookback] != m.session()[d.t] {
            return 0;
        }
        let change = m.close()[d.t] - m.close()[d.t - self.lookback];
        if change > 0.0 {
            1
        } else if change < 0.0 {
            -1
        } else {
            0
        }
    }
}

/// A backtest's result: metrics and the equity curve.
#[derive(Debug, Clone, Serialize)]
pub struct BacktestReport {
    /// Policy name.
    pub policy: String,
    /// The metrics.
    pub metrics: Metrics,
    /// (bar start ns UTC, equity in currency) after each bar.
    pub equity: Vec<(i64, f64)>,
    /// Net PnL of each trading day, in order (what Sharpe and Sortino are computed from; kept so
    /// that reports over several periods can compute their metrics from the pieces).
    #[serde(skip)]
    pub daily_pnl: Vec<f64>,
    /// Closed trades as (net PnL, bars held).
    #[serde(skip)]
    pub trades: Vec<(f64, usize)>,
    /// Contracts bought and sold.
    #[serde(skip)]
    pub contracts_traded: u64,
}

/// Runs `policy` over rows `split` from a flat start: one decision per bar close, fills and costs
/// as [`transition`] says, flattened at the end. Deterministic.
pub fn backtest(
    m: &MarketData,
    x: &Execution,
    cfg: &EnvConfig,
    split: Range<usize>,
    capital: f64,
    policy: &mut dyn Policy,
) -> Result<BacktestReport, EnvError> {
    if split.is_empty() || split.end > m.rows() {
        return Err(EnvError::Config(format!(
            "backtest split {split:?} is empty or outside the {} rows",
            m.rows()
        )));
    }
    if !(capital.is_finite() && capital > 0.0) {
        return Err(EnvError::Config(format!(
            "capital must be positive, got {capital}"
        )));
    }
    let mut obs = vec![0f32; cfg.obs_dim(m.cols())];
    let limit = i32::from(cfg.max_position);
    let (mut t, mut position, mut entry) = (split.start, 0i32, 0.0f64);
    let mut equity_now = 0.0;
    // At most one point per bar and one day per bar: no growth in the loop.
    let mut equity = Vec::with_capacity(split.len() + 1);
    equity.push((m.ts()[t], 0.0));
    let mut daily: Vec<f64> = Vec::with_capacity(split.len());
    daily.push(0.0);
    let mut day_session = m.session()[t];
    let (mut trades, mut trade_pnl, mut trade_bars) = (Vec::new(), 0.0, 0usize);
    let (mut contracts, mut costs) = (0u64, 0.0);
    let observes = policy.observes();
    loop {
        if observes {
            observe(m, cfg, x.tick_size, t, position, entry, &mut obs);
        }
        let target = policy
            .target(&Decision {
                t,
                position,
                obs: &obs,
                market: m,
            })
            .clamp(-limit, limit);
        let tr = transition(m, x, t, split.end, cfg.session_rule, position, target);
        let pnl = tr.pnl();
        equity_now += pnl;
        contracts += u64::from(tr.traded);
        costs += tr.cost;
        if m.session()[tr.next_t] != day_session {
            day_session = m.session()[tr.next_t];
            daily.push(0.0);
        }
        *daily.last_mut().expect("one day at least") += pnl;
        if tr.terminal {
            equity.last_mut().expect("one point at least").1 = equity_now;
        } else {
            equity.push((m.ts()[tr.next_t], equity_now));
        }
        // Trade bookkeeping: a flip closes the old trade (old leg's PnL and exit cost) and opens
        // a new one (new leg's PnL and entry cost).
        let opened = tr.position != 0 && tr.position.signum() != position.signum();
        let closed = position != 0 && tr.position.signum() != position.signum();
        let exit_cost = if closed {
            f64::from(position.unsigned_abs()) * x.cost_per_side
        } else {
            0.0
        };
        if position != 0 {
            trade_pnl += tr.hold_pnl;
            trade_bars += 1;
            if closed {
                trades.push((trade_pnl - exit_cost, trade_bars));
            } else {
                trade_pnl += tr.bar_pnl - tr.cost;
            }
        }
        if opened {
            trade_pnl = tr.bar_pnl - (tr.cost - exit_cost);
            trade_bars = 0;
        }
        entry = next_entry(entry, position, &tr);
        position = tr.position;
        if !tr.terminal {
            t = tr.next_t;
        } else if tr.next_t + 1 < split.end {
            // Flat after the session's end: the next decision is at the next bar's close. The
            // new day is opened by the next step's own check.
            t = tr.next_t + 1;
            equity.push((m.ts()[t], equity_now));
        } else {
            break;
        }
    }
    let values: Vec<f64> = equity.iter().map(|&(_, e)| e).collect();
    let metrics = Metrics::compute(&MetricInputs {
        daily_pnl: &daily,
        equity: &values,
        trades: &trades,
        capital,
        contracts_traded: contracts,
        total_costs: costs,
        bars: split.len(),
    });
    Ok(BacktestReport {
        policy: policy.name(),
        metrics,
        equity,
        daily_pnl: daily,
        trades,
        contracts_traded: contracts,
    })
}

/// The baseline strategies every report shows beside the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// Never trade.
    Flat,
    /// Long one contract from the first fill to the end, held across sessions.
    BuyAndHold,
    /// A seeded random target each bar.
    Random,
    /// Sign of the last 30 bars' price change within the session.
    Momentum,
}

impl Baseline {
    /// All four, in report order.
    pub const ALL: [Baseline; 4] = [
        Baseline::Flat,
        Baseline::BuyAndHold,
        Baseline::Random,
        Baseline::Momentum,
    ];

    /// Backtests this baseline over `split`. Buy-and-hold holds across sessions (its
    /// definition); the others follow `cfg`.
    pub fn run(
        self,
        m: &MarketData,
        x: &Execution,
        cfg: &EnvConfig,
        split: Range<usize>,
        capital: f64,
        seed: u64,
    ) -> Result<BacktestReport, EnvError> {
        match self {
            Baseline::Flat => backtest(m, x, cfg, split, capital, &mut Flat),
            Baseline::BuyAndHold => {
                let hold = EnvConfig {
                    session_rule: SessionRule::Hold,
                    ..cfg.clone()
                };
                backtest(m, x, &hold, split, capital, &mut BuyAndHold)
            }
            Baseline::Random => backtest(
                m,
                x,
                cfg,
                split,
                capital,
                &mut Random::new(seed, cfg.max_position),
            ),
            Baseline::Momentum => {
                backtest(m, x, cfg, split, capital, &mut Momentum { lookback: 30 })
            }
        }
    }
}

/// The four baselines over the same split and costs, in report order.
pub fn baselines(
    m: &MarketData,
    x: &Execution,
    cfg: &EnvConfig,
    split: Range<usize>,
    capital: f64,
    seed: u64,
) -> Result<Vec<BacktestReport>, EnvError> {
    Baseline::ALL
        .iter()
        .map(|b| b.run(m, x, cfg, split.clone(), capital, seed))
        .collect()
}
