//! foxhunt-memory: the GPU side. A CUDA context with NVRTC-compiled kernels (kernels/*.cu,
//! embedded in the binary) and [`GpuVecEnv`], N environments stepped on the device exactly as
//! foxhunt-env's CPU reference steps them.
//!
//! Without the `cuda` feature the same types exist and every constructor returns
//! [`MemoryError::NoCuda`], so callers have one code path and a clear message.
//!
//! [`HostPool`] and [`HostArena`] hold a walk-forward window's data for the window's life, built
//! with one copy and handed back to the pool for the next window (see [`arena`]).

pub mod arena;
mod error;
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
pub use gpu::{GpuContext, GpuVecEnv};
#[cfg(not(feature = "cuda"))]
pub use twin::{GpuContext, GpuVecEnv};

/// CUDA source of the environment kernels.
pub const ENV_KERNELS: &str = include_str!("../../../kernels/env_step.cu");
