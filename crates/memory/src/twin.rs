//! The build without CUDA: the same types, whose constructors say why there is no GPU.

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

/// The device window pool (unavailable in this build).
pub struct DevicePool {
    _private: (),
}

impl DevicePool {
    /// Never reached in this build: no [`GpuContext`] can be made.
    pub fn try_new(_ctx: &std::sync::Arc<GpuContext>) -> Result<Self, MemoryError> {
        Err(no_cuda())
    }
}

/// The device replay ring (unavailable in this build).
pub struct DeviceReplay {
    _private: (),
}

impl DeviceReplay {
    /// Always [`MemoryError::NoCuda`] in this build.
    pub fn new(
        _ctx: &std::sync::Arc<GpuContext>,
        _n_env: usize,
        _cap_rows: usize,
    ) -> Result<Self, MemoryError> {
        Err(no_cuda())
    }
}
