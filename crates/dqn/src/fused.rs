//! The fused CUDA engine (feature `cuda`): the agent's Q-network, learning rule and target update
//! as foxhunt's own kernels (foxhunt-gpu's kernels/dqn.cu) over flat parameter buffers on the
//! device's stream, so that acting, sampling and training never wait for the host.
//!
//! burn-cuda keeps its tensors to itself (no way to hand one to a foreign kernel), so a burn
//! agent on the GPU needs the observations and each sampled batch copied through the host at
//! every step. This engine reads the environment's observation buffer and the device replay's
//! batch buffers where they lie and writes actions where the environment kernel reads them.
//! It computes what [`DqnAgent`](crate::DqnAgent) computes, operation by operation (tested
//! against it); the burn agent stays the owner of checkpoints and evaluation, and the two trade
//! state through [`AgentState`] (once per epoch, not per step).
//!
//! Not implemented here: prioritized replay (its priorities live on the host); the trainer
//! keeps the burn agent for it.

use std::sync::Arc;

use foxhunt_gpu::{DeviceBatch, DeviceBuffer, GpuContext, Grid, Kernel, Module};

use crate::DqnError;
use crate::agent::{AgentState, UpdateStats};
use crate::config::{Activation, AgentConfig, Loss, TargetUpdate};

/// Offsets of a dense layer's weight `[d_in, d_out]` and bias `[d_out]` in the flat vector.
#[derive(Debug, Clone, Copy)]
struct Dense {
    w: u64,
    b: u64,
    d_in: u32,
    d_out: u32,
}

/// Where each parameter lives in the flat vector: the order of [`AgentState`] (hidden layers,
/// then layer norms' scale and shift, the Q or advantage head, the value head).
#[derive(Debug, Clone)]
struct Layout {
    hidden: Vec<Dense>,
    norms: Vec<(u64, u64)>,
    head: Dense,
    value: Option<Dense>,
    total: usize,
}

impl Layout {
    fn of(cfg: &AgentConfig) -> Self {
        let mut at = 0u64;
        let mut width = cfg.obs_dim;
        let mut hidden = Vec::new();
        for &h in &cfg.hidden {
            hidden.push(Dense::at(&mut at, width, h));
            width = h;
        }
        let mut norms = Vec::new();
        if cfg.layer_norm {
            for &h in &cfg.hidden {
                norms.push((at, at + h as u64));
                at += 2 * h as u64;
            }
        }
        let head = Dense::at(&mut at, width, cfg.actions);
        let value = cfg.dueling.then(|| Dense::at(&mut at, width, 1));
        Self {
            hidden,
            norms,
            head,
            value,
            total: at as usize,
        }
    }
}

impl Dense {
    /// A `[d_in, d_out]` layer placed at `*at`, which moves past it.
    fn at(at: &mut u64, d_in: usize, d_out: usize) -> Self {
        let d = Self {
            w: *at,
            b: *at + (d_in * d_out) as u64,
            d_in: d_in as u32,
            d_out: d_out as u32,
        };
        *at = d.b + d_out as u64;
        d
    }
}

/// The network of `cfg` as the device's greedy evaluation reads it (foxhunt-gpu's
/// kernels/eval.cu: a header, then per hidden layer and head the offsets and sizes in the flat
/// parameter vector), and the widest row its layers read or write.
pub fn layout_words(cfg: &AgentConfig) -> (Vec<u64>, usize) {
    let l = Layout::of(cfg);
    let mut w = vec![
        l.hidden.len() as u64,
        cfg.actions as u64,
        cfg.obs_dim as u64,
        u64::from(cfg.layer_norm),
        u64::from(cfg.dueling),
    ];
    for (k, d) in l.hidden.iter().enumerate() {
        let (g, b) = l.norms.get(k).copied().unwrap_or((0, 0));
        w.extend([d.w, d.b, u64::from(d.d_in), u64::from(d.d_out), g, b]);
    }
    for d in std::iter::once(l.head).chain(l.value) {
        w.extend([d.w, d.b, u64::from(d.d_in), u64::from(d.d_out)]);
    }
    let widest = cfg.hidden.iter().copied().max().unwrap_or(0);
    (w, widest.max(cfg.actions + 1))
}

/// Why the device cannot decide exactly as the host for this network, if it cannot: the host's
/// tanh and GELU are library functions the device does not share bit for bit.
pub fn device_eval_unsupported(cfg: &AgentConfig) -> Option<String> {
    (cfg.activation != Activation::Relu).then(|| {
        format!(
            "the {:?} activation (the host's and the device's math differ in the last bit)",
            cfg.activation
        )
    })
}

/// What the target network does after an update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TargetStep {
    /// Stays.
    Keep,
    /// Becomes a copy of the online network (hard updates, every K-th update).
    Copy,
    /// Moves toward the online network by the Polyak blend `tau` (soft updates, every update).
    Blend(f32),
}

/// The numbers that change from one update to the next: the learning rate, burn's Adam bias
/// corrections, and the target update that follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpdateTerms {
    /// Learning rate (the schedule at this update).
    pub lr: f32,
    /// Adam's `eps * sqrt(1 - beta2^t)`.
    pub eps_c2: f32,
    /// Adam's `sqrt(1 - beta2^t) / (1 - beta1^t)`.
    pub cf: f32,
    /// The target update after it.
    pub target: TargetStep,
}

/// The terms of update number `done` (0 for the first) under `cfg`: burn's Adam at step
/// `t = done + 1`, its bias corrections in f32 as burn computes them; the hard target copy after
/// every `every`-th update. Every engine that updates on the device takes them from here.
pub fn update_terms(cfg: &AgentConfig, done: u64) -> UpdateTerms {
    let t = (done + 1) as i32;
    let c2 = (1.0 - cfg.beta2.powi(t)).sqrt();
    let target = match cfg.target_update {
        TargetUpdate::Hard { every } if (done + 1).is_multiple_of(every) => TargetStep::Copy,
        TargetUpdate::Hard { .. } => TargetStep::Keep,
        TargetUpdate::Soft { tau } => TargetStep::Blend(tau),
    };
    UpdateTerms {
        lr: cfg.lr_at(done) as f32,
        eps_c2: cfg.adam_eps * c2,
        cf: c2 / (1.0 - cfg.beta1.powi(t)),
        target,
    }
}

/// The hidden activation as the kernels number it (foxhunt-gpu's kernels/dqn.cuh `act_f`).
pub fn activation_code(a: Activation) -> i32 {
    match a {
        Activation::Relu => 0,
        Activation::Tanh => 1,
        Activation::Gelu => 2,
    }
}

/// The learner's buffers handed to a kernel that updates them in place
/// ([`FusedDqn::lend_for_updates`]).
pub struct LentState<'a> {
    /// The online network, flat in [`AgentState`] order.
    pub online: &'a mut DeviceBuffer<f32>,
    /// The target network.
    pub target: &'a mut DeviceBuffer<f32>,
    /// Adam's first moments.
    pub moment_1: &'a mut DeviceBuffer<f32>,
    /// Adam's second moments.
    pub moment_2: &'a mut DeviceBuffer<f32>,
    /// `[rows, 4]` statistics of the updates (loss, mean Q, mean |TD|, gradient norm).
    pub stats: &'a mut DeviceBuffer<f32>,
    /// The first statistics row the lent updates write.
    pub first_stat: usize,
    /// The network's layout words ([`layout_words`]).
    pub layout: &'a DeviceBuffer<u64>,
}

/// Activations of one forward pass over `rows` inputs (and, for the training pass, the
/// buffers of its backward pass).
struct Pass {
    rows: usize,
    /// Per hidden layer, `[rows, width]`: dense output, activation input, normalized input,
    /// activation output.
    z: Vec<DeviceBuffer<f32>>,
    h: Vec<DeviceBuffer<f32>>,
    xhat: Vec<DeviceBuffer<f32>>,
    /// Per hidden layer, `[rows]`: 1/sigma of the layer norm.
    rstd: Vec<DeviceBuffer<f32>>,
    a: Vec<DeviceBuffer<f32>>,
    /// `[rows, actions]`: advantages (dueling only).
    adv: DeviceBuffer<f32>,
    /// `[rows]`: values (dueling only).
    v: DeviceBuffer<f32>,
    /// `[rows, actions]`.
    q: DeviceBuffer<f32>,
}

impl Pass {
    fn new(ctx: &GpuContext, cfg: &AgentConfig, rows: usize) -> Result<Self, DqnError> {
        let per_layer = || -> Result<Vec<DeviceBuffer<f32>>, DqnError> {
            Ok(cfg
                .hidden
                .iter()
                .map(|&h| ctx.alloc::<f32>(rows * h))
                .collect::<Result<_, _>>()?)
        };
        Ok(Self {
            rows,
            z: per_layer()?,
            h: per_layer()?,
            xhat: per_layer()?,
            rstd: cfg
                .hidden
                .iter()
                .map(|_| ctx.alloc::<f32>(rows))
                .collect::<Result<_, _>>()?,
            a: per_layer()?,
            adv: ctx.alloc(rows * cfg.actions)?,
            v: ctx.alloc(rows)?,
            q: ctx.alloc(rows * cfg.actions)?,
        })
    }
}

/// Gradient buffers of the training pass's backward.
struct Backward {
    /// `[batch, actions]`: dLoss/dQ; and for dueling, dLoss/dA.
    dq: DeviceBuffer<f32>,
    dadv: DeviceBuffer<f32>,
    /// `[batch]`.
    dv: DeviceBuffer<f32>,
    /// Per hidden layer `[batch, width]`: gradient at the activation output, at the norm's
    /// output, at the dense output.
    da: Vec<DeviceBuffer<f32>>,
    dh: Vec<DeviceBuffer<f32>>,
    dz: Vec<DeviceBuffer<f32>>,
    /// `[batch, 3]`: per-row loss, Q of the taken action, |TD|.
    terms: DeviceBuffer<f32>,
}

/// The engine's kernels.
struct Kernels {
    dense_fwd: Kernel,
    hidden_post_fwd: Kernel,
    dueling_fwd: Kernel,
    select_actions: Kernel,
    td_loss: Kernel,
    batch_stats: Kernel,
    dueling_bwd: Kernel,
    dense_bwd_params: Kernel,
    dense_bwd_input: Kernel,
    hidden_post_bwd: Kernel,
    norm_bwd_params: Kernel,
    grad_norm: Kernel,
    adam_step: Kernel,
    polyak: Kernel,
}

impl Kernels {
    fn load(ctx: &GpuContext) -> Result<Self, DqnError> {
        let f = |name: &'static str| ctx.kernel(Module::Dqn, name);
        Ok(Self {
            dense_fwd: f("dense_fwd")?,
            hidden_post_fwd: f("hidden_post_fwd")?,
            dueling_fwd: f("dueling_fwd")?,
            select_actions: f("select_actions")?,
            td_loss: f("td_loss")?,
            batch_stats: f("batch_stats")?,
            dueling_bwd: f("dueling_bwd")?,
            dense_bwd_params: f("dense_bwd_params")?,
            dense_bwd_input: f("dense_bwd_input")?,
            hidden_post_bwd: f("hidden_post_bwd")?,
            norm_bwd_params: f("norm_bwd_params")?,
            grad_norm: f("grad_norm")?,
            adam_step: f("adam_step")?,
            polyak: f("polyak")?,
        })
    }
}

/// A 1-D launch of at least `threads` threads in blocks of `block`.
fn grid(threads: usize, block: u32) -> Grid {
    Grid::cover(threads, block)
}

/// Which parameters a forward pass reads.
#[derive(Clone, Copy)]
enum Net {
    Online,
    Target,
}

/// Which forward pass.
#[derive(Clone, Copy)]
enum Which {
    Train,
    NextOnline,
    NextTarget,
    Act,
}

/// The DQN agent's training on the GPU without host round trips: see the module docs.
pub struct FusedDqn {
    ctx: Arc<GpuContext>,
    cfg: AgentConfig,
    layout: Layout,
    k: Kernels,
    online: DeviceBuffer<f32>,
    target: DeviceBuffer<f32>,
    grads: DeviceBuffer<f32>,
    m1: DeviceBuffer<f32>,
    m2: DeviceBuffer<f32>,
    /// `[1]`: the latest global gradient norm (read by the Adam kernel for clipping).
    norm: DeviceBuffer<f32>,
    /// The network's layout words ([`layout_words`]), for kernels that walk the network.
    layout_words: DeviceBuffer<u64>,
    updates: u64,
    train: Pass,
    next_online: Pass,
    next_target: Pass,
    act_pass: Option<Pass>,
    bwd: Backward,
    /// `[capacity, 4]`: loss, mean Q, mean |TD|, gradient norm of each update since the last
    /// [`FusedDqn::take_stats`].
    stats: DeviceBuffer<f32>,
    stat_rows: usize,
    stat_capacity: usize,
}

impl FusedDqn {
    /// An engine for `cfg` on `ctx`'s device starting from `state` (one upload), able to hold
    /// the statistics of `stat_capacity` updates between two [`FusedDqn::take_stats`].
    pub fn new(
        ctx: &Arc<GpuContext>,
        cfg: &AgentConfig,
        state: &AgentState,
        stat_capacity: usize,
    ) -> Result<Self, DqnError> {
        cfg.validate()?;
        if cfg.prioritized.is_some() {
            return Err(DqnError::Engine(
                "prioritized replay is not implemented by the fused engine".into(),
            ));
        }
        let layout = Layout::of(cfg);
        let n = layout.total;
        let b = cfg.batch_size;
        let widths = || -> Result<Vec<DeviceBuffer<f32>>, DqnError> {
            Ok(cfg
                .hidden
                .iter()
                .map(|&h| ctx.alloc::<f32>(b * h))
                .collect::<Result<_, _>>()?)
        };
        let mut engine = Self {
            k: Kernels::load(ctx)?,
            online: ctx.alloc(n)?,
            target: ctx.alloc(n)?,
            grads: ctx.alloc(n)?,
            m1: ctx.alloc(n)?,
            m2: ctx.alloc(n)?,
            norm: ctx.alloc(1)?,
            layout_words: ctx.upload(&layout_words(cfg).0)?,
            updates: 0,
            train: Pass::new(ctx, cfg, b)?,
            next_online: Pass::new(ctx, cfg, b)?,
            next_target: Pass::new(ctx, cfg, b)?,
            act_pass: None,
            bwd: Backward {
                dq: ctx.alloc(b * cfg.actions)?,
                dadv: ctx.alloc(b * cfg.actions)?,
                dv: ctx.alloc(b)?,
                da: widths()?,
                dh: widths()?,
                dz: widths()?,
                terms: ctx.alloc(b * 3)?,
            },
            stats: ctx.alloc(stat_capacity.max(1) * 4)?,
            stat_rows: 0,
            stat_capacity: stat_capacity.max(1),
            ctx: ctx.clone(),
            cfg: cfg.clone(),
            layout,
        };
        engine.load(state)?;
        Ok(engine)
    }

    /// Number of parameters of the network.
    pub fn num_params(&self) -> usize {
        self.layout.total
    }
    /// Updates done.
    pub fn updates(&self) -> u64 {
        self.updates
    }
    /// The device.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }
    /// The online network's parameters on the device, flat in [`AgentState`] order.
    pub fn online_params(&self) -> &DeviceBuffer<f32> {
        &self.online
    }

    /// Takes `state` (uploads networks and Adam's moments).
    pub fn load(&mut self, state: &AgentState) -> Result<(), DqnError> {
        let n = self.layout.total;
        for (what, v) in [
            ("online", &state.online),
            ("target", &state.target),
            ("moment_1", &state.moment_1),
            ("moment_2", &state.moment_2),
        ] {
            if v.len() != n {
                return Err(DqnError::Engine(format!(
                    "{what}: {} values for a network of {n} parameters",
                    v.len()
                )));
            }
        }
        let c = &self.ctx;
        c.write(&mut self.online, &state.online)?;
        c.write(&mut self.target, &state.target)?;
        c.write(&mut self.m1, &state.moment_1)?;
        c.write(&mut self.m2, &state.moment_2)?;
        self.updates = state.updates;
        Ok(())
    }

    /// The learning state read back (waits for the device), for the burn agent's checkpoints
    /// and evaluation.
    pub fn state(&self) -> Result<AgentState, DqnError> {
        let c = &self.ctx;
        Ok(AgentState {
            online: c.download(&self.online)?,
            target: c.download(&self.target)?,
            moment_1: c.download(&self.m1)?,
            moment_2: c.download(&self.m2)?,
            updates: self.updates,
        })
    }

    fn act_code(&self) -> i32 {
        activation_code(self.cfg.activation)
    }

    /// The network's layout words on the device ([`layout_words`]).
    pub fn layout_words(&self) -> &DeviceBuffer<u64> {
        &self.layout_words
    }

    /// Hands the learning state to a kernel that makes the next `updates` updates itself,
    /// exactly as [`FusedDqn::learn`] and [`FusedDqn::sync_target`] would (with the terms of
    /// [`update_terms`] from update [`FusedDqn::updates`] on), writing their statistics from
    /// [`LentState::first_stat`]. Counts them as made: the caller queues that kernel before the
    /// engine's next use.
    pub fn lend_for_updates(&mut self, updates: usize) -> Result<LentState<'_>, DqnError> {
        if self.stat_rows + updates > self.stat_capacity {
            return Err(DqnError::Engine(format!(
                "statistics of {} updates do not fit beside {} not taken (room for {})",
                updates, self.stat_rows, self.stat_capacity
            )));
        }
        let first_stat = self.stat_rows;
        self.stat_rows += updates;
        self.updates += updates as u64;
        Ok(LentState {
            online: &mut self.online,
            target: &mut self.target,
            moment_1: &mut self.m1,
            moment_2: &mut self.m2,
            stats: &mut self.stats,
            first_stat,
            layout: &self.layout_words,
        })
    }

    /// Forward pass `which` of `net` over `x` (`[pass rows, obs_dim]`); the result lands in the
    /// pass's `q`.
    fn forward(&mut self, net: Net, which: Which, x: &DeviceBuffer<f32>) -> Result<(), DqnError> {
        let act = self.act_code();
        let use_norm = i32::from(self.cfg.layer_norm);
        let (ctx, k, layout) = (&self.ctx, &self.k, &self.layout);
        let p = match net {
            Net::Online => &self.online,
            Net::Target => &self.target,
        };
        let pass = match which {
            Which::Train => &mut self.train,
            Which::NextOnline => &mut self.next_online,
            Which::NextTarget => &mut self.next_target,
            Which::Act => self.act_pass.as_mut().expect("act pass sized before use"),
        };
        let rows = pass.rows as u32;
        let n_rows = pass.rows;
        for (l, d) in layout.hidden.iter().enumerate() {
            let (done, rest) = pass.a.split_at_mut(l);
            let input = if l == 0 { x } else { &done[l - 1] };
            let launch = ctx
                .launch(&k.dense_fwd)
                .input(input)
                .input(p)
                .value(&d.w)
                .value(&d.b)
                .output(&mut pass.z[l])
                .value(&rows)
                .value(&d.d_in)
                .value(&d.d_out);
            // SAFETY: dense_fwd(x, p, w_off, b_off, y, rows, d_in, d_out): x holds rows * d_in
            // floats (the observations or the previous layer's output), p the whole parameter
            // vector the layout's offsets index, z rows * d_out; one thread per output.
            unsafe { launch.run(grid(n_rows * d.d_out as usize, 256)) }?;
            let (g, bt) = layout.norms.get(l).copied().unwrap_or((0, 0));
            let launch = ctx
                .launch(&k.hidden_post_fwd)
                .input(&pass.z[l])
                .input(p)
                .value(&g)
                .value(&bt)
                .output(&mut pass.h[l])
                .output(&mut pass.xhat[l])
                .output(&mut pass.rstd[l])
                .output(&mut rest[0])
                .value(&rows)
                .value(&d.d_out)
                .value(&use_norm)
                .value(&act);
            // SAFETY: hidden_post_fwd's signature; z, h, xhat, a hold rows * width floats,
            // rstd rows; the norm offsets are read only when use_norm is set, and then index
            // width scales and shifts; one thread per row.
            unsafe { launch.run(grid(n_rows, 128)) }?;
        }
        let last = match layout.hidden.len() {
            0 => x,
            n => &pass.a[n - 1],
        };
        let head = layout.head;
        let out = if layout.value.is_some() {
            &mut pass.adv
        } else {
            &mut pass.q
        };
        let launch = ctx
            .launch(&k.dense_fwd)
            .input(last)
            .input(p)
            .value(&head.w)
            .value(&head.b)
            .output(out)
            .value(&rows)
            .value(&head.d_in)
            .value(&head.d_out);
        // SAFETY: as for the hidden layers: the head reads rows * d_in floats and writes
        // rows * actions.
        unsafe { launch.run(grid(n_rows * head.d_out as usize, 256)) }?;
        if let Some(v) = layout.value {
            let launch = ctx
                .launch(&k.dense_fwd)
                .input(last)
                .input(p)
                .value(&v.w)
                .value(&v.b)
                .output(&mut pass.v)
                .value(&rows)
                .value(&v.d_in)
                .value(&v.d_out);
            // SAFETY: the value head writes rows * 1 floats.
            unsafe { launch.run(grid(n_rows, 256)) }?;
            let actions = head.d_out;
            let launch = ctx
                .launch(&k.dueling_fwd)
                .input(&pass.v)
                .input(&pass.adv)
                .output(&mut pass.q)
                .value(&rows)
                .value(&actions);
            // SAFETY: dueling_fwd(v, adv, q, rows, actions): v rows, adv and q rows * actions.
            unsafe { launch.run(grid(n_rows, 128)) }?;
        }
        Ok(())
    }

    fn size_act_pass(&mut self, n: usize) -> Result<(), DqnError> {
        if self.act_pass.as_ref().is_none_or(|p| p.rows != n) {
            self.act_pass = Some(Pass::new(&self.ctx, &self.cfg, n)?);
        }
        Ok(())
    }

    /// Epsilon-greedy actions of `n` environments from their observations `obs`
    /// (`[n, obs_dim]`, on the device) into `actions` (`[n]`): greedy on the online network,
    /// uniform with probability `epsilon` (see [`crate::explore`]: Philox keyed by `seed`,
    /// counter `(env, counter)`). Asynchronous.
    pub fn act(
        &mut self,
        obs: &DeviceBuffer<f32>,
        n: usize,
        epsilon: f32,
        seed: u64,
        counter: u64,
        actions: &mut DeviceBuffer<u8>,
    ) -> Result<(), DqnError> {
        if obs.len() != n * self.cfg.obs_dim || actions.len() != n {
            return Err(DqnError::Engine(format!(
                "{} observation floats and {} action slots for {n} environments of {}",
                obs.len(),
                actions.len(),
                self.cfg.obs_dim
            )));
        }
        self.size_act_pass(n)?;
        self.forward(Net::Online, Which::Act, obs)?;
        let q = &self.act_pass.as_ref().expect("sized").q;
        let (rows, a) = (n as u32, self.cfg.actions as u32);
        let launch = self
            .ctx
            .launch(&self.k.select_actions)
            .input(q)
            .value(&rows)
            .value(&a)
            .value(&epsilon)
            .value(&seed)
            .value(&counter)
            .output(actions);
        // SAFETY: select_actions(q, rows, actions, epsilon, seed, step, out): q holds
        // n * actions floats, out n bytes; one thread per environment.
        unsafe { launch.run(grid(n, 128)) }?;
        Ok(())
    }

    /// Q-values of the online network for `obs` (`[n, obs_dim]`) read back (waits for the
    /// device; for tests and checks).
    pub fn q_values(&mut self, obs: &DeviceBuffer<f32>, n: usize) -> Result<Vec<f32>, DqnError> {
        self.size_act_pass(n)?;
        self.forward(Net::Online, Which::Act, obs)?;
        let q = &self.act_pass.as_ref().expect("sized").q;
        Ok(self.ctx.download(q)?)
    }

    /// One DQN update on a batch sampled on the device, as [`crate::DqnAgent::learn`]; its
    /// statistics stay on the device until [`FusedDqn::take_stats`]. Asynchronous.
    pub fn learn(&mut self, batch: &DeviceBatch) -> Result<(), DqnError> {
        let bs = self.cfg.batch_size;
        if batch.batch() != bs || batch.obs_dim() != self.cfg.obs_dim {
            return Err(DqnError::Engine(format!(
                "a batch of {} observations of {} for batch size {bs} and {}",
                batch.batch(),
                batch.obs_dim(),
                self.cfg.obs_dim
            )));
        }
        if self.stat_rows == self.stat_capacity {
            return Err(DqnError::Engine(format!(
                "statistics of {} updates not taken",
                self.stat_capacity
            )));
        }
        self.forward(Net::Online, Which::Train, &batch.obs)?;
        self.forward(Net::Online, Which::NextOnline, &batch.next_obs)?;
        self.forward(Net::Target, Which::NextTarget, &batch.next_obs)?;
        let act = self.act_code();
        let use_norm = i32::from(self.cfg.layer_norm);
        let (ctx, k, layout) = (&self.ctx, &self.k, &self.layout);
        let rows = bs as u32;
        let actions = self.cfg.actions as u32;
        let double = i32::from(self.cfg.double);
        let (loss_kind, delta) = match self.cfg.loss {
            Loss::Huber { delta } => (0i32, delta),
            Loss::Mse => (1, 0.0f32),
        };
        let bwd = &mut self.bwd;
        let launch = ctx
            .launch(&k.td_loss)
            .input(&self.train.q)
            .input(&batch.actions)
            .input(&self.next_online.q)
            .input(&self.next_target.q)
            .input(&batch.returns)
            .input(&batch.discounts)
            .input(&batch.weights)
            .value(&rows)
            .value(&actions)
            .value(&double)
            .value(&loss_kind)
            .value(&delta)
            .output(&mut bwd.dq)
            .output(&mut bwd.terms);
        // SAFETY: td_loss's signature; q buffers hold batch * actions floats, the batch
        // vectors batch entries (actions < actions: written by the environment kernel), dq
        // batch * actions, terms batch * 3; one thread per row.
        unsafe { launch.run(grid(bs, 128)) }?;
        let at = (self.stat_rows * 4) as u64;
        let launch = ctx
            .launch(&k.batch_stats)
            .input(&bwd.terms)
            .value(&rows)
            .output(&mut self.stats)
            .value(&at);
        // SAFETY: batch_stats(terms, rows, stats, at): one block of 256 threads (its shared
        // arrays' size); stats holds stat_capacity * 4 floats and at + 3 is below that.
        unsafe { launch.run(Grid::block(256)) }?;

        let train = &self.train;
        let grads = &mut self.grads;
        let p = &self.online;
        // Head(s): from dQ to the last hidden layer's output gradient.
        let n_hidden = layout.hidden.len();
        if layout.value.is_some() {
            let launch = ctx
                .launch(&k.dueling_bwd)
                .input(&bwd.dq)
                .output(&mut bwd.dv)
                .output(&mut bwd.dadv)
                .value(&rows)
                .value(&actions);
            // SAFETY: dueling_bwd(dq, dv, dadv, rows, actions): sizes batch * actions and batch.
            unsafe { launch.run(grid(bs, 128)) }?;
        }
        let head_dy = if layout.value.is_some() {
            &bwd.dadv
        } else {
            &bwd.dq
        };
        let last_x = match n_hidden {
            0 => &batch.obs,
            n => &train.a[n - 1],
        };
        let heads =
            std::iter::once((layout.head, head_dy)).chain(layout.value.map(|v| (v, &bwd.dv)));
        for (i, (d, dy)) in heads.enumerate() {
            let launch = ctx
                .launch(&k.dense_bwd_params)
                .input(last_x)
                .input(dy)
                .output(&mut *grads)
                .value(&d.w)
                .value(&d.b)
                .value(&rows)
                .value(&d.d_in)
                .value(&d.d_out);
            // SAFETY: dense_bwd_params(x, dy, grads, w_off, b_off, rows, d_in, d_out): x holds
            // batch * d_in floats, dy batch * d_out, grads the whole vector the offsets index;
            // one thread per weight and bias.
            unsafe { launch.run(grid((d.d_in as usize + 1) * d.d_out as usize, 256)) }?;
            if n_hidden > 0 {
                let acc = i32::from(i > 0);
                let launch = ctx
                    .launch(&k.dense_bwd_input)
                    .input(dy)
                    .input(p)
                    .value(&d.w)
                    .output(&mut bwd.da[n_hidden - 1])
                    .value(&rows)
                    .value(&d.d_in)
                    .value(&d.d_out)
                    .value(&acc);
                // SAFETY: dense_bwd_input(dy, p, w_off, dx, rows, d_in, d_out, acc): dx holds
                // batch * d_in floats (the last hidden layer's width); one thread per entry.
                unsafe { launch.run(grid(bs * d.d_in as usize, 256)) }?;
            }
        }
        for l in (0..n_hidden).rev() {
            let d = layout.hidden[l];
            let (g, bt) = layout.norms.get(l).copied().unwrap_or((0, 0));
            let launch = ctx
                .launch(&k.hidden_post_bwd)
                .input(&bwd.da[l])
                .input(&train.h[l])
                .input(&train.xhat[l])
                .input(&train.rstd[l])
                .input(p)
                .value(&g)
                .output(&mut bwd.dh[l])
                .output(&mut bwd.dz[l])
                .value(&rows)
                .value(&d.d_out)
                .value(&use_norm)
                .value(&act);
            // SAFETY: hidden_post_bwd's signature; every per-layer buffer holds
            // batch * width floats, rstd batch; one thread per row.
            unsafe { launch.run(grid(bs, 128)) }?;
            if use_norm != 0 {
                let launch = ctx
                    .launch(&k.norm_bwd_params)
                    .input(&bwd.dh[l])
                    .input(&train.xhat[l])
                    .output(&mut *grads)
                    .value(&g)
                    .value(&bt)
                    .value(&rows)
                    .value(&d.d_out);
                // SAFETY: norm_bwd_params(dh, xhat, grads, g_off, b_off, rows, width): one
                // thread per feature; the offsets index width scales and shifts.
                unsafe { launch.run(grid(d.d_out as usize, 128)) }?;
            }
            let x = if l == 0 { &batch.obs } else { &train.a[l - 1] };
            let launch = ctx
                .launch(&k.dense_bwd_params)
                .input(x)
                .input(&bwd.dz[l])
                .output(&mut *grads)
                .value(&d.w)
                .value(&d.b)
                .value(&rows)
                .value(&d.d_in)
                .value(&d.d_out);
            // SAFETY: as for the heads.
            unsafe { launch.run(grid((d.d_in as usize + 1) * d.d_out as usize, 256)) }?;
            if l > 0 {
                let zero = 0i32;
                let launch = ctx
                    .launch(&k.dense_bwd_input)
                    .input(&bwd.dz[l])
                    .input(p)
                    .value(&d.w)
                    .output(&mut bwd.da[l - 1])
                    .value(&rows)
                    .value(&d.d_in)
                    .value(&d.d_out)
                    .value(&zero);
                // SAFETY: as for the heads: dx is the previous layer's batch * d_in gradient.
                unsafe { launch.run(grid(bs * d.d_in as usize, 256)) }?;
            }
        }
        let n = self.layout.total as u64;
        let at_norm = at + 3;
        let launch = ctx
            .launch(&k.grad_norm)
            .input(&*grads)
            .value(&n)
            .output(&mut self.norm)
            .output(&mut self.stats)
            .value(&at_norm);
        // SAFETY: grad_norm(g, n, norm, stats, at): one block of 1024 threads (its shared
        // array's size); grads holds n floats, norm 1, stats beyond at.
        unsafe { launch.run(Grid::block(1024)) }?;

        let c = &self.cfg;
        let UpdateTerms { lr, eps_c2, cf, .. } = update_terms(c, self.updates);
        let clip = c.grad_clip.unwrap_or(0.0);
        let launch = ctx
            .launch(&k.adam_step)
            .output(&mut self.online)
            .input(&*grads)
            .output(&mut self.m1)
            .output(&mut self.m2)
            .value(&n)
            .input(&self.norm)
            .value(&clip)
            .value(&lr)
            .value(&c.beta1)
            .value(&c.beta2)
            .value(&eps_c2)
            .value(&cf)
            .value(&c.weight_decay);
        // SAFETY: adam_step's signature; p, g, m, v hold n floats, norm 1; one thread per
        // parameter.
        unsafe { launch.run(grid(n as usize, 256)) }?;
        self.updates += 1;
        self.stat_rows += 1;
        Ok(())
    }

    /// The target update due after the latest [`FusedDqn::learn`] (hard copy every K updates or
    /// Polyak blend), as [`crate::DqnAgent::sync_target`]. Asynchronous.
    pub fn sync_target(&mut self) -> Result<(), DqnError> {
        let due = update_terms(&self.cfg, self.updates.saturating_sub(1)).target;
        match due {
            TargetStep::Keep => {}
            TargetStep::Copy => self.ctx.copy(&self.online, &mut self.target)?,
            TargetStep::Blend(tau) => {
                let n = self.layout.total as u64;
                let launch = self
                    .ctx
                    .launch(&self.k.polyak)
                    .input(&self.online)
                    .output(&mut self.target)
                    .value(&n)
                    .value(&tau);
                // SAFETY: polyak(online, target, n, tau): both hold n floats.
                unsafe { launch.run(grid(n as usize, 256)) }?;
            }
        }
        Ok(())
    }

    /// The gradient of the latest update's loss with respect to every parameter, before
    /// clipping, in [`AgentState`] order (waits for the device; for tests and checks).
    pub fn gradients(&self) -> Result<Vec<f32>, DqnError> {
        Ok(self.ctx.download(&self.grads)?)
    }

    /// The statistics of the updates since the last call, one [`UpdateStats`] each: the one
    /// read of them (waits for the device).
    pub fn take_stats(&mut self) -> Result<Vec<UpdateStats>, DqnError> {
        let rows = self
            .ctx
            .download_prefix(&self.stats, self.stat_rows * 4)?
            .chunks_exact(4)
            .map(|c| UpdateStats {
                loss: c[0],
                mean_q: c[1],
                td_abs_mean: c[2],
                grad_norm: c[3],
            })
            .collect();
        self.stat_rows = 0;
        Ok(rows)
    }
}
