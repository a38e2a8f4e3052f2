//! The memory crate's error type.

/// Errors of foxhunt-memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// No usable CUDA: built without the `cuda` feature, or no driver/device on this machine.
    #[error("no CUDA device found: {0}")]
    NoCuda(String),
    /// The CUDA driver reported an error.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// NVRTC could not compile a kernel module; `log` is NVRTC's log.
    #[error("NVRTC could not compile kernel module {module}: {log}")]
    Compile {
        /// Module name.
        module: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// A setting is unusable (split, sizes).
    #[error("GPU environment: {0}")]
    Config(String),
}
