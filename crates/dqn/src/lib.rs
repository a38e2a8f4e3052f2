//! foxhunt-dqn: a Deep Q-Network agent on burn, generic over the backend (NdArray on the CPU,
//! burn-cuda with the `cuda` feature).
//!
//! [`DqnConfig`] holds every hyperparameter with documented defaults, [`AgentConfig`] adds the
//! values derived for an agent (observation size, actions, seed); [`QNetwork`] is the MLP
//! (optional dueling head and layer norm); [`DqnAgent`] acts for N environments and runs one
//! update per [`DqnAgent::train_step`] (double or vanilla targets, n-step returns, Huber or MSE,
//! gradient-norm clipping, Adam with a learning-rate schedule, hard or Polyak target updates);
//! [`replay`] is the host replay (uniform or prioritized); [`checkpoint`] saves and loads it all.
//! With the `cuda` feature, `fused` is the same learning rule as foxhunt's own CUDA kernels over
//! device buffers (no host round trip per step); it trades state with a [`DqnAgent`] through
//! [`AgentState`]. [`explore`] is the epsilon-greedy rule both draw their exploration with.

pub mod agent;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod explore;
// Kernel launches are `unsafe` (foxhunt-gpu's `Launch::run`); each carries a SAFETY comment. The
// rest of the crate has none.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod fused;
pub mod model;
pub mod replay;

pub use agent::{AgentState, Batch, DqnAgent, HostStats, Snapshot, TrainStats, UpdateStats};
pub use config::{AgentConfig, DqnConfig};
pub use error::DqnError;
pub use model::QNetwork;

/// The CPU training backend: burn's NdArray with autodiff.
pub type CpuBackend = burn::backend::Autodiff<burn::backend::NdArray<f32>>;

/// The CUDA training backend (feature `cuda`).
#[cfg(feature = "cuda")]
pub type CudaBackend = burn::backend::Autodiff<burn::backend::Cuda<f32, i32>>;
