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
    /// The device refused the fused engine's work (no CUDA, the driver, a kernel module).
    #[error("fused CUDA engine: {0}")]
    Gpu(#[from] foxhunt_gpu::GpuError),
    /// The fused engine was asked for something it does not implement, or given buffers of
    /// the wrong size.
    #[error("fused CUDA engine: {0}")]
    Engine(String),
}
