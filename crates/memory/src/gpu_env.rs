//! The GPU environment: N environments over a window resident in a [`GpuArena`](crate::GpuArena), stepped by
//! kernels that transcribe foxhunt-env's reference step (kernels/env_step.cu).

use std::ops::Range;
use std::sync::Arc;

use foxhunt_env::{EnvConfig, SessionRule};
use foxhunt_gpu::{DeviceBuffer, Elem, GpuContext, Grid, Kernel, Launch, Module};

use crate::MemoryError;
use crate::device::{DeviceWindow, OnStream};
use crate::replay::DeviceReplay;

/// The scalars env_reset and env_step both take after the market buffers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EnvScalars {
    pub cols: u32,
    pub split_start: u32,
    pub split_end: u32,
    pub lookback: u32,
    pub max_position: i32,
    pub upnl_scale: f32,
    pub tick_size: f64,
    pub seed: u64,
}

/// Pushes the arguments both kernels begin with, in their order in kernels/env_step.cu.
fn market<'a>(l: Launch<'a>, w: &'a DeviceWindow, s: &'a EnvScalars) -> Launch<'a> {
    l.input(&w.features)
        .input(&w.open)
        .input(&w.close)
        .input(&w.session)
        .input(&w.contract)
        .value(&s.cols)
        .value(&s.split_start)
        .value(&s.split_end)
        .value(&s.lookback)
        .value(&s.max_position)
        .value(&s.upnl_scale)
        .value(&s.tick_size)
        .value(&s.seed)
}

/// The scalars only env_step takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepParams {
    pub multiplier: f64,
    pub cost_per_side: f64,
    pub slippage_price: f64,
    pub episode_steps: u32,
    pub reward_scale: f64,
    pub risk_penalty: f64,
    pub flatten_at_close: i32,
}

/// N environments on the device over one split of a window resident in a [`GpuArena`](crate::GpuArena); the
/// environment borrows the arena, so it cannot outlive the window or copy its data.
///
/// The same semantics as `foxhunt_env::VecEnv` step for step: the kernels in kernels/env_step.cu
/// transcribe `exec::transition`, `next_entry`, `observe` and `episode_start`.
pub struct GpuVecEnv<'a> {
    ctx: Arc<GpuContext>,
    step_fn: Kernel,
    record_fn: Kernel,
    reset_fn: Kernel,
    pub(crate) window: &'a DeviceWindow,
    pub(crate) scalars: EnvScalars,
    pub(crate) params: StepParams,
    pub(crate) n: u32,
    dim: usize,
    pub(crate) t: DeviceBuffer<u32>,
    pub(crate) position: DeviceBuffer<i32>,
    pub(crate) entry: DeviceBuffer<f64>,
    pub(crate) steps: DeviceBuffer<u32>,
    pub(crate) episode: DeviceBuffer<u32>,
    /// Observations, `[n * obs_dim]`.
    pub obs: DeviceBuffer<f32>,
    /// Rewards of the last step, `[n]`.
    pub rewards: DeviceBuffer<f32>,
    /// Done codes of the last step, `[n]` (foxhunt_env::done).
    pub dones: DeviceBuffer<u8>,
}

impl<'a> GpuVecEnv<'a> {
    /// `n` environments over rows `split` of the arena's window (nothing is uploaded but the
    /// environments' own zeroed state).
    pub fn new(
        arena: impl Into<OnStream<'a>>,
        cfg: EnvConfig,
        split: Range<usize>,
        n: usize,
        seed: u64,
    ) -> Result<Self, MemoryError> {
        let arena = arena.into();
        let ctx = arena.context().clone();
        let exec = *arena.exec();
        if split.end > arena.rows() || split.len() < 2 || n == 0 || n > u32::MAX as usize {
            return Err(MemoryError::Config(format!(
                "split {split:?} of {} rows with {n} environments",
                arena.rows()
            )));
        }
        let dim = cfg.obs_dim(arena.buffers().cols);
        Ok(Self {
            step_fn: ctx.kernel(Module::Env, "env_step")?,
            record_fn: ctx.kernel(Module::Env, "env_step_record")?,
            reset_fn: ctx.kernel(Module::Env, "env_reset")?,
            window: arena.buffers(),
            scalars: EnvScalars {
                cols: arena.buffers().cols as u32,
                split_start: split.start as u32,
                split_end: split.end as u32,
                lookback: cfg.lookback as u32,
                max_position: i32::from(cfg.max_position),
                upnl_scale: cfg.upnl_scale,
                tick_size: exec.tick_size,
                seed,
            },
            params: StepParams {
                multiplier: exec.multiplier,
                cost_per_side: exec.cost_per_side,
                slippage_price: exec.slippage_price,
                episode_steps: cfg.episode_steps,
                reward_scale: cfg.reward_scale,
                risk_penalty: cfg.risk_penalty,
                flatten_at_close: i32::from(cfg.session_rule == SessionRule::FlattenAtClose),
            },
            t: ctx.alloc(n)?,
            position: ctx.alloc(n)?,
            entry: ctx.alloc(n)?,
            steps: ctx.alloc(n)?,
            episode: ctx.alloc(n)?,
            obs: ctx.alloc(n * dim)?,
            rewards: ctx.alloc(n)?,
            dones: ctx.alloc(n)?,
            ctx,
            n: n as u32,
            dim,
        })
    }

    /// Number of environments.
    pub fn len(&self) -> usize {
        self.n as usize
    }
    /// Whether there are none (never: `new` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Observation length.
    pub fn obs_dim(&self) -> usize {
        self.dim
    }
    /// The device.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn grid(&self) -> Grid {
        Grid::cover(self.n as usize, 256)
    }

    /// Starts over with episode starts seeded by `seed`: [`GpuVecEnv::reset`] on the buffers
    /// already made (an epoch's environments without an allocation).
    pub fn restart(&mut self, seed: u64) -> Result<(), MemoryError> {
        self.scalars.seed = seed;
        self.reset()
    }

    /// Starts episode 0 of every environment and writes the observations (asynchronous).
    pub fn reset(&mut self) -> Result<(), MemoryError> {
        let grid = self.grid();
        let l = market(self.ctx.launch(&self.reset_fn), self.window, &self.scalars)
            .output(&mut self.t)
            .output(&mut self.position)
            .output(&mut self.entry)
            .output(&mut self.steps)
            .output(&mut self.episode)
            .output(&mut self.obs)
            .value(&self.n);
        // SAFETY: the arguments follow env_reset's signature in kernels/env_step.cu; every
        // buffer holds n (obs: n * obs_dim) elements and the grid covers n threads, each
        // writing its own environment's elements.
        unsafe { l.run(grid) }?;
        Ok(())
    }

    /// Steps every environment with `actions` (`[n]`, on the device; asynchronous).
    pub fn step(&mut self, actions: &DeviceBuffer<u8>) -> Result<(), MemoryError> {
        self.launch_step(actions, None)
    }

    /// Steps every environment and writes this step's replay row into `replay` (asynchronous).
    pub fn step_record(
        &mut self,
        actions: &DeviceBuffer<u8>,
        replay: &mut DeviceReplay,
    ) -> Result<(), MemoryError> {
        if replay.n_env() != self.n as usize {
            return Err(MemoryError::Config(format!(
                "replay rows of {} environments for {}",
                replay.n_env(),
                self.n
            )));
        }
        self.launch_step(actions, Some(replay))
    }

    fn launch_step(
        &mut self,
        actions: &DeviceBuffer<u8>,
        replay: Option<&mut DeviceReplay>,
    ) -> Result<(), MemoryError> {
        if actions.len() != self.n as usize {
            return Err(MemoryError::Config(format!(
                "{} actions for {} environments",
                actions.len(),
                self.n
            )));
        }
        let grid = self.grid();
        let f = if replay.is_some() {
            &self.record_fn
        } else {
            &self.step_fn
        };
        let p = &self.params;
        let l = market(self.ctx.launch(f), self.window, &self.scalars)
            .value(&p.multiplier)
            .value(&p.cost_per_side)
            .value(&p.slippage_price)
            .value(&p.episode_steps)
            .value(&p.reward_scale)
            .value(&p.risk_penalty)
            .value(&p.flatten_at_close)
            .output(&mut self.t)
            .output(&mut self.position)
            .output(&mut self.entry)
            .output(&mut self.steps)
            .output(&mut self.episode)
            .input(actions)
            .output(&mut self.obs)
            .output(&mut self.rewards)
            .output(&mut self.dones)
            .value(&self.n);
        let l = match replay {
            Some(r) => r.push_row_args(l),
            None => l,
        };
        // SAFETY: the arguments follow env_step's signature in kernels/env_step.cu (with the
        // ring's buffers and row base, env_step_record's); every environment buffer holds n
        // (obs: n * obs_dim) elements, the ring holds cap_rows * n slots and its row base + n is
        // within it, the market arrays hold the rows the split indexes, and the grid covers n
        // threads, each touching its own environment's elements.
        unsafe { l.run(grid) }?;
        Ok(())
    }

    /// Uploads actions (for tests and benchmarks; the trainer chooses them on the device).
    pub fn upload_actions(&self, actions: &[u8]) -> Result<DeviceBuffer<u8>, MemoryError> {
        Ok(self.ctx.upload(actions)?)
    }

    /// A device buffer read back (waits for the device; for tests and logging).
    pub fn download<T: Elem>(&self, buf: &DeviceBuffer<T>) -> Result<Vec<T>, MemoryError> {
        Ok(self.ctx.download(buf)?)
    }

    /// Waits for all work queued on the stream.
    pub fn synchronize(&self) -> Result<(), MemoryError> {
        Ok(self.ctx.synchronize()?)
    }

    /// Current bar and position of every environment (waits for the device).
    pub fn state(&self) -> Result<(Vec<u32>, Vec<i32>), MemoryError> {
        Ok((self.download(&self.t)?, self.download(&self.position)?))
    }
}
