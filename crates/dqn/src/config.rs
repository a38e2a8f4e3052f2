//! The agent's configuration: every hyperparameter a user sets, with its default, in
//! [`DqnConfig`]; and what an agent is built from, [`AgentConfig`]: those settings plus the values
//! the environment and the run derive (observation size, actions, seed). Serializable, so that a
//! checkpoint can refuse weights of another architecture.

use serde::{Deserialize, Serialize};

/// Hidden-layer activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// max(0, x).
    Relu,
    /// tanh(x).
    Tanh,
    /// Gaussian error linear unit.
    Gelu,
}

/// TD loss on the chosen actions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", deny_unknown_fields)]
pub enum Loss {
    /// Huber with threshold `delta` (smooth L1 for delta = 1).
    Huber {
        /// Quadratic below, linear above this |TD error|.
        delta: f32,
    },
    /// Squared error.
    Mse,
}

/// Which TD loss, without its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum LossKind {
    /// Huber.
    Huber,
    /// Squared error.
    Mse,
}

impl Loss {
    /// Huber's threshold when none is given.
    pub const DEFAULT_HUBER_DELTA: f32 = 1.0;

    /// The loss's kind.
    pub fn kind(&self) -> LossKind {
        match self {
            Loss::Huber { .. } => LossKind::Huber,
            Loss::Mse => LossKind::Mse,
        }
    }
}

/// Learning-rate schedule over updates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", deny_unknown_fields)]
pub enum LrSchedule {
    /// Always `lr`.
    Constant,
    /// From `lr` to `lr * end_factor` linearly over `steps` updates, then constant.
    Linear {
        /// Final fraction of lr.
        end_factor: f64,
        /// Updates to get there.
        steps: u64,
    },
    /// Cosine from `lr` to `lr * min_factor` over `steps` updates, then constant.
    Cosine {
        /// Final fraction of lr.
        min_factor: f64,
        /// Updates to get there.
        steps: u64,
    },
}

/// Which learning-rate schedule, without its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum LrScheduleKind {
    /// Constant.
    Constant,
    /// Linear decay.
    Linear,
    /// Cosine decay.
    Cosine,
}

impl LrSchedule {
    /// The final fraction of lr a decaying schedule reaches when none is given.
    pub const DEFAULT_END_FACTOR: f64 = 0.1;
    /// The updates a decaying schedule takes when none are given.
    pub const DEFAULT_STEPS: u64 = 100_000;

    /// The schedule's kind.
    pub fn kind(&self) -> LrScheduleKind {
        match self {
            LrSchedule::Constant => LrScheduleKind::Constant,
            LrSchedule::Linear { .. } => LrScheduleKind::Linear,
            LrSchedule::Cosine { .. } => LrScheduleKind::Cosine,
        }
    }

    /// Final fraction of lr and updates to get there when the schedule decays, else `None`.
    pub fn decay(&self) -> Option<(f64, u64)> {
        match *self {
            LrSchedule::Constant => None,
            LrSchedule::Linear { end_factor, steps } => Some((end_factor, steps)),
            LrSchedule::Cosine { min_factor, steps } => Some((min_factor, steps)),
        }
    }

    /// A schedule of `kind` that decays to `end_factor` of lr over `steps` updates (both unused
    /// by a constant schedule).
    pub fn of(kind: LrScheduleKind, end_factor: f64, steps: u64) -> Self {
        match kind {
            LrScheduleKind::Constant => LrSchedule::Constant,
            LrScheduleKind::Linear => LrSchedule::Linear { end_factor, steps },
            LrScheduleKind::Cosine => LrSchedule::Cosine {
                min_factor: end_factor,
                steps,
            },
        }
    }
}

/// How the target network follows the online network.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", deny_unknown_fields)]
pub enum TargetUpdate {
    /// Copy the online weights every `every` updates.
    Hard {
        /// Updates between copies.
        every: u64,
    },
    /// target = tau * online + (1 - tau) * target after every update (Polyak).
    Soft {
        /// Blend factor in (0, 1].
        tau: f32,
    },
}

/// Epsilon schedule shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// Straight line from start to end.
    Linear,
    /// Geometric from start to end.
    Exponential,
}

/// Epsilon-greedy exploration over environment steps. Default: linear from 1.0 to 0.05 over the
/// first 20,000 environment steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Epsilon {
    /// Epsilon at step 0.
    pub start: f64,
    /// Epsilon from `steps` on.
    pub end: f64,
    /// Environment steps of the decay.
    pub steps: u64,
    /// Shape of the decay.
    pub decay: Decay,
}

impl Default for Epsilon {
    fn default() -> Self {
        Self {
            start: 1.0,
            end: 0.05,
            steps: 20_000,
            decay: Decay::Linear,
        }
    }
}

impl Epsilon {
    /// Epsilon after `step` environment steps.
    pub fn at(&self, step: u64) -> f64 {
        if step >= self.steps || self.steps == 0 {
            return self.end;
        }
        let f = step as f64 / self.steps as f64;
        match self.decay {
            Decay::Linear => self.start + (self.end - self.start) * f,
            Decay::Exponential => {
                self.start * (self.end.max(1e-12) / self.start.max(1e-12)).powf(f)
            }
        }
    }
}

/// Proportional prioritized replay (Schaul et al. 2016). Default: alpha 0.6, beta from 0.4 to 1
/// over 100,000 updates, eps 1e-6.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Prioritized {
    /// Priority exponent: p = (|td| + eps)^alpha.
    pub alpha: f64,
    /// Importance-weight exponent at update 0, annealed to 1 over `beta_steps`.
    pub beta_start: f64,
    /// Updates over which beta reaches 1.
    pub beta_steps: u64,
    /// Added to |td| so that no transition has zero priority.
    pub eps: f64,
}

impl Default for Prioritized {
    fn default() -> Self {
        Self {
            alpha: 0.6,
            beta_start: 0.4,
            beta_steps: 100_000,
            eps: 1e-6,
        }
    }
}

/// The DQN settings a user chooses (TOML table `[dqn]`). Defaults: hidden 128x128 ReLU, no
/// dueling, no layer norm, double DQN, 1-step, gamma 0.99, Huber(1), grad-norm clip 10,
/// Adam(1e-3, 0.9, 0.999, 1e-8, no weight decay), constant lr, hard target copy every 1000
/// updates, epsilon linear 1.0 -> 0.05 over 20k environment steps, uniform replay of 100k
/// transitions, batch 64. Each default is defined once, here: a partial table keeps the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DqnConfig {
    /// Hidden layer widths.
    pub hidden: Vec<usize>,
    /// Hidden activation.
    pub activation: Activation,
    /// Separate value and advantage heads, Q = V + A - mean(A).
    pub dueling: bool,
    /// Layer norm after each hidden linear layer (before the activation).
    pub layer_norm: bool,
    /// Double DQN targets (online net picks, target net evaluates); false for vanilla max.
    pub double: bool,
    /// n of n-step returns.
    pub n_step: usize,
    /// Discount per step.
    pub gamma: f64,
    /// TD loss.
    pub loss: Loss,
    /// Global gradient-norm clip; None for no clipping.
    pub grad_clip: Option<f32>,
    /// Adam learning rate.
    pub lr: f64,
    /// Adam beta1.
    pub beta1: f32,
    /// Adam beta2.
    pub beta2: f32,
    /// Adam epsilon.
    pub adam_eps: f32,
    /// L2 weight decay added to gradients; 0 for none.
    pub weight_decay: f32,
    /// Learning-rate schedule.
    pub lr_schedule: LrSchedule,
    /// Target network updates.
    pub target_update: TargetUpdate,
    /// Exploration.
    pub epsilon: Epsilon,
    /// Prioritized replay; None for uniform replay.
    pub prioritized: Option<Prioritized>,
    /// Replay capacity in transitions.
    pub replay_capacity: usize,
    /// Transitions per update.
    pub batch_size: usize,
    /// Dense layers as full-f32 multiply-and-sum instead of the backend's matmul. On Hopper,
    /// burn-cuda 0.21's matmul rounds f32 operands to TF32 (about 5e-4 relative to the CPU);
    /// this path agrees with the CPU to about 1e-6, at some cost in speed. Default false.
    pub full_f32: bool,
}

impl Default for DqnConfig {
    fn default() -> Self {
        Self {
            hidden: vec![128, 128],
            activation: Activation::Relu,
            dueling: false,
            layer_norm: false,
            double: true,
            n_step: 1,
            gamma: 0.99,
            loss: Loss::Huber {
                delta: Loss::DEFAULT_HUBER_DELTA,
            },
            grad_clip: Some(10.0),
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
            weight_decay: 0.0,
            lr_schedule: LrSchedule::Constant,
            target_update: TargetUpdate::Hard { every: 1000 },
            epsilon: Epsilon::default(),
            prioritized: None,
            replay_capacity: 100_000,
            batch_size: 64,
            full_f32: false,
        }
    }
}

impl DqnConfig {
    /// Units of the first hidden layer; 0 when there is none (the head reads the observation).
    pub fn first_width(&self) -> usize {
        self.hidden.first().copied().unwrap_or(0)
    }

    /// Checks the values a user may have set; the error says which and why.
    pub fn validate(&self) -> Result<(), crate::DqnError> {
        let bad = |m: String| Err(crate::DqnError::Config(m));
        if self.hidden.is_empty() || self.hidden.contains(&0) {
            return bad(format!(
                "hidden must list one or more positive widths, got {:?}",
                self.hidden
            ));
        }
        if self.n_step == 0 || !(0.0..=1.0).contains(&self.gamma) {
            return bad(format!(
                "n_step must be >= 1 and gamma in [0, 1] (got {} and {})",
                self.n_step, self.gamma
            ));
        }
        if !(self.lr > 0.0 && self.lr.is_finite())
            || self.batch_size == 0
            || self.replay_capacity < self.batch_size
        {
            return bad(format!(
                "lr must be positive and batch_size in 1..=replay_capacity (lr {}, batch {}, capacity {})",
                self.lr, self.batch_size, self.replay_capacity
            ));
        }
        if let TargetUpdate::Soft { tau } = self.target_update
            && !(tau > 0.0 && tau <= 1.0)
        {
            return bad(format!("soft target tau must be in (0, 1], got {tau}"));
        }
        if let TargetUpdate::Hard { every: 0 } = self.target_update {
            return bad("hard target update period must be at least 1".into());
        }
        // Ranges outside which a setting means nothing (docs/TRAINING.md lists them): the
        // first value out of its range is named.
        let f = f64::from;
        let mut checks: Vec<(&str, f64, bool, &str)> = vec![
            (
                "beta1",
                f(self.beta1),
                (0.0..1.0).contains(&self.beta1),
                "[0, 1)",
            ),
            (
                "beta2",
                f(self.beta2),
                (0.0..1.0).contains(&self.beta2),
                "[0, 1)",
            ),
            (
                "adam_eps",
                f(self.adam_eps),
                self.adam_eps > 0.0 && self.adam_eps.is_finite(),
                "> 0",
            ),
            (
                "weight_decay",
                f(self.weight_decay),
                self.weight_decay >= 0.0 && self.weight_decay.is_finite(),
                ">= 0",
            ),
            (
                "epsilon.start",
                self.epsilon.start,
                (0.0..=1.0).contains(&self.epsilon.start),
                "[0, 1]",
            ),
            (
                "epsilon.end",
                self.epsilon.end,
                (0.0..=1.0).contains(&self.epsilon.end),
                "[0, 1]",
            ),
        ];
        if let Some(c) = self.grad_clip {
            checks.push((
                "grad_clip",
                f(c),
                c > 0.0 && c.is_finite(),
                "> 0 (0 turns clipping off)",
            ));
        }
        if let Loss::Huber { delta } = self.loss {
            checks.push((
                "loss.delta (Huber)",
                f(delta),
                delta > 0.0 && delta.is_finite(),
                "> 0",
            ));
        }
        if let Some((end, _)) = self.lr_schedule.decay() {
            checks.push((
                "lr_schedule.end_factor",
                end,
                (0.0..=1.0).contains(&end),
                "[0, 1]",
            ));
        }
        if let Some(p) = &self.prioritized {
            checks.extend([
                (
                    "prioritized.alpha",
                    p.alpha,
                    (0.0..=1.0).contains(&p.alpha),
                    "[0, 1]",
                ),
                (
                    "prioritized.beta_start",
                    p.beta_start,
                    (0.0..=1.0).contains(&p.beta_start),
                    "[0, 1]",
                ),
                (
                    "prioritized.eps",
                    p.eps,
                    p.eps > 0.0 && p.eps.is_finite(),
                    "> 0",
                ),
            ]);
        }
        if let Some((name, v, _, range)) = checks.into_iter().find(|c| !c.2) {
            return bad(format!("{name} must be in {range}, got {v}"));
        }
        Ok(())
    }

    /// Learning rate at update `step`.
    pub fn lr_at(&self, step: u64) -> f64 {
        match self.lr_schedule {
            LrSchedule::Constant => self.lr,
            LrSchedule::Linear { end_factor, steps } => {
                let f = if steps == 0 {
                    1.0
                } else {
                    (step as f64 / steps as f64).min(1.0)
                };
                self.lr * (1.0 + (end_factor - 1.0) * f)
            }
            LrSchedule::Cosine { min_factor, steps } => {
                let f = if steps == 0 {
                    1.0
                } else {
                    (step as f64 / steps as f64).min(1.0)
                };
                self.lr
                    * (min_factor
                        + (1.0 - min_factor) * 0.5 * (1.0 + (std::f64::consts::PI * f).cos()))
            }
        }
    }
}

/// What an agent is built from: the user's [`DqnConfig`] and the values derived for it (the
/// observation size and the number of actions from the environment, the seed from the run and
/// the window). Reads as a [`DqnConfig`] through `Deref`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Observation length (input).
    pub obs_dim: usize,
    /// Number of discrete actions (output).
    pub actions: usize,
    /// Seed of initialization and replay sampling.
    pub seed: u64,
    /// The DQN settings.
    pub dqn: DqnConfig,
}

impl Default for AgentConfig {
    /// 32 inputs, 3 actions, seed 0, the default settings.
    fn default() -> Self {
        Self {
            obs_dim: 32,
            actions: 3,
            seed: 0,
            dqn: DqnConfig::default(),
        }
    }
}

impl std::ops::Deref for AgentConfig {
    type Target = DqnConfig;
    fn deref(&self) -> &DqnConfig {
        &self.dqn
    }
}

impl AgentConfig {
    /// An agent of `obs_dim` inputs and `actions` outputs, seeded by `seed`, with settings `dqn`.
    pub fn new(obs_dim: usize, actions: usize, seed: u64, dqn: DqnConfig) -> Self {
        Self {
            obs_dim,
            actions,
            seed,
            dqn,
        }
    }

    /// Checks the shape and the settings; the error says which value and why.
    pub fn validate(&self) -> Result<(), crate::DqnError> {
        if self.obs_dim == 0 || self.actions < 2 {
            return Err(crate::DqnError::Config(format!(
                "obs_dim must be >= 1 and actions >= 2 (got {} and {})",
                self.obs_dim, self.actions
            )));
        }
        self.dqn.validate()
    }

    /// The fields that fix the network's shape: a checkpoint only loads into the same ones.
    pub fn architecture(&self) -> (usize, usize, &[usize], Activation, bool, bool) {
        (
            self.obs_dim,
            self.actions,
            &self.dqn.hidden,
            self.dqn.activation,
            self.dqn.dueling,
            self.dqn.layer_norm,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each default is defined once: a table that names only some keys keeps the others'
    /// defaults, at every depth.
    #[test]
    fn partial_tables_keep_the_defaults_of_their_siblings() {
        for doc in [
            "",
            "[epsilon]\n",
            "hidden = [128, 128]\n",
            "[epsilon]\nend = 0.05\n",
        ] {
            let c: DqnConfig = toml::from_str(doc).unwrap_or_else(|e| panic!("{doc:?}: {e}"));
            assert_eq!(c, DqnConfig::default(), "{doc:?}");
        }
        let c: DqnConfig = toml::from_str("[prioritized]\nalpha = 0.7\n").expect("parses");
        assert_eq!(
            c.prioritized,
            Some(Prioritized {
                alpha: 0.7,
                ..Prioritized::default()
            })
        );
    }

    #[test]
    fn unknown_keys_are_refused_at_every_depth() {
        for (doc, key) in [
            ("hiden = [8]\n", "hiden"),
            ("[epsilon]\nstart = 1.0\nsteep = 5\n", "steep"),
            ("[prioritized]\nalfa = 0.5\n", "alfa"),
            (
                "[target_update]\nkind = \"soft\"\ntau = 0.1\nevery = 4\n",
                "every",
            ),
            (
                "[lr_schedule]\nkind = \"linear\"\nend_factor = 0.1\nsteps = 9\nstep = 1\n",
                "step",
            ),
            (
                "loss = { kind = \"huber\", delta = 1.0, delt = 2.0 }\n",
                "delt",
            ),
        ] {
            let e = toml::from_str::<DqnConfig>(doc).expect_err(doc).to_string();
            assert!(e.contains(key), "{doc:?}: {e}");
        }
    }
}
