//! The fused CUDA engine (feature `cuda`): the agent's Q-network, learning rule and target update
//! as foxhunt's own kernels (kernels/dqn.cu) over flat parameter buffers on foxhunt-memory's
//! stream, so that acting, sampling and training never wait for the host.
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

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use foxhunt_memory::{DeviceBatch, GpuContext};

use crate::DqnError;
use crate::agent::AgentState;
use crate::config::{Activation, DqnConfig, Loss, TargetUpdate};

/// Kernel sources of the engine's NVRTC module.
const SOURCE: &str = concat!(
    include_str!("../../../kernels/philox.cuh"),
    include_str!("../../../kernels/dqn.cu")
);

fn dev(e: impl std::fmt::Display) -> DqnError {
    DqnError::Device(e.to_string())
}

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
    fn of(cfg: &DqnConfig) -> Self {
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

/// Activations of one forward pass over `rows` inputs (and, for the training pass, the
/// buffers of its backward pass).
struct Pass {
    rows: usize,
    /// Per hidden layer, `[rows, width]`: dense output, activation input, normalized input,
    /// activation output.
    z: Vec<CudaSlice<f32>>,
    h: Vec<CudaSlice<f32>>,
    xhat: Vec<CudaSlice<f32>>,
    /// Per hidden layer, `[rows]`: 1/sigma of the layer norm.
    rstd: Vec<CudaSlice<f32>>,
    a: Vec<CudaSlice<f32>>,
    /// `[rows, actions]`: advantages (dueling only).
    adv: CudaSlice<f32>,
    /// `[rows]`: values (dueling only).
    v: CudaSlice<f32>,
    /// `[rows, actions]`.
    q: CudaSlice<f32>,
}

impl Pass {
    fn new(ctx: &GpuContext, cfg: &DqnConfig, rows: usize) -> Result<Self, DqnError> {
        let s = ctx.stream();
        let per_layer = |w: usize| -> Result<Vec<CudaSlice<f32>>, DqnError> {
            cfg.hidden
                .iter()
                .map(|&h| s.alloc_zeros::<f32>(rows * h * w).map_err(dev))
                .collect()
        };
        Ok(Self {
            rows,
            z: per_layer(1)?,
            h: per_layer(1)?,
            xhat: per_layer(1)?,
            rstd: cfg
                .hidden
                .iter()
                .map(|_| s.alloc_zeros::<f32>(rows).map_err(dev))
                .collect::<Result<_, _>>()?,
            a: per_layer(1)?,
            adv: s.alloc_zeros(rows * cfg.actions).map_err(dev)?,
            v: s.alloc_zeros(rows).map_err(dev)?,
            q: s.alloc_zeros(rows * cfg.actions).map_err(dev)?,
        })
    }
}

/// Gradient buffers of the training pass's backward.
struct Backward {
    /// `[batch, actions]`: dLoss/dQ; and for dueling, dLoss/dA.
    dq: CudaSlice<f32>,
    dadv: CudaSlice<f32>,
    /// `[batch]`.
    dv: CudaSlice<f32>,
    /// Per hidden layer `[batch, width]`: gradient at the activation output, at the norm's
    /// output, at the dense output.
    da: Vec<CudaSlice<f32>>,
    dh: Vec<CudaSlice<f32>>,
    dz: Vec<CudaSlice<f32>>,
    /// `[batch, 3]`: per-row loss, Q of the taken action, |TD|.
    terms: CudaSlice<f32>,
}

/// The engine's kernels.
struct Kernels {
    dense_fwd: CudaFunction,
    hidden_post_fwd: CudaFunction,
    dueling_fwd: CudaFunction,
    select_actions: CudaFunction,
    td_loss: CudaFunction,
    batch_stats: CudaFunction,
    dueling_bwd: CudaFunction,
    dense_bwd_params: CudaFunction,
    dense_bwd_input: CudaFunction,
    hidden_post_bwd: CudaFunction,
    norm_bwd_params: CudaFunction,
    grad_norm: CudaFunction,
    adam_step: CudaFunction,
    polyak: CudaFunction,
}

impl Kernels {
    fn load(ctx: &GpuContext) -> Result<Self, DqnError> {
        let f = |name: &str| ctx.function("dqn", SOURCE, name).map_err(dev);
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

/// A 1-D launch of `threads` threads in blocks of `block`.
fn grid(threads: usize, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (threads as u64).div_ceil(u64::from(block)).max(1) as u32,
            1,
            1,
        ),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
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
    cfg: DqnConfig,
    layout: Layout,
    k: Kernels,
    online: CudaSlice<f32>,
    target: CudaSlice<f32>,
    grads: CudaSlice<f32>,
    m1: CudaSlice<f32>,
    m2: CudaSlice<f32>,
    /// `[1]`: the latest global gradient norm (read by the Adam kernel for clipping).
    norm: CudaSlice<f32>,
    updates: u64,
    train: Pass,
    next_online: Pass,
    next_target: Pass,
    act_pass: Option<Pass>,
    bwd: Backward,
    /// `[capacity, 4]`: loss, mean Q, mean |TD|, gradient norm of each update since the last
    /// [`FusedDqn::take_stats`].
    stats: CudaSlice<f32>,
    stat_rows: usize,
    stat_capacity: usize,
}

impl FusedDqn {
    /// An engine for `cfg` on `ctx`'s device starting from `state` (one upload), able to hold
    /// the statistics of `stat_capacity` updates between two [`FusedDqn::take_stats`].
    pub fn new(
        ctx: &Arc<GpuContext>,
        cfg: &DqnConfig,
        state: &AgentState,
        stat_capacity: usize,
    ) -> Result<Self, DqnError> {
        cfg.validate()?;
        if cfg.prioritized.is_some() {
            return Err(DqnError::Device(
                "prioritized replay is not implemented by the fused engine".into(),
            ));
        }
        let layout = Layout::of(cfg);
        let s = ctx.stream();
        let n = layout.total;
        let b = cfg.batch_size;
        let widths = || {
            cfg.hidden
                .iter()
                .map(|&h| s.alloc_zeros::<f32>(b * h).map_err(dev))
        };
        let mut engine = Self {
            k: Kernels::load(ctx)?,
            online: s.alloc_zeros(n).map_err(dev)?,
            target: s.alloc_zeros(n).map_err(dev)?,
            grads: s.alloc_zeros(n).map_err(dev)?,
            m1: s.alloc_zeros(n).map_err(dev)?,
            m2: s.alloc_zeros(n).map_err(dev)?,
            norm: s.alloc_zeros(1).map_err(dev)?,
            updates: 0,
            train: Pass::new(ctx, cfg, b)?,
            next_online: Pass::new(ctx, cfg, b)?,
            next_target: Pass::new(ctx, cfg, b)?,
            act_pass: None,
            bwd: Backward {
                dq: s.alloc_zeros(b * cfg.actions).map_err(dev)?,
                dadv: s.alloc_zeros(b * cfg.actions).map_err(dev)?,
                dv: s.alloc_zeros(b).map_err(dev)?,
                da: widths().collect::<Result<_, _>>()?,
                dh: widths().collect::<Result<_, _>>()?,
                dz: widths().collect::<Result<_, _>>()?,
                terms: s.alloc_zeros(b * 3).map_err(dev)?,
            },
            stats: s.alloc_zeros(stat_capacity.max(1) * 4).map_err(dev)?,
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
                return Err(DqnError::Device(format!(
                    "{what}: {} values for a network of {n} parameters",
                    v.len()
                )));
            }
        }
        let s = self.ctx.stream();
        s.memcpy_htod(&state.online, &mut self.online)
            .map_err(dev)?;
        s.memcpy_htod(&state.target, &mut self.target)
            .map_err(dev)?;
        s.memcpy_htod(&state.moment_1, &mut self.m1).map_err(dev)?;
        s.memcpy_htod(&state.moment_2, &mut self.m2).map_err(dev)?;
        self.updates = state.updates;
        Ok(())
    }

    /// The learning state read back (synchronizes), for the burn agent's checkpoints and
    /// evaluation.
    pub fn state(&self) -> Result<AgentState, DqnError> {
        let s = self.ctx.stream();
        Ok(AgentState {
            online: s.clone_dtoh(&self.online).map_err(dev)?,
            target: s.clone_dtoh(&self.target).map_err(dev)?,
            moment_1: s.clone_dtoh(&self.m1).map_err(dev)?,
            moment_2: s.clone_dtoh(&self.m2).map_err(dev)?,
            updates: self.updates,
        })
    }

    fn act_code(&self) -> i32 {
        match self.cfg.activation {
            Activation::Relu => 0,
            Activation::Tanh => 1,
            Activation::Gelu => 2,
        }
    }

    /// Forward pass `which` of `net` over `x` (`[pass rows, obs_dim]`); the result lands in the
    /// pass's `q`.
    fn forward(&mut self, net: Net, which: Which, x: &CudaSlice<f32>) -> Result<(), DqnError> {
        let stream = self.ctx.stream().clone();
        let act = self.act_code();
        let use_norm = i32::from(self.cfg.layer_norm);
        let (k, layout) = (&self.k, &self.layout);
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
        for (l, d) in layout.hidden.iter().enumerate() {
            let input = if l == 0 { x } else { &pass.a[l - 1] };
            let mut b = stream.launch_builder(&k.dense_fwd);
            b.arg(input).arg(p).arg(&d.w).arg(&d.b).arg(&mut pass.z[l]);
            b.arg(&rows).arg(&d.d_in).arg(&d.d_out);
            // SAFETY: dense_fwd(x, p, w_off, b_off, y, rows, d_in, d_out): x holds rows * d_in
            // floats (the observations or the previous layer's output), p the whole parameter
            // vector the layout's offsets index, z rows * d_out; one thread per output.
            unsafe { b.launch(grid(pass.rows * d.d_out as usize, 256)) }.map_err(dev)?;
            let (g, bt) = layout.norms.get(l).copied().unwrap_or((0, 0));
            let mut b = stream.launch_builder(&k.hidden_post_fwd);
            b.arg(&pass.z[l]).arg(p).arg(&g).arg(&bt);
            b.arg(&mut pass.h[l])
                .arg(&mut pass.xhat[l])
                .arg(&mut pass.rstd[l])
                .arg(&mut pass.a[l]);
            b.arg(&rows).arg(&d.d_out).arg(&use_norm).arg(&act);
            // SAFETY: hidden_post_fwd's signature; z, h, xhat, a hold rows * width floats,
            // rstd rows; the norm offsets are read only when use_norm is set, and then index
            // width scales and shifts; one thread per row.
            unsafe { b.launch(grid(pass.rows, 128)) }.map_err(dev)?;
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
        let mut b = stream.launch_builder(&k.dense_fwd);
        b.arg(last).arg(p).arg(&head.w).arg(&head.b).arg(out);
        b.arg(&rows).arg(&head.d_in).arg(&head.d_out);
        // SAFETY: as for the hidden layers: the head reads rows * d_in floats and writes
        // rows * actions.
        unsafe { b.launch(grid(pass.rows * head.d_out as usize, 256)) }.map_err(dev)?;
        if let Some(v) = layout.value {
            let mut b = stream.launch_builder(&k.dense_fwd);
            b.arg(last).arg(p).arg(&v.w).arg(&v.b).arg(&mut pass.v);
            b.arg(&rows).arg(&v.d_in).arg(&v.d_out);
            // SAFETY: the value head writes rows * 1 floats.
            unsafe { b.launch(grid(pass.rows, 256)) }.map_err(dev)?;
            let actions = head.d_out;
            let mut b = stream.launch_builder(&k.dueling_fwd);
            b.arg(&pass.v).arg(&pass.adv).arg(&mut pass.q);
            b.arg(&rows).arg(&actions);
            // SAFETY: dueling_fwd(v, adv, q, rows, actions): v rows, adv and q rows * actions.
            unsafe { b.launch(grid(pass.rows, 128)) }.map_err(dev)?;
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
    /// uniform with probability `epsilon` (Philox keyed by `seed`, counter `(env, step)`).
    /// Asynchronous.
    pub fn act(
        &mut self,
        obs: &CudaSlice<f32>,
        n: usize,
        epsilon: f32,
        seed: u64,
        step: u64,
        actions: &mut CudaSlice<u8>,
    ) -> Result<(), DqnError> {
        if obs.len() != n * self.cfg.obs_dim || actions.len() != n {
            return Err(DqnError::Device(format!(
                "{} observation floats and {} action slots for {n} environments of {}",
                obs.len(),
                actions.len(),
                self.cfg.obs_dim
            )));
        }
        self.size_act_pass(n)?;
        self.forward(Net::Online, Which::Act, obs)?;
        let stream = self.ctx.stream().clone();
        let q = &self.act_pass.as_ref().expect("sized").q;
        let (rows, a) = (n as u32, self.cfg.actions as u32);
        let mut b = stream.launch_builder(&self.k.select_actions);
        b.arg(q)
            .arg(&rows)
            .arg(&a)
            .arg(&epsilon)
            .arg(&seed)
            .arg(&step)
            .arg(actions);
        // SAFETY: select_actions(q, rows, actions, epsilon, seed, step, out): q holds
        // n * actions floats, out n bytes; one thread per environment.
        unsafe { b.launch(grid(n, 128)) }.map_err(dev)?;
        Ok(())
    }

    /// Q-values of the online network for `obs` (`[n, obs_dim]`) read back (synchronizes; for
    /// tests and checks).
    pub fn q_values(&mut self, obs: &CudaSlice<f32>, n: usize) -> Result<Vec<f32>, DqnError> {
        self.size_act_pass(n)?;
        self.forward(Net::Online, Which::Act, obs)?;
        let q = &self.act_pass.as_ref().expect("sized").q;
        self.ctx.stream().clone_dtoh(q).map_err(dev)
    }

    /// One DQN update on a batch sampled on the device, as [`crate::DqnAgent::learn`]; its
    /// statistics stay on the device until [`FusedDqn::take_stats`]. Asynchronous.
    pub fn learn(&mut self, batch: &DeviceBatch) -> Result<(), DqnError> {
        let bs = self.cfg.batch_size;
        if batch.obs.len() != bs * self.cfg.obs_dim || batch.actions.len() != bs {
            return Err(DqnError::Device(format!(
                "a batch of {} actions for batch size {bs}",
                batch.actions.len()
            )));
        }
        if self.stat_rows == self.stat_capacity {
            return Err(DqnError::Device(format!(
                "statistics of {} updates not taken",
                self.stat_capacity
            )));
        }
        self.forward(Net::Online, Which::Train, &batch.obs)?;
        self.forward(Net::Online, Which::NextOnline, &batch.next_obs)?;
        self.forward(Net::Target, Which::NextTarget, &batch.next_obs)?;
        let act = self.act_code();
        let use_norm = i32::from(self.cfg.layer_norm);
        let stream = self.ctx.stream().clone();
        let k = &self.k;
        let layout = &self.layout;
        let rows = bs as u32;
        let actions = self.cfg.actions as u32;
        let double = i32::from(self.cfg.double);
        let (loss_kind, delta) = match self.cfg.loss {
            Loss::Huber { delta } => (0i32, delta),
            Loss::Mse => (1, 0.0f32),
        };
        let bwd = &mut self.bwd;
        let mut b = stream.launch_builder(&k.td_loss);
        b.arg(&self.train.q)
            .arg(&batch.actions)
            .arg(&self.next_online.q)
            .arg(&self.next_target.q);
        b.arg(&batch.returns)
            .arg(&batch.discounts)
            .arg(&batch.weights);
        b.arg(&rows)
            .arg(&actions)
            .arg(&double)
            .arg(&loss_kind)
            .arg(&delta);
        b.arg(&mut bwd.dq).arg(&mut bwd.terms);
        // SAFETY: td_loss's signature; q buffers hold batch * actions floats, the batch
        // vectors batch entries (actions < actions: written by the environment kernel), dq
        // batch * actions, terms batch * 3; one thread per row.
        unsafe { b.launch(grid(bs, 128)) }.map_err(dev)?;
        let at = (self.stat_rows * 4) as u64;
        let mut b = stream.launch_builder(&k.batch_stats);
        b.arg(&bwd.terms).arg(&rows).arg(&mut self.stats).arg(&at);
        // SAFETY: batch_stats(terms, rows, stats, at): one block of 256 threads (its shared
        // arrays' size); stats holds stat_capacity * 4 floats and at + 3 is below that.
        unsafe { b.launch(grid(256, 256)) }.map_err(dev)?;

        let train = &self.train;
        let grads = &mut self.grads;
        let p = &self.online;
        // Head(s): from dQ to the last hidden layer's output gradient.
        let n_hidden = layout.hidden.len();
        let head_dy = if layout.value.is_some() {
            let mut b = stream.launch_builder(&k.dueling_bwd);
            b.arg(&bwd.dq)
                .arg(&mut bwd.dv)
                .arg(&mut bwd.dadv)
                .arg(&rows)
                .arg(&actions);
            // SAFETY: dueling_bwd(dq, dv, dadv, rows, actions): sizes batch * actions and batch.
            unsafe { b.launch(grid(bs, 128)) }.map_err(dev)?;
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
            let mut b = stream.launch_builder(&k.dense_bwd_params);
            b.arg(last_x).arg(dy).arg(&mut *grads).arg(&d.w).arg(&d.b);
            b.arg(&rows).arg(&d.d_in).arg(&d.d_out);
            // SAFETY: dense_bwd_params(x, dy, grads, w_off, b_off, rows, d_in, d_out): x holds
            // batch * d_in floats, dy batch * d_out, grads the whole vector the offsets index;
            // one thread per weight and bias.
            unsafe { b.launch(grid((d.d_in as usize + 1) * d.d_out as usize, 256)) }
                .map_err(dev)?;
            if n_hidden > 0 {
                let acc = i32::from(i > 0);
                let mut b = stream.launch_builder(&k.dense_bwd_input);
                b.arg(dy).arg(p).arg(&d.w).arg(&mut bwd.da[n_hidden - 1]);
                b.arg(&rows).arg(&d.d_in).arg(&d.d_out).arg(&acc);
                // SAFETY: dense_bwd_input(dy, p, w_off, dx, rows, d_in, d_out, acc): dx holds
                // batch * d_in floats (the last hidden layer's width); one thread per entry.
                unsafe { b.launch(grid(bs * d.d_in as usize, 256)) }.map_err(dev)?;
            }
        }
        for l in (0..n_hidden).rev() {
            let d = layout.hidden[l];
            let (g, bt) = layout.norms.get(l).copied().unwrap_or((0, 0));
            let mut b = stream.launch_builder(&k.hidden_post_bwd);
            b.arg(&bwd.da[l])
                .arg(&train.h[l])
                .arg(&train.xhat[l])
                .arg(&train.rstd[l])
                .arg(p)
                .arg(&g);
            b.arg(&mut bwd.dh[l]).arg(&mut bwd.dz[l]);
            b.arg(&rows).arg(&d.d_out).arg(&use_norm).arg(&act);
            // SAFETY: hidden_post_bwd's signature; every per-layer buffer holds
            // batch * width floats, rstd batch; one thread per row.
            unsafe { b.launch(grid(bs, 128)) }.map_err(dev)?;
            if use_norm != 0 {
                let mut b = stream.launch_builder(&k.norm_bwd_params);
                b.arg(&bwd.dh[l])
                    .arg(&train.xhat[l])
                    .arg(&mut *grads)
                    .arg(&g)
                    .arg(&bt);
                b.arg(&rows).arg(&d.d_out);
                // SAFETY: norm_bwd_params(dh, xhat, grads, g_off, b_off, rows, width): one
                // thread per feature; the offsets index width scales and shifts.
                unsafe { b.launch(grid(d.d_out as usize, 128)) }.map_err(dev)?;
            }
            let x = if l == 0 { &batch.obs } else { &train.a[l - 1] };
            let mut b = stream.launch_builder(&k.dense_bwd_params);
            b.arg(x)
                .arg(&bwd.dz[l])
                .arg(&mut *grads)
                .arg(&d.w)
                .arg(&d.b);
            b.arg(&rows).arg(&d.d_in).arg(&d.d_out);
            // SAFETY: as for the heads.
            unsafe { b.launch(grid((d.d_in as usize + 1) * d.d_out as usize, 256)) }
                .map_err(dev)?;
            if l > 0 {
                let zero = 0i32;
                let mut b = stream.launch_builder(&k.dense_bwd_input);
                b.arg(&bwd.dz[l]).arg(p).arg(&d.w).arg(&mut bwd.da[l - 1]);
                b.arg(&rows).arg(&d.d_in).arg(&d.d_out).arg(&zero);
                // SAFETY: as for the heads: dx is the previous layer's batch * d_in gradient.
                unsafe { b.launch(grid(bs * d.d_in as usize, 256)) }.map_err(dev)?;
            }
        }
        let n = self.layout.total as u64;
        let at_norm = at + 3;
        let mut b = stream.launch_builder(&k.grad_norm);
        b.arg(&*grads)
            .arg(&n)
            .arg(&mut self.norm)
            .arg(&mut self.stats)
            .arg(&at_norm);
        // SAFETY: grad_norm(g, n, norm, stats, at): one block of 1024 threads (its shared
        // array's size); grads holds n floats, norm 1, stats beyond at.
        unsafe { b.launch(grid(1024, 1024)) }.map_err(dev)?;

        // burn's Adam, step t = updates + 1, bias corrections in f32 as burn computes them.
        let c = &self.cfg;
        let t = (self.updates + 1) as i32;
        let c2 = (1.0 - c.beta2.powi(t)).sqrt();
        let cf = c2 / (1.0 - c.beta1.powi(t));
        let eps_c2 = c.adam_eps * c2;
        let lr = c.lr_at(self.updates) as f32;
        let clip = c.grad_clip.unwrap_or(0.0);
        let mut b = stream.launch_builder(&k.adam_step);
        b.arg(&mut self.online)
            .arg(&*grads)
            .arg(&mut self.m1)
            .arg(&mut self.m2)
            .arg(&n)
            .arg(&self.norm);
        b.arg(&clip)
            .arg(&lr)
            .arg(&c.beta1)
            .arg(&c.beta2)
            .arg(&eps_c2)
            .arg(&cf)
            .arg(&c.weight_decay);
        // SAFETY: adam_step's signature; p, g, m, v hold n floats, norm 1; one thread per
        // parameter.
        unsafe { b.launch(grid(n as usize, 256)) }.map_err(dev)?;
        self.updates += 1;
        self.stat_rows += 1;
        Ok(())
    }

    /// The target update due after the latest [`FusedDqn::learn`] (hard copy every K updates or
    /// Polyak blend), as [`crate::DqnAgent::sync_target`]. Asynchronous.
    pub fn sync_target(&mut self) -> Result<(), DqnError> {
        let stream = self.ctx.stream().clone();
        match self.cfg.target_update {
            TargetUpdate::Hard { every } => {
                if self.updates.is_multiple_of(every) {
                    stream
                        .memcpy_dtod(&self.online, &mut self.target)
                        .map_err(dev)?;
                }
            }
            TargetUpdate::Soft { tau } => {
                let n = self.layout.total as u64;
                let mut b = stream.launch_builder(&self.k.polyak);
                b.arg(&self.online).arg(&mut self.target).arg(&n).arg(&tau);
                // SAFETY: polyak(online, target, n, tau): both hold n floats.
                unsafe { b.launch(grid(n as usize, 256)) }.map_err(dev)?;
            }
        }
        Ok(())
    }

    /// The gradient of the latest update's loss with respect to every parameter, before
    /// clipping, in [`AgentState`] order (synchronizes; for tests and checks).
    pub fn gradients(&self) -> Result<Vec<f32>, DqnError> {
        self.ctx.stream().clone_dtoh(&self.grads).map_err(dev)
    }

    /// The statistics of the updates since the last call, `[loss, mean Q, mean |TD|, grad
    /// norm]` each: the one read of them (synchronizes).
    pub fn take_stats(&mut self) -> Result<Vec<[f32; 4]>, DqnError> {
        if self.stat_rows == 0 {
            return Ok(Vec::new());
        }
        let written = self.stats.slice(0..self.stat_rows * 4);
        let rows = self
            .ctx
            .stream()
            .clone_dtoh(&written)
            .map_err(dev)?
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect();
        self.stat_rows = 0;
        Ok(rows)
    }
}
