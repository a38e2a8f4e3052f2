//! The walk-forward trainer end to end on the bundled ES data, on the CPU: the phase breakdown's
//! structure (snapshot, times redacted), resume after a stop giving identical results, and a
//! window whose loss stops being finite failing alone while the run goes on.

use std::path::Path;

use foxhunt_data::{Period, WalkForwardConfig};
use foxhunt_env::SpecTable;
use foxhunt_testkit::Scratch;
use foxhunt_trainer::report::WindowStatus;
use foxhunt_trainer::{DeviceChoice, Job, RunOptions, Shard, TrainConfig, TrainError};

/// The profile windows (3/1/1 months, step 3): two windows on the bundled data.
fn windows() -> WalkForwardConfig {
    WalkForwardConfig::new(
        Period::Months(3),
        Period::Months(1),
        Period::Months(1),
        Period::Months(3),
    )
}

fn small() -> TrainConfig {
    let mut c = TrainConfig {
        epochs: 3,
        max_steps_per_epoch: 12,
        envs: 8,
        learning_starts: 32,
        device: DeviceChoice::Cpu,
        seed: 11,
        ..TrainConfig::default()
    };
    c.dqn.hidden = vec![16];
    c.dqn.batch_size = 16;
    c.dqn.replay_capacity = 4096;
    c.dqn.epsilon.steps = 200;
    c
}

fn run(
    cfg: &TrainConfig,
    out: &Path,
    resume: bool,
    stop: Option<usize>,
) -> Result<foxhunt_trainer::RunReport, TrainError> {
    run_plan(cfg, &windows(), out, resume, stop, None)
}

/// [`run`] with other windows, and as one shard of a shared run directory.
fn run_plan(
    cfg: &TrainConfig,
    w: &WalkForwardConfig,
    out: &Path,
    resume: bool,
    stop: Option<usize>,
    shard: Option<Shard>,
) -> Result<foxhunt_trainer::RunReport, TrainError> {
    run_workers(cfg, w, out, resume, stop, shard, 1)
}

/// [`run_plan`] on `workers` workers of the run's device.
fn run_workers(
    cfg: &TrainConfig,
    w: &WalkForwardConfig,
    out: &Path,
    resume: bool,
    stop: Option<usize>,
    shard: Option<Shard>,
    workers: usize,
) -> Result<foxhunt_trainer::RunReport, TrainError> {
    let d = foxhunt_testkit::es_dataset();
    let spec = SpecTable::default().get("ES").expect("ES").clone();
    foxhunt_trainer::run(
        &Job {
            dataset: d,
            spec: &spec,
            windows: w,
            cfg,
            source: serde_json::json!({"data": "futures-baseline"}),
        },
        &RunOptions {
            out: out.to_path_buf(),
            resume,
            stop_after_epochs: stop,
            progress: false,
            shard,
            devices: foxhunt_trainer::Devices::One,
            workers_per_device: workers,
        },
    )
}

/// A scratch directory's `run` folder, not yet made (as a run directory is before `train`).
fn scratch(name: &str) -> (Scratch, std::path::PathBuf) {
    let s = Scratch::new(&format!("trainer-{name}"));
    let run = s.join("run");
    (s, run)
}

/// Replaces every `=number` of a phase line's times with `=[ms]`.
fn redact(line: &str) -> String {
    line.split(' ')
        .map(|part| match part.split_once('=') {
            Some((k, _)) if foxhunt_trainer::phase::PHASES.contains(&k) || k == "total" => {
                format!("{k}=[ms]")
            }
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn phase_breakdown_has_one_line_per_epoch_and_init_uploads_only_first() {
    let (_tmp, out) = scratch("phases");
    let r = run(&small(), &out, false, None).expect("runs");
    let lines: Vec<String> = r.phases.iter().map(|p| redact(&p.to_string())).collect();
    insta::assert_snapshot!(lines.join("\n"));
    // Structure beyond the line: which epochs uploaded window data, and phase sums.
    let uploads: Vec<(usize, usize, bool)> = r
        .phases
        .iter()
        .map(|p| (p.window, p.epoch, p.uploaded_bytes > 0))
        .collect();
    insta::assert_json_snapshot!(uploads);
    for p in &r.phases {
        let sum: f64 = p.values().iter().sum();
        assert!(
            sum <= p.total + 1e-6,
            "phases {sum} ms exceed the epoch's {} ms",
            p.total
        );
        assert!(p.updates > 0, "the replay warms up within the first epoch");
    }
    // The report on disk carries the same breakdowns, and the files a user reads exist.
    let on_disk: foxhunt_trainer::RunReport =
        foxhunt_trainer::report::read_json(&out.join("report.json")).expect("report");
    assert_eq!(on_disk.phases, r.phases);
    for f in [
        "config.json",
        "equity.csv",
        "equity.png",
        "summary.txt",
        "report.html",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    assert_eq!(r.aggregate.len(), 5, "agent and four baselines");
    assert_eq!(r.aggregate[0].policy, "agent");
    let csv = std::fs::read_to_string(out.join("equity.csv")).expect("csv");
    assert!(csv.starts_with("time,window,agent,flat,buy-and-hold,random,momentum-30\n"));
    // The aggregate's bars are the test periods' bars.
    let test_bars: usize = r.windows.iter().map(|w| w.test.rows.len()).sum();
    assert_eq!(r.aggregate[0].metrics.bars, test_bars);
    // A second run into the same directory without --resume is refused: nothing is overwritten.
    let again = run(&small(), &out, false, None).expect_err("refused");
    assert!(again.to_string().contains("already holds a run"), "{again}");
}

/// report.html: every chart drawn with its data, the tables' numbers are report.json's, nothing
/// fetched when it is viewed, and writing it again from the run directory gives the same file.
#[test]
fn the_html_report_holds_every_chart_and_the_reports_numbers() {
    use foxhunt_trainer::{charts::grouped, html};
    let (_tmp, out) = scratch("html");
    let r = run(&small(), &out, false, None).expect("runs");
    let page = std::fs::read_to_string(out.join(html::FILE)).expect("report.html");
    let found = html::check(&page, html::CHARTS).unwrap_or_else(|p| panic!("{p:#?}"));
    assert_eq!(found.len(), html::CHARTS.len());
    let cell = |v: f64| format!(">{}</td>", grouped(v, 2));
    for p in &r.aggregate {
        assert!(page.contains(&cell(p.metrics.total_pnl)), "{}", p.policy);
    }
    for w in &r.windows {
        for p in &w.test_results {
            assert!(
                page.contains(&cell(p.metrics.total_pnl)),
                "window {}",
                w.index
            );
        }
    }
    for fetch in ["<script", "<link", " src=", "href=", "url(", "@import"] {
        assert!(!page.contains(fetch), "report.html holds {fetch}");
    }
    std::fs::remove_file(out.join(html::FILE)).expect("remove");
    let again = foxhunt_trainer::write_html(&out).expect("rewritten");
    assert_eq!(std::fs::read_to_string(again).expect("read"), page);
}

#[test]
fn a_stopped_run_resumes_to_identical_results() {
    let cfg = small();
    let ((_t1, full), (_t2, parts)) = (scratch("full"), scratch("parts"));
    let a = run(&cfg, &full, false, None).expect("uninterrupted run");
    // Stop inside window 1 (window 0 has 3 epochs), then continue.
    let stopped = run(&cfg, &parts, false, Some(4)).expect_err("stops");
    assert!(
        matches!(stopped, TrainError::Stopped { epochs: 4 }),
        "{stopped}"
    );
    let w0 = parts.join("windows/window-000/report.json");
    let w0_before = std::fs::read(&w0).expect("window 0 finished before the stop");
    assert!(parts.join("windows/window-001/progress.json").is_file());
    let b = run(&cfg, &parts, true, None).expect("resumed run");
    assert_eq!(
        std::fs::read(&w0).expect("still there"),
        w0_before,
        "window 0 not redone"
    );
    assert_eq!(a.windows, b.windows, "per-window results identical");
    assert_eq!(a.aggregate, b.aggregate, "aggregate identical");
    // Window 1's first epoch was trained before the stop and its breakdown kept.
    assert_eq!(b.phases.len(), a.phases.len());
    // A budget that ends exactly with a window stops before the next one starts.
    let (_t3, edge) = scratch("edge");
    let e = run(&cfg, &edge, false, Some(3)).expect_err("stops");
    assert!(matches!(e, TrainError::Stopped { epochs: 3 }), "{e}");
    assert!(edge.join("windows/window-000/report.json").is_file());
    assert!(
        !edge.join("windows/window-001").exists(),
        "window 1 was not begun"
    );
    // A resume under another configuration is refused, naming what differs.
    let other = TrainConfig {
        seed: 12,
        ..cfg.clone()
    };
    let e = run(&other, &parts, true, None).expect_err("other config");
    assert!(e.to_string().contains("train.seed: 11 -> 12"), "{e}");
}

/// Resume state is trusted only as written: a changed byte in any file a resume reads (a
/// checkpoint, the replay, progress, a finished window's report, phases or curves) is refused,
/// naming the file; restored, the same run resumes.
#[test]
fn damaged_resume_state_is_refused_naming_the_file() {
    let cfg = small();
    let (_t, parts) = scratch("damaged");
    run(&cfg, &parts, false, Some(4)).expect_err("stops inside window 1");
    let files = [
        "windows/window-000/report.json",
        "windows/window-000/phases.json",
        "windows/window-000/curves.json",
        "windows/window-001/progress.json",
        "windows/window-001/epoch-000.ckpt",
        "windows/window-001/epoch-000.replay",
    ];
    for f in files {
        let path = parts.join(f);
        let good = std::fs::read(&path).unwrap_or_else(|e| panic!("{f}: {e}"));
        let mut bad = good.clone();
        if f.ends_with(".json") {
            // An edit a person could make: a number's leading digit changed, still valid JSON.
            // Not any digit: the checksum is over the parsed value, so a change past a float's
            // 17th significant digit (which parses to the same f64) is rightly no change.
            let at = (good.len() / 2..good.len())
                .chain(1..good.len() / 2)
                .find(|&i| good[i].is_ascii_digit() && good[i - 1] == b' ')
                .expect("a number");
            bad[at] = if good[at] == b'7' { b'8' } else { b'7' };
        } else {
            bad[good.len() / 2] ^= 0x01;
        }
        std::fs::write(&path, &bad).expect("damage");
        let e = run(&cfg, &parts, true, None).expect_err("damaged state refused");
        let msg = e.to_string();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(
            msg.contains(&name) && msg.contains("changed after foxhunt wrote"),
            "{f}: {msg}"
        );
        std::fs::write(&path, &good).expect("restore");
    }
    run(&cfg, &parts, true, None).expect("restored state resumes");
}

/// Week-sized windows: ten windows over the bundled data (the synthetic lead-in's months).
fn weekly() -> WalkForwardConfig {
    WalkForwardConfig::new(
        Period::Weeks(4),
        Period::Weeks(1),
        Period::Weeks(1),
        Period::Weeks(2),
    )
}

/// A report's results as bytes (`RunReport::results`).
fn results(r: &foxhunt_trainer::RunReport) -> Vec<u8> {
    serde_json::to_vec(&r.results()).expect("json")
}

/// Shards of one run directory, started alone, together and under other settings: the
/// aggregate equals the unsharded run byte for byte in its results; a report asked for too early
/// names each missing window and its shard; a shard with other settings is refused naming the
/// setting; a stopped shard resumes alone.
#[test]
fn sharded_runs_aggregate_to_the_unsharded_run() {
    let cfg = TrainConfig {
        epochs: 2,
        ..small()
    };
    let w = weekly();
    let ((_t1, full_dir), (_t2, parts)) = (scratch("shard-full"), scratch("shard-parts"));
    let full = run_plan(&cfg, &w, &full_dir, false, None, None).expect("unsharded");
    let n = full.windows.len();
    assert!(n >= 6, "enough windows to shard: {n}");
    let shard = |k| Some(Shard::new(k, 3).expect("valid"));

    let one = run_plan(&cfg, &w, &parts, false, None, shard(1)).expect("shard 1 alone");
    assert!(one.windows.iter().all(|r| r.index % 3 == 1));
    assert!(
        !parts.join("report.json").exists(),
        "no report before every window is done"
    );
    let e = foxhunt_trainer::aggregate(&parts, cfg.capital)
        .expect_err("incomplete")
        .to_string();
    assert!(
        e.contains("window 0 (shard 0/3)") && e.contains("window 2 (shard 2/3)"),
        "{e}"
    );
    assert!(!e.contains("window 1 "), "shard 1's windows are done: {e}");

    // The other two at the same moment: both may find the run complete and write the report.
    std::thread::scope(|s| {
        let a = s.spawn(|| run_plan(&cfg, &w, &parts, false, None, shard(0)));
        let b = s.spawn(|| run_plan(&cfg, &w, &parts, false, None, shard(2)));
        a.join().expect("thread").expect("shard 0");
        b.join().expect("thread").expect("shard 2");
    });
    let merged: foxhunt_trainer::RunReport =
        foxhunt_trainer::report::read_json(&parts.join("report.json")).expect("report written");
    assert_eq!(
        results(&merged),
        results(&full),
        "aggregate equals the unsharded run"
    );
    assert_eq!(merged.phases.len(), full.phases.len());
    assert_eq!(
        std::fs::read(parts.join("equity.csv")).expect("csv"),
        std::fs::read(full_dir.join("equity.csv")).expect("csv")
    );
    // The sharded run's report.html lists each shard with the windows it owns; the unsharded
    // run's has no shard table.
    let page = std::fs::read_to_string(parts.join("report.html")).expect("report.html");
    for k in 0..3 {
        let owned: Vec<String> = merged
            .windows
            .iter()
            .filter(|w| w.index % 3 == k)
            .map(|w| w.index.to_string())
            .collect();
        let row = format!("<tr><td>{k} of 3</td><td>{}</td>", owned.join(", "));
        assert!(page.contains(&row), "{row}");
    }
    let plain = std::fs::read_to_string(full_dir.join("report.html")).expect("report.html");
    assert!(!plain.contains("shard-table"));
    let again = foxhunt_trainer::aggregate(&parts, cfg.capital).expect("complete");
    assert_eq!(
        results(&again),
        results(&full),
        "foxhunt report gives the same"
    );

    // Another seed in the same directory: refused, naming it.
    let other = TrainConfig {
        seed: 12,
        ..cfg.clone()
    };
    let e = run_plan(&other, &w, &parts, true, None, shard(0)).expect_err("other settings");
    assert!(e.to_string().contains("train.seed: 11 -> 12"), "{e}");
    // Run again without --resume: its windows have results already.
    let e = run_plan(&cfg, &w, &parts, false, None, shard(0)).expect_err("already trained");
    assert!(e.to_string().contains("--resume"), "{e}");

    // A stopped shard continues with --resume, alone, to the same results.
    let (_t3, fresh) = scratch("shard-resume");
    let half = Some(Shard::new(0, 2).expect("valid"));
    let e = run_plan(&cfg, &w, &fresh, false, Some(3), half).expect_err("stops");
    assert!(matches!(e, TrainError::Stopped { epochs: 3 }), "{e}");
    let r = run_plan(&cfg, &w, &fresh, true, None, half).expect("resumed shard");
    let mine: Vec<_> = full
        .windows
        .iter()
        .filter(|x| x.index % 2 == 0)
        .cloned()
        .collect();
    assert_eq!(r.windows, mine);
}

/// Windows spread over three workers taking them from one queue give, window by window, what
/// one worker gives: the report and its results equal, byte for byte.
#[test]
fn several_workers_give_the_one_worker_results() {
    let cfg = TrainConfig {
        epochs: 2,
        ..small()
    };
    let w = weekly();
    let ((_t1, one), (_t2, three)) = (scratch("workers-1"), scratch("workers-3"));
    let a = run_workers(&cfg, &w, &one, false, None, None, 1).expect("one worker");
    let b = run_workers(&cfg, &w, &three, false, None, None, 3).expect("three workers");
    assert!(a.windows.len() >= 6);
    assert_eq!(results(&a), results(&b));
    assert_eq!(
        std::fs::read(one.join("equity.csv")).expect("csv"),
        std::fs::read(three.join("equity.csv")).expect("csv")
    );
    let (_t3, stop) = scratch("workers-stop");
    let e = run_workers(&cfg, &w, &stop, false, Some(2), None, 2).expect_err("refused");
    assert!(e.to_string().contains("--stop-after-epochs"), "{e}");
    assert!(!stop.exists(), "refused before the run directory");
}

#[test]
fn a_non_finite_loss_fails_its_window_and_the_run_goes_on() {
    let (_tmp, out) = scratch("nan");
    let mut cfg = small();
    // A learning rate of 1e30 blows the weights up in the first updates.
    cfg.dqn.lr = 1e30;
    cfg.dqn.grad_clip = None;
    let r = run(&cfg, &out, false, None).expect("the run itself completes");
    assert_eq!(r.windows.len(), 2, "both windows were attempted");
    for (k, w) in r.windows.iter().enumerate() {
        let WindowStatus::Failed { error } = &w.status else {
            panic!("window {k} should have failed: {:?}", w.status);
        };
        assert!(
            error.starts_with(&format!("window {k}, epoch 0, step "))
                && error.contains("is not finite; last finite statistics: "),
            "{error}"
        );
        assert!(w.test_results.is_empty());
    }
    assert!(r.aggregate.is_empty(), "no finished window, no aggregate");
    let summary = foxhunt_trainer::report::summary(&r);
    assert!(summary.contains("FAILED: window 1, epoch 0"), "{summary}");
}

/// The standalone settings of a population's member: the base with its seed and learning rate.
fn standalone(base: &TrainConfig, seed: u64, lr: f64) -> TrainConfig {
    let mut c = TrainConfig {
        seed,
        ..base.clone()
    };
    c.dqn.lr = lr;
    c
}

/// The member the selection must pick in window `w`, from the standalone runs of the members:
/// best validation PnL, the first on ties.
fn best_of(alone: &[foxhunt_trainer::RunReport], w: usize) -> usize {
    let vals: Vec<f64> = alone
        .iter()
        .map(|a| {
            a.windows[w]
                .validation
                .as_ref()
                .expect("validated")
                .total_pnl
        })
        .collect();
    let mut best = 0;
    for (k, &v) in vals.iter().enumerate() {
        if v > vals[best] {
            best = k;
        }
    }
    best
}

/// A population (2 seeds x 2 learning rates) on the CPU: each member trains exactly as the
/// standalone run with its seed and settings (every epoch's statistics, the best epoch and its
/// validation), the selected member is the best on validation and its test equals that
/// standalone run's test, a vote of one is that agent, and members' state lives in their own
/// folders.
#[test]
fn a_population_member_trains_as_its_standalone_run_and_the_best_on_validation_is_tested() {
    let base = small();
    let pop = {
        let mut c = TrainConfig {
            agents: 2,
            ensemble: 1,
            ..base.clone()
        };
        c.sweep
            .set("dqn.lr".into(), vec![0.001.into(), 0.004.into()]);
        c
    };
    let (_t, out) = scratch("population");
    let r = run(&pop, &out, false, None).expect("population run");
    // Member order: the grid (learning rate), then seeds.
    let alone: Vec<foxhunt_trainer::RunReport> =
        [(11, 0.001), (12, 0.001), (11, 0.004), (12, 0.004)]
            .iter()
            .enumerate()
            .map(|(k, &(seed, lr))| {
                let (_t, dir) = scratch(&format!("population-alone-{k}"));
                run(&standalone(&base, seed, lr), &dir, false, None).expect("standalone")
            })
            .collect();
    assert_eq!(r.windows.len(), 2);
    for (w, win) in r.windows.iter().enumerate() {
        assert_eq!(win.status, WindowStatus::Ok);
        let p = win.population.as_ref().expect("a population report");
        assert_eq!(p.members.len(), 4);
        for (k, m) in p.members.iter().enumerate() {
            let a = &alone[k].windows[w];
            assert_eq!(m.index, k);
            assert_eq!(m.status, WindowStatus::Ok);
            assert_eq!(
                m.epochs, a.epochs,
                "window {w} agent {k}: every epoch as standalone"
            );
            assert_eq!(m.best_epoch, a.best_epoch, "window {w} agent {k}");
            assert_eq!(m.validation, a.validation, "window {w} agent {k}");
            assert_eq!(m.seed, [11, 12, 11, 12][k]);
            assert_eq!(
                m.settings["dqn.lr"],
                serde_json::json!([0.001, 0.004][k / 2])
            );
            let dir = out.join(format!("windows/window-{w:03}/agent-{k:03}"));
            assert!(dir.join("report.json").is_file(), "{}", dir.display());
            let best = m.best_epoch.expect("trained");
            assert!(dir.join(format!("best-epoch-{best:03}.ckpt")).is_file());
        }
        let sel = best_of(&alone, w);
        assert_eq!(p.selected, sel, "window {w}");
        assert_eq!(p.ensemble, vec![sel]);
        let (mine, theirs) = (&win.test_results, &alone[sel].windows[w].test_results);
        assert_eq!(
            mine[0], theirs[0],
            "the selected agent's test is its standalone test"
        );
        assert_eq!(mine[1].policy, "ensemble");
        assert_eq!(
            mine[1].metrics, mine[0].metrics,
            "a vote of one is that agent"
        );
        assert_eq!(mine[2..], theirs[1..], "the same baselines");
        assert_eq!(win.epochs, alone[sel].windows[w].epochs);
    }
    let names: Vec<&str> = r.aggregate.iter().map(|p| p.policy.as_str()).collect();
    assert_eq!(&names[..2], &["agent", "ensemble"]);
    // One copy of each window's data, charged to its first member's first epoch.
    let uploads = r.phases.iter().filter(|p| p.uploaded_bytes > 0).count();
    assert_eq!((uploads, r.phases.len()), (2, 2 * 4 * 3));
    let page = std::fs::read_to_string(out.join("report.html")).expect("report.html");
    assert!(page.contains("id=\"population\""));
    let summary = foxhunt_trainer::report::summary(&r);
    assert!(
        summary.contains("of 4 selected on validation (dqn.lr="),
        "{summary}"
    );
}

/// A population whose one member's loss blows up: that member fails alone (marked, with the
/// window, epoch and step) and the others are selected from; selection by Sharpe picks the
/// best Sharpe; a population stopped inside a window resumes to the uninterrupted results.
#[test]
fn a_failing_member_fails_alone_and_a_stopped_population_resumes_identically() {
    let pop = {
        let mut c = TrainConfig {
            select: foxhunt_trainer::Select::Sharpe,
            ..small()
        };
        c.dqn.grad_clip = None;
        c.sweep.set(
            "dqn.lr".into(),
            vec![0.001.into(), 1e30.into(), 0.004.into()],
        );
        c
    };
    let ((_t1, full), (_t2, parts)) = (scratch("pop-full"), scratch("pop-parts"));
    let a = run(&pop, &full, false, None).expect("the run completes");
    for (w, win) in a.windows.iter().enumerate() {
        assert_eq!(win.status, WindowStatus::Ok, "window {w}");
        let p = win.population.as_ref().expect("population");
        let WindowStatus::Failed { error } = &p.members[1].status else {
            panic!("agent 1 should have failed: {:?}", p.members[1].status);
        };
        assert!(
            error.starts_with(&format!("agent 1: window {w}, epoch 0, step ")),
            "{error}"
        );
        assert!(p.members[1].validation.is_none());
        let sharpe = |k: usize| {
            p.members[k]
                .validation
                .as_ref()
                .expect("validated")
                .sharpe
                .unwrap_or(f64::NEG_INFINITY)
        };
        let want = if sharpe(2) > sharpe(0) { 2 } else { 0 };
        assert_eq!(
            p.selected,
            want,
            "window {w}: {} vs {}",
            sharpe(0),
            sharpe(2)
        );
        assert_eq!(p.members[p.selected].validation, win.validation);
    }
    // Stopped inside window 0 (3 epochs), then continued.
    let e = run(&pop, &parts, false, Some(2)).expect_err("stops");
    assert!(matches!(e, TrainError::Stopped { epochs: 2 }), "{e}");
    assert!(
        parts
            .join("windows/window-000/agent-000/progress.json")
            .is_file()
    );
    assert!(
        parts
            .join("windows/window-000/agent-001/report.json")
            .is_file(),
        "the failed member is finished"
    );
    let b = run(&pop, &parts, true, None).expect("resumed");
    assert_eq!(a.windows, b.windows, "per-window results identical");
    assert_eq!(a.aggregate, b.aggregate);
}

/// On a GPU: each member of a population (one after another on the device, sharing the
/// window's one upload) trains exactly as the standalone GPU run with its seed, and the selected
/// member's test (decided on the host) equals that run's test (decided on the device).
#[cfg(feature = "cuda")]
#[test]
fn on_the_gpu_a_population_member_equals_its_standalone_gpu_run() {
    if !foxhunt_testkit::gpu_tests() {
        return;
    }
    let base = TrainConfig {
        device: DeviceChoice::Cuda,
        ..small()
    };
    let pop = TrainConfig {
        agents: 3,
        ..base.clone()
    };
    let (_t, out) = scratch("gpu-population");
    let r = run(&pop, &out, false, None).expect("GPU population");
    assert_eq!(r.device, "cuda");
    let alone: Vec<foxhunt_trainer::RunReport> = (0..3)
        .map(|k| {
            let (_t, dir) = scratch(&format!("gpu-population-{k}"));
            run(&standalone(&base, 11 + k, base.dqn.lr), &dir, false, None).expect("standalone")
        })
        .collect();
    for (w, win) in r.windows.iter().enumerate() {
        let p = win.population.as_ref().expect("population");
        for (k, m) in p.members.iter().enumerate() {
            let a = &alone[k].windows[w];
            assert_eq!(m.epochs, a.epochs, "window {w} agent {k}");
            assert_eq!((m.best_epoch, &m.validation), (a.best_epoch, &a.validation));
        }
        assert_eq!(p.selected, best_of(&alone, w));
        assert_eq!(win.test_results, alone[p.selected].windows[w].test_results);
    }
    // A population whose members, side by side, do not fit the GPU's memory is refused with
    // the arithmetic before a run directory exists (one such agent alone fits).
    let mut big = TrainConfig {
        agents: 64,
        ..base.clone()
    };
    big.dqn.hidden = vec![8192, 8192];
    let (_t2, refused) = scratch("gpu-population-big");
    let e = run(&big, &refused, false, None)
        .expect_err("too big for the GPU")
        .to_string();
    assert!(
        e.contains("of GPU memory (")
            && e.contains("agents held at once")
            && e.contains("gradient slots"),
        "{e}"
    );
    assert!(!refused.exists());
    // The window's data crossed to the device once, for the first member.
    let uploads: Vec<bool> = r.phases.iter().map(|p| p.uploaded_bytes > 0).collect();
    assert_eq!(
        uploads.iter().filter(|&&u| u).count(),
        r.windows.len(),
        "{uploads:?}"
    );
}

/// On a GPU (feature `cuda`, FOXHUNT_GPU_TESTS=1): the device path (arena, GPU environments,
/// device replay, fused engine) trains every window, keeps the phase structure of the CPU run,
/// learns (finite statistics, weights that move the validation result), and is deterministic:
/// the same seed gives the same reports.
#[cfg(feature = "cuda")]
#[test]
fn on_the_gpu_the_fused_path_trains_and_repeats_itself_exactly() {
    if !foxhunt_testkit::gpu_tests() {
        return;
    }
    let cfg = TrainConfig {
        device: DeviceChoice::Cuda,
        ..small()
    };
    let ((_t1, one), (_t2, two)) = (scratch("gpu-one"), scratch("gpu-two"));
    let a = run(&cfg, &one, false, None).expect("GPU run");
    let b = run(&cfg, &two, false, None).expect("GPU run again");
    assert_eq!(a.device, "cuda");
    assert_eq!(a.windows, b.windows, "same seed, same results on the GPU");
    let (_t3, on_cpu) = scratch("gpu-cpu");
    let cpu = run(&small(), &on_cpu, false, None).expect("CPU run");
    // The device ring counts a step's transitions once its next row exists, the host replay
    // at once: the first epoch may make one update fewer, the structure is the same.
    let shape = |r: &foxhunt_trainer::RunReport| {
        r.phases
            .iter()
            .map(|p| (p.window, p.epoch, p.updates > 0, p.uploaded_bytes > 0))
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&a), shape(&cpu), "the CPU run's phase structure");
    // The step loop's phases are timed by device events: present, and within the epoch's
    // wall time.
    for p in &a.phases {
        let sum: f64 = p.values().iter().sum();
        assert!(p.collect > 0.0 && p.train > 0.0 && p.sync > 0.0, "{p}");
        assert!(
            sum <= p.total + 1e-6,
            "phases {sum} ms exceed the epoch's {p}"
        );
    }
    for w in &a.windows {
        assert_eq!(w.status, WindowStatus::Ok);
        for e in &w.epochs {
            for v in [e.loss, e.mean_q, e.td_abs_mean, e.grad_norm] {
                assert!(v.is_some_and(f32::is_finite), "{e:?}");
            }
        }
        assert!(
            w.epochs.windows(2).any(|p| p[0].val_pnl != p[1].val_pnl),
            "training changes the policy: {:?}",
            w.epochs
        );
    }
}

/// A build without CUDA support says so when CUDA is asked for, and `auto` takes the CPU.
#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_cuda_feature_asking_for_cuda_says_so() {
    let e = foxhunt_trainer::resolve_device(DeviceChoice::Cuda).expect_err("no CUDA in this build");
    assert!(
        e.to_string()
            .starts_with("no CUDA device found: this build has no CUDA support"),
        "{e}"
    );
    assert_eq!(
        foxhunt_trainer::resolve_device(DeviceChoice::Auto).expect("auto falls back"),
        foxhunt_trainer::Resolved::Cpu
    );
}

/// The GPU, the bundled ES bars and ES's contract, where GPU tests run (`None`: they do not).
#[cfg(feature = "cuda")]
fn es_on_the_gpu() -> Option<(
    std::sync::Arc<foxhunt_gpu::GpuContext>,
    foxhunt_env::MarketData,
    foxhunt_env::ContractSpec,
)> {
    if !foxhunt_testkit::gpu_tests() {
        return None;
    }
    Some((
        foxhunt_gpu::GpuContext::new(0).expect("a GPU"),
        foxhunt_testkit::es_market(foxhunt_testkit::es_real_rows()),
        SpecTable::default().get("ES").expect("ES").clone(),
    ))
}

/// On a GPU: the device's greedy evaluation decides exactly what the host decides at every bar
/// (and so books the same metrics), for untrained, trained, layer-norm + dueling and near-tie
/// networks, under several environment settings and costs, on the bundled real bars.
#[cfg(feature = "cuda")]
#[test]
fn on_the_gpu_greedy_evaluation_decides_exactly_as_the_host() {
    use foxhunt_dqn::fused::layout_words;
    use foxhunt_dqn::replay::{Replay, Transition};
    use foxhunt_dqn::{AgentConfig, Batch, CpuBackend, DqnAgent, DqnConfig};
    use foxhunt_env::{Costs, EnvConfig, Execution};
    use foxhunt_memory::{DeviceEvaluator, DevicePool, NetOnDevice, WindowData};
    use foxhunt_trainer::eval::{BarByBar, book, host_targets};
    let Some((ctx, market, spec)) = es_on_the_gpu() else {
        return;
    };
    let n = market.rows();
    let train = |cfg: &AgentConfig, updates: usize| {
        let dev = Default::default();
        let mut a = DqnAgent::<CpuBackend>::new(cfg.clone(), &dev).expect("valid");
        let mut r = Replay::new(256, 3, None);
        for k in 0..256u32 {
            let x = |j: u32| ((k * 37 + j * 11) % 89) as f32 / 44.5 - 1.0;
            r.push(Transition {
                obs: (0..cfg.obs_dim as u32).map(x).collect(),
                action: (k % cfg.actions as u32) as u8,
                ret: x(5),
                next_obs: (0..cfg.obs_dim as u32).map(|j| x(j + 1)).collect(),
                discount: 0.9,
            });
        }
        for u in 0..updates {
            a.learn(Batch::from_host(&r.sample(32, u as u64), cfg.obs_dim, &dev));
        }
        a
    };
    let mut compared = 0;
    for (env, costs) in [
        (EnvConfig::default(), Costs::default()),
        (
            EnvConfig {
                lookback: 3,
                max_position: 2,
                episode_steps: 50,
                ..EnvConfig::default()
            },
            Costs {
                commission: 0.0,
                slippage_ticks: 0.0,
            },
        ),
        (
            EnvConfig {
                upnl_scale: 7.0,
                ..EnvConfig::default()
            },
            Costs {
                commission: 4.0,
                slippage_ticks: 2.0,
            },
        ),
    ] {
        let exec = Execution::new(&spec, costs);
        let cfg = TrainConfig {
            env: env.clone(),
            costs,
            ..TrainConfig::default()
        };
        let mut pool = DevicePool::new(&ctx);
        let arena = pool
            .window(&WindowData {
                market: market.clone(),
                exec,
            })
            .expect("upload");
        let mut ev = DeviceEvaluator::new(&arena, &env, market.session()).expect("evaluator");
        let shape =
            |dqn: DqnConfig| AgentConfig::new(env.obs_dim(market.cols()), env.actions(), 5, dqn);
        let small = DqnConfig {
            hidden: vec![64, 32],
            ..DqnConfig::default()
        };
        let normed = DqnConfig {
            hidden: vec![48],
            layer_norm: true,
            dueling: true,
            ..DqnConfig::default()
        };
        let mut nets = vec![
            (
                "untrained",
                shape(small.clone()),
                train(&shape(small.clone()), 0).export_state().online,
            ),
            (
                "trained",
                shape(small.clone()),
                train(&shape(small.clone()), 60).export_state().online,
            ),
            (
                "norm + dueling",
                shape(normed.clone()),
                train(&shape(normed), 60).export_state().online,
            ),
        ];
        // Near ties: a head whose outputs are all but equal.
        let mut tied = train(&shape(small.clone()), 20).export_state().online;
        let head = tied.len() - (32 + 1) * env.actions();
        for v in &mut tied[head..] {
            *v *= 1e-6;
        }
        nets.push(("near ties", shape(small), tied));
        for (name, agent_cfg, params) in nets {
            let (words, max_width) = layout_words(&agent_cfg);
            let layout = ctx.upload(&words).expect("layout");
            let on_device = ctx.upload(&params).expect("params");
            let net = NetOnDevice {
                params: &on_device,
                layout: &layout,
                obs_dim: agent_cfg.obs_dim,
                max_width,
                first_width: agent_cfg.first_width(),
            };
            let host_net = foxhunt_dqn::model::HostQNetwork::from_flat(&agent_cfg, &params);
            for split in [0..n / 3, n / 3..n, 17..n - 5] {
                let want = host_targets(&host_net, &market, &exec, &env, split.clone());
                let got = ev.targets(&net, split.clone()).expect("device decisions");
                let first_diff = want.iter().zip(&got).position(|(a, b)| a != b);
                assert_eq!(
                    first_diff, None,
                    "{name} {split:?} {env:?}: device and host differ"
                );
                assert_eq!(got.len(), split.len());
                // And both are the bar-by-bar backtest's decisions and metrics.
                let mut old = BarByBar::new(host_net.clone(), &env);
                let reference = foxhunt_env::backtest(
                    &market,
                    &exec,
                    &env,
                    split.clone(),
                    cfg.capital,
                    &mut old,
                )
                .expect("bar by bar");
                assert!(
                    old.decided
                        .iter()
                        .zip(&got)
                        .all(|(a, &b)| *a == i32::from(b))
                );
                let booked = book(&got, &market, &exec, &cfg, split.clone()).expect("booked");
                assert_eq!(booked.metrics, reference.metrics, "{name}: metrics");
                // Decided and booked on the device: the same metrics to the bit, whatever the
                // chunks the walk is cut into and the rows its rounds take, the stitch's teams
                // (one block, or several deciding 1 to 32 bars each a round), whether the walks
                // start from the flat pass's first-layer sums or sum every input again,
                // however the equity is summed, whether a team meets at a thread-block
                // cluster's barrier (where the device runs its teams so) or in global memory,
                // and however many threads a chunk walk's block has.
                let team = |team, rows| Some(foxhunt_memory::Stitch { team, rows });
                let threads = foxhunt_memory::WALK_THREADS;
                for ((chunk, walk, stitch, reuse, chain, clusters), walk_threads) in [
                    (foxhunt_memory::CHUNK_BARS, 8, None, true, false, true),
                    (foxhunt_memory::CHUNK_BARS, 8, None, false, false, false),
                    (1, 1, team(1, 32), true, true, true),
                    (7, 32, team(3, 1), false, false, true),
                    (300, 5, team(8, 32), true, true, true),
                    (300, 5, team(8, 32), true, false, false),
                    (
                        foxhunt_memory::CHUNK_BARS,
                        2,
                        team(2, 5),
                        false,
                        false,
                        false,
                    ),
                    (
                        foxhunt_memory::CHUNK_BARS,
                        2,
                        team(16, 2),
                        true,
                        false,
                        true,
                    ),
                ]
                .into_iter()
                .zip([threads, 256, 32, 1024, 64, 512, 96, threads])
                {
                    ev.set_chunk_bars(Some(chunk));
                    ev.set_walk_rows(walk);
                    ev.set_walk_threads(walk_threads).expect("walk threads");
                    ev.set_stitch(stitch).expect("stitch");
                    ev.set_stitch_clusters(clusters);
                    ev.set_first_layer_reuse(reuse);
                    ev.set_chain_only(chain);
                    let got = ev.targets(&net, split.clone()).expect("device decisions");
                    assert_eq!(
                        want.iter().zip(&got).position(|(a, b)| a != b),
                        None,
                        "{name} {split:?}: chunks of {chunk} ({walk} rows, {walk_threads} \
                         threads), stitch {stitch:?} (clusters {clusters}), first-layer reuse \
                         {reuse} decide otherwise"
                    );
                    let judged = ev.judge(&net, split.clone(), cfg.capital).expect("judged");
                    assert_eq!(
                        format!("{judged:?}"),
                        format!("{:?}", reference.metrics),
                        "{name} {split:?} chunks of {chunk}, stitch {stitch:?}, chain {chain}: \
                         device metrics"
                    );
                }
                ev.set_chunk_bars(None);
                ev.set_walk_rows(foxhunt_memory::WALK_ROWS);
                ev.set_walk_threads(threads).expect("walk threads");
                ev.set_stitch(None).expect("stitch");
                ev.set_stitch_clusters(true);
                ev.set_first_layer_reuse(true);
                ev.set_chain_only(false);
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 36);
    eprintln!("device greedy evaluation equals the host's in {compared} cases");
}

/// On a GPU: networks judged together (a population's validations, a row of blocks each) decide
/// and book exactly what each decides and books alone, with the stitch's teams chosen for the
/// population or set (several blocks a session, a cooperative launch of every row), and the same
/// network twice; networks of different shapes are refused.
#[cfg(feature = "cuda")]
#[test]
fn on_the_gpu_networks_judged_together_equal_each_judged_alone() {
    use foxhunt_dqn::fused::layout_words;
    use foxhunt_dqn::{AgentConfig, CpuBackend, DqnAgent, DqnConfig};
    use foxhunt_env::{Costs, EnvConfig, Execution};
    use foxhunt_memory::{DeviceEvaluator, DevicePool, NetOnDevice, Stitch, WindowData};
    let Some((ctx, market, spec)) = es_on_the_gpu() else {
        return;
    };
    let n = market.rows();
    let env = EnvConfig {
        lookback: 3,
        max_position: 2,
        ..EnvConfig::default()
    };
    let exec = Execution::new(&spec, Costs::default());
    let mut pool = DevicePool::new(&ctx);
    let arena = pool
        .window(&WindowData {
            market: market.clone(),
            exec,
        })
        .expect("upload");
    let mut ev = DeviceEvaluator::new(&arena, &env, market.session()).expect("evaluator");
    let agent_cfg = |seed: u64, hidden: Vec<usize>| {
        let dqn = DqnConfig {
            hidden,
            ..DqnConfig::default()
        };
        AgentConfig::new(env.obs_dim(market.cols()), env.actions(), seed, dqn)
    };
    // Differently seeded networks of one shape; near ties in one; the first again at the end.
    let cfg = agent_cfg(1, vec![64, 32]);
    let (words, max_width) = layout_words(&cfg);
    let mut params: Vec<Vec<f32>> = (0..5u64)
        .map(|seed| {
            DqnAgent::<CpuBackend>::new(agent_cfg(seed, vec![64, 32]), &Default::default())
                .expect("valid")
                .export_state()
                .online
        })
        .collect();
    let head = params[2].len() - (32 + 1) * env.actions();
    for v in &mut params[2][head..] {
        *v *= 1e-6;
    }
    params.push(params[0].clone());
    let layouts: Vec<_> = params
        .iter()
        .map(|_| ctx.upload(&words).expect("layout"))
        .collect();
    let uploaded: Vec<_> = params
        .iter()
        .map(|p| ctx.upload(p).expect("params"))
        .collect();
    let nets: Vec<NetOnDevice<'_>> = uploaded
        .iter()
        .zip(&layouts)
        .map(|(p, l)| NetOnDevice {
            params: p,
            layout: l,
            obs_dim: cfg.obs_dim,
            max_width,
            first_width: cfg.first_width(),
        })
        .collect();
    let capital = TrainConfig::default().capital;
    let mut compared = 0;
    for split in [0..n / 3, 17..n - 5] {
        let alone_targets: Vec<Vec<i8>> = nets
            .iter()
            .map(|net| ev.targets(net, split.clone()).expect("alone"))
            .collect();
        let alone: Vec<String> = nets
            .iter()
            .map(|net| {
                format!(
                    "{:?}",
                    ev.judge(net, split.clone(), capital).expect("alone")
                )
            })
            .collect();
        assert_ne!(
            alone[0], alone[1],
            "differently seeded networks trade differently"
        );
        assert_eq!(alone[0], alone[5]);
        for stitch in [
            None,
            Some(Stitch { team: 1, rows: 8 }),
            Some(Stitch { team: 2, rows: 5 }),
        ] {
            ev.set_stitch(stitch).expect("stitch");
            for k in [1, 2, nets.len()] {
                let together = ev.targets_all(&nets[..k], split.clone()).expect("together");
                assert_eq!(
                    together,
                    alone_targets[..k],
                    "{split:?} {stitch:?}: {k} networks' decisions"
                );
                let judged = ev
                    .judge_all(&nets[..k], split.clone(), capital)
                    .expect("together");
                let judged: Vec<String> = judged.iter().map(|m| format!("{m:?}")).collect();
                assert_eq!(
                    judged,
                    alone[..k],
                    "{split:?} {stitch:?}: {k} networks' metrics"
                );
                compared += 1;
            }
        }
        ev.set_stitch(None).expect("stitch");
        // Enough networks that the evaluator's own chunks are longer (foxhunt-memory's
        // chunk_bars_for): the same decisions and metrics as each alone.
        let sms = ctx.sm_count().expect("multiprocessors") as usize;
        let k = (1..4096)
            .find(|&k| {
                foxhunt_memory::chunk_bars_for(k, split.len(), sms)
                    >= 2 * foxhunt_memory::CHUNK_BARS
            })
            .expect("a population with longer chunks");
        let many: Vec<NetOnDevice<'_>> = nets.iter().cycle().take(k).copied().collect();
        let together = ev.targets_all(&many, split.clone()).expect("together");
        let judged = ev
            .judge_all(&many, split.clone(), capital)
            .expect("together");
        for (i, (t, m)) in together.iter().zip(&judged).enumerate() {
            let j = i % nets.len();
            assert_eq!(
                *t, alone_targets[j],
                "{split:?}: network {i} of {k}, decisions"
            );
            assert_eq!(
                format!("{m:?}"),
                alone[j],
                "{split:?}: network {i} of {k}, metrics"
            );
        }
        // Alone again after judging together: the buffers grown for the population change
        // nothing.
        assert_eq!(
            format!(
                "{:?}",
                ev.judge(&nets[1], split.clone(), capital).expect("alone")
            ),
            alone[1]
        );
    }
    assert_eq!(compared, 18);
    // Networks of different shapes cannot share an evaluation.
    let other = agent_cfg(9, vec![48]);
    let (other_words, other_width) = layout_words(&other);
    let other_layout = ctx.upload(&other_words).expect("layout");
    let other_params = ctx
        .upload(
            &DqnAgent::<CpuBackend>::new(other.clone(), &Default::default())
                .expect("valid")
                .export_state()
                .online,
        )
        .expect("params");
    let odd = NetOnDevice {
        params: &other_params,
        layout: &other_layout,
        obs_dim: other.obs_dim,
        max_width: other_width,
        first_width: other.first_width(),
    };
    let e = ev
        .judge_all(&[nets[0], odd], 0..n / 3, capital)
        .expect_err("shapes differ");
    assert!(e.to_string().contains("differ in shape"), "{e}");
}

/// On a GPU: decisions booked on the device give the host backtest's metrics to the bit, for
/// decisions of every kind (random, sparse, held for long, flipping, at the position limit),
/// with costs whose sums are exact in any order (the equity summed in parallel) and costs that
/// are not (summed as one chain), on the bundled real bars (several contracts, rolls).
#[cfg(feature = "cuda")]
#[test]
fn on_the_gpu_booking_equals_the_host_backtest() {
    use foxhunt_env::{Costs, EnvConfig, Execution};
    use foxhunt_memory::{DeviceEvaluator, DevicePool, WindowData};
    use foxhunt_trainer::eval::book;
    let Some((ctx, market, spec)) = es_on_the_gpu() else {
        return;
    };
    let n = market.rows();
    let mut parallel = [0, 0];
    let mut compared = 0;
    for (max_position, costs) in [
        (1u8, Costs::default()),
        (
            2,
            Costs {
                commission: 1.18,
                slippage_ticks: 0.5,
            },
        ),
        (
            3,
            Costs {
                commission: 0.0,
                slippage_ticks: 0.0,
            },
        ),
    ] {
        let env = EnvConfig {
            max_position,
            ..EnvConfig::default()
        };
        let exec = Execution::new(&spec, costs);
        let cfg = TrainConfig {
            env: env.clone(),
            costs,
            ..TrainConfig::default()
        };
        let mut pool = DevicePool::new(&ctx);
        let arena = pool
            .window(&WindowData {
                market: market.clone(),
                exec,
            })
            .expect("upload");
        let mut ev = DeviceEvaluator::new(&arena, &env, market.session()).expect("evaluator");
        let limit = i64::from(max_position);
        let draw = |seed: u64, t: usize| foxhunt_env::vec_env::mix64(seed ^ (t as u64 * 0x9E37));
        /// A kind of decisions: the target at bar t.
        type Decide = Box<dyn Fn(usize) -> i8>;
        let kinds: [(&str, Decide); 5] = [
            (
                "random",
                Box::new(move |t| ((draw(1, t) % (2 * limit as u64 + 1)) as i64 - limit) as i8),
            ),
            (
                "sparse",
                Box::new(move |t| if draw(2, t) % 50 == 0 { 1 } else { 0 }),
            ),
            (
                "held",
                Box::new(move |t| if (t / 400) % 3 == 0 { 0 } else { limit as i8 }),
            ),
            (
                "flips",
                Box::new(move |t| {
                    if (t / 7) % 2 == 0 {
                        -(limit as i8)
                    } else {
                        limit as i8
                    }
                }),
            ),
            (
                "beyond the limit",
                Box::new(move |t| (draw(3, t) % 9) as i8 - 4),
            ),
        ];
        for (name, kind) in &kinds {
            for split in [0..n, 3..n / 2, n / 2..n - 1, 100..101, 500..503] {
                let targets: Vec<i8> = split.clone().map(kind).collect();
                let host = book(&targets, &market, &exec, &cfg, split.clone()).expect("host");
                // A session booked by one warp, or in slices by several (uneven, and the
                // default), trades open across the slices' edges included; the split's rows
                // summed by one block, or by a cluster of several (uneven, blocks without rows
                // in the short splits, and the default).
                for (warps, blocks) in [(1, 1), (3, 3), (8, 8), (3, 1), (1, 8)] {
                    ev.set_book_warps(Some(warps));
                    ev.set_book_blocks(Some(blocks));
                    let dev = ev
                        .book_targets(&targets, split.clone(), cfg.capital)
                        .expect("device");
                    assert_eq!(
                        format!("{:?}", dev.metrics()),
                        format!("{:?}", host.metrics),
                        "{name} {split:?} max {max_position} {costs:?}, {warps} warps, \
                         {blocks} blocks"
                    );
                    assert_eq!(
                        dev.daily_pnl, host.daily_pnl,
                        "{name}: daily PnL, {warps} warps, {blocks} blocks"
                    );
                    parallel[usize::from(dev.parallel_equity)] += 1;
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, 5 * 75);
    // Both ways of summing the equity were taken.
    assert!(parallel[0] > 0 && parallel[1] > 0, "{parallel:?}");
}
