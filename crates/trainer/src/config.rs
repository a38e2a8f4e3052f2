//! What a training run is configured by: the loop's own settings, the environment, costs and
//! the agent, with documented defaults, readable from a TOML file and overridable by flags.

use foxhunt_dqn::{AgentConfig, DqnConfig};
use foxhunt_env::{Costs, EnvConfig};
use serde::{Deserialize, Serialize};

use crate::TrainError;
use crate::population::{Select, Sweep};

/// Where to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The CPU (burn NdArray, rayon environments).
    Cpu,
    /// An NVIDIA GPU; an error when none can be used.
    Cuda,
    /// The GPU when one can be used, else the CPU (saying why).
    #[default]
    Auto,
}

/// How the device engine runs an epoch's step loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum StepLoop {
    /// Several kernel launches per step (acting, environment step, sampling, about forty for
    /// the update).
    Eager,
    /// Every step of the epoch in one kernel launch where the network fits it (two copies of
    /// its weights in one block's shared memory, at most 8 hidden layers), else `eager`,
    /// saying why (docs/TRAINING.md).
    #[default]
    OneLaunch,
}

/// A training run's settings. TOML sections `[env]`, `[costs]` and `[dqn]` hold the parts; the
/// rest are top-level keys. Every default is the part's own (one definition per setting): a
/// file that names some keys of a table keeps the defaults of the others.
///
/// ```toml
/// epochs = 5
/// max_steps_per_epoch = 200
/// envs = 64
/// [dqn]
/// hidden = [128, 128]
/// lr = 0.0005
/// [dqn.target_update]
/// kind = "soft"
/// tau = 0.01
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Epochs per window (default 5).
    pub epochs: usize,
    /// Environment steps per epoch, each followed by one update once the replay is warm
    /// (default 200).
    pub max_steps_per_epoch: usize,
    /// Environments stepped together (default 64).
    pub envs: usize,
    /// Transitions the replay holds before updates begin (default 1000, at least a batch).
    pub learning_starts: usize,
    /// Write resumable state every this many epochs (default 1; 0: only after each window).
    pub checkpoint_every: usize,
    /// Device (default auto).
    pub device: DeviceChoice,
    /// How the GPU runs the step loop (default one-launch; the CPU ignores it).
    pub step_loop: StepLoop,
    /// Seed of everything random in the run (default 0).
    pub seed: u64,
    /// Capital that returns and drawdown fractions are stated on (default 100,000).
    pub capital: f64,
    /// Trading costs (default: 2.50 per side, one tick of slippage).
    pub costs: Costs,
    /// The environment (default: one contract each way, flatten at each session's close).
    pub env: EnvConfig,
    /// The agent's settings (default: foxhunt-dqn's). Observation size, actions and the agent's
    /// seed are derived per window ([`TrainConfig::agent_config`]), not set here.
    pub dqn: DqnConfig,
    /// Agents per grid point of `sweep`, seeded `seed`, `seed + 1`, ... (default 1).
    pub agents: usize,
    /// Settings each taking several values: the population is their grid times `agents`
    /// (default: none). TOML `[sweep]` with lists at the settings' keys, e.g. `dqn.lr = [1e-3,
    /// 3e-4]`.
    pub sweep: Sweep,
    /// The validation metric that picks the best (agent, epoch) of a window (default pnl).
    pub select: Select,
    /// Also test the majority vote of this many best agents on validation (default 0: none).
    pub ensemble: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 5,
            max_steps_per_epoch: 200,
            envs: 64,
            learning_starts: 1000,
            checkpoint_every: 1,
            device: DeviceChoice::Auto,
            step_loop: StepLoop::OneLaunch,
            seed: 0,
            capital: 100_000.0,
            costs: Costs::default(),
            env: EnvConfig::default(),
            dqn: DqnConfig::default(),
            agents: 1,
            sweep: Sweep::default(),
            select: Select::Pnl,
            ensemble: 0,
        }
    }
}

impl TrainConfig {
    /// Reads a TOML file over the defaults, key by key; an unknown key at any depth, or a value
    /// of the wrong type, is an error naming the file, the line and the key.
    pub fn from_toml_file(path: &std::path::Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TrainError::file(path, format!("cannot read: {e}")))?;
        toml::from_str(&text).map_err(|e| TrainError::file(path, e.to_string().trim_end()))
    }

    /// Checks the settings the loop itself owns (the environment and the agent check theirs).
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::Options(m));
        if self.epochs == 0 || self.max_steps_per_epoch == 0 || self.envs == 0 {
            return bad(format!(
                "epochs, max_steps_per_epoch and envs must be at least 1 (got {}, {}, {})",
                self.epochs, self.max_steps_per_epoch, self.envs
            ));
        }
        if !(self.capital.is_finite() && self.capital > 0.0) {
            return bad(format!("capital must be positive, got {}", self.capital));
        }
        for (name, v) in [
            ("commission", self.costs.commission),
            ("slippage_ticks", self.costs.slippage_ticks),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!("{name} must be zero or more, got {v}"));
            }
        }
        self.env.validate()?;
        // Checked here, before a run directory is made, not first when a window's agent is.
        self.dqn.validate()?;
        Ok(())
    }

    /// The agent's configuration for a window: the settings, with the sizes the environment
    /// derives from `feature_cols` and a seed per window.
    pub fn agent_config(&self, feature_cols: usize, window: usize) -> AgentConfig {
        AgentConfig::new(
            self.env.obs_dim(feature_cols),
            self.env.actions(),
            self.seed ^ (window as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            self.dqn.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_toml_example_parses_and_unknown_keys_are_refused() {
        let doc = include_str!("../../../docs/TRAINING.md");
        // The TOML block of a section of the page.
        let example = |section: &str| {
            let at = doc.find(section).expect("the section");
            let start = at + doc[at..].find("```toml\n").expect("a TOML example") + 8;
            let end = start + doc[start..].find("```").expect("closed");
            doc[start..end].to_string()
        };
        let dir = foxhunt_testkit::Scratch::new("config");
        let path = dir.join("train.toml");
        // The population's example: 4 seeds x 2 learning rates x 2 shapes.
        std::fs::write(&path, example("## A population per window")).expect("write");
        let c = TrainConfig::from_toml_file(&path).expect("the population example parses");
        let m = crate::population::members(&c).expect("a valid population");
        assert_eq!((m.len(), c.ensemble), (16, 3));
        assert_eq!(
            (m[0].cfg.dqn.hidden.clone(), m[0].cfg.dqn.lr, m[1].cfg.seed),
            (vec![64, 64], 0.001, 1)
        );
        std::fs::write(&path, example("## Options")).expect("write");
        let c = TrainConfig::from_toml_file(&path).expect("the documented example parses");
        assert_eq!((c.epochs, c.envs, c.dqn.n_step), (10, 128, 3));
        assert_eq!(c.costs.commission, 1.25);
        assert_eq!(
            c.costs.slippage_ticks, 1.0,
            "unset keys keep their defaults"
        );
        assert_eq!(c.dqn.hidden, vec![256, 256]);
        assert_eq!(
            c.dqn.target_update,
            foxhunt_dqn::config::TargetUpdate::Soft { tau: 0.005 }
        );
        std::fs::write(&path, "epochs = 3\nepocs = 4\n").expect("write");
        let e = TrainConfig::from_toml_file(&path).expect_err("typo refused");
        let msg = e.to_string();
        assert!(msg.contains("train.toml") && msg.contains("epocs"), "{msg}");
        assert!(msg.contains("line 2"), "the line is named: {msg}");
    }

    /// Each part's defaults are its own: a file that names one key of a table, or only the
    /// table, keeps the defaults of every other key, at every depth.
    #[test]
    fn a_partial_table_keeps_the_defaults_of_its_siblings() {
        for doc in [
            "",
            "[dqn]\nhidden = [128, 128]\n",
            "[dqn]\n",
            "[dqn.epsilon]\n",
            "[dqn.epsilon]\nstart = 1.0\n",
            "[env]\n",
            "[costs]\ncommission = 2.5\n",
        ] {
            let c: TrainConfig = toml::from_str(doc).unwrap_or_else(|e| panic!("{doc:?}: {e}"));
            assert_eq!(c, TrainConfig::default(), "{doc:?}");
        }
        assert_eq!(TrainConfig::default().dqn.epsilon.steps, 20_000);
    }

    #[test]
    fn the_derived_values_are_not_settings() {
        for key in ["obs_dim", "actions", "seed"] {
            let doc = format!("[dqn]\n{key} = 3\n");
            let e = toml::from_str::<TrainConfig>(&doc)
                .expect_err(key)
                .to_string();
            assert!(e.contains(key) && e.contains("unknown field"), "{e}");
        }
        let a = TrainConfig::default().agent_config(15, 2);
        assert_eq!((a.obs_dim, a.actions), (17, 3));
        assert_ne!(a.seed, TrainConfig::default().agent_config(15, 3).seed);
    }
}
