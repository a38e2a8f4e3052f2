//! The learning rule: batched action selection and one DQN update, on any burn backend.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor};

use crate::DqnError;
use crate::config::{AgentConfig, DqnConfig, Loss, TargetUpdate};
use crate::model::QNetwork;

/// A batch of n-step transitions, all on the agent's device.
pub struct Batch<B: Backend> {
    /// Observations, `[batch, obs_dim]`.
    pub obs: Tensor<B, 2>,
    /// Actions taken, `[batch]`.
    pub actions: Tensor<B, 1, Int>,
    /// Discounted reward sums over the n steps, `[batch]`.
    pub returns: Tensor<B, 1>,
    /// Observations n steps later, `[batch, obs_dim]`.
    pub next_obs: Tensor<B, 2>,
    /// gamma^k for the k steps summed, 0 where the episode terminated inside them, `[batch]`.
    pub discounts: Tensor<B, 1>,
    /// Importance weights, `[batch]` (ones for uniform replay).
    pub weights: Tensor<B, 1>,
}

impl<B: Backend> Batch<B> {
    /// Uploads a host batch (`obs` row-major `[batch * obs_dim]`).
    pub fn from_host(h: &crate::replay::HostBatch, obs_dim: usize, device: &B::Device) -> Self {
        let n = h.actions.len();
        let f2 = |v: &[f32]| Tensor::<B, 1>::from_floats(v, device).reshape([n, obs_dim]);
        let f1 = |v: &[f32]| Tensor::<B, 1>::from_floats(v, device);
        Self {
            obs: f2(&h.obs),
            actions: Tensor::<B, 1, Int>::from_ints(h.actions.as_slice(), device),
            returns: f1(&h.returns),
            next_obs: f2(&h.next_obs),
            discounts: f1(&h.discounts),
            weights: f1(&h.weights),
        }
    }
}

/// Statistics of one update, left on the device: reading them (`to_host`) is the one
/// synchronization, and the caller decides when.
pub struct TrainStats<B: Backend> {
    /// Mean weighted loss, `[1]`.
    pub loss: Tensor<B, 1>,
    /// Mean Q of the chosen actions, `[1]`.
    pub mean_q: Tensor<B, 1>,
    /// Mean |TD error|, `[1]`.
    pub td_abs_mean: Tensor<B, 1>,
    /// Largest |TD error|, `[1]`.
    pub td_abs_max: Tensor<B, 1>,
    /// Global gradient norm before clipping, `[1]`.
    pub grad_norm: Tensor<B, 1>,
    /// TD errors, `[batch]` (new priorities for prioritized replay).
    pub td_errors: Tensor<B, 1>,
}

/// One update's statistics on the host: what the trainer logs, checks and reports per epoch.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UpdateStats {
    /// Mean weighted loss.
    pub loss: f32,
    /// Mean Q of the chosen actions.
    pub mean_q: f32,
    /// Mean |TD error|.
    pub td_abs_mean: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
}

impl UpdateStats {
    /// The statistics with their names, in report order.
    pub fn named(&self) -> [(&'static str, f32); 4] {
        [
            ("loss", self.loss),
            ("mean Q", self.mean_q),
            ("mean |TD error|", self.td_abs_mean),
            ("gradient norm", self.grad_norm),
        ]
    }

    /// The name of the first statistic that is not finite.
    pub fn first_non_finite(&self) -> Option<&'static str> {
        self.named()
            .into_iter()
            .find(|(_, v)| !v.is_finite())
            .map(|(n, _)| n)
    }
}

/// [`TrainStats`] read to the host.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HostStats {
    /// Mean weighted loss.
    pub loss: f32,
    /// Mean Q of the chosen actions.
    pub mean_q: f32,
    /// Mean |TD error|.
    pub td_abs_mean: f32,
    /// Largest |TD error|.
    pub td_abs_max: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
}

impl<B: Backend> TrainStats<B> {
    /// Reads the scalars (synchronizes with the device).
    pub fn to_host(&self) -> HostStats {
        let s = |t: &Tensor<B, 1>| t.clone().into_scalar().elem::<f32>();
        HostStats {
            loss: s(&self.loss),
            mean_q: s(&self.mean_q),
            td_abs_mean: s(&self.td_abs_mean),
            td_abs_max: s(&self.td_abs_max),
            grad_norm: s(&self.grad_norm),
        }
    }
}

use burn::tensor::ElementConversion;

/// TD targets `returns + discounts * Q_target(next, a*)`, `[batch]`.
///
/// Double DQN: `a* = argmax_a Q_online(next, a)`; vanilla: the target network's own max.
/// `next_online` and `next_target` are `[batch, actions]`.
pub fn td_targets<B: Backend>(
    next_online: Tensor<B, 2>,
    next_target: Tensor<B, 2>,
    returns: Tensor<B, 1>,
    discounts: Tensor<B, 1>,
    double: bool,
) -> Tensor<B, 1> {
    let next = if double {
        let best = next_online.argmax(1);
        next_target.gather(1, best)
    } else {
        next_target.max_dim(1)
    };
    returns + discounts * next.squeeze_dim::<1>(1)
}

/// Elementwise TD loss, `[batch] -> [batch]`.
pub fn td_loss<B: Backend>(td: Tensor<B, 1>, loss: Loss) -> Tensor<B, 1> {
    match loss {
        Loss::Mse => td.powf_scalar(2.0),
        Loss::Huber { delta } => {
            let abs = td.clone().abs();
            let quadratic = td.powf_scalar(2.0) * 0.5;
            let linear = (abs.clone() - 0.5 * delta) * delta;
            quadratic.mask_where(abs.greater_elem(delta), linear)
        }
    }
}

/// A DQN agent: online and target networks, Adam, counters.
pub struct DqnAgent<B: AutodiffBackend> {
    cfg: AgentConfig,
    online: Option<QNetwork<B>>,
    target: QNetwork<B::InnerBackend>,
    optim: OptimizerAdaptor<Adam, QNetwork<B>, B>,
    device: B::Device,
    updates: u64,
    env_steps: u64,
}

impl<B: AutodiffBackend> DqnAgent<B> {
    /// A new agent on `device`, its networks initialized from `cfg.seed` alone (the same
    /// seed gives the same weights on any thread; see [`QNetwork::init`]).
    pub fn new(cfg: AgentConfig, device: &B::Device) -> Result<Self, DqnError> {
        cfg.validate()?;
        let online = QNetwork::<B>::init(&cfg, device);
        let target = online.valid();
        let optim = Self::optimizer(&cfg);
        Ok(Self {
            cfg,
            online: Some(online),
            target,
            optim,
            device: device.clone(),
            updates: 0,
            env_steps: 0,
        })
    }

    fn optimizer(cfg: &DqnConfig) -> OptimizerAdaptor<Adam, QNetwork<B>, B> {
        AdamConfig::new()
            .with_beta_1(cfg.beta1)
            .with_beta_2(cfg.beta2)
            .with_epsilon(cfg.adam_eps)
            .with_weight_decay(
                (cfg.weight_decay > 0.0).then(|| WeightDecayConfig::new(cfg.weight_decay)),
            )
            .init()
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }
    /// The device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }
    /// Updates done.
    pub fn updates(&self) -> u64 {
        self.updates
    }
    /// Environment steps counted with [`DqnAgent::count_env_steps`].
    pub fn env_steps(&self) -> u64 {
        self.env_steps
    }
    /// Adds environment steps (they drive the epsilon schedule).
    pub fn count_env_steps(&mut self, n: u64) {
        self.env_steps += n;
    }
    /// Epsilon at the current environment step.
    pub fn epsilon(&self) -> f64 {
        self.cfg.epsilon.at(self.env_steps)
    }

    fn online(&self) -> &QNetwork<B> {
        self.online
            .as_ref()
            .expect("online network is present between updates")
    }

    /// The online network without autodiff (for evaluation and export).
    pub fn online_net(&self) -> QNetwork<B::InnerBackend> {
        self.online().valid()
    }
    /// The target network.
    pub fn target_net(&self) -> &QNetwork<B::InnerBackend> {
        &self.target
    }

    /// Q-values of the online network, `[n, obs_dim] -> [n, actions]`.
    pub fn q_values(&self, obs: Tensor<B::InnerBackend, 2>) -> Tensor<B::InnerBackend, 2> {
        self.online().valid().forward(obs)
    }

    /// Epsilon-greedy actions for N environments, `[n, obs_dim] -> [n]`; epsilon 0 is greedy.
    ///
    /// The exploration draws come from the backend's generator, which the whole process shares
    /// (seed it with `B::seed` for a reproducible single-threaded run). A caller that needs draws
    /// reproducible across threads, such as the walk-forward trainer, picks its own actions
    /// from [`DqnAgent::q_values`].
    pub fn act(
        &self,
        obs: Tensor<B::InnerBackend, 2>,
        epsilon: f64,
    ) -> Tensor<B::InnerBackend, 1, Int> {
        let n = obs.dims()[0];
        let greedy = self.q_values(obs).argmax(1).squeeze_dim::<1>(1);
        if epsilon <= 0.0 {
            return greedy;
        }
        let actions = self.cfg.actions as f64;
        let random = Tensor::<B::InnerBackend, 1>::random(
            [n],
            Distribution::Uniform(0.0, actions),
            &self.device,
        )
        .int()
        .clamp_max(self.cfg.actions as i64 - 1);
        let explore = Tensor::<B::InnerBackend, 1>::random(
            [n],
            Distribution::Uniform(0.0, 1.0),
            &self.device,
        )
        .lower_elem(epsilon);
        greedy.mask_where(explore, random)
    }

    /// One DQN update on `batch` followed by the target update its schedule calls for: the same
    /// as [`DqnAgent::learn`] then [`DqnAgent::sync_target`]. Nothing is read back to the host.
    pub fn train_step(&mut self, batch: Batch<B>) -> TrainStats<B::InnerBackend> {
        let stats = self.learn(batch);
        self.sync_target();
        stats
    }

    /// The target network update due after the latest [`DqnAgent::learn`]: a hard copy every
    /// K updates, or a Polyak blend after each. Separate from `learn` so that a trainer can time
    /// it as its own phase.
    pub fn sync_target(&mut self) {
        let online = self.online();
        match self.cfg.target_update {
            TargetUpdate::Hard { every } => {
                if self.updates.is_multiple_of(every) {
                    self.target = online.valid();
                }
            }
            TargetUpdate::Soft { tau } => {
                self.target = polyak(&online.valid(), self.target.clone(), tau)
            }
        }
    }

    /// One gradient update on `batch`, without the target update (see
    /// [`DqnAgent::train_step`]). Nothing is read back to the host here.
    pub fn learn(&mut self, batch: Batch<B>) -> TrainStats<B::InnerBackend> {
        let lr = self.cfg.lr_at(self.updates);
        let online = self
            .online
            .take()
            .expect("online network is present between updates");
        let (loss, q, td) = batch_loss(&online, &self.target, batch, &self.cfg);
        let mut grads = GradientsParams::from_grads(loss.backward(), &online);
        let grad_norm = global_norm::<B>(&online, &grads);
        if let Some(max) = self.cfg.grad_clip {
            // A division, not `recip()`: NdArray's SIMD reciprocal is an approximation that
            // differs between CPUs.
            let norm = grad_norm.clone() + 1e-6;
            let scale = norm.ones_like().mul_scalar(max).div(norm).clamp_max(1.0);
            scale_grads::<B>(&online, &mut grads, scale);
        }
        let online = self.optim.step(lr, online, grads);
        self.updates += 1;
        self.online = Some(online);
        let td = td.inner();
        TrainStats {
            loss: loss.inner(),
            mean_q: q.inner().mean(),
            td_abs_mean: td.clone().abs().mean(),
            td_abs_max: td.clone().abs().max(),
            grad_norm,
            td_errors: td,
        }
    }

    /// The gradient of [`DqnAgent::learn`]'s loss on `batch` with respect to every parameter of
    /// the online network as it is now, before clipping, flat in [`AgentState`] order. Reads the
    /// device; for checks (the fused engine's test compares its backward pass with this).
    pub fn gradients(&self, batch: Batch<B>) -> Vec<f32> {
        struct Flat<'a>(&'a GradientsParams, Vec<f32>);
        impl<B: AutodiffBackend> ModuleVisitor<B> for Flat<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let g = self
                    .0
                    .get::<B::InnerBackend, D>(param.id)
                    .expect("every parameter takes part in the loss");
                self.1.extend(g.into_data().iter::<f32>());
            }
        }
        let online = self.online();
        let (loss, _, _) = batch_loss(online, &self.target, batch, &self.cfg);
        let grads = GradientsParams::from_grads(loss.backward(), online);
        let mut f = Flat(&grads, Vec::new());
        online.visit(&mut f);
        f.1
    }

    /// Rebuilds an agent from a format-3 checkpoint's parts.
    pub(crate) fn from_parts(
        cfg: AgentConfig,
        device: &B::Device,
        online: QNetwork<B>,
        target: QNetwork<B::InnerBackend>,
        optim: OptimizerAdaptor<Adam, QNetwork<B>, B>,
        updates: u64,
        env_steps: u64,
    ) -> Self {
        Self {
            cfg,
            online: Some(online),
            target,
            optim,
            device: device.clone(),
            updates,
            env_steps,
        }
    }

    /// A fresh optimizer of this configuration (to load an optimizer record into).
    pub(crate) fn fresh_optimizer(cfg: &DqnConfig) -> OptimizerAdaptor<Adam, QNetwork<B>, B> {
        Self::optimizer(cfg)
    }
}

/// The mean weighted TD loss of `batch` (`[1]`, tracked for gradients through `online`), the
/// online Q-values of the taken actions and the TD errors (`[batch]` each).
fn batch_loss<B: AutodiffBackend>(
    online: &QNetwork<B>,
    target: &QNetwork<B::InnerBackend>,
    batch: Batch<B>,
    cfg: &DqnConfig,
) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    let q = online
        .forward(batch.obs)
        .gather(1, batch.actions.unsqueeze_dim(1))
        .squeeze_dim::<1>(1);
    let next = batch.next_obs.inner();
    let y = td_targets(
        online.valid().forward(next.clone()),
        target.forward(next),
        batch.returns.inner(),
        batch.discounts.inner(),
        cfg.double,
    );
    let td = q.clone() - Tensor::from_inner(y);
    let loss = (td_loss(td.clone(), cfg.loss) * batch.weights).mean();
    (loss, q, td)
}

/// sqrt(sum of squared gradients over every parameter), `[1]`, on the device.
fn global_norm<B: AutodiffBackend>(
    module: &QNetwork<B>,
    grads: &GradientsParams,
) -> Tensor<B::InnerBackend, 1> {
    struct Norm<'a, B: AutodiffBackend> {
        grads: &'a GradientsParams,
        sum: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Norm<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let s = g.powf_scalar(2.0).sum();
                self.sum = Some(match self.sum.take() {
                    Some(acc) => acc + s,
                    None => s,
                });
            }
        }
    }
    let mut v = Norm::<B> { grads, sum: None };
    module.visit(&mut v);
    v.sum.expect("the network has parameters").sqrt()
}

/// Multiplies every gradient by `scale` (`[1]`), on the device.
fn scale_grads<B: AutodiffBackend>(
    module: &QNetwork<B>,
    grads: &mut GradientsParams,
    scale: Tensor<B::InnerBackend, 1>,
) {
    struct Scale<'a, B: AutodiffBackend> {
        grads: &'a mut GradientsParams,
        scale: Tensor<B::InnerBackend, 1>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let s = self.scale.clone().reshape([1; D]);
                self.grads.register::<B::InnerBackend, D>(param.id, g * s);
            }
        }
    }
    module.visit(&mut Scale::<B> { grads, scale });
}

/// target <- tau * online + (1 - tau) * target, parameter by parameter (same visiting order).
fn polyak<B: Backend>(online: &QNetwork<B>, target: QNetwork<B>, tau: f32) -> QNetwork<B> {
    struct Collect<B: Backend> {
        params: Vec<Tensor<B, 1>>,
    }
    impl<B: Backend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            let n = t.shape().num_elements();
            self.params.push(t.reshape([n]));
        }
    }
    struct Blend<B: Backend> {
        params: std::vec::IntoIter<Tensor<B, 1>>,
        tau: f32,
    }
    impl<B: Backend> ModuleMapper<B> for Blend<B> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let src = self
                .params
                .next()
                .expect("same architecture")
                .reshape(tensor.shape());
            Param::from_mapped_value(id, src * self.tau + tensor * (1.0 - self.tau), mapper)
        }
    }
    let mut c = Collect { params: Vec::new() };
    online.visit(&mut c);
    target.map(&mut Blend {
        params: c.params.into_iter(),
        tau,
    })
}

/// What decides an agent's next updates, as flat host vectors in the network's parameter order
/// (the order [`QNetwork`]'s `visit` walks: each hidden layer's weight `[d_in, d_out]` then bias,
/// the layer norms' scale then shift, the Q (advantage) head, the value head). The fused CUDA
/// engine trains from and back into it; the environment-step counter stays with the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentState {
    /// Online network parameters.
    pub online: Vec<f32>,
    /// Target network parameters.
    pub target: Vec<f32>,
    /// Adam's first moments (zero before the first update).
    pub moment_1: Vec<f32>,
    /// Adam's second moments (zero before the first update).
    pub moment_2: Vec<f32>,
    /// Updates done (Adam's step count; the learning-rate and target schedules' clock).
    pub updates: u64,
}

/// An agent copied into memory: its learning state and its environment-step count, for keeping
/// an epoch's agent (the best on validation) without writing it, and making it again later.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Networks, Adam's moments, updates.
    pub state: AgentState,
    /// Environment steps counted (the exploration schedule's clock).
    pub env_steps: u64,
}

/// The optimizer's per-parameter state.
type AdamRecords<B> = <OptimizerAdaptor<Adam, QNetwork<B>, B> as Optimizer<QNetwork<B>, B>>::Record;

/// Every float parameter of a module, flattened in visiting order.
fn flat_params<B: Backend, M: Module<B>>(module: &M) -> Vec<f32> {
    struct Flat(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Flat {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.extend(param.val().into_data().iter::<f32>());
        }
    }
    let mut f = Flat(Vec::new());
    module.visit(&mut f);
    f.0
}

/// Replaces every float parameter's values with the next ones of `values` (visiting order),
/// keeping parameter ids (which the optimizer's state is keyed by) and gradient tracking.
fn assign_params<B: Backend, M: Module<B>>(module: M, values: &[f32]) -> M {
    struct Assign<'a> {
        values: &'a [f32],
        at: usize,
    }
    impl<B: Backend> ModuleMapper<B> for Assign<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, old, mapper) = param.consume();
            let shape = old.shape();
            let n = shape.num_elements();
            let data =
                burn::tensor::TensorData::new(self.values[self.at..self.at + n].to_vec(), shape);
            self.at += n;
            let t = Tensor::from_data(data, &old.device()).set_require_grad(old.is_require_grad());
            Param::from_mapped_value(id, t, mapper)
        }
    }
    let mut a = Assign { values, at: 0 };
    let m = module.map(&mut a);
    assert_eq!(
        a.at,
        values.len(),
        "parameter vector of another architecture"
    );
    m
}

impl<B: AutodiffBackend> DqnAgent<B> {
    /// Number of float parameters of the Q-network.
    pub fn num_params(&self) -> usize {
        self.online().num_params()
    }

    /// The agent copied into memory (reads the device).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            state: self.export_state(),
            env_steps: self.env_steps,
        }
    }

    /// An agent of `cfg` on `device` made from `snapshot`: trains, acts and checkpoints as the
    /// agent it was taken from.
    ///
    /// # Panics
    /// When the snapshot is of another architecture (a programmer error, as [`Self::import_state`]).
    pub fn restore(
        cfg: AgentConfig,
        device: &B::Device,
        snapshot: &Snapshot,
    ) -> Result<Self, DqnError> {
        let mut agent = Self::new(cfg, device)?;
        agent.import_state(&snapshot.state);
        agent.env_steps = snapshot.env_steps;
        Ok(agent)
    }

    /// The agent's learning state as host vectors (reads the device).
    pub fn export_state(&self) -> AgentState {
        struct Moments<'a, B: AutodiffBackend> {
            records: &'a AdamRecords<B>,
            m1: Vec<f32>,
            m2: Vec<f32>,
        }
        impl<B: AutodiffBackend> ModuleVisitor<B> for Moments<'_, B> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let n = param.val().shape().num_elements();
                match self.records.get(&param.id) {
                    Some(r) => {
                        let s = r.clone().into_state::<D>().momentum;
                        self.m1.extend(s.moment_1.into_data().iter::<f32>());
                        self.m2.extend(s.moment_2.into_data().iter::<f32>());
                    }
                    None => {
                        self.m1.extend(std::iter::repeat_n(0.0, n));
                        self.m2.extend(std::iter::repeat_n(0.0, n));
                    }
                }
            }
        }
        let records = self.optim.to_record();
        let mut m = Moments::<B> {
            records: &records,
            m1: Vec::new(),
            m2: Vec::new(),
        };
        self.online().visit(&mut m);
        AgentState {
            online: flat_params(self.online()),
            target: flat_params(&self.target),
            moment_1: m.m1,
            moment_2: m.m2,
            updates: self.updates,
        }
    }

    /// Takes `state` as the agent's learning state (networks, Adam's moments, update count).
    ///
    /// # Panics
    /// When `state` is of another architecture (vector lengths differ): a programmer error.
    pub fn import_state(&mut self, state: &AgentState) {
        let n = self.num_params();
        for (what, v) in [
            ("online", &state.online),
            ("target", &state.target),
            ("moment_1", &state.moment_1),
            ("moment_2", &state.moment_2),
        ] {
            assert_eq!(v.len(), n, "{what}: {} values for {n} parameters", v.len());
        }
        let online = self.online.take().expect("online network present");
        let online = assign_params(online, &state.online);
        self.target = assign_params(self.target.clone(), &state.target);
        struct Records<'a, B: AutodiffBackend> {
            state: &'a AgentState,
            at: usize,
            time: usize,
            map: AdamRecords<B>,
        }
        impl<B: AutodiffBackend> ModuleVisitor<B> for Records<'_, B> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let shape = param.val().shape();
                let n = shape.num_elements();
                let device = param.val().device();
                let t = |v: &[f32]| {
                    Tensor::<B::InnerBackend, D>::from_data(
                        burn::tensor::TensorData::new(
                            v[self.at..self.at + n].to_vec(),
                            shape.clone(),
                        ),
                        &device,
                    )
                };
                let s = burn::optim::AdamState {
                    momentum: burn::optim::AdaptiveMomentumState {
                        time: self.time,
                        moment_1: t(&self.state.moment_1),
                        moment_2: t(&self.state.moment_2),
                        max_moment_2: None,
                    },
                };
                self.map
                    .insert(param.id, burn::optim::record::AdaptorRecord::from_state(s));
                self.at += n;
            }
        }
        let mut r = Records::<B> {
            state,
            at: 0,
            time: state.updates as usize,
            map: Default::default(),
        };
        // Before the first update Adam has no state; a fresh optimizer is exactly that.
        if state.updates > 0 {
            online.visit(&mut r);
        }
        self.optim = Self::optimizer(&self.cfg).load_record(r.map);
        self.online = Some(online);
        self.updates = state.updates;
    }
}
