//! The host window arena and its pool: one copy per window, none per epoch, buffers reused from
//! window to window.

use std::path::{Path, PathBuf};

use foxhunt_data::{
    Adjustment, Dataset, FeatureConfig, LoadOptions, Normalizer, SessionCalendar, SymbolSelector,
};
use foxhunt_env::{Costs, EnvConfig, Execution, MarketData, SpecTable, VecEnv};
use foxhunt_memory::{HostPool, WindowData};

fn test_data() -> PathBuf {
    std::env::var_os("FOXHUNT_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../test_data"))
}

fn window(rows: std::ops::Range<usize>, d: &Dataset) -> WindowData {
    let n = Normalizer::fit(&d.features, rows.clone());
    let spec = SpecTable::default().get("ES").expect("ES").clone();
    WindowData {
        market: MarketData::from_features(&d.features, rows, Some(&n)),
        exec: Execution::new(&spec, Costs::default()),
    }
}

#[test]
fn a_window_is_copied_once_and_its_buffers_serve_the_next_window() {
    let d = Dataset::load(
        &test_data().join("futures-baseline"),
        &SymbolSelector::parse("ES.FUT").expect("valid"),
        &LoadOptions::default(),
        &SessionCalendar::cme(),
        Adjustment::Difference,
        &FeatureConfig::default(),
    )
    .expect("bundled data");
    let (w0, w1, w2) = (
        window(0..6000, &d),
        window(3000..8000, &d),
        window(0..9000, &d),
    );
    let mut pool = HostPool::new();
    {
        let arena = pool.window(&w0);
        assert_eq!(
            arena.market(),
            &w0.market,
            "the arena holds the window's data"
        );
        let after_upload = arena.pool_stats();
        assert_eq!(after_upload.uploaded, w0.bytes());
        assert_eq!(after_upload.allocated, w0.bytes());
        // Epochs 2..N step environments over the resident data and copy nothing.
        let mut obs = vec![0f32; 16 * EnvConfig::default().obs_dim(w0.market.cols)];
        for e in 1..4 {
            let epoch = arena.epoch(e);
            let a = epoch.arena();
            let mut env = VecEnv::new(
                a.market(),
                *a.exec(),
                EnvConfig::default(),
                0..4000,
                16,
                e as u64,
            )
            .expect("env");
            env.reset(&mut obs);
            let (mut r, mut dn) = (vec![0f32; 16], vec![0u8; 16]);
            for _ in 0..50 {
                env.step(&[2; 16], &mut obs, &mut r, &mut dn);
            }
            assert_eq!(
                arena.pool_stats(),
                after_upload,
                "epoch {e} copied window data"
            );
        }
    }
    // A smaller window reuses every buffer: nothing new is allocated.
    let before = pool.stats();
    {
        let arena = pool.window(&w1);
        assert_eq!(arena.market(), &w1.market);
    }
    let s = pool.stats();
    assert_eq!(
        s.allocated, before.allocated,
        "no allocation for a smaller window"
    );
    assert_eq!(s.reused, w1.bytes());
    assert_eq!(s.uploaded, w0.bytes() + w1.bytes());
    assert_eq!(s.peak, w0.bytes());
    // A larger one allocates anew, and the peak grows by what it holds beside the old buffers.
    {
        let arena = pool.window(&w2);
        assert_eq!(arena.market(), &w2.market);
    }
    let s2 = pool.stats();
    assert_eq!(s2.allocated, w0.bytes() + w2.bytes());
    assert_eq!(s2.peak, w0.bytes() + w2.bytes());
    assert_eq!(s2.allocations, 12);
}
