//! The one-launch epoch: every step of a training epoch (act, environment step and replay write,
//! sample, the DQN update, the target update) in one persistent kernel, for one agent
//! ([`EpochKernel::run`]) or a population of agents side by side ([`EpochPopulation`]);
//! foxhunt-gpu's kernels/epoch.cu says how the work is split. The values that change from step
//! to step come from a table the host fills once per epoch ([`PlannedStep`]); nothing else
//! crosses between host and device until the epoch's statistics are read.
//!
//! The learner's state is given as device buffers and plain numbers ([`LearnerBuffers`],
//! [`LearnRule`]): this crate knows where the environments and the replay live, not how a
//! network is trained.

use foxhunt_gpu::{DeviceBatch, DeviceBuffer, GpuContext, Grid, Kernel, Launch, Module};

use crate::MemoryError;
use crate::gpu_env::{EnvScalars, GpuVecEnv, StepParams};
use crate::replay::DeviceReplay;

mod meeting;
pub use meeting::{EpochMeeting, Seat};

/// Words per step of the table (kernels/epoch.cu's ST_WORDS).
const ST_WORDS: usize = 12;
/// Words of a member's entry in the member table (kernels/epoch.cu's MEMBER_WORDS).
const MEMBER_WORDS: usize = 37;
/// The word of a member's entry that holds its step table's address.
const MEMBER_TABLE: usize = 30;
/// Timestamps per step (kernels/epoch.cu's STAMPS).
const STAMPS: usize = 8;
/// The most hidden layers the kernel takes (kernels/epoch.cu's MAX_HIDDEN).
const MAX_HIDDEN: usize = 8;

/// The epoch's two compilations (kernels/epoch.cu): `epoch_steps`, whose blocks meet at grid
/// barriers in a cooperative launch, and `epoch_steps_cluster`, for a member whose blocks are one
/// thread-block cluster. The same body, so the same bits; two kernels, because the cluster's
/// barrier objects make the compiler fence every barrier of the kernel that holds them harder.
#[derive(Clone, Debug)]
struct EpochKernels {
    grid: Kernel,
    cluster: Kernel,
}

impl EpochKernels {
    /// The kernel for a launch whose members are each one cluster, or not.
    fn of(&self, clustered: bool) -> &Kernel {
        if clustered { &self.cluster } else { &self.grid }
    }
}

/// The kernels and the block they are compiled for: kernels/epoch.cu's `__launch_bounds__` fix
/// the threads a block (read back, not repeated here), and their static shared memory (a
/// reduction array of a float a thread, the member's and the layout words, the chunk's draws and
/// segments) is what the dynamic part cannot have.
struct Compiled {
    kernels: EpochKernels,
    threads: u32,
    /// The most dynamic shared memory a block can have, bytes.
    shared_limit: usize,
}

impl Compiled {
    fn new(ctx: &GpuContext) -> Result<Self, MemoryError> {
        let kernels = EpochKernels {
            grid: ctx.kernel(Module::Epoch, "epoch_steps")?,
            cluster: ctx.kernel(Module::Epoch, "epoch_steps_cluster")?,
        };
        let (g, c) = (&kernels.grid, &kernels.cluster);
        let threads = g.max_threads()?.min(c.max_threads()?);
        let shared_limit =
            (ctx.max_shared_per_block()?
                .saturating_sub(g.static_shared()?.max(c.static_shared()?))) as usize;
        Ok(Self {
            kernels,
            threads,
            shared_limit,
        })
    }
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
    /// Hidden layers normalized (their normalized inputs are kept for the backward pass).
    pub layer_norm: bool,
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
    let limit = Compiled::new(ctx)?.shared_limit;
    Ok((shared_bytes(shape, 1) > limit).then(|| {
        format!(
            "{} parameters (two networks of them do not fit in {limit} bytes of a block's shared memory)",
            shape.params
        )
    }))
}

/// Bytes of dynamic shared memory for chunks of `chunk` rows (kernels/epoch.cu's layout; the
/// same buffers, counted in another order).
fn shared_bytes(s: &NetShape, chunk: usize) -> usize {
    let widest = s
        .hidden
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(s.actions + 1);
    let (a, c) = (s.actions, chunk);
    // The training pass takes a chunk's observations and next observations together.
    let t = 2 * c;
    let kept_per_layer = if s.layer_norm { 3 } else { 2 };
    let floats = 2 * s.params.next_multiple_of(4)
        + t * s.obs_dim
        + s.hidden
            .iter()
            .map(|&w| kept_per_layer * t * w + t)
            .sum::<usize>()
        + t * (2 * a + 1)
        + 2 * c * widest
        + s.hidden.len() * c
        + c * (a + 1)
        + 3 * c * a
        + c
        + t
        + 2 * c;
    4 * floats
}

/// The one-launch epoch over one window's environments, replay and learner: the kernel, its
/// launch shape and the buffers an agent's launch needs beside its learner (gradient slots, the
/// barrier, timestamps, the step table).
pub struct EpochKernel {
    kernels: EpochKernels,
    grid: Grid,
    chunk: u32,
    /// Groups of batch rows (kernels/epoch.cu): fixed for a network, batch and device, whatever
    /// the launch; each has a gradient slot.
    slots: u32,
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
    /// The agent's own launches' tables.
    alone: Tables,
    max_steps: usize,
    /// Blocks of the kernel the device holds at once.
    resident: usize,
    /// Whether a launch's members may each be a thread-block cluster ([`EpochKernel::set_clusters`]).
    clusters: bool,
    /// Whether a launch's blocks may keep Adam's operands of their slices in shared memory
    /// ([`EpochKernel::set_adam_in_shared`]).
    adam_shared: bool,
    /// The most dynamic shared memory a block can have, bytes.
    shared_limit: usize,
}

/// The most blocks of a member launched as one thread-block cluster (the largest cluster a
/// Hopper device allows, with the kernel's consent to more than the portable 8).
const MAX_CLUSTER: u32 = 16;

/// Whether launches use thread-block clusters where they can, by default: yes, unless
/// `FOXHUNT_EPOCH_CLUSTERS` is `off` (or `0`), which keeps every member on its grid barrier (to
/// compare, or to step around a driver that mislaunches clusters).
pub fn clusters_by_default() -> bool {
    !matches!(
        std::env::var("FOXHUNT_EPOCH_CLUSTERS").as_deref(),
        Ok("off" | "0")
    )
}

/// Whether launches keep Adam's operands of a block's parameter slice (the moments and the summed
/// gradient) in its shared memory where they fit, by default: yes, unless
/// `FOXHUNT_EPOCH_ADAM_SHARED` is `off` (or `0`), which leaves them in global memory (to
/// compare): the same bits either way.
pub fn adam_shared_by_default() -> bool {
    !matches!(
        std::env::var("FOXHUNT_EPOCH_ADAM_SHARED").as_deref(),
        Ok("off" | "0")
    )
}

/// Arrays of a block's parameter slice kept in shared memory for Adam: the two moments and the
/// summed gradient (kernels/epoch.cu's `adam_shared`).
const ADAM_SLICE_ARRAYS: u64 = 3;

/// Floats of each array of a block's parameter slice kept in shared memory when a member's
/// parameters are cut into `slots` groups' slices over `blocks` blocks (kernels/epoch.cu's
/// split): the largest block's slice, from the float4 it starts in, in whole float4s.
fn adam_slice_floats(params: u64, slots: u32, blocks: u32) -> u64 {
    let (p, s, b) = (params, u64::from(slots), u64::from(blocks.max(1)));
    (0..b)
        .map(|g| {
            let (k0, k1) = (g * s / b, (g + 1) * s / b);
            let (p0, p1) = (k0 * p / s, k1 * p / s);
            (p1 - (p0 & !3)).next_multiple_of(4)
        })
        .max()
        .unwrap_or(0)
}

/// Bytes of shared memory a block adds for slice arrays of `floats` floats each.
fn adam_slice_bytes(floats: u64) -> u64 {
    4 * ADAM_SLICE_ARRAYS * floats
}

/// The floats of each slice array a launch's blocks keep in shared memory (EPOCH_PARAMS'
/// `adam_shared`): [`adam_slice_floats`] where `allowed` and the blocks of `per` a member have
/// room for them beside what `grid`'s blocks need, else 0 (Adam's operands stay in global
/// memory).
fn launch_adam_slice(
    allowed: bool,
    params: u64,
    slots: u32,
    grid: Grid,
    per: u32,
    limit: usize,
) -> u32 {
    let floats = adam_slice_floats(params, slots, per);
    if allowed && u64::from(grid.shared_bytes) + adam_slice_bytes(floats) <= limit as u64 {
        floats as u32
    } else {
        0
    }
}

/// Whether a launch of `rows` members of `grid`'s blocks each runs them as clusters: where
/// `allowed`, a member has 2 to [`MAX_CLUSTER`] blocks and the device runs every member's
/// cluster at once (so a launch takes as long either way); else each member meets at its grid
/// barrier in a cooperative launch. Either way the same bits (kernels/epoch.cu).
fn use_clusters(
    ctx: &GpuContext,
    kernels: &EpochKernels,
    allowed: bool,
    grid: Grid,
    rows: usize,
) -> Result<bool, MemoryError> {
    if !allowed || grid.blocks < 2 || grid.blocks > MAX_CLUSTER {
        return Ok(false);
    }
    let fit = kernels.cluster.max_clusters(ctx, grid)?;
    Ok(fit as usize >= rows)
}

/// The step tables and member words of launches, grown to the largest launch yet.
struct Tables {
    words: DeviceBuffer<u64>,
    table: DeviceBuffer<u64>,
}

impl Tables {
    fn new(ctx: &GpuContext) -> Result<Self, MemoryError> {
        Ok(Self {
            words: ctx.alloc(MEMBER_WORDS)?,
            table: ctx.alloc(ST_WORDS)?,
        })
    }
    /// Room for `words` member words and `table` table words (new buffers where short).
    fn reserve(&mut self, ctx: &GpuContext, words: usize, table: usize) -> Result<(), MemoryError> {
        if words > self.words.capacity() {
            self.words = ctx.alloc(words)?;
        }
        if table > self.table.capacity() {
            self.table = ctx.alloc(table)?;
        }
        Ok(())
    }
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
        let Compiled {
            kernels,
            threads,
            shared_limit: limit,
        } = Compiled::new(ctx)?;
        // The largest chunk of rows that fits beside the networks, up to 8.
        let chunk = (1..=8)
            .rev()
            .find(|&c| shared_bytes(&shape, c) <= limit)
            .unwrap_or(1);
        let shared = shared_bytes(&shape, chunk) as u32;
        // Up to the limit: a launch adds Adam's operands where they fit (`launch_adam_slice`).
        kernels.grid.allow_shared(limit as u32)?;
        kernels.cluster.allow_shared(limit as u32)?;
        // One block per few rows of the larger of environments and batch, as many as can be
        // resident at once (a cooperative launch needs them all). Alone, an agent has a block
        // per group of batch rows.
        let resident =
            (ctx.sm_count()? * kernels.grid.blocks_per_sm(threads, shared)?).max(1) as usize;
        let blocks = wanted_blocks(n_env, batch, batch_rows).min(resident);
        Ok(Self {
            grid: Grid {
                blocks: blocks as u32,
                threads,
                shared_bytes: shared,
            },
            chunk: chunk as u32,
            slots: blocks as u32,
            actions: ctx.alloc(n_env)?,
            part: ctx.alloc(blocks * crate::gradient_slot_floats(shape.params))?,
            grads: ctx.alloc(shape.params)?,
            norm_part: ctx.alloc(blocks)?,
            loss_part: ctx.alloc(3 * blocks)?,
            barrier: ctx.alloc(2)?,
            times: ctx.alloc(STAMPS * max_steps.max(1))?,
            alone: Tables::new(ctx)?,
            resident,
            clusters: clusters_by_default(),
            adam_shared: adam_shared_by_default(),
            shared_limit: limit,
            kernels,
            shape,
            n_env,
            batch,
            max_steps,
        })
    }

    /// Blocks of the agent's own launch.
    pub fn blocks(&self) -> u32 {
        self.grid.blocks
    }

    /// Lets launches run each member's blocks as a thread-block cluster where the device can
    /// (`true`, [`clusters_by_default`]'s choice), or keeps them on grid barriers (`false`): the
    /// same results, bit for bit, by other synchronization.
    pub fn set_clusters(&mut self, on: bool) {
        self.clusters = on;
    }

    /// Lets launches keep Adam's operands of each block's parameter slice (the moments and the
    /// summed gradient) in its shared memory where they fit (`true`, [`adam_shared_by_default`]'s
    /// choice), or keeps them in global memory (`false`): the same results, bit for bit.
    pub fn set_adam_in_shared(&mut self, on: bool) {
        self.adam_shared = on;
    }

    /// Whether the agent's own launch runs its blocks as one thread-block cluster.
    pub fn runs_in_clusters(&self, ctx: &GpuContext) -> Result<bool, MemoryError> {
        use_clusters(ctx, &self.kernels, self.clusters, self.grid, 1)
    }

    /// Whether the agent's own launch keeps Adam's operands in its blocks' shared memory.
    pub fn keeps_adam_in_shared(&self) -> bool {
        let (p, slots, g) = (self.shape.params as u64, self.slots, self.grid);
        launch_adam_slice(self.adam_shared, p, slots, g, g.blocks, self.shared_limit) > 0
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
        EpochMember {
            kernel: self,
            env,
            ring,
            batch,
            learner,
            rule,
            plan,
            first_stat,
        }
        .run(ctx)
    }
}

/// Blocks wanted for `n_env` environments and batches of `batch`, `batch_rows` rows a block.
fn wanted_blocks(n_env: usize, batch: usize, batch_rows: usize) -> usize {
    n_env
        .div_ceil(16)
        .max(batch.div_ceil(batch_rows.max(1)))
        .max(1)
}

/// One agent of a launch: the buffers of its [`EpochKernel`], its environments, replay, batch
/// and learner, its rule and the steps it runs (statistics from row `first_stat` on).
pub struct EpochMember<'m, 'w> {
    /// Its kernel's buffers (gradient slots, barrier, timestamps).
    pub kernel: &'m mut EpochKernel,
    /// Its environments.
    pub env: &'m mut GpuVecEnv<'w>,
    /// Its replay ring.
    pub ring: &'m mut DeviceReplay,
    /// Its batch buffers.
    pub batch: &'m mut DeviceBatch,
    /// Its learner.
    pub learner: LearnerBuffers<'m>,
    /// Its rule.
    pub rule: &'m LearnRule,
    /// Its steps.
    pub plan: &'m [PlannedStep],
    /// Its first statistics row.
    pub first_stat: usize,
}

impl EpochMember<'_, '_> {
    /// Runs the member's plan alone, in a launch of its own, as [`EpochKernel::run`].
    pub fn run(mut self, ctx: &GpuContext) -> Result<(), MemoryError> {
        let prepared = self.prepare(ctx)?;
        // SAFETY: `prepared` names the buffers this member borrows (its kernel's, environments',
        // ring's, batch's and learner's), lent until this call returns; work queued on the
        // stream after it runs after the launch.
        unsafe { launch_all(ctx, &mut self.kernel.alone, &[prepared], usize::MAX) }?;
        Ok(())
    }

    /// The member's part of a launch, made ready: its step table and words (device addresses
    /// of its buffers, its keys), and what the members of a launch share. Checks the member
    /// against its kernel, and advances its ring's rows and draws as the launch will.
    fn prepare(&mut self, ctx: &GpuContext) -> Result<PreparedMember, MemoryError> {
        let k = &*self.kernel;
        let n = self.env.n as usize;
        if self.plan.len() > k.max_steps
            || n != k.n_env
            || self.ring.n_env != n
            || self.batch.batch() != k.batch
            || self.batch.obs_dim() != k.shape.obs_dim
            || self.learner.online.len() != k.shape.params
            || self.learner.stats.len()
                < 4 * (self.first_stat + self.plan.iter().filter(|s| s.learn).count())
        {
            return Err(MemoryError::Config(format!(
                "one-launch epoch of {} steps, {n} environments, batch {} of {} floats, {} parameters for a kernel of {} steps, {} environments, batch {}, {} parameters",
                self.plan.len(),
                self.batch.batch(),
                self.batch.obs_dim(),
                self.learner.online.len(),
                k.max_steps,
                k.n_env,
                k.batch,
                k.shape.params
            )));
        }
        let mut table = Vec::with_capacity(ST_WORDS * self.plan.len());
        step_table(self.ring, self.plan, self.first_stat, &mut table);
        let (e, r, b, l) = (&*self.env, &*self.ring, &*self.batch, &self.learner);
        let words = vec![
            ctx.address(&e.t),
            ctx.address(&e.position),
            ctx.address(&e.entry),
            ctx.address(&e.steps),
            ctx.address(&e.episode),
            ctx.address(&k.actions),
            ctx.address(&e.obs),
            ctx.address(&e.rewards),
            ctx.address(&e.dones),
            ctx.address(&r.t),
            ctx.address(&r.position),
            ctx.address(&r.entry),
            ctx.address(&r.action),
            ctx.address(&r.reward),
            ctx.address(&r.done),
            ctx.address(&b.obs),
            ctx.address(&b.actions),
            ctx.address(&b.returns),
            ctx.address(&b.next_obs),
            ctx.address(&b.discounts),
            ctx.address(&b.weights),
            ctx.address(&*l.online),
            ctx.address(&*l.target),
            ctx.address(&*l.moment_1),
            ctx.address(&*l.moment_2),
            ctx.address(&k.part),
            ctx.address(&k.grads),
            ctx.address(&k.norm_part),
            ctx.address(&k.loss_part),
            ctx.address(&*l.stats),
            0, // the table's address: set at launch (MEMBER_TABLE)
            ctx.address(&k.barrier),
            ctx.address(&k.times),
            ctx.address(l.layout),
            e.scalars.seed,
            self.rule.sample_seed,
            self.rule.explore_seed,
        ];
        debug_assert_eq!(words.len(), MEMBER_WORDS);
        let w = e.window;
        let (sc, sp, rule) = (&e.scalars, &e.params, self.rule);
        let (loss_kind, delta) = match rule.huber_delta {
            Some(d) => (0i32, d),
            None => (1, 0.0),
        };
        Ok(PreparedMember {
            words,
            table,
            kernels: k.kernels.clone(),
            shared: Shared {
                grid: k.grid,
                resident: k.resident,
                clusters: k.clusters,
                adam_shared: k.adam_shared,
                shared_limit: k.shared_limit,
                window: [
                    ctx.address(&w.features),
                    ctx.address(&w.open),
                    ctx.address(&w.close),
                    ctx.address(&w.session),
                    ctx.address(&w.contract),
                ],
                env: EnvScalars { seed: 0, ..*sc },
                step: *sp,
                n_env: n as u32,
                cap_rows: r.cap_rows as u64,
                n_step: rule.n_step,
                gamma: rule.gamma,
                batch: k.batch as u32,
                params: k.shape.params as u64,
                activation: rule.activation,
                double: i32::from(rule.double),
                loss_kind,
                delta,
                clip: rule.clip,
                beta1: rule.beta1,
                beta2: rule.beta2,
                weight_decay: rule.weight_decay,
                tau: rule.tau,
                steps: self.plan.len() as u32,
                chunk: k.chunk,
                slots: k.slots,
            },
        })
    }
}

/// A member's part of a launch ([`EpochMember::prepare`]): numbers only (its buffers' device
/// addresses, its keys, its step table), so that the thread that launches need not be the
/// member's own ([`EpochMeeting`]).
struct PreparedMember {
    words: Vec<u64>,
    table: Vec<u64>,
    kernels: EpochKernels,
    shared: Shared,
}

/// What the members of one launch share: the launch's shape and EPOCH_PARAMS' values (the
/// window's buffers as addresses).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shared {
    grid: Grid,
    resident: usize,
    clusters: bool,
    adam_shared: bool,
    shared_limit: usize,
    window: [u64; 5],
    env: EnvScalars,
    step: StepParams,
    n_env: u32,
    cap_rows: u64,
    n_step: u32,
    gamma: f32,
    batch: u32,
    params: u64,
    activation: i32,
    double: i32,
    loss_kind: i32,
    delta: f32,
    clip: f32,
    beta1: f32,
    beta2: f32,
    weight_decay: f32,
    tau: f32,
    steps: u32,
    chunk: u32,
    slots: u32,
}

/// A population's one-launch epochs: its members launched together, a row of blocks a member,
/// from one thread ([`EpochPopulation::run`]) or from the members' own ([`EpochMeeting`]).
/// Members that share everything but their keys (replay draws, exploration, episode starts),
/// their step tables and their networks' values share a launch; the others launch beside them,
/// as do members beyond what one launch holds (a block each). A member equals its agent trained
/// alone, bit for bit, in any launch and with any number of blocks (kernels/epoch.cu: its sums
/// follow its groups of batch rows, not its blocks).
pub struct EpochPopulation {
    tables: Tables,
    max_blocks: usize,
}

impl EpochPopulation {
    /// Launches whose members have as many blocks as the device holds for all of them, up to
    /// the blocks an agent has alone.
    pub fn new(ctx: &GpuContext) -> Result<Self, MemoryError> {
        Self::with_blocks(ctx, usize::MAX)
    }

    /// As [`EpochPopulation::new`], with at most `blocks` blocks a member (at least 1): for
    /// tests and benchmarks of members with few blocks.
    pub fn with_blocks(ctx: &GpuContext, blocks: usize) -> Result<Self, MemoryError> {
        Ok(Self {
            tables: Tables::new(ctx)?,
            max_blocks: blocks.max(1),
        })
    }

    /// Queues the members' epochs, as few launches as they allow (one where they share all but
    /// their keys and the device holds a block of each), on `ctx`'s stream, where the members'
    /// buffers are. Each member ends as its own launch would have left it. Returns the blocks
    /// each member had.
    pub fn run(
        &mut self,
        ctx: &GpuContext,
        members: &mut [EpochMember<'_, '_>],
    ) -> Result<Vec<u32>, MemoryError> {
        let parts = members
            .iter_mut()
            .map(|m| m.prepare(ctx))
            .collect::<Result<Vec<_>, _>>()?;
        // SAFETY: `members` borrows every buffer the parts name until this call returns; work
        // queued on the stream after it runs after the launches.
        unsafe { launch_all(ctx, &mut self.tables, &parts, self.max_blocks) }
    }
}

/// The step table of `plan` from the ring's and the sampler's state, which it advances as the
/// launch will.
fn step_table(
    ring: &mut DeviceReplay,
    plan: &[PlannedStep],
    first_stat: usize,
    words: &mut Vec<u64>,
) {
    let n = ring.n_env as u64;
    let (mut written, mut draws, mut stat) = (ring.written_rows, ring.draws, first_stat as u64);
    for s in plan {
        let row_base = (written % ring.cap_rows as u64) * n;
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
    ring.written_rows = written;
    ring.draws = draws;
}

/// Launches `members`' epochs: members sharing a launch's values in order of first appearance,
/// each such set in launches of at most a block a member of the device, `max_blocks` blocks a
/// member at most. Returns the blocks each member had.
///
/// # Safety
/// Every buffer a member's part names is alive, and nothing but these launches reads or writes
/// it, until the launches' work on `ctx`'s stream is done: each member's owner waits for them (on
/// this stream, or on an event recorded after them) before it uses or frees its buffers again.
unsafe fn launch_all(
    ctx: &GpuContext,
    tables: &mut Tables,
    members: &[PreparedMember],
    max_blocks: usize,
) -> Result<Vec<u32>, MemoryError> {
    // The launches: sets of members sharing every value, cut to what the device holds.
    let mut sets: Vec<Vec<usize>> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        match sets.iter_mut().find(|set| {
            let f = &members[set[0]];
            f.shared == m.shared && set.len() < m.shared.resident
        }) {
            Some(set) => set.push(i),
            None => sets.push(vec![i]),
        }
    }
    // Every member's table and words, in launch order: one copy each.
    let order: Vec<usize> = sets.iter().flatten().copied().collect();
    let table_len: usize = members.iter().map(|m| m.table.len()).sum();
    tables.reserve(ctx, MEMBER_WORDS * members.len(), table_len)?;
    let table_base = ctx.address(&tables.table);
    let (mut table, mut words) = (Vec::with_capacity(table_len), Vec::new());
    for &i in &order {
        let mut w = members[i].words.clone();
        w[MEMBER_TABLE] = table_base + 8 * table.len() as u64;
        words.extend_from_slice(&w);
        table.extend_from_slice(&members[i].table);
    }
    ctx.write(&mut tables.table, &table)?;
    ctx.write(&mut tables.words, &words)?;
    let mut set_words = ctx.address(&tables.words);
    let mut blocks = vec![0u32; members.len()];
    for set in &sets {
        let m = &members[set[0]];
        let sh = &m.shared;
        let per = (sh.resident / set.len())
            .min(sh.slots as usize)
            .min(max_blocks)
            .max(1) as u32;
        for &i in set {
            blocks[i] = per;
        }
        let adam_shared = launch_adam_slice(
            sh.adam_shared,
            sh.params,
            sh.slots,
            sh.grid,
            per,
            sh.shared_limit,
        );
        let grid = Grid {
            blocks: per,
            // Fits in u32: launch_adam_slice checked it against the limit.
            shared_bytes: sh.grid.shared_bytes + adam_slice_bytes(u64::from(adam_shared)) as u32,
            ..sh.grid
        };
        let clustered = use_clusters(ctx, &m.kernels, sh.clusters, grid, set.len())?;
        let l = push_env(ctx.launch(m.kernels.of(clustered)), sh)
            .value(&sh.n_env)
            .value(&sh.cap_rows)
            .value(&sh.n_step)
            .value(&sh.gamma)
            .value(&sh.batch)
            .value(&sh.params)
            .value(&sh.activation)
            .value(&sh.double)
            .value(&sh.loss_kind)
            .value(&sh.delta)
            .value(&sh.clip)
            .value(&sh.beta1)
            .value(&sh.beta2)
            .value(&sh.weight_decay)
            .value(&sh.tau)
            .value(&sh.steps)
            .value(&sh.chunk)
            .value(&sh.slots)
            .value(&adam_shared)
            .value(&set_words);
        // SAFETY: the arguments follow EPOCH_PARAMS (kernels/epoch.cu) in order and size (the
        // window's and the member table's pointers passed as their 8-byte addresses), and each
        // member's words its `Member` struct, in order (`prepare`), the table's address set
        // above; `adam_shared` is 0 or adam_slice_floats for `per` blocks, whose three arrays
        // the launch's shared_bytes include beyond what the rest takes (within what the kernels
        // allow). The caller keeps every buffer they name alive and to these launches alone
        // until they are done. Each member was checked by `prepare` against its kernel: its
        // environments' buffers hold n_env elements (observations n_env * obs_dim), its ring
        // cap_rows * n_env slots whose row bases the table gives modulo that, its batch buffers
        // `batch` rows of obs_dim floats; its layout words describe `params` parameters, which
        // each of online, target, the moments and grads hold (each a DeviceBuffer, a whole
        // allocation: 16-byte aligned, as Adam's float4 loads and stores need); part holds
        // slots * gradient_slot_floats(params), norm_part slots, loss_part 3 * slots, stats
        // rows for every learning step from first_stat; its table and times hold the plan's
        // steps. Members of a launch share every value pushed here (`Shared`), so each block's
        // shared memory is what kernels/epoch.cu lays out for `chunk` rows of its member's
        // network. A member's block touches only its own environments', batch rows' and
        // parameter slices' elements between its barriers, and no other member's buffers; the
        // launch is cooperative with at most `resident` blocks in all, so every block is
        // resident and the grid barriers complete (`epoch_steps`), or each member's blocks are
        // one cluster (`epoch_steps_cluster`: run at once, meeting at the cluster's barrier,
        // writing only their own cluster's shared memory); per <= slots.
        unsafe {
            if clustered {
                l.run_clusters(grid, set.len() as u32)
            } else {
                l.run_cooperative_rows(grid, set.len() as u32)
            }
        }?;
        set_words += (8 * MEMBER_WORDS * set.len()) as u64;
    }
    Ok(blocks)
}

/// Pushes the market and environment arguments EPOCH_PARAMS begins with, in order (the window's
/// buffers as their addresses; the episode starts' key is the member's, in its words).
fn push_env<'l>(l: Launch<'l>, sh: &'l Shared) -> Launch<'l> {
    let (w, sc, sp) = (&sh.window, &sh.env, &sh.step);
    l.value(&w[0])
        .value(&w[1])
        .value(&w[2])
        .value(&w[3])
        .value(&w[4])
        .value(&sc.cols)
        .value(&sc.split_start)
        .value(&sc.split_end)
        .value(&sc.lookback)
        .value(&sc.max_position)
        .value(&sc.upnl_scale)
        .value(&sc.tick_size)
        .value(&sp.multiplier)
        .value(&sp.cost_per_side)
        .value(&sp.slippage_price)
        .value(&sp.episode_steps)
        .value(&sp.reward_scale)
        .value(&sp.risk_penalty)
        .value(&sp.flatten_at_close)
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
    /// Where the blocks are one cluster, only the sends of the new networks: each block waits
    /// for their arrival where it next reads them, so that wait counts in the next step's
    /// collect (its acting pass) or forward.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block's parameter slice (kernels/epoch.cu's split) fits in the shared arrays counted
    /// from the float4 it starts in, and the arrays are whole float4s, no longer than the
    /// largest slice needs.
    #[test]
    fn adam_slice_floats_hold_every_blocks_slice() {
        for (params, slots) in [(21_123u64, 16u32), (5_000, 50), (7, 4), (130, 3)] {
            for blocks in 1..=slots {
                let floats = adam_slice_floats(params, slots, blocks);
                assert_eq!(
                    floats % 4,
                    0,
                    "{params} params, {blocks} blocks: whole float4s"
                );
                let mut widest = 0;
                for g in 0..u64::from(blocks) {
                    let (s, b) = (u64::from(slots), u64::from(blocks));
                    let (p0, p1) = ((g * s / b) * params / s, ((g + 1) * s / b) * params / s);
                    assert!(p1 - (p0 & !3) <= floats, "block {g} of {blocks}");
                    widest = widest.max(p1 - (p0 & !3));
                }
                assert!(
                    floats < widest + 4,
                    "{params} params, {blocks} blocks: no more"
                );
            }
        }
    }
}
