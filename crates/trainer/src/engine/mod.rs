//! Training engines: what the window loop asks of the thing that collects experience and
//! learns from it, and the two implementations. [`host::HostEngine`] steps the CPU reference
//! environments and trains a burn agent (NdArray; burn-cuda when prioritized replay is asked for
//! on a GPU). `device::DeviceEngine` (feature `cuda`) keeps environments, replay ring, sampling,
//! acting and learning on the device, with foxhunt's own kernels.
//!
//! The loop does not know which one it drives: it calls the steps in order, times them as
//! phases, and at the epoch's end takes the statistics and the agent (for evaluation and
//! checkpoints), whose backend the engine chooses.

#[cfg(feature = "cuda")]
pub(crate) mod device;
pub(crate) mod host;

use std::ops::Range;

use burn::tensor::backend::AutodiffBackend;
use foxhunt_dqn::model::HostQNetwork;
use foxhunt_dqn::{AgentConfig, DqnAgent, Snapshot, UpdateStats};
use foxhunt_env::{EnvConfig, Execution, MarketData, Metrics};

use crate::TrainError;
use crate::phase::{DeviceMarks, Phase, PhaseClock};

/// Which network a greedy evaluation decides with.
#[derive(Clone, Copy)]
pub(crate) enum Judged<'a> {
    /// The online network as of the last finished epoch (validation).
    Current,
    /// A kept agent (the best epoch's, for the test).
    Kept(&'a Snapshot),
}

/// A window's market rows and terms, and the environment, for a greedy evaluation.
pub(crate) struct EvalData<'a> {
    /// The window's rows (host copy).
    pub market: &'a MarketData,
    /// Contract terms and costs.
    pub exec: &'a Execution,
    /// The environment.
    pub env: &'a EnvConfig,
}

/// One training engine over one window.
pub(crate) trait Engine {
    /// The backend of the agent that holds the learning state between epochs.
    type B: AutodiffBackend;

    /// Starts an epoch: fresh environments over the train split, episode starts seeded by
    /// `seed`.
    fn begin_epoch(&mut self, seed: u64) -> Result<(), TrainError>;

    /// One step of every environment with epsilon-greedy actions (exploration drawn at
    /// `counter`, see `foxhunt_dqn::explore`); the transitions go into the replay.
    fn collect(&mut self, counter: u64) -> Result<(), TrainError>;

    /// Transitions the replay can sample now.
    fn available(&self) -> usize;

    /// The epoch's steps after [`Engine::begin_epoch`]: each collects, and once the replay holds
    /// `learning_starts` transitions, learns and syncs the target; returns the steps that
    /// learned, in order. By default [`eager_steps`], one call per phase; an engine that runs
    /// the whole loop at once on its device overrides it and charges the clock its device-timed
    /// phases.
    fn run_steps(
        &mut self,
        plan: &EpochPlan,
        clock: &mut PhaseClock,
    ) -> Result<Vec<usize>, TrainError> {
        eager_steps(self, plan, clock)
    }

    /// One update on a batch sampled from the replay.
    fn learn(&mut self) -> Result<(), TrainError>;

    /// The target-network update due after the latest [`Engine::learn`].
    fn sync_target(&mut self) -> Result<(), TrainError>;

    /// Ends the epoch: the statistics of its updates, read once, in order.
    fn finish_epoch(&mut self) -> Result<Vec<UpdateStats>, TrainError>;

    /// The agent with the learning state as of now (the host's greedy decisions); an engine
    /// that learns elsewhere brings it up to date first (a read of the device's weights).
    fn agent(&mut self) -> Result<&DqnAgent<Self::B>, TrainError>;

    /// The agent's settings.
    fn agent_config(&self) -> &AgentConfig;

    /// The exploration rate now.
    fn epsilon(&self) -> f64;

    /// The learning state as of now, kept aside (the best epoch's agent, checkpoints).
    fn snapshot(&mut self) -> Result<Snapshot, TrainError> {
        Ok(self.agent()?.snapshot())
    }

    /// The replay's contents when a checkpoint can carry them (host replay), else `None`: the
    /// engine then resumes with an empty replay.
    fn replay_bytes(&self) -> Option<Vec<u8>>;

    /// The greedy policy's decision at every bar of `split` (`targets[t - split.start]`), for
    /// the network `which`: exactly the decisions of a bar-by-bar backtest. On the host by
    /// default (foxhunt-trainer's `eval`); an engine with the network on a device may decide
    /// there.
    fn greedy_targets(
        &mut self,
        which: Judged<'_>,
        data: &EvalData<'_>,
        split: Range<usize>,
    ) -> Result<Vec<i8>, TrainError> {
        host_greedy_targets(self, which, data, split)
    }

    /// The metrics of the greedy policy of `which` backtested over `split` with `capital`:
    /// exactly the metrics of foxhunt-env's backtest of [`Engine::greedy_targets`]' decisions
    /// (the validation of every epoch, which needs no more than the metrics). Booked on the
    /// host by default; an engine whose device decides may book there too.
    fn judge(
        &mut self,
        which: Judged<'_>,
        data: &EvalData<'_>,
        split: Range<usize>,
        capital: f64,
    ) -> Result<Metrics, TrainError> {
        let targets = self.greedy_targets(which, data, split.clone())?;
        book_metrics(&targets, data, split, capital)
    }

    /// Bytes of window data the engine uploaded when it was made (its own arena).
    fn uploaded_bytes(&self) -> u64 {
        0
    }

    /// How phase boundaries wait for the engine's device, and, where it has them, device
    /// timestamps for the step loop's phases.
    fn timing(&self) -> Timing;
}

/// The steps of one epoch, as the window loop asks for them.
pub(crate) struct EpochPlan {
    /// Window index.
    pub window: usize,
    /// Epoch within the window.
    pub epoch: usize,
    /// Environment steps.
    pub steps: usize,
    /// Transitions the replay must hold before the first update.
    pub learning_starts: usize,
}

impl EpochPlan {
    /// The exploration counter of `step` (see `foxhunt_dqn::explore`).
    pub fn counter(&self, step: usize) -> u64 {
        foxhunt_dqn::explore::step_counter(self.window, self.epoch, step)
    }
}

/// [`Engine::run_steps`] one engine call at a time, each timed as its phase.
pub(crate) fn eager_steps<E: Engine + ?Sized>(
    engine: &mut E,
    plan: &EpochPlan,
    clock: &mut PhaseClock,
) -> Result<Vec<usize>, TrainError> {
    let mut learned = Vec::new();
    for step in 0..plan.steps {
        clock.time_device(Phase::Collect, || engine.collect(plan.counter(step)))?;
        if engine.available() >= plan.learning_starts {
            clock.time_device(Phase::Train, || engine.learn())?;
            clock.time_device(Phase::Sync, || engine.sync_target())?;
            learned.push(step);
        }
    }
    Ok(learned)
}

/// [`Engine::greedy_targets`] on the host, from the engine's agent.
pub(crate) fn host_greedy_targets<E: Engine + ?Sized>(
    engine: &mut E,
    which: Judged<'_>,
    data: &EvalData<'_>,
    split: Range<usize>,
) -> Result<Vec<i8>, TrainError> {
    let net = match which {
        Judged::Current => engine.agent()?.online_net().to_host(),
        Judged::Kept(s) => HostQNetwork::from_flat(engine.agent_config(), &s.state.online),
    };
    Ok(crate::eval::host_targets(
        &net,
        data.market,
        data.exec,
        data.env,
        split,
    ))
}

/// The metrics of the backtest of `targets` over `split` with `capital`, booked on the host.
pub(crate) fn book_metrics(
    targets: &[i8],
    data: &EvalData<'_>,
    split: Range<usize>,
    capital: f64,
) -> Result<Metrics, TrainError> {
    let r = crate::eval::book_in(targets, data.market, data.exec, data.env, split, capital)?;
    Ok(r.metrics)
}

/// Made by [`Engine::timing`] for a window's phase clock.
pub(crate) struct Timing {
    /// Waits for the work queued so far.
    pub sync: Box<dyn Fn()>,
    /// Device timestamps, where the engine's work is asynchronous.
    pub marks: Option<Box<dyn DeviceMarks>>,
}
