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
use foxhunt_dqn::{DqnAgent, Snapshot, UpdateStats};
use foxhunt_env::{EnvConfig, Execution, MarketData};

use crate::TrainError;
use crate::phase::DeviceMarks;

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

    /// One update on a batch sampled from the replay.
    fn learn(&mut self) -> Result<(), TrainError>;

    /// The target-network update due after the latest [`Engine::learn`].
    fn sync_target(&mut self) -> Result<(), TrainError>;

    /// Ends the epoch: the statistics of its updates, read once, in order; afterwards
    /// [`Engine::agent`] holds the learning state as of now.
    fn finish_epoch(&mut self) -> Result<Vec<UpdateStats>, TrainError>;

    /// The agent as of the last finished epoch (evaluation, checkpoints).
    fn agent(&self) -> &DqnAgent<Self::B>;

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

    /// Bytes of window data the engine uploaded when it was made (its own arena).
    fn uploaded_bytes(&self) -> u64 {
        0
    }

    /// How phase boundaries wait for the engine's device, and, where it has them, device
    /// timestamps for the step loop's phases.
    fn timing(&self) -> Timing;
}

/// [`Engine::greedy_targets`] on the host, from the engine's agent.
pub(crate) fn host_greedy_targets<E: Engine + ?Sized>(
    engine: &E,
    which: Judged<'_>,
    data: &EvalData<'_>,
    split: Range<usize>,
) -> Result<Vec<i8>, TrainError> {
    let net = match which {
        Judged::Current => engine.agent().online_net().to_host(),
        Judged::Kept(s) => HostQNetwork::from_flat(engine.agent().config(), &s.state.online),
    };
    Ok(crate::eval::host_targets(
        &net,
        data.market,
        data.exec,
        data.env,
        split,
    ))
}

/// Made by [`Engine::timing`] for a window's phase clock.
pub(crate) struct Timing {
    /// Waits for the work queued so far.
    pub sync: Box<dyn Fn()>,
    /// Device timestamps, where the engine's work is asynchronous.
    pub marks: Option<Box<dyn DeviceMarks>>,
}
