//! The DQN crate's error type.

use std::path::PathBuf;

/// Errors of foxhunt-dqn: invalid configuration, unusable checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum DqnError {
    /// A hyperparameter is out of range.
    #[error("DQN config: {0}")]
    Config(String),
    /// A checkpoint cannot be written or read, or belongs to another configuration.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The fused CUDA engine cannot run: no CUDA, a failed launch, or a configuration it does
    /// not implement.
    #[error("fused CUDA engine: {0}")]
    Device(String),
}
