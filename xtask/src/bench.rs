//! `cargo xtask bench data`: times load + validate + roll + features of synthetic ES years.
//! Benchmarks live here, not in tests: timings are reported, never asserted.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use foxhunt_data::continuous::build_continuous;
use foxhunt_data::features::compute_features;
use foxhunt_data::read::load_path;
use foxhunt_data::{Adjustment, FeatureConfig, LoadOptions, SessionCalendar, SymbolSelector};

/// Median and minimum of a sample of durations in milliseconds.
pub fn summarize(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[0])
}

pub fn data(root: &Path, years: u32, reps: usize) -> Result<()> {
    let file = root.join(format!(
        "target/bench-data/es-synth-{years}y.ohlcv-1m.dbn.zst"
    ));
    if !file.exists() {
        crate::synth::run(&file, "2019-01-02", years, 7)?;
    }
    let selector = SymbolSelector::Parent("ES".into());
    let opts = LoadOptions::default();
    let calendar = SessionCalendar::cme();
    let cfg = FeatureConfig::default();
    let (mut read, mut roll, mut feat, mut total) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut rows = 0;
    let mut bars_read = 0;
    for _ in 0..reps {
        let t0 = Instant::now();
        let raw = load_path(&file, &selector, &opts)?;
        let t1 = Instant::now();
        let series = build_continuous("ES", &raw.contracts, &calendar, Adjustment::Difference)?;
        let t2 = Instant::now();
        let m = compute_features(&series, &calendar, &cfg);
        let t3 = Instant::now();
        rows = m.rows;
        bars_read = raw.bar_count();
        read.push((t1 - t0).as_secs_f64() * 1e3);
        roll.push((t2 - t1).as_secs_f64() * 1e3);
        feat.push((t3 - t2).as_secs_f64() * 1e3);
        total.push((t3 - t0).as_secs_f64() * 1e3);
    }
    println!(
        "bench data: {} ({bars_read} bars read over all contracts, {rows} continuous rows), {reps} repetitions",
        file.display()
    );
    println!("{:<28} {:>10} {:>10}", "phase", "median ms", "min ms");
    for (name, s) in [
        ("read+validate (DBN zstd)", &mut read),
        ("roll+adjust", &mut roll),
        ("features", &mut feat),
        ("total", &mut total),
    ] {
        let (med, min) = summarize(s);
        println!("{name:<28} {med:>10.2} {min:>10.2}");
    }
    let (med, _) = summarize(&mut total);
    println!(
        "throughput: {:.1} M bars/s (bars read / median total)",
        bars_read as f64 / med / 1e3
    );
    Ok(())
}
