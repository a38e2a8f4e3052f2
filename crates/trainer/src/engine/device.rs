//! The device engine (feature `cuda`): the window's data in a device arena (one upload), N
//! environments stepped by foxhunt-memory's kernel, transitions written by that kernel into the
//! device replay ring and sampled there with Philox, and the agent acting and learning in
//! foxhunt-dqn's fused engine. Nothing crosses to the host within an epoch: observations,
//! actions, batches and statistics stay on the device; the statistics and the weights are read
//! once, at the end of the epoch.
//!
//! Between epochs the learning state lives in a burn agent on the CPU backend: it is what
//! evaluation and checkpoints read, and the CPU backend reads it fastest (no device round trip
//! per tensor). The engine fixes that choice in its type.

use std::ops::Range;
use std::sync::Arc;

use foxhunt_dqn::config::{Loss, TargetUpdate};
use foxhunt_dqn::fused::{
    FusedDqn, LentState, TargetStep, activation_code, device_eval_unsupported, layout_words,
    update_terms,
};
use foxhunt_dqn::{AgentConfig, CpuBackend, DqnAgent, Snapshot, UpdateStats};
use foxhunt_env::{EnvConfig, Metrics};
use foxhunt_gpu::{DeviceBatch, DeviceBuffer, EventMarks, GpuContext};
use foxhunt_memory::{
    DeviceEvaluator, DevicePool, DeviceReplay, EpochKernel, EpochMeeting, EpochMember, GpuArena,
    GpuVecEnv, LearnRule, LearnerBuffers, NetOnDevice, NetShape, PlannedStep, SampleSpec, Seat,
    TargetSync, epoch_unsupported, unsupported_env,
};

use super::{Engine, EpochPlan, EvalData, Judged, Timing, eager_steps};
use crate::phase::{DeviceMarks, Phase, PhaseClock};
use crate::{StepLoop, TrainError};

/// The device side of a run: its context and the pool of window buffers, reused from window to
/// window.
pub(crate) struct GpuRun {
    pub pool: DevicePool,
}

impl GpuRun {
    pub fn new(ctx: &Arc<GpuContext>) -> Self {
        Self {
            pool: DevicePool::new(ctx),
        }
    }
}

/// The device engine over one window resident in `arena`.
pub(crate) struct DeviceEngine<'a, 'p> {
    arena: &'a GpuArena<'p>,
    /// Whose stream the engine's work is queued on.
    ctx: Arc<GpuContext>,
    agent: DqnAgent<CpuBackend>,
    fused: FusedDqn,
    ring: DeviceReplay,
    batch: DeviceBatch,
    envs: Option<GpuVecEnv<'a>>,
    actions: DeviceBuffer<u8>,
    env: EnvConfig,
    split: Range<usize>,
    n_env: usize,
    explore_seed: u64,
    /// Greedy evaluation on the device, where it can decide exactly as the host.
    eval: Option<DeviceEval<'a>>,
    /// The one-launch epoch, where the network fits it and the run asks for it.
    one_launch: Option<OneLaunch>,
    /// Its seat at the population's meeting point, where this engine is a member of one whose
    /// members' epochs launch together.
    seat: Option<Seat<'a, 'a>>,
    /// Whether `fused` has learned since `agent` last took its weights.
    agent_behind: bool,
}

/// The one-launch epoch's kernel, its constants, and the plan's buffer (reused epoch to epoch).
struct OneLaunch {
    kernel: EpochKernel,
    rule: LearnRule,
    plan: Vec<PlannedStep>,
}

/// The device's greedy evaluation: the evaluator, the network's widest row, and a buffer for a
/// kept agent's parameters.
struct DeviceEval<'a> {
    evaluator: DeviceEvaluator<'a>,
    max_width: usize,
    kept: DeviceBuffer<f32>,
}

impl<'a, 'p> DeviceEngine<'a, 'p> {
    /// An engine over `arena` starting from `agent`'s state, queuing its work on the stream
    /// of `ctx` (the arena's own, or a worker's of the same device: see [`GpuArena::on`]);
    /// `max_updates` is the most updates an epoch makes (their statistics stay on the device
    /// until it ends); `session` is the window's session index per row; `step_loop` how
    /// epochs run; `meeting`, for a member of a population, where its one-launch epochs meet
    /// the other members'.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        arena: &'a GpuArena<'p>,
        ctx: &Arc<GpuContext>,
        agent: DqnAgent<CpuBackend>,
        env: &EnvConfig,
        split: Range<usize>,
        n_env: usize,
        explore_seed: u64,
        max_updates: usize,
        session: &[u32],
        step_loop: StepLoop,
        meeting: Option<&'a EpochMeeting<'a>>,
    ) -> Result<Self, TrainError> {
        let ctx = ctx.clone();
        let dqn = agent.config().clone();
        let eval = match device_eval_unsupported(&dqn).or_else(|| unsupported_env(env)) {
            Some(why) => {
                tracing::info!(
                    "greedy evaluation on the host: the device cannot decide exactly as the host with {why}"
                );
                None
            }
            None => Some(DeviceEval {
                evaluator: DeviceEvaluator::new(arena.on(&ctx), env, session)?,
                max_width: layout_words(&dqn).1,
                kept: ctx.alloc(agent.num_params())?,
            }),
        };
        let rows = (dqn.replay_capacity / n_env).max(dqn.n_step + 2);
        let ring = DeviceReplay::new(&ctx, n_env, rows)?;
        let batch = DeviceBatch::new(&ctx, dqn.batch_size, dqn.obs_dim)?;
        let fused = FusedDqn::new(&ctx, &dqn, &agent.export_state(), max_updates)?;
        let one_launch = match step_loop {
            StepLoop::Eager => None,
            StepLoop::OneLaunch => {
                let shape = net_shape(&dqn, fused.num_params());
                match epoch_unsupported(&ctx, &shape)? {
                    Some(why) => {
                        tracing::info!("eager step loop: the one-launch epoch cannot take {why}");
                        None
                    }
                    None => Some(OneLaunch {
                        kernel: EpochKernel::new(&ctx, shape, n_env, dqn.batch_size, max_updates)?,
                        rule: learn_rule(&dqn, explore_seed),
                        plan: Vec::with_capacity(max_updates),
                    }),
                }
            }
        };
        Ok(Self {
            arena,
            ctx: ctx.clone(),
            agent,
            fused,
            ring,
            batch,
            envs: None,
            actions: ctx.alloc(n_env)?,
            env: env.clone(),
            split,
            n_env,
            explore_seed,
            eval,
            seat: one_launch.as_ref().and(meeting).map(EpochMeeting::join),
            one_launch,
            agent_behind: false,
        })
    }
}

/// Parameters `params` of the fused engine's network as the device's evaluation reads them.
fn net_on_device<'b>(
    params: &'b DeviceBuffer<f32>,
    fused: &'b FusedDqn,
    cfg: &AgentConfig,
    max_width: usize,
) -> NetOnDevice<'b> {
    NetOnDevice {
        params,
        layout: fused.layout_words(),
        obs_dim: cfg.obs_dim,
        max_width,
        first_width: cfg.first_width(),
    }
}

/// The network's shape as the one-launch epoch sizes it.
pub fn net_shape(cfg: &AgentConfig, params: usize) -> NetShape {
    NetShape {
        params,
        obs_dim: cfg.obs_dim,
        actions: cfg.actions,
        hidden: cfg.hidden.clone(),
        layer_norm: cfg.layer_norm,
    }
}

/// The fused engine's buffers lent to the one-launch epoch, and the first statistics row its
/// updates write.
pub fn learner_buffers(lent: LentState<'_>) -> (LearnerBuffers<'_>, usize) {
    (
        LearnerBuffers {
            online: lent.online,
            target: lent.target,
            moment_1: lent.moment_1,
            moment_2: lent.moment_2,
            stats: lent.stats,
            layout: lent.layout,
        },
        lent.first_stat,
    )
}

/// The agent's learning rule as the one-launch epoch takes it (replay draws seeded by the
/// agent's seed, exploration by `explore_seed`).
pub fn learn_rule(cfg: &AgentConfig, explore_seed: u64) -> LearnRule {
    LearnRule {
        activation: activation_code(cfg.activation),
        double: cfg.double,
        huber_delta: match cfg.loss {
            Loss::Huber { delta } => Some(delta),
            Loss::Mse => None,
        },
        clip: cfg.grad_clip.unwrap_or(0.0),
        beta1: cfg.beta1,
        beta2: cfg.beta2,
        weight_decay: cfg.weight_decay,
        tau: match cfg.target_update {
            TargetUpdate::Soft { tau } => tau,
            TargetUpdate::Hard { .. } => 0.0,
        },
        n_step: cfg.n_step as u32,
        gamma: cfg.gamma as f32,
        sample_seed: cfg.seed,
        explore_seed,
    }
}

impl<'a> DeviceEngine<'a, '_> {
    /// The device's evaluator and the network `which` on the device, where the device decides
    /// exactly as the host (`None`: the host decides).
    fn device_eval(
        &mut self,
        which: Judged<'_>,
    ) -> Result<Option<(&mut DeviceEvaluator<'a>, NetOnDevice<'_>)>, TrainError> {
        let Some(DeviceEval {
            evaluator,
            max_width,
            kept,
        }) = self.eval.as_mut()
        else {
            return Ok(None);
        };
        let params = match which {
            Judged::Current => self.fused.online_params(),
            Judged::Kept(s) => {
                self.ctx.write(kept, &s.state.online)?;
                &*kept
            }
        };
        let net = net_on_device(params, &self.fused, self.agent.config(), *max_width);
        Ok(Some((evaluator, net)))
    }

    /// Judges the online network over `split` at the population's meeting, where this engine
    /// has a seat whose meeting judges networks in its environment (`None`: it judges alone).
    fn judge_at_meeting(
        &self,
        split: &Range<usize>,
        capital: f64,
    ) -> Result<Option<Metrics>, TrainError> {
        let (Some(seat), Some(eval)) = (self.seat.as_ref(), self.eval.as_ref()) else {
            return Ok(None);
        };
        if !seat.judges(&self.env) {
            return Ok(None);
        }
        let params = self.fused.online_params();
        let net = net_on_device(params, &self.fused, self.agent.config(), eval.max_width);
        Ok(Some(seat.judge(
            &self.ctx,
            &self.env,
            &net,
            split.clone(),
            capital,
        )?))
    }
    /// The one-launch epoch's plan of `plan`'s steps: what the eager loop decides step by step,
    /// decided ahead (the exploration rate before the step is counted, the learning gate on
    /// the ring's rows after the step, the update's terms), so that the device runs the epoch
    /// without the host. Counts the environment steps; returns the steps that learn.
    fn plan(&mut self, plan: &EpochPlan) -> Vec<usize> {
        let one = self.one_launch.as_mut().expect("a one-launch engine");
        let cfg = self.agent.config().clone();
        let (mut written, mut done) = (self.ring.written_rows(), self.fused.updates());
        let mut learned = Vec::new();
        one.plan.clear();
        for step in 0..plan.steps {
            let epsilon = self.agent.epsilon() as f32;
            self.agent.count_env_steps(self.n_env as u64);
            written += 1;
            let learn = self.ring.transitions_after(written, cfg.n_step) >= plan.learning_starts;
            let terms = update_terms(&cfg, done);
            one.plan.push(PlannedStep {
                act: true,
                epsilon,
                counter: plan.counter(step),
                learn,
                lr: terms.lr,
                eps_c2: terms.eps_c2,
                cf: terms.cf,
                sync: match terms.target {
                    _ if !learn => TargetSync::None,
                    TargetStep::Keep => TargetSync::None,
                    TargetStep::Copy => TargetSync::Copy,
                    TargetStep::Blend(_) => TargetSync::Blend,
                },
            });
            if learn {
                done += 1;
                learned.push(step);
            }
        }
        learned
    }

    /// Queues steps `range` of the plan as one launch: the engine's own, or, for a member of a
    /// population, the one its members' epochs meet in.
    fn launch(&mut self, range: Range<usize>) -> Result<(), TrainError> {
        let ctx = self.ctx.clone();
        let seat = self.seat.take();
        let r = self.member(range).and_then(|member| match &seat {
            Some(seat) => Ok(seat.launch(&ctx, member)?),
            None => Ok(member.run(&ctx)?),
        });
        self.seat = seat;
        r
    }

    /// Steps `range` of the plan as a member of a one-launch epoch.
    fn member(&mut self, range: Range<usize>) -> Result<EpochMember<'_, 'a>, TrainError> {
        let OneLaunch { kernel, rule, plan } =
            self.one_launch.as_mut().expect("a one-launch engine");
        let steps = &plan[range];
        let env = self
            .envs
            .as_mut()
            .expect("begin_epoch made the environments");
        let (learner, first_stat) = learner_buffers(
            self.fused
                .lend_for_updates(steps.iter().filter(|s| s.learn).count())?,
        );
        Ok(EpochMember {
            kernel,
            env,
            ring: &mut self.ring,
            batch: &mut self.batch,
            first_stat,
            learner,
            rule,
            plan: steps,
        })
    }
}

/// Queues steps `range` of each engine's plan in launches of `population` (one where their
/// one-launch epochs agree in all but their keys: foxhunt-memory's `EpochPopulation`), the
/// engines on one stream. Each engine ends as its own launch would have left it. Returns the
/// blocks each engine's member had.
#[cfg(test)]
pub(crate) fn launch_together(
    population: &mut foxhunt_memory::EpochPopulation,
    engines: &mut [&mut DeviceEngine<'_, '_>],
    range: Range<usize>,
) -> Result<Vec<u32>, TrainError> {
    let Some(ctx) = engines.first().map(|e| e.ctx.clone()) else {
        return Ok(Vec::new());
    };
    let mut members = Vec::with_capacity(engines.len());
    for e in engines.iter_mut() {
        assert!(Arc::ptr_eq(&e.ctx, &ctx), "engines of one stream");
        members.push(e.member(range.clone())?);
    }
    Ok(population.run(&ctx, &mut members)?)
}

impl Engine for DeviceEngine<'_, '_> {
    type B = CpuBackend;

    fn begin_epoch(&mut self, seed: u64) -> Result<(), TrainError> {
        match self.envs.as_mut() {
            Some(env) => env.restart(seed)?,
            None => {
                let mut env = GpuVecEnv::new(
                    self.arena.on(&self.ctx),
                    self.env.clone(),
                    self.split.clone(),
                    self.n_env,
                    seed,
                )?;
                env.reset()?;
                self.envs = Some(env);
            }
        }
        Ok(())
    }

    fn collect(&mut self, counter: u64) -> Result<(), TrainError> {
        let env = self
            .envs
            .as_mut()
            .expect("begin_epoch made the environments");
        let epsilon = self.agent.epsilon() as f32;
        self.fused.act(
            &env.obs,
            self.n_env,
            epsilon,
            self.explore_seed,
            counter,
            &mut self.actions,
        )?;
        env.step_record(&self.actions, &mut self.ring)?;
        self.agent.count_env_steps(self.n_env as u64);
        Ok(())
    }

    fn available(&self) -> usize {
        self.ring.transitions(self.agent.config().n_step)
    }

    fn run_steps(
        &mut self,
        plan: &EpochPlan,
        clock: &mut PhaseClock,
    ) -> Result<Vec<usize>, TrainError> {
        if self.one_launch.is_none() {
            return eager_steps(self, plan, clock);
        }
        let learned = self.plan(plan);
        self.launch(0..plan.steps)?;
        // The device's own timestamps of each step's phases (waits for the launch).
        let one = self.one_launch.as_ref().expect("checked above");
        let [collect, train, sync] = one.kernel.step_times(&self.ctx, plan.steps)?.phases();
        clock.record(Phase::Collect, collect);
        clock.record(Phase::Train, train);
        clock.record(Phase::Sync, sync);
        Ok(learned)
    }

    fn learn(&mut self) -> Result<(), TrainError> {
        let cfg = self.agent.config();
        let spec = SampleSpec {
            arena: self.arena,
            env: &self.env,
            n_step: cfg.n_step as u32,
            gamma: cfg.gamma as f32,
            seed: cfg.seed,
        };
        self.ring.sample(&spec, &mut self.batch)?;
        self.fused.learn(&self.batch)?;
        Ok(())
    }

    fn sync_target(&mut self) -> Result<(), TrainError> {
        Ok(self.fused.sync_target()?)
    }

    fn finish_epoch(&mut self) -> Result<Vec<UpdateStats>, TrainError> {
        // The weights stay on the device until a checkpoint or the host asks for them.
        self.agent_behind = true;
        Ok(self.fused.take_stats()?)
    }

    fn agent(&mut self) -> Result<&DqnAgent<CpuBackend>, TrainError> {
        if self.agent_behind {
            self.agent.import_state(&self.fused.state()?);
            self.agent_behind = false;
        }
        Ok(&self.agent)
    }

    fn agent_config(&self) -> &AgentConfig {
        self.agent.config()
    }

    fn epsilon(&self) -> f64 {
        self.agent.epsilon()
    }

    fn snapshot(&mut self) -> Result<Snapshot, TrainError> {
        Ok(Snapshot {
            state: self.fused.state()?,
            env_steps: self.agent.env_steps(),
        })
    }

    fn replay_bytes(&self) -> Option<Vec<u8>> {
        // The device ring is not saved: a resumed GPU run starts with an empty ring.
        None
    }

    fn uploaded_bytes(&self) -> u64 {
        self.arena.uploaded_bytes()
    }

    fn greedy_targets(
        &mut self,
        which: Judged<'_>,
        data: &EvalData<'_>,
        split: Range<usize>,
    ) -> Result<Vec<i8>, TrainError> {
        match self.device_eval(which)? {
            Some((e, net)) => Ok(e.targets(&net, split)?),
            // Not exact on the device for this network or environment: the host decides.
            None => super::host_greedy_targets(self, which, data, split),
        }
    }

    fn judge(
        &mut self,
        which: Judged<'_>,
        data: &EvalData<'_>,
        split: Range<usize>,
        capital: f64,
    ) -> Result<Metrics, TrainError> {
        // A population's validation, judged with the other members' where they meet.
        if let Judged::Current = which
            && let Some(m) = self.judge_at_meeting(&split, capital)?
        {
            return Ok(m);
        }
        match self.device_eval(which)? {
            Some((e, net)) => Ok(e.judge(&net, split, capital)?),
            None => {
                let targets = super::host_greedy_targets(self, which, data, split.clone())?;
                super::book_metrics(&targets, data, split, capital)
            }
        }
    }

    fn timing(&self) -> Timing {
        let ctx = self.ctx.clone();
        Timing {
            sync: Box::new(move || {
                // A failed sync surfaces in the next read of a result; timing just ends here.
                let _ = ctx.synchronize();
            }),
            marks: Some(Box::new(Marks(self.ctx.marks()))),
        }
    }
}

/// The stream's events as phase marks; a mark that fails loses its timing, never the work.
struct Marks(EventMarks);

impl DeviceMarks for Marks {
    fn restart(&mut self) {
        if let Err(e) = self.0.restart() {
            tracing::warn!("phase timing: {e}");
        }
    }
    fn mark(&mut self) {
        if let Err(e) = self.0.mark() {
            tracing::warn!("phase timing: {e}");
        }
    }
    fn intervals(&mut self) -> Vec<f64> {
        self.0.intervals().unwrap_or_else(|e| {
            tracing::warn!("phase timing: {e}");
            Vec::new()
        })
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
