//! The fused CUDA engine against the burn agent on the CPU (NdArray): the same start, the same
//! batches, the same updates, for every architecture and learning-rule option the engine
//! implements; and its epsilon-greedy actions. Needs `--features cuda` and FOXHUNT_GPU_TESTS=1.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use burn::tensor::Tensor;
use foxhunt_dqn::config::{Activation, Loss, LrSchedule, TargetUpdate};
use foxhunt_dqn::fused::FusedDqn;
use foxhunt_dqn::replay::{HostBatch, Replay, Transition};
use foxhunt_dqn::{AgentConfig, AgentState, Batch, CpuBackend, DqnAgent, DqnConfig};
use foxhunt_gpu::{DeviceBatch, GpuContext, HostBatchParts};

type B = CpuBackend;

fn gpu() -> Option<Arc<GpuContext>> {
    foxhunt_testkit::gpu_tests()
        .then(|| GpuContext::new(0).unwrap_or_else(|e| panic!("FOXHUNT_GPU_TESTS=1 but {e}")))
}

/// Batches from a replay of deterministic transitions (terminal ones included: discount 0).
fn batches(dim: usize, actions: u32, batch: usize, count: usize) -> Vec<HostBatch> {
    let mut r = Replay::new(512, 5, None);
    for k in 0..512u32 {
        let x = |j: u32| ((k * 31 + j * 17) % 97) as f32 / 48.5 - 1.0;
        r.push(Transition {
            obs: (0..dim as u32).map(x).collect(),
            action: (k % actions) as u8,
            ret: x(7) * 2.0,
            next_obs: (0..dim as u32).map(|j| x(j + 3)).collect(),
            discount: if k % 11 == 0 { 0.0 } else { 0.97 },
        });
    }
    (0..count).map(|u| r.sample(batch, u as u64)).collect()
}

fn upload(ctx: &GpuContext, hb: &HostBatch, out: &mut DeviceBatch) {
    let parts = HostBatchParts {
        obs: hb.obs.clone(),
        actions: hb.actions.iter().map(|&a| a as i32).collect(),
        returns: hb.returns.clone(),
        next_obs: hb.next_obs.clone(),
        discounts: hb.discounts.clone(),
        weights: hb.weights.clone(),
    };
    out.upload(ctx, &parts).expect("batch upload");
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn fused_updates_follow_the_burn_agent() {
    let Some(ctx) = gpu() else { return };
    let base = AgentConfig {
        obs_dim: 12,
        actions: 3,
        seed: 7,
        dqn: DqnConfig {
            hidden: vec![32, 32],
            batch_size: 64,
            ..DqnConfig::default()
        },
    };
    let variants = [
        (
            "default (relu, double, Huber, clip, hard target)",
            base.clone(),
        ),
        (
            "layer norm + dueling + soft target + weight decay",
            AgentConfig {
                dqn: DqnConfig {
                    layer_norm: true,
                    dueling: true,
                    target_update: TargetUpdate::Soft { tau: 0.05 },
                    weight_decay: 1e-3,
                    ..base.dqn.clone()
                },
                ..base.clone()
            },
        ),
        (
            "gelu + layer norm",
            AgentConfig {
                dqn: DqnConfig {
                    layer_norm: true,
                    activation: Activation::Gelu,
                    ..base.dqn.clone()
                },
                ..base.clone()
            },
        ),
        (
            "tanh + vanilla + MSE + no clip + cosine lr + hard every 4",
            AgentConfig {
                dqn: DqnConfig {
                    activation: Activation::Tanh,
                    double: false,
                    loss: Loss::Mse,
                    grad_clip: None,
                    lr_schedule: LrSchedule::Cosine {
                        min_factor: 0.1,
                        steps: 30,
                    },
                    target_update: TargetUpdate::Hard { every: 4 },
                    ..base.dqn.clone()
                },
                ..base.clone()
            },
        ),
        (
            "one hidden layer, dueling, tight clip",
            AgentConfig {
                dqn: DqnConfig {
                    hidden: vec![48],
                    dueling: true,
                    grad_clip: Some(0.05),
                    ..base.dqn.clone()
                },
                ..base.clone()
            },
        ),
    ];
    let mut report = Vec::new();
    for (name, cfg) in variants {
        let dev = Default::default();
        let mut agent = DqnAgent::<B>::new(cfg.clone(), &dev).expect("valid");
        let mut fused = FusedDqn::new(&ctx, &cfg, &agent.export_state(), 64).expect("engine");
        assert_eq!(fused.num_params(), agent.num_params(), "{name}: layout");
        let mut db = DeviceBatch::new(&ctx, cfg.batch_size, cfg.obs_dim).expect("batch");
        let hbs = batches(cfg.obs_dim, cfg.actions as u32, cfg.batch_size, 30);
        let mut cpu_stats = Vec::new();
        let mut grad_rel = 0f32;
        for (u, hb) in hbs.iter().enumerate() {
            upload(&ctx, hb, &mut db);
            // The first updates start from the burn agent's exact state, so that the gradients
            // are compared on the same weights.
            let want_grads = (u < 3).then(|| {
                fused.load(&agent.export_state()).expect("load");
                agent.gradients(Batch::from_host(hb, cfg.obs_dim, &dev))
            });
            fused.learn(&db).expect("learn");
            // The backward pass, on the same weights: within f32 rounding of burn's gradient.
            if let Some(want) = want_grads {
                let got = fused.gradients().expect("gradients");
                let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
                grad_rel = grad_rel.max(max_abs_diff(&got, &want) / scale);
            }
            fused.sync_target().expect("target");
            let s = agent.train_step(Batch::from_host(hb, cfg.obs_dim, &dev));
            let v = |t: Tensor<burn::backend::NdArray<f32>, 1>| t.into_scalar();
            cpu_stats.push([v(s.loss), v(s.mean_q), v(s.td_abs_mean), v(s.grad_norm)]);
        }
        let gpu_stats = fused.take_stats().expect("stats");
        assert_eq!(gpu_stats.len(), 30);
        assert!(fused.take_stats().expect("empty").is_empty(), "taken once");
        let want: AgentState = agent.export_state();
        let got = fused.state().expect("state");
        assert_eq!(got.updates, 30);
        let scale = want.online.iter().map(|v| v.abs()).fold(0f32, f32::max);
        let d_online = max_abs_diff(&got.online, &want.online);
        let d_target = max_abs_diff(&got.target, &want.target);
        let d_m1 = max_abs_diff(&got.moment_1, &want.moment_1);
        let m1_scale = want.moment_1.iter().map(|v| v.abs()).fold(0f32, f32::max);
        let stat_rel = gpu_stats
            .iter()
            .zip(&cpu_stats)
            .flat_map(|(g, c)| {
                g.named()
                    .into_iter()
                    .zip(c)
                    .map(|((_, g), c)| (g - c).abs() / c.abs().max(1e-3))
            })
            .fold(0f32, f32::max);
        // Q-values of the two trained networks on a probe batch.
        let probe = &hbs[0].obs;
        let d_obs = ctx.upload(probe).expect("probe");
        let q_gpu = fused.q_values(&d_obs, cfg.batch_size).expect("q");
        let mut cpu_after = DqnAgent::<B>::new(cfg.clone(), &dev).expect("valid");
        cpu_after.import_state(&want);
        let q_cpu = cpu_after
            .q_values(
                Tensor::<burn::backend::NdArray<f32>, 1>::from_floats(probe.as_slice(), &dev)
                    .reshape([cfg.batch_size, cfg.obs_dim]),
            )
            .into_data()
            .to_vec::<f32>()
            .expect("f32");
        let q_scale = q_cpu.iter().map(|v| v.abs()).fold(0f32, f32::max);
        let q_rel = max_abs_diff(&q_gpu, &q_cpu) / q_scale;
        report.push(format!(
            "{name}: gradient rel {grad_rel:.2e}; after 30 updates: Q rel {q_rel:.2e}, max |d \
             online| {d_online:.2e} (max |w| {scale:.2}), |d target| {d_target:.2e}, |d m1| \
             {d_m1:.2e} (max {m1_scale:.2e}), stats rel {stat_rel:.2e}"
        ));
        // Gradients on the same weights agree to f32 rounding. Over 30 updates Adam divides
        // each gradient by its own running scale, so a parameter whose gradient is near zero
        // moves by about lr whatever its rounding: weights may drift apart by a few lr at
        // most, the networks' outputs and the statistics stay close.
        let fail = || report.join("\n");
        // burn 0.21's GELU backward is the derivative of GELU's tanh approximation (up to
        // 8.7e-4 from the exact one, which the engine computes) while its forward is exact:
        // its gradients are off by that much, not the engine's.
        let grad_tol = if cfg.activation == Activation::Gelu {
            3e-3
        } else {
            1e-4
        };
        assert!(grad_rel < grad_tol, "{}", fail());
        assert!(q_rel < 1e-3, "{}", fail());
        assert!(
            d_online < 5.0 * cfg.lr as f32 && d_target < 5.0 * cfg.lr as f32,
            "{}",
            fail()
        );
        assert!(d_m1 < 1e-2 * m1_scale.max(1e-6), "{}", fail());
        assert!(stat_rel < 1e-2, "{}", fail());
        // The weights did move: the comparison is not between two untouched networks.
        let start = DqnAgent::<B>::new(cfg.clone(), &dev)
            .expect("valid")
            .export_state();
        assert!(
            max_abs_diff(&got.online, &start.online) > 1e-3,
            "{name}: trained"
        );
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn fused_actions_are_greedy_on_burn_q_values_and_explore_at_the_asked_rate() {
    let Some(ctx) = gpu() else { return };
    let cfg = AgentConfig {
        obs_dim: 10,
        actions: 3,
        seed: 3,
        dqn: DqnConfig {
            hidden: vec![64, 64],
            layer_norm: true,
            dueling: true,
            ..DqnConfig::default()
        },
    };
    let dev = Default::default();
    let agent = DqnAgent::<B>::new(cfg.clone(), &dev).expect("valid");
    let mut fused = FusedDqn::new(&ctx, &cfg, &agent.export_state(), 1).expect("engine");
    let n = 4096;
    let obs: Vec<f32> = (0..n * 10)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    let d_obs = ctx.upload(&obs).expect("obs");
    let q_gpu = fused.q_values(&d_obs, n).expect("q");
    let q_cpu = agent
        .q_values(
            Tensor::<burn::backend::NdArray<f32>, 1>::from_floats(obs.as_slice(), &dev)
                .reshape([n, 10]),
        )
        .into_data()
        .to_vec::<f32>()
        .expect("f32");
    let d_q = max_abs_diff(&q_gpu, &q_cpu);
    assert!(d_q < 1e-5, "Q-values differ by {d_q}");
    let mut actions = ctx.alloc::<u8>(n).expect("actions");
    fused.act(&d_obs, n, 0.0, 1, 0, &mut actions).expect("act");
    let greedy = ctx.download(&actions).expect("download");
    for (r, &a) in greedy.iter().enumerate() {
        let q = &q_cpu[r * 3..r * 3 + 3];
        let best = q.iter().copied().fold(f32::MIN, f32::max);
        // Near-ties may go either way between two summation orders.
        assert!(q[a as usize] >= best - 1e-5, "row {r}: action {a} of {q:?}");
    }
    fused.act(&d_obs, n, 0.3, 1, 1, &mut actions).expect("act");
    let explored = ctx.download(&actions).expect("download");
    let differ = greedy.iter().zip(&explored).filter(|(a, b)| a != b).count() as f64 / n as f64;
    // A uniform action differs from the greedy one 2/3 of the time: 0.3 * 2/3 = 0.2.
    assert!((differ - 0.2).abs() < 0.03, "{differ}");
    // The device draws what the host's exploration rule draws: one rule, two generators.
    for (r, (&g, &e)) in greedy.iter().zip(&explored).enumerate() {
        let host = foxhunt_dqn::explore::explore(1, 1, r as u32, 0.3, u32::from(g), 3);
        assert_eq!(
            u32::from(e),
            host,
            "row {r}: device and host exploration differ"
        );
    }
    // The same (seed, step) draws the same actions; another step draws others.
    let mut again = ctx.alloc::<u8>(n).expect("actions");
    fused.act(&d_obs, n, 0.3, 1, 1, &mut again).expect("act");
    assert_eq!(ctx.download(&again).expect("download"), explored);
    fused.act(&d_obs, n, 0.3, 1, 2, &mut again).expect("act");
    assert_ne!(ctx.download(&again).expect("download"), explored);
}
