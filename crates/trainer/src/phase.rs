//! Phase-breakdown profiling: where an epoch's wall time goes (init, collect, train, sync, eval),
//! logged as one line per epoch and kept for the run's report.
//!
//! On a GPU every phase boundary first waits for the device (`sync` below), so a phase is
//! charged for the work it queued, not for the moment its launches returned.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The phases of an epoch, in order.
pub const PHASES: [&str; 5] = ["init", "collect", "train", "sync", "eval"];

/// One epoch's breakdown, times in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PhaseTimes {
    /// Window index.
    pub window: usize,
    /// Epoch within the window.
    pub epoch: usize,
    /// Environment steps taken (each over all environments).
    pub steps: usize,
    /// Updates done.
    pub updates: usize,
    /// Bytes of window data copied into the arena during this epoch (non-zero only when the
    /// window's arena was built, in its first epoch).
    pub uploaded_bytes: u64,
    /// Building the window's arena (first epoch) or borrowing it (later epochs).
    pub init: f64,
    /// Acting and stepping the environments, writing the replay.
    pub collect: f64,
    /// Sampling batches and the gradient updates.
    pub train: f64,
    /// Target-network updates.
    pub sync: f64,
    /// Greedy evaluation on the validation split, and keeping the best checkpoint.
    pub eval: f64,
    /// The whole epoch.
    pub total: f64,
}

impl std::fmt::Display for PhaseTimes {
    /// `phase breakdown window=W epoch=E steps=S init=X collect=X train=X sync=X eval=X total=X`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "phase breakdown window={} epoch={} steps={} init={:.3} collect={:.3} train={:.3} sync={:.3} eval={:.3} total={:.3}",
            self.window,
            self.epoch,
            self.steps,
            self.init,
            self.collect,
            self.train,
            self.sync,
            self.eval,
            self.total
        )
    }
}

impl PhaseTimes {
    /// The phase times in [`PHASES`] order.
    pub fn values(&self) -> [f64; 5] {
        [self.init, self.collect, self.train, self.sync, self.eval]
    }
}

/// Accumulates time per phase; `sync` waits for the device at each boundary.
pub struct PhaseClock<'s> {
    sync: &'s dyn Fn(),
    start: Instant,
    totals: [f64; 5],
    charged: f64,
}

impl<'s> PhaseClock<'s> {
    /// A clock starting now.
    pub fn new(sync: &'s dyn Fn()) -> Self {
        sync();
        Self {
            sync,
            start: Instant::now(),
            totals: [0.0; 5],
            charged: 0.0,
        }
    }

    /// Runs `f` as part of phase `phase` (an index into [`PHASES`]).
    pub fn time<T>(&mut self, phase: usize, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        (self.sync)();
        self.totals[phase] += t.elapsed().as_secs_f64() * 1e3;
        out
    }

    /// Adds time measured elsewhere (the first epoch's arena build) to `phase`.
    pub fn charge(&mut self, phase: usize, ms: f64) {
        self.totals[phase] += ms;
        self.charged += ms;
    }

    /// The breakdown so far; `total` is the clock's time plus what was charged to it.
    pub fn finish(&self, window: usize, epoch: usize, steps: usize, updates: usize) -> PhaseTimes {
        let [init, collect, train, sync, eval] = self.totals;
        PhaseTimes {
            window,
            epoch,
            steps,
            updates,
            uploaded_bytes: 0,
            init,
            collect,
            train,
            sync,
            eval,
            total: self.start.elapsed().as_secs_f64() * 1e3 + self.charged,
        }
    }
}
