//! foxhunt-data's integration tests, on the real exchange data in test_data/ wherever it serves.

use std::path::{Path, PathBuf};

use foxhunt_data::continuous::build_continuous;
use foxhunt_data::features::compute_features;
use foxhunt_data::read::{load_bytes, load_path};
use foxhunt_data::session::{date_to_day, day_to_date};
use foxhunt_data::walkforward::plan;
use foxhunt_data::*;

use foxhunt_testkit::{Scratch, test_data};

fn es() -> SymbolSelector {
    SymbolSelector::parse("ES.FUT").expect("valid")
}

fn ts(s: &str) -> i64 {
    let t: jiff::Timestamp = s.parse().expect("valid timestamp");
    i64::try_from(t.as_nanosecond()).expect("fits")
}

fn load(dir: &Path, sel: &SymbolSelector, opts: &LoadOptions) -> RawData {
    load_path(dir, sel, opts).unwrap_or_else(|e| panic!("{} loads: {e}", dir.display()))
}

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("data-test-{name}"))
}

fn lean_opts() -> LoadOptions {
    LoadOptions {
        format: Format::Lean,
        ..LoadOptions::default()
    }
}

// ---------------------------------------------------------------- readers

#[test]
fn bundled_dbn_equals_the_lean_bars_it_was_built_from() {
    let lean = load(
        &test_data().join("lean-futures-minute/cme/minute/es"),
        &es(),
        &lean_opts(),
    );
    let dbn = real_part(load(
        &test_data().join("futures-baseline"),
        &es(),
        &LoadOptions::default(),
    ));
    assert_eq!(dbn.files.len(), 16);
    assert_eq!(lean.contracts, dbn.contracts);
    let z3 = dbn
        .contracts
        .iter()
        .find(|c| c.symbol == "ESZ3")
        .expect("ESZ3 present");
    // First line of 20131006_es_minute_trade_201312.csv: 79200000,1676.75,1677.25,1673.5,1675.25,1884
    let b = z3.bars[0];
    assert_eq!(b.ts(), ts("2013-10-06T22:00:00Z"));
    assert_eq!(
        (b.open(), b.high(), b.low(), b.close(), b.volume()),
        (1676.75, 1677.25, 1673.5, 1675.25, 1884.0)
    );
    assert!(z3.bars.windows(2).all(|w| w[0].ts() < w[1].ts()));
}

#[test]
fn databento_samples_decode_plain_and_zstd_alike() {
    let dir = test_data().join("databento-dbn");
    let sel = SymbolSelector::parse("ESH1").expect("valid");
    let opts = LoadOptions::default();
    let plain = load(&dir.join("dbn__test_data.ohlcv-1m.dbn"), &sel, &opts);
    let zstd = load(&dir.join("dbn__test_data.ohlcv-1m.v3.dbn.zst"), &sel, &opts);
    assert_eq!(plain.contracts, zstd.contracts);
    let bars = &plain.contracts[0].bars;
    // Values as decoded by Databento's own Python decoder (databento-dbn 0.72): fixed-point
    // open 372025000000000 at 2020-12-28T13:00Z, volume 353; second bar volume 152.
    assert_eq!(bars.len(), 2);
    assert_eq!(
        (bars[0].ts(), bars[0].open(), bars[0].volume()),
        (ts("2020-12-28T13:00:00Z"), 372_025.0, 353.0)
    );
    assert_eq!(
        (bars[1].ts(), bars[1].close(), bars[1].volume()),
        (ts("2020-12-28T13:01:00Z"), 372_150.0, 152.0)
    );
    // The hourly file is read when hourly bars are asked for, never mixed with minutes.
    let hourly = LoadOptions {
        bar_seconds: 3600,
        ..LoadOptions::default()
    };
    let h = load(
        &dir.join("dbn__test_data.ohlcv-1h.v3.dbn.zst"),
        &sel,
        &hourly,
    );
    assert_eq!(
        h.contracts[0].bars[1].ts() - h.contracts[0].bars[0].ts(),
        3_600_000_000_000
    );
    assert!(matches!(
        load_path(&dir.join("dbn__test_data.ohlcv-1h.v3.dbn.zst"), &sel, &opts),
        Err(DataError::Format { .. })
    ));
}

#[test]
fn parent_symbol_selects_one_root_of_a_shared_file() {
    let file = test_data()
        .join("databento-dbn/nautilus__futures_ohlcv-1m_2024-07-01T23-40_2024-07-02T00-10.dbn.zst");
    let raw = load(&file, &es(), &LoadOptions::default());
    assert_eq!(raw.available, vec!["ESU4".to_owned(), "NQU4".to_owned()]);
    assert_eq!(raw.contracts.len(), 1);
    assert_eq!(raw.contracts[0].symbol, "ESU4");
    assert_eq!(raw.contracts[0].bars.len(), 30);
    let nq = load(
        &file,
        &SymbolSelector::parse("NQ.FUT").expect("valid"),
        &LoadOptions::default(),
    );
    assert_eq!(nq.contracts[0].symbol, "NQU4");
}

#[test]
fn directory_skips_other_schemas_and_bar_sizes_with_reasons() {
    let raw = load(
        &test_data().join("databento-dbn"),
        &SymbolSelector::parse("NQ.FUT").expect("valid"),
        &LoadOptions::default(),
    );
    let skipped: Vec<String> = raw
        .skipped_files
        .iter()
        .map(|(p, why)| {
            format!(
                "{} {why}",
                p.file_name().unwrap_or_default().to_string_lossy()
            )
        })
        .collect();
    assert!(
        skipped
            .iter()
            .any(|s| s.starts_with("nautilus__futures_definition") && s.contains("definition"))
    );
    assert!(
        skipped
            .iter()
            .any(|s| s.starts_with("nautilus__futures_trades") && s.contains("trades"))
    );
    assert!(
        skipped
            .iter()
            .any(|s| s.starts_with("dbn__test_data.ohlcv-1h") && s.contains("3600 s"))
    );
    assert_eq!(
        raw.contracts
            .iter()
            .map(|c| c.symbol.as_str())
            .collect::<Vec<_>>(),
        ["NQM4", "NQU4"]
    );
}

#[test]
fn csv_6e_month_reads_with_bar_end_convention() {
    let dir = test_data().join("cme-6e-1min-2024-01");
    let sel = SymbolSelector::parse("6E.FUT").expect("valid");
    let start = load(&dir, &sel, &LoadOptions::default());
    let end = load(
        &dir,
        &sel,
        &LoadOptions {
            bar_time: BarTime::End,
            ..LoadOptions::default()
        },
    );
    assert_eq!(
        start.contracts[0].symbol, "6EH4",
        "symbol comes from the file name"
    );
    assert_eq!(
        start.contracts[0].bars.len(),
        29_996,
        "SOURCE.txt: 29,996 bars"
    );
    // First row: 2024-01-01 23:01:00,1.1076,1.10785,1.1076,1.1078,205
    let (s0, e0) = (start.contracts[0].bars[0], end.contracts[0].bars[0]);
    assert_eq!(s0.ts(), ts("2024-01-01T23:01:00Z"));
    assert_eq!(e0.ts(), ts("2024-01-01T23:00:00Z"));
    assert_eq!(
        (s0.open(), s0.high(), s0.low(), s0.close(), s0.volume()),
        (1.1076, 1.10785, 1.1076, 1.1078, 205.0)
    );
}

#[test]
fn generic_csv_forms_and_time_zones() {
    let dir = scratch("csvforms");
    // Headerless epoch milliseconds with a symbol column.
    std::fs::write(
        dir.join("a.csv"),
        "1704150000000,10,11,9,10.5,3,CLG4\n1704150060000,10.5,11,10,10.75,4,CLG4\n",
    )
    .expect("write");
    // Header, naive New York time (EST, UTC-5 in January), gzip.
    let gz = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b"datetime,open,high,low,close,volume,symbol\n2024-01-01 18:02:00,10.75,11,10.5,11,5,CLG4\n").expect("gz");
        e.finish().expect("gz")
    };
    std::fs::write(dir.join("b.csv.gz"), gz).expect("write");
    // Databento CSV export: fixed-point prices, instrument id, symbol mapped.
    std::fs::write(
        dir.join("c.csv"),
        "ts_event,rtype,publisher_id,instrument_id,open,high,low,close,volume,symbol\n1704150180000000000,33,1,42,11000000000,11250000000,11000000000,11250000000,6,CLG4\n",
    )
    .expect("write");
    let opts = LoadOptions {
        tz: read::parse_time_zone("America/New_York").expect("tz"),
        ..LoadOptions::default()
    };
    let raw = load(
        &dir,
        &SymbolSelector::parse("CL.FUT").expect("valid"),
        &opts,
    );
    let bars = &raw.contracts[0].bars;
    let want: Vec<(i64, f64)> = vec![
        (ts("2024-01-01T23:00:00Z"), 10.5),
        (ts("2024-01-01T23:01:00Z"), 10.75),
        (ts("2024-01-01T23:02:00Z"), 11.0),
        (ts("2024-01-01T23:03:00Z"), 11.25),
    ];
    assert_eq!(
        bars.iter().map(|b| (b.ts(), b.close())).collect::<Vec<_>>(),
        want
    );
}

/// Writes one CSV file and returns the load error's message.
fn csv_error(body: &str) -> String {
    let dir = scratch("csverr");
    std::fs::write(dir.join("bad.csv"), body).expect("write");
    let err = load_path(
        &dir,
        &SymbolSelector::parse("ESZ3").expect("valid"),
        &LoadOptions::default(),
    )
    .expect_err("bad input must not load");
    err.to_string()
}

#[test]
fn bad_bars_are_rejected_naming_file_line_and_problem() {
    let h = "timestamp,open,high,low,close,volume,symbol\n";
    let ok = "2024-01-02T14:30:00Z,100,101,99,100.5,10,ESZ3\n";
    for (row, want) in [
        (
            "2024-01-02T14:31:00Z,100,100.25,99,100.5,10,ESZ3\n",
            "high 100.25 is below max(open, close) = 100.5",
        ),
        (
            "2024-01-02T14:31:00Z,100,101,100.25,100.5,10,ESZ3\n",
            "low 100.25 is above min(open, close) = 100",
        ),
        (
            "2024-01-02T14:31:00Z,NaN,101,99,100.5,10,ESZ3\n",
            "open is not finite",
        ),
        (
            "2024-01-02T14:31:00Z,0,0,0,0,10,ESZ3\n",
            "open price 0 is not positive",
        ),
        (
            "2024-01-02T14:31:00Z,100,101,99,100.5,-3,ESZ3\n",
            "volume -3 is negative",
        ),
        (
            "2024-01-02T14:29:00Z,100,101,99,100.5,10,ESZ3\n",
            "is before the previous bar's",
        ),
        (
            "2024-01-02T14:31:00Z,100,abc,99,100.5,10,ESZ3\n",
            "high \"abc\" is not a number",
        ),
        (
            "yesterday,100,101,99,100.5,10,ESZ3\n",
            "cannot read timestamp",
        ),
    ] {
        let msg = csv_error(&format!("{h}{ok}{row}"));
        assert!(msg.contains("bad.csv: line 3"), "{msg}");
        assert!(msg.contains(want), "expected {want:?} in {msg}");
    }
}

#[test]
fn duplicates_across_files_name_both_places() {
    let dir = scratch("dup");
    std::fs::write(
        dir.join("a.csv"),
        "2024-01-02T14:30:00Z,100,101,99,100.5,10,ESZ3\n",
    )
    .expect("write");
    std::fs::write(dir.join("b.csv"), "2024-01-02T14:29:00Z,100,101,99,100.5,10,ESZ3\n2024-01-02T14:30:00Z,100,101,99,100.5,10,ESZ3\n").expect("write");
    let err = load_path(&dir, &es(), &LoadOptions::default()).expect_err("duplicate");
    let msg = err.to_string();
    assert!(matches!(err, DataError::Duplicate { .. }), "{msg}");
    assert!(
        msg.contains("b.csv: line 2")
            && msg.contains("a.csv, line 1")
            && msg.contains("2024-01-02T14:30:00Z"),
        "{msg}"
    );
}

#[test]
fn unknown_symbol_lists_what_is_there_and_empty_dirs_say_so() {
    let err = load_path(
        &test_data().join("futures-baseline"),
        &SymbolSelector::parse("NQ.FUT").expect("valid"),
        &LoadOptions::default(),
    )
    .expect_err("no NQ in ES data");
    let msg = err.to_string();
    assert!(
        msg.contains("symbol NQ.FUT not found") && msg.contains("ESZ3") && msg.contains("ESH4"),
        "{msg}"
    );
    let empty = scratch("empty");
    let msg = load_path(&empty, &es(), &LoadOptions::default())
        .expect_err("nothing to read")
        .to_string();
    assert!(msg.contains("no bars found"), "{msg}");
    let msg = load_path(&empty.join("missing"), &es(), &LoadOptions::default())
        .expect_err("missing")
        .to_string();
    assert!(msg.contains("missing: cannot read"), "{msg}");
}

#[test]
fn truncated_and_corrupt_dbn_files_are_errors_not_panics() {
    let path = test_data().join("futures-baseline/glbx-mdp3-20131007.ohlcv-1m.dbn.zst");
    let bytes = std::fs::read(&path).expect("bundled file");
    let plain = zstd::stream::decode_all(bytes.as_slice()).expect("valid zstd");
    let name = Path::new("cut.dbn");
    // Cut inside a record: the decoder must say the file is truncated.
    let cut = &plain[..plain.len() - 20];
    let msg = load_bytes(name, cut, &es(), &LoadOptions::default())
        .expect_err("truncated")
        .to_string();
    assert!(msg.contains("cut.dbn") && msg.contains("record"), "{msg}");
    // Garbage after the zstd magic.
    let mut bad = bytes[..64].to_vec();
    bad.extend_from_slice(&[0xff; 64]);
    let msg = load_bytes(
        Path::new("bad.dbn.zst"),
        &bad,
        &es(),
        &LoadOptions::default(),
    )
    .expect_err("corrupt")
    .to_string();
    assert!(msg.contains("bad.dbn.zst"), "{msg}");
    let msg = load_bytes(
        Path::new("junk.dbn"),
        b"not dbn at all",
        &es(),
        &LoadOptions::default(),
    )
    .expect_err("junk")
    .to_string();
    assert!(msg.contains("junk.dbn: file header"), "{msg}");
}

// ---------------------------------------------------------------- continuous contracts

/// The real files of futures-baseline and their contracts, without the synthetic lead-in
/// (synthetic-es-*.dbn.zst, contracts ESM3 and ESU3 only: see its SOURCE.txt).
fn real_part(mut raw: RawData) -> RawData {
    let synthetic = |p: &std::path::Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("synthetic-"))
    };
    assert_eq!(raw.files.iter().filter(|p| synthetic(p)).count(), 7);
    raw.files.retain(|p| !synthetic(p));
    raw.contracts
        .retain(|c| c.symbol != "ESM3" && c.symbol != "ESU3");
    raw
}

fn bundled() -> (RawData, SessionCalendar) {
    (
        real_part(load(
            &test_data().join("futures-baseline"),
            &es(),
            &LoadOptions::default(),
        )),
        SessionCalendar::cme(),
    )
}

#[test]
fn volume_roll_follows_the_previous_session_volume() {
    let (raw, cal) = bundled();
    let s = build_continuous("ES", &raw.contracts, &cal, Adjustment::None).expect("rolls");
    // Independent check of the rule: per session, volumes per contract, computed here.
    let mut vol: std::collections::BTreeMap<(i32, String), f64> = Default::default();
    for c in &raw.contracts {
        for b in &c.bars {
            *vol.entry((cal.trading_day(b.ts()), c.symbol.clone()))
                .or_default() += b.volume();
        }
    }
    let v = |day: &str, sym: &str| {
        vol.get(&(date_to_day(day.parse().expect("date")), sym.to_owned()))
            .copied()
            .unwrap_or(0.0)
    };
    let first = &s.rolls[0];
    assert_eq!(
        (
            first.from.as_str(),
            first.to.as_str(),
            first.session.as_str()
        ),
        ("ESZ3", "ESH4", "2013-12-19")
    );
    // The session before the roll is the first in which ESH4 out-traded ESZ3 ...
    assert!(v("2013-12-18", "ESH4") > v("2013-12-18", "ESZ3"));
    // ... and in the session before that (2013-12-04 is the previous one in the data) it had not.
    assert!(v("2013-12-04", "ESH4") < v("2013-12-04", "ESZ3"));
    // Every row before the roll is ESZ3, every row from it on is ESH4 (until 2020).
    let row = first.row;
    assert!(
        s.contract[..row]
            .iter()
            .all(|&k| s.contracts[usize::from(k)] == "ESZ3")
    );
    assert_eq!(s.contracts[usize::from(s.contract[row])], "ESH4");
    assert_eq!(
        day_to_date(s.session_days[s.session[row] as usize]).to_string(),
        "2013-12-19"
    );
    // Rolls happen only at session boundaries.
    for r in &s.rolls {
        assert_ne!(s.session[r.row], s.session[r.row - 1]);
    }
}

#[test]
fn back_adjustment_shifts_or_scales_only_earlier_bars() {
    let (raw, cal) = bundled();
    let none = build_continuous("ES", &raw.contracts, &cal, Adjustment::None).expect("ok");
    let diff = build_continuous("ES", &raw.contracts, &cal, Adjustment::Difference).expect("ok");
    let ratio = build_continuous("ES", &raw.contracts, &cal, Adjustment::Ratio).expect("ok");
    let (r0, r1) = (&none.rolls[0], &none.rolls[1]);
    // The reference of the first roll: both contracts' closes at the last common minute.
    let close_at = |sym: &str, t: i64| {
        raw.contracts
            .iter()
            .find(|c| c.symbol == sym)
            .and_then(|c| c.bars.iter().find(|b| b.ts() == t))
            .map(|b| b.close())
    };
    let t: jiff::Timestamp = r0.reference_time.parse().expect("rfc3339");
    let t = i64::try_from(t.as_nanosecond()).expect("fits");
    assert_eq!(
        (close_at("ESZ3", t), close_at("ESH4", t)),
        (Some(r0.from_price), Some(r0.to_price))
    );
    let last = none.len() - 1;
    assert_eq!(
        diff.adjusted(last),
        none.raw[last],
        "latest contract keeps real prices"
    );
    // The second roll comes after the six-year hole: a new segment, not adjusted across. So
    // between the two rolls prices are ESH4's own, and before the first they are shifted by the
    // first roll's gap alone.
    assert!(r0.break_days.is_none() && r1.break_days.is_some());
    let mid = r0.row;
    assert_eq!(diff.adjusted(mid).close(), none.raw[mid].close());
    assert_eq!(
        diff.adjusted(0).close(),
        none.raw[0].close() + r0.difference()
    );
    let expect_ratio = none.raw[0].close() * r0.ratio();
    assert!((ratio.adjusted(0).close() - expect_ratio).abs() < 1e-9 * expect_ratio);
    // Difference adjustment keeps every within-session price difference exactly.
    let d = |s: &ContinuousSeries, i: usize| s.adjusted(i).close() - s.adjusted(i - 1).close();
    for i in 1..none.len() {
        if none.session[i] == none.session[i - 1] {
            assert_eq!(d(&diff, i), d(&none, i), "row {i}");
        }
    }
    let collected: Vec<Bar> = diff.adjusted_bars().collect();
    assert_eq!(collected.len(), diff.len());
    assert_eq!(collected[mid], diff.adjusted(mid));
}

// ---------------------------------------------------------------- features

#[test]
fn features_never_look_ahead() {
    let (raw, cal) = bundled();
    let cfg = FeatureConfig::default();
    let base = build_continuous("ES", &raw.contracts, &cal, Adjustment::Difference).expect("ok");
    let f0 = compute_features(&base, &cal, &cfg);
    for k in [1usize, 500, 1337, 9000, base.len() - 2] {
        let mut changed = base.clone();
        for b in &mut changed.raw[k..] {
            *b = Bar::new(
                b.ts(),
                b.open() * 1.01,
                b.high() * 1.03,
                b.low() * 0.99,
                b.close() * 1.02,
                b.volume() * 3.0 + 1.0,
            )
            .expect("still valid");
        }
        let f1 = compute_features(&changed, &cal, &cfg);
        for t in 0..k {
            assert_eq!(
                f0.row(t),
                f1.row(t),
                "row {t} changed when bars from {k} on changed"
            );
        }
        assert_ne!(
            f0.row(k),
            f1.row(k),
            "the perturbation must be visible at row {k}"
        );
    }
}

#[test]
fn feature_values_match_their_definitions() {
    let (raw, cal) = bundled();
    let s = build_continuous("ES", &raw.contracts, &cal, Adjustment::Difference).expect("ok");
    let f = compute_features(&s, &cal, &FeatureConfig::default());
    assert_eq!((f.rows, f.cols), (s.len(), 13));
    let col = |name: &str| f.names.iter().position(|n| n == name).expect("column");
    let (r1, r5, range) = (col("ret_1"), col("ret_5"), col("range"));
    let c = |t: usize| s.raw[t].close();
    let t = 2_000;
    assert_eq!(s.session[t], s.session[t - 5]);
    assert!((f64::from(f.row(t)[r1]) - (c(t) / c(t - 1)).ln()).abs() < 1e-6);
    assert!((f64::from(f.row(t)[r5]) - (c(t) / c(t - 5)).ln()).abs() < 1e-6);
    assert!((f64::from(f.row(t)[range]) - (s.raw[t].high() / s.raw[t].low()).ln()).abs() < 1e-6);
    // At a session's first bar the return is measured from that bar's open, not the last close.
    let first = (1..s.len())
        .find(|&i| s.session[i] != s.session[i - 1])
        .expect("two sessions");
    assert!(
        (f64::from(f.row(first)[r5]) - (s.raw[first].close() / s.raw[first].open()).ln()).abs()
            < 1e-6
    );
    assert_eq!(f.row(first)[col("session_age")], 0.0);
    assert!(f.values.iter().all(|v| v.is_finite()));
    // Price columns are the traded ones: adjusted forward, so the first contract keeps its
    // own prices, and the same whatever the series' adjustment.
    assert_eq!(f.close[0], s.raw[0].close());
    let traded: Vec<f64> = s.traded_bars().map(|b| b.close()).collect();
    assert_eq!(f.close, traded);
}

#[test]
fn normalizer_fits_on_train_rows_only() {
    let (raw, cal) = bundled();
    let s = build_continuous("ES", &raw.contracts, &cal, Adjustment::Difference).expect("ok");
    let mut f = compute_features(&s, &cal, &FeatureConfig::default());
    let train = 0..8_000;
    let n = Normalizer::fit(&f, train.clone());
    let z = n.apply(&f, train.clone());
    for c in 0..f.cols {
        let col: Vec<f64> = z
            .iter()
            .skip(c)
            .step_by(f.cols)
            .map(|&v| f64::from(v))
            .collect();
        let mean = col.iter().sum::<f64>() / col.len() as f64;
        assert!(mean.abs() < 1e-3, "column {c} mean {mean}");
    }
    for v in &mut f.values[8_000 * f.cols..] {
        *v = 1e6;
    }
    assert_eq!(
        Normalizer::fit(&f, train),
        n,
        "rows after train must not move the statistics"
    );
}

// ---------------------------------------------------------------- walk-forward

fn days(from: &str, n: i32) -> Vec<i32> {
    // Weekdays only, ten rows per day.
    let d0 = date_to_day(from.parse().expect("date"));
    (0..n)
        .map(|i| d0 + i)
        .filter(|&d| day_to_date(d).weekday().to_monday_zero_offset() < 5)
        .flat_map(|d| [d; 10])
        .collect()
}

#[test]
fn rolling_and_anchored_month_windows() {
    let rows = days("2023-01-01", 365);
    let mut cfg = WalkForwardConfig::new(
        Period::Months(3),
        Period::Months(1),
        Period::Months(1),
        Period::Months(1),
    );
    cfg.min_bars = 10;
    let p = plan(&rows, &cfg).expect("plan");
    let w0 = &p.windows[0];
    assert_eq!(
        (w0.train.start.as_str(), w0.train.end.as_str()),
        ("2023-01-02", "2023-04-02")
    );
    assert_eq!(
        (
            w0.val.start.as_str(),
            w0.test.start.as_str(),
            w0.test.end.as_str()
        ),
        ("2023-04-02", "2023-05-02", "2023-06-02")
    );
    // Test starts inside the data up to 2023-12-29: windows 0..=7 (test from 2023-05..2023-12).
    assert_eq!(p.windows.len(), 8);
    for w in &p.windows {
        assert_eq!(w.train.rows.end, w.val.rows.start);
        assert_eq!(w.val.rows.end, w.test.rows.start);
        assert!(w.train.rows.start < w.train.rows.end);
    }
    assert_eq!(p.windows[1].train.start, "2023-02-02");
    cfg.mode = TrainMode::Anchored;
    let a = plan(&rows, &cfg).expect("plan");
    assert!(a.windows.iter().all(|w| w.train.rows.start == 0));
    assert_eq!(a.windows[2].train.rows.end, p.windows[2].train.rows.end);
}

#[test]
fn gaps_and_skipping() {
    let rows = days("2024-01-01", 60);
    let mut cfg = WalkForwardConfig::new(
        Period::Weeks(2),
        Period::Days(7),
        Period::Days(7),
        Period::Weeks(1),
    );
    cfg.gap = Period::Days(2);
    cfg.min_bars = 10;
    let p = plan(&rows, &cfg).expect("plan");
    let w = &p.windows[0];
    assert_eq!(
        (w.train.end.as_str(), w.val.start.as_str()),
        ("2024-01-15", "2024-01-17")
    );
    assert_eq!(w.test.start, "2024-01-26");
    assert!(
        w.val.rows.start > w.train.rows.end,
        "the gap's rows belong to no split"
    );
    cfg.min_bars = 60;
    let strict = plan(&rows, &cfg).expect("plan");
    assert!(strict.windows.is_empty() && !strict.skipped.is_empty());
    assert!(
        strict.skipped[0].reason.contains("validation has 50 bars"),
        "{}",
        strict.skipped[0].reason
    );
    let zero = WalkForwardConfig::new(
        Period::Days(0),
        Period::Days(1),
        Period::Days(1),
        Period::Days(1),
    );
    assert!(plan(&rows, &zero).is_err());
}

// ---------------------------------------------------------------- fuzz smoke

/// The fuzz targets' bodies (fuzz/fuzz_targets) over deterministic mutations of real files:
/// every input must give Ok or Err, never a panic.
#[test]
fn fuzz_smoke_readers_never_panic() {
    let seeds: Vec<(PathBuf, Vec<u8>)> = [
        "databento-dbn/dbn__test_data.ohlcv-1m.dbn",
        "databento-dbn/nautilus__futures_ohlcv-1m_2024-05-09T09-55_2024-05-09T10-05.dbn.zst",
        "futures-baseline/glbx-mdp3-20131006.ohlcv-1m.dbn.zst",
    ]
    .iter()
    .map(|p| (PathBuf::from(p), std::fs::read(test_data().join(p)).expect("seed")))
    .chain(std::iter::once((
        PathBuf::from("seed.csv"),
        b"ts_event,rtype,publisher_id,instrument_id,open,high,low,close,volume,symbol\n1704150180000000000,33,1,42,11000000000,11250000000,11000000000,11250000000,6,ESZ3\n2024-01-02 14:30:00,1,2,0.5,1.5,3,ESZ3\n".to_vec(),
    )))
    .collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let sel = es();
    for (name, seed) in &seeds {
        for _ in 0..300 {
            let mut m = seed.clone();
            for _ in 0..(1 + next() % 4) {
                let i = (next() as usize) % m.len().max(1);
                match next() % 4 {
                    0 if !m.is_empty() => m[i] ^= 1 << (next() % 8),
                    1 => m.truncate(i),
                    2 => m.insert(i.min(m.len()), (next() % 256) as u8),
                    _ if !m.is_empty() => m[i] = b"0123456789,.-:\nTZe"[(next() % 18) as usize],
                    _ => {}
                }
            }
            let _ = load_bytes(name, &m, &sel, &LoadOptions::default());
        }
    }
}

#[test]
fn of_several_bad_files_the_first_in_name_order_is_reported() {
    let dir = scratch("twobad");
    for (name, body) in [
        (
            "a.csv",
            "2024-01-02T14:30:00Z,100,101,99,100.5,10,ESZ3\n2024-01-02T14:31:00Z,100,99,98,100.5,10,ESZ3\n",
        ),
        ("b.csv", "2024-01-02T14:32:00Z,100,101,99,100.5,-5,ESZ3\n"),
        ("c.csv", "2024-01-02T14:33:00Z,100,101,99,100.5,10,ESZ3\n"),
    ] {
        std::fs::write(dir.join(name), body).expect("write");
    }
    let msg = load_path(&dir, &es(), &LoadOptions::default())
        .expect_err("bad files")
        .to_string();
    assert!(
        msg.contains("a.csv: line 2") && msg.contains("high 99"),
        "{msg}"
    );
    std::fs::remove_file(dir.join("a.csv")).expect("rm");
    let msg = load_path(&dir, &es(), &LoadOptions::default())
        .expect_err("bad file")
        .to_string();
    assert!(
        msg.contains("b.csv: line 1") && msg.contains("volume -5"),
        "{msg}"
    );
}

// ---------------------------------------------------------------- nothing passed over silently

fn esh1() -> SymbolSelector {
    SymbolSelector::parse("ESH1").expect("valid")
}

/// The plain (uncompressed) real DBN file: ESH1, two ohlcv-1m records of 56 bytes each.
fn plain_dbn() -> Vec<u8> {
    std::fs::read(test_data().join("databento-dbn/dbn__test_data.ohlcv-1m.dbn")).expect("read")
}

#[test]
fn links_are_followed_and_every_entry_not_read_is_listed_with_why() {
    let dir = scratch("links");
    let data = dir.join("data");
    std::fs::create_dir_all(data.join("sub")).expect("dir");
    let real = test_data().join("databento-dbn/dbn__test_data.ohlcv-1m.dbn");
    std::os::unix::fs::symlink(&real, data.join("linked.dbn")).expect("link");
    std::os::unix::fs::symlink(data.join("nowhere.dbn"), data.join("dangling.dbn")).expect("link");
    std::os::unix::fs::symlink(data.join("loop-b.dbn"), data.join("loop-a.dbn")).expect("link");
    std::os::unix::fs::symlink(data.join("loop-a.dbn"), data.join("loop-b.dbn")).expect("link");
    let raw = load(&data, &esh1(), &LoadOptions::default());
    assert_eq!(raw.files, vec![data.join("linked.dbn")], "the link is read");
    assert_eq!(raw.bar_count(), 2);
    let skipped: Vec<(String, &str)> = raw
        .skipped_files
        .iter()
        .map(|(p, why)| {
            let name = p.file_name().expect("name").to_string_lossy().into_owned();
            (name, why.as_str())
        })
        .collect();
    let names: Vec<&str> = skipped.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["dangling.dbn", "loop-a.dbn", "loop-b.dbn", "sub"]);
    assert!(
        skipped[0].1.starts_with("cannot be followed or read"),
        "{skipped:?}"
    );
    assert!(
        skipped[1].1.contains("symbolic links"),
        "the loop is named: {skipped:?}"
    );
    assert!(skipped[3].1.starts_with("a directory"), "{skipped:?}");
}

#[test]
fn records_without_bars_are_counted_by_type_not_dropped_silently() {
    let mut bytes = plain_dbn();
    // A 16-byte record of an rtype no DBN version defines, then a known non-bar type (status,
    // 0x12) of the same length: the decoder passes both; the load must say so.
    for rtype in [0xEE_u8, 0x12] {
        let mut rec = vec![0u8; 16];
        rec[0] = 4; // length in 4-byte words
        rec[1] = rtype;
        bytes.extend_from_slice(&rec);
    }
    let raw = load_bytes(
        Path::new("mixed.dbn"),
        &bytes,
        &esh1(),
        &LoadOptions::default(),
    )
    .expect("the bars still load");
    assert_eq!(raw.bar_count(), 2);
    assert_eq!(raw.notes.len(), 1, "{:?}", raw.notes);
    let note = &raw.notes[0].1;
    assert!(
        note.contains("1 status (rtype 0x12)") && note.contains("1 of unknown rtype 0xee"),
        "{note}"
    );
    // The plain file alone has none.
    let raw = load_bytes(
        Path::new("plain.dbn"),
        &plain_dbn(),
        &esh1(),
        &LoadOptions::default(),
    )
    .expect("loads");
    assert!(raw.notes.is_empty(), "{:?}", raw.notes);
}

#[test]
fn a_bad_record_length_deep_in_a_file_is_not_blamed_on_the_header() {
    let mut bytes = plain_dbn();
    let second = bytes.len() - 56;
    bytes[second] = 3; // 12 bytes: shorter than any record header
    let msg = load_bytes(
        Path::new("deep.dbn"),
        &bytes,
        &esh1(),
        &LoadOptions::default(),
    )
    .expect_err("corrupt")
    .to_string();
    assert!(
        msg.starts_with(&format!("deep.dbn: byte {second}: ")) && !msg.contains("file header"),
        "{msg}"
    );
}

#[test]
fn csv_rows_with_another_number_of_fields_are_rejected_naming_the_line() {
    let dir = scratch("csv-width");
    let f = dir.join("es.csv");
    std::fs::write(
        &f,
        "ts,open,high,low,close,volume\n\
         2024-01-02T14:30:00Z,100,101,99,100.5,10\n\
         2024-01-02T14:31:00Z,100,101,99,100.5,10,extra\n",
    )
    .expect("write");
    let sel = SymbolSelector::parse("ES").expect("valid");
    let msg = load_path(&f, &sel, &LoadOptions::default())
        .expect_err("extra field")
        .to_string();
    assert!(
        msg.contains("es.csv: line 3: 7 fields where the header has 6"),
        "{msg}"
    );
    std::fs::write(
        &f,
        "2024-01-02T14:30:00Z,100,101,99,100.5,10\n2024-01-02T14:31:00Z,100,101,99,100.5\n",
    )
    .expect("write");
    let msg = load_path(&f, &sel, &LoadOptions::default())
        .expect_err("missing field")
        .to_string();
    assert!(
        msg.contains("es.csv: line 2: 5 fields where the first row has 6"),
        "{msg}"
    );
}

#[test]
fn an_error_quotes_a_short_excerpt_of_a_huge_line() {
    let dir = scratch("csv-huge");
    let f = dir.join("es.csv");
    // One 2 MB line that is neither a header nor a row.
    let line = "x".repeat(2 << 20);
    std::fs::write(&f, format!("{line}\n")).expect("write");
    let msg = load_path(
        &f,
        &SymbolSelector::parse("ES").expect("valid"),
        &LoadOptions::default(),
    )
    .expect_err("no header")
    .to_string();
    assert!(msg.len() < 400, "{} bytes: {}", msg.len(), &msg[..400]);
    assert!(
        msg.contains("es.csv: line 1:") && msg.contains("bytes in all"),
        "{msg}"
    );
}

#[test]
fn no_bars_found_lists_the_files_passed_over() {
    let dir = test_data().join("databento-dbn");
    let opts = LoadOptions {
        bar_seconds: 3600 * 24,
        ..LoadOptions::default()
    };
    let msg = load_path(&dir, &es(), &opts)
        .expect_err("no daily bars")
        .to_string();
    assert!(
        msg.contains("no bars found")
            && msg.contains("not read")
            && msg.contains("60 s bars, not the 86400 s bars asked for")
            && msg.contains("schema"),
        "{msg}"
    );
}

#[test]
fn periods_beyond_the_calendar_and_empty_splits_are_errors_or_skips_not_panics() {
    let days: Vec<i32> = (0..400).map(|d| 19_000 + d).collect();
    for cfg in [
        WalkForwardConfig::new(
            Period::Months(u32::MAX),
            Period::Months(1),
            Period::Months(1),
            Period::Months(1),
        ),
        WalkForwardConfig {
            gap: Period::Days(100_000_000),
            ..WalkForwardConfig::new(
                Period::Months(1),
                Period::Months(1),
                Period::Months(1),
                Period::Months(1),
            )
        },
        WalkForwardConfig::new(
            Period::Days(1),
            Period::Days(1),
            Period::Days(1),
            Period::Weeks(u32::MAX),
        ),
    ] {
        let e = plan(&days, &cfg).expect_err("out of range").to_string();
        assert!(
            e.contains("beyond the calendar") || e.contains("out of range"),
            "{e}"
        );
    }
    // min_bars 0 never lets an empty split through.
    let sparse: Vec<i32> = vec![19_000, 19_001, 19_100, 19_101];
    let cfg = WalkForwardConfig {
        min_bars: 0,
        ..WalkForwardConfig::new(
            Period::Days(2),
            Period::Days(2),
            Period::Days(2),
            Period::Days(2),
        )
    };
    let p = plan(&sparse, &cfg).expect("plans");
    for w in &p.windows {
        assert!(!w.train.rows.is_empty() && !w.val.rows.is_empty() && !w.test.rows.is_empty());
    }
    assert!(
        p.skipped
            .iter()
            .all(|s| s.reason.contains("need at least 1"))
    );
}

#[test]
fn a_hole_longer_than_a_front_month_ends_an_adjustment_segment() {
    let ds = foxhunt_testkit::es_dataset();
    let s = &ds.series;
    let breaks: Vec<Option<i32>> = s.rolls.iter().map(|r| r.break_days).collect();
    // 2013-12 to 2020-01: the only roll across a hole; the others are ordinary.
    assert_eq!(breaks.len(), 4, "{:?}", s.rolls);
    assert!(breaks[..3].iter().all(Option::is_none), "{breaks:?}");
    let days = breaks[3].expect("the six-year hole");
    // 2013-12-18 to 2020-01-05.
    assert_eq!(days, 2208);
    // Before the hole, bars line up with the last contract before it (ESH4), not with ESH0:
    // the break's 1403-point difference is not added to them.
    let before = s.rolls[3].row - 1;
    assert_eq!(s.adjusted(before).close(), s.raw[before].close());
    let first = 0;
    let shift: f64 = s.rolls[..3].iter().map(|r| r.difference()).sum();
    assert_eq!(s.adjusted(first).close(), s.raw[first].close() + shift);
}

#[test]
fn implausible_bars_are_refused_naming_the_record_unless_allowed() {
    let dir = scratch("outliers");
    let f = dir.join("ESH4.csv");
    let mut text = String::from("ts,open,high,low,close,volume\n");
    for m in 0..30 {
        let p = 4000.0 + f64::from(m % 5) * 0.25;
        let high = if m == 17 { 1e308 } else { p + 0.5 };
        text.push_str(&format!(
            "2024-01-02T14:{m:02}:00Z,{p},{high},{},{p},10\n",
            p - 0.5
        ));
    }
    std::fs::write(&f, &text).expect("write");
    let sel = SymbolSelector::parse("ESH4").expect("valid");
    let msg = load_path(&f, &sel, &LoadOptions::default())
        .expect_err("1e308 among bars near 4000")
        .to_string();
    assert!(
        msg.contains("ESH4.csv: line 19: ESH4: implausible bar: high 1e308")
            && msg.contains("--allow-outliers"),
        "{msg}"
    );
    let opts = LoadOptions {
        allow_outliers: true,
        ..LoadOptions::default()
    };
    let raw = load(&f, &sel, &opts);
    assert_eq!(raw.bar_count(), 30);
    assert!(
        raw.notes
            .iter()
            .any(|(_, n)| n.contains("implausible bars kept") && n.contains("line 19")),
        "{:?}",
        raw.notes
    );
    // Real bars pass: every bundled data set loads with the check on.
    for name in ["futures-baseline", "cme-6e-1min-2024-01"] {
        let sel = SymbolSelector::parse(if name.starts_with("cme") {
            "6EH4"
        } else {
            "ES.FUT"
        })
        .expect("valid");
        load(&test_data().join(name), &sel, &LoadOptions::default());
    }
}
