//! foxhunt-gpu: the one crate that talks to CUDA. Everything else reaches the device through its
//! types, never through cudarc's.
//!
//! - [`GpuContext`]: a device's primary context (shared with burn-cuda), the stream foxhunt's work
//!   goes to, and the kernel modules compiled by NVRTC for the device's architecture, cached.
//! - [`DeviceBuffer`]: a typed buffer in device memory; copies in and out go through the context.
//! - [`Kernel`] and [`Launch`]: a function of a [`Module`] and its launch, argument by argument;
//!   the launch is the one `unsafe` step, and each call site says why it is sound.
//! - [`EventMarks`]: timestamps recorded on the stream and read back in one go.
//! - [`DeviceBatch`]: a sampled batch of n-step transitions, the vocabulary between the replay
//!   that writes it (foxhunt-memory) and the learner that reads it (foxhunt-dqn).
//!
//! - [`KernelCache`]: compiled modules (CUBIN) kept on disk between runs, checked before use.
//!
//! Built without the `cuda` feature the crate holds only what needs no device: [`GpuError`],
//! the kernel sources ([`Module`]), the kernel cache's files and [`philox`], the host twin of the
//! kernels' generator.
//! Callers gate their device code as a whole on their own `cuda` feature.

mod cache;
mod error;
mod module;
pub mod philox;

#[cfg(feature = "cuda")]
mod batch;
#[cfg(feature = "cuda")]
mod buffer;
// Library probes and kernel launches are unsafe FFI; each use carries a SAFETY comment. The
// rest of the workspace denies unsafe code, but for the `unsafe` launch calls that state why
// their arguments fit.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod context;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod launch;
#[cfg(feature = "cuda")]
mod marks;

pub use cache::KernelCache;
pub use error::GpuError;
pub use module::{Module, SOURCES_ENV};

#[cfg(feature = "cuda")]
pub use batch::{DeviceBatch, HostBatchParts};
#[cfg(feature = "cuda")]
pub use buffer::{DeviceBuffer, Elem};
#[cfg(feature = "cuda")]
pub use context::{CompileCheck, CompileStats, GpuContext, GpuEvent, compile_check};
#[cfg(feature = "cuda")]
pub use launch::{Grid, Kernel, Launch};
#[cfg(feature = "cuda")]
pub use marks::EventMarks;
