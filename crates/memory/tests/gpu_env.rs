//! The GPU environment against the CPU reference, step for step on real ES bars; the device
//! arena's one upload and pool reuse; the replay ring and its sampler. Needs the `cuda` feature
//! and FOXHUNT_GPU_TESTS=1 (a no-op otherwise).
#![cfg(feature = "cuda")]

use std::sync::Arc;

use foxhunt_env::{EnvConfig, Execution, MarketData};
use foxhunt_gpu::{DeviceBatch, GpuContext};
use foxhunt_memory::{DevicePool, Pool, WindowData};

/// The real part of the bundled ES data, normalized over itself, and ES's terms.
fn es() -> (MarketData, Execution) {
    (
        foxhunt_testkit::es_market(foxhunt_testkit::es_real_rows()),
        foxhunt_testkit::es_execution(),
    )
}

/// The device, or None (test skipped) unless FOXHUNT_GPU_TESTS=1.
fn gpu_or_skip() -> Option<Arc<GpuContext>> {
    foxhunt_testkit::gpu_tests()
        .then(|| GpuContext::new(0).unwrap_or_else(|e| panic!("FOXHUNT_GPU_TESTS=1 but {e}")))
}

#[test]
fn gpu_environment_matches_the_cpu_reference() {
    use foxhunt_env::VecEnv;
    use foxhunt_memory::GpuVecEnv;
    let Some(ctx) = gpu_or_skip() else { return };
    let (m, x) = es();
    let mut pool = DevicePool::new(&ctx);
    let data = WindowData {
        market: m.clone(),
        exec: x,
    };
    let arena = pool.window(&data).expect("upload");
    for (cfg, label) in [
        (EnvConfig::default(), "default"),
        (
            EnvConfig {
                lookback: 3,
                max_position: 2,
                episode_steps: 200,
                risk_penalty: 0.5,
                ..EnvConfig::default()
            },
            "lookback 3, +-2, truncation, penalty",
        ),
        (
            EnvConfig {
                session_rule: foxhunt_env::SessionRule::Hold,
                ..EnvConfig::default()
            },
            "hold across sessions",
        ),
    ] {
        let (n, steps, seed, split) = (4096usize, 3000usize, 17u64, 200..m.rows());
        let dim = cfg.obs_dim(m.cols());
        let mut cpu = VecEnv::new(&m, x, cfg.clone(), split.clone(), n, seed).expect("cpu env");
        let mut gpu = GpuVecEnv::new(&arena, cfg.clone(), split.clone(), n, seed).expect("gpu env");
        let (mut obs, mut rew, mut dn) = (vec![0f32; n * dim], vec![0f32; n], vec![0u8; n]);
        cpu.reset(&mut obs);
        gpu.reset().expect("reset");
        assert_eq!(
            gpu.download(&gpu.obs).expect("obs"),
            obs,
            "{label}: reset observations"
        );
        let (mut worst, mut done_count) = (0f32, 0usize);
        for step in 0..steps {
            // Actions from the observation, so that a divergence anywhere feeds back.
            let actions: Vec<u8> = (0..n)
                .map(|i| {
                    ((obs[i * dim].to_bits() as usize ^ (step * 31 + i)) % cfg.actions()) as u8
                })
                .collect();
            cpu.step(&actions, &mut obs, &mut rew, &mut dn);
            let a = gpu.upload_actions(&actions).expect("upload");
            gpu.step(&a).expect("step");
            let (g_obs, g_rew, g_dn) = (
                gpu.download(&gpu.obs).expect("obs"),
                gpu.download(&gpu.rewards).expect("rew"),
                gpu.download(&gpu.dones).expect("dones"),
            );
            let (g_t, g_pos) = gpu.state().expect("state");
            assert_eq!(g_dn, dn, "{label}: done codes at step {step}");
            assert_eq!(g_t, cpu.bar_index(), "{label}: bar indices at step {step}");
            assert_eq!(g_pos, cpu.positions(), "{label}: positions at step {step}");
            for (a, b) in rew.iter().zip(&g_rew) {
                let rel = (a - b).abs() / a.abs().max(1e-6);
                worst = worst.max(rel);
                assert!(rel <= 1e-5, "{label}: reward {a} vs {b} at step {step}");
            }
            assert_eq!(g_obs, obs, "{label}: observations at step {step}");
            done_count += dn.iter().filter(|&&d| d != 0).count();
        }
        println!(
            "{label}: {n} environments x {steps} steps on real ES bars: bar indices, positions, done codes and observations equal; worst reward relative difference {worst:e}; {done_count} episode ends"
        );
    }
}

#[test]
fn the_device_arena_uploads_once_and_the_pool_reuses_its_buffers() {
    use foxhunt_memory::GpuVecEnv;
    let Some(ctx) = gpu_or_skip() else { return };
    let (m, x) = es();
    let half = m.rows() / 2;
    let real = foxhunt_testkit::es_real_rows();
    let small = WindowData {
        market: foxhunt_testkit::es_market(real.start..real.start + half),
        exec: x,
    };
    let full = WindowData {
        market: m.clone(),
        exec: x,
    };
    let mut pool = DevicePool::new(&ctx);
    {
        let arena = pool.window(&full).expect("upload");
        let after_upload = arena.pool_stats();
        assert_eq!(after_upload.uploaded, arena.uploaded_bytes());
        assert_eq!(after_upload.allocations, 5, "five market buffers");
        // Epochs 2..N: environments over the resident window, stepping; no window upload.
        for e in 1..4 {
            let epoch = arena.epoch(e);
            let mut env = GpuVecEnv::new(
                epoch.arena(),
                EnvConfig::default(),
                0..m.rows(),
                1024,
                e as u64,
            )
            .expect("env");
            env.reset().expect("reset");
            let a = env.upload_actions(&vec![2u8; 1024]).expect("actions");
            for _ in 0..100 {
                env.step(&a).expect("step");
            }
            env.synchronize().expect("sync");
            assert_eq!(
                arena.pool_stats(),
                after_upload,
                "epoch {e} uploaded window data"
            );
        }
    }
    let before = pool.stats();
    {
        let arena = pool.window(&small).expect("upload");
        let s = arena.pool_stats();
        assert_eq!(
            s.allocations, before.allocations,
            "no cudaMalloc for a window that fits"
        );
        assert_eq!(s.allocated, before.allocated);
        assert_eq!(s.reused, arena.uploaded_bytes());
        // The reused buffers hold the new window: a GPU environment over them matches the CPU.
        let mut cpu =
            foxhunt_env::VecEnv::new(&small.market, x, EnvConfig::default(), 0..half, 64, 3)
                .expect("cpu");
        let mut gpu = GpuVecEnv::new(&arena, EnvConfig::default(), 0..half, 64, 3).expect("gpu");
        let dim = EnvConfig::default().obs_dim(m.cols());
        let mut obs = vec![0f32; 64 * dim];
        cpu.reset(&mut obs);
        gpu.reset().expect("reset");
        assert_eq!(gpu.download(&gpu.obs).expect("obs"), obs);
    }
    println!("device pool after two windows: {:?}", pool.stats());
}

#[test]
fn the_step_kernel_writes_the_replay_ring_and_sampling_on_the_device_matches_the_host() {
    use foxhunt_env::VecEnv;
    use foxhunt_env::vec_env::observe;
    use foxhunt_gpu::philox::philox4x32_10;
    use foxhunt_memory::{DeviceReplay, GpuVecEnv, SampleSpec};
    let Some(ctx) = gpu_or_skip() else { return };
    let (m, x) = es();
    let data = WindowData {
        market: m.clone(),
        exec: x,
    };
    let mut pool = DevicePool::new(&ctx);
    let arena = pool.window(&data).expect("upload");
    let cfg = EnvConfig {
        episode_steps: 40,
        lookback: 2,
        ..EnvConfig::default()
    };
    let (n, cap, steps, seed) = (512usize, 64usize, 150usize, 5u64);
    let dim = cfg.obs_dim(m.cols());
    let mut cpu = VecEnv::new(&m, x, cfg.clone(), 0..m.rows(), n, seed).expect("cpu");
    let mut gpu = GpuVecEnv::new(&arena, cfg.clone(), 0..m.rows(), n, seed).expect("gpu");
    let mut replay = DeviceReplay::new(&ctx, n, cap).expect("ring");
    let (mut obs, mut rew, mut dn) = (vec![0f32; n * dim], vec![0f32; n], vec![0u8; n]);
    cpu.reset(&mut obs);
    gpu.reset().expect("reset");
    // The CPU reference's rows: state before the step, action, reward, done.
    // (bars, positions, entries, actions, rewards, done codes) of every environment, per step.
    type Row = (Vec<u32>, Vec<i32>, Vec<f64>, Vec<u8>, Vec<f32>, Vec<u8>);
    let mut rows: Vec<Row> = Vec::new();
    for step in 0..steps {
        let actions: Vec<u8> = (0..n).map(|i| ((i * 7 + step * 3) % 3) as u8).collect();
        let before = (
            cpu.bar_index().to_vec(),
            cpu.positions().to_vec(),
            cpu.entries().to_vec(),
        );
        cpu.step(&actions, &mut obs, &mut rew, &mut dn);
        rows.push((
            before.0,
            before.1,
            before.2,
            actions.clone(),
            rew.clone(),
            dn.clone(),
        ));
        let a = gpu.upload_actions(&actions).expect("upload");
        gpu.step_record(&a, &mut replay).expect("step");
    }
    let ring = replay.download().expect("ring");
    let (rt, rp, re, ra, rr, rd) = (
        ring.t,
        ring.position,
        ring.entry,
        ring.action,
        ring.reward,
        ring.done,
    );
    for (row, r) in rows.iter().enumerate().skip(steps - cap) {
        let base = (row % cap) * n;
        assert_eq!(&rt[base..base + n], &r.0[..], "ring bars, row {row}");
        assert_eq!(&rp[base..base + n], &r.1[..], "ring positions, row {row}");
        assert_eq!(&re[base..base + n], &r.2[..], "ring entries, row {row}");
        assert_eq!(&ra[base..base + n], &r.3[..], "ring actions, row {row}");
        assert_eq!(&rr[base..base + n], &r.4[..], "ring rewards, row {row}");
        assert_eq!(&rd[base..base + n], &r.5[..], "ring done codes, row {row}");
    }
    // Sampling: the device's batch equals the same Philox draws resolved on the host.
    let (batch, n_step, gamma, sseed) = (1024usize, 3u32, 0.97f32, 99u64);
    let spec = SampleSpec {
        arena: &arena,
        env: &cfg,
        n_step,
        gamma,
        seed: sseed,
    };
    let mut out = DeviceBatch::new(&ctx, batch, dim).expect("batch");
    for _ in 0..2 {
        let draw = replay.draws();
        replay.sample(&spec, &mut out).expect("sample");
        let h = out.download(&ctx).expect("batch");
        let (o, a, g, no, d, w) = (
            h.obs,
            h.actions,
            h.returns,
            h.next_obs,
            h.discounts,
            h.weights,
        );
        let written = steps as u64;
        let oldest = written - cap as u64;
        let starts = written - oldest - u64::from(n_step);
        let (mut terminal, mut truncated) = (0, 0);
        for b in 0..batch {
            let r = philox4x32_10(
                [b as u32, draw as u32, (draw >> 32) as u32, 0x5EED],
                [sseed as u32, (sseed >> 32) as u32],
            );
            let row = oldest + ((u64::from(r[0]) << 32 | u64::from(r[1])) % starts);
            let env = (r[2] as usize) % n;
            let slot = |row: u64| ((row % cap as u64) as usize) * n + env;
            let (mut ret, mut disc, mut weight, mut k) = (0f32, 1f32, 1f32, 0u64);
            while k < u64::from(n_step) {
                let s = slot(row + k);
                ret += disc * rr[s];
                disc *= gamma;
                k += 1;
                if rd[s] == 1 {
                    disc = 0.0;
                    terminal += 1;
                    break;
                }
                if rd[s] == 2 {
                    weight = 0.0;
                    truncated += 1;
                    break;
                }
            }
            let (s0, sn) = (slot(row), slot(row + k));
            let mut want = vec![0f32; dim];
            observe(
                &m,
                &cfg,
                x.tick_size,
                rt[s0] as usize,
                rp[s0],
                re[s0],
                &mut want,
            );
            assert_eq!(&o[b * dim..(b + 1) * dim], &want[..], "obs of sample {b}");
            observe(
                &m,
                &cfg,
                x.tick_size,
                rt[sn] as usize,
                rp[sn],
                re[sn],
                &mut want,
            );
            assert_eq!(
                &no[b * dim..(b + 1) * dim],
                &want[..],
                "next obs of sample {b}"
            );
            assert_eq!(a[b], i32::from(ra[s0]), "action of sample {b}");
            assert_eq!(
                (g[b], d[b], w[b]),
                (ret, disc, weight),
                "return of sample {b}"
            );
        }
        assert!(
            terminal > 0 && truncated > 0,
            "the batch covers terminal and truncated ends"
        );
        println!(
            "sampled {batch} transitions on the device equal to the host: {terminal} terminal, {truncated} truncated"
        );
    }
}
