//! Training on the GPU (feature `cuda`): the window's data in a device arena (one upload), N
//! environments stepped by foxhunt-memory's kernel, transitions written by that kernel into the
//! device replay ring and sampled there with Philox, and the agent acting and learning in
//! foxhunt-dqn's fused engine. Nothing crosses to the host within an epoch: observations,
//! actions, batches and statistics stay on the device; the statistics and the weights are read
//! once, at the end of the epoch (the weights for the host-side evaluation and checkpoints).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use foxhunt_dqn::fused::FusedDqn;
use foxhunt_dqn::{AgentState, DqnConfig};
use foxhunt_env::EnvConfig;
use foxhunt_memory::{
    DeviceBatch, DevicePool, DeviceReplay, GpuArena, GpuContext, GpuVecEnv, SampleSpec, WindowData,
};

use crate::TrainError;
use crate::phase::DeviceMarks;

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

/// One window on the device: its arena, replay ring, sampler and engine (separate fields, so
/// that an epoch's environments can borrow the arena while the ring is written and sampled).
pub(crate) struct GpuWindow<'p> {
    pub arena: GpuArena<'p>,
    pub ring: DeviceReplay,
    pub sampler: Sampler,
    pub engine: FusedDqn,
}

/// Draws batches from the ring into device buffers that the engine reads.
pub(crate) struct Sampler {
    pub batch: DeviceBatch,
    n_step: u32,
    gamma: f32,
    seed: u64,
}

impl<'p> GpuWindow<'p> {
    /// Uploads the window and the agent's `state`; `max_updates` is the most updates an epoch
    /// makes (the engine keeps their statistics on the device until the epoch ends).
    pub fn new(
        run: &'p mut GpuRun,
        data: &WindowData,
        envs: usize,
        dqn: &DqnConfig,
        state: &AgentState,
        max_updates: usize,
    ) -> Result<Self, TrainError> {
        let ctx = run.pool.context().clone();
        let arena = run.pool.window(data)?;
        let rows = (dqn.replay_capacity / envs).max(dqn.n_step + 2);
        let ring = DeviceReplay::new(&ctx, envs, rows)?;
        let batch = ring.batch_buffers(dqn.batch_size, dqn.obs_dim)?;
        let engine = FusedDqn::new(&ctx, dqn, state, max_updates)?;
        Ok(Self {
            arena,
            ring,
            sampler: Sampler {
                batch,
                n_step: dqn.n_step as u32,
                gamma: dqn.gamma as f32,
                seed: dqn.seed,
            },
            engine,
        })
    }
}

impl Sampler {
    /// Transitions of `ring` that can be sampled.
    pub fn transitions(&self, ring: &DeviceReplay, envs: usize) -> usize {
        let rows = (ring.written_rows() as usize).min(ring.capacity_rows());
        rows.saturating_sub(self.n_step as usize) * envs
    }

    /// Samples a batch into [`Sampler::batch`] on the device (asynchronous).
    pub fn sample(
        &mut self,
        arena: &GpuArena<'_>,
        ring: &mut DeviceReplay,
        env: &EnvConfig,
    ) -> Result<(), TrainError> {
        let spec = SampleSpec {
            arena,
            env,
            n_step: self.n_step,
            gamma: self.gamma,
            seed: self.seed,
        };
        ring.sample(&spec, &mut self.batch)?;
        Ok(())
    }
}

/// The environments of one epoch on the device and the buffer their actions are chosen into.
pub(crate) struct GpuEnvs<'a> {
    env: GpuVecEnv<'a>,
    actions: CudaSlice<u8>,
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
        let actions = arena
            .context()
            .stream()
            .alloc_zeros(n)
            .map_err(|e| foxhunt_memory::MemoryError::Driver(e.to_string()))?;
        Ok(Self { env, actions })
    }

    /// The engine picks every environment's action (epsilon-greedy, Philox keyed by `seed`,
    /// counter `draw`), then the environments step and record into `ring` (asynchronous).
    pub fn step(
        &mut self,
        engine: &mut FusedDqn,
        epsilon: f32,
        seed: u64,
        draw: u64,
        ring: &mut DeviceReplay,
    ) -> Result<(), TrainError> {
        let n = self.env.len();
        engine.act(&self.env.obs, n, epsilon, seed, draw, &mut self.actions)?;
        self.env.step_record(&self.actions, ring)?;
        Ok(())
    }
}

/// Phase boundaries as CUDA events on foxhunt-memory's stream: recording one costs a few
/// microseconds and no wait; the events are made once and reused epoch after epoch.
pub(crate) struct EventMarks {
    stream: Arc<CudaStream>,
    events: Vec<CudaEvent>,
    used: usize,
}

impl EventMarks {
    pub fn new(ctx: &GpuContext) -> Self {
        Self {
            stream: ctx.stream().clone(),
            events: Vec::new(),
            used: 0,
        }
    }
}

impl DeviceMarks for EventMarks {
    fn restart(&mut self) {
        self.used = 0;
        self.mark();
    }

    fn mark(&mut self) {
        if self.used == self.events.len() {
            let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
            match self.stream.context().new_event(Some(flags)) {
                Ok(e) => self.events.push(e),
                Err(e) => {
                    // A broken context fails the next launch with its own error; the phase
                    // times just lose this mark.
                    tracing::warn!("phase timing: cannot create a CUDA event: {e}");
                    return;
                }
            }
        }
        if let Err(e) = self.events[self.used].record(&self.stream) {
            tracing::warn!("phase timing: cannot record a CUDA event: {e}");
            return;
        }
        self.used += 1;
    }

    fn intervals(&mut self) -> Vec<f64> {
        let Some(last) = self.used.checked_sub(1) else {
            return Vec::new();
        };
        if let Err(e) = self.events[last].synchronize() {
            tracing::warn!("phase timing: {e}");
            return Vec::new();
        }
        (1..self.used)
            .map(|i| {
                self.events[i - 1]
                    .elapsed_ms(&self.events[i])
                    .map_or(0.0, f64::from)
            })
            .collect()
    }
}
