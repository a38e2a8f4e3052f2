//! Command-line options (clap) of `foxhunt train` and its example: where the data is and how to
//! read it, the walk-forward windows, and every training setting, laid over a TOML config.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use foxhunt_data::{
    Adjustment, BarTime, FeatureConfig, Format, LoadOptions, Period, SessionCalendar,
    SymbolSelector, TrainMode, WalkForwardConfig, read::parse_time_zone,
};

use crate::TrainError;

type Result<T> = std::result::Result<T, TrainError>;

macro_rules! bail {
    ($($t:tt)*) => {
        return Err(TrainError::Options(format!($($t)*)))
    };
}

/// `--format`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// From each file's name.
    Auto,
    /// Databento DBN (.dbn, .dbn.zst).
    Dbn,
    /// CSV (.csv, .csv.gz, .csv.zst).
    Csv,
    /// QuantConnect Lean minute zips.
    Lean,
}

/// `--bar-time`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BarTimeArg {
    /// Timestamps mark the bar's open.
    Start,
    /// Timestamps mark the bar's close.
    End,
}

/// `--adjustment`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum AdjustmentArg {
    /// Raw prices.
    None,
    /// Panama: add the roll gap to earlier prices.
    Difference,
    /// Multiply earlier prices by the roll ratio.
    Ratio,
}

/// Where the data is and how to read it.
#[derive(Debug, Clone, Args)]
pub struct LoaderArgs {
    /// Directory of data files (or one file).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// ES.FUT for every ES outright (continuous front month), or one raw symbol such as ESZ3.
    #[arg(long)]
    pub symbol: String,
    /// File format.
    #[arg(long, value_enum, default_value = "auto")]
    pub format: FormatArg,
    /// IANA time zone of CSV/Lean timestamps that carry no offset.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// What CSV timestamps mark.
    #[arg(long, value_enum, default_value = "start")]
    pub bar_time: BarTimeArg,
    /// Bar length in seconds (turns bar-end stamps into bar-start).
    #[arg(long, default_value_t = 60)]
    pub bar_seconds: i64,
    /// Back-adjustment of the continuous series.
    #[arg(long, value_enum, default_value = "difference")]
    pub adjustment: AdjustmentArg,
}

impl LoaderArgs {
    /// Loads the data set these options describe.
    pub fn load(&self) -> Result<foxhunt_data::Dataset> {
        let selector = SymbolSelector::parse(&self.symbol)?;
        if self.bar_seconds <= 0 {
            bail!("--bar-seconds must be positive, got {}", self.bar_seconds);
        }
        let opts = LoadOptions {
            format: match self.format {
                FormatArg::Auto => Format::Auto,
                FormatArg::Dbn => Format::Dbn,
                FormatArg::Csv => Format::Csv,
                FormatArg::Lean => Format::Lean,
            },
            tz: parse_time_zone(&self.tz)?,
            bar_time: match self.bar_time {
                BarTimeArg::Start => BarTime::Start,
                BarTimeArg::End => BarTime::End,
            },
            bar_seconds: self.bar_seconds,
        };
        let adjustment = match self.adjustment {
            AdjustmentArg::None => Adjustment::None,
            AdjustmentArg::Difference => Adjustment::Difference,
            AdjustmentArg::Ratio => Adjustment::Ratio,
        };
        Ok(foxhunt_data::Dataset::load(
            &self.data_dir,
            &selector,
            &opts,
            &SessionCalendar::cme(),
            adjustment,
            &FeatureConfig::default(),
        )?)
    }
}

/// Walk-forward window flags: each period in months, weeks or days.
#[derive(Debug, Clone, Default, Args)]
pub struct WindowArgs {
    /// Train period in months.
    #[arg(long)]
    pub train_months: Option<u32>,
    /// Train period in weeks.
    #[arg(long)]
    pub train_weeks: Option<u32>,
    /// Train period in days.
    #[arg(long)]
    pub train_days: Option<u32>,
    /// Validation period in months.
    #[arg(long)]
    pub val_months: Option<u32>,
    /// Validation period in weeks.
    #[arg(long)]
    pub val_weeks: Option<u32>,
    /// Validation period in days.
    #[arg(long)]
    pub val_days: Option<u32>,
    /// Test period in months.
    #[arg(long)]
    pub test_months: Option<u32>,
    /// Test period in weeks.
    #[arg(long)]
    pub test_weeks: Option<u32>,
    /// Test period in days.
    #[arg(long)]
    pub test_days: Option<u32>,
    /// Step between windows in months.
    #[arg(long)]
    pub step_months: Option<u32>,
    /// Step between windows in weeks.
    #[arg(long)]
    pub step_weeks: Option<u32>,
    /// Step between windows in days.
    #[arg(long)]
    pub step_days: Option<u32>,
    /// Days left out between train and validation and between validation and test.
    #[arg(long, default_value_t = 0)]
    pub gap_days: u32,
    /// Anchored (expanding) train instead of rolling.
    #[arg(long)]
    pub anchored: bool,
    /// Minimum bars in each split; windows with fewer are reported and skipped.
    #[arg(long, default_value_t = 100)]
    pub min_bars: usize,
}

fn period(
    name: &str,
    months: Option<u32>,
    weeks: Option<u32>,
    days: Option<u32>,
) -> Result<Option<Period>> {
    Ok(match (months, weeks, days) {
        (None, None, None) => None,
        (Some(m), None, None) => Some(Period::Months(m)),
        (None, Some(w), None) => Some(Period::Weeks(w)),
        (None, None, Some(d)) => Some(Period::Days(d)),
        _ => bail!("give the {name} period once: --{name}-months, --{name}-weeks or --{name}-days"),
    })
}

impl WindowArgs {
    /// The plan's configuration, `None` when no window flag was given.
    pub fn config(&self) -> Result<Option<WalkForwardConfig>> {
        let parts = [
            period(
                "train",
                self.train_months,
                self.train_weeks,
                self.train_days,
            )?,
            period("val", self.val_months, self.val_weeks, self.val_days)?,
            period("test", self.test_months, self.test_weeks, self.test_days)?,
            period("step", self.step_months, self.step_weeks, self.step_days)?,
        ];
        match parts {
            [None, None, None, None] => Ok(None),
            [Some(train), Some(val), Some(test), Some(step)] => Ok(Some(WalkForwardConfig {
                gap: Period::Days(self.gap_days),
                mode: if self.anchored {
                    TrainMode::Anchored
                } else {
                    TrainMode::Rolling
                },
                min_bars: self.min_bars,
                ..WalkForwardConfig::new(train, val, test, step)
            })),
            _ => bail!(
                "walk-forward windows need all four periods: train, val, test and step (e.g. --train-months 3 --val-months 1 --test-months 1 --step-months 1)"
            ),
        }
    }
}

/// `--model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelArg {
    /// Deep Q-Network.
    Dqn,
}

/// `--activation`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ActivationArg {
    /// max(0, x).
    Relu,
    /// tanh.
    Tanh,
    /// GELU.
    Gelu,
}

/// `--loss`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LossArg {
    /// Huber (delta from --huber-delta).
    Huber,
    /// Squared error.
    Mse,
}

/// `--lr-schedule`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LrScheduleArg {
    /// Constant.
    Constant,
    /// Linear to lr x --lr-end-factor over --lr-decay-steps updates.
    Linear,
    /// Cosine to lr x --lr-end-factor over --lr-decay-steps updates.
    Cosine,
}

/// `--eps-decay`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DecayArg {
    /// Linear.
    Linear,
    /// Exponential.
    Exponential,
}

/// `--device`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DeviceArg {
    /// The CPU.
    Cpu,
    /// An NVIDIA GPU (an error when none can be used).
    Cuda,
    /// The GPU when one can be used, else the CPU.
    Auto,
}

/// Every option of `foxhunt train`. Settings left out come from `--config` and then from the
/// defaults documented in [`crate::TrainConfig`].
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// Data location and reading.
    #[command(flatten)]
    pub loader: LoaderArgs,
    /// Walk-forward windows.
    #[command(flatten)]
    pub windows: WindowArgs,
    /// The model (DQN).
    #[arg(long, value_enum, default_value = "dqn")]
    pub model: ModelArg,
    /// TOML file of settings (see docs/TRAINING.md); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run directory for reports, checkpoints and state [default: runs/run-<UTC time>, a new
    /// directory each run].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run in --out where it stopped.
    #[arg(long)]
    pub resume: bool,
    /// Stop after this many epochs (state written; --resume continues).
    #[arg(long)]
    pub stop_after_epochs: Option<usize>,
    /// No progress bars even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
    /// TOML file of contract specs laid over the built-in ones.
    #[arg(long)]
    pub specs: Option<PathBuf>,
    /// cpu, cuda or auto.
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Epochs per window.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Environment steps per epoch.
    #[arg(long)]
    pub max_steps_per_epoch: Option<usize>,
    /// Transitions per update.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Environments stepped together.
    #[arg(long)]
    pub envs: Option<usize>,
    /// Transitions in the replay before updates begin.
    #[arg(long)]
    pub learning_starts: Option<usize>,
    /// Save resumable state every N epochs (0: after windows only).
    #[arg(long)]
    pub checkpoint_every: Option<usize>,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Capital that returns are stated on.
    #[arg(long)]
    pub capital: Option<f64>,
    /// Commission per contract per side.
    #[arg(long)]
    pub commission: Option<f64>,
    /// Slippage per side in ticks.
    #[arg(long)]
    pub slippage_ticks: Option<f64>,
    /// Largest position in contracts.
    #[arg(long)]
    pub max_position: Option<u8>,
    /// Feature rows per observation.
    #[arg(long)]
    pub lookback: Option<usize>,
    /// Truncate episodes after N steps (0: session end only).
    #[arg(long)]
    pub episode_steps: Option<u32>,
    /// Reward = PnL / reward scale.
    #[arg(long)]
    pub reward_scale: Option<f64>,
    /// Reward penalty per contract held per step.
    #[arg(long)]
    pub risk_penalty: Option<f64>,
    /// Hold positions across sessions instead of flattening at each close.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub hold_overnight: Option<bool>,
    /// Hidden layer widths, e.g. 128,128.
    #[arg(long, value_delimiter = ',')]
    pub hidden: Option<Vec<usize>>,
    /// Activation.
    #[arg(long, value_enum)]
    pub activation: Option<ActivationArg>,
    /// Dueling head.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub dueling: Option<bool>,
    /// Layer norm after each hidden layer.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub layer_norm: Option<bool>,
    /// Double-DQN targets (false: vanilla).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub double: Option<bool>,
    /// n of n-step returns.
    #[arg(long)]
    pub n_step: Option<usize>,
    /// Discount.
    #[arg(long)]
    pub gamma: Option<f64>,
    /// Loss.
    #[arg(long, value_enum)]
    pub loss: Option<LossArg>,
    /// Huber delta.
    #[arg(long)]
    pub huber_delta: Option<f32>,
    /// Gradient-norm clip (0: none).
    #[arg(long)]
    pub grad_clip: Option<f32>,
    /// Learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Adam beta1.
    #[arg(long)]
    pub beta1: Option<f32>,
    /// Adam beta2.
    #[arg(long)]
    pub beta2: Option<f32>,
    /// Adam epsilon.
    #[arg(long)]
    pub adam_eps: Option<f32>,
    /// Weight decay.
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Learning-rate schedule.
    #[arg(long, value_enum)]
    pub lr_schedule: Option<LrScheduleArg>,
    /// Final learning rate as a fraction of --lr (linear, cosine).
    #[arg(long, default_value_t = 0.1)]
    pub lr_end_factor: f64,
    /// Updates over which the learning rate decays.
    #[arg(long, default_value_t = 100_000)]
    pub lr_decay_steps: u64,
    /// Hard target update every N updates.
    #[arg(long, conflicts_with = "tau")]
    pub target_update_every: Option<u64>,
    /// Soft (Polyak) target update with this tau.
    #[arg(long)]
    pub tau: Option<f32>,
    /// Exploration at the start.
    #[arg(long)]
    pub eps_start: Option<f64>,
    /// Exploration at the end.
    #[arg(long)]
    pub eps_end: Option<f64>,
    /// Environment steps over which exploration decays.
    #[arg(long)]
    pub eps_steps: Option<u64>,
    /// Exploration decay.
    #[arg(long, value_enum)]
    pub eps_decay: Option<DecayArg>,
    /// Proportional prioritized replay.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub prioritized: Option<bool>,
    /// Prioritized replay alpha.
    #[arg(long)]
    pub per_alpha: Option<f64>,
    /// Prioritized replay initial beta.
    #[arg(long)]
    pub per_beta_start: Option<f64>,
    /// Replay capacity in transitions.
    #[arg(long)]
    pub replay_capacity: Option<usize>,
    /// Dense layers in full f32 (no TF32 matmul on Hopper; slower).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub full_f32: Option<bool>,
}

impl TrainArgs {
    /// The training settings: defaults, then `--config`, then the flags given.
    pub fn train_config(&self) -> Result<crate::TrainConfig> {
        use foxhunt_dqn::config::{Activation, Decay, Loss, LrSchedule, Prioritized, TargetUpdate};
        let mut c = match &self.config {
            Some(p) => crate::TrainConfig::from_toml_file(p)?,
            None => crate::TrainConfig::default(),
        };
        macro_rules! set {
            ($($flag:ident => $field:expr),* $(,)?) => {
                $(if let Some(v) = self.$flag.clone() { $field = v; })*
            };
        }
        set! {
            epochs => c.epochs,
            max_steps_per_epoch => c.max_steps_per_epoch,
            batch_size => c.dqn.batch_size,
            envs => c.envs,
            learning_starts => c.learning_starts,
            checkpoint_every => c.checkpoint_every,
            seed => c.seed,
            capital => c.capital,
            commission => c.costs.commission,
            slippage_ticks => c.costs.slippage_ticks,
            max_position => c.env.max_position,
            lookback => c.env.lookback,
            episode_steps => c.env.episode_steps,
            reward_scale => c.env.reward_scale,
            risk_penalty => c.env.risk_penalty,
            hidden => c.dqn.hidden,
            dueling => c.dqn.dueling,
            layer_norm => c.dqn.layer_norm,
            double => c.dqn.double,
            n_step => c.dqn.n_step,
            gamma => c.dqn.gamma,
            lr => c.dqn.lr,
            beta1 => c.dqn.beta1,
            beta2 => c.dqn.beta2,
            adam_eps => c.dqn.adam_eps,
            weight_decay => c.dqn.weight_decay,
            eps_start => c.dqn.epsilon.start,
            eps_end => c.dqn.epsilon.end,
            eps_steps => c.dqn.epsilon.steps,
            replay_capacity => c.dqn.replay_capacity,
            full_f32 => c.dqn.full_f32,
        }
        if let Some(d) = self.device {
            c.device = match d {
                DeviceArg::Cpu => crate::DeviceChoice::Cpu,
                DeviceArg::Cuda => crate::DeviceChoice::Cuda,
                DeviceArg::Auto => crate::DeviceChoice::Auto,
            };
        }
        if let Some(h) = self.hold_overnight {
            c.env.session_rule = if h {
                foxhunt_env::SessionRule::Hold
            } else {
                foxhunt_env::SessionRule::FlattenAtClose
            };
        }
        if let Some(a) = self.activation {
            c.dqn.activation = match a {
                ActivationArg::Relu => Activation::Relu,
                ActivationArg::Tanh => Activation::Tanh,
                ActivationArg::Gelu => Activation::Gelu,
            };
        }
        match (self.loss, self.huber_delta) {
            (Some(LossArg::Mse), Some(_)) => bail!("--huber-delta needs --loss huber"),
            (Some(LossArg::Mse), None) => c.dqn.loss = Loss::Mse,
            (Some(LossArg::Huber), d) => {
                c.dqn.loss = Loss::Huber {
                    delta: d.unwrap_or(1.0),
                }
            }
            (None, Some(d)) => c.dqn.loss = Loss::Huber { delta: d },
            (None, None) => {}
        }
        if let Some(g) = self.grad_clip {
            c.dqn.grad_clip = (g > 0.0).then_some(g);
        }
        if let Some(s) = self.lr_schedule {
            c.dqn.lr_schedule = match s {
                LrScheduleArg::Constant => LrSchedule::Constant,
                LrScheduleArg::Linear => LrSchedule::Linear {
                    end_factor: self.lr_end_factor,
                    steps: self.lr_decay_steps,
                },
                LrScheduleArg::Cosine => LrSchedule::Cosine {
                    min_factor: self.lr_end_factor,
                    steps: self.lr_decay_steps,
                },
            };
        }
        if let Some(every) = self.target_update_every {
            c.dqn.target_update = TargetUpdate::Hard { every };
        }
        if let Some(tau) = self.tau {
            c.dqn.target_update = TargetUpdate::Soft { tau };
        }
        if let Some(d) = self.eps_decay {
            c.dqn.epsilon.decay = match d {
                DecayArg::Linear => Decay::Linear,
                DecayArg::Exponential => Decay::Exponential,
            };
        }
        match self.prioritized {
            Some(true) => {
                c.dqn.prioritized.get_or_insert_with(Prioritized::default);
            }
            Some(false) => c.dqn.prioritized = None,
            None => {}
        }
        if self.per_alpha.is_some() || self.per_beta_start.is_some() {
            let Some(p) = c.dqn.prioritized.as_mut() else {
                bail!("--per-alpha and --per-beta-start need --prioritized");
            };
            if let Some(a) = self.per_alpha {
                p.alpha = a;
            }
            if let Some(b) = self.per_beta_start {
                p.beta_start = b;
            }
        }
        Ok(c)
    }

    /// The run directory: --out, or a new `runs/run-<UTC time>`. --resume needs --out.
    pub fn out_dir(&self) -> Result<PathBuf> {
        match (&self.out, self.resume) {
            (Some(p), _) => Ok(p.clone()),
            (None, true) => bail!("--resume needs --out DIR, the run directory to continue"),
            (None, false) => Ok(PathBuf::from("runs").join(
                jiff::Timestamp::now()
                    .strftime("run-%Y%m%d-%H%M%S")
                    .to_string(),
            )),
        }
    }

    /// Loads the data, plans the windows and runs the job, writing the run directory `out`.
    /// Returns the report; the summary table is the caller's to print.
    pub fn run(&self, out: &std::path::Path) -> Result<crate::RunReport> {
        let cfg = self.train_config()?;
        let windows = self.windows.config()?.ok_or_else(|| {
            TrainError::Options(
                "give the walk-forward windows, e.g. --train-months 3 --val-months 1 --test-months 1 --step-months 3".into(),
            )
        })?;
        let dataset = self.loader.load()?;
        let specs = match &self.specs {
            Some(p) => foxhunt_env::SpecTable::with_overrides(p)?,
            None => foxhunt_env::SpecTable::default(),
        };
        let spec = specs.get(&dataset.series.root)?.clone();
        let job = crate::Job {
            dataset: &dataset,
            spec: &spec,
            windows: &windows,
            cfg: &cfg,
            source: serde_json::json!({
                "data_dir": self.loader.data_dir,
                "symbol": self.loader.symbol,
                "adjustment": format!("{:?}", self.loader.adjustment).to_lowercase(),
                "model": "dqn",
            }),
        };
        crate::run(
            &job,
            &crate::RunOptions {
                out: out.to_path_buf(),
                resume: self.resume,
                stop_after_epochs: self.stop_after_epochs,
                progress: !self.no_progress,
            },
        )
    }
}
