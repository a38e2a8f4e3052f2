//! The device engine (feature `cuda`): the window's data in a device arena (one upload), N
//! environments stepped by foxhunt-memory's kernel, transitions written by that kernel into the
//! device replay ring and sampled there with Philox, and the agent acting and learning in
//! foxhunt-dqn's fused engine. Nothing crosses to the host within an epoch: observations,
//! actions, batches and statistics stay on the device; the statistics and the weights are read
//! once, at the end of the epoch.
//!
//! Between epochs the learning state lives in a burn agent on the CPU backend: it is what
//! evaluation and checkpoints read, and the CPU backend reads it fastest (no device round trip
//! per tensor). The engine fixes that choice in its type.

use std::ops::Range;
use std::sync::Arc;

use foxhunt_dqn::fused::{FusedDqn, device_eval_unsupported, layout_words};
use foxhunt_dqn::{CpuBackend, DqnAgent, UpdateStats};
use foxhunt_env::EnvConfig;
use foxhunt_gpu::{DeviceBatch, DeviceBuffer, EventMarks, GpuContext};
use foxhunt_memory::{
    DeviceEvaluator, DevicePool, DeviceReplay, GpuArena, GpuVecEnv, NetOnDevice, SampleSpec,
    unsupported_env,
};

use super::{Engine, EvalData, Judged, Timing};
use crate::TrainError;
use crate::phase::DeviceMarks;

/// The device side of a run: its context and the pool of window buffers, reused from window to
/// window.
pub(crate) struct GpuRun {
    pub pool: DevicePool,
}

impl GpuRun {
    pub fn new(ctx: &Arc<GpuContext>) -> Self {
        Self {
            pool: DevicePool::new(ctx),
        }
    }
}

/// The device engine over one window resident in `arena`.
pub(crate) struct DeviceEngine<'a, 'p> {
    arena: &'a GpuArena<'p>,
    agent: DqnAgent<CpuBackend>,
    fused: FusedDqn,
    ring: DeviceReplay,
    batch: DeviceBatch,
    envs: Option<GpuVecEnv<'a>>,
    actions: DeviceBuffer<u8>,
    env: EnvConfig,
    split: Range<usize>,
    n_env: usize,
    explore_seed: u64,
    /// Greedy evaluation on the device, where it can decide exactly as the host.
    eval: Option<DeviceEval<'a>>,
}

/// The device's greedy evaluation: the evaluator, the network's layout words, and a buffer for
/// a kept agent's parameters.
struct DeviceEval<'a> {
    evaluator: DeviceEvaluator<'a>,
    layout: DeviceBuffer<u64>,
    max_width: usize,
    kept: DeviceBuffer<f32>,
}

impl<'a, 'p> DeviceEngine<'a, 'p> {
    /// An engine over `arena` starting from `agent`'s state (one upload); `max_updates` is the
    /// most updates an epoch makes (their statistics stay on the device until it ends);
    /// `session` is the window's session index per row.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        arena: &'a GpuArena<'p>,
        agent: DqnAgent<CpuBackend>,
        env: &EnvConfig,
        split: Range<usize>,
        n_env: usize,
        explore_seed: u64,
        max_updates: usize,
        session: &[u32],
    ) -> Result<Self, TrainError> {
        let ctx = arena.context().clone();
        let dqn = agent.config().clone();
        let eval = match device_eval_unsupported(&dqn).or_else(|| unsupported_env(env)) {
            Some(why) => {
                tracing::info!(
                    "greedy evaluation on the host: the device cannot decide exactly as the host with {why}"
                );
                None
            }
            None => {
                let (words, max_width) = layout_words(&dqn);
                Some(DeviceEval {
                    evaluator: DeviceEvaluator::new(arena, env, session)?,
                    layout: ctx.upload(&words)?,
                    max_width,
                    kept: ctx.alloc(agent.num_params())?,
                })
            }
        };
        let rows = (dqn.replay_capacity / n_env).max(dqn.n_step + 2);
        let ring = DeviceReplay::new(&ctx, n_env, rows)?;
        let batch = DeviceBatch::new(&ctx, dqn.batch_size, dqn.obs_dim)?;
        let fused = FusedDqn::new(&ctx, &dqn, &agent.export_state(), max_updates)?;
        Ok(Self {
            arena,
            agent,
            fused,
            ring,
            batch,
            envs: None,
            actions: ctx.alloc(n_env)?,
            env: env.clone(),
            split,
            n_env,
            explore_seed,
            eval,
        })
    }
}

impl Engine for DeviceEngine<'_, '_> {
    type B = CpuBackend;

    fn begin_epoch(&mut self, seed: u64) -> Result<(), TrainError> {
        let mut env = GpuVecEnv::new(
            self.arena,
            self.env.clone(),
            self.split.clone(),
            self.n_env,
            seed,
        )?;
        env.reset()?;
        self.envs = Some(env);
        Ok(())
    }

    fn collect(&mut self, counter: u64) -> Result<(), TrainError> {
        let env = self
            .envs
            .as_mut()
            .expect("begin_epoch made the environments");
        let epsilon = self.agent.epsilon() as f32;
        self.fused.act(
            &env.obs,
            self.n_env,
            epsilon,
            self.explore_seed,
            counter,
            &mut self.actions,
        )?;
        env.step_record(&self.actions, &mut self.ring)?;
        self.agent.count_env_steps(self.n_env as u64);
        Ok(())
    }

    fn available(&self) -> usize {
        self.ring.transitions(self.agent.config().n_step)
    }

    fn learn(&mut self) -> Result<(), TrainError> {
        let cfg = self.agent.config();
        let spec = SampleSpec {
            arena: self.arena,
            env: &self.env,
            n_step: cfg.n_step as u32,
            gamma: cfg.gamma as f32,
            seed: cfg.seed,
        };
        self.ring.sample(&spec, &mut self.batch)?;
        self.fused.learn(&self.batch)?;
        Ok(())
    }

    fn sync_target(&mut self) -> Result<(), TrainError> {
        Ok(self.fused.sync_target()?)
    }

    fn finish_epoch(&mut self) -> Result<Vec<UpdateStats>, TrainError> {
        self.envs = None;
        let stats = self.fused.take_stats()?;
        // The engine's weights, read once per epoch, become the agent's.
        self.agent.import_state(&self.fused.state()?);
        Ok(stats)
    }

    fn agent(&self) -> &DqnAgent<CpuBackend> {
        &self.agent
    }

    fn replay_bytes(&self) -> Option<Vec<u8>> {
        // The device ring is not saved: a resumed GPU run starts with an empty ring.
        None
    }

    fn uploaded_bytes(&self) -> u64 {
        self.arena.uploaded_bytes()
    }

    fn greedy_targets(
        &mut self,
        which: Judged<'_>,
        data: &EvalData<'_>,
        split: Range<usize>,
    ) -> Result<Vec<i8>, TrainError> {
        let Some(e) = self.eval.as_mut() else {
            // Not exact on the device for this network or environment: the host decides.
            return super::host_greedy_targets(self, which, data, split);
        };
        let params = match which {
            Judged::Current => self.fused.online_params(),
            Judged::Kept(s) => {
                self.arena.context().write(&mut e.kept, &s.state.online)?;
                &e.kept
            }
        };
        let net = NetOnDevice {
            params,
            layout: &e.layout,
            obs_dim: self.agent.config().obs_dim,
            max_width: e.max_width,
        };
        Ok(e.evaluator.targets(&net, split)?)
    }

    fn timing(&self) -> Timing {
        let ctx = self.arena.context().clone();
        Timing {
            sync: Box::new(move || {
                // A failed sync surfaces in the next read of a result; timing just ends here.
                let _ = ctx.synchronize();
            }),
            marks: Some(Box::new(Marks(self.arena.context().marks()))),
        }
    }
}

/// The stream's events as phase marks; a mark that fails loses its timing, never the work.
struct Marks(EventMarks);

impl DeviceMarks for Marks {
    fn restart(&mut self) {
        if let Err(e) = self.0.restart() {
            tracing::warn!("phase timing: {e}");
        }
    }
    fn mark(&mut self) {
        if let Err(e) = self.0.mark() {
            tracing::warn!("phase timing: {e}");
        }
    }
    fn intervals(&mut self) -> Vec<f64> {
        self.0.intervals().unwrap_or_else(|e| {
            tracing::warn!("phase timing: {e}");
            Vec::new()
        })
    }
}
