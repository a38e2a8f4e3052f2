//! The host window arena and its pool: one copy per window, none per epoch, buffers reused from
//! window to window.

use foxhunt_env::{EnvConfig, VecEnv};
use foxhunt_memory::{HostPool, Pool, WindowData};

fn window(rows: std::ops::Range<usize>) -> WindowData {
    WindowData {
        market: foxhunt_testkit::es_market(rows),
        exec: foxhunt_testkit::es_execution(),
    }
}

#[test]
fn a_window_is_copied_once_and_its_buffers_serve_the_next_window() {
    let (w0, w1, w2) = (window(0..6000), window(3000..8000), window(0..9000));
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
        let mut obs = vec![0f32; 16 * EnvConfig::default().obs_dim(w0.market.cols())];
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
