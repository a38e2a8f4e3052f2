//! The agent's configuration: every hyperparameter with its default, serializable so that a
//! checkpoint can refuse weights of another architecture.

use serde::{Deserialize, Serialize};

/// Hidden-layer activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum Loss {
    /// Huber with threshold `delta` (smooth L1 for delta = 1).
    Huber {
        /// Quadratic below, linear above this |TD error|.
        delta: f32,
    },
    /// Squared error.
    Mse,
}

/// Learning-rate schedule over updates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
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

/// How the target network follows the online network.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
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
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// Straight line from start to end.
    Linear,
    /// Geometric from start to end.
    Exponential,
}

/// Epsilon-greedy exploration over environment steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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

/// Proportional prioritized replay (Schaul et al. 2016).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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

/// Everything that defines a DQN agent. Defaults: hidden 128x128 ReLU, no dueling, no layer
/// norm, double DQN, 1-step, gamma 0.99, Huber(1), grad-norm clip 10, Adam(1e-3, 0.9, 0.999,
/// 1e-8, no weight decay), constant lr, hard target copy every 1000 updates, epsilon linear
/// 1.0 -> 0.05 over 100k steps, uniform replay of 100k transitions, batch 64, seed 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DqnConfig {
    /// Observation length (input).
    pub obs_dim: usize,
    /// Number of discrete actions (output).
    pub actions: usize,
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
    /// Seed of initialization, exploration and sampling.
    pub seed: u64,
    /// Dense layers as full-f32 multiply-and-sum instead of the backend's matmul. On Hopper,
    /// burn-cuda 0.21's matmul rounds f32 operands to TF32 (about 5e-4 relative to the CPU);
    /// this path agrees with the CPU to about 1e-6, at some cost in speed. Default false.
    pub full_f32: bool,
}

impl Default for DqnConfig {
    fn default() -> Self {
        Self {
            obs_dim: 32,
            actions: 3,
            hidden: vec![128, 128],
            activation: Activation::Relu,
            dueling: false,
            layer_norm: false,
            double: true,
            n_step: 1,
            gamma: 0.99,
            loss: Loss::Huber { delta: 1.0 },
            grad_clip: Some(10.0),
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
            weight_decay: 0.0,
            lr_schedule: LrSchedule::Constant,
            target_update: TargetUpdate::Hard { every: 1000 },
            epsilon: Epsilon {
                start: 1.0,
                end: 0.05,
                steps: 100_000,
                decay: Decay::Linear,
            },
            prioritized: None,
            replay_capacity: 100_000,
            batch_size: 64,
            seed: 0,
            full_f32: false,
        }
    }
}

impl DqnConfig {
    /// Checks the values a user may have set; the error says which and why.
    pub fn validate(&self) -> Result<(), crate::DqnError> {
        let bad = |m: String| Err(crate::DqnError::Config(m));
        if self.obs_dim == 0 || self.actions < 2 {
            return bad(format!(
                "obs_dim must be >= 1 and actions >= 2 (got {} and {})",
                self.obs_dim, self.actions
            ));
        }
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
        Ok(())
    }

    /// The fields that fix the network's shape: a checkpoint only loads into the same ones.
    pub fn architecture(&self) -> (usize, usize, &[usize], Activation, bool, bool) {
        (
            self.obs_dim,
            self.actions,
            &self.hidden,
            self.activation,
            self.dueling,
            self.layer_norm,
        )
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
