//! Execution and costs: the one function that says what a step does to a position and to
//! equity. The vectorized environment, the backtester and the GPU kernels all follow it.

use serde::{Deserialize, Serialize};

use crate::market::MarketData;
use crate::spec::ContractSpec;

/// What happens at the end of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SessionRule {
    /// Close the position at the close of a session's last bar; the episode ends there.
    /// Nothing is ever held across the overnight or weekend gap.
    #[default]
    FlattenAtClose,
    /// Hold across sessions (gap risk included); rolls cost a round trip per contract carried.
    /// Used by the buy-and-hold baseline.
    Hold,
}

/// Trading costs, in the contract's currency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Costs {
    /// Commission per contract per side.
    pub commission: f64,
    /// Slippage per contract per side, in ticks against the trader.
    pub slippage_ticks: f64,
}

impl Default for Costs {
    /// 2.50 per contract per side, one tick of slippage.
    fn default() -> Self {
        Self {
            commission: 2.5,
            slippage_ticks: 1.0,
        }
    }
}

/// A contract spec and costs, resolved to the numbers a step needs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Execution {
    /// Currency per point.
    pub multiplier: f64,
    /// Price increment.
    pub tick_size: f64,
    /// Commission + slippage for one contract on one side, in currency.
    pub cost_per_side: f64,
    /// Slippage in price units (ticks x tick size).
    pub slippage_price: f64,
}

impl Execution {
    /// Resolves `spec` and `costs`.
    pub fn new(spec: &ContractSpec, costs: Costs) -> Self {
        Self {
            multiplier: spec.multiplier,
            tick_size: spec.tick_size,
            cost_per_side: costs.commission + costs.slippage_ticks * spec.tick_value(),
            slippage_price: costs.slippage_ticks * spec.tick_size,
        }
    }
}

/// The outcome of one decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    /// The bar whose close ends the step: `t + 1`, or `t` when the step is terminal.
    pub next_t: usize,
    /// Position after the step (0 when terminal).
    pub position: i32,
    /// PnL of the old position from close t to the fill at open t+1 (currency).
    pub hold_pnl: f64,
    /// PnL of the new position from the fill at open t+1 to close t+1 (currency).
    pub bar_pnl: f64,
    /// Commission and slippage paid in the step (currency, >= 0).
    pub cost: f64,
    /// Contracts traded (both legs of a roll counted).
    pub traded: u32,
    /// The step flattened at the close of bar t: t was the last bar of its session (under
    /// `FlattenAtClose`) or of the data; the episode ends.
    pub terminal: bool,
    /// Fill price of the new position (open t+1 plus slippage against the trader), if it traded.
    pub fill: Option<f64>,
}

impl Transition {
    /// Change of equity over the step, costs included (currency).
    pub fn pnl(&self) -> f64 {
        self.hold_pnl + self.bar_pnl - self.cost
    }
}

/// Whether a decision at the close of bar `t` has no next bar to fill at: `t` is the last row
/// before `end`, or (under `FlattenAtClose`) the last bar of its session.
pub fn is_last_bar(m: &MarketData, t: usize, end: usize, rule: SessionRule) -> bool {
    t + 1 >= end || (rule == SessionRule::FlattenAtClose && m.session()[t + 1] != m.session()[t])
}

/// One step: at the close of bar `t` the agent holds `position` and asks for `target`.
///
/// - Normal step: the order fills at the open of bar t+1, `slippage` ticks against the trader; the
///   old position earns `(open[t+1] - close[t])`, the new one `(close[t+1] - open[t+1])`, both times
///   the multiplier; commission and slippage are paid per contract traded. A roll between t and t+1
///   (the front contract changes) costs a round trip per contract carried over.
/// - Terminal step (`is_last_bar`): the position is closed at the close of bar t, paying costs;
///   no price change is earned (the position was marked at that close already).
///
/// Only bars t and t+1 are read; nothing after t+1, and the decision itself saw nothing after t.
pub fn transition(
    m: &MarketData,
    x: &Execution,
    t: usize,
    end: usize,
    rule: SessionRule,
    position: i32,
    target: i32,
) -> Transition {
    if is_last_bar(m, t, end, rule) {
        let traded = position.unsigned_abs();
        return Transition {
            next_t: t,
            position: 0,
            hold_pnl: 0.0,
            bar_pnl: 0.0,
            cost: f64::from(traded) * x.cost_per_side,
            traded,
            terminal: true,
            fill: None,
        };
    }
    let (open, close_t, close_next) = (m.open()[t + 1], m.close()[t], m.close()[t + 1]);
    let mut traded = (target - position).unsigned_abs();
    if m.contract()[t + 1] != m.contract()[t] && position.signum() * target.signum() > 0 {
        // Carried across a roll: sell the old contract and buy the new one.
        traded += 2 * position.unsigned_abs().min(target.unsigned_abs());
    }
    let fill = (target != position)
        .then(|| open + x.slippage_price * f64::from((target - position).signum()));
    Transition {
        next_t: t + 1,
        position: target,
        hold_pnl: f64::from(position) * (open - close_t) * x.multiplier,
        bar_pnl: f64::from(target) * (close_next - open) * x.multiplier,
        cost: f64::from(traded) * x.cost_per_side,
        traded,
        terminal: false,
        fill,
    }
}

/// Average entry price after a step, for unrealized PnL: a new or flipped position enters at the
/// fill, an added one averages in, a reduced one keeps its entry, a flat one has none (0).
pub fn next_entry(entry: f64, position: i32, tr: &Transition) -> f64 {
    let new = tr.position;
    match tr.fill {
        _ if new == 0 => 0.0,
        None => entry,
        Some(fill) if position == 0 || position.signum() != new.signum() => fill,
        Some(fill) if new.abs() > position.abs() => {
            (entry * f64::from(position.abs()) + fill * f64::from(new.abs() - position.abs()))
                / f64::from(new.abs())
        }
        Some(_) => entry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn market(open: &[f64], close: &[f64], session: &[u32], contract: &[u16]) -> MarketData {
        let rows = open.len();
        MarketData::new(crate::MarketColumns {
            cols: 0,
            features: Vec::new(),
            open: open.to_vec(),
            close: close.to_vec(),
            session: session.to_vec(),
            contract: contract.to_vec(),
            ts: (0..rows as i64).collect(),
        })
        .expect("valid market data")
    }

    fn es() -> Execution {
        Execution::new(
            &ContractSpec {
                multiplier: 50.0,
                tick_size: 0.25,
                currency: "USD".into(),
            },
            Costs {
                commission: 2.0,
                slippage_ticks: 1.0,
            },
        )
    }

    #[test]
    fn fills_at_next_open_and_marks_at_close() {
        let m = market(
            &[100.0, 101.0, 102.0],
            &[100.5, 101.5, 102.5],
            &[0, 0, 0],
            &[0; 3],
        );
        let x = es();
        assert_eq!(x.cost_per_side, 2.0 + 12.5);
        let tr = transition(&m, &x, 0, 3, SessionRule::FlattenAtClose, 0, 1);
        assert_eq!((tr.next_t, tr.position, tr.terminal), (1, 1, false));
        assert_eq!(tr.fill, Some(101.25));
        assert_eq!(tr.bar_pnl, 0.5 * 50.0);
        assert_eq!(tr.pnl(), 25.0 - 14.5);
        // Holding: gap from close 1 (101.5) to open 2 (102), then the bar (102 -> 102.5).
        let tr = transition(&m, &x, 1, 3, SessionRule::FlattenAtClose, 1, 1);
        assert_eq!((tr.hold_pnl, tr.bar_pnl, tr.cost), (25.0, 25.0, 0.0));
        // The last bar flattens at its close.
        let tr = transition(&m, &x, 2, 3, SessionRule::FlattenAtClose, 1, 1);
        assert_eq!((tr.terminal, tr.position, tr.pnl()), (true, 0, -14.5));
        assert_eq!(next_entry(101.25, 1, &tr), 0.0);
    }

    #[test]
    fn sessions_and_rolls() {
        let prices = [100.0, 101.0, 90.0];
        let m = market(&prices, &prices, &[0, 0, 1], &[0; 3]);
        let x = es();
        assert!(transition(&m, &x, 1, 3, SessionRule::FlattenAtClose, 1, 1).terminal);
        let held = transition(&m, &x, 1, 3, SessionRule::Hold, 1, 1);
        assert_eq!((held.terminal, held.hold_pnl), (false, -11.0 * 50.0));
        let m = market(&prices, &prices, &[0, 0, 1], &[0, 0, 1]);
        let rolled = transition(&m, &x, 1, 3, SessionRule::Hold, 2, 1);
        assert_eq!(rolled.traded, 1 + 2, "sell one, roll the other one");
    }
}
