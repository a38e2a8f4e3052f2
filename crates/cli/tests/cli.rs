//! End-to-end tests of the `foxhunt` binary on the bundled real data.

use std::process::{Command, Output};

use foxhunt_testkit::{Scratch, root};

/// Runs foxhunt from the workspace root, so paths in its output are stable.
fn foxhunt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_foxhunt"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("foxhunt runs")
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = foxhunt(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

/// Runs foxhunt expecting exit code 1 and `expected` in its one-paragraph error.
fn fails_with(args: &[&str], expected: &str) {
    let out = foxhunt(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        err.contains(expected),
        "{args:?}: expected {expected:?} in {err}"
    );
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn inspect_bundled_es_text() {
    let out = foxhunt(&[
        "data",
        "inspect",
        "--data-dir",
        "test_data/futures-baseline",
        "--symbol",
        "ES.FUT",
        "--train-months",
        "3",
        "--val-months",
        "1",
        "--test-months",
        "1",
        "--step-months",
        "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    insta::assert_snapshot!(stdout(&out));
}

#[test]
fn inspect_json_on_every_bundled_data_set() {
    let es = json(&[
        "data",
        "inspect",
        "--data-dir",
        "test_data/futures-baseline",
        "--symbol",
        "ES.FUT",
        "--json",
    ]);
    // 150,350 synthetic lead-in bars (2013-03-25 .. 09-05) and 18,888 real ones.
    assert_eq!(es["bars"], 169_238);
    assert_eq!(es["rolls"][0]["from"], "ESM3");
    assert_eq!(es["rolls"][1]["from"], "ESU3");
    assert_eq!(es["rolls"][2]["from"], "ESZ3");
    assert_eq!(es["rolls"][2]["to"], "ESH4");
    assert_eq!(es["windows"], serde_json::Value::Null);
    let fx = json(&[
        "data",
        "inspect",
        "--data-dir",
        "test_data/cme-6e-1min-2024-01",
        "--symbol",
        "6E.FUT",
        "--bar-time",
        "end",
        "--train-weeks",
        "2",
        "--val-days",
        "3",
        "--test-days",
        "3",
        "--step-days",
        "3",
        "--json",
    ]);
    assert_eq!(fx["bars"], 29_996);
    assert_eq!(fx["first"], "2024-01-01T23:00:00Z");
    let windows = fx["windows"]["windows"].as_array().expect("windows");
    assert!(!windows.is_empty());
    assert_eq!(windows[0]["train"]["start"], "2024-01-02");
    let gc = json(&[
        "data",
        "inspect",
        "--data-dir",
        "test_data/lean-futures-minute/comex/minute/gc",
        "--symbol",
        "GC.FUT",
        "--json",
    ]);
    assert_eq!(gc["contracts"].as_array().map(Vec::len), Some(15));
    let nq = json(&[
        "data",
        "inspect",
        "--data-dir",
        "test_data/databento-dbn",
        "--symbol",
        "NQ.FUT",
        "--json",
    ]);
    assert_eq!(nq["bars"], 40);
    let lean_es = json(&[
        "data",
        "inspect",
        "--data-dir",
        "test_data/lean-futures-minute/cme/minute/es",
        "--symbol",
        "ES.FUT",
        "--json",
    ]);
    assert_eq!(
        lean_es["bars"], 18_888,
        "the Lean source and the real part of its DBN conversion give one series"
    );
}

#[test]
fn bad_input_exits_non_zero_with_one_clear_paragraph() {
    let out = foxhunt(&[
        "data",
        "inspect",
        "--data-dir",
        "test_data/futures-baseline",
        "--symbol",
        "NQ.FUT",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "error: symbol NQ.FUT not found in test_data/futures-baseline; symbols present: ESH0"
        ),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one paragraph: {err}");
    assert!(!err.contains("panicked") && stdout(&out).is_empty());

    let dir = Scratch::new("cli-test");
    std::fs::write(
        dir.join("es.csv"),
        "2024-01-02T14:30:00Z,100,99,98,100.5,10,ESZ3\n",
    )
    .expect("write");
    fails_with(
        &[
            "data",
            "inspect",
            "--data-dir",
            dir.to_str().expect("utf-8"),
            "--symbol",
            "ES.FUT",
        ],
        "es.csv: line 1: ESZ3: invalid bar: high 99 is below max(open, close) = 100.5",
    );

    fails_with(
        &[
            "data",
            "inspect",
            "--data-dir",
            "test_data/futures-baseline",
            "--symbol",
            "ES.FUT",
            "--train-months",
            "3",
        ],
        "need all four periods",
    );
    fails_with(
        &[
            "data",
            "inspect",
            "--data-dir",
            "test_data/futures-baseline",
            "--symbol",
            "ES.FUT",
            "--tz",
            "Mars/Base",
        ],
        "unknown time zone \"Mars/Base\"",
    );
}

#[test]
fn backtest_json_carries_the_metrics_and_matches_an_independent_buy_and_hold() {
    let out = json(&[
        "backtest",
        "--data-dir",
        "test_data/futures-baseline",
        "--symbol",
        "ES.FUT",
        "--strategy",
        "buy-and-hold",
        "--commission",
        "1.5",
        "--slippage-ticks",
        "2",
        "--json",
    ]);
    for key in [
        "total_pnl",
        "sharpe",
        "sortino",
        "max_drawdown",
        "trades",
        "total_costs",
        "bars",
    ] {
        assert!(out.get(key).is_some(), "missing {key}: {out}");
    }
    // Independently from the data layer: long from the first fill (open of the second bar) to
    // the last close, one round trip plus one per roll, each side 1.5 + 2 ticks x 12.50.
    let d = foxhunt_testkit::es_dataset();
    let f = &d.features;
    let round_trip = 2.0 * (1.5 + 2.0 * 12.5);
    let expected =
        (f.close[f.rows - 1] - f.open[1]) * 50.0 - round_trip * (1 + d.series.rolls.len()) as f64;
    assert!(
        (out["total_pnl"].as_f64().expect("number") - expected).abs() < 1e-6,
        "{out}"
    );
    assert_eq!(out["bars"], f.rows);
    assert_eq!(
        out["total_costs"].as_f64(),
        Some(round_trip * (1 + d.series.rolls.len()) as f64)
    );
}

#[test]
fn backtest_all_strategies_on_every_bundled_data_set() {
    for args in [
        &[
            "--data-dir",
            "test_data/futures-baseline",
            "--symbol",
            "ES.FUT",
        ][..],
        &[
            "--data-dir",
            "test_data/cme-6e-1min-2024-01",
            "--symbol",
            "6E.FUT",
            "--bar-time",
            "end",
            "--from",
            "2024-01-10",
            "--to",
            "2024-01-20",
        ],
        &[
            "--data-dir",
            "test_data/lean-futures-minute/comex/minute/gc",
            "--symbol",
            "GC.FUT",
        ],
        &[
            "--data-dir",
            "test_data/databento-dbn",
            "--symbol",
            "NQ.FUT",
        ],
    ] {
        let mut a = vec!["backtest", "--strategy", "all", "--json"];
        a.extend_from_slice(args);
        let v = json(&a);
        let names: Vec<&str> = v
            .as_array()
            .expect("array")
            .iter()
            .map(|r| r["strategy"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            names,
            ["flat", "buy-and-hold", "random", "momentum-30"],
            "{args:?}"
        );
    }
    fails_with(
        &[
            "backtest",
            "--data-dir",
            "test_data/futures-baseline",
            "--symbol",
            "ES.FUT",
            "--strategy",
            "flat",
            "--from",
            "2030-01-01",
        ],
        "a backtest needs at least 2",
    );
    fails_with(
        &[
            "backtest",
            "--data-dir",
            "test_data/futures-baseline",
            "--symbol",
            "ES.FUT",
            "--strategy",
            "flat",
            "--commission=-1",
        ],
        "--commission must be zero or more",
    );
}

/// A small `foxhunt train` over the bundled data: phase lines on stdout, the run directory's
/// files, `foxhunt report`, and the device rules on a machine without a GPU.
#[test]
fn train_without_a_gpu_falls_back_to_the_cpu_unless_cuda_is_asked_for() {
    if foxhunt_testkit::gpu_machine() {
        return; // this machine has a GPU: the fallback cannot be observed here
    }
    let scratch = Scratch::new("cli-train");
    let out_dir = scratch.join("run");
    let out_arg = out_dir.display().to_string();
    let mut args = vec![
        "train",
        "--data-dir",
        "test_data/futures-baseline",
        "--symbol",
        "ES.FUT",
        "--train-months",
        "3",
        "--val-months",
        "1",
        "--test-months",
        "1",
        "--step-months",
        "3",
        "--epochs",
        "2",
        "--max-steps-per-epoch",
        "6",
        "--envs",
        "4",
        "--learning-starts",
        "8",
        "--batch-size",
        "8",
        "--hidden",
        "8",
        "--out",
        &out_arg,
    ];
    // Asked for CUDA where there is none: an error, and nothing trained.
    let mut cuda = args.clone();
    cuda.extend(["--device", "cuda"]);
    fails_with(&cuda, "no CUDA device found");
    // auto (the default): says so and trains on the CPU.
    args.extend(["--device", "auto"]);
    let out = foxhunt(&args);
    let (so, se) = (
        stdout(&out),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{se}\n{so}");
    assert!(so.contains("no CUDA device found"), "{so}");
    assert!(so.contains("training on the CPU"), "{so}");
    let lines: Vec<&str> = so
        .lines()
        .filter(|l| l.contains("phase breakdown window="))
        .collect();
    assert_eq!(lines.len(), 4, "2 windows x 2 epochs: {so}");
    assert!(
        so.contains("device cpu; 2 windows trained, 0 failed"),
        "{so}"
    );
    for f in [
        "config.json",
        "report.json",
        "equity.csv",
        "equity.png",
        "summary.txt",
        "report.html",
    ] {
        assert!(out_dir.join(f).is_file(), "{f} missing");
    }
    let written = std::fs::read(out_dir.join("report.json")).expect("report");
    let report = foxhunt(&["report", &out_arg]);
    assert!(report.status.success());
    assert_eq!(
        stdout(&report),
        std::fs::read_to_string(out_dir.join("summary.txt")).expect("summary")
    );
    assert_eq!(
        std::fs::read(out_dir.join("report.json")).expect("report"),
        written,
        "foxhunt report reads a finished run's report, never rewrites it"
    );
    // --html writes the run's report.html again, the same as the run wrote.
    let page = std::fs::read(out_dir.join("report.html")).expect("report.html");
    let html = foxhunt(&["report", &out_arg, "--html"]);
    assert!(html.status.success());
    assert!(stdout(&html).contains("report.html"), "{}", stdout(&html));
    assert_eq!(
        std::fs::read(out_dir.join("report.html")).expect("again"),
        page
    );
}

/// The arguments of a small CPU `foxhunt train` on the bundled data into `out`, with `extra`
/// flags; an extra `!--flag` takes the base's `--flag VALUE` out (clap refuses most flags given
/// twice).
fn small_train_args(out: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let out = out.display().to_string();
    let mut args = vec![
        "train",
        "--data-dir",
        "test_data/futures-baseline",
        "--symbol",
        "ES.FUT",
        "--train-months",
        "3",
        "--val-months",
        "1",
        "--test-months",
        "1",
        "--step-months",
        "1",
        "--epochs",
        "1",
        "--max-steps-per-epoch",
        "4",
        "--envs",
        "2",
        "--hidden",
        "8",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        &out,
    ];
    for flag in extra.iter().filter_map(|a| a.strip_prefix('!')) {
        let at = args
            .iter()
            .position(|a| *a == flag)
            .expect("a flag of the base");
        args.drain(at..at + 2);
    }
    args.extend(extra.iter().filter(|a| !a.starts_with('!')));
    args.into_iter().map(String::from).collect()
}

/// Runs [`small_train_args`].
fn train_small(out: &std::path::Path, extra: &[&str]) -> Output {
    let args = small_train_args(out, extra);
    foxhunt(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn unusable_train_settings_are_refused_before_a_run_directory_exists() {
    let scratch = Scratch::new("cli-settings");
    for (i, (extra, names)) in [
        (&["--beta1", "1"][..], "beta1 must be in [0, 1), got 1"),
        (&["--adam-eps", "0"], "adam_eps must be in > 0, got 0"),
        (&["--grad-clip", "-1"], "grad_clip must be in > 0"),
        (
            &["--huber-delta", "-2"],
            "loss.delta (Huber) must be in > 0, got -2",
        ),
        (
            &["--eps-start", "1.5"],
            "epsilon.start must be in [0, 1], got 1.5",
        ),
        (
            &["--lr-schedule", "linear", "--lr-end-factor", "-0.5"],
            "lr_schedule.end_factor must be in [0, 1], got -0.5",
        ),
        (
            &["--prioritized", "--per-alpha", "-1"],
            "prioritized.alpha must be in [0, 1], got -1",
        ),
        (
            &["--replay-capacity", "0"],
            "batch_size in 1..=replay_capacity",
        ),
        (&["!--hidden", "--hidden", "100000,100000"], "network: 100"),
        (&["--lookback", "1000000"], "lookback 1000000"),
        (&["!--envs", "--envs", "1000000000"], "(envs)"),
        (&["--gap-days", "100000000"], "beyond the calendar's range"),
        (
            &["!--train-months", "--train-months", "4294967295"],
            "beyond the calendar's range",
        ),
        (
            &["--min-bars", "100000000"],
            "the walk-forward plan has no window to train",
        ),
        (
            &["--devices", "0"],
            "--devices picks GPUs; it cannot go with --device cpu",
        ),
        (&["--devices", "0,x"], "\"x\" is not a GPU index"),
        // No GPU where CI runs: the missing driver is named; on a GPU machine, the device.
        (&["!--device", "--devices", "9"], "CUDA"),
        (&["--workers-per-device", "0"], "at least 1"),
        (&["--sweep", "dqn.lrr=0.1,0.2"], "unknown setting `dqn.lrr`"),
        (&["--sweep", "capital=1,2"], "`capital` cannot be swept"),
        (
            &["--sweep", "dqn.lr=0.1", "--sweep", "dqn.lr=0.2"],
            "--sweep names dqn.lr twice",
        ),
        (&["--sweep", "dqn.gamma=0.9,2"], "sweep: dqn.gamma=2"),
        (
            &["--agents", "2", "--ensemble", "3"],
            "larger than the population",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let out_dir = scratch.join(format!("run-{i}"));
        let out = train_small(&out_dir, extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(
            err.contains(names),
            "{extra:?}: expected {names:?} in {err}"
        );
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
        assert!(!out_dir.exists(), "{extra:?} left a run directory behind");
    }
}

/// A population from the command line and the same from a config file: the run's recorded
/// settings are equal, the report has the population per window and the vote beside the agent.
#[test]
fn a_population_from_flags_or_from_the_config_file_is_the_same_run() {
    let scratch = Scratch::new("cli-population");
    let flags = scratch.join("flags");
    let out = train_small(
        &flags,
        &[
            "--agents",
            "2",
            "--sweep",
            "dqn.lr=0.001,0.003",
            "--ensemble",
            "2",
            "--select",
            "sharpe",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout(&out).contains("of 4 selected on validation"),
        "{}",
        stdout(&out)
    );
    let toml = scratch.join("population.toml");
    std::fs::write(
        &toml,
        "agents = 2\nensemble = 2\nselect = \"sharpe\"\n[sweep]\ndqn.lr = [0.001, 0.003]\n",
    )
    .expect("write");
    let file = scratch.join("file");
    let path = toml.display().to_string();
    let out = train_small(&file, &["--config", &path]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |dir: &std::path::Path, name: &str| -> serde_json::Value {
        let bytes = std::fs::read(dir.join(name)).expect(name);
        serde_json::from_slice(&bytes).expect("json")
    };
    assert_eq!(
        read(&flags, "config.json")["train"],
        read(&file, "config.json")["train"]
    );
    let report = read(&flags, "report.json");
    for w in report["windows"].as_array().expect("windows") {
        assert_eq!(
            w["population"]["members"]
                .as_array()
                .expect("members")
                .len(),
            4
        );
        assert_eq!(
            w["population"]["ensemble"].as_array().expect("vote").len(),
            2
        );
        assert_eq!(w["test_results"][1]["policy"], "ensemble");
    }
    assert_eq!(report["windows"], read(&file, "report.json")["windows"]);
}

#[test]
fn a_run_whose_every_window_fails_exits_non_zero_with_its_reports_written() {
    let scratch = Scratch::new("cli-failed");
    let out_dir = scratch.join("run");
    // A learning rate of 1e30 without clipping makes every window's loss non-finite.
    let out = train_small(
        &out_dir,
        &[
            "--lr",
            "1e30",
            "--grad-clip",
            "0",
            "--learning-starts",
            "1",
            "--batch-size",
            "2",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("every window failed"), "{err}");
    assert!(
        stdout(&out).contains("FAILED: window 0"),
        "{}",
        stdout(&out)
    );
    assert!(out_dir.join("summary.txt").is_file() && out_dir.join("report.json").is_file());
}

#[test]
fn a_run_directory_is_new_empty_or_a_run_and_has_one_process_at_a_time() {
    let scratch = Scratch::new("cli-rundir");
    let run = |out: &std::path::Path, extra: &[&str]| train_small(out, extra);
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // A directory holding a user's files is refused and left exactly as it was.
    let mine = scratch.join("mine");
    std::fs::create_dir_all(&mine).expect("dir");
    std::fs::write(mine.join("notes.txt"), "keep me").expect("write");
    let out = run(&mine, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", err(&out));
    assert!(
        err(&out).contains("is not empty (it holds notes.txt)"),
        "{}",
        err(&out)
    );
    let left: Vec<_> = std::fs::read_dir(&mine)
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("notes.txt")]);
    assert_eq!(
        std::fs::read_to_string(mine.join("notes.txt")).expect("read"),
        "keep me"
    );

    // A directory another process works in (this test holds its lock): refused at once,
    // naming the holder; nothing written.
    let busy = scratch.join("busy");
    std::fs::create_dir_all(&busy).expect("dir");
    let lock = foxhunt_fs::lock_dir(&busy).expect("lock");
    let out = run(&busy, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", err(&out));
    assert!(
        err(&out).contains(&format!(
            "another process (pid {}) is using",
            std::process::id()
        )),
        "{}",
        err(&out)
    );
    assert!(!busy.join("config.json").exists());
    drop(lock);

    // --resume where there is no run.
    let out = run(&scratch.join("none"), &["--resume"]);
    assert_eq!(out.status.code(), Some(1), "{}", err(&out));
    assert!(err(&out).contains("holds no foxhunt run"), "{}", err(&out));
    assert!(!scratch.join("none").exists());
}

#[test]
fn resume_refuses_a_change_of_how_the_data_is_read() {
    let scratch = Scratch::new("cli-resume-reading");
    let dir = scratch.join("run");
    let out = train_small(&dir, &["--stop-after-epochs", "1"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (extra, names) in [
        (
            &["--tz", "America/Chicago"][..],
            "source.loader.tz: \"UTC\" -> \"America/Chicago\"",
        ),
        (&["--bar-time", "end"], "source.loader.bar_time"),
    ] {
        let mut args = vec!["--resume"];
        args.extend(extra);
        let out = train_small(&dir, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(
            err.contains(names),
            "{extra:?}: expected {names:?} in {err}"
        );
    }
    let out = train_small(&dir, &["--resume"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `foxhunt resume DIR` continues a stopped run from its directory alone, to the results of
/// the same run uninterrupted; a directory without a run, or whose config.json was edited, is
/// refused naming the file.
#[test]
fn resume_continues_a_stopped_run_from_its_directory_alone() {
    let scratch = Scratch::new("cli-resume-alone");
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let stopped = scratch.join("stopped");
    let out = train_small(&stopped, &["--stop-after-epochs", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", err(&out));
    assert!(
        !stopped.join("report.json").exists(),
        "stopped before its end"
    );
    let dir = stopped.display().to_string();
    let out = foxhunt(&["resume", &dir, "--no-progress"]);
    assert!(out.status.success(), "{}", err(&out));
    assert!(stdout(&out).contains("run directory: "), "{}", stdout(&out));
    let whole = scratch.join("whole");
    let out = train_small(&whole, &[]);
    assert!(out.status.success(), "{}", err(&out));
    let read = |dir: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).expect("report"))
            .expect("json")
    };
    let windows = read(&stopped)["windows"].clone();
    assert!(windows.as_array().is_some_and(|w| w.len() > 1), "{windows}");
    assert_eq!(windows, read(&whole)["windows"]);

    // No run there: refused, nothing made.
    let none = scratch.join("none");
    fails_with(
        &["resume", &none.display().to_string()],
        "not a foxhunt run directory (no config.json)",
    );
    assert!(!none.exists());
    // A recorded setting edited by hand: the seal refuses it, naming the file.
    let config = stopped.join("config.json");
    let text = std::fs::read_to_string(&config).expect("config");
    let edited = text.replacen("\"epochs\": 1", "\"epochs\": 2", 1);
    assert_ne!(edited, text, "config.json records the epochs");
    std::fs::write(&config, edited).expect("write");
    let out = foxhunt(&["resume", &dir]);
    assert_eq!(out.status.code(), Some(1), "{}", err(&out));
    assert!(err(&out).contains("config.json"), "{}", err(&out));
}

/// Two real processes on one run directory: one trains, the other is refused (by the lock while
/// the first runs, or as a directory holding a run once it is done), and what the first wrote
/// is whole. A lock file left by a process that is gone blocks nothing.
#[test]
fn two_processes_on_one_run_directory_never_both_run() {
    let scratch = Scratch::new("cli-two");
    let dir = scratch.join("run");
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_foxhunt"))
            .args(small_train_args(
                &dir,
                &[
                    "!--epochs",
                    "--epochs",
                    "2",
                    "!--max-steps-per-epoch",
                    "--max-steps-per-epoch",
                    "20",
                    "!--envs",
                    "--envs",
                    "4",
                ],
            ))
            .current_dir(root())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starts")
    };
    let (a, b) = (spawn(), spawn());
    let outs = [
        a.wait_with_output().expect("runs"),
        b.wait_with_output().expect("runs"),
    ];
    let ok: Vec<&Output> = outs.iter().filter(|o| o.status.success()).collect();
    assert_eq!(ok.len(), 1, "exactly one trains: {outs:?}");
    let refused = outs
        .iter()
        .find(|o| !o.status.success())
        .expect("one refused");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is using") || err.contains("already holds a run"),
        "{err}"
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).expect("report"))
            .expect("the winner's report is whole");
    assert!(r["windows"].is_array());

    // A stale lock file (its process long gone) in an otherwise empty directory: taken over.
    let stale = scratch.join("stale");
    std::fs::create_dir_all(&stale).expect("dir");
    std::fs::write(stale.join(".lock"), "pid 4000000000\n").expect("write");
    let out = train_small(&stale, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A shard named by the Slurm job-array environment trains its windows and says which; the
/// report of the run before the other shard ran lists what is missing and whose it is.
#[test]
fn a_shard_from_the_job_array_environment_and_a_report_of_what_is_missing() {
    let scratch = Scratch::new("cli-shard");
    let dir = scratch.join("run");
    let d = dir.display().to_string();
    let args = small_train_args(
        &dir,
        &[
            "!--train-months",
            "--train-weeks",
            "4",
            "!--val-months",
            "--val-weeks",
            "1",
            "!--test-months",
            "--test-weeks",
            "1",
            "!--step-months",
            "--step-weeks",
            "2",
        ],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_foxhunt"))
        .args(args)
        .env("SLURM_ARRAY_TASK_ID", "0")
        .env("SLURM_ARRAY_TASK_COUNT", "2")
        .current_dir(root())
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}{}", stdout(&out));
    // Training logs on stdout.
    let log = stdout(&out);
    assert!(
        log.contains("shard 0/2 owns 5 of the plan's 10 windows: 0, 2, 4, 6, 8"),
        "{log}"
    );
    let report = foxhunt(&["report", &d]);
    let rerr = String::from_utf8_lossy(&report.stderr);
    assert_eq!(report.status.code(), Some(1), "{rerr}");
    assert!(
        rerr.contains(
            "5 of the plan's windows not finished: window 1 (shard 1/2), window 3 (shard 1/2)"
        ),
        "{rerr}"
    );
    fails_with(
        &[
            "train",
            "--data-dir",
            "d",
            "--symbol",
            "ES.FUT",
            "--shard",
            "1/2",
        ],
        "shard 1/2 needs --out DIR",
    );
}
