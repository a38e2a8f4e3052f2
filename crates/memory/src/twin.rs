//! The build without CUDA: the same types, whose constructors say why there is no GPU.

use foxhunt_env::{EnvConfig, Execution, MarketData};

use crate::MemoryError;

fn no_cuda() -> MemoryError {
    MemoryError::NoCuda("this build has no CUDA support (build with the `cuda` feature)".into())
}

/// A CUDA context (unavailable in this build).
pub struct GpuContext {
    _private: (),
}

impl GpuContext {
    /// Always [`MemoryError::NoCuda`] in this build.
    pub fn new(_ordinal: usize) -> Result<std::sync::Arc<Self>, MemoryError> {
        Err(no_cuda())
    }
}

/// The GPU environment (unavailable in this build).
pub struct GpuVecEnv {
    _private: (),
}

impl GpuVecEnv {
    /// Always [`MemoryError::NoCuda`] in this build.
    pub fn new(
        _ctx: &std::sync::Arc<GpuContext>,
        _market: &MarketData,
        _exec: Execution,
        _cfg: EnvConfig,
        _split: std::ops::Range<usize>,
        _n: usize,
        _seed: u64,
    ) -> Result<Self, MemoryError> {
        Err(no_cuda())
    }
}
