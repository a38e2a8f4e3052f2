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

/// The phases of an epoch, in order, by name.
pub const PHASES: [&str; 5] = ["init", "collect", "train", "sync", "eval"];

/// A phase of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Building the window's arena (first epoch) or borrowing it (later epochs).
    Init,
    /// Acting and stepping the environments, writing the replay.
    Collect,
    /// Sampling batches and the gradient updates.
    Train,
    /// Target-network updates.
    Sync,
    /// Greedy evaluation on the validation split.
    Eval,
}

impl Phase {
    /// The phase's name in the `phase breakdown` line.
    pub fn name(self) -> &'static str {
        PHASES[self as usize]
    }
}

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

    /// The mean per epoch of each phase in [`PHASES`] order, then of the total (None for no
    /// epochs): what the summary and the HTML report print.
    pub fn means(phases: &[PhaseTimes]) -> Option<[f64; 6]> {
        if phases.is_empty() {
            return None;
        }
        let mut m = [0.0; 6];
        for p in phases {
            for (acc, v) in m.iter_mut().zip(p.values().into_iter().chain([p.total])) {
                *acc += v;
            }
        }
        Some(m.map(|v| v / phases.len() as f64))
    }
}

/// Timestamps recorded on a device's stream, read back in one go.
pub trait DeviceMarks {
    /// Starts a new series: forgets earlier marks and records the first one.
    fn restart(&mut self);
    /// Records a mark after all the work queued so far (does not wait).
    fn mark(&mut self);
    /// Milliseconds between consecutive marks of the series, in order (waits for the device).
    fn intervals(&mut self) -> Vec<f64>;
}

/// Accumulates time per phase over one epoch at a time; `sync` waits for the device at each
/// host-timed boundary. Made once per window (its device marks are reused epoch after epoch).
pub struct PhaseClock {
    sync: Box<dyn Fn()>,
    device: Option<Box<dyn DeviceMarks>>,
    /// Phases of the device marks recorded after the first, in order.
    marked: Vec<Phase>,
    start: Instant,
    totals: [f64; 5],
    charged: f64,
}

impl PhaseClock {
    /// A clock whose host-timed phases end with `sync`, and whose device phases are timed by
    /// `device` when given ([`PhaseClock::time_device`]).
    pub fn new(sync: Box<dyn Fn()>, device: Option<Box<dyn DeviceMarks>>) -> Self {
        Self {
            sync,
            device,
            marked: Vec::new(),
            start: Instant::now(),
            totals: [0.0; 5],
            charged: 0.0,
        }
    }

    /// Starts an epoch's breakdown now (waits for the device first, so that earlier work is
    /// not charged to it).
    pub fn start_epoch(&mut self) {
        (self.sync)();
        self.marked.clear();
        self.totals = [0.0; 5];
        self.charged = 0.0;
        if let Some(m) = self.device.as_deref_mut() {
            m.restart();
        }
        self.start = Instant::now();
    }

    /// Runs `f` as part of `phase`.
    pub fn time<T>(&mut self, phase: Phase, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        (self.sync)();
        self.totals[phase as usize] += t.elapsed().as_secs_f64() * 1e3;
        out
    }

    /// Runs `f`, which queues device work, as part of `phase`: timed by device marks when the
    /// clock has them (no wait), else as [`PhaseClock::time`].
    pub fn time_device<T>(&mut self, phase: Phase, f: impl FnOnce() -> T) -> T {
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

    /// Adds device time measured inside one launch (the one-launch epoch's timestamps) to
    /// `phase`; the epoch's total is the clock's own.
    pub fn record(&mut self, phase: Phase, ms: f64) {
        self.totals[phase as usize] += ms;
    }

    /// Adds time measured elsewhere (the first epoch's arena build) to `phase`.
    pub fn charge(&mut self, phase: Phase, ms: f64) {
        self.totals[phase as usize] += ms;
        self.charged += ms;
    }

    /// The epoch's breakdown; `total` is the clock's time since [`PhaseClock::start_epoch`]
    /// plus what was charged to it. Reads the device marks (waits for the device once).
    pub fn finish(
        &mut self,
        window: usize,
        epoch: usize,
        steps: usize,
        updates: usize,
    ) -> PhaseTimes {
        if let Some(m) = self.device.as_deref_mut() {
            for (phase, ms) in self.marked.drain(..).zip(m.intervals()) {
                self.totals[phase as usize] += ms;
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
