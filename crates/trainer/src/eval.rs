//! Judging a network: the greedy policy backtested over a split (validation every epoch, test
//! once), and the window's test beside the baselines.

use std::ops::Range;

use burn::tensor::backend::AutodiffBackend;
use foxhunt_dqn::DqnAgent;
use foxhunt_dqn::model::HostQNetwork;
use foxhunt_env::backtest::Decision;
use foxhunt_env::{BacktestReport, Baseline, EnvConfig, Execution, MarketData, Policy, backtest};

use crate::{TrainConfig, TrainError};

/// The greedy policy of a trained network, for backtests, on a host snapshot of the weights: a
/// backtest decides bar by bar, and neither a device round trip nor a tensor dispatch per bar
/// is worth paying.
struct AgentPolicy {
    net: HostQNetwork,
    env: EnvConfig,
}

impl Policy for AgentPolicy {
    fn name(&self) -> String {
        "agent".into()
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        self.env.target(self.net.greedy(d.obs) as u8)
    }
}

/// The greedy policy of `agent`'s online network over rows `split`.
pub(crate) fn greedy_backtest<B: AutodiffBackend>(
    agent: &DqnAgent<B>,
    market: &MarketData,
    exec: &Execution,
    cfg: &TrainConfig,
    split: Range<usize>,
) -> Result<BacktestReport, TrainError> {
    let mut policy = AgentPolicy {
        net: agent.online_net().to_host(),
        env: cfg.env.clone(),
    };
    Ok(backtest(
        market,
        exec,
        &cfg.env,
        split,
        cfg.capital,
        &mut policy,
    )?)
}

/// The window's test: `agent` and then the baselines over rows `split`, in report order.
pub(crate) fn test_with_baselines<B: AutodiffBackend>(
    agent: &DqnAgent<B>,
    market: &MarketData,
    exec: &Execution,
    cfg: &TrainConfig,
    split: Range<usize>,
) -> Result<Vec<BacktestReport>, TrainError> {
    let mut runs = vec![greedy_backtest(agent, market, exec, cfg, split.clone())?];
    for b in Baseline::ALL {
        runs.push(b.run(market, exec, &cfg.env, split.clone(), cfg.capital, cfg.seed)?);
    }
    Ok(runs)
}
