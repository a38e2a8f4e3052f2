//! The one-launch epoch against the eager step loop and the burn agent, on the device (needs the
//! `cuda` feature and FOXHUNT_GPU_TESTS=1; a no-op otherwise): with exploration only, the
//! environments, the ring and the sampled batches of both loops are equal bit for bit; one
//! launch of S steps equals S launches of one step and repeats itself; each member of a
//! population's launch equals its agent trained alone; on the same weights and batch the
//! gradients are the burn agent's, and 30 updates later so are the Q-values, for every network
//! option the kernel takes.

use std::sync::Arc;

use foxhunt_dqn::config::{Activation, Epsilon, Loss, LrSchedule, TargetUpdate};
use foxhunt_dqn::fused::FusedDqn;
use foxhunt_dqn::model::HostQNetwork;
use foxhunt_dqn::replay::HostBatch;
use foxhunt_dqn::{AgentConfig, AgentState, Batch, CpuBackend, DqnAgent, DqnConfig};
use foxhunt_env::{EnvConfig, Execution, MarketData};
use foxhunt_gpu::{DeviceBatch, GpuContext, HostBatchParts};
use foxhunt_memory::{
    DeviceEvaluator, DevicePool, EpochMeeting, EpochPopulation, GpuArena, WindowData,
};

use super::{DeviceEngine, launch_together};
use crate::StepLoop;
use crate::engine::{Engine, EpochPlan, EvalData, Judged};
use crate::phase::PhaseClock;

fn gpu() -> Option<Arc<GpuContext>> {
    foxhunt_testkit::gpu_tests()
        .then(|| GpuContext::new(0).unwrap_or_else(|e| panic!("FOXHUNT_GPU_TESTS=1 but {e}")))
}

fn es() -> (MarketData, Execution) {
    (
        foxhunt_testkit::es_market(foxhunt_testkit::es_real_rows()),
        foxhunt_testkit::es_execution(),
    )
}

/// An agent configuration for the ES window with `dqn`'s settings.
fn agent_cfg(m: &MarketData, dqn: DqnConfig) -> AgentConfig {
    let env = EnvConfig::default();
    AgentConfig::new(env.obs_dim(m.cols()), env.actions(), 11, dqn)
}

/// A device engine over the first 60% of the window, starting from `state`.
fn engine<'a, 'p>(
    arena: &'a GpuArena<'p>,
    m: &MarketData,
    cfg: &AgentConfig,
    state: &AgentState,
    n_env: usize,
    step_loop: StepLoop,
) -> DeviceEngine<'a, 'p> {
    engine_exploring(arena, m, cfg, state, n_env, step_loop, 5)
}

/// As `engine`, with exploration keyed by `explore_seed`.
fn engine_exploring<'a, 'p>(
    arena: &'a GpuArena<'p>,
    m: &MarketData,
    cfg: &AgentConfig,
    state: &AgentState,
    n_env: usize,
    step_loop: StepLoop,
    explore_seed: u64,
) -> DeviceEngine<'a, 'p> {
    engine_on(
        arena,
        arena.context(),
        m,
        cfg,
        state,
        n_env,
        step_loop,
        explore_seed,
        None,
    )
}

/// As `engine_exploring`, queuing on `ctx`'s stream and seated at `meeting`.
#[allow(clippy::too_many_arguments)]
fn engine_on<'a, 'p>(
    arena: &'a GpuArena<'p>,
    ctx: &Arc<GpuContext>,
    m: &MarketData,
    cfg: &AgentConfig,
    state: &AgentState,
    n_env: usize,
    step_loop: StepLoop,
    explore_seed: u64,
    meeting: Option<&'a EpochMeeting<'a>>,
) -> DeviceEngine<'a, 'p> {
    let mut agent = DqnAgent::<CpuBackend>::new(cfg.clone(), &Default::default()).expect("agent");
    agent.import_state(state);
    let split = 0..m.rows() * 3 / 5;
    DeviceEngine::new(
        arena,
        ctx,
        agent,
        &EnvConfig::default(),
        split,
        n_env,
        explore_seed,
        512,
        m.session(),
        step_loop,
        meeting,
    )
    .expect("engine")
}

fn clock() -> PhaseClock {
    PhaseClock::new(Box::new(|| {}), None)
}

fn plan(epoch: usize, steps: usize, learning_starts: usize) -> EpochPlan {
    EpochPlan {
        window: 0,
        epoch,
        steps,
        learning_starts,
    }
}

/// Everything an epoch leaves on the device, read back: environment state, observations,
/// rewards and done codes, the ring, the last sampled batch, the learner's state.
#[derive(Debug, PartialEq)]
struct Trace {
    env: (Vec<u32>, Vec<i32>),
    obs: Vec<f32>,
    rewards: Vec<f32>,
    dones: Vec<u8>,
    ring: foxhunt_memory::ReplayRows,
    batch: HostBatchParts,
}

fn trace(e: &DeviceEngine<'_, '_>) -> Trace {
    let env = e.envs.as_ref().expect("an epoch began");
    Trace {
        env: env.state().expect("state"),
        obs: env.download(&env.obs).expect("obs"),
        rewards: env.download(&env.rewards).expect("rewards"),
        dones: env.download(&env.dones).expect("dones"),
        ring: e.ring.download().expect("ring"),
        batch: e.batch.download(e.arena.context()).expect("batch"),
    }
}

/// The sampled batch as the burn agent takes it.
fn host_batch(p: &HostBatchParts) -> HostBatch {
    HostBatch {
        slots: Vec::new(),
        obs: p.obs.clone(),
        actions: p.actions.iter().map(|&a| i64::from(a)).collect(),
        returns: p.returns.clone(),
        next_obs: p.next_obs.clone(),
        discounts: p.discounts.clone(),
        weights: p.weights.clone(),
    }
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Q-values of the online network `params` on the first `rows` observations of `obs`, on the
/// host.
fn q_rows(cfg: &AgentConfig, params: &[f32], obs: &[f32], rows: usize) -> Vec<f32> {
    let mut net = HostQNetwork::from_flat(cfg, params);
    let mut out = vec![0f32; rows * cfg.actions];
    for r in 0..rows {
        net.forward(
            &obs[r * cfg.obs_dim..(r + 1) * cfg.obs_dim],
            &mut out[r * cfg.actions..(r + 1) * cfg.actions],
        );
    }
    out
}

#[test]
fn exploring_only_the_one_launch_epoch_steps_records_and_samples_as_the_eager_loop() {
    let Some(ctx) = gpu() else { return };
    let (m, x) = es();
    let mut pool = DevicePool::new(&ctx);
    let arena = pool
        .window(&WindowData {
            market: m.clone(),
            exec: x,
        })
        .expect("upload");
    // (environments, batch, hidden): the profile's sizes, a split of environments and rows
    // that does not divide evenly among the blocks, 4096 environments with batches of 1024,
    // and the largest batch.
    for (n_env, batch, hidden) in [
        (64, 64, vec![128, 128]),
        (100, 96, vec![32]),
        (4096, 1024, vec![128, 128]),
        (256, 4096, vec![64, 64]),
    ] {
        let cfg = agent_cfg(
            &m,
            DqnConfig {
                hidden: hidden.clone(),
                batch_size: batch,
                epsilon: Epsilon {
                    start: 1.0,
                    end: 1.0,
                    ..Epsilon::default()
                },
                ..DqnConfig::default()
            },
        );
        let state = DqnAgent::<CpuBackend>::new(cfg.clone(), &Default::default())
            .expect("agent")
            .export_state();
        let mut eager = engine(&arena, &m, &cfg, &state, n_env, StepLoop::Eager);
        let mut fused = engine(&arena, &m, &cfg, &state, n_env, StepLoop::OneLaunch);
        assert!(
            fused.one_launch.is_some(),
            "{n_env}/{batch}: the kernel takes it"
        );
        // Learning starts within the first epoch; the second starts over from a new seed with
        // the ring and the learner carried.
        let starts = batch.max(n_env * 6);
        for epoch in 0..2 {
            let p = plan(epoch, 24, starts);
            let mut learned = Vec::new();
            for e in [&mut eager, &mut fused] {
                e.begin_epoch(100 + epoch as u64).expect("begin");
                learned.push(e.run_steps(&p, &mut clock()).expect("steps"));
            }
            assert_eq!(
                learned[0], learned[1],
                "{n_env}/{batch}: the steps that learn"
            );
            assert!(!learned[0].is_empty(), "updates happened");
            let (a, b) = (trace(&eager), trace(&fused));
            assert_eq!(
                a.env, b.env,
                "{n_env}/{batch} epoch {epoch}: environment state"
            );
            assert_eq!(a.obs, b.obs, "{n_env}/{batch}: observations");
            assert_eq!(a.rewards, b.rewards, "{n_env}/{batch}: rewards");
            assert_eq!(a.dones, b.dones, "{n_env}/{batch}: done codes");
            assert_eq!(a.ring, b.ring, "{n_env}/{batch}: the ring");
            assert_eq!(a.batch, b.batch, "{n_env}/{batch}: the last sampled batch");
            let (sa, sb) = (
                eager.finish_epoch().expect("stats"),
                fused.finish_epoch().expect("stats"),
            );
            assert_eq!(sa.len(), sb.len());
            for (u, (x, y)) in sa.iter().zip(&sb).enumerate() {
                let rel = (x.loss - y.loss).abs() / x.loss.abs().max(1e-6);
                assert!(
                    rel < 1e-3,
                    "{n_env}/{batch} update {u}: loss {x:?} vs {y:?}"
                );
            }
        }
        // The learners, updated from the same batches, agree to rounding (the sums run in
        // another order).
        let (wa, wb) = (
            eager.fused.state().expect("state"),
            fused.fused.state().expect("state"),
        );
        assert_eq!(wa.updates, wb.updates);
        let d = max_abs_diff(&wa.online, &wb.online);
        assert!(
            d < 5.0 * cfg.lr as f32,
            "{n_env}/{batch}: online weights {d:.3e} apart"
        );
    }
}

#[test]
fn one_launch_equals_launches_of_one_step_and_repeats_itself() {
    let Some(ctx) = gpu() else { return };
    let (m, x) = es();
    let mut pool = DevicePool::new(&ctx);
    let arena = pool
        .window(&WindowData {
            market: m.clone(),
            exec: x,
        })
        .expect("upload");
    for dqn in [
        DqnConfig {
            hidden: vec![128, 128],
            ..DqnConfig::default()
        },
        DqnConfig {
            hidden: vec![64, 32],
            layer_norm: true,
            dueling: true,
            target_update: TargetUpdate::Soft { tau: 0.05 },
            batch_size: 200,
            ..DqnConfig::default()
        },
    ] {
        let cfg = agent_cfg(&m, dqn);
        let state = DqnAgent::<CpuBackend>::new(cfg.clone(), &Default::default())
            .expect("agent")
            .export_state();
        let n_env = 96;
        let p = plan(0, 40, cfg.batch_size.max(n_env * 8));
        // `clusters`: each launch's blocks one thread-block cluster where the device can, else
        // on the grid barrier; `adam`: Adam's operands in the blocks' shared memory where they fit,
        // else in global memory.
        let run = |by_step: bool, clusters: bool, adam: bool| {
            let mut e = engine(&arena, &m, &cfg, &state, n_env, StepLoop::OneLaunch);
            let one = e.one_launch.as_mut().expect("one launch");
            one.kernel.set_clusters(clusters);
            one.kernel.set_adam_in_shared(adam);
            assert_eq!(
                one.kernel.keeps_adam_in_shared(),
                adam,
                "these networks' slices fit beside them"
            );
            let clustered = one.kernel.runs_in_clusters(&ctx).expect("clusters");
            e.begin_epoch(7).expect("begin");
            let learned = if by_step {
                let learned = e.plan(&p);
                for s in 0..p.steps {
                    e.launch(s..s + 1).expect("launch");
                }
                learned
            } else {
                e.run_steps(&p, &mut clock()).expect("steps")
            };
            let t = trace(&e);
            let stats: Vec<[f32; 4]> = e
                .finish_epoch()
                .expect("stats")
                .iter()
                .map(|s| [s.loss, s.mean_q, s.td_abs_mean, s.grad_norm])
                .collect();
            let w = e.fused.state().expect("state");
            (learned, t, stats, w, clustered)
        };
        let once = run(false, true, true);
        assert!(
            !once.0.is_empty() && once.0.len() < p.steps,
            "warm-up, then updates"
        );
        // 16 blocks (batch 64): one cluster wherever the device launches clusters; 50 blocks
        // (batch 200): more than a cluster holds, the grid barrier.
        let one_cluster = cfg.batch_size == 64 && ctx.cluster_launch().expect("attribute");
        assert_eq!(once.4, one_cluster, "the launch's blocks in a cluster");
        let grid = run(false, false, true);
        assert!(!grid.4, "clusters turned off");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (what, other) in [
            ("steps one by one", run(true, true, true)),
            ("a second run", run(false, true, true)),
            ("grid barriers", grid),
            ("Adam's operands in global memory", run(false, true, false)),
        ] {
            assert_eq!(once.0, other.0, "{what}: the steps that learn");
            assert_eq!(once.1, other.1, "{what}: environments, ring, batch");
            assert_eq!(once.2.len(), other.2.len());
            for (a, b) in once.2.iter().zip(&other.2) {
                assert_eq!(bits(a), bits(b), "{what}: statistics");
            }
            assert_eq!(
                bits(&once.3.online),
                bits(&other.3.online),
                "{what}: online"
            );
            assert_eq!(
                bits(&once.3.target),
                bits(&other.3.target),
                "{what}: target"
            );
            assert_eq!(
                bits(&once.3.moment_1),
                bits(&other.3.moment_1),
                "{what}: m1"
            );
            assert_eq!(
                bits(&once.3.moment_2),
                bits(&other.3.moment_2),
                "{what}: m2"
            );
        }
        // Greedy acting used the weights as they moved: not a run of untouched networks.
        assert!(max_abs_diff(&once.3.online, &state.online) > 1e-4);
    }
}

/// What an epoch left, as bits: environments, ring and batch; statistics; online, target and
/// Adam's moments.
type EpochResult = (Trace, Vec<[u32; 4]>, [Vec<u32>; 4]);

fn epoch_result(e: &mut DeviceEngine<'_, '_>) -> EpochResult {
    let t = trace(e);
    let stats: Vec<[u32; 4]> = e
        .finish_epoch()
        .expect("stats")
        .iter()
        .map(|s| [s.loss, s.mean_q, s.td_abs_mean, s.grad_norm].map(f32::to_bits))
        .collect();
    let w = e.fused.state().expect("state");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    (
        t,
        stats,
        [&w.online, &w.target, &w.moment_1, &w.moment_2].map(|v| bits(v)),
    )
}

#[test]
fn members_of_one_launch_equal_their_agents_alone() {
    let Some(ctx) = gpu() else { return };
    let (m, x) = es();
    let mut pool = DevicePool::new(&ctx);
    let arena = pool
        .window(&WindowData {
            market: m.clone(),
            exec: x,
        })
        .expect("upload");
    let greedy_often = Epsilon {
        start: 0.3,
        end: 0.3,
        ..Epsilon::default()
    };
    // The profile's network (16 groups of 4 rows), and one with every option and 50 groups;
    // members with 1, a few (not dividing the groups) and as many blocks as alone.
    for (dqn, n_env) in [
        (
            DqnConfig {
                hidden: vec![128, 128],
                epsilon: greedy_often,
                ..DqnConfig::default()
            },
            64,
        ),
        (
            DqnConfig {
                hidden: vec![64, 32],
                layer_norm: true,
                dueling: true,
                target_update: TargetUpdate::Soft { tau: 0.05 },
                batch_size: 200,
                epsilon: greedy_often,
                ..DqnConfig::default()
            },
            96,
        ),
    ] {
        let env = EnvConfig::default();
        let keys = [11u64, 12, 13];
        let cfgs: Vec<AgentConfig> = keys
            .iter()
            .map(|&k| AgentConfig::new(env.obs_dim(m.cols()), env.actions(), k, dqn.clone()))
            .collect();
        let states: Vec<AgentState> = cfgs
            .iter()
            .map(|c| {
                DqnAgent::<CpuBackend>::new(c.clone(), &Default::default())
                    .expect("agent")
                    .export_state()
            })
            .collect();
        let p = plan(0, 40, cfgs[0].batch_size.max(n_env * 8));
        // The validation after the epoch: the last fifth of the window.
        let data = EvalData {
            market: &m,
            exec: &x,
            env: &env,
        };
        let val = m.rows() * 4 / 5..m.rows();
        let judge = |e: &mut DeviceEngine<'_, '_>| {
            let metrics = e
                .judge(Judged::Current, &data, val.clone(), 1e5)
                .expect("judged");
            format!("{metrics:?}")
        };
        let make = |k: usize| {
            let mut e = engine_exploring(
                &arena,
                &m,
                &cfgs[k],
                &states[k],
                n_env,
                StepLoop::OneLaunch,
                100 + keys[k],
            );
            e.begin_epoch(7 + keys[k]).expect("begin");
            e
        };
        let (alone, alone_judged): (Vec<_>, Vec<_>) = (0..keys.len())
            .map(|k| {
                let mut e = make(k);
                let learned = e.run_steps(&p, &mut clock()).expect("steps");
                assert!(!learned.is_empty(), "the epoch learns");
                let judged = judge(&mut e);
                (epoch_result(&mut e), judged)
            })
            .unzip();
        let slots = {
            let e = make(0);
            e.one_launch.as_ref().expect("one launch").kernel.blocks()
        };
        for blocks in [1, 3, slots as usize] {
            let mut engines: Vec<_> = (0..keys.len()).map(make).collect();
            let mut population = EpochPopulation::with_blocks(&ctx, blocks).expect("population");
            for e in engines.iter_mut() {
                e.plan(&p);
            }
            let mut refs: Vec<&mut DeviceEngine<'_, '_>> = engines.iter_mut().collect();
            let had = launch_together(&mut population, &mut refs, 0..p.steps).expect("launch");
            // One launch; as many blocks as asked where the device holds them for all three.
            assert!(had.iter().all(|&b| b == had[0]), "{had:?}");
            assert!(had[0] as usize <= blocks.min(slots as usize), "{had:?}");
            if blocks < 4 {
                assert_eq!(had[0] as usize, blocks);
            }
            for (k, e) in engines.iter_mut().enumerate() {
                let got = epoch_result(e);
                let what = format!("member {k} of {blocks} blocks");
                assert_eq!(got.0, alone[k].0, "{what}: environments, ring, batch");
                assert_eq!(got.1, alone[k].1, "{what}: statistics");
                for (i, name) in ["online", "target", "m1", "m2"].iter().enumerate() {
                    assert!(got.2[i] == alone[k].2[i], "{what}: {name}");
                }
            }
        }
        // Members on threads and streams of their own, seated at one meeting point before any
        // arrives: their epochs meet in one launch and their validations in one evaluation,
        // and each ends, and is judged, as alone.
        ctx.synchronize().expect("the upload is done");
        let meeting = EpochMeeting::with_evaluator(
            DeviceEvaluator::new(&arena, &env, m.session()).expect("evaluator"),
        );
        let seated = std::sync::Barrier::new(keys.len());
        let met: Vec<(EpochResult, String)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..keys.len())
                .map(|k| {
                    let (arena, m, cfgs, states) = (&arena, &m, &cfgs, &states);
                    let (meeting, seated, p, judge) = (&meeting, &seated, &p, &judge);
                    scope.spawn(move || {
                        let worker = arena.context().worker().expect("a worker's stream");
                        let mut e = engine_on(
                            arena,
                            &worker,
                            m,
                            &cfgs[k],
                            &states[k],
                            n_env,
                            StepLoop::OneLaunch,
                            100 + keys[k],
                            Some(meeting),
                        );
                        e.begin_epoch(7 + keys[k]).expect("begin");
                        seated.wait();
                        e.run_steps(p, &mut clock()).expect("steps");
                        let judged = judge(&mut e);
                        let r = epoch_result(&mut e);
                        drop(e);
                        worker.synchronize().expect("the worker's work is done");
                        (r, judged)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a member's thread"))
                .collect()
        });
        assert_eq!(
            meeting.rounds(),
            vec![keys.len()],
            "one launch for every member"
        );
        assert_eq!(
            meeting.judge_rounds(),
            vec![keys.len()],
            "one evaluation for every member"
        );
        for (k, (got, judged)) in met.iter().enumerate() {
            assert_eq!(
                *judged, alone_judged[k],
                "member {k} on its thread: validation"
            );
            assert_eq!(
                got.0, alone[k].0,
                "member {k} on its thread: environments, ring, batch"
            );
            assert_eq!(got.1, alone[k].1, "member {k} on its thread: statistics");
            assert!(
                got.2 == alone[k].2,
                "member {k} on its thread: networks and moments"
            );
        }
        // The members are different agents: equal to their own runs, not to each other's.
        assert_ne!(alone[0].2[0], alone[1].2[0]);
        assert_ne!(alone[0].0, alone[1].0);
    }
}

#[test]
fn one_launch_gradients_and_updates_follow_the_burn_agent() {
    let Some(ctx) = gpu() else { return };
    let (m, x) = es();
    let mut pool = DevicePool::new(&ctx);
    let arena = pool
        .window(&WindowData {
            market: m.clone(),
            exec: x,
        })
        .expect("upload");
    let base = DqnConfig {
        hidden: vec![64, 64],
        batch_size: 64,
        ..DqnConfig::default()
    };
    let variants = [
        (
            "default (relu, double, Huber, clip, hard target)",
            base.clone(),
        ),
        (
            "layer norm + dueling + soft target + weight decay",
            DqnConfig {
                layer_norm: true,
                dueling: true,
                target_update: TargetUpdate::Soft { tau: 0.05 },
                weight_decay: 1e-3,
                ..base.clone()
            },
        ),
        (
            "gelu + layer norm",
            DqnConfig {
                layer_norm: true,
                activation: Activation::Gelu,
                ..base.clone()
            },
        ),
        (
            "tanh + vanilla + MSE + no clip + cosine lr + hard every 4",
            DqnConfig {
                activation: Activation::Tanh,
                double: false,
                loss: Loss::Mse,
                grad_clip: None,
                lr_schedule: LrSchedule::Cosine {
                    min_factor: 0.1,
                    steps: 30,
                },
                target_update: TargetUpdate::Hard { every: 4 },
                ..base.clone()
            },
        ),
        (
            "one hidden layer, dueling, tight clip, batch 1000",
            DqnConfig {
                hidden: vec![48],
                dueling: true,
                grad_clip: Some(0.05),
                batch_size: 1000,
                ..base.clone()
            },
        ),
        // Chunks of 8 rows a block: the training pass over 16 rows, which a pass over a layer
        // this wide takes in two turns (tiled for a width of a multiple of 4, else by rows).
        (
            "a wide layer, batch 1000",
            DqnConfig {
                hidden: vec![260, 36],
                batch_size: 1000,
                ..base.clone()
            },
        ),
        (
            "a wide layer of odd width, batch 1000",
            DqnConfig {
                hidden: vec![258],
                batch_size: 1000,
                ..base.clone()
            },
        ),
        // A layer of a width not a multiple of 4 leaves the parameters after it off whole
        // float4s: the tiled layers behind it store their gradient slots a float at a time, and
        // groups of about 16 rows (batch 2048) add their second chunk into the first's.
        (
            "tiled layers after one of odd width, batch 2048",
            DqnConfig {
                hidden: vec![258, 36, 36],
                batch_size: 2048,
                ..base.clone()
            },
        ),
    ];
    let dev = Default::default();
    let mut report = Vec::new();
    for (name, dqn) in variants {
        let cfg = agent_cfg(&m, dqn);
        let mut agent = DqnAgent::<CpuBackend>::new(cfg.clone(), &dev).expect("agent");
        let start = agent.export_state();
        let mut e = engine(&arena, &m, &cfg, &start, 64, StepLoop::OneLaunch);
        // The eager engine on the same batches: the reference for GELU, whose backward burn
        // takes from the tanh approximation while both engines differentiate the exact GELU.
        let mut eager = FusedDqn::new(&ctx, &cfg, &start, 64).expect("eager engine");
        let mut db = DeviceBatch::new(&ctx, cfg.batch_size, cfg.obs_dim).expect("batch");
        e.begin_epoch(3).expect("begin");
        // Fill the ring without learning, then one update per launch.
        e.run_steps(&plan(0, 20, usize::MAX), &mut clock())
            .expect("warm-up");
        let (mut grad_burn, mut grad_eager) = (0f32, 0f32);
        let mut probe = Vec::new();
        for u in 0..30 {
            let learned = e
                .run_steps(&plan(1 + u, 1, 0), &mut clock())
                .expect("update");
            assert_eq!(learned, vec![0]);
            let parts = e.batch.download(&ctx).expect("batch");
            let hb = host_batch(&parts);
            if u == 0 {
                let ours = ctx
                    .download(
                        e.one_launch
                            .as_ref()
                            .expect("one launch")
                            .kernel
                            .gradients(),
                    )
                    .expect("gradients");
                let want = agent.gradients(Batch::from_host(&hb, cfg.obs_dim, &dev));
                grad_burn = max_abs_diff(&ours, &want) / max_abs(&want);
                db.upload(&ctx, &parts).expect("upload");
                eager.learn(&db).expect("learn");
                eager.sync_target().expect("sync");
                let theirs = eager.gradients().expect("gradients");
                grad_eager = max_abs_diff(&ours, &theirs) / max_abs(&theirs);
                probe = parts.obs.clone();
            } else {
                db.upload(&ctx, &parts).expect("upload");
                eager.learn(&db).expect("learn");
                eager.sync_target().expect("sync");
            }
            agent.train_step(Batch::from_host(&hb, cfg.obs_dim, &dev));
        }
        let stats = e.finish_epoch().expect("stats");
        assert_eq!(stats.len(), 30);
        let got = e.fused.state().expect("state");
        assert_eq!(got.updates, 30);
        let rows = cfg.batch_size.min(64);
        let q_ours = q_rows(&cfg, &got.online, &probe, rows);
        let q_burn = q_rows(&cfg, &agent.export_state().online, &probe, rows);
        let q_eager = q_rows(&cfg, &eager.state().expect("state").online, &probe, rows);
        let rel = |a: &[f32], b: &[f32]| max_abs_diff(a, b) / max_abs(b);
        let (q_vs_burn, q_vs_eager) = (rel(&q_ours, &q_burn), rel(&q_ours, &q_eager));
        report.push(format!(
            "{name}: gradient rel {grad_burn:.2e} (burn), {grad_eager:.2e} (eager engine); \
             after 30 updates Q rel {q_vs_burn:.2e} (burn), {q_vs_eager:.2e} (eager engine)"
        ));
        let fail = || report.join("\n");
        assert!(grad_eager < 1e-6, "{}", fail());
        assert!(q_vs_eager < 1e-5, "{}", fail());
        if cfg.activation == Activation::Gelu {
            // burn's GELU derivative is its tanh approximation's (up to 8.7e-4 off).
            assert!(grad_burn < 3e-3 && q_vs_burn < 1e-3, "{}", fail());
        } else {
            assert!(grad_burn < 1e-6 && q_vs_burn < 1e-5, "{}", fail());
        }
        assert!(
            max_abs_diff(&got.online, &start.online) > 1e-4,
            "{name}: trained"
        );
    }
    eprintln!("{}", report.join("\n"));
}
