//! The environment crate's error type.

/// Errors of foxhunt-env: user input (specs, configuration, splits) that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A contract spec is missing or invalid.
    #[error("contract spec: {0}")]
    Spec(String),
    /// Market data whose columns do not fit together.
    #[error("market data: {0}")]
    Market(String),
    /// An environment or backtest setting is invalid.
    #[error("environment config: {0}")]
    Config(String),
}
