//! foxhunt-memory: the GPU side. A CUDA context with NVRTC-compiled kernels (kernels/*.cu,
//! embedded in the binary) and [`GpuVecEnv`], N environments stepped on the device exactly as
//! foxhunt-env's CPU reference steps them.
//!
//! Without the `cuda` feature the same types exist and every constructor returns
//! [`MemoryError::NoCuda`], so callers have one code path and a clear message.
//!
//! Not yet here (issue #4 continues): the window arena and its buffer pool, the device replay
//! ring and on-device sampling.

mod error;
// Kernel launches and library probes are unsafe FFI; each use carries a SAFETY comment. The rest
// of the workspace denies unsafe code.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu;
#[cfg(not(feature = "cuda"))]
mod twin;

pub use error::MemoryError;
#[cfg(feature = "cuda")]
pub use gpu::{GpuContext, GpuVecEnv};
#[cfg(not(feature = "cuda"))]
pub use twin::{GpuContext, GpuVecEnv};

/// CUDA source of the environment kernels.
pub const ENV_KERNELS: &str = include_str!("../../../kernels/env_step.cu");
