//! foxhunt-env: the simulation of trading one futures contract on real bars, the reference
//! semantics that the GPU kernels reproduce.
//!
//! [`spec`] holds contract specifications; [`exec::transition`] is the one definition of a
//! step (fills at the next open with slippage, commission per side, marking at closes, sessions
//! and rolls); [`VecEnv`] steps N environments over shared [`MarketData`]; [`backtest`] runs a
//! [`Policy`] over a split and computes [`Metrics`]; [`backtest::baselines`] gives the four
//! baselines. The semantics, with a worked example, are in docs/ENVIRONMENT.md.

pub mod backtest;
pub mod error;
pub mod exec;
pub mod market;
pub mod metrics;
pub mod spec;
pub mod vec_env;

pub use backtest::{BacktestReport, Baseline, Policy, backtest, baselines};
pub use error::EnvError;
pub use exec::{Costs, Execution, SessionRule, Transition};
pub use market::{MarketColumns, MarketData};
pub use metrics::{MetricParts, Metrics};
pub use spec::{ContractSpec, SpecTable};
pub use vec_env::{EnvConfig, VecEnv, done};
