//! Experience collection on the GPU (feature `cuda`): the window's data in a device arena (one
//! upload), N environments stepped by foxhunt-memory's kernel, transitions written by that
//! kernel into the device replay ring and sampled there with Philox.
//!
//! What still crosses to the host each step, because burn-cuda 0.21 gives no way to hand a
//! tensor to a foreign kernel or take one from it: the observations for the Q-network's forward
//! (N x obs_dim floats) down, the chosen actions (N bytes) up, and the sampled batch down to be
//! uploaded into burn. The fused engine (own kernels for the network) removes all three.

use std::sync::Arc;

use foxhunt_dqn::replay::HostBatch;
use foxhunt_env::EnvConfig;
use foxhunt_memory::{
    DeviceBatch, DevicePool, DeviceReplay, GpuArena, GpuContext, GpuVecEnv, MemoryError,
    SampleSpec, WindowData,
};

use crate::TrainError;

/// The device side of a run: the pool of window buffers, reused from window to window.
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

/// One window on the device: its arena, replay ring and sampler (separate fields, so that an
/// epoch's environments can borrow the arena while the ring is written and sampled).
pub(crate) struct GpuWindow<'p> {
    pub arena: GpuArena<'p>,
    pub ring: DeviceReplay,
    pub sampler: Sampler,
}

/// Draws batches from the ring into device buffers and reads them back for burn.
pub(crate) struct Sampler {
    batch: DeviceBatch,
    ctx: Arc<GpuContext>,
    n_step: u32,
    gamma: f32,
    seed: u64,
}

impl<'p> GpuWindow<'p> {
    pub fn new(
        run: &'p mut GpuRun,
        data: &WindowData,
        envs: usize,
        dqn: &foxhunt_dqn::DqnConfig,
    ) -> Result<Self, TrainError> {
        let ctx = run.pool.context().clone();
        let arena = run.pool.window(data)?;
        let rows = (dqn.replay_capacity / envs).max(dqn.n_step + 2);
        let ring = DeviceReplay::new(&ctx, envs, rows)?;
        let batch = ring.batch_buffers(dqn.batch_size, dqn.obs_dim)?;
        Ok(Self {
            arena,
            ring,
            sampler: Sampler {
                batch,
                ctx,
                n_step: dqn.n_step as u32,
                gamma: dqn.gamma as f32,
                seed: dqn.seed,
            },
        })
    }
}

impl Sampler {
    /// Transitions of `ring` that can be sampled.
    pub fn transitions(&self, ring: &DeviceReplay, envs: usize) -> usize {
        let rows = (ring.written_rows() as usize).min(ring.capacity_rows());
        rows.saturating_sub(self.n_step as usize) * envs
    }

    /// Samples a batch on the device and reads it back for burn.
    pub fn sample(
        &mut self,
        arena: &GpuArena<'_>,
        ring: &mut DeviceReplay,
        env: &EnvConfig,
    ) -> Result<HostBatch, TrainError> {
        let spec = SampleSpec {
            arena,
            env,
            n_step: self.n_step,
            gamma: self.gamma,
            seed: self.seed,
        };
        ring.sample(&spec, &mut self.batch)?;
        let (obs, actions, returns, next_obs, discounts, weights) =
            self.batch.download(&self.ctx)?;
        Ok(HostBatch {
            slots: Vec::new(),
            obs,
            actions: actions.into_iter().map(i64::from).collect(),
            returns,
            next_obs,
            discounts,
            weights,
        })
    }
}

/// The environments of one epoch on the device.
pub(crate) struct GpuEnvs<'a> {
    env: GpuVecEnv<'a>,
    pub obs: Vec<f32>,
}

impl<'a> GpuEnvs<'a> {
    pub fn new(
        arena: &'a GpuArena<'_>,
        cfg: &EnvConfig,
        split: std::ops::Range<usize>,
        n: usize,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let mut env = GpuVecEnv::new(arena, cfg.clone(), split, n, seed)?;
        env.reset()?;
        let obs = env.download(&env.obs)?;
        Ok(Self { env, obs })
    }

    /// Steps with `actions`, recording into `ring`, and reads the next observations back.
    pub fn step(&mut self, actions: &[u8], ring: &mut DeviceReplay) -> Result<(), MemoryError> {
        let a = self.env.upload_actions(actions)?;
        self.env.step_record(&a, ring)?;
        self.obs = self.env.download(&self.env.obs)?;
        Ok(())
    }
}
