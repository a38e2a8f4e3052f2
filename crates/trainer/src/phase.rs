//! Phase-breakdown profiling: where an epoch's wall time goes (init, collect, train, sync, eval),
//! logged as one line per epoch and kept for the run's report.
//!
//! A phase is charged for the work it did, not for the moment its launches returned. Phases
//! timed on the host wait for the device at their end (`sync` below). On the GPU, the phases of
//! the step loop (collect, train, sync) are timed by device events instead ([`DeviceMarks`]):
//! an event is recorded on the stream at each boundary and the intervals are read once, when
//! the epoch ends, so the loop never waits for the device.

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

/// Timestamps recorded on a device's stream (CUDA events), read back in one go.
pub trait DeviceMarks {
    /// Starts a new series: forgets earlier marks and records the first one.
    fn restart(&mut self);
    /// Records a mark after all the work queued so far (does not wait).
    fn mark(&mut self);
    /// Milliseconds between consecutive marks of the series, in order (waits for the device).
    fn intervals(&mut self) -> Vec<f64>;
}

/// Accumulates time per phase; `sync` waits for the device at each host-timed boundary.
pub struct PhaseClock<'s> {
    sync: &'s dyn Fn(),
    device: Option<&'s mut dyn DeviceMarks>,
    /// Phases of the device marks recorded after the first, in order.
    marked: Vec<usize>,
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
            device: None,
            marked: Vec::new(),
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

    /// Times [`PhaseClock::time_device`] phases with `marks` (the device is idle now: the
    /// clock was just made).
    pub fn with_device(mut self, marks: Option<&'s mut dyn DeviceMarks>) -> Self {
        self.device = marks;
        if let Some(m) = self.device.as_deref_mut() {
            m.restart();
        }
        self
    }

    /// Runs `f`, which queues device work, as part of phase `phase`: timed by device marks when
    /// the clock has them (no wait), else as [`PhaseClock::time`].
    pub fn time_device<T>(&mut self, phase: usize, f: impl FnOnce() -> T) -> T {
        let Some(m) = self.device.as_deref_mut() else {
            return self.time(phase, f);
        };
        // Host work between the previous mark and this phase's launches is the device's idle
        // time; it is charged to this phase, as a host clock would charge it.
        let out = f();
        m.mark();
        self.marked.push(phase);
        out
    }

    /// Adds time measured elsewhere (the first epoch's arena build) to `phase`.
    pub fn charge(&mut self, phase: usize, ms: f64) {
        self.totals[phase] += ms;
        self.charged += ms;
    }

    /// The breakdown so far; `total` is the clock's time plus what was charged to it. Reads the
    /// device marks (waits for the device once).
    pub fn finish(
        &mut self,
        window: usize,
        epoch: usize,
        steps: usize,
        updates: usize,
    ) -> PhaseTimes {
        if let Some(m) = self.device.as_deref_mut() {
            for (phase, ms) in self.marked.drain(..).zip(m.intervals()) {
                self.totals[phase] += ms;
            }
        }
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
