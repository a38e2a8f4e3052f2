//! The one-launch epoch: every step of a training epoch (act, environment step and replay write,
//! sample, the DQN update, the target update) in one cooperative kernel (foxhunt-gpu's
//! kernels/epoch.cu says how the work is split). The values that change from step to step come
//! from a table the host fills once per epoch ([`PlannedStep`]); nothing else crosses between
//! host and device until the epoch's statistics are read.
//!
//! The learner's state is given as device buffers and plain numbers ([`LearnerBuffers`],
//! [`LearnRule`]): this crate knows where the environments and the replay live, not how a
//! network is trained.

use foxhunt_gpu::{DeviceBatch, DeviceBuffer, GpuContext, Grid, Kernel, Launch, Module};

use crate::MemoryError;
use crate::gpu_env::GpuVecEnv;
use crate::replay::DeviceReplay;

/// Words per step of the table (kernels/epoch.cu's ST_WORDS).
const ST_WORDS: usize = 12;
/// Timestamps per step (kernels/epoch.cu's STAMPS).
const STAMPS: usize = 8;
/// Threads per block.
const THREADS: u32 = 256;
/// The most hidden layers the kernel takes (kernels/epoch.cu's MAX_HIDDEN).
const MAX_HIDDEN: usize = 8;
/// Bytes of the kernel's static shared memory (a reduction array of THREADS floats, the layout
/// words, the chunk's draws and a few sums: 1,856 bytes for sm_90), rounded up: what the dynamic
/// part cannot have.
const STATIC_SHARED: usize = 2048;

/// The most dynamic shared memory a block of the kernel can have.
fn shared_limit(ctx: &GpuContext) -> Result<usize, MemoryError> {
    Ok((ctx.max_shared_per_block()? as usize).saturating_sub(STATIC_SHARED))
}

/// The shape of the network the kernel trains.
#[derive(Debug, Clone, PartialEq)]
pub struct NetShape {
    /// Parameters, flat.
    pub params: usize,
    /// Inputs.
    pub obs_dim: usize,
    /// Outputs.
    pub actions: usize,
    /// Hidden layer widths.
    pub hidden: Vec<usize>,
}

/// The learner's state on the device, flat in the learner's parameter order: what the kernel
/// reads and updates in place.
pub struct LearnerBuffers<'a> {
    /// The online network.
    pub online: &'a mut DeviceBuffer<f32>,
    /// The target network.
    pub target: &'a mut DeviceBuffer<f32>,
    /// Adam's first moments.
    pub moment_1: &'a mut DeviceBuffer<f32>,
    /// Adam's second moments.
    pub moment_2: &'a mut DeviceBuffer<f32>,
    /// `[rows, 4]` statistics (loss, mean Q, mean |TD|, gradient norm) of each update.
    pub stats: &'a mut DeviceBuffer<f32>,
    /// The layout words (foxhunt-dqn's `fused::layout_words`).
    pub layout: &'a DeviceBuffer<u64>,
}

/// The learning rule's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnRule {
    /// Hidden activation: 0 ReLU, 1 tanh, 2 GELU.
    pub activation: i32,
    /// Double-DQN targets.
    pub double: bool,
    /// Huber's delta, or `None` for the squared error.
    pub huber_delta: Option<f32>,
    /// Gradient-norm clip (0: none).
    pub clip: f32,
    /// Adam's beta1.
    pub beta1: f32,
    /// Adam's beta2.
    pub beta2: f32,
    /// L2 weight decay.
    pub weight_decay: f32,
    /// The Polyak blend of a soft target update.
    pub tau: f32,
    /// n of n-step returns.
    pub n_step: u32,
    /// Discount.
    pub gamma: f32,
    /// Key of the replay sampler's draws.
    pub sample_seed: u64,
    /// Key of the exploration draws.
    pub explore_seed: u64,
}

/// How the target network follows after a step's update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSync {
    /// Unchanged.
    None,
    /// A copy of the online network.
    Copy,
    /// The Polyak blend.
    Blend,
}

/// One step of an epoch as the host plans it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlannedStep {
    /// The environments act and step (false: an update alone, for benchmarks).
    pub act: bool,
    /// Exploration rate.
    pub epsilon: f32,
    /// Exploration counter (foxhunt-dqn's `explore::step_counter`).
    pub counter: u64,
    /// An update follows the step.
    pub learn: bool,
    /// The update's learning rate.
    pub lr: f32,
    /// Adam's eps * sqrt(1 - b2^t).
    pub eps_c2: f32,
    /// Adam's sqrt(1 - b2^t) / (1 - b1^t).
    pub cf: f32,
    /// The target update after the update.
    pub sync: TargetSync,
}

/// Why the kernel cannot train this network, if it cannot: too many hidden layers, or the two
/// networks and a few rows' activations beyond one block's shared memory.
pub fn unsupported(ctx: &GpuContext, shape: &NetShape) -> Result<Option<String>, MemoryError> {
    if shape.hidden.len() > MAX_HIDDEN {
        return Ok(Some(format!(
            "{} hidden layers (the one-launch epoch takes {MAX_HIDDEN})",
            shape.hidden.len()
        )));
    }
    let limit = shared_limit(ctx)?;
    Ok((shared_bytes(shape, 1) > limit).then(|| {
        format!(
            "{} parameters (two networks of them do not fit in {limit} bytes of a block's shared memory)",
            shape.params
        )
    }))
}

/// Bytes of dynamic shared memory for chunks of `chunk` rows (kernels/epoch.cu's layout).
fn shared_bytes(s: &NetShape, chunk: usize) -> usize {
    let widest = s
        .hidden
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(s.actions + 1);
    let a = s.actions;
    let floats = 2 * s.params.next_multiple_of(4)
        + 2 * chunk * s.obs_dim
        + s.hidden
            .iter()
            .map(|&w| 3 * chunk * w + chunk)
            .sum::<usize>()
        + chunk * a
        + chunk
        + chunk * a
        + 2 * chunk * widest
        + s.hidden.len() * chunk
        + chunk * a
        + chunk
        + 4 * chunk * a
        + chunk
        + 2 * chunk * widest
        + 3 * chunk
        + chunk;
    4 * floats
}

/// The one-launch epoch over one window's environments, replay and learner.
pub struct EpochKernel {
    kernel: Kernel,
    grid: Grid,
    chunk: u32,
    shape: NetShape,
    n_env: usize,
    batch: usize,
    actions: DeviceBuffer<u8>,
    part: DeviceBuffer<f32>,
    grads: DeviceBuffer<f32>,
    norm_part: DeviceBuffer<f32>,
    loss_part: DeviceBuffer<f32>,
    barrier: DeviceBuffer<u32>,
    times: DeviceBuffer<u64>,
    table: DeviceBuffer<u64>,
    max_steps: usize,
}

impl EpochKernel {
    /// A kernel for `n_env` environments, batches of `batch` and epochs of at most `max_steps`
    /// steps of a network of `shape` (which [`unsupported`] accepts).
    pub fn new(
        ctx: &GpuContext,
        shape: NetShape,
        n_env: usize,
        batch: usize,
        max_steps: usize,
    ) -> Result<Self, MemoryError> {
        Self::with_batch_rows(ctx, shape, n_env, batch, max_steps, Self::BATCH_ROWS)
    }

    /// Batch rows a block learns from when blocks are free (`new`'s choice): fewer rows a block
    /// shorten its passes, more blocks lengthen the gradient's sum over their slots and the
    /// grid barriers.
    pub const BATCH_ROWS: usize = 4;

    /// As [`EpochKernel::new`], with one block per `batch_rows` rows of the batch (at least 1)
    /// where the environments do not ask for more blocks and the device holds them.
    pub fn with_batch_rows(
        ctx: &GpuContext,
        shape: NetShape,
        n_env: usize,
        batch: usize,
        max_steps: usize,
        batch_rows: usize,
    ) -> Result<Self, MemoryError> {
        if let Some(why) = unsupported(ctx, &shape)? {
            return Err(MemoryError::Config(format!("one-launch epoch: {why}")));
        }
        let kernel = ctx.kernel(Module::Epoch, "epoch_steps")?;
        let limit = shared_limit(ctx)?;
        // The largest chunk of rows that fits beside the networks, up to 8.
        let chunk = (1..=8)
            .rev()
            .find(|&c| shared_bytes(&shape, c) <= limit)
            .unwrap_or(1);
        let shared = shared_bytes(&shape, chunk) as u32;
        kernel.allow_shared(shared)?;
        // One block per few rows of the larger of environments and batch, as many as can be
        // resident at once (a cooperative launch needs them all).
        let resident = (ctx.sm_count()? * kernel.blocks_per_sm(THREADS, shared)?).max(1) as usize;
        let wanted = n_env
            .div_ceil(16)
            .max(batch.div_ceil(batch_rows.max(1)))
            .max(1);
        let blocks = wanted.min(resident);
        Ok(Self {
            grid: Grid {
                blocks: blocks as u32,
                threads: THREADS,
                shared_bytes: shared,
            },
            chunk: chunk as u32,
            actions: ctx.alloc(n_env)?,
            part: ctx.alloc(blocks * shape.params)?,
            grads: ctx.alloc(shape.params)?,
            norm_part: ctx.alloc(blocks)?,
            loss_part: ctx.alloc(3 * blocks)?,
            barrier: ctx.alloc(2)?,
            times: ctx.alloc(STAMPS * max_steps.max(1))?,
            table: ctx.alloc(ST_WORDS * max_steps.max(1))?,
            kernel,
            shape,
            n_env,
            batch,
            max_steps,
        })
    }

    /// Blocks of the launch.
    pub fn blocks(&self) -> u32 {
        self.grid.blocks
    }

    /// The gradient of the latest update, flat (for tests).
    pub fn gradients(&self) -> &DeviceBuffer<f32> {
        &self.grads
    }

    /// Runs the steps of `plan` in one launch: the environments act with the online network
    /// and step (writing the ring), and where a step learns, a batch is sampled from the ring
    /// and the learner updated, its statistics written from row `first_stat` on. Advances the
    /// ring's rows and draws as the launch does. Asynchronous.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        ctx: &GpuContext,
        env: &mut GpuVecEnv<'_>,
        ring: &mut DeviceReplay,
        batch: &mut DeviceBatch,
        learner: LearnerBuffers<'_>,
        rule: &LearnRule,
        plan: &[PlannedStep],
        first_stat: usize,
    ) -> Result<(), MemoryError> {
        let n = env.n as usize;
        if plan.len() > self.max_steps
            || n != self.n_env
            || ring.n_env != n
            || batch.batch() != self.batch
            || batch.obs_dim() != self.shape.obs_dim
            || learner.online.len() != self.shape.params
            || learner.stats.len() < 4 * (first_stat + plan.iter().filter(|s| s.learn).count())
        {
            return Err(MemoryError::Config(format!(
                "one-launch epoch of {} steps, {n} environments, batch {} of {} floats, {} parameters for a kernel of {} steps, {} environments, batch {}, {} parameters",
                plan.len(),
                batch.batch(),
                batch.obs_dim(),
                learner.online.len(),
                self.max_steps,
                self.n_env,
                self.batch,
                self.shape.params
            )));
        }
        // The table: the ring's rows and the sampler's draws advance as the steps do.
        let (mut written, mut draws, mut stat) = (ring.written_rows, ring.draws, first_stat as u64);
        let mut words = Vec::with_capacity(ST_WORDS * plan.len());
        for s in plan {
            let row_base = (written % ring.cap_rows as u64) * n as u64;
            if s.act {
                written += 1;
            }
            words.extend_from_slice(&[
                u64::from(s.epsilon.to_bits()),
                s.counter,
                row_base,
                written,
                u64::from(s.learn),
                draws,
                u64::from(s.lr.to_bits()),
                u64::from(s.eps_c2.to_bits()),
                u64::from(s.cf.to_bits()),
                match s.sync {
                    TargetSync::None => 0,
                    TargetSync::Copy => 1,
                    TargetSync::Blend => 2,
                },
                stat,
                u64::from(s.act),
            ]);
            if s.learn {
                draws += 1;
                stat += 1;
            }
        }
        ctx.write(&mut self.table, &words)?;
        ring.written_rows = written;
        ring.draws = draws;
        let steps = plan.len() as u32;
        let (loss_kind, delta) = match rule.huber_delta {
            Some(d) => (0i32, d),
            None => (1, 0.0),
        };
        let double = i32::from(rule.double);
        let params = self.shape.params as u64;
        let (n_env, batch_rows, cap) = (n as u32, self.batch as u32, ring.cap_rows as u64);
        let w = env.window;
        let (sc, sp) = (&env.scalars, &env.params);
        let l = push_env(ctx.launch(&self.kernel), w, sc, sp)
            .output(&mut env.t)
            .output(&mut env.position)
            .output(&mut env.entry)
            .output(&mut env.steps)
            .output(&mut env.episode)
            .output(&mut self.actions)
            .output(&mut env.obs)
            .output(&mut env.rewards)
            .output(&mut env.dones)
            .value(&n_env)
            .output(&mut ring.t)
            .output(&mut ring.position)
            .output(&mut ring.entry)
            .output(&mut ring.action)
            .output(&mut ring.reward)
            .output(&mut ring.done)
            .value(&cap)
            .value(&rule.n_step)
            .value(&rule.gamma)
            .value(&rule.sample_seed)
            .output(&mut batch.obs)
            .output(&mut batch.actions)
            .output(&mut batch.returns)
            .output(&mut batch.next_obs)
            .output(&mut batch.discounts)
            .output(&mut batch.weights)
            .value(&batch_rows)
            .input(learner.layout)
            .value(&params)
            .output(learner.online)
            .output(learner.target)
            .output(learner.moment_1)
            .output(learner.moment_2)
            .output(&mut self.part)
            .output(&mut self.grads)
            .output(&mut self.norm_part)
            .output(&mut self.loss_part)
            .output(learner.stats)
            .value(&rule.activation)
            .value(&double)
            .value(&loss_kind)
            .value(&delta)
            .value(&rule.clip)
            .value(&rule.beta1)
            .value(&rule.beta2)
            .value(&rule.weight_decay)
            .value(&rule.tau)
            .value(&rule.explore_seed)
            .input(&self.table)
            .value(&steps)
            .value(&self.chunk)
            .output(&mut self.barrier)
            .output(&mut self.times);
        // SAFETY: the arguments follow EPOCH_PARAMS (kernels/epoch.cu) in order and type. The
        // environment's buffers hold n_env elements (observations n_env * obs_dim), the ring
        // cap_rows * n_env slots whose row bases the table gives modulo that, the batch buffers
        // `batch` rows of obs_dim floats; the layout words describe `params` parameters, which
        // each of online, target, the moments and grads hold; part holds blocks * params,
        // norm_part blocks, loss_part 3 * blocks, stats rows for every learning step from
        // first_stat (checked above); the table and times hold the plan's steps (checked
        // above). Block g touches only its own environments', batch rows' and parameter slice's
        // elements between the grid barriers; the launch is cooperative, so every block is
        // resident and the barriers complete; the dynamic shared memory is what
        // kernels/epoch.cu lays out for `chunk` rows (shared_bytes).
        unsafe { l.run_cooperative(self.grid) }?;
        Ok(())
    }
}

/// Pushes the market and environment arguments EPOCH_PARAMS begins with, in order.
fn push_env<'l>(
    l: Launch<'l>,
    w: &'l crate::device::DeviceWindow,
    sc: &'l crate::gpu_env::EnvScalars,
    sp: &'l crate::gpu_env::StepParams,
) -> Launch<'l> {
    {
        l.input(&w.features)
            .input(&w.open)
            .input(&w.close)
            .input(&w.session)
            .input(&w.contract)
            .value(&sc.cols)
            .value(&sc.split_start)
            .value(&sc.split_end)
            .value(&sc.lookback)
            .value(&sc.max_position)
            .value(&sc.upnl_scale)
            .value(&sc.tick_size)
            .value(&sc.seed)
            .value(&sp.multiplier)
            .value(&sp.cost_per_side)
            .value(&sp.slippage_price)
            .value(&sp.episode_steps)
            .value(&sp.reward_scale)
            .value(&sp.risk_penalty)
            .value(&sp.flatten_at_close)
    }
}

/// Where the device's time went in a launch, milliseconds summed over its steps (block 0's
/// timestamps; a part ends when block 0 has done it, and waits at the grid barriers count in
/// the part that follows them).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Acting, stepping and writing the ring, up to every block's rows written.
    pub collect: f64,
    /// Sampling the block's first chunk of the batch (its draws and observations).
    pub sample: f64,
    /// The forward passes and TD terms of that chunk.
    pub forward: f64,
    /// The backward pass of that chunk, then the block's other chunks (sampled, forward and
    /// backward) into its gradient slot.
    pub backward: f64,
    /// Summing the slots and the gradient norm.
    pub reduce: f64,
    /// Adam, and the target update where the step has one: both on each block's slice of the
    /// parameters, in one pass over it.
    pub adam: f64,
    /// Every block taking the new networks (after the grid barrier that follows the update).
    pub sync: f64,
}

impl StepTimes {
    /// The phases of the `phase breakdown` line: collect, train (sampling, forward, backward,
    /// reduction, Adam), sync.
    pub fn phases(&self) -> [f64; 3] {
        [
            self.collect,
            self.sample + self.forward + self.backward + self.reduce + self.adam,
            self.sync,
        ]
    }
}

impl EpochKernel {
    /// Where the device's time went in the last launch's first `steps` steps (waits for the
    /// device).
    pub fn step_times(&self, ctx: &GpuContext, steps: usize) -> Result<StepTimes, MemoryError> {
        let t = ctx.download_prefix(&self.times, STAMPS * steps)?;
        let mut p = [0f64; STAMPS - 1];
        for s in t.chunks_exact(STAMPS) {
            for (k, v) in p.iter_mut().enumerate() {
                *v += s[k + 1].saturating_sub(s[k]) as f64 / 1e6;
            }
        }
        Ok(StepTimes {
            collect: p[0],
            sample: p[1],
            forward: p[2],
            backward: p[3],
            reduce: p[4],
            adam: p[5],
            sync: p[6],
        })
    }
}
