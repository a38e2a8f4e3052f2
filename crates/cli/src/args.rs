//! The command-line options (clap) of `foxhunt train` and the commands that read data: where
//! the data is and how to read it, the walk-forward windows, and every training setting as a
//! flag laid over the TOML config, key by key.
//!
//! Precedence, in one place ([`TrainFlags::apply`]): a flag given wins over the config file,
//! which wins over the defaults; each flag sets only what it names, and a flag whose value
//! could not take effect (`--huber-delta` with the MSE loss, `--lr-end-factor` with a constant
//! schedule, `--per-alpha` without prioritized replay) is an error, never ignored.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use foxhunt_data::{
    Adjustment, BarTime, FeatureConfig, Format, LoadOptions, Period, SessionCalendar,
    SymbolSelector, TrainMode, WalkForwardConfig, read::parse_time_zone,
};
use foxhunt_dqn::config::{
    Activation, Decay, Loss, LossKind, LrSchedule, LrScheduleKind, Prioritized, TargetUpdate,
};
use foxhunt_env::SessionRule;
use foxhunt_trainer::{DeviceChoice, Select, StepLoop, Sweep, TrainConfig};

/// Where the data is and how to read it. Every field changes what is read, so all of them are
/// recorded in a run's config.json (and `--resume` refuses a change).
#[derive(Debug, Clone, Args, serde::Serialize, serde::Deserialize)]
pub struct LoaderArgs {
    /// Directory of data files (or one file).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// ES.FUT for every ES outright (continuous front month), or one raw symbol such as ESZ3.
    #[arg(long)]
    pub symbol: String,
    /// File format.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub format: Format,
    /// IANA time zone of CSV/Lean timestamps that carry no offset.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// What CSV timestamps mark.
    #[arg(long, value_enum, default_value_t = BarTime::Start)]
    pub bar_time: BarTime,
    /// Bar length in seconds (turns bar-end stamps into bar-start).
    #[arg(long, default_value_t = 60)]
    pub bar_seconds: i64,
    /// Back-adjustment of the continuous series.
    #[arg(long, value_enum, default_value_t = Adjustment::Difference)]
    pub adjustment: Adjustment,
    /// Keep bars the data-quality check finds implausible (listed), instead of refusing them.
    #[arg(long)]
    pub allow_outliers: bool,
}

impl LoaderArgs {
    /// Loads the data set these options describe.
    pub fn load(&self) -> Result<foxhunt_data::Dataset> {
        let selector = SymbolSelector::parse(&self.symbol)?;
        if self.bar_seconds <= 0 {
            bail!("--bar-seconds must be positive, got {}", self.bar_seconds);
        }
        let opts = LoadOptions {
            format: self.format,
            tz: parse_time_zone(&self.tz)?,
            bar_time: self.bar_time,
            bar_seconds: self.bar_seconds,
            allow_outliers: self.allow_outliers,
        };
        let data = foxhunt_data::Dataset::load(
            &self.data_dir,
            &selector,
            &opts,
            &SessionCalendar::cme(),
            self.adjustment,
            &FeatureConfig::default(),
        )?;
        // Nothing is passed over silently: every command that reads data says what it did
        // not read, and what it read past.
        for (file, why) in &data.raw.skipped_files {
            tracing::info!("{}: not read: {why}", file.display());
        }
        for (file, note) in &data.raw.notes {
            tracing::info!("{}: {note}", file.display());
        }
        Ok(data)
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelArg {
    /// Deep Q-Network.
    Dqn,
}

/// Every training setting as a flag; a flag left out leaves the config file's value, or the
/// default (documented in [`TrainConfig`] and its parts). See [`TrainFlags::apply`].
#[derive(Debug, Clone, Default, Args)]
pub struct TrainFlags {
    /// cpu, cuda or auto [default: auto].
    #[arg(long, value_enum)]
    pub device: Option<DeviceChoice>,
    /// How the GPU runs an epoch's steps: eager or one-launch [default: one-launch].
    #[arg(long, value_enum)]
    pub step_loop: Option<StepLoop>,
    /// Epochs per window [default: 5].
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Environment steps per epoch [default: 200].
    #[arg(long)]
    pub max_steps_per_epoch: Option<usize>,
    /// Transitions per update [default: 64].
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Environments stepped together [default: 64].
    #[arg(long)]
    pub envs: Option<usize>,
    /// Transitions in the replay before updates begin [default: 1000].
    #[arg(long)]
    pub learning_starts: Option<usize>,
    /// Save resumable state every N epochs (0: after windows only) [default: 1].
    #[arg(long)]
    pub checkpoint_every: Option<usize>,
    /// Seed [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Capital that returns are stated on [default: 100000].
    #[arg(long, allow_negative_numbers = true)]
    pub capital: Option<f64>,
    /// Commission per contract per side [default: 2.5].
    #[arg(long, allow_negative_numbers = true)]
    pub commission: Option<f64>,
    /// Slippage per side in ticks [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub slippage_ticks: Option<f64>,
    /// Largest position in contracts [default: 1].
    #[arg(long)]
    pub max_position: Option<u8>,
    /// Feature rows per observation [default: 1].
    #[arg(long)]
    pub lookback: Option<usize>,
    /// Truncate episodes after N steps (0: session end only) [default: 0].
    #[arg(long)]
    pub episode_steps: Option<u32>,
    /// Reward = PnL / reward scale [default: 100].
    #[arg(long, allow_negative_numbers = true)]
    pub reward_scale: Option<f64>,
    /// Reward penalty per contract held per step [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub risk_penalty: Option<f64>,
    /// Hold positions across sessions instead of flattening at each close.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub hold_overnight: Option<bool>,
    /// Hidden layer widths, e.g. 128,128 [default: 128,128].
    #[arg(long, value_delimiter = ',')]
    pub hidden: Option<Vec<usize>>,
    /// Activation [default: relu].
    #[arg(long, value_enum)]
    pub activation: Option<Activation>,
    /// Dueling head.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub dueling: Option<bool>,
    /// Layer norm after each hidden layer.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub layer_norm: Option<bool>,
    /// Double-DQN targets (false: vanilla) [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub double: Option<bool>,
    /// n of n-step returns [default: 1].
    #[arg(long)]
    pub n_step: Option<usize>,
    /// Discount [default: 0.99].
    #[arg(long, allow_negative_numbers = true)]
    pub gamma: Option<f64>,
    /// Loss [default: huber].
    #[arg(long, value_enum)]
    pub loss: Option<LossKind>,
    /// Huber delta [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub huber_delta: Option<f32>,
    /// Gradient-norm clip (0: none) [default: 10].
    #[arg(long, allow_negative_numbers = true)]
    pub grad_clip: Option<f32>,
    /// Learning rate [default: 0.001].
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Adam beta1 [default: 0.9].
    #[arg(long, allow_negative_numbers = true)]
    pub beta1: Option<f32>,
    /// Adam beta2 [default: 0.999].
    #[arg(long, allow_negative_numbers = true)]
    pub beta2: Option<f32>,
    /// Adam epsilon [default: 1e-8].
    #[arg(long, allow_negative_numbers = true)]
    pub adam_eps: Option<f32>,
    /// Weight decay [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f32>,
    /// Learning-rate schedule [default: constant].
    #[arg(long, value_enum)]
    pub lr_schedule: Option<LrScheduleKind>,
    /// Final learning rate as a fraction of --lr, for a linear or cosine schedule
    /// [default: 0.1].
    #[arg(long, allow_negative_numbers = true)]
    pub lr_end_factor: Option<f64>,
    /// Updates over which a linear or cosine schedule decays [default: 100000].
    #[arg(long)]
    pub lr_decay_steps: Option<u64>,
    /// Hard target update every N updates [default: 1000].
    #[arg(long, conflicts_with = "tau")]
    pub target_update_every: Option<u64>,
    /// Soft (Polyak) target update with this tau.
    #[arg(long, allow_negative_numbers = true)]
    pub tau: Option<f32>,
    /// Exploration at the start [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub eps_start: Option<f64>,
    /// Exploration at the end [default: 0.05].
    #[arg(long, allow_negative_numbers = true)]
    pub eps_end: Option<f64>,
    /// Environment steps over which exploration decays [default: 20000].
    #[arg(long)]
    pub eps_steps: Option<u64>,
    /// Exploration decay [default: linear].
    #[arg(long, value_enum)]
    pub eps_decay: Option<Decay>,
    /// Proportional prioritized replay.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub prioritized: Option<bool>,
    /// Prioritized replay alpha [default: 0.6].
    #[arg(long, allow_negative_numbers = true)]
    pub per_alpha: Option<f64>,
    /// Prioritized replay initial beta [default: 0.4].
    #[arg(long, allow_negative_numbers = true)]
    pub per_beta_start: Option<f64>,
    /// Replay capacity in transitions [default: 100000].
    #[arg(long)]
    pub replay_capacity: Option<usize>,
    /// Dense layers in full f32 (no TF32 matmul on Hopper; slower).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub full_f32: Option<bool>,
    /// Agents per setting of --sweep, seeded --seed, --seed + 1, ... [default: 1].
    #[arg(long)]
    pub agents: Option<usize>,
    /// A setting (its TOML key, e.g. dqn.lr) taking several values: KEY=V1,V2,... Repeatable;
    /// the population is the grid of all swept settings times --agents.
    #[arg(long, value_name = "KEY=V1,V2,...")]
    pub sweep: Vec<String>,
    /// Validation metric that selects the agent and epoch tested [default: pnl].
    #[arg(long, value_enum)]
    pub select: Option<Select>,
    /// Also test the majority vote of the TOP best agents on validation [default: 0: none].
    #[arg(long, value_name = "TOP")]
    pub ensemble: Option<usize>,
}

impl TrainFlags {
    /// Lays the flags given over `c` (defaults and config file already in it). Each flag sets
    /// what it names and nothing else; see the module docs for the refusals.
    pub fn apply(&self, c: &mut TrainConfig) -> Result<()> {
        macro_rules! set {
            ($($flag:ident => $field:expr),* $(,)?) => {
                $(if let Some(v) = self.$flag.clone() { $field = v; })*
            };
        }
        set! {
            device => c.device,
            step_loop => c.step_loop,
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
            activation => c.dqn.activation,
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
            eps_decay => c.dqn.epsilon.decay,
            replay_capacity => c.dqn.replay_capacity,
            full_f32 => c.dqn.full_f32,
            agents => c.agents,
            select => c.select,
            ensemble => c.ensemble,
        }
        // Each --sweep replaces the config file's values of its key.
        let mut named = Vec::new();
        for text in &self.sweep {
            let (key, values) = Sweep::parse_flag(text)?;
            if named.contains(&key) {
                bail!("--sweep names {key} twice; give its values in one --sweep {key}=V1,V2,...");
            }
            named.push(key.clone());
            c.sweep.set(key, values);
        }
        if let Some(h) = self.hold_overnight {
            c.env.session_rule = if h {
                SessionRule::Hold
            } else {
                SessionRule::FlattenAtClose
            };
        }
        if let Some(g) = self.grad_clip {
            c.dqn.grad_clip = (g != 0.0).then_some(g);
        }
        c.dqn.loss = match (self.loss.unwrap_or(c.dqn.loss.kind()), c.dqn.loss) {
            (LossKind::Mse, _) if self.huber_delta.is_some() => {
                bail!(
                    "--huber-delta needs the Huber loss; the MSE loss has no delta (add --loss huber)"
                )
            }
            (LossKind::Mse, _) => Loss::Mse,
            (LossKind::Huber, current) => Loss::Huber {
                delta: self.huber_delta.unwrap_or(match current {
                    Loss::Huber { delta } => delta,
                    Loss::Mse => Loss::DEFAULT_HUBER_DELTA,
                }),
            },
        };
        let kind = self.lr_schedule.unwrap_or(c.dqn.lr_schedule.kind());
        let decay_flags = self.lr_end_factor.is_some() || self.lr_decay_steps.is_some();
        if kind == LrScheduleKind::Constant && decay_flags {
            bail!(
                "--lr-end-factor and --lr-decay-steps shape a decaying schedule; the learning rate is constant (add --lr-schedule linear or cosine)"
            );
        }
        let (end, steps) = c
            .dqn
            .lr_schedule
            .decay()
            .unwrap_or((LrSchedule::DEFAULT_END_FACTOR, LrSchedule::DEFAULT_STEPS));
        c.dqn.lr_schedule = LrSchedule::of(
            kind,
            self.lr_end_factor.unwrap_or(end),
            self.lr_decay_steps.unwrap_or(steps),
        );
        if let Some(every) = self.target_update_every {
            c.dqn.target_update = TargetUpdate::Hard { every };
        }
        if let Some(tau) = self.tau {
            c.dqn.target_update = TargetUpdate::Soft { tau };
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
                bail!(
                    "--per-alpha and --per-beta-start shape prioritized replay, which is off (add --prioritized)"
                );
            };
            if let Some(a) = self.per_alpha {
                p.alpha = a;
            }
            if let Some(b) = self.per_beta_start {
                p.beta_start = b;
            }
        }
        Ok(())
    }
}

/// Every option of `foxhunt train`.
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
    /// Continue the run in --out where it stopped (the same options again; `foxhunt resume
    /// DIR` needs none).
    #[arg(long)]
    pub resume: bool,
    /// TOML file of contract specs laid over the built-in ones.
    #[arg(long)]
    pub specs: Option<PathBuf>,
    /// How the run is carried out.
    #[command(flatten)]
    pub exec: ExecArgs,
    /// The training settings.
    #[command(flatten)]
    pub flags: TrainFlags,
}

/// How a run is carried out: where it stops, how it shows progress, which part of it this
/// process takes and on which devices. None of it changes a result, so none of it is recorded
/// (`foxhunt train` and `foxhunt resume` share them).
#[derive(Debug, Clone, Default, Args)]
pub struct ExecArgs {
    /// Stop after this many epochs (the state written; `foxhunt resume DIR` continues the run).
    #[arg(long)]
    pub stop_after_epochs: Option<usize>,
    /// No progress bars even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
    /// Train only shard K of N (window w belongs to shard w mod N) in a run directory that
    /// all N shards share [default: from SLURM_ARRAY_TASK_ID/_COUNT (or _MIN/_MAX), or
    /// JOB_COMPLETION_INDEX; else every window].
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// The number of shards of a Kubernetes Indexed Job (its completions), with
    /// JOB_COMPLETION_INDEX [default: $JOB_COMPLETIONS].
    #[arg(long, value_name = "N")]
    pub shard_count: Option<usize>,
    /// GPUs to spread the windows over, one worker each: a list (0,1,3) or `all`
    /// [default: the one --device picks].
    #[arg(long, value_name = "LIST|all")]
    pub devices: Option<String>,
    /// Workers per device (GPU, or the CPU), each training the next window.
    #[arg(long, default_value_t = 1)]
    pub workers_per_device: usize,
}

impl ExecArgs {
    /// The GPUs of `--devices`.
    pub fn devices(&self) -> Result<foxhunt_trainer::Devices> {
        use foxhunt_trainer::Devices;
        Ok(match self.devices.as_deref().map(str::trim) {
            None => Devices::One,
            Some("all") => Devices::All,
            Some(list) => Devices::List(
                list.split(',')
                    .map(|d| {
                        d.trim().parse::<usize>().map_err(|_| {
                            anyhow::anyhow!(
                                "--devices {list}: {d:?} is not a GPU index; give indices like 0,1 or `all`"
                            )
                        })
                    })
                    .collect::<Result<_>>()?,
            ),
        })
    }

    /// This process's shard: `--shard`, else the scheduler's environment, else none.
    pub fn shard(&self) -> Result<Option<foxhunt_trainer::Shard>> {
        Ok(match (&self.shard, self.shard_count) {
            (Some(_), Some(_)) => {
                bail!(
                    "--shard K/N names the count already; --shard-count goes with JOB_COMPLETION_INDEX"
                )
            }
            (Some(text), None) => Some(foxhunt_trainer::Shard::parse(text)?),
            (None, count) => {
                let found = foxhunt_trainer::Shard::from_env(|v| std::env::var(v).ok(), count)?;
                if found.is_none() && count.is_some() {
                    bail!("--shard-count is given but JOB_COMPLETION_INDEX is not set");
                }
                found
            }
        })
    }

    /// What the trainer is told for the run directory `out` (`resume`: continue it).
    pub fn options(&self, out: &Path, resume: bool) -> Result<foxhunt_trainer::RunOptions> {
        Ok(foxhunt_trainer::RunOptions {
            out: out.to_path_buf(),
            resume,
            stop_after_epochs: self.stop_after_epochs,
            progress: !self.no_progress,
            shard: self.shard()?,
            devices: self.devices()?,
            workers_per_device: self.workers_per_device,
        })
    }
}

impl TrainArgs {
    /// The training settings: the defaults, then `--config`, then the flags given.
    pub fn train_config(&self) -> Result<TrainConfig> {
        let mut c = match &self.config {
            Some(p) => TrainConfig::from_toml_file(p)?,
            None => TrainConfig::default(),
        };
        self.flags.apply(&mut c)?;
        Ok(c)
    }

    /// The run directory: --out, or a new `runs/run-<UTC time>` (created here, which reserves
    /// the name: `-2`, `-3`, ... follow when it is taken). --resume and a shard need --out.
    pub fn out_dir(&self) -> Result<PathBuf> {
        if self.out.is_none()
            && let Some(s) = self.exec.shard()?
        {
            bail!("shard {s} needs --out DIR: the run directory every shard of the run shares");
        }
        match (&self.out, self.resume) {
            (Some(p), _) => Ok(p.clone()),
            (None, true) => bail!("--resume needs --out DIR, the run directory to continue"),
            (None, false) => Ok(foxhunt_fs::create_unique_dir(
                Path::new("runs"),
                &jiff::Timestamp::now()
                    .strftime("run-%Y%m%d-%H%M%S")
                    .to_string(),
            )?),
        }
    }

    /// What a run records of these options beside the contract spec (config.json): the data
    /// source and how it is read, the windows and the training settings. Every option that
    /// changes a result lands in one of them (a test enumerates the options).
    pub fn recorded(&self) -> Result<Recorded> {
        let cfg = self.train_config()?;
        let windows = self.windows.config()?.context(
            "give the walk-forward windows, e.g. --train-months 3 --val-months 1 --test-months 1 --step-months 3",
        )?;
        Ok(Recorded {
            loader: self.loader.clone(),
            specs: self.specs.clone(),
            windows,
            cfg,
        })
    }

    /// Loads the data, plans the windows and runs the job, writing the run directory `out`.
    /// Returns the report; the summary table is the caller's to print.
    pub fn run(&self, out: &Path) -> Result<foxhunt_trainer::RunReport> {
        self.recorded()?.run(&self.exec.options(out, self.resume)?)
    }
}

/// What a run's config.json records of how it was asked for: the data and how it is read, the
/// contract specs file, the windows and the training settings. From the options of `foxhunt
/// train`, or read back from a run directory by `foxhunt resume`.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Where the data is and how it is read.
    pub loader: LoaderArgs,
    /// The contract specs file laid over the built-in specs, if any.
    pub specs: Option<PathBuf>,
    /// The walk-forward windows.
    pub windows: WalkForwardConfig,
    /// The training settings.
    pub cfg: TrainConfig,
}

impl Recorded {
    /// The data source as config.json records it.
    pub fn source(&self) -> serde_json::Value {
        serde_json::json!({
            "loader": self.loader,
            "specs": self.specs,
            "model": "dqn",
        })
    }

    /// What the run in `dir` recorded (its config.json, checked against its seal). A data
    /// directory or specs file given as a relative path is read from the current directory,
    /// as when the run started.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        if !path.exists() {
            bail!(
                "{}: not a foxhunt run directory (no config.json)",
                dir.display()
            );
        }
        let v: serde_json::Value = foxhunt_trainer::report::read_json(&path)?;
        /// The value at a dotted key of `v`, read back as what it records.
        fn read<T: serde::de::DeserializeOwned>(
            v: &serde_json::Value,
            path: &Path,
            key: &str,
        ) -> Result<T> {
            let at = key
                .split('.')
                .try_fold(v, |v, k| v.get(k))
                .with_context(|| format!("{}: no `{key}`", path.display()))?;
            serde_json::from_value(at.clone())
                .with_context(|| format!("{}: `{key}` cannot be read back", path.display()))
        }
        let model: serde_json::Value = read(&v, &path, "source.model")?;
        if model != "dqn" {
            bail!("{}: source.model is {model}, not \"dqn\"", path.display());
        }
        Ok(Self {
            loader: read(&v, &path, "source.loader")?,
            specs: read(&v, &path, "source.specs")?,
            windows: read(&v, &path, "windows")?,
            cfg: read(&v, &path, "train")?,
        })
    }

    /// Loads the data, plans the windows and runs the job as `opts` say.
    pub fn run(&self, opts: &foxhunt_trainer::RunOptions) -> Result<foxhunt_trainer::RunReport> {
        let dataset = self.loader.load()?;
        let specs = match &self.specs {
            Some(p) => foxhunt_env::SpecTable::with_overrides(p)?,
            None => foxhunt_env::SpecTable::default(),
        };
        let spec = specs.get(&dataset.series.root)?.clone();
        let job = foxhunt_trainer::Job {
            dataset: &dataset,
            spec: &spec,
            windows: &self.windows,
            cfg: &self.cfg,
            source: self.source(),
        };
        Ok(foxhunt_trainer::run(&job, opts)?)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use foxhunt_dqn::config::{Loss, LrSchedule, Prioritized, TargetUpdate};
    use foxhunt_env::SessionRule;
    use foxhunt_trainer::{DeviceChoice, TrainConfig};

    use super::TrainArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        train: TrainArgs,
    }

    /// The settings `foxhunt train` would use with config file `toml` (if any) and `flags`.
    fn settings(toml: Option<&str>, flags: &[&str]) -> anyhow::Result<TrainConfig> {
        let dir = foxhunt_testkit::Scratch::new("cli-args");
        let path = dir.join("train.toml");
        let mut argv = vec!["t", "--data-dir", "d", "--symbol", "ES.FUT"];
        let p = path.display().to_string();
        if let Some(t) = toml {
            std::fs::write(&path, t).expect("write");
            argv.extend(["--config", &p]);
        }
        argv.extend(flags);
        Cli::try_parse_from(argv)?.train.train_config()
    }

    fn ok(toml: Option<&str>, flags: &[&str]) -> TrainConfig {
        settings(toml, flags).unwrap_or_else(|e| panic!("{toml:?} {flags:?}: {e:#}"))
    }

    fn refused(toml: Option<&str>, flags: &[&str], names: &str) {
        let e = format!("{:#}", settings(toml, flags).expect_err("refused"));
        assert!(e.contains(names), "{toml:?} {flags:?}: {e}");
    }

    /// Every option of `foxhunt train` either lands in what a run records (config.json:
    /// source, windows, settings), so that `--resume` refuses a change, or is named here as one
    /// that changes no result. A new option fails this test until it is one or the other.
    #[test]
    fn every_option_that_changes_a_result_is_recorded() {
        use clap::CommandFactory;
        let base = [
            "t",
            "--data-dir",
            "d",
            "--symbol",
            "ES.FUT",
            "--train-months",
            "3",
            "--val-months",
            "1",
            "--test-months",
            "1",
            "--step-months",
            "1",
        ];
        let recorded = |extra: &[&str]| {
            let mut argv = base.to_vec();
            argv.extend(extra);
            let args = Cli::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{extra:?}: {e}"))
                .train;
            let r = args
                .recorded()
                .unwrap_or_else(|e| panic!("{extra:?}: {e:#}"));
            serde_json::json!({"source": r.source(), "windows": r.windows, "train": r.cfg})
        };
        // Options that change no result: where the run goes, how it is shown, when it stops,
        // and --model (one value); --config's contents are recorded as the settings it sets.
        let unrecorded = [
            "out",
            "resume",
            "stop_after_epochs",
            "no_progress",
            "model",
            "config",
            "help",
            // A sharded run's results equal the unsharded run's, and a run on several workers
            // a one-worker run's (tested).
            "shard",
            "shard_count",
            "devices",
            "workers_per_device",
        ];
        let changed: &[(&str, &[&str])] = &[
            ("data_dir", &["--data-dir", "elsewhere"]),
            ("symbol", &["--symbol", "NQ.FUT"]),
            ("format", &["--format", "csv"]),
            ("tz", &["--tz", "America/Chicago"]),
            ("bar_time", &["--bar-time", "end"]),
            ("bar_seconds", &["--bar-seconds", "300"]),
            ("adjustment", &["--adjustment", "ratio"]),
            ("allow_outliers", &["--allow-outliers"]),
            ("specs", &["--specs", "specs.toml"]),
            ("train_months", &["--train-months", "4"]),
            ("train_weeks", &["!--train-months", "--train-weeks", "5"]),
            ("train_days", &["!--train-months", "--train-days", "5"]),
            ("val_months", &["--val-months", "2"]),
            ("val_weeks", &["!--val-months", "--val-weeks", "2"]),
            ("val_days", &["!--val-months", "--val-days", "2"]),
            ("test_months", &["--test-months", "2"]),
            ("test_weeks", &["!--test-months", "--test-weeks", "2"]),
            ("test_days", &["!--test-months", "--test-days", "2"]),
            ("step_months", &["--step-months", "2"]),
            ("step_weeks", &["!--step-months", "--step-weeks", "2"]),
            ("step_days", &["!--step-months", "--step-days", "2"]),
            ("gap_days", &["--gap-days", "2"]),
            ("anchored", &["--anchored"]),
            ("min_bars", &["--min-bars", "7"]),
            ("device", &["--device", "cpu"]),
            ("step_loop", &["--step-loop", "eager"]),
            ("epochs", &["--epochs", "2"]),
            ("max_steps_per_epoch", &["--max-steps-per-epoch", "3"]),
            ("batch_size", &["--batch-size", "3"]),
            ("envs", &["--envs", "3"]),
            ("learning_starts", &["--learning-starts", "3"]),
            ("checkpoint_every", &["--checkpoint-every", "3"]),
            ("seed", &["--seed", "3"]),
            ("capital", &["--capital", "3"]),
            ("commission", &["--commission", "3"]),
            ("slippage_ticks", &["--slippage-ticks", "3"]),
            ("max_position", &["--max-position", "3"]),
            ("lookback", &["--lookback", "3"]),
            ("episode_steps", &["--episode-steps", "3"]),
            ("reward_scale", &["--reward-scale", "3"]),
            ("risk_penalty", &["--risk-penalty", "3"]),
            ("hold_overnight", &["--hold-overnight"]),
            ("hidden", &["--hidden", "3"]),
            ("activation", &["--activation", "tanh"]),
            ("dueling", &["--dueling", "true"]),
            ("layer_norm", &["--layer-norm", "true"]),
            ("double", &["--double", "false"]),
            ("n_step", &["--n-step", "2"]),
            ("gamma", &["--gamma", "0.5"]),
            ("loss", &["--loss", "mse"]),
            ("huber_delta", &["--huber-delta", "3"]),
            ("grad_clip", &["--grad-clip", "3"]),
            ("lr", &["--lr", "0.5"]),
            ("beta1", &["--beta1", "0.5"]),
            ("beta2", &["--beta2", "0.5"]),
            ("adam_eps", &["--adam-eps", "0.5"]),
            ("weight_decay", &["--weight-decay", "0.5"]),
            ("lr_schedule", &["--lr-schedule", "cosine"]),
            (
                "lr_end_factor",
                &["--lr-schedule", "linear", "--lr-end-factor", "0.5"],
            ),
            (
                "lr_decay_steps",
                &["--lr-schedule", "linear", "--lr-decay-steps", "5"],
            ),
            ("target_update_every", &["--target-update-every", "5"]),
            ("tau", &["--tau", "0.5"]),
            ("eps_start", &["--eps-start", "0.5"]),
            ("eps_end", &["--eps-end", "0.5"]),
            ("eps_steps", &["--eps-steps", "5"]),
            ("eps_decay", &["--eps-decay", "exponential"]),
            ("prioritized", &["--prioritized"]),
            ("per_alpha", &["--prioritized", "--per-alpha", "0.5"]),
            (
                "per_beta_start",
                &["--prioritized", "--per-beta-start", "0.5"],
            ),
            ("replay_capacity", &["--replay-capacity", "500"]),
            ("full_f32", &["--full-f32"]),
            ("agents", &["--agents", "2"]),
            ("sweep", &["--sweep", "dqn.lr=0.1,0.2"]),
            ("select", &["--select", "sharpe"]),
            ("ensemble", &["--ensemble", "1"]),
        ];
        let plain = recorded(&[]);
        let cmd = Cli::command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if unrecorded.contains(&id) {
                continue;
            }
            let Some((_, extra)) = changed.iter().find(|(name, _)| *name == id) else {
                panic!("--{id} is new: record it in config.json or name it as changing no result");
            };
            // A flag of the base given again replaces the base's; "!--flag" drops it alone.
            let mut argv: Vec<&str> = base.to_vec();
            for flag in extra
                .iter()
                .filter(|a| a.starts_with("--") || a.starts_with("!"))
            {
                let flag = flag.trim_start_matches('!');
                if let Some(at) = argv.iter().position(|x| *x == flag) {
                    argv.drain(at..at + 2);
                }
            }
            argv.extend(extra.iter().filter(|a| !a.starts_with('!')));
            let args = Cli::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
                .train;
            let r = args
                .recorded()
                .unwrap_or_else(|e| panic!("{argv:?}: {e:#}"));
            let got =
                serde_json::json!({"source": r.source(), "windows": r.windows, "train": r.cfg});
            assert_ne!(
                got, plain,
                "--{id} ({argv:?}) is not recorded in config.json"
            );
        }
        // The recorded JSON holds the loader's reading options by name.
        let r = recorded(&[
            "--tz",
            "America/Chicago",
            "--bar-time",
            "end",
            "--bar-seconds",
            "300",
        ]);
        assert_eq!(r["source"]["loader"]["tz"], "America/Chicago");
        assert_eq!(r["source"]["loader"]["bar_time"], "end");
        assert_eq!(r["source"]["loader"]["bar_seconds"], 300);
    }

    #[test]
    fn defaults_then_file_then_flags_key_by_key() {
        assert_eq!(ok(None, &[]), TrainConfig::default());
        let file = "epochs = 9\nenvs = 16\n[dqn]\nlr = 0.01\n";
        let c = ok(Some(file), &[]);
        assert_eq!((c.epochs, c.envs, c.dqn.lr), (9, 16, 0.01));
        assert_eq!(
            c.max_steps_per_epoch,
            TrainConfig::default().max_steps_per_epoch
        );
        let c = ok(Some(file), &["--epochs", "3", "--lr", "0.5"]);
        assert_eq!((c.epochs, c.envs, c.dqn.lr), (3, 16, 0.5));
        // A flag given alone takes effect.
        assert_eq!(ok(None, &["--eps-steps", "7"]).dqn.epsilon.steps, 7);
        // A table naming one key keeps the defaults of the others, at every depth.
        let c = ok(Some("[dqn]\nhidden = [128, 128]\n"), &[]);
        assert_eq!(c, TrainConfig::default());
        let c = ok(Some("[dqn.epsilon]\nend = 0.2\n"), &["--eps-start", "0.5"]);
        assert_eq!(
            (c.dqn.epsilon.start, c.dqn.epsilon.end, c.dqn.epsilon.steps),
            (0.5, 0.2, 20_000)
        );
        let c = ok(Some("device = \"cpu\"\n"), &["--device", "cuda"]);
        assert_eq!(c.device, DeviceChoice::Cuda);
        assert_eq!(
            ok(Some("device = \"cpu\"\n"), &[]).device,
            DeviceChoice::Cpu
        );
    }

    #[test]
    fn flags_with_a_meaning_of_their_own() {
        assert_eq!(ok(None, &["--grad-clip", "0"]).dqn.grad_clip, None);
        assert_eq!(ok(None, &["--grad-clip", "2"]).dqn.grad_clip, Some(2.0));
        assert_eq!(
            ok(None, &["--hold-overnight"]).env.session_rule,
            SessionRule::Hold
        );
        let file = "[env]\nsession_rule = \"hold\"\n";
        assert_eq!(
            ok(Some(file), &["--hold-overnight", "false"])
                .env
                .session_rule,
            SessionRule::FlattenAtClose
        );
        assert_eq!(ok(None, &["--hidden", "32,16"]).dqn.hidden, vec![32, 16]);
    }

    #[test]
    fn the_loss_and_its_delta() {
        let huber2 = "[dqn]\nloss = { kind = \"huber\", delta = 2.0 }\n";
        let mse = "[dqn.loss]\nkind = \"mse\"\n";
        assert_eq!(ok(Some(huber2), &[]).dqn.loss, Loss::Huber { delta: 2.0 });
        // The delta alone changes the file's Huber loss.
        assert_eq!(
            ok(Some(huber2), &["--huber-delta", "3"]).dqn.loss,
            Loss::Huber { delta: 3.0 }
        );
        assert_eq!(
            ok(None, &["--huber-delta", "3"]).dqn.loss,
            Loss::Huber { delta: 3.0 }
        );
        assert_eq!(ok(Some(huber2), &["--loss", "mse"]).dqn.loss, Loss::Mse);
        assert_eq!(
            ok(Some(mse), &["--loss", "huber"]).dqn.loss,
            Loss::Huber { delta: 1.0 }
        );
        refused(
            Some(mse),
            &["--huber-delta", "3"],
            "--huber-delta needs the Huber loss",
        );
        refused(
            None,
            &["--loss", "mse", "--huber-delta", "3"],
            "--huber-delta",
        );
    }

    #[test]
    fn the_learning_rate_schedule_and_its_shape() {
        let linear = "[dqn.lr_schedule]\nkind = \"linear\"\nend_factor = 0.2\nsteps = 500\n";
        let cosine = "[dqn.lr_schedule]\nkind = \"cosine\"\nmin_factor = 0.3\nsteps = 100\n";
        // Given alone, the end factor or the steps change the file's schedule.
        assert_eq!(
            ok(Some(linear), &["--lr-end-factor", "0.5"])
                .dqn
                .lr_schedule,
            LrSchedule::Linear {
                end_factor: 0.5,
                steps: 500
            }
        );
        assert_eq!(
            ok(Some(cosine), &["--lr-decay-steps", "7"]).dqn.lr_schedule,
            LrSchedule::Cosine {
                min_factor: 0.3,
                steps: 7
            }
        );
        // A new kind keeps the file's shape, or takes the default one.
        assert_eq!(
            ok(Some(cosine), &["--lr-schedule", "linear"])
                .dqn
                .lr_schedule,
            LrSchedule::Linear {
                end_factor: 0.3,
                steps: 100
            }
        );
        assert_eq!(
            ok(
                None,
                &["--lr-schedule", "cosine", "--lr-end-factor", "0.05"]
            )
            .dqn
            .lr_schedule,
            LrSchedule::Cosine {
                min_factor: 0.05,
                steps: LrSchedule::DEFAULT_STEPS
            }
        );
        assert_eq!(
            ok(Some(linear), &["--lr-schedule", "constant"])
                .dqn
                .lr_schedule,
            LrSchedule::Constant
        );
        // A shape for a constant rate is refused, not ignored.
        refused(
            None,
            &["--lr-end-factor", "0.5"],
            "--lr-schedule linear or cosine",
        );
        refused(
            Some(linear),
            &["--lr-schedule", "constant", "--lr-decay-steps", "9"],
            "constant",
        );
    }

    #[test]
    fn target_updates_and_prioritized_replay() {
        let soft = "[dqn.target_update]\nkind = \"soft\"\ntau = 0.01\n";
        assert_eq!(
            ok(Some(soft), &["--target-update-every", "50"])
                .dqn
                .target_update,
            TargetUpdate::Hard { every: 50 }
        );
        assert_eq!(
            ok(None, &["--tau", "0.2"]).dqn.target_update,
            TargetUpdate::Soft { tau: 0.2 }
        );
        assert_eq!(
            ok(Some(soft), &[]).dqn.target_update,
            TargetUpdate::Soft { tau: 0.01 }
        );
        refused(
            None,
            &["--tau", "0.2", "--target-update-every", "5"],
            "cannot be used",
        );
        let per = "[dqn.prioritized]\nalpha = 0.5\n";
        assert_eq!(
            ok(Some(per), &["--per-beta-start", "0.6"]).dqn.prioritized,
            Some(Prioritized {
                alpha: 0.5,
                beta_start: 0.6,
                ..Prioritized::default()
            })
        );
        assert_eq!(
            ok(Some(per), &["--prioritized", "false"]).dqn.prioritized,
            None
        );
        assert_eq!(
            ok(None, &["--prioritized", "--per-alpha", "0.9"])
                .dqn
                .prioritized,
            Some(Prioritized {
                alpha: 0.9,
                ..Prioritized::default()
            })
        );
        refused(None, &["--per-alpha", "0.7"], "add --prioritized");
    }

    #[test]
    fn a_bad_config_file_names_the_file_the_line_and_the_key() {
        refused(
            Some("epochs = 3\n[dqn.epsilon]\nstart = 1.0\nsteep = 5\n"),
            &[],
            "train.toml",
        );
        let e = format!(
            "{:#}",
            settings(
                Some("epochs = 3\n[dqn.epsilon]\nstart = 1.0\nsteep = 5\n"),
                &[]
            )
            .expect_err("unknown key")
        );
        assert!(e.contains("line 4") && e.contains("steep"), "{e}");
    }
}
