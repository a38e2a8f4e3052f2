//! The walk-forward loop: for each window build its arena (one copy), train epochs (collect,
//! train, sync, eval) with an engine, keep the checkpoint that scores best on validation, test
//! it once, and report all of it; write resumable state as it goes.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use foxhunt_data::{Dataset, Normalizer, WalkForwardConfig, Window};
use foxhunt_dqn::replay::Replay;
use foxhunt_dqn::{CpuBackend, DqnAgent, Snapshot, checkpoint};
use foxhunt_env::vec_env::mix64;
use foxhunt_env::{ContractSpec, Execution, MarketData};
use foxhunt_memory::{HostArena, HostPool, Pool, WindowData};

use crate::TrainError;
use crate::config::{DeviceChoice, TrainConfig};
use crate::engine::host::{HostEngine, HostSetup};
use crate::engine::{Engine, EpochPlan, EvalData, Judged};
use crate::phase::{Phase, PhaseClock, PhaseTimes};
use crate::progress::Bars;
use crate::report::{
    self, Curve, EpochSummary, PolicyResult, RunReport, Skipped, WindowReport, WindowStatus,
    read_json, write_json,
};
use crate::rundir::{Progress, WindowDir};

/// What to train on and how.
pub struct Job<'a> {
    /// The loaded series and features.
    pub dataset: &'a Dataset,
    /// The contract traded.
    pub spec: &'a ContractSpec,
    /// The walk-forward plan's settings.
    pub windows: &'a WalkForwardConfig,
    /// The training settings.
    pub cfg: &'a TrainConfig,
    /// Where the data came from (directory, symbol, ...), recorded with the run's config.
    pub source: serde_json::Value,
}

/// How to run a job.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The run directory (reports, checkpoints, state).
    pub out: PathBuf,
    /// Continue the run in `out`: finished windows are read back, an unfinished one continues
    /// from its last saved epoch.
    pub resume: bool,
    /// Stop (state written) after this many epochs in this invocation, for time-boxed runs;
    /// `--resume` continues.
    pub stop_after_epochs: Option<usize>,
    /// Progress bars on a terminal.
    pub progress: bool,
    /// Train only this shard's windows of a run directory that several processes share
    /// (`None`: every window, and the directory is this process's alone).
    pub shard: Option<crate::Shard>,
    /// The GPUs the windows are spread over (one worker each).
    pub devices: Devices,
    /// Workers per device (GPU, or the CPU), each taking the next window: for small networks
    /// that leave a device idle. Default 1.
    pub workers_per_device: usize,
}

/// The device a run trains on, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// burn NdArray, rayon environments.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
}

#[cfg(feature = "cuda")]
type Gpu = std::sync::Arc<foxhunt_gpu::GpuContext>;
/// No GPU can be opened in a build without CUDA: the type has no values.
#[cfg(not(feature = "cuda"))]
#[derive(Clone)]
enum Gpu {}

/// The device `--device` asks for, opened once: the context a CUDA run then works in.
/// `auto` takes the GPU when one can be used and otherwise says why and takes the CPU; `cuda`
/// without a usable GPU is an error ("no CUDA device found: ...").
fn open_device(choice: DeviceChoice) -> Result<Option<Gpu>, TrainError> {
    #[cfg(feature = "cuda")]
    let open = || foxhunt_gpu::GpuContext::new(0);
    #[cfg(not(feature = "cuda"))]
    let open = || -> Result<Gpu, foxhunt_gpu::GpuError> {
        Err(foxhunt_gpu::GpuError::NoCuda(
            "this build has no CUDA support (build with the `cuda` feature)".into(),
        ))
    };
    match choice {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Cuda => Ok(Some(open()?)),
        DeviceChoice::Auto => match open() {
            Ok(ctx) => Ok(Some(ctx)),
            Err(e) => {
                tracing::warn!("{e}; training on the CPU");
                Ok(None)
            }
        },
    }
}

/// Which GPUs a run's workers train on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Devices {
    /// The one device `--device` resolves to (GPU 0 or the CPU).
    #[default]
    One,
    /// These GPUs, one worker (or `workers_per_device`) each.
    List(Vec<usize>),
    /// Every GPU of the host.
    All,
}

/// One slot per worker: the context of its GPU, or `None` for the CPU. `--devices` names GPUs
/// (and so needs `--device cuda` or `auto`); `per_device` workers share each device.
fn open_workers(
    choice: DeviceChoice,
    devices: &Devices,
    per_device: usize,
) -> Result<Vec<Option<Gpu>>, TrainError> {
    if per_device == 0 {
        return Err(TrainError::Options(
            "--workers-per-device must be at least 1".into(),
        ));
    }
    let opened: Vec<Option<Gpu>> = match devices {
        Devices::One => vec![open_device(choice)?],
        _ if choice == DeviceChoice::Cpu => {
            return Err(TrainError::Options(
                "--devices picks GPUs; it cannot go with --device cpu".into(),
            ));
        }
        #[cfg(feature = "cuda")]
        list => {
            let count = foxhunt_gpu::GpuContext::device_count()?;
            let wanted: Vec<usize> = match list {
                Devices::List(v) => v.clone(),
                _ => (0..count).collect(),
            };
            if wanted.is_empty() {
                return Err(TrainError::Options(
                    "--devices all: this machine has no CUDA device".into(),
                ));
            }
            for (k, &d) in wanted.iter().enumerate() {
                if d >= count {
                    return Err(TrainError::Options(format!(
                        "--devices: GPU {d} does not exist; this machine has {count} CUDA \
                         device(s){}",
                        if count > 0 {
                            format!(", numbered 0 to {}", count - 1)
                        } else {
                            String::new()
                        }
                    )));
                }
                if wanted[..k].contains(&d) {
                    return Err(TrainError::Options(format!(
                        "--devices names GPU {d} twice; use --workers-per-device for several \
                         workers on one GPU"
                    )));
                }
            }
            wanted
                .into_iter()
                .map(|d| foxhunt_gpu::GpuContext::new(d).map(Some))
                .collect::<Result<_, _>>()?
        }
        #[cfg(not(feature = "cuda"))]
        _ => {
            return Err(TrainError::Gpu(foxhunt_gpu::GpuError::NoCuda(
                "--devices: this build has no CUDA support (build with the `cuda` feature)".into(),
            )));
        }
    };
    let mut slots = Vec::with_capacity(opened.len() * per_device);
    for gpu in opened {
        slots.push(gpu.clone());
        for _ in 1..per_device {
            // Workers on one GPU each queue on a stream of their own, so that one's kernels
            // fill what the other leaves idle; one worker keeps the device's default stream.
            #[cfg(feature = "cuda")]
            slots.push(gpu.as_ref().map(|g| g.worker()).transpose()?);
            #[cfg(not(feature = "cuda"))]
            slots.push(gpu.clone());
        }
    }
    Ok(slots)
}

/// Resolves `--device` as [`run`] does (see there).
pub fn resolve_device(choice: DeviceChoice) -> Result<Resolved, TrainError> {
    Ok(match open_device(choice)? {
        Some(_) => Resolved::Cuda,
        None => Resolved::Cpu,
    })
}

/// The device side of a run, alive for the whole run.
enum DeviceRun {
    Cpu,
    #[cfg(feature = "cuda")]
    Gpu(crate::engine::device::GpuRun),
    #[cfg(not(feature = "cuda"))]
    #[allow(dead_code)]
    Gpu(Gpu),
}

/// Runs the job: every window of the plan, then the aggregate report. Returns the report that
/// was also written to `out/report.json`.
pub fn run(job: &Job<'_>, opts: &RunOptions) -> Result<RunReport, TrainError> {
    job.cfg.validate()?;
    let plan = foxhunt_data::walkforward::plan(&job.dataset.series.row_days(), job.windows)?;
    if plan.windows.is_empty() {
        // Refused before a run directory is made: a run that trains nothing is no result.
        let why: Vec<String> = plan
            .skipped
            .iter()
            .map(|s| format!("window {}: {}", s.window.index, s.reason))
            .collect();
        return Err(TrainError::Options(format!(
            "the walk-forward plan has no window to train ({} skipped, {} wholly in holes in \
             the data{}{}); choose shorter periods, a smaller --min-bars or more data",
            plan.skipped.len(),
            plan.empty,
            if why.is_empty() { "" } else { ": " },
            why.join("; ")
        )));
    }
    let learning_starts = job.cfg.learning_starts.max(job.cfg.dqn.batch_size);
    let collected = job
        .cfg
        .envs
        .saturating_mul(job.cfg.max_steps_per_epoch)
        .saturating_mul(job.cfg.epochs);
    if learning_starts > collected.min(job.cfg.dqn.replay_capacity) {
        tracing::warn!(
            "no update can happen: learning starts once the replay holds {learning_starts} \
             transitions (learning_starts, at least batch_size), but a window collects at most \
             {collected} (envs x max_steps_per_epoch x epochs) into a replay of {}; the agent \
             stays as initialized",
            job.cfg.dqn.replay_capacity
        );
    }
    let owned: Vec<&Window> = plan
        .windows
        .iter()
        .filter(|w| opts.shard.is_none_or(|s| s.owns(w.index)))
        .collect();
    if let Some(s) = opts.shard {
        let list: Vec<String> = owned.iter().map(|w| w.index.to_string()).collect();
        tracing::info!(
            "shard {s} owns {} of the plan's {} windows: {}",
            owned.len(),
            plan.windows.len(),
            if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            }
        );
    }
    let t_open = Instant::now();
    let slots = open_workers(job.cfg.device, &opts.devices, opts.workers_per_device)?;
    let device_open_ms = t_open.elapsed().as_secs_f64() * 1e3;
    if slots.len() > 1 && opts.stop_after_epochs.is_some() {
        return Err(TrainError::Options(format!(
            "--stop-after-epochs counts the epochs of one worker; it cannot go with {} workers",
            slots.len()
        )));
    }
    // Each worker holds its own agent, replay and environments.
    crate::budget::check(
        job.cfg,
        job.dataset.features.cols,
        slots.len(),
        crate::budget::available_memory(),
    )?;
    let resolved = match slots.first() {
        Some(Some(_)) => Resolved::Cuda,
        _ => Resolved::Cpu,
    };
    let out = &opts.out;
    let config = serde_json::json!({
        "source": job.source,
        "windows": job.windows,
        "train": job.cfg,
        "spec": job.spec,
    });
    // Unsharded, the run directory is this process's for its whole life; a shard shares it
    // with the others and locks only the windows it trains.
    let _lock = match opts.shard {
        None => Some(crate::rundir::prepare(out, &config, &plan, opts.resume)?),
        Some(s) => {
            crate::rundir::prepare_shared(out, &config, &plan, s)?;
            None
        }
    };
    let exec = Execution::new(job.spec, job.cfg.costs);
    let bars = Bars::new(opts.progress, owned.len(), job.cfg.epochs);
    for s in &plan.skipped {
        tracing::warn!("window {} skipped: {}", s.window.index, s.reason);
    }
    let ctx = RunCtx {
        job,
        opts,
        exec,
        bars: &bars,
    };
    let trained = ctx.train_windows(&owned, &slots);
    bars.finish();
    let (done, pool) = trained?;
    #[cfg(feature = "cuda")]
    // A device's workers share its context: one line per device.
    for ctx in slots.iter().flatten().step_by(opts.workers_per_device) {
        let k = ctx.compile_stats();
        tracing::info!(
            "kernel modules: {} compiled, {} from the kernel cache, {} damaged entries rebuilt",
            k.compiled,
            k.cached,
            k.rebuilt
        );
        for e in k.cache_errors {
            tracing::warn!("kernel cache not written (the next run compiles again): {e}");
        }
    }
    let device_name = match resolved {
        Resolved::Cpu => "cpu",
        Resolved::Cuda => "cuda",
    };
    let report = assemble(
        &plan,
        done,
        job.cfg.capital,
        RunMeta {
            device: device_name.into(),
            device_open_ms,
            pool,
        },
    );
    match opts.shard {
        None => write_outputs(out, &report.report, &report.curves)?,
        // The shard that finds every window done writes the run's report (two finishing
        // together write the same bytes, atomically).
        Some(s) => match aggregate(out, job.cfg.capital) {
            Ok(_) => tracing::info!("shard {s}: every window of the run is done; report written"),
            Err(TrainError::Incomplete { missing, .. }) => tracing::info!(
                "shard {s} done; {} windows of other shards still missing; `foxhunt report {}` \
                 aggregates once they are done",
                missing.len(),
                out.display()
            ),
            Err(e) => return Err(e),
        },
    }
    Ok(report.report)
}

/// What every window of a run shares.
struct RunCtx<'a> {
    job: &'a Job<'a>,
    opts: &'a RunOptions,
    exec: Execution,
    bars: &'a Bars,
}

/// One worker's own memory: its host pool and its device's (a GPU context, or none).
struct Worker {
    pool: HostPool,
    device: DeviceRun,
}

impl Worker {
    fn new(gpu: &Option<Gpu>) -> Self {
        #[cfg(feature = "cuda")]
        let device = match gpu {
            Some(ctx) => DeviceRun::Gpu(crate::engine::device::GpuRun::new(ctx)),
            None => DeviceRun::Cpu,
        };
        #[cfg(not(feature = "cuda"))]
        let device = match gpu {
            Some(g) => match *g {},
            None => DeviceRun::Cpu,
        };
        Self {
            pool: HostPool::new(),
            device,
        }
    }
}

impl RunCtx<'_> {
    /// Trains `windows` (in order), one worker per slot taking the next window from a shared
    /// queue; each window's results are its own (seeded by the window), so they equal a
    /// one-worker run's whatever worker trains it. Returns the results in window order and the
    /// pools' bookkeeping, summed. The first error stops every worker after its window.
    fn train_windows(
        &self,
        windows: &[&Window],
        slots: &[Option<Gpu>],
    ) -> Result<(Vec<WindowResult>, foxhunt_memory::PoolStats), TrainError> {
        if let [gpu] = slots {
            let mut worker = Worker::new(gpu);
            let mut budget = self.opts.stop_after_epochs;
            let done = windows
                .iter()
                .map(|w| self.train_window(w, &mut worker, &mut budget))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok((done, worker.pool.stats()));
        }
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let results: Mutex<Vec<(usize, WindowResult)>> = Mutex::new(Vec::new());
        let error: Mutex<Option<TrainError>> = Mutex::new(None);
        let mut pool = foxhunt_memory::PoolStats::default();
        std::thread::scope(|scope| {
            let handles: Vec<_> = slots
                .iter()
                .map(|gpu| {
                    let (next, failed, results, error) = (&next, &failed, &results, &error);
                    scope.spawn(move || {
                        let mut worker = Worker::new(gpu);
                        let mut budget = None;
                        while !failed.load(Ordering::SeqCst) {
                            let i = next.fetch_add(1, Ordering::SeqCst);
                            let Some(w) = windows.get(i) else { break };
                            match self.train_window(w, &mut worker, &mut budget) {
                                Ok(r) => results.lock().expect("no worker panics").push((i, r)),
                                Err(e) => {
                                    failed.store(true, Ordering::SeqCst);
                                    error.lock().expect("no worker panics").get_or_insert(e);
                                }
                            }
                        }
                        worker.pool.stats()
                    })
                })
                .collect();
            for h in handles {
                pool.add(&h.join().expect("a worker does not panic"));
            }
        });
        if let Some(e) = error.into_inner().expect("no worker panics") {
            return Err(e);
        }
        let mut done = results.into_inner().expect("no worker panics");
        done.sort_by_key(|(i, _)| *i);
        Ok((done.into_iter().map(|(_, r)| r).collect(), pool))
    }

    /// One window: read back when a resumed run finished it, else trained (or continued) on
    /// `worker`, its results written to its folder. `budget` counts the epochs left of
    /// `--stop-after-epochs` (`Err(Stopped)` when it ends).
    fn train_window(
        &self,
        w: &Window,
        worker: &mut Worker,
        budget: &mut Option<usize>,
    ) -> Result<WindowResult, TrainError> {
        let (job, opts, out) = (self.job, self.opts, &self.opts.out);
        let stopped = || TrainError::Stopped {
            epochs: opts.stop_after_epochs.unwrap_or(0),
        };
        let dir = WindowDir::new(out, w.index);
        if opts.resume && dir.report().exists() {
            tracing::info!("window {} already finished: read back", w.index);
            self.bars.window_done();
            return read_window(&dir);
        }
        if *budget == Some(0) {
            // The epochs asked for ended with the previous window: stop before this one.
            return Err(stopped());
        }
        let _window_lock = dir.lock()?;
        if !opts.resume && dir.has_state() {
            return Err(TrainError::Options(format!(
                "window {} in {} has results or state from an earlier run of this shard; \
                 continue with --resume",
                w.index,
                out.display()
            )));
        }
        tracing::info!(
            "window {}: train {}..{} ({} bars), validation {}..{}, test {}..{}",
            w.index,
            w.train.start,
            w.train.end,
            w.train.rows.len(),
            w.val.start,
            w.val.end,
            w.test.start,
            w.test.end
        );
        let ctx = WindowCtx {
            job,
            w,
            exec: self.exec,
            dir: &dir,
            resume: opts.resume,
            bars: self.bars,
        };
        let (report, phases, curves) = match ctx.train(&mut worker.pool, &mut worker.device, budget)
        {
            Ok(o) => {
                write_json(&dir.curves(), &o.curves)?;
                (o.report, o.phases, Some(o.curves))
            }
            Err(f) => match *f {
                WindowFailure {
                    error: error @ TrainError::NonFinite { .. },
                    phases,
                    epochs,
                } => {
                    tracing::error!("{error}; going on with the next window");
                    (failed_report(w, error.to_string(), epochs), phases, None)
                }
                WindowFailure {
                    error: TrainError::Stopped { .. },
                    ..
                } => return Err(stopped()),
                WindowFailure { error, .. } => return Err(error),
            },
        };
        write_json(&dir.phases(), &phases)?;
        // Written last: its presence marks the window finished for --resume.
        write_json(&dir.report(), &report)?;
        self.bars.window_done();
        Ok(WindowResult {
            report,
            phases,
            curves,
        })
    }
}

/// One window's finished results, as trained or read back.
struct WindowResult {
    report: WindowReport,
    phases: Vec<PhaseTimes>,
    /// The test-period curves, for a window that finished.
    curves: Option<Vec<Curve>>,
}

/// Reads a finished window's results back from its folder (all checked).
fn read_window(dir: &WindowDir) -> Result<WindowResult, TrainError> {
    let report: WindowReport = read_json(&dir.report())?;
    let phases = read_json(&dir.phases())?;
    let curves = match report.status {
        WindowStatus::Ok => Some(read_json(&dir.curves())?),
        WindowStatus::Failed { .. } => None,
    };
    Ok(WindowResult {
        report,
        phases,
        curves,
    })
}

/// What a report says of the process that wrote it, beside the results.
struct RunMeta {
    device: String,
    device_open_ms: f64,
    pool: foxhunt_memory::PoolStats,
}

/// A run's report and the curves its outputs are drawn from.
struct Assembled {
    report: RunReport,
    curves: Vec<(usize, Vec<Curve>)>,
}

/// The run's report from its windows' results (in window order): one rule for a run that
/// trained every window and for the aggregation of shards, so that both give the same results.
fn assemble(
    plan: &foxhunt_data::walkforward::Plan,
    done: Vec<WindowResult>,
    capital: f64,
    meta: RunMeta,
) -> Assembled {
    let mut windows = Vec::with_capacity(done.len());
    let mut phases = Vec::new();
    let mut curves = Vec::new();
    for r in done {
        if let Some(c) = r.curves {
            curves.push((r.report.index, c));
        }
        phases.extend(r.phases);
        windows.push(r.report);
    }
    let report = RunReport {
        device: meta.device,
        device_open_ms: meta.device_open_ms,
        windows,
        skipped: plan
            .skipped
            .iter()
            .map(|s| Skipped {
                index: s.window.index,
                reason: s.reason.clone(),
            })
            .collect(),
        empty_windows: plan.empty,
        aggregate: aggregate_policies(&curves, capital),
        phases,
        pool: meta.pool,
    };
    Assembled { report, curves }
}

/// Aggregates the run in `out` from its windows' folders and writes its report (report.json,
/// equity, summary), as `foxhunt report` and the last shard to finish do. A window not yet
/// finished is an error listing every missing window and the shard that owns it.
pub fn aggregate(out: &Path, capital: f64) -> Result<RunReport, TrainError> {
    let plan: foxhunt_data::walkforward::Plan = read_json(&out.join(crate::rundir::PLAN_FILE))?;
    let mut missing = Vec::new();
    let mut done = Vec::new();
    for w in &plan.windows {
        let dir = WindowDir::new(out, w.index);
        if dir.report().exists() {
            done.push(read_window(&dir)?);
        } else {
            missing.push(w.index);
        }
    }
    if !missing.is_empty() {
        return Err(TrainError::Incomplete {
            dir: out.to_path_buf(),
            owners: crate::rundir::shard_counts(out),
            missing,
        });
    }
    let device = {
        let config: serde_json::Value = read_json(&out.join("config.json"))?;
        config["train"]["device"]
            .as_str()
            .unwrap_or("auto")
            .to_string()
    };
    let a = assemble(
        &plan,
        done,
        capital,
        RunMeta {
            device,
            device_open_ms: 0.0,
            pool: foxhunt_memory::PoolStats::default(),
        },
    );
    write_outputs(out, &a.report, &a.curves)?;
    Ok(a.report)
}

fn failed_report(w: &Window, error: String, epochs: Vec<EpochSummary>) -> WindowReport {
    WindowReport {
        index: w.index,
        train: w.train.clone(),
        val: w.val.clone(),
        test: w.test.clone(),
        status: WindowStatus::Failed { error },
        best_epoch: None,
        validation: None,
        test_results: Vec::new(),
        epochs,
    }
}

fn aggregate_policies(curves: &[(usize, Vec<Curve>)], capital: f64) -> Vec<PolicyResult> {
    let Some((_, first)) = curves.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|k| {
            let parts: Vec<&Curve> = curves.iter().map(|(_, c)| &c[k]).collect();
            PolicyResult {
                policy: first[k].policy.clone(),
                metrics: report::aggregate(&parts, capital),
            }
        })
        .collect()
}

fn write_outputs(
    out: &Path,
    report: &RunReport,
    curves: &[(usize, Vec<Curve>)],
) -> Result<(), TrainError> {
    write_json(&out.join("report.json"), report)?;
    foxhunt_fs::write_atomic(
        &out.join("equity.csv"),
        report::equity_csv(curves).as_bytes(),
    )?;
    if !curves.is_empty() {
        crate::charts::Chart::Lines(crate::html::equity_chart(curves))
            .png(&out.join("equity.png"), crate::html::EQUITY_SIZE)?;
    }
    crate::html::write(out, report, curves)?;
    Ok(foxhunt_fs::write_atomic(
        &out.join("summary.txt"),
        report::summary(report).as_bytes(),
    )?)
}

/// Writes report.html of the finished run in `out` from its report.json and its windows'
/// curves (`foxhunt report --html`), and returns its path.
pub fn write_html(out: &Path) -> Result<std::path::PathBuf, TrainError> {
    let report: RunReport = read_json(&out.join("report.json"))?;
    let mut curves = Vec::new();
    for w in &report.windows {
        if w.status == WindowStatus::Ok {
            curves.push((w.index, read_json(&WindowDir::new(out, w.index).curves())?));
        }
    }
    crate::html::write(out, &report, &curves)?;
    Ok(out.join(crate::html::FILE))
}

struct WindowCtx<'a> {
    job: &'a Job<'a>,
    w: &'a Window,
    exec: Execution,
    dir: &'a WindowDir,
    resume: bool,
    bars: &'a Bars,
}

struct WindowOutcome {
    report: WindowReport,
    curves: Vec<Curve>,
    phases: Vec<PhaseTimes>,
}

struct WindowFailure {
    error: TrainError,
    phases: Vec<PhaseTimes>,
    epochs: Vec<EpochSummary>,
}

impl From<TrainError> for Box<WindowFailure> {
    fn from(error: TrainError) -> Self {
        Box::new(WindowFailure {
            error,
            phases: Vec::new(),
            epochs: Vec::new(),
        })
    }
}

fn fail(error: TrainError, prog: &Progress) -> Box<WindowFailure> {
    Box::new(WindowFailure {
        error,
        phases: prog.phases.clone(),
        epochs: prog.epochs.clone(),
    })
}

fn rel(r: &Range<usize>, base: usize) -> Range<usize> {
    r.start - base..r.end - base
}

/// The window's three splits as rows of its arena.
struct Splits {
    train: Range<usize>,
    val: Range<usize>,
    test: Range<usize>,
}

/// Where a window starts: its agent and host replay (fresh, or read back on resume), the
/// progress so far and the best epoch's agent so far.
struct Start<B: burn::tensor::backend::AutodiffBackend> {
    agent: DqnAgent<B>,
    replay: Option<Replay>,
    prog: Progress,
    best: Option<Best>,
}

/// The epoch that scored best on validation so far, its agent kept in memory; its checkpoint
/// is written outside the timed epochs (with resumable state, and when the window ends).
struct Best {
    epoch: usize,
    agent: Snapshot,
    /// Whether `best-epoch-E.ckpt` holds it already.
    written: bool,
}

impl WindowCtx<'_> {
    /// Trains the window on the device the run has, with the engine that device calls for.
    fn train(
        &self,
        pool: &mut HostPool,
        device: &mut DeviceRun,
        budget: &mut Option<usize>,
    ) -> Result<WindowOutcome, Box<WindowFailure>> {
        let (cfg, w) = (self.job.cfg, self.w);
        let t_init = Instant::now();
        self.dir.create()?;
        let m = &self.job.dataset.features;
        let rows = w.train.rows.start..w.test.rows.end;
        let base = rows.start;
        let norm = Normalizer::fit(m, w.train.rows.clone());
        let data = WindowData {
            market: MarketData::from_features(m, rows, Some(&norm)).map_err(TrainError::from)?,
            exec: self.exec,
        };
        let arena = pool.window(&data);
        let splits = Splits {
            train: rel(&w.train.rows, base),
            val: rel(&w.val.rows, base),
            test: rel(&w.test.rows, base),
        };
        let host = |market| HostSetup {
            market,
            exec: self.exec,
            env: cfg.env.clone(),
            envs: cfg.envs,
            split: splits.train.clone(),
            explore_seed: cfg.seed,
        };
        match device {
            DeviceRun::Cpu => {
                let s = self.start::<CpuBackend>(&Default::default(), true)?;
                let replay = s.replay.expect("a host replay was asked for");
                let engine = HostEngine::new(host(arena.market()), s.agent, replay);
                self.epochs(engine, s.prog, s.best, &arena, &splits, t_init, budget)
            }
            // Prioritized replay keeps its sum tree on the host: the agent trains on
            // burn-cuda with host collection.
            #[cfg(feature = "cuda")]
            DeviceRun::Gpu(_) if cfg.dqn.prioritized.is_some() => {
                let s = self.start::<foxhunt_dqn::CudaBackend>(&Default::default(), true)?;
                let replay = s.replay.expect("a host replay was asked for");
                let engine = HostEngine::new(host(arena.market()), s.agent, replay);
                self.epochs(engine, s.prog, s.best, &arena, &splits, t_init, budget)
            }
            #[cfg(feature = "cuda")]
            DeviceRun::Gpu(g) => {
                let start = self.start::<CpuBackend>(&Default::default(), false)?;
                let gpu_arena = g.pool.window(&data).map_err(TrainError::from)?;
                let prog = start.prog;
                let engine = crate::engine::device::DeviceEngine::new(
                    &gpu_arena,
                    start.agent,
                    &cfg.env,
                    splits.train.clone(),
                    cfg.envs,
                    cfg.seed,
                    cfg.max_steps_per_epoch,
                    arena.market().session(),
                    cfg.step_loop,
                )
                .map_err(|e| fail(e, &prog))?;
                self.epochs(engine, prog, start.best, &arena, &splits, t_init, budget)
            }
            #[cfg(not(feature = "cuda"))]
            DeviceRun::Gpu(g) => match *g {},
        }
    }

    /// The window's starting point: a fresh agent, or on `--resume` the state the window's
    /// progress names. `host_replay`: whether the engine keeps its replay on the host (and so
    /// saved it with its checkpoints).
    fn start<B: burn::tensor::backend::AutodiffBackend>(
        &self,
        device: &B::Device,
        host_replay: bool,
    ) -> Result<Start<B>, TrainError> {
        let dqn = self
            .job
            .cfg
            .agent_config(self.job.dataset.features.cols, self.w.index);
        let progress = self.dir.progress();
        if self.resume && progress.exists() {
            let prog: Progress = read_json(&progress)?;
            let (ckpt, rpl) = self.dir.state_files(prog.epochs_done - 1);
            let agent = checkpoint::load::<B>(&ckpt, &dqn, device)?;
            let replay = if host_replay {
                let bytes = foxhunt_fs::read_sealed(&rpl)?;
                Some(Replay::from_bytes(
                    &bytes,
                    dqn.replay_capacity,
                    dqn.prioritized,
                )?)
            } else {
                None
            };
            // The best epoch's checkpoint was written with the state that names it.
            let best = match prog.best_epoch {
                Some(e) => Some(Best {
                    epoch: e,
                    agent: checkpoint::load::<B>(&self.dir.best(e), &dqn, device)?.snapshot(),
                    written: true,
                }),
                None => None,
            };
            tracing::info!(
                "window {}: resuming after epoch {}",
                self.w.index,
                prog.epochs_done - 1
            );
            return Ok(Start {
                agent,
                replay,
                prog,
                best,
            });
        }
        let replay =
            host_replay.then(|| Replay::new(dqn.replay_capacity, dqn.seed, dqn.prioritized));
        Ok(Start {
            agent: DqnAgent::<B>::new(dqn, device)?,
            replay,
            prog: Progress::default(),
            best: None,
        })
    }

    /// The window's epochs on `engine`, then the test of the best one.
    #[allow(clippy::too_many_arguments)]
    fn epochs<E: Engine>(
        &self,
        mut engine: E,
        mut prog: Progress,
        mut best: Option<Best>,
        arena: &HostArena<'_>,
        splits: &Splits,
        t_init: Instant,
        budget: &mut Option<usize>,
    ) -> Result<WindowOutcome, Box<WindowFailure>> {
        let (cfg, w) = (self.job.cfg, self.w);
        let init_ms = t_init.elapsed().as_secs_f64() * 1e3;
        let uploaded = arena.uploaded_bytes() + engine.uploaded_bytes();
        let timing = engine.timing();
        let mut clock = PhaseClock::new(timing.sync, timing.marks);
        let learning_starts = cfg.learning_starts.max(cfg.dqn.batch_size);
        let data = EvalData {
            market: arena.market(),
            exec: &self.exec,
            env: &cfg.env,
        };
        let first_epoch = prog.epochs_done;
        self.bars.window_started(w.index, first_epoch);
        for epoch in first_epoch..cfg.epochs {
            clock.start_epoch();
            if epoch == first_epoch {
                clock.charge(Phase::Init, init_ms);
            }
            let _loan = clock.time(Phase::Init, || arena.epoch(epoch));
            engine
                .begin_epoch(epoch_seed(cfg.seed, w.index, epoch))
                .map_err(|e| fail(e, &prog))?;
            let plan = EpochPlan {
                window: w.index,
                epoch,
                steps: cfg.max_steps_per_epoch,
                learning_starts,
            };
            let stat_steps = engine
                .run_steps(&plan, &mut clock)
                .map_err(|e| fail(e, &prog))?;
            // The one read of the epoch's statistics, and the check that they are finite.
            let stats = engine.finish_epoch().map_err(|e| fail(e, &prog))?;
            crate::stats::check_finite(&stats, &stat_steps, w.index, epoch)
                .map_err(|e| fail(e, &prog))?;
            let val_report = clock
                .time(Phase::Eval, || -> Result<_, TrainError> {
                    let targets =
                        engine.greedy_targets(Judged::Current, &data, splits.val.clone())?;
                    let r = crate::eval::book(
                        &targets,
                        data.market,
                        &self.exec,
                        cfg,
                        splits.val.clone(),
                    )?;
                    if prog.best_val_pnl.is_none_or(|b| r.metrics.total_pnl > b) {
                        // Kept in memory; written outside the timed epoch.
                        best = Some(Best {
                            epoch,
                            agent: engine.snapshot()?,
                            written: false,
                        });
                        prog.best_val_pnl = Some(r.metrics.total_pnl);
                        prog.best_epoch = Some(epoch);
                        prog.best_validation = Some(r.metrics.clone());
                    }
                    Ok(r)
                })
                .map_err(|e| fail(e, &prog))?;
            let mut pt = clock.finish(w.index, epoch, cfg.max_steps_per_epoch, stat_steps.len());
            if epoch == first_epoch {
                pt.uploaded_bytes = uploaded;
            }
            tracing::info!("{pt}");
            let val_pnl = val_report.metrics.total_pnl;
            prog.epochs.push(crate::stats::summarize(
                epoch,
                &stats,
                engine.epsilon(),
                val_pnl,
            ));
            prog.phases.push(pt);
            prog.epochs_done = epoch + 1;
            self.bars.epoch_done(val_pnl);
            if let Some(b) = budget.as_mut() {
                *b = b.saturating_sub(1);
            }
            let stop = *budget == Some(0) && epoch + 1 < cfg.epochs;
            let due = cfg.checkpoint_every > 0 && (epoch + 1) % cfg.checkpoint_every == 0;
            if stop || (due && epoch + 1 < cfg.epochs) {
                // The best checkpoint first: the progress written after it names it.
                self.write_best(&mut engine, best.as_mut())
                    .and_then(|()| {
                        let replay = engine.replay_bytes();
                        self.dir.save_progress(engine.agent()?, replay, &prog)
                    })
                    .map_err(|e| fail(e, &prog))?;
            }
            if stop {
                return Err(fail(TrainError::Stopped { epochs: 0 }, &prog));
            }
        }
        // The best epoch's agent, judged once on the test split beside the baselines.
        let mut best = best.expect("at least one epoch ran");
        let tested = (|| -> Result<_, TrainError> {
            let targets =
                engine.greedy_targets(Judged::Kept(&best.agent), &data, splits.test.clone())?;
            let tested = crate::eval::test_with_baselines(
                &targets,
                data.market,
                &self.exec,
                cfg,
                splits.test.clone(),
            )?;
            self.write_best(&mut engine, Some(&mut best))?;
            Ok(tested)
        })()
        .map_err(|e| fail(e, &prog))?;
        let best = best.epoch;
        let report = WindowReport {
            index: w.index,
            train: w.train.clone(),
            val: w.val.clone(),
            test: w.test.clone(),
            status: WindowStatus::Ok,
            best_epoch: Some(best),
            validation: prog.best_validation.clone(),
            test_results: tested
                .iter()
                .map(|r| PolicyResult {
                    policy: r.policy.clone(),
                    metrics: r.metrics.clone(),
                })
                .collect(),
            epochs: prog.epochs.clone(),
        };
        let curves = tested
            .iter()
            .map(|r| Curve::from_backtest(&r.policy, r))
            .collect();
        self.dir.finish(best, cfg.epochs);
        Ok(WindowOutcome {
            report,
            curves,
            phases: prog.phases,
        })
    }
}

impl WindowCtx<'_> {
    /// Writes the best epoch's checkpoint (`best-epoch-E.ckpt`) unless it is written already.
    fn write_best<E: Engine>(
        &self,
        engine: &mut E,
        best: Option<&mut Best>,
    ) -> Result<(), TrainError> {
        let Some(b) = best.filter(|b| !b.written) else {
            return Ok(());
        };
        let a = engine.agent()?;
        let agent = DqnAgent::<E::B>::restore(a.config().clone(), a.device(), &b.agent)?;
        self.dir.create()?;
        checkpoint::save(&agent, &self.dir.best(b.epoch))?;
        b.written = true;
        Ok(())
    }
}

fn epoch_seed(seed: u64, window: usize, epoch: usize) -> u64 {
    mix64(seed ^ mix64(((window as u64) << 32) | epoch as u64))
}
