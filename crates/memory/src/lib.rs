//! foxhunt-memory: where a walk-forward window's data lives while it trains, on the host or the
//! GPU. A CUDA context with NVRTC-compiled kernels (kernels/*.cu, embedded in the binary); the
//! window arena and its buffer pool ([`HostPool`] / `DevicePool`: one upload per window, none
//! per epoch, buffers reused between windows); [`GpuVecEnv`], N environments stepped on the
//! device exactly as foxhunt-env's CPU reference steps them; and `DeviceReplay`, a replay ring
//! the step kernel writes and a kernel samples with Philox, on the device.
//!
//! Without the `cuda` feature the same types exist and every constructor returns
//! [`MemoryError::NoCuda`], so callers have one code path and a clear message.
//!
//! [`HostPool`] and [`HostArena`] hold a walk-forward window's data for the window's life, built
//! with one copy and handed back to the pool for the next window (see [`arena`]).

pub mod arena;
mod error;
pub mod philox;
// Kernel launches and library probes are unsafe FFI; each use carries a SAFETY comment. The rest
// of the workspace denies unsafe code.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu;
#[cfg(not(feature = "cuda"))]
mod twin;

pub use arena::{Epoch, HostArena, HostPool, PoolStats, WindowData};
pub use error::MemoryError;
#[cfg(feature = "cuda")]
pub use gpu::{
    DeviceBatch, DevicePool, DeviceReplay, DeviceWindow, GpuArena, GpuContext, GpuVecEnv,
    SampleSpec,
};
#[cfg(not(feature = "cuda"))]
pub use twin::{DevicePool, DeviceReplay, GpuContext, GpuVecEnv};

/// CUDA source of the environment and replay kernels: one NVRTC module (the replay sampler
/// rebuilds observations with the environment's `observe`).
pub const ENV_KERNELS: &str = concat!(
    include_str!("../../../kernels/philox.cuh"),
    include_str!("../../../kernels/env_step.cu"),
    include_str!("../../../kernels/replay.cu")
);
