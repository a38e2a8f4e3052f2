//! The device replay ring: one row per environment step of all N environments, written by the
//! step kernel (replay by index: the state before the step, not its observation), sampled on the
//! device into a [`DeviceBatch`].

use std::sync::Arc;

use foxhunt_env::EnvConfig;
use foxhunt_gpu::{DeviceBatch, DeviceBuffer, GpuContext, Grid, Kernel, Launch, Module};

use crate::MemoryError;
use crate::device::GpuArena;

/// The device replay ring: per slot the state before the step (bar, position, entry), the
/// action, the reward and the done code. Written by [`crate::GpuVecEnv::step_record`]; sampled
/// by [`DeviceReplay::sample`].
pub struct DeviceReplay {
    ctx: Arc<GpuContext>,
    sample_fn: Kernel,
    pub(crate) n_env: usize,
    pub(crate) cap_rows: usize,
    pub(crate) written_rows: u64,
    /// The slot of the row being written, `(row % cap_rows) * n_env` (a kernel argument).
    row_base: u64,
    pub(crate) draws: u64,
    pub(crate) t: DeviceBuffer<u32>,
    pub(crate) position: DeviceBuffer<i32>,
    pub(crate) entry: DeviceBuffer<f64>,
    pub(crate) action: DeviceBuffer<u8>,
    pub(crate) reward: DeviceBuffer<f32>,
    pub(crate) done: DeviceBuffer<u8>,
}

/// The ring read back, slot by slot (for tests).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRows {
    /// Bar before the step.
    pub t: Vec<u32>,
    /// Position before the step.
    pub position: Vec<i32>,
    /// Entry price before the step.
    pub entry: Vec<f64>,
    /// Action taken.
    pub action: Vec<u8>,
    /// Reward of the step.
    pub reward: Vec<f32>,
    /// Done code of the step.
    pub done: Vec<u8>,
}

/// What a replay sample needs besides the ring: the environment's observation settings.
pub struct SampleSpec<'a, 'p> {
    /// The arena the ring's bars index.
    pub arena: &'a GpuArena<'p>,
    /// The environment configuration (look-back, scales).
    pub env: &'a EnvConfig,
    /// n of n-step returns.
    pub n_step: u32,
    /// Discount.
    pub gamma: f32,
    /// Seed of the sampler (Philox key).
    pub seed: u64,
}

impl DeviceReplay {
    /// A ring of `cap_rows` steps of `n_env` environments.
    pub fn new(ctx: &Arc<GpuContext>, n_env: usize, cap_rows: usize) -> Result<Self, MemoryError> {
        if n_env == 0 || cap_rows < 2 {
            return Err(MemoryError::Config(format!(
                "replay of {cap_rows} rows of {n_env} environments"
            )));
        }
        let slots = n_env * cap_rows;
        Ok(Self {
            sample_fn: ctx.kernel(Module::Env, "replay_sample")?,
            ctx: ctx.clone(),
            n_env,
            cap_rows,
            written_rows: 0,
            row_base: 0,
            draws: 0,
            t: ctx.alloc(slots)?,
            position: ctx.alloc(slots)?,
            entry: ctx.alloc(slots)?,
            action: ctx.alloc(slots)?,
            reward: ctx.alloc(slots)?,
            done: ctx.alloc(slots)?,
        })
    }

    /// Environments per row.
    pub fn n_env(&self) -> usize {
        self.n_env
    }
    /// Rows (steps) written so far.
    pub fn written_rows(&self) -> u64 {
        self.written_rows
    }
    /// Rows the ring holds.
    pub fn capacity_rows(&self) -> usize {
        self.cap_rows
    }
    /// Samples drawn so far (the Philox counter of the next draw).
    pub fn draws(&self) -> u64 {
        self.draws
    }
    /// Transitions that can start an n-step sample now.
    pub fn transitions(&self, n_step: usize) -> usize {
        self.transitions_after(self.written_rows, n_step)
    }
    /// Transitions that can start an n-step sample once `written_rows` rows are written (for
    /// planning steps ahead).
    pub fn transitions_after(&self, written_rows: u64, n_step: usize) -> usize {
        let rows = (written_rows.min(self.cap_rows as u64)) as usize;
        rows.saturating_sub(n_step) * self.n_env
    }

    /// Claims the next row and pushes the ring's arguments of env_step_record (buffers, then
    /// the row's first slot).
    pub(crate) fn push_row_args<'a>(&'a mut self, l: Launch<'a>) -> Launch<'a> {
        self.row_base = (self.written_rows % self.cap_rows as u64) * self.n_env as u64;
        self.written_rows += 1;
        l.output(&mut self.t)
            .output(&mut self.position)
            .output(&mut self.entry)
            .output(&mut self.action)
            .output(&mut self.reward)
            .output(&mut self.done)
            .value(&self.row_base)
    }

    /// Draws `out`'s batch uniformly from the ring on the device (Philox keyed by the seed,
    /// counter by the draw number): no host round trip (asynchronous).
    pub fn sample(
        &mut self,
        spec: &SampleSpec<'_, '_>,
        out: &mut DeviceBatch,
    ) -> Result<(), MemoryError> {
        let w = spec.arena.buffers();
        let dim = spec.env.obs_dim(w.cols);
        if out.obs_dim() != dim {
            return Err(MemoryError::Config(format!(
                "a batch of {}-float observations for an environment of {dim}",
                out.obs_dim()
            )));
        }
        let (cols, lookback) = (w.cols as u32, spec.env.lookback as u32);
        let max_position = i32::from(spec.env.max_position);
        let tick = spec.arena.exec().tick_size;
        let (n_env, cap, written) = (self.n_env as u32, self.cap_rows as u64, self.written_rows);
        let batch = out.batch() as u32;
        let draw = self.draws;
        self.draws += 1;
        let l = self
            .ctx
            .launch(&self.sample_fn)
            .input(&w.features)
            .input(&w.close)
            .value(&cols)
            .value(&lookback)
            .value(&max_position)
            .value(&spec.env.upnl_scale)
            .value(&tick)
            .input(&self.t)
            .input(&self.position)
            .input(&self.entry)
            .input(&self.action)
            .input(&self.reward)
            .input(&self.done)
            .value(&n_env)
            .value(&cap)
            .value(&written)
            .value(&spec.n_step)
            .value(&spec.gamma)
            .value(&spec.seed)
            .value(&draw)
            .output(&mut out.obs)
            .output(&mut out.actions)
            .output(&mut out.returns)
            .output(&mut out.next_obs)
            .output(&mut out.discounts)
            .output(&mut out.weights)
            .value(&batch);
        // SAFETY: the arguments follow replay_sample's signature in kernels/replay.cu; the ring
        // buffers hold cap_rows * n_env slots and every index the kernel forms is taken modulo
        // that; the batch buffers hold batch (observations: batch * obs_dim) elements for the
        // obs_dim the arena's columns and the look-back give (checked above); the grid covers
        // batch threads, each writing its own sample.
        unsafe { l.run(Grid::cover(batch as usize, 128)) }?;
        Ok(())
    }

    /// The ring read back (waits for the device; for tests).
    pub fn download(&self) -> Result<ReplayRows, MemoryError> {
        let c = &self.ctx;
        Ok(ReplayRows {
            t: c.download(&self.t)?,
            position: c.download(&self.position)?,
            entry: c.download(&self.entry)?,
            action: c.download(&self.action)?,
            reward: c.download(&self.reward)?,
            done: c.download(&self.done)?,
        })
    }
}
