//! The vectorized reference environment: N environments stepped together over shared bar data,
//! state as structure of arrays, seeded and deterministic. The GPU kernels must match it step for
//! step.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::EnvError;
use crate::exec::{Execution, SessionRule, next_entry, transition};
use crate::market::MarketData;

/// Environment settings. Defaults: one contract each way (3 actions), look-back 1 row, episodes
/// to the end of the session, reward in units of 100 currency, no risk penalty, flatten at each
/// session's close, unrealized PnL observed in units of 100 ticks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    /// Largest position in contracts; actions are targets `-max..=max` (2 max + 1 actions).
    pub max_position: u8,
    /// Feature rows in an observation (t-lookback+1 ..= t).
    pub lookback: usize,
    /// Steps after which an episode is truncated; 0 for no limit (the session end still ends it).
    pub episode_steps: u32,
    /// Reward = (PnL - penalty) / reward_scale.
    pub reward_scale: f64,
    /// Currency charged per contract held per step, in the reward only (not in PnL).
    pub risk_penalty: f64,
    /// What happens at a session's end.
    pub session_rule: SessionRule,
    /// Unrealized PnL is observed as ticks / upnl_scale.
    pub upnl_scale: f32,
}

impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            max_position: 1,
            lookback: 1,
            episode_steps: 0,
            reward_scale: 100.0,
            risk_penalty: 0.0,
            session_rule: SessionRule::FlattenAtClose,
            upnl_scale: 100.0,
        }
    }
}

impl EnvConfig {
    /// Number of discrete actions.
    pub fn actions(&self) -> usize {
        2 * usize::from(self.max_position) + 1
    }
    /// Target position of an action index: action a means `a - max_position` contracts.
    pub fn target(&self, action: u8) -> i32 {
        i32::from(action.min(2 * self.max_position)) - i32::from(self.max_position)
    }
    /// Observation length: `lookback * cols + 2`.
    ///
    /// Layout: feature rows t-lookback+1 ..= t (row-major, oldest first, clamped at row 0), then
    /// position / max_position, then unrealized PnL in ticks / upnl_scale.
    pub fn obs_dim(&self, cols: usize) -> usize {
        self.lookback * cols + 2
    }
    /// Checks the settings (also done by [`VecEnv::new`]).
    pub fn validate(&self) -> Result<(), EnvError> {
        if self.max_position == 0 || self.max_position > 100 {
            return Err(EnvError::Config(format!(
                "max_position must be 1..=100, got {}",
                self.max_position
            )));
        }
        if self.lookback == 0 {
            return Err(EnvError::Config("lookback must be at least 1".into()));
        }
        if !(self.reward_scale.is_finite() && self.reward_scale > 0.0) {
            return Err(EnvError::Config(format!(
                "reward_scale must be positive, got {}",
                self.reward_scale
            )));
        }
        Ok(())
    }
}

/// Writes the observation of (t, position, entry) into `out` (`obs_dim` floats).
pub fn observe(
    m: &MarketData,
    cfg: &EnvConfig,
    tick_size: f64,
    t: usize,
    position: i32,
    entry: f64,
    out: &mut [f32],
) {
    let cols = m.cols();
    for k in 0..cfg.lookback {
        let row = (t + k + 1).saturating_sub(cfg.lookback);
        out[k * cols..(k + 1) * cols].copy_from_slice(m.row(row));
    }
    let n = cfg.lookback * cols;
    out[n] = position as f32 / f32::from(cfg.max_position);
    let upnl_ticks = if position == 0 {
        0.0
    } else {
        (m.close()[t] - entry) * f64::from(position) / tick_size
    };
    out[n + 1] = upnl_ticks as f32 / cfg.upnl_scale;
}

/// SplitMix64's finalizer: a counter-based hash, so any (seed, env, episode) draws its numbers
/// without shared state (the GPU kernel computes the same function).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Episode start of environment `env` in its `episode`-th episode: uniform over the rows of
/// `split` that have a next row.
pub fn episode_start(seed: u64, env: u32, episode: u32, split: &Range<usize>) -> usize {
    let h = mix64(seed ^ mix64(u64::from(env) << 32 | u64::from(episode)));
    let starts = (split.len() - 1) as u64;
    split.start + (h % starts) as usize
}

/// Step outcome codes in `dones`.
pub mod done {
    /// The episode goes on.
    pub const RUNNING: u8 = 0;
    /// Flattened at a session's (or the split's) end: a true terminal state.
    pub const TERMINAL: u8 = 1;
    /// Cut by `episode_steps`: not terminal, the value of the next state still counts.
    pub const TRUNCATED: u8 = 2;
}

/// N environments over one split of shared market data.
pub struct VecEnv<'a> {
    market: &'a MarketData,
    exec: Execution,
    cfg: EnvConfig,
    split: Range<usize>,
    seed: u64,
    t: Vec<u32>,
    position: Vec<i32>,
    entry: Vec<f64>,
    steps: Vec<u32>,
    episode: Vec<u32>,
}

/// One environment's state, borrowed from the arrays.
struct Slot<'s> {
    t: &'s mut u32,
    position: &'s mut i32,
    entry: &'s mut f64,
    steps: &'s mut u32,
    episode: &'s mut u32,
}

impl<'a> VecEnv<'a> {
    /// `n` environments over rows `split` of `market`. Call [`VecEnv::reset`] before stepping.
    pub fn new(
        market: &'a MarketData,
        exec: Execution,
        cfg: EnvConfig,
        split: Range<usize>,
        n: usize,
        seed: u64,
    ) -> Result<Self, EnvError> {
        cfg.validate()?;
        if split.end > market.rows() || split.len() < 2 {
            return Err(EnvError::Config(format!(
                "split {split:?} needs at least 2 of the {} rows",
                market.rows()
            )));
        }
        if n == 0 || n > u32::MAX as usize {
            return Err(EnvError::Config(format!(
                "number of environments must be 1..2^32, got {n}"
            )));
        }
        Ok(Self {
            market,
            exec,
            cfg,
            split,
            seed,
            t: vec![0; n],
            position: vec![0; n],
            entry: vec![0.0; n],
            steps: vec![0; n],
            episode: vec![0; n],
        })
    }

    /// Number of environments.
    pub fn len(&self) -> usize {
        self.t.len()
    }
    /// Whether there are no environments (never: `new` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.t.is_empty()
    }
    /// Observation length.
    pub fn obs_dim(&self) -> usize {
        self.cfg.obs_dim(self.market.cols())
    }
    /// The configuration.
    pub fn config(&self) -> &EnvConfig {
        &self.cfg
    }
    /// Current bar of each environment, `[n]` (what replay-by-index stores).
    pub fn bar_index(&self) -> &[u32] {
        &self.t
    }
    /// Current position of each environment, `[n]`.
    pub fn positions(&self) -> &[i32] {
        &self.position
    }
    /// Entry price of each environment's position, `[n]`.
    pub fn entries(&self) -> &[f64] {
        &self.entry
    }

    /// Starts episode 0 of every environment and writes observations, `obs` is `[n * obs_dim]`.
    pub fn reset(&mut self, obs: &mut [f32]) {
        let starts: Vec<usize> = (0..self.len())
            .map(|i| episode_start(self.seed, i as u32, 0, &self.split))
            .collect();
        self.reset_to(&starts, obs)
            .expect("seeded starts are rows of the split with a next row");
    }

    /// Starts every environment's episode at a given bar (a backtest-like start, or a replay of
    /// chosen situations) instead of a seeded random one, and writes observations. `starts` is
    /// `[n]`; each must be a row of the split with a next row. Later episodes start at random.
    pub fn reset_to(&mut self, starts: &[usize], obs: &mut [f32]) -> Result<(), EnvError> {
        let dim = self.obs_dim();
        assert!(
            starts.len() == self.len() && obs.len() == self.len() * dim,
            "reset_to buffers must be [n] and [n * obs_dim]"
        );
        if let Some(bad) = starts
            .iter()
            .find(|&&t| t < self.split.start || t + 1 >= self.split.end)
        {
            return Err(EnvError::Config(format!(
                "episode start {bad} is not a row of the split {:?} with a next row",
                self.split
            )));
        }
        for (i, &t) in starts.iter().enumerate() {
            self.episode[i] = 0;
            self.t[i] = t as u32;
            self.position[i] = 0;
            self.entry[i] = 0.0;
            self.steps[i] = 0;
            observe(
                self.market,
                &self.cfg,
                self.exec.tick_size,
                t,
                0,
                0.0,
                &mut obs[i * dim..(i + 1) * dim],
            );
        }
        Ok(())
    }

    /// Steps every environment with `actions` (`[n]`, indices into `0..actions()`), writing the
    /// next observations `[n * obs_dim]`, rewards `[n]` and done codes `[n]` (see [`done`]). An
    /// environment whose episode ended is reset at once (seeded), and its observation is that of
    /// the new episode's first state.
    pub fn step(&mut self, actions: &[u8], obs: &mut [f32], rewards: &mut [f32], dones: &mut [u8]) {
        let n = self.len();
        let dim = self.obs_dim();
        assert!(
            actions.len() == n && rewards.len() == n && dones.len() == n && obs.len() == n * dim,
            "step buffers must be [n] and [n * obs_dim]"
        );
        let (market, exec, cfg, split, seed) =
            (self.market, &self.exec, &self.cfg, &self.split, self.seed);
        // Independent environments: chunks run on rayon's threads, the result is the same for
        // any split of the work.
        let chunk = n.div_ceil(rayon::current_num_threads() * 4).max(256);
        let mut work = self
            .t
            .chunks_mut(chunk)
            .zip(self.position.chunks_mut(chunk))
            .zip(self.entry.chunks_mut(chunk))
            .zip(self.steps.chunks_mut(chunk))
            .zip(self.episode.chunks_mut(chunk))
            .zip(actions.chunks(chunk))
            .zip(obs.chunks_mut(chunk * dim))
            .zip(rewards.chunks_mut(chunk))
            .zip(dones.chunks_mut(chunk))
            .enumerate()
            .peekable();
        // The calling thread steps the last chunk itself (the only one for 256 environments or
        // fewer, so that no other thread is woken at all): `rayon::scope` would leave it
        // blocked while a woken pool thread did the work.
        rayon::in_place_scope(|s| {
            while let Some((c, ((((((((t, pos), entry), steps), episode), act), ob), rew), dn))) =
                work.next()
            {
                let mut body = move || {
                    for j in 0..t.len() {
                        let slot = Slot {
                            t: &mut t[j],
                            position: &mut pos[j],
                            entry: &mut entry[j],
                            steps: &mut steps[j],
                            episode: &mut episode[j],
                        };
                        let env = (c * chunk + j) as u32;
                        let (r, d) = step_one(
                            market,
                            exec,
                            cfg,
                            split,
                            seed,
                            env,
                            slot,
                            act[j],
                            &mut ob[j * dim..(j + 1) * dim],
                        );
                        rew[j] = r;
                        dn[j] = d;
                    }
                };
                if work.peek().is_some() {
                    s.spawn(move |_| body());
                } else {
                    body();
                }
            }
        });
    }
}

#[allow(clippy::too_many_arguments)]
fn step_one(
    m: &MarketData,
    x: &Execution,
    cfg: &EnvConfig,
    split: &Range<usize>,
    seed: u64,
    env: u32,
    s: Slot<'_>,
    action: u8,
    obs: &mut [f32],
) -> (f32, u8) {
    let (t, position) = (*s.t as usize, *s.position);
    let tr = transition(
        m,
        x,
        t,
        split.end,
        cfg.session_rule,
        position,
        cfg.target(action),
    );
    let penalty = cfg.risk_penalty * f64::from(tr.position.unsigned_abs());
    let reward = ((tr.pnl() - penalty) / cfg.reward_scale) as f32;
    *s.entry = next_entry(*s.entry, position, &tr);
    *s.position = tr.position;
    *s.t = tr.next_t as u32;
    *s.steps += 1;
    let code = if tr.terminal {
        done::TERMINAL
    } else if cfg.episode_steps > 0 && *s.steps >= cfg.episode_steps {
        done::TRUNCATED
    } else {
        done::RUNNING
    };
    if code != done::RUNNING {
        *s.episode += 1;
        *s.t = episode_start(seed, env, *s.episode, split) as u32;
        *s.position = 0;
        *s.entry = 0.0;
        *s.steps = 0;
    }
    observe(
        m,
        cfg,
        x.tick_size,
        *s.t as usize,
        *s.position,
        *s.entry,
        obs,
    );
    (reward, code)
}
