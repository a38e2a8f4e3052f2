//! foxhunt-memory: where a walk-forward window's data lives while it trains, on the host or the
//! GPU: the window arena and its buffer pool ([`HostPool`] / `DevicePool`: one copy per window,
//! none per epoch, buffers reused between windows); with the `cuda` feature, `GpuVecEnv`, N
//! environments stepped on the device exactly as foxhunt-env's CPU reference steps them, and
//! `DeviceReplay`, a replay ring the step kernel writes and a kernel samples with Philox;
//! `DeviceEvaluator`, greedy decisions over a split; `EpochKernel`, a whole training epoch in one
//! launch.
//!
//! The device side is gated as a whole: without the `cuda` feature it does not exist, and
//! callers gate the code that uses it the same way. Device memory and launches go through
//! foxhunt-gpu; this crate never names cudarc.
//!
//! [`HostPool`] and [`HostArena`] hold a walk-forward window's data for the window's life, built
//! with one copy and handed back to the pool for the next window (see [`arena`]).

pub mod arena;
#[cfg(feature = "cuda")]
mod device;
mod error;
// Kernel launches are `unsafe` (foxhunt-gpu's `Launch::run`); each states in a SAFETY comment why
// its arguments fit the kernel. The rest of the crate has no unsafe code.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod epoch;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod eval;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod gpu_env;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod replay;

pub use arena::{Arena, Epoch, HostArena, HostPool, Pool, PoolStats, WindowData};

/// Device bytes the greedy evaluation (`DeviceEvaluator`) holds per bar of the largest split it
/// is asked about, for a network whose first hidden layer has `first_width` units: the flat
/// decisions, the walk's decisions, the given and final ones, the walk's position (1 byte each),
/// its entry price (8), the booking's steps (hold PnL, bar PnL, cost: 8 each, a packed word: 4),
/// step PnL, cost, their gathered copies and the equity (8 each), two point flags (1 each), a
/// little more for the chunk and session tables (a chunk's 17 bytes over its 64 bars and more, a
/// session's 76 over its hundreds), and the first layer's flat sums (4 bytes a unit).
pub fn eval_bytes_per_bar(first_width: usize) -> usize {
    84 + 4 * first_width
}

/// Floats between two gradient slots of the one-launch epoch for a network of `params`
/// parameters: the parameters rounded up to whole float4s, so that every slot's rows are 16-byte
/// aligned for the kernel's float4 stores (kernels/epoch.cu's P4).
pub fn gradient_slot_floats(params: usize) -> usize {
    params.next_multiple_of(4)
}
#[cfg(feature = "cuda")]
pub use device::{DevicePool, DeviceWindow, GpuArena, OnStream};
#[cfg(feature = "cuda")]
pub use epoch::{
    EpochKernel, EpochMeeting, EpochMember, EpochPopulation, LearnRule, LearnerBuffers, NetShape,
    PlannedStep, Seat, StepTimes, TargetSync, clusters_by_default,
    unsupported as epoch_unsupported,
};
pub use error::MemoryError;
#[cfg(feature = "cuda")]
pub use eval::{
    BOOK_BLOCKS, BOOK_WARPS, CHUNK_BARS, DeviceBook, DeviceEvaluator, NetOnDevice, Stitch,
    WALK_ROWS, WALK_THREADS, chunk_bars_for, unsupported_env,
};
#[cfg(feature = "cuda")]
pub use gpu_env::GpuVecEnv;
#[cfg(feature = "cuda")]
pub use replay::{DeviceReplay, ReplayRows, SampleSpec};

#[cfg(test)]
mod tests {
    use super::gradient_slot_floats;

    #[test]
    fn gradient_slots_are_whole_float4s_holding_every_parameter() {
        for params in 0..64 {
            let s = gradient_slot_floats(params);
            assert!(
                s.is_multiple_of(4) && s >= params && s < params + 4,
                "{params} -> {s}"
            );
        }
        // The profile's network (32-128-128-3): 21,123 parameters, slots 21,124 floats apart.
        assert_eq!(gradient_slot_floats(21_123), 21_124);
    }
}
