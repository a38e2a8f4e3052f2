//! The GPU environment against the CPU reference, step for step on real ES bars. Needs the
//! `cuda` feature and FOXHUNT_GPU_TESTS=1; without the feature, the twin's error is checked.

#[cfg(feature = "cuda")]
use std::path::{Path, PathBuf};

#[cfg(feature = "cuda")]
use foxhunt_data::{
    Adjustment, Dataset, FeatureConfig, LoadOptions, SessionCalendar, SymbolSelector,
};
#[cfg(feature = "cuda")]
use foxhunt_env::{Costs, EnvConfig, Execution, MarketData, SpecTable};
use foxhunt_memory::GpuContext;

#[cfg(feature = "cuda")]
fn test_data() -> PathBuf {
    std::env::var_os("FOXHUNT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../test_data"))
}

#[cfg(feature = "cuda")]
#[cfg(feature = "cuda")]
fn es() -> (MarketData, Execution) {
    let d = Dataset::load(
        &test_data().join("futures-baseline"),
        &SymbolSelector::parse("ES.FUT").expect("valid"),
        &LoadOptions::default(),
        &SessionCalendar::cme(),
        Adjustment::Difference,
        &FeatureConfig::default(),
    )
    .expect("bundled data");
    let n = foxhunt_data::Normalizer::fit(&d.features, 0..d.features.rows);
    let spec = SpecTable::default().get("ES").expect("ES").clone();
    (
        MarketData::from_features(&d.features, 0..d.features.rows, Some(&n)),
        Execution::new(&spec, Costs::default()),
    )
}

#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_cuda_feature_the_gpu_says_so() {
    let err = GpuContext::new(0).err().expect("no CUDA in this build");
    assert!(matches!(err, foxhunt_memory::MemoryError::NoCuda(_)));
    assert!(
        err.to_string()
            .starts_with("no CUDA device found: this build has no CUDA support"),
        "{err}"
    );
}

#[cfg(feature = "cuda")]
#[test]
fn gpu_environment_matches_the_cpu_reference() {
    use foxhunt_env::VecEnv;
    use foxhunt_memory::GpuVecEnv;
    if std::env::var("FOXHUNT_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set FOXHUNT_GPU_TESTS=1 to run on a CUDA device");
        return;
    }
    let ctx = match GpuContext::new(0) {
        Ok(c) => c,
        Err(e) => panic!("FOXHUNT_GPU_TESTS=1 but {e}"),
    };
    let (m, x) = es();
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
        let (n, steps, seed, split) = (4096usize, 3000usize, 17u64, 200..m.rows);
        let dim = cfg.obs_dim(m.cols);
        let mut cpu = VecEnv::new(&m, x, cfg.clone(), split.clone(), n, seed).expect("cpu env");
        let mut gpu =
            GpuVecEnv::new(&ctx, &m, x, cfg.clone(), split.clone(), n, seed).expect("gpu env");
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
