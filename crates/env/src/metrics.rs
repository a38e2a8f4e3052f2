//! Backtest metrics from daily (per-session) PnL, the equity curve and the trade list.
//!
//! Conventions: a day is a trading session; Sharpe = mean / sample std of daily PnL x sqrt(252);
//! Sortino = mean / downside deviation x sqrt(252), downside deviation = sqrt(mean(min(x, 0)^2))
//! over all days; maximum drawdown is the largest fall of equity from a running peak (currency,
//! and as a fraction of capital + peak); Calmar = annualized return / maximum drawdown fraction,
//! annualized return = total PnL / capital x 252 / days. Undefined ratios are `None`.

use serde::Serialize;

/// Trading days per year, for annualizing.
pub const DAYS_PER_YEAR: f64 = 252.0;

/// Summary of one backtest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Metrics {
    /// Sum of all step PnL, costs included (currency).
    pub total_pnl: f64,
    /// Capital the return is stated on (currency).
    pub capital: f64,
    /// total_pnl / capital.
    pub return_on_capital: f64,
    /// Annualized Sharpe ratio of daily PnL.
    pub sharpe: Option<f64>,
    /// Annualized Sortino ratio of daily PnL.
    pub sortino: Option<f64>,
    /// Largest peak-to-trough fall of equity (currency, >= 0).
    pub max_drawdown: f64,
    /// The same as a fraction of capital + peak equity.
    pub max_drawdown_fraction: f64,
    /// Annualized return / maximum drawdown fraction.
    pub calmar: Option<f64>,
    /// Share of closed trades with positive PnL.
    pub hit_rate: Option<f64>,
    /// Closed trades (flat -> position -> flat, a flip closes one and opens one).
    pub trades: usize,
    /// Contracts bought and sold, rolls included.
    pub contracts_traded: u64,
    /// Contracts traded per day.
    pub turnover_per_day: f64,
    /// Mean bars a trade was held.
    pub avg_holding_bars: Option<f64>,
    /// Commission and slippage paid (currency).
    pub total_costs: f64,
    /// Bars in the backtest.
    pub bars: usize,
    /// Trading days in the backtest.
    pub days: usize,
}

/// Inputs of [`Metrics::compute`].
pub struct MetricInputs<'a> {
    /// PnL per trading day, in order.
    pub daily_pnl: &'a [f64],
    /// Equity (cumulative PnL, starting at 0) after each bar.
    pub equity: &'a [f64],
    /// (PnL, bars held) of each closed trade.
    pub trades: &'a [(f64, usize)],
    /// Capital for returns and drawdown fractions.
    pub capital: f64,
    /// Contracts traded.
    pub contracts_traded: u64,
    /// Costs paid.
    pub total_costs: f64,
    /// Bars covered.
    pub bars: usize,
}

/// What [`Metrics::from_parts`] needs: the daily PnL and what the equity curve and the trade
/// list come to (a backtest on the device books these without keeping either).
pub struct MetricParts<'a> {
    /// PnL per trading day, in order.
    pub daily_pnl: &'a [f64],
    /// Largest fall of equity from its running peak (the peak starting at 0).
    pub max_drawdown: f64,
    /// The largest of those falls as a fraction of capital + peak.
    pub max_drawdown_fraction: f64,
    /// Closed trades.
    pub trades: usize,
    /// Closed trades with a positive PnL.
    pub winning_trades: usize,
    /// Bars the closed trades were held, summed.
    pub bars_held: u64,
    /// Capital for returns and drawdown fractions.
    pub capital: f64,
    /// Contracts traded.
    pub contracts_traded: u64,
    /// Costs paid.
    pub total_costs: f64,
    /// Bars covered.
    pub bars: usize,
}

impl Metrics {
    /// Computes every metric from the backtest's records.
    pub fn compute(i: &MetricInputs<'_>) -> Self {
        let (mut peak, mut max_dd, mut max_dd_frac) = (0.0f64, 0.0f64, 0.0f64);
        for &e in i.equity {
            peak = peak.max(e);
            max_dd = max_dd.max(peak - e);
            max_dd_frac = max_dd_frac.max((peak - e) / (i.capital + peak));
        }
        Self::from_parts(&MetricParts {
            daily_pnl: i.daily_pnl,
            max_drawdown: max_dd,
            max_drawdown_fraction: max_dd_frac,
            trades: i.trades.len(),
            winning_trades: i.trades.iter().filter(|(p, _)| *p > 0.0).count(),
            // Whole numbers: their sum in any order is the one a float sum in order gives
            // (below 2^53).
            bars_held: i.trades.iter().map(|&(_, b)| b as u64).sum(),
            capital: i.capital,
            contracts_traded: i.contracts_traded,
            total_costs: i.total_costs,
            bars: i.bars,
        })
    }

    /// Every metric from the daily PnL and what the curve and the trades come to.
    pub fn from_parts(i: &MetricParts<'_>) -> Self {
        let days = i.daily_pnl.len();
        let total_pnl: f64 = i.daily_pnl.iter().sum();
        let mean = if days > 0 {
            total_pnl / days as f64
        } else {
            0.0
        };
        let sharpe = (days >= 2).then(|| {
            let var =
                i.daily_pnl.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (days - 1) as f64;
            (var > 0.0).then(|| mean / var.sqrt() * DAYS_PER_YEAR.sqrt())
        });
        let sortino = (days >= 1).then(|| {
            let down =
                (i.daily_pnl.iter().map(|x| x.min(0.0).powi(2)).sum::<f64>() / days as f64).sqrt();
            (down > 0.0).then(|| mean / down * DAYS_PER_YEAR.sqrt())
        });
        let annual = if days > 0 {
            total_pnl / i.capital * DAYS_PER_YEAR / days as f64
        } else {
            0.0
        };
        let n_trades = i.trades;
        Self {
            total_pnl,
            capital: i.capital,
            return_on_capital: total_pnl / i.capital,
            sharpe: sharpe.flatten(),
            sortino: sortino.flatten(),
            max_drawdown: i.max_drawdown,
            max_drawdown_fraction: i.max_drawdown_fraction,
            calmar: (i.max_drawdown_fraction > 0.0).then(|| annual / i.max_drawdown_fraction),
            hit_rate: (n_trades > 0).then(|| i.winning_trades as f64 / n_trades as f64),
            trades: n_trades,
            contracts_traded: i.contracts_traded,
            turnover_per_day: if days > 0 {
                i.contracts_traded as f64 / days as f64
            } else {
                0.0
            },
            avg_holding_bars: (n_trades > 0).then(|| i.bars_held as f64 / n_trades as f64),
            total_costs: i.total_costs,
            bars: i.bars,
            days,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_values() {
        // Daily PnL 100, -50, 150: mean 66.667; sample std = sqrt(((33.33)^2 + (116.67)^2 + (83.33)^2) / 2)
        // = sqrt((1111.1 + 13611.1 + 6944.4) / 2) = sqrt(10833.3) = 104.083.
        let daily = [100.0, -50.0, 150.0];
        let equity = [0.0, 100.0, 50.0, 200.0];
        let m = Metrics::compute(&MetricInputs {
            daily_pnl: &daily,
            equity: &equity,
            trades: &[(120.0, 10), (-20.0, 4), (100.0, 1)],
            capital: 10_000.0,
            contracts_traded: 12,
            total_costs: 30.0,
            bars: 99,
        });
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.abs().max(1.0);
        assert!(close(m.total_pnl, 200.0));
        assert!(close(
            m.sharpe.expect("defined"),
            66.666_666_666_666_67 / 104.083_299_973_306_9 * 252f64.sqrt()
        ));
        // Downside deviation: sqrt(50^2 / 3) = 28.8675.
        assert!(close(
            m.sortino.expect("defined"),
            66.666_666_666_666_67 / 28.867_513_459_481_29 * 252f64.sqrt()
        ));
        assert!(close(m.max_drawdown, 50.0));
        assert!(close(m.max_drawdown_fraction, 50.0 / 10_100.0));
        assert!(close(
            m.calmar.expect("defined"),
            (200.0 / 10_000.0 * 252.0 / 3.0) / (50.0 / 10_100.0)
        ));
        assert!(close(m.hit_rate.expect("defined"), 2.0 / 3.0));
        assert!(close(m.avg_holding_bars.expect("defined"), 5.0));
        assert!(close(m.turnover_per_day, 4.0));
        assert!(close(m.return_on_capital, 0.02));
    }

    #[test]
    fn undefined_ratios_are_none() {
        let m = Metrics::compute(&MetricInputs {
            daily_pnl: &[0.0, 0.0],
            equity: &[0.0, 0.0],
            trades: &[],
            capital: 1.0,
            contracts_traded: 0,
            total_costs: 0.0,
            bars: 2,
        });
        assert_eq!(
            (
                m.sharpe,
                m.sortino,
                m.calmar,
                m.hit_rate,
                m.avg_holding_bars
            ),
            (None, None, None, None, None)
        );
    }
}
