//! `cargo xtask bench data`: times load + validate + roll + features of synthetic ES years.
//! Benchmarks live here, not in tests: timings are reported, never asserted.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use foxhunt_data::continuous::build_continuous;
use foxhunt_data::features::compute_features;
use foxhunt_data::read::load_path;
use foxhunt_data::{Adjustment, FeatureConfig, LoadOptions, SessionCalendar, SymbolSelector};
use foxhunt_env::{Execution, MarketData, SpecTable};

/// Median and minimum of a sample of durations in milliseconds.
pub fn summarize(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[0])
}

pub fn data(root: &Path, years: u32, reps: usize) -> Result<()> {
    // The same synthetic years in the two layouts users have: one file, and one file per day
    // (Databento batch downloads); measured side by side in one run.
    let file = root.join(format!(
        "target/bench-data/es-synth-{years}y.ohlcv-1m.dbn.zst"
    ));
    if !file.exists() {
        crate::synth::run(&file, "2019-01-02", years, 7, false)?;
    }
    let dir = root.join(format!("target/bench-data/es-synth-{years}y-daily"));
    if !dir.exists() {
        crate::synth::run(&dir, "2019-01-02", years, 7, true)?;
    }
    let selector = SymbolSelector::Parent("ES".into());
    let opts = LoadOptions::default();
    let calendar = SessionCalendar::cme();
    let cfg = FeatureConfig::default();
    let layouts = [("one file", file), ("daily files", dir)];
    let mut samples: [[Vec<f64>; 4]; 2] = Default::default();
    let mut sizes = [(0, 0, 0); 2];
    for _ in 0..reps {
        for (k, (_, path)) in layouts.iter().enumerate() {
            let t0 = Instant::now();
            let raw = load_path(path, &selector, &opts)?;
            let t1 = Instant::now();
            let series = build_continuous("ES", &raw.contracts, &calendar, Adjustment::Difference)?;
            let t2 = Instant::now();
            let m = compute_features(&series, &calendar, &cfg);
            let t3 = Instant::now();
            sizes[k] = (raw.files.len(), raw.bar_count(), m.rows);
            for (s, d) in samples[k]
                .iter_mut()
                .zip([t1 - t0, t2 - t1, t3 - t2, t3 - t0])
            {
                s.push(d.as_secs_f64() * 1e3);
            }
        }
    }
    println!("bench data: {years} synthetic ES year(s), {reps} repetitions, layouts alternated");
    for (k, (name, path)) in layouts.iter().enumerate() {
        let (files, bars, rows) = sizes[k];
        println!(
            "{name}: {} ({files} files, {bars} bars read, {rows} continuous rows)",
            path.display()
        );
        println!("  {:<26} {:>10} {:>10}", "phase", "median ms", "min ms");
        for (phase, s) in [
            "read+validate (DBN zstd)",
            "roll+adjust",
            "features",
            "total",
        ]
        .iter()
        .zip(samples[k].iter_mut())
        {
            let (med, min) = summarize(s);
            println!("  {phase:<26} {med:>10.2} {min:>10.2}");
        }
        let (med, _) = summarize(&mut samples[k][3]);
        println!(
            "  throughput: {:.1} M bars/s (bars read / median total)",
            bars as f64 / med / 1e3
        );
    }
    Ok(())
}

/// The environment benchmarks' market: bundled real ES bars with 15 features, look-back 2, so
/// that an observation is 15 x 2 + position + unrealized PnL = 32 floats.
fn bench_market(
    root: &Path,
) -> Result<(
    foxhunt_env::MarketData,
    foxhunt_env::EnvConfig,
    foxhunt_env::Execution,
)> {
    use foxhunt_env::{Costs, EnvConfig, Execution, MarketData, SpecTable};
    let features = FeatureConfig {
        return_horizons: vec![1, 5, 15, 30, 60, 120],
        vol_windows: vec![15, 60],
        volume_window: 60,
        time_encodings: true,
    };
    let calendar = SessionCalendar::cme();
    let data = foxhunt_data::Dataset::load(
        &root.join("test_data/futures-baseline"),
        &SymbolSelector::Parent("ES".into()),
        &LoadOptions::default(),
        &calendar,
        Adjustment::Difference,
        &features,
    )?;
    let m = MarketData::from_features(&data.features, 0..data.features.rows, None)?;
    let cfg = EnvConfig {
        lookback: 2,
        ..EnvConfig::default()
    };
    anyhow::ensure!(
        cfg.obs_dim(m.cols()) == 32,
        "observation is {} floats, the benchmarks want 32",
        cfg.obs_dim(m.cols())
    );
    let exec = Execution::new(SpecTable::default().get("ES")?, Costs::default());
    Ok((m, cfg, exec))
}

/// `cargo xtask bench env`: steps of the CPU reference environment per second, N environments,
/// a 32-float observation (15 features x 2 rows + position + unrealized PnL) written into a
/// preallocated buffer, over the bundled real ES bars.
pub fn env(root: &Path, envs: usize, steps: usize, reps: usize) -> Result<()> {
    use foxhunt_env::VecEnv;
    let (m, cfg, exec) = bench_market(root)?;
    let dim = cfg.obs_dim(m.cols());
    let mut env = VecEnv::new(&m, exec, cfg, 0..m.rows(), envs, 7)?;
    let (mut obs, mut rew, mut done) = (vec![0f32; envs * dim], vec![0f32; envs], vec![0u8; envs]);
    env.reset(&mut obs);
    // Actions are drawn before timing: the benchmark measures the environment, not a policy.
    let actions: Vec<Vec<u8>> = (0..16u64)
        .map(|k| {
            (0..envs as u64)
                .map(|i| (foxhunt_env::vec_env::mix64(k * 1_000_003 + i) % 3) as u8)
                .collect()
        })
        .collect();
    let mut per_s = Vec::new();
    for rep in 0..=reps {
        let t0 = Instant::now();
        for s in 0..steps {
            env.step(&actions[s % actions.len()], &mut obs, &mut rew, &mut done);
        }
        let secs = t0.elapsed().as_secs_f64();
        if rep > 0 {
            per_s.push((envs * steps) as f64 / secs / 1e6); // the first repetition warms caches
        }
    }
    let (median, _) = summarize(&mut per_s);
    let best = per_s.last().copied().unwrap_or(0.0);
    println!(
        "bench env: {envs} environments x {steps} steps, obs {dim} floats, {} rayon threads, {reps} repetitions",
        rayon::current_num_threads()
    );
    println!("env-steps/s: median {median:.1} M, best {best:.1} M");
    Ok(())
}

/// `cargo xtask bench dqn`: microseconds per DQN train_step (32 -> 128 -> 128 -> 3, Adam,
/// double DQN, Huber, grad clip) at batch 64 and 1024, on the CPU (NdArray) or burn-cuda.
pub fn dqn(
    root: &Path,
    device: &str,
    updates: usize,
    batch_rows: &[usize],
    members: &[usize],
) -> Result<()> {
    #[cfg(not(feature = "cuda"))]
    let _ = (root, batch_rows, members); // only the one-launch benchmarks read these
    match device {
        "cpu" => {
            dqn_on::<foxhunt_dqn::CpuBackend>(&Default::default(), "cpu (burn NdArray)", updates)
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            dqn_on::<foxhunt_dqn::CudaBackend>(&Default::default(), "cuda (burn-cuda)", updates)?;
            dqn_fused(updates)?;
            let (m, env_cfg, exec) = bench_market(root)?;
            let ctx = std::sync::Arc::new(foxhunt_gpu::GpuContext::new(0)?);
            let mut pool = foxhunt_memory::DevicePool::new(&ctx);
            let arena = pool.window(&foxhunt_memory::WindowData {
                market: m.clone(),
                exec,
            })?;
            let w = BenchWindow {
                ctx: &ctx,
                arena: &arena,
                market: &m,
                env: &env_cfg,
            };
            for &rows in batch_rows {
                dqn_one_launch(&w, updates, rows)?;
            }
            if !members.is_empty() {
                dqn_population(&w, updates, members)?;
            }
            Ok(())
        }
        other => anyhow::bail!(
            "--device {other}: this build knows cpu{}",
            if cfg!(feature = "cuda") {
                " and cuda"
            } else {
                " (build xtask with --features cuda for cuda)"
            }
        ),
    }
}

fn dqn_on<B: burn::tensor::backend::AutodiffBackend>(
    device: &B::Device,
    name: &str,
    updates: usize,
) -> Result<()> {
    use foxhunt_dqn::{AgentConfig, Batch, DqnAgent, DqnConfig};
    println!(
        "bench dqn: {name}, obs 32, hidden 128x128, 3 actions, {updates} timed updates per batch size"
    );
    println!(
        "{:>9} {:>6} {:>14} {:>14} {:>14}",
        "dense", "batch", "median us", "min us", "pipelined us"
    );
    for (full_f32, batch) in [(false, 64usize), (false, 1024), (true, 64), (true, 1024)] {
        let cfg = AgentConfig {
            dqn: DqnConfig {
                batch_size: batch,
                replay_capacity: 4096,
                full_f32,
                ..DqnConfig::default()
            },
            ..AgentConfig::default()
        };
        let mut agent = DqnAgent::<B>::new(cfg, device)?;
        let mut replay = bench_replay();
        // Batches are uploaded before timing: the benchmark times the update, not the sampling.
        let batches: Vec<Batch<B>> = (0..16)
            .map(|u| Batch::from_host(&replay.sample(batch, u), 32, device))
            .collect();
        let mut step = |i: usize| {
            let b = &batches[i % batches.len()];
            agent.train_step(Batch {
                obs: b.obs.clone(),
                actions: b.actions.clone(),
                returns: b.returns.clone(),
                next_obs: b.next_obs.clone(),
                discounts: b.discounts.clone(),
                weights: b.weights.clone(),
            })
        };
        for i in 0..20 {
            step(i).to_host(); // warm-up (kernel compilation on cuda)
        }
        // Per-update times, each synchronized by reading the loss (what a caller reading
        // statistics every step would see), and one long run synchronized only at the end.
        let mut each = Vec::with_capacity(updates);
        for i in 0..updates {
            let t0 = Instant::now();
            step(i).to_host();
            each.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        let t0 = Instant::now();
        let mut last = None;
        for i in 0..updates {
            last = Some(step(i));
        }
        if let Some(s) = last {
            s.to_host();
        }
        let pipelined = t0.elapsed().as_secs_f64() * 1e6 / updates as f64;
        let (med, min) = summarize(&mut each);
        let dense = if full_f32 { "full f32" } else { "matmul" };
        println!("{dense:>9} {batch:>6} {med:>14.1} {min:>14.1} {pipelined:>14.1}");
    }
    Ok(())
}

/// 4096 deterministic transitions of 32-float observations, 3 actions: what both DQN benches
/// sample their batches from.
fn bench_replay() -> foxhunt_dqn::replay::Replay {
    use foxhunt_dqn::replay::{Replay, Transition};
    let mut replay = Replay::new(4096, 1, None);
    for k in 0..4096u32 {
        let x = |j: u32| {
            ((k.wrapping_mul(2654435761) ^ j.wrapping_mul(40503)) % 1000) as f32 / 500.0 - 1.0
        };
        replay.push(Transition {
            obs: (0..32).map(x).collect(),
            action: (k % 3) as u8,
            ret: x(99),
            next_obs: (32..64).map(x).collect(),
            discount: 0.99,
        });
    }
    replay
}

/// The fused engine on the same shapes and data as [`dqn_on`], in the same run: one update
/// (learn + target update) synchronized each time, and a pipelined run synchronized at the end.
#[cfg(feature = "cuda")]
fn dqn_fused(updates: usize) -> Result<()> {
    use foxhunt_dqn::fused::FusedDqn;
    use foxhunt_dqn::{AgentConfig, CpuBackend, DqnAgent, DqnConfig};
    let ctx = foxhunt_gpu::GpuContext::new(0)?;
    ctx.synchronize()?;
    println!("bench dqn: cuda (foxhunt fused engine), same shapes, {updates} timed updates");
    println!(
        "{:>9} {:>6} {:>14} {:>14} {:>14}",
        "dense", "batch", "median us", "min us", "pipelined us"
    );
    for batch in [64usize, 1024] {
        let cfg = AgentConfig {
            dqn: DqnConfig {
                batch_size: batch,
                replay_capacity: 4096,
                ..DqnConfig::default()
            },
            ..AgentConfig::default()
        };
        let agent = DqnAgent::<CpuBackend>::new(cfg.clone(), &Default::default())?;
        let mut engine = FusedDqn::new(&ctx, &cfg, &agent.export_state(), 2 * updates + 40)?;
        let mut replay = bench_replay();
        let mut batches = Vec::new();
        for u in 0..16 {
            let hb = replay.sample(batch, u);
            let mut b = foxhunt_gpu::DeviceBatch::new(&ctx, batch, 32)?;
            b.upload(
                &ctx,
                &foxhunt_gpu::HostBatchParts {
                    obs: hb.obs,
                    actions: hb.actions.iter().map(|&a| a as i32).collect(),
                    returns: hb.returns,
                    next_obs: hb.next_obs,
                    discounts: hb.discounts,
                    weights: hb.weights,
                },
            )?;
            batches.push(b);
        }
        let mut step = |i: usize| -> Result<()> {
            engine.learn(&batches[i % batches.len()])?;
            engine.sync_target()?;
            Ok(())
        };
        for i in 0..20 {
            step(i)?;
        }
        ctx.synchronize()?;
        let mut each = Vec::with_capacity(updates);
        for i in 0..updates {
            let t0 = Instant::now();
            step(i)?;
            ctx.synchronize()?;
            each.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        let t0 = Instant::now();
        for i in 0..updates {
            step(i)?;
        }
        ctx.synchronize()?;
        let pipelined = t0.elapsed().as_secs_f64() * 1e6 / updates as f64;
        let stats = engine.take_stats()?;
        ensure_finite(&stats)?;
        let (med, min) = summarize(&mut each);
        println!(
            "{:>9} {batch:>6} {med:>14.1} {min:>14.1} {pipelined:>14.1}",
            "fused"
        );
    }
    Ok(())
}

/// The one-launch epoch kernel (foxhunt-memory's `EpochKernel`) on the same network, over the
/// bundled ES bars (32-float observations): the replay ring filled by 64 environments, then
/// launches of `updates` updates alone (each samples its batch from the ring, learns and updates
/// the target), launches of `updates` whole steps (act, environment step, sample, update), and
/// single-update launches synchronized each time. Microseconds per update or step; medians of 5
/// launches.
/// The bundled ES bars resident on the device, for the one-launch benchmarks.
#[cfg(feature = "cuda")]
struct BenchWindow<'a, 'p> {
    ctx: &'a std::sync::Arc<foxhunt_gpu::GpuContext>,
    arena: &'a foxhunt_memory::GpuArena<'p>,
    market: &'a foxhunt_env::MarketData,
    env: &'a foxhunt_env::EnvConfig,
}

#[cfg(feature = "cuda")]
fn dqn_one_launch(w: &BenchWindow<'_, '_>, updates: usize, batch_rows: usize) -> Result<()> {
    use foxhunt_dqn::fused::FusedDqn;
    use foxhunt_dqn::{AgentConfig, CpuBackend, DqnAgent, DqnConfig};
    use foxhunt_gpu::DeviceBatch;
    use foxhunt_memory::{DeviceReplay, EpochKernel, GpuVecEnv, PlannedStep};
    let (ctx, arena, m, env_cfg) = (w.ctx, w.arena, w.market, w.env);
    let n_env = 64;
    println!(
        "bench dqn: cuda (one-launch epoch kernel), same network, ring of 64 environments over the bundled ES bars, launches of {updates} steps, {batch_rows} batch rows a block"
    );
    println!(
        "{:>6} {:>7} {:>8} {:>16} {:>16} {:>18}",
        "batch", "blocks", "barrier", "update us", "act+update us", "1-update launch us"
    );
    let mut breakdown = Vec::new();
    for batch in [64usize, 1024, 4096] {
        let cfg = AgentConfig {
            dqn: DqnConfig {
                batch_size: batch,
                ..DqnConfig::default()
            },
            ..AgentConfig::default()
        };
        let agent = DqnAgent::<CpuBackend>::new(cfg.clone(), &Default::default())?;
        let steps = updates.max(1);
        let mut fused = FusedDqn::new(ctx, &cfg, &agent.export_state(), 16 * steps + 64)?;
        let shape = foxhunt_trainer::net_shape(&cfg, fused.num_params());
        let mut kernel =
            EpochKernel::with_batch_rows(ctx, shape, n_env, batch, steps.max(64), batch_rows)?;
        let mut ring = DeviceReplay::new(ctx, n_env, 4096 / n_env)?;
        let mut db = DeviceBatch::new(ctx, batch, cfg.obs_dim)?;
        let mut env = GpuVecEnv::new(arena, env_cfg.clone(), 0..m.rows(), n_env, 7)?;
        env.reset()?;
        let rule = foxhunt_trainer::learn_rule(&cfg, 2);
        let step = |act: bool, learn: bool, done: u64| planned_step(&cfg, act, learn, done);
        let mut launch =
            |kernel: &mut EpochKernel, plan: &[PlannedStep], fused: &mut FusedDqn| -> Result<()> {
                let n = plan.iter().filter(|s| s.learn).count();
                let (learner, first) = foxhunt_trainer::learner_buffers(fused.lend_for_updates(n)?);
                kernel.run(
                    ctx, &mut env, &mut ring, &mut db, learner, &rule, plan, first,
                )?;
                Ok(())
            };
        // The ring filled (64 rows of 64 environments), then a warm-up launch.
        let fill: Vec<_> = (0..64).map(|_| step(true, false, 0)).collect();
        launch(&mut kernel, &fill, &mut fused)?;
        // Each member's blocks on the grid barrier, then (where the device can) one cluster:
        // side by side, same network and ring.
        for clusters in [false, true] {
            kernel.set_clusters(clusters);
            let sync = if kernel.runs_in_clusters(ctx)? {
                "cluster"
            } else {
                "grid"
            };
            if clusters && sync == "grid" {
                continue;
            }
            let mut parts = Vec::new();
            let mut timed = |kernel: &mut EpochKernel,
                             act: bool,
                             fused: &mut FusedDqn,
                             reps: usize|
             -> Result<f64> {
                let mut us = Vec::new();
                for rep in 0..reps {
                    let done = fused.updates();
                    let plan: Vec<_> = (0..steps)
                        .map(|k| step(act, true, done + k as u64))
                        .collect();
                    ctx.synchronize()?;
                    let t0 = Instant::now();
                    launch(kernel, &plan, fused)?;
                    ctx.synchronize()?;
                    us.push(t0.elapsed().as_secs_f64() * 1e6 / steps as f64);
                    fused.take_stats()?;
                    if rep + 1 == reps && reps > 1 {
                        parts.push((act, kernel.step_times(ctx, steps)?));
                    }
                }
                Ok(summarize(&mut us).0)
            };
            timed(&mut kernel, false, &mut fused, 1)?;
            let update_us = timed(&mut kernel, false, &mut fused, 5)?;
            let step_us = timed(&mut kernel, true, &mut fused, 5)?;
            let mut single = Vec::new();
            for _ in 0..steps.min(200) {
                let plan = [step(false, true, fused.updates())];
                ctx.synchronize()?;
                let t0 = Instant::now();
                launch(&mut kernel, &plan, &mut fused)?;
                ctx.synchronize()?;
                single.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            let stats = fused.take_stats()?;
            ensure_finite(&stats)?;
            let (single_us, _) = summarize(&mut single);
            println!(
                "{batch:>6} {:>7} {sync:>8} {update_us:>16.1} {step_us:>16.1} {single_us:>18.1}",
                kernel.blocks()
            );
            breakdown.push((batch, sync, parts));
        }
    }
    println!(
        "device timestamps, us per step (block 0): collect = act + env step + ring write + wait for every block; sample and forward: the block's first chunk; backward: its backward, then the block's other chunks"
    );
    println!(
        "{:>6} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "batch",
        "barrier",
        "act",
        "collect",
        "sample",
        "forward",
        "backward",
        "reduce",
        "adam",
        "sync"
    );
    for (batch, sync, parts) in breakdown {
        for (act, t) in parts {
            let us = |ms: f64| ms * 1e3 / updates.max(1) as f64;
            println!(
                "{batch:>6} {sync:>8} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                if act { "yes" } else { "no" },
                us(t.collect),
                us(t.sample),
                us(t.forward),
                us(t.backward),
                us(t.reduce),
                us(t.adam),
                us(t.sync)
            );
        }
    }
    Ok(())
}

/// Fails where an update's statistics are not finite (a benchmark that diverged times nothing).
#[cfg(feature = "cuda")]
fn ensure_finite(stats: &[foxhunt_dqn::UpdateStats]) -> Result<()> {
    anyhow::ensure!(
        stats.iter().all(|r| r.first_non_finite().is_none()),
        "non-finite statistics"
    );
    Ok(())
}

/// A planned step of `cfg`'s agent after `done` updates, exploring at 0.1 (the benchmarks' plan).
#[cfg(feature = "cuda")]
fn planned_step(
    cfg: &foxhunt_dqn::AgentConfig,
    act: bool,
    learn: bool,
    done: u64,
) -> foxhunt_memory::PlannedStep {
    use foxhunt_dqn::fused::{TargetStep, update_terms};
    use foxhunt_memory::TargetSync;
    let t = update_terms(cfg, done);
    foxhunt_memory::PlannedStep {
        act,
        epsilon: 0.1,
        counter: done,
        learn,
        lr: t.lr,
        eps_c2: t.eps_c2,
        cf: t.cf,
        sync: match t.target {
            TargetStep::Keep => TargetSync::None,
            TargetStep::Copy => TargetSync::Copy,
            TargetStep::Blend(_) => TargetSync::Blend,
        },
    }
}

/// A population of K agents (seeds 1000.., the default network, 64 environments each over the
/// bundled ES bars, batch 64) in one launch of foxhunt-memory's `EpochPopulation`: each ring
/// filled by a launch of 64 acting steps, then launches of `updates` whole steps (act,
/// environment step, sample, update) for all K at once. Microseconds per step of the launch
/// (median of 5 launches) and agent-steps per second.
#[cfg(feature = "cuda")]
fn dqn_population(w: &BenchWindow<'_, '_>, updates: usize, members: &[usize]) -> Result<()> {
    use foxhunt_dqn::fused::FusedDqn;
    use foxhunt_dqn::{AgentConfig, CpuBackend, DqnAgent, DqnConfig};
    use foxhunt_gpu::DeviceBatch;
    use foxhunt_memory::{
        DeviceReplay, EpochKernel, EpochMember, EpochPopulation, GpuVecEnv, LearnRule, PlannedStep,
    };
    let (ctx, arena, m, env_cfg) = (w.ctx, w.arena, w.market, w.env);
    let (n_env, batch, steps) = (64, 64, updates.max(1));
    println!(
        "bench dqn: cuda, a population in one launch (EpochPopulation), each agent 64 environments over the bundled ES bars, batch {batch}, launches of {steps} steps"
    );
    println!(
        "{:>7} {:>14} {:>14} {:>16} {:>18}",
        "agents", "blocks/agent", "step us", "agent-steps/s", "us per agent-step"
    );
    struct Agent<'w> {
        cfg: AgentConfig,
        fused: FusedDqn,
        kernel: EpochKernel,
        ring: DeviceReplay,
        db: DeviceBatch,
        env: GpuVecEnv<'w>,
        rule: LearnRule,
    }
    for &k in members {
        let mut agents = Vec::with_capacity(k);
        for i in 0..k as u64 {
            let cfg = AgentConfig {
                seed: 1000 + i,
                dqn: DqnConfig {
                    batch_size: batch,
                    ..DqnConfig::default()
                },
                ..AgentConfig::default()
            };
            let agent = DqnAgent::<CpuBackend>::new(cfg.clone(), &Default::default())?;
            let fused = FusedDqn::new(ctx, &cfg, &agent.export_state(), 16 * steps + 64)?;
            let shape = foxhunt_trainer::net_shape(&cfg, fused.num_params());
            let mut env = GpuVecEnv::new(arena, env_cfg.clone(), 0..m.rows(), n_env, 7 + i)?;
            env.reset()?;
            agents.push(Agent {
                kernel: EpochKernel::new(ctx, shape, n_env, batch, steps.max(64))?,
                ring: DeviceReplay::new(ctx, n_env, 4096 / n_env)?,
                db: DeviceBatch::new(ctx, batch, cfg.obs_dim)?,
                rule: foxhunt_trainer::learn_rule(&cfg, 2 + i),
                env,
                fused,
                cfg,
            });
        }
        let mut population = EpochPopulation::new(ctx)?;
        let mut blocks = Vec::new();
        let mut run = |agents: &mut [Agent<'_>], n: usize, learn: bool| -> Result<f64> {
            let plans: Vec<Vec<PlannedStep>> = agents
                .iter()
                .map(|a| {
                    let done = a.fused.updates();
                    (0..n as u64)
                        .map(|s| planned_step(&a.cfg, true, learn, done + s))
                        .collect()
                })
                .collect();
            let mut launch = Vec::with_capacity(agents.len());
            for (a, plan) in agents.iter_mut().zip(&plans) {
                let (learner, first_stat) =
                    foxhunt_trainer::learner_buffers(a.fused.lend_for_updates(if learn {
                        n
                    } else {
                        0
                    })?);
                launch.push(EpochMember {
                    kernel: &mut a.kernel,
                    env: &mut a.env,
                    ring: &mut a.ring,
                    batch: &mut a.db,
                    first_stat,
                    learner,
                    rule: &a.rule,
                    plan,
                });
            }
            ctx.synchronize()?;
            let t0 = Instant::now();
            blocks = population.run(ctx, &mut launch)?;
            ctx.synchronize()?;
            let us = t0.elapsed().as_secs_f64() * 1e6;
            drop(launch);
            for a in agents.iter_mut() {
                let stats = a.fused.take_stats()?;
                ensure_finite(&stats)?;
            }
            Ok(us)
        };
        // The rings filled (64 rows), a warm-up launch, then the timed ones.
        run(&mut agents, 64, false)?;
        run(&mut agents, steps, true)?;
        let mut us: Vec<f64> = (0..5)
            .map(|_| run(&mut agents, steps, true).map(|t| t / steps as f64))
            .collect::<Result<_>>()?;
        let (step_us, _) = summarize(&mut us);
        println!(
            "{k:>7} {:>14} {step_us:>14.1} {:>16.0} {:>18.2}",
            blocks.first().copied().unwrap_or(0),
            k as f64 * 1e6 / step_us,
            step_us / k as f64
        );
    }
    Ok(())
}

/// `cargo xtask bench gpu-env` (xtask built with --features cuda): environment-steps per second
/// of the GPU environment over the bundled ES bars, N environments, 32-float observations; timed
/// from host clocks around K steps with a stream synchronize at both ends.
#[cfg(feature = "cuda")]
pub fn gpu_env(root: &Path, envs: usize, steps: usize, reps: usize) -> Result<()> {
    use foxhunt_gpu::{DeviceBatch, GpuContext};
    use foxhunt_memory::{DevicePool, DeviceReplay, GpuVecEnv, Pool, SampleSpec, WindowData};
    let (m, cfg, exec) = bench_market(root)?;
    let dim = cfg.obs_dim(m.cols());
    let ctx = GpuContext::new(0)?;
    println!(
        "bench gpu-env: {} on device 0, bundled ES data ({} rows x {} features), {envs} environments x {steps} steps, obs {dim} floats, {reps} repetitions",
        ctx.arch(),
        m.rows(),
        m.cols()
    );
    // Window upload: the arena built from the window's data (one copy per window), first into
    // fresh buffers, then into the pool's reused ones; beside a plain 256 MiB pageable copy as
    // the host-to-device reference rate.
    let data = WindowData {
        market: m.clone(),
        exec,
    };
    let mut pool = DevicePool::new(&ctx);
    let (mut fresh, mut reused) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for rep in 0..=reps {
        ctx.synchronize()?;
        let t0 = Instant::now();
        let arena = pool.window(&data)?;
        ctx.synchronize()?;
        let s = t0.elapsed().as_secs_f64();
        bytes = arena.uploaded_bytes();
        if rep == 0 {
            fresh.push(bytes as f64 / s / 1e9);
        } else {
            reused.push(bytes as f64 / s / 1e9);
        }
    }
    let big = vec![1u8; 256 << 20];
    let mut dst = ctx.alloc::<u8>(big.len())?;
    let mut reference = Vec::new();
    for _ in 0..reps.max(3) {
        ctx.synchronize()?;
        let t0 = Instant::now();
        ctx.write(&mut dst, &big)?;
        ctx.synchronize()?;
        reference.push(big.len() as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    let (ref_median, _) = summarize(&mut reference);
    let (reuse_median, _) = summarize(&mut reused);
    println!(
        "window upload: {:.1} MB; first (cudaMalloc + copy) {:.2} GB/s; reused buffers median {:.2} GB/s; reference: 256 MiB pageable host-to-device copy into an allocated buffer, median {:.2} GB/s; pool {:?}",
        bytes as f64 / 1e6,
        fresh[0],
        reuse_median,
        ref_median,
        pool.stats()
    );
    let arena = pool.window(&data)?;
    let actions: Vec<u8> = (0..envs as u64)
        .map(|i| (foxhunt_env::vec_env::mix64(i) % 3) as u8)
        .collect();
    // Stepping without and with replay writes, alternated in one run.
    let cap_rows = 64;
    let mut replay = DeviceReplay::new(&ctx, envs, cap_rows)?;
    let mut env = GpuVecEnv::new(&arena, cfg.clone(), 0..m.rows(), envs, 7)?;
    env.reset()?;
    let actions = env.upload_actions(&actions)?;
    let (mut plain, mut record) = (Vec::new(), Vec::new());
    for rep in 0..=reps {
        for recording in [false, true] {
            env.synchronize()?;
            let t0 = Instant::now();
            for _ in 0..steps {
                if recording {
                    env.step_record(&actions, &mut replay)?;
                } else {
                    env.step(&actions)?;
                }
            }
            env.synchronize()?;
            let rate = (envs * steps) as f64 / t0.elapsed().as_secs_f64() / 1e9;
            if rep > 0 {
                if recording {
                    record.push(rate)
                } else {
                    plain.push(rate)
                }
            }
        }
    }
    let (p_med, _) = summarize(&mut plain);
    let (r_med, _) = summarize(&mut record);
    // A rough count of device-memory traffic per env-step, ignoring caches: state read and
    // written (t, position, entry, steps, episode: 24 bytes each way), action read (1),
    // reward and done written (5), observation written (dim floats), the observation's feature
    // rows read (lookback x cols floats), and open/close/session/contract of bars t and t+1;
    // with replay writes, 22 more (t 4, position 4, entry 8, action 1, reward 4, done 1).
    let step_bytes = 24 * 2 + 1 + 5 + dim * 4 + cfg.lookback * m.cols() * 4 + 2 * (8 + 8 + 4 + 4);
    let rec_bytes = step_bytes + 22;
    println!(
        "env-steps/s without replay writes: median {p_med:.2} G (about {step_bytes} B/step, {:.0} GB/s)",
        p_med * step_bytes as f64
    );
    println!(
        "env-steps/s with replay writes:    median {r_med:.2} G (about {rec_bytes} B/step, {:.0} GB/s); ring {cap_rows} rows x {envs} environments",
        r_med * rec_bytes as f64
    );
    // Sampling a batch on the device from the full ring.
    let spec = SampleSpec {
        arena: &arena,
        env: &cfg,
        n_step: 3,
        gamma: 0.99,
        seed: 1,
    };
    for batch in [64usize, 1024] {
        let mut out = DeviceBatch::new(&ctx, batch, dim)?;
        let mut us = Vec::new();
        for rep in 0..=reps {
            env.synchronize()?;
            let t0 = Instant::now();
            for _ in 0..100 {
                replay.sample(&spec, &mut out)?;
            }
            env.synchronize()?;
            if rep > 0 {
                us.push(t0.elapsed().as_secs_f64() * 1e6 / 100.0);
            }
        }
        let (med, _) = summarize(&mut us);
        println!(
            "replay sample on the device, batch {batch}, 3-step returns: median {med:.1} us per batch (eager launches, synchronized per 100)"
        );
    }
    Ok(())
}

/// The device evaluation's settings that `bench eval --device cuda` times side by side (every
/// combination): each gives the same decisions. Read only by the CUDA build.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct DeviceVariants {
    /// Bars of a chunk walk.
    pub chunks: Vec<usize>,
    /// Stitch teams: `auto` or BLOCKS:ROWS.
    pub stitch: Vec<String>,
    /// Most bars a chunk walk decides a round.
    pub walk_rows: Vec<u32>,
    /// Threads of a chunk walk's block.
    pub walk_threads: Vec<u32>,
    /// `reuse` or `full`: how a walk in a position gets its first hidden layer.
    pub first_layer: Vec<String>,
    /// `auto` or 1 to 8: warps booking a session.
    pub book_warps: Vec<String>,
    /// `auto` or 1 to 8: blocks (one cluster) summing a split's rows.
    pub book_blocks: Vec<String>,
    /// `on` or `off`: stitch teams as thread-block clusters.
    pub stitch_clusters: Vec<String>,
    /// Networks judged together (a population's validations), timed beside as many judged one
    /// after another.
    pub members: Vec<usize>,
}

/// `cargo xtask bench eval [--device cpu|cuda]`: the greedy evaluation of the profile
/// configuration's validation month (the last window of its plan), for the untrained agent and
/// the agent a CPU run of the profile configuration keeps as best: the bar-by-bar backtest as
/// before, the host's rewrite, and (cuda) the device's decisions, side by side in one run, each
/// checked to decide and book the same.
pub fn eval(root: &Path, device: &str, reps: usize, variants: &DeviceVariants) -> Result<()> {
    use foxhunt_dqn::model::HostQNetwork;
    use foxhunt_dqn::{CpuBackend, DqnAgent, checkpoint};
    use foxhunt_trainer::eval::{BarByBar, book, host_targets};
    let out_dir = root.join("target/bench-eval");
    let _ = std::fs::remove_dir_all(&out_dir);
    let args = crate::profile::profile_args(root, "cpu", &out_dir, &[]);
    let train = crate::profile::profile_train_args(&args)?;
    println!("bench eval: training the profile configuration on the CPU for a kept agent ...");
    let report = train.run(&out_dir)?;
    let cfg = train.train_config()?;
    let dataset = train.loader.load()?;
    let plan = foxhunt_data::walkforward::plan(
        &dataset.series.row_days(),
        &train.windows.config()?.expect("profile windows"),
    )?;
    println!(
        "{:<7} {:>6} {:>9} {:>7} {:>7} {:>14} {:>12} {:>9} {:>12}",
        "window",
        "bars",
        "agent",
        "in pos",
        "trades",
        "bar by bar us",
        "host us",
        "speed-up",
        "booking us",
    );
    for w in &plan.windows {
        let Some(best) = report
            .windows
            .iter()
            .find(|r| r.index == w.index)
            .and_then(|r| r.best_epoch)
        else {
            continue;
        };
        let f = &dataset.features;
        let rows = w.train.rows.start..w.test.rows.end;
        let norm = foxhunt_data::Normalizer::fit(f, w.train.rows.clone());
        let market = MarketData::from_features(f, rows.clone(), Some(&norm))?;
        let exec = Execution::new(SpecTable::default().get("ES")?, cfg.costs);
        let split = w.val.rows.start - rows.start..w.val.rows.end - rows.start;
        let agent_cfg = cfg.agent_config(f.cols, w.index);
        let dev = Default::default();
        let trained = checkpoint::load::<CpuBackend>(
            &out_dir.join(format!(
                "windows/window-{:03}/best-epoch-{best:03}.ckpt",
                w.index
            )),
            &agent_cfg,
            &dev,
        )?;
        let untrained = DqnAgent::<CpuBackend>::new(agent_cfg.clone(), &dev)?;
        for (name, agent) in [("untrained", &untrained), ("trained", &trained)] {
            let net: HostQNetwork = agent.online_net().to_host();
            let time = |f: &mut dyn FnMut()| {
                let mut us: Vec<f64> = (0..reps)
                    .map(|_| {
                        let t0 = Instant::now();
                        f();
                        t0.elapsed().as_secs_f64() * 1e6
                    })
                    .collect();
                summarize(&mut us).0
            };
            let old = || {
                let mut p = BarByBar::new(net.clone(), &cfg.env);
                let r = foxhunt_env::backtest(
                    &market,
                    &exec,
                    &cfg.env,
                    split.clone(),
                    cfg.capital,
                    &mut p,
                )
                .expect("backtest");
                (p.decided, r)
            };
            let new = || {
                let t = host_targets(&net, &market, &exec, &cfg.env, split.clone());
                book(&t, &market, &exec, &cfg, split.clone()).expect("book")
            };
            let (decided, want) = old();
            anyhow::ensure!(
                new().metrics == want.metrics,
                "{name}: the host rewrite books other metrics"
            );
            // The two in turn, rep by rep, so that the machine's moods fall on both alike.
            let (mut old_us, mut host_us) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                let t0 = Instant::now();
                std::hint::black_box(old());
                old_us.push(t0.elapsed().as_secs_f64() * 1e6);
                let t0 = Instant::now();
                std::hint::black_box(new());
                host_us.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            let (old_us, host_us) = (summarize(&mut old_us).0, summarize(&mut host_us).0);
            let in_position =
                decided.iter().filter(|&&t| t != 0).count() as f64 / decided.len() as f64;
            let targets: Vec<i8> = decided.iter().map(|&t| t as i8).collect();
            let book_us = time(&mut || {
                book(&targets, &market, &exec, &cfg, split.clone()).expect("book");
            });
            println!(
                "{:<7} {:>6} {name:>9} {:>6.1}% {:>7} {old_us:>14.1} {host_us:>12.1} {:>8.1}x {book_us:>12.1}",
                w.index,
                split.len(),
                in_position * 100.0,
                want.metrics.trades,
                old_us / host_us,
            );
            if device == "cuda" {
                device_eval(
                    &market,
                    &exec,
                    &cfg,
                    &agent_cfg,
                    agent,
                    split.clone(),
                    &decided,
                    &want,
                    reps,
                    variants,
                )?;
            }
        }
    }
    println!(
        "bar by bar: one forward per bar inside the backtest (before); host: decisions with sessions on {} threads, several bars per forward pass, then the backtest's booking of them; booking: that booking alone",
        rayon::current_num_threads()
    );
    if device == "cuda" {
        println!(
            "device: decide = eval_flat + eval_chunks + eval_stitch, decisions read back; judge = decided and booked on the device, metrics read back (what an epoch's validation costs); + host booking = decisions read back and booked by the host; chain = the equity summed as one chain even where the parallel sum is exact"
        );
    }
    Ok(())
}

/// The device's decisions and metrics of `agent` over `split`, for each combination of
/// `variants`: median microseconds to decide (read back included), to judge (decide and book on
/// the device, metrics read back), to judge with the equity as one chain, and to decide and book
/// on the host; each checked against the bar-by-bar decisions and metrics.
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
fn device_eval(
    market: &MarketData,
    exec: &Execution,
    cfg: &foxhunt_trainer::TrainConfig,
    agent_cfg: &foxhunt_dqn::AgentConfig,
    agent: &foxhunt_dqn::DqnAgent<foxhunt_dqn::CpuBackend>,
    split: std::ops::Range<usize>,
    decided: &[i32],
    want: &foxhunt_env::BacktestReport,
    reps: usize,
    variants: &DeviceVariants,
) -> Result<()> {
    use foxhunt_gpu::GpuContext;
    use foxhunt_memory::{DeviceEvaluator, DevicePool, NetOnDevice, Stitch, WindowData};
    let firsts = switches(&variants.first_layer, "--first-layer", "reuse", "full")?;
    let book_warps = counts(
        &variants.book_warps,
        "--book-warps",
        foxhunt_memory::BOOK_WARPS,
    )?;
    let book_blocks = counts(
        &variants.book_blocks,
        "--book-blocks",
        foxhunt_memory::BOOK_BLOCKS,
    )?;
    let clusters = switches(&variants.stitch_clusters, "--stitch-clusters", "on", "off")?;
    let stitches = variants
        .stitch
        .iter()
        .map(|s| -> Result<(String, Option<Stitch>)> {
            if s == "auto" {
                return Ok((s.clone(), None));
            }
            let parsed = s
                .split_once(':')
                .and_then(|(t, r)| Some((t.parse().ok()?, r.parse().ok()?)));
            let Some((team, rows)) = parsed else {
                anyhow::bail!("--stitch {s}: expected auto or BLOCKS:ROWS");
            };
            Ok((s.clone(), Some(Stitch { team, rows })))
        })
        .collect::<Result<Vec<_>>>()?;
    let ctx = GpuContext::new(0)?;
    let mut pool = DevicePool::new(&ctx);
    let arena = pool.window(&WindowData {
        market: market.clone(),
        exec: *exec,
    })?;
    let mut ev = DeviceEvaluator::new(&arena, &cfg.env, market.session())?;
    let (words, max_width) = foxhunt_dqn::fused::layout_words(agent_cfg);
    let layout = ctx.upload(&words)?;
    let params = ctx.upload(&agent.export_state().online)?;
    let net = NetOnDevice {
        params: &params,
        layout: &layout,
        obs_dim: agent_cfg.obs_dim,
        max_width,
        first_width: agent_cfg.first_width(),
    };
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        f()?;
        let mut us = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t0 = Instant::now();
            f()?;
            us.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        Ok(summarize(&mut us).0)
    };
    let combos: Vec<Variant> = variants
        .chunks
        .iter()
        .flat_map(|c| stitches.iter().map(move |s| (c, s)))
        .flat_map(|cs| {
            variants
                .walk_rows
                .iter()
                .flat_map(move |w| variants.walk_threads.iter().map(move |t| (cs, (w, t))))
        })
        .flat_map(|csw| firsts.iter().map(move |f| (csw, f)))
        .flat_map(|cswf| book_warps.iter().map(move |b| (cswf, b)))
        .flat_map(|cswfb| book_blocks.iter().map(move |t| (cswfb, t)))
        .flat_map(|cswfbt| clusters.iter().map(move |c| (cswfbt, c)))
        .map(
            |(
                (((((&chunk, (label, team)), (&walk, &threads)), &reuse), &book), &total),
                &clustered,
            )| Variant {
                chunk: Some(chunk),
                label: label.clone(),
                team: *team,
                walk,
                threads,
                reuse,
                book,
                total,
                clustered,
            },
        )
        .collect();
    for v in &combos {
        let (chunk, label, walk, threads, reuse) =
            (v.chunk_label(), &v.label, v.walk, v.threads, v.reuse);
        let book = v.book.map_or_else(|| "auto".into(), |w| w.to_string());
        let total = v.total.map_or_else(|| "auto".into(), |b| b.to_string());
        let clustered = if v.clustered { "on" } else { "off" };
        v.set(&mut ev)?;
        let first = if reuse { "reuse" } else { "full" };
        let targets = ev.targets(&net, split.clone())?;
        anyhow::ensure!(
            targets
                .iter()
                .zip(decided)
                .all(|(&a, &b)| i32::from(a) == b),
            "chunks of {chunk}, stitch {label}: the device decides otherwise than bar by bar"
        );
        let judged = ev.judge(&net, split.clone(), cfg.capital)?;
        anyhow::ensure!(
            format!("{judged:?}") == format!("{:?}", want.metrics),
            "chunks of {chunk}, stitch {label}: the device books other metrics"
        );
        let decide = time(&mut || Ok(ev.targets(&net, split.clone()).map(|_| ())?))?;
        let judge = time(&mut || Ok(ev.judge(&net, split.clone(), cfg.capital).map(|_| ())?))?;
        ev.set_chain_only(true);
        let chain = time(&mut || Ok(ev.judge(&net, split.clone(), cfg.capital).map(|_| ())?))?;
        ev.set_chain_only(false);
        let host_book = time(&mut || {
            let t = ev.targets(&net, split.clone())?;
            foxhunt_trainer::eval::book(&t, market, exec, cfg, split.clone())?;
            Ok(())
        })?;
        // Where a judgement's time goes: device timestamps between its kernels, median of reps.
        let kernels = kernel_us(&mut ev, reps, &mut |ev| {
            ev.judge(&net, split.clone(), cfg.capital).map(|_| ())?;
            Ok(())
        })?;
        println!(
            "  device, chunks of {chunk:>4} (walk rows {walk:>2}, threads {threads:>4}), stitch {label:>5}, first layer {first:>5}, book warps {book:>4}, book blocks {total:>4}, clusters {clustered:>3}: decide {decide:>9.1} us, judge {judge:>9.1} us, judge (chain) {chain:>9.1} us, decide + host booking {host_book:>9.1} us; kernels us: {kernels}"
        );
    }
    Variant::default().set(&mut ev)?;
    if !variants.members.is_empty() {
        population_eval(
            &ctx,
            &mut ev,
            agent_cfg,
            agent,
            split,
            cfg.capital,
            reps,
            &variants.members,
            &combos,
        )?;
    }
    Ok(())
}

/// A count's list as given to `flag`: each `auto` (`None`) or 1 to `max`.
#[cfg(feature = "cuda")]
fn counts(list: &[String], flag: &str, max: u32) -> Result<Vec<Option<u32>>> {
    list.iter()
        .map(|v| match v.as_str() {
            "auto" => Ok(None),
            _ => match v.parse::<u32>() {
                Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
                _ => anyhow::bail!("{flag} {v}: expected auto or 1 to {max}"),
            },
        })
        .collect()
}

/// A two-way setting's list as given to `flag`: each `yes` or `no`.
#[cfg(feature = "cuda")]
fn switches(list: &[String], flag: &str, yes: &str, no: &str) -> Result<Vec<bool>> {
    list.iter()
        .map(|v| match v.as_str() {
            v if v == yes => Ok(true),
            v if v == no => Ok(false),
            _ => anyhow::bail!("{flag} {v}: expected {yes} or {no}"),
        })
        .collect()
}

/// One combination of the device evaluation's settings (`bench eval`'s lists).
#[cfg(feature = "cuda")]
struct Variant {
    /// Bars a chunk; `None`: the evaluator's choice for the networks judged.
    chunk: Option<usize>,
    label: String,
    team: Option<foxhunt_memory::Stitch>,
    walk: u32,
    /// Threads of a chunk walk's block.
    threads: u32,
    reuse: bool,
    /// Warps booking a session; `None`: the evaluator's choice.
    book: Option<u32>,
    /// Blocks summing the split's rows; `None`: the evaluator's choice.
    total: Option<u32>,
    /// Stitch teams as thread-block clusters.
    clustered: bool,
}

#[cfg(feature = "cuda")]
impl Default for Variant {
    /// The evaluator's own settings.
    fn default() -> Self {
        Self {
            chunk: None,
            label: "auto".into(),
            team: None,
            walk: foxhunt_memory::WALK_ROWS,
            threads: foxhunt_memory::WALK_THREADS,
            reuse: true,
            book: None,
            total: None,
            clustered: true,
        }
    }
}

#[cfg(feature = "cuda")]
impl Variant {
    fn set(&self, ev: &mut foxhunt_memory::DeviceEvaluator<'_>) -> Result<()> {
        ev.set_chunk_bars(self.chunk);
        ev.set_stitch(self.team)?;
        ev.set_walk_rows(self.walk);
        ev.set_walk_threads(self.threads)
            .map_err(|e| anyhow::anyhow!("--walk-threads {}: {e}", self.threads))?;
        ev.set_first_layer_reuse(self.reuse);
        ev.set_book_warps(self.book);
        ev.set_book_blocks(self.total);
        ev.set_stitch_clusters(self.clustered);
        Ok(())
    }
    /// The chunk's bars as printed: `auto` for the evaluator's choice.
    fn chunk_label(&self) -> String {
        self.chunk.map_or_else(|| "auto".into(), |c| c.to_string())
    }
}

/// Median microseconds each kernel of a judgement took over `reps` calls of `judge` (device
/// timestamps between the kernels), labelled.
#[cfg(feature = "cuda")]
fn kernel_us(
    ev: &mut foxhunt_memory::DeviceEvaluator<'_>,
    reps: usize,
    judge: &mut dyn FnMut(&mut foxhunt_memory::DeviceEvaluator<'_>) -> Result<()>,
) -> Result<String> {
    ev.set_kernel_timing(true);
    let mut per_kernel: Vec<Vec<f64>> = Vec::new();
    for _ in 0..reps {
        judge(ev)?;
        for (k, ms) in ev.kernel_ms()?.into_iter().enumerate() {
            if per_kernel.len() <= k {
                per_kernel.push(Vec::new());
            }
            per_kernel[k].push(ms * 1e3);
        }
    }
    ev.set_kernel_timing(false);
    Ok([
        "flat",
        "chunks",
        "stitch",
        "book steps",
        "book sessions",
        "book total",
    ]
    .iter()
    .zip(&mut per_kernel)
    .map(|(name, us)| format!("{name} {:.1}", summarize(us).0))
    .collect::<Vec<_>>()
    .join(", "))
}

/// A population's validations: for each K of `members`, K networks (`agent` and differently
/// seeded untrained ones) judged in one evaluation (`judge_all`) beside the same K judged one
/// after another, median microseconds of `reps`; the metrics checked equal first. Then the
/// evaluation of the K together under each of `combos` (checked equal too), with its kernels.
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
fn population_eval(
    ctx: &std::sync::Arc<foxhunt_gpu::GpuContext>,
    ev: &mut foxhunt_memory::DeviceEvaluator<'_>,
    agent_cfg: &foxhunt_dqn::AgentConfig,
    agent: &foxhunt_dqn::DqnAgent<foxhunt_dqn::CpuBackend>,
    split: std::ops::Range<usize>,
    capital: f64,
    reps: usize,
    members: &[usize],
    combos: &[Variant],
) -> Result<()> {
    use foxhunt_dqn::{CpuBackend, DqnAgent};
    use foxhunt_memory::NetOnDevice;
    let most = members.iter().copied().max().unwrap_or(1);
    let (words, max_width) = foxhunt_dqn::fused::layout_words(agent_cfg);
    let layout = ctx.upload(&words)?;
    let mut params = vec![ctx.upload(&agent.export_state().online)?];
    for k in 1..most {
        let mut c = agent_cfg.clone();
        c.seed = agent_cfg.seed + 1000 + k as u64;
        let a = DqnAgent::<CpuBackend>::new(c, &Default::default())?;
        params.push(ctx.upload(&a.export_state().online)?);
    }
    let nets: Vec<NetOnDevice<'_>> = params
        .iter()
        .map(|p| NetOnDevice {
            params: p,
            layout: &layout,
            obs_dim: agent_cfg.obs_dim,
            max_width,
            first_width: agent_cfg.first_width(),
        })
        .collect();
    for &k in members {
        let nets = &nets[..k.max(1)];
        let alone = |ev: &mut foxhunt_memory::DeviceEvaluator<'_>| -> Result<Vec<String>> {
            nets.iter()
                .map(|n| Ok(format!("{:?}", ev.judge(n, split.clone(), capital)?)))
                .collect()
        };
        let together = |ev: &mut foxhunt_memory::DeviceEvaluator<'_>| -> Result<Vec<String>> {
            Ok(ev
                .judge_all(nets, split.clone(), capital)?
                .iter()
                .map(|m| format!("{m:?}"))
                .collect())
        };
        let want = alone(ev)?;
        anyhow::ensure!(
            want == together(ev)?,
            "{k} networks judged together book other metrics than each alone"
        );
        // In turn, rep by rep, so that the machine's moods fall on both alike.
        let (mut one_by_one, mut all) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let t0 = Instant::now();
            alone(ev)?;
            one_by_one.push(t0.elapsed().as_secs_f64() * 1e6);
            let t0 = Instant::now();
            together(ev)?;
            all.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        let (one_by_one, all) = (summarize(&mut one_by_one).0, summarize(&mut all).0);
        println!(
            "  device, {k:>3} networks: one after another {one_by_one:>10.1} us, together {all:>10.1} us ({:.1} us a network, {:.2}x)",
            all / k as f64,
            one_by_one / all
        );
        if combos.len() < 2 {
            continue;
        }
        for v in combos {
            v.set(ev)?;
            anyhow::ensure!(
                want == together(ev)?,
                "{k} networks together, chunks of {}, stitch {}: other metrics",
                v.chunk_label(),
                v.label
            );
            let mut us: Vec<f64> = (0..reps)
                .map(|_| {
                    let t0 = Instant::now();
                    together(ev).map(|_| t0.elapsed().as_secs_f64() * 1e6)
                })
                .collect::<Result<_>>()?;
            let kernels = kernel_us(ev, reps, &mut |ev| together(ev).map(|_| ()))?;
            println!(
                "    {k:>3} together, chunks of {:>4} (walk rows {:>2}, threads {:>4}), stitch {:>5}: {:>10.1} us; kernels us: {kernels}",
                v.chunk_label(),
                v.walk,
                v.threads,
                v.label,
                summarize(&mut us).0
            );
        }
        Variant::default().set(ev)?;
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::too_many_arguments)]
fn device_eval(
    _: &MarketData,
    _: &Execution,
    _: &foxhunt_trainer::TrainConfig,
    _: &foxhunt_dqn::AgentConfig,
    _: &foxhunt_dqn::DqnAgent<foxhunt_dqn::CpuBackend>,
    _: std::ops::Range<usize>,
    _: &[i32],
    _: &foxhunt_env::BacktestReport,
    _: usize,
    _: &DeviceVariants,
) -> Result<()> {
    anyhow::bail!("bench eval --device cuda needs xtask built with --features cuda")
}
