//! The memory crate's error type.

/// Errors of foxhunt-memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The device refused (no CUDA, the driver, a kernel module).
    #[error(transparent)]
    Gpu(#[from] foxhunt_gpu::GpuError),
    /// A setting is unusable (split, sizes).
    #[error("GPU environment: {0}")]
    Config(String),
    /// A population's launch, made by another member's thread, failed.
    #[error("a population's one-launch epoch: {0}")]
    Launch(String),
}
