//! The host engine: N reference environments (foxhunt-env's `VecEnv`) on the host, the host
//! replay (uniform or prioritized), and a burn agent on its backend.

use std::ops::Range;

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use foxhunt_dqn::explore::explore;
use foxhunt_dqn::replay::{NStep, Replay, StepEnd, Transition};
use foxhunt_dqn::{AgentConfig, Batch, DqnAgent, TrainStats, UpdateStats};
use foxhunt_env::vec_env::done;
use foxhunt_env::{EnvConfig, Execution, MarketData, VecEnv};

use super::{Engine, Timing};
use crate::TrainError;

/// What the host engine is built from.
pub(crate) struct HostSetup<'m> {
    /// The window's rows.
    pub market: &'m MarketData,
    /// Contract terms and costs.
    pub exec: Execution,
    /// The environment.
    pub env: EnvConfig,
    /// Environments stepped together.
    pub envs: usize,
    /// Rows the environments train on.
    pub split: Range<usize>,
    /// Key of the exploration draws (the run's seed).
    pub explore_seed: u64,
}

/// The host engine over one window.
pub(crate) struct HostEngine<'m, B: AutodiffBackend> {
    setup: HostSetup<'m>,
    agent: DqnAgent<B>,
    replay: Replay,
    collector: Option<Collector<'m>>,
    stats: Vec<TrainStats<B::InnerBackend>>,
}

impl<'m, B: AutodiffBackend> HostEngine<'m, B> {
    /// An engine starting from `agent` and `replay` (fresh, or read back on resume).
    pub fn new(setup: HostSetup<'m>, agent: DqnAgent<B>, replay: Replay) -> Self {
        Self {
            setup,
            agent,
            replay,
            collector: None,
            stats: Vec::new(),
        }
    }

    /// Epsilon-greedy actions for every environment: greedy from the online network, the
    /// exploration rule of `foxhunt_dqn::explore` on top.
    fn choose_actions(&self, obs: &[f32], counter: u64) -> Vec<u8> {
        let dim = self.agent.config().obs_dim;
        let n = obs.len() / dim;
        let q = self.agent.q_values(
            Tensor::<B::InnerBackend, 1>::from_floats(obs, self.agent.device()).reshape([n, dim]),
        );
        let greedy = q.argmax(1).into_data();
        let actions = self.agent.config().actions as u32;
        let epsilon = self.agent.epsilon() as f32;
        greedy
            .iter::<i64>()
            .enumerate()
            .map(|(i, g)| {
                explore(
                    self.setup.explore_seed,
                    counter,
                    i as u32,
                    epsilon,
                    g as u32,
                    actions,
                ) as u8
            })
            .collect()
    }
}

impl<B: AutodiffBackend> Engine for HostEngine<'_, B> {
    type B = B;

    fn begin_epoch(&mut self, seed: u64) -> Result<(), TrainError> {
        let s = &self.setup;
        let cfg = self.agent.config();
        self.collector = Some(Collector::new(
            s.market,
            &s.exec,
            &s.env,
            s.split.clone(),
            s.envs,
            seed,
            cfg.n_step,
            cfg.gamma,
        )?);
        Ok(())
    }

    fn collect(&mut self, counter: u64) -> Result<(), TrainError> {
        let col = self
            .collector
            .as_ref()
            .expect("begin_epoch made the environments");
        let actions = self.choose_actions(&col.obs, counter);
        let col = self.collector.as_mut().expect("made");
        col.step(&actions, &mut self.replay);
        self.agent.count_env_steps(self.setup.envs as u64);
        Ok(())
    }

    fn available(&self) -> usize {
        self.replay.len()
    }

    fn learn(&mut self) -> Result<(), TrainError> {
        let cfg = self.agent.config();
        let (batch, dim, prioritized) = (cfg.batch_size, cfg.obs_dim, cfg.prioritized.is_some());
        let hb = self.replay.sample(batch, self.agent.updates());
        let device = self.agent.device().clone();
        let s = self.agent.learn(Batch::from_host(&hb, dim, &device));
        if prioritized {
            // Prioritized replay lives on the host: its new priorities are read back every
            // update (uniform replay reads nothing).
            let td: Vec<f32> = s.td_errors.clone().into_data().iter::<f32>().collect();
            self.replay.update_priorities(&hb.slots, &td);
        }
        self.stats.push(s);
        Ok(())
    }

    fn sync_target(&mut self) -> Result<(), TrainError> {
        self.agent.sync_target();
        Ok(())
    }

    fn finish_epoch(&mut self) -> Result<Vec<UpdateStats>, TrainError> {
        self.collector = None;
        Ok(read_stats::<B>(&std::mem::take(&mut self.stats)))
    }

    fn agent(&mut self) -> Result<&DqnAgent<B>, TrainError> {
        Ok(&self.agent)
    }

    fn agent_config(&self) -> &AgentConfig {
        self.agent.config()
    }

    fn epsilon(&self) -> f64 {
        self.agent.epsilon()
    }

    fn replay_bytes(&self) -> Option<Vec<u8>> {
        Some(self.replay.to_bytes())
    }

    fn timing(&self) -> Timing {
        let device = self.agent.device().clone();
        Timing {
            sync: Box::new(move || {
                // A failed sync surfaces in the next read of a result; timing just ends here.
                let _ = B::sync(&device);
            }),
            marks: None,
        }
    }
}

/// Reads the statistics of an epoch's updates in one go.
fn read_stats<B: AutodiffBackend>(stats: &[TrainStats<B::InnerBackend>]) -> Vec<UpdateStats> {
    if stats.is_empty() {
        return Vec::new();
    }
    let col = |f: fn(&TrainStats<B::InnerBackend>) -> Tensor<B::InnerBackend, 1>| -> Vec<f32> {
        Tensor::cat(stats.iter().map(f).collect(), 0)
            .into_data()
            .iter::<f32>()
            .collect()
    };
    let (l, q, td, g) = (
        col(|s| s.loss.clone()),
        col(|s| s.mean_q.clone()),
        col(|s| s.td_abs_mean.clone()),
        col(|s| s.grad_norm.clone()),
    );
    (0..l.len())
        .map(|i| UpdateStats {
            loss: l[i],
            mean_q: q[i],
            td_abs_mean: td[i],
            grad_norm: g[i],
        })
        .collect()
}

/// The N environments of one epoch on the host and their n-step accumulators.
struct Collector<'m> {
    env: VecEnv<'m>,
    dim: usize,
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    rewards: Vec<f32>,
    dones: Vec<u8>,
    nstep: Vec<NStep>,
    out: Vec<Transition>,
}

impl<'m> Collector<'m> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        market: &'m MarketData,
        exec: &Execution,
        cfg: &EnvConfig,
        split: Range<usize>,
        n: usize,
        seed: u64,
        n_step: usize,
        gamma: f64,
    ) -> Result<Self, TrainError> {
        let mut env = VecEnv::new(market, *exec, cfg.clone(), split, n, seed)?;
        let dim = env.obs_dim();
        let mut obs = vec![0f32; n * dim];
        env.reset(&mut obs);
        Ok(Self {
            env,
            dim,
            next_obs: obs.clone(),
            obs,
            rewards: vec![0.0; n],
            dones: vec![0; n],
            nstep: (0..n).map(|_| NStep::new(n_step, gamma)).collect(),
            out: Vec::new(),
        })
    }

    /// Steps every environment and writes the completed n-step transitions to `replay`.
    fn step(&mut self, actions: &[u8], replay: &mut Replay) {
        self.env.step(
            actions,
            &mut self.next_obs,
            &mut self.rewards,
            &mut self.dones,
        );
        let dim = self.dim;
        for (i, acc) in self.nstep.iter_mut().enumerate() {
            let end = match self.dones[i] {
                done::TERMINAL => StepEnd::Terminal,
                done::TRUNCATED => StepEnd::Truncated,
                _ => StepEnd::Running,
            };
            acc.push(
                &self.obs[i * dim..(i + 1) * dim],
                actions[i],
                self.rewards[i],
                &self.next_obs[i * dim..(i + 1) * dim],
                end,
                &mut self.out,
            );
        }
        for t in self.out.drain(..) {
            replay.push(t);
        }
        std::mem::swap(&mut self.obs, &mut self.next_obs);
    }
}
