//! The walk-forward loop: for each window build its arena (one copy), train epochs (collect,
//! train, sync, eval) with an engine, keep the checkpoint that scores best on validation, test
//! it once, and report all of it; write resumable state as it goes.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use foxhunt_data::{Dataset, Normalizer, WalkForwardConfig, Window};
use foxhunt_dqn::model::HostQNetwork;
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
use crate::population::{self, Member, MemberReport, PopulationReport, Vote};
use crate::progress::Bars;
use crate::report::{
    self, Curve, EpochSummary, PolicyResult, RunReport, Skipped, WindowReport, WindowStatus,
    read_json, write_json,
};
use crate::rundir::{Progress, StateWriter, WindowDir};

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
    let members = population::members(job.cfg)?;
    if members.len() > 1 {
        tracing::info!(
            "a population of {} agents per window ({} settings x {} seeds), selected on \
             validation by {:?}{}",
            members.len(),
            job.cfg.sweep.points(),
            job.cfg.agents,
            job.cfg.select,
            match job.cfg.ensemble {
                0 => String::new(),
                k => format!(", and the vote of the best {k} tested"),
            }
        );
    }
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
    let resolved = match slots.first() {
        Some(Some(_)) => Resolved::Cuda,
        _ => Resolved::Cpu,
    };
    // Each worker holds its own agent, replay and environments; a population's members train
    // on threads (one per core; on a GPU, where they meet, one each), so that many are held at
    // once (WindowCtx::population).
    let cols = job.dataset.features.cols;
    let heaviest = members
        .iter()
        .map(|m| &m.cfg)
        .max_by(|a, b| {
            let size = |c: &TrainConfig| {
                crate::budget::estimate(c, cols)
                    .iter()
                    .map(|p| p.1)
                    .sum::<f64>()
            };
            size(a).total_cmp(&size(b))
        })
        .expect("a population has a member");
    #[cfg(feature = "cuda")]
    // The largest split a window evaluates: what the device's evaluation holds.
    let eval_bars = owned
        .iter()
        .map(|w| w.val.rows.len().max(w.test.rows.len()))
        .max()
        .unwrap_or(0);
    let fits = |at_once: usize| -> Result<(), TrainError> {
        crate::budget::check(
            heaviest,
            cols,
            slots.len(),
            at_once,
            crate::budget::available_memory(),
        )?;
        #[cfg(feature = "cuda")]
        // A device's workers share its memory: one check per device.
        for ctx in slots.iter().flatten().step_by(opts.workers_per_device) {
            crate::budget::check_device(
                heaviest,
                cols,
                eval_bars,
                opts.workers_per_device * at_once,
                ctx.free_memory()? as f64,
            )?;
        }
        Ok(())
    };
    let mut at_once = member_threads(&members, resolved);
    if let Err(e) = fits(at_once) {
        // Members that would all meet do not fit at once: a core's worth at a time, apart.
        let apart = member_threads(&members, Resolved::Cpu);
        if apart >= at_once {
            return Err(e);
        }
        fits(apart)?;
        tracing::info!(
            "the population's {} members do not fit the memory at once ({e}); {apart} at a time, \
             each its own launches",
            members.len()
        );
        at_once = apart;
    }
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
    let epochs = members.iter().map(|m| m.cfg.epochs).sum();
    let bars = Bars::new(opts.progress, owned.len(), epochs);
    for s in &plan.skipped {
        tracing::warn!("window {} skipped: {}", s.window.index, s.reason);
    }
    let ctx = RunCtx {
        job,
        opts,
        exec,
        bars: &bars,
        members,
        member_threads: at_once,
    };
    let t_train = Instant::now();
    let trained = ctx.train_windows(&owned, &slots);
    let train_ms = t_train.elapsed().as_secs_f64() * 1e3;
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
            train_ms,
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
    /// The agents each window trains (one, or a population).
    members: Vec<Member>,
    /// The threads a window's population trains on ([`member_threads`], or fewer where that
    /// many members do not fit the memory at once).
    member_threads: usize,
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
            members: &self.members,
            member_threads: self.member_threads,
            member: false,
        };
        let (report, phases, curves) = match ctx.train(&mut worker.pool, &mut worker.device, budget)
        {
            Ok(o) => {
                if let Some(c) = &o.curves {
                    write_json(&dir.curves(), c)?;
                }
                (o.report, o.phases, o.curves)
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
    train_ms: f64,
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
        train_ms: meta.train_ms,
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
            train_ms: 0.0,
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
        population: None,
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
    /// The agents the window trains (one: a standalone run).
    members: &'a [Member],
    /// The threads a population trains on.
    member_threads: usize,
    /// Whether this context trains one member of a population (in the member's folder).
    member: bool,
}

struct WindowOutcome {
    report: WindowReport,
    /// The test-period curves (none when every member of a population failed).
    curves: Option<Vec<Curve>>,
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

/// An agent's trained window: its progress (epochs, best validation), the best epoch's agent,
/// and, when it was asked for, that agent's test beside the baselines.
struct Trained {
    prog: Progress,
    best: Best,
    tested: Option<Vec<foxhunt_env::BacktestReport>>,
}

/// Where a window's agents train: the CPU, or a GPU: the window resident in a device arena
/// (made once per window, when an agent needs the device engine) and the context whose stream
/// an agent's work is queued on (the arena's, or a worker's for members side by side).
enum Place<'a, 'g> {
    Cpu,
    #[cfg(feature = "cuda")]
    Gpu {
        arena: Option<&'a foxhunt_memory::GpuArena<'g>>,
        ctx: Gpu,
        /// For a member of a population: where its one-launch epochs (and its validations)
        /// meet the others'.
        meeting: Option<&'a foxhunt_memory::EpochMeeting<'a>>,
    },
    #[cfg(not(feature = "cuda"))]
    #[allow(dead_code)]
    Gpu(std::marker::PhantomData<(&'a (), &'g ())>),
}

/// A member of a population after the window: its report line, the phases of its epochs and
/// its best epoch's agent (none when it failed).
struct MemberDone {
    report: MemberReport,
    phases: Vec<PhaseTimes>,
    best: Option<Snapshot>,
}

/// A member's outcome and the epochs of `--stop-after-epochs` it left.
type MemberRun = Result<(MemberDone, Option<usize>), TrainError>;

/// A finished member's file in its folder (its `report.json`), read back by `--resume`.
#[derive(serde::Serialize, serde::Deserialize)]
struct MemberFile {
    report: MemberReport,
    phases: Vec<PhaseTimes>,
}

impl WindowCtx<'_> {
    /// Trains the window on the device the run has, with the engine that device calls for:
    /// one agent, or every member of the population on the one arena.
    fn train(
        &self,
        pool: &mut HostPool,
        device: &mut DeviceRun,
        budget: &mut Option<usize>,
    ) -> Result<WindowOutcome, Box<WindowFailure>> {
        let w = self.w;
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
        #[cfg(feature = "cuda")]
        let (gpu_ctx, gpu_arena) = match device {
            DeviceRun::Cpu => (None, None),
            DeviceRun::Gpu(g) => {
                let ctx = g.pool.context().clone();
                // Prioritized replay keeps its sum tree on the host (burn-cuda, host
                // collection): no device arena for it.
                let needed = self.members.iter().any(|m| m.cfg.dqn.prioritized.is_none());
                let arena = match needed {
                    true => Some(g.pool.window(&data).map_err(TrainError::from)?),
                    false => None,
                };
                (Some(ctx), arena)
            }
        };
        #[cfg(feature = "cuda")]
        let place = match gpu_ctx {
            Some(ctx) => Place::Gpu {
                arena: gpu_arena.as_ref(),
                ctx,
                meeting: None,
            },
            None => Place::Cpu,
        };
        #[cfg(not(feature = "cuda"))]
        let place = match device {
            DeviceRun::Cpu => Place::Cpu,
            DeviceRun::Gpu(g) => match *g {},
        };
        if self.members.len() > 1 {
            return self.population(&place, &arena, &splits, t_init, budget);
        }
        let t = self.agent(&place, &arena, &splits, t_init, budget, true, true)?;
        let tested = t.tested.expect("the test was asked for");
        let report = WindowReport {
            index: w.index,
            train: w.train.clone(),
            val: w.val.clone(),
            test: w.test.clone(),
            status: WindowStatus::Ok,
            best_epoch: Some(t.best.epoch),
            validation: t.prog.best_validation.clone(),
            test_results: results_of(&tested),
            epochs: t.prog.epochs.clone(),
            population: None,
        };
        Ok(WindowOutcome {
            report,
            curves: Some(curves_of(&tested)),
            phases: t.prog.phases,
        })
    }

    /// One agent's epochs on the window (this context's settings and folder), on the engine
    /// `place` calls for; `test`: judge the best epoch on the test split too; `upload`:
    /// whether the arena's upload is charged to this agent's first epoch.
    #[allow(clippy::too_many_arguments)]
    fn agent(
        &self,
        place: &Place<'_, '_>,
        arena: &HostArena<'_>,
        splits: &Splits,
        t_init: Instant,
        budget: &mut Option<usize>,
        test: bool,
        upload: bool,
    ) -> Result<Trained, Box<WindowFailure>> {
        let cfg = self.job.cfg;
        let host = |market| HostSetup {
            market,
            exec: self.exec,
            env: cfg.env.clone(),
            envs: cfg.envs,
            split: splits.train.clone(),
            explore_seed: cfg.seed,
        };
        let run = Epochs {
            arena,
            splits,
            t_init,
            test,
            upload,
        };
        match place {
            Place::Cpu => {
                let s = self.start::<CpuBackend>(&Default::default(), true)?;
                let replay = s.replay.expect("a host replay was asked for");
                let engine = HostEngine::new(host(arena.market()), s.agent, replay);
                self.epochs(engine, s.prog, s.best, &run, budget)
            }
            #[cfg(feature = "cuda")]
            Place::Gpu { .. } if cfg.dqn.prioritized.is_some() => {
                let s = self.start::<foxhunt_dqn::CudaBackend>(&Default::default(), true)?;
                let replay = s.replay.expect("a host replay was asked for");
                let engine = HostEngine::new(host(arena.market()), s.agent, replay);
                self.epochs(engine, s.prog, s.best, &run, budget)
            }
            #[cfg(feature = "cuda")]
            Place::Gpu {
                arena: on_device,
                ctx,
                meeting,
            } => {
                let gpu_arena = on_device
                    .expect("a device arena is made when an agent needs the device engine");
                let start = self.start::<CpuBackend>(&Default::default(), false)?;
                let prog = start.prog;
                let engine = crate::engine::device::DeviceEngine::new(
                    gpu_arena,
                    ctx,
                    start.agent,
                    &cfg.env,
                    splits.train.clone(),
                    cfg.envs,
                    cfg.seed,
                    cfg.max_steps_per_epoch,
                    arena.market().session(),
                    cfg.step_loop,
                    *meeting,
                )
                .map_err(|e| fail(e, &prog))?;
                self.epochs(engine, prog, start.best, &run, budget)
            }
            #[cfg(not(feature = "cuda"))]
            Place::Gpu(_) => unreachable!("no GPU place without CUDA"),
        }
    }

    /// Every member of the population on the window's one arena (on threads, one per core;
    /// on a GPU each thread queues on a stream of its own), each in its own folder; the best
    /// on validation is tested once, and the vote of the best `ensemble` beside it. A member whose statistics stop being
    /// finite fails alone. `budget` (`--stop-after-epochs`) counts each member's epochs.
    fn population(
        &self,
        place: &Place<'_, '_>,
        arena: &HostArena<'_>,
        splits: &Splits,
        t_init: Instant,
        budget: &mut Option<usize>,
    ) -> Result<WindowOutcome, Box<WindowFailure>> {
        let (cfg, w) = (self.job.cfg, self.w);
        self.bars.window_started(w.index, 0);
        let start_budget = *budget;
        let threads = self.member_threads;
        let mut done: Vec<Option<MemberRun>> = (0..self.members.len()).map(|_| None).collect();
        if threads <= 1 {
            for (k, m) in self.members.iter().enumerate() {
                let mut b = start_budget;
                let t0 = if k == 0 { t_init } else { Instant::now() };
                done[k] = Some(
                    self.member_run(m, place, arena, splits, t0, &mut b, k == 0)
                        .map(|d| (d, b)),
                );
            }
        } else {
            use std::sync::Mutex;
            use std::sync::atomic::{AtomicUsize, Ordering};
            let next = AtomicUsize::new(0);
            let slots = Mutex::new(&mut done);
            // On a GPU, members that each have a thread meet at every one-launch epoch, so that
            // the epochs of all of them are one launch, and at every validation, judged together
            // in one evaluation (where the device decides exactly: the window's environment).
            // With fewer threads than members they train apart, each its own launches: a
            // meeting needs every member on a thread of its own ([`member_threads`] gives one
            // each where they can meet and fit).
            #[cfg(feature = "cuda")]
            let meets = threads == self.members.len();
            #[cfg(feature = "cuda")]
            let meeting = match place {
                Place::Gpu {
                    arena: Some(on_device),
                    ctx,
                    ..
                } if meets && foxhunt_memory::unsupported_env(&cfg.env).is_none() => {
                    foxhunt_memory::EpochMeeting::with_evaluator(
                        foxhunt_memory::DeviceEvaluator::new(
                            on_device.on(ctx),
                            &cfg.env,
                            arena.market().session(),
                        )
                        .map_err(TrainError::from)?,
                    )
                }
                _ => foxhunt_memory::EpochMeeting::new(),
            };
            #[cfg(feature = "cuda")]
            let meet = meets.then_some(&meeting);
            // A place per thread: on a GPU a worker's stream each, the window's arena shared.
            let places: Vec<Place<'_, '_>> = (0..threads)
                .map(|_| -> Result<_, TrainError> {
                    Ok(match place {
                        Place::Cpu => Place::Cpu,
                        #[cfg(feature = "cuda")]
                        Place::Gpu { arena, ctx, .. } => Place::Gpu {
                            arena: *arena,
                            ctx: ctx.worker()?,
                            meeting: meet,
                        },
                        #[cfg(not(feature = "cuda"))]
                        Place::Gpu(_) => unreachable!("no GPU place without CUDA"),
                    })
                })
                .collect::<Result<_, _>>()?;
            // The window's upload is done before any worker's stream reads it (GpuArena::on).
            #[cfg(feature = "cuda")]
            if let Place::Gpu { ctx, .. } = place {
                ctx.synchronize().map_err(TrainError::from)?;
            }
            std::thread::scope(|scope| {
                for place in places {
                    let (next, slots) = (&next, &slots);
                    scope.spawn(move || {
                        loop {
                            let k = next.fetch_add(1, Ordering::SeqCst);
                            let Some(m) = self.members.get(k) else { break };
                            let mut b = start_budget;
                            let t0 = if k == 0 { t_init } else { Instant::now() };
                            let r = self
                                .member_run(m, &place, arena, splits, t0, &mut b, k == 0)
                                .map(|d| (d, b));
                            slots.lock().expect("no member panics")[k] = Some(r);
                        }
                        // The worker's work ends before the window's arena goes back to the
                        // pool (each member's last read waits for it already).
                        #[cfg(feature = "cuda")]
                        if let Place::Gpu { ctx, .. } = &place {
                            let _ = ctx.synchronize();
                        }
                    });
                }
            });
            #[cfg(feature = "cuda")]
            {
                let what = format!("window {}: the members'", w.index);
                log_rounds(
                    &what,
                    "one-launch epochs",
                    "launches",
                    "members",
                    &meeting.rounds(),
                );
                log_rounds(
                    &what,
                    "validations",
                    "evaluations",
                    "networks",
                    &meeting.judge_rounds(),
                );
            }
        }
        let mut members = Vec::with_capacity(done.len());
        let mut stopped = false;
        let mut left = start_budget;
        for r in done {
            match r.expect("every member ran") {
                Ok((d, b)) => {
                    left = match (left, b) {
                        (Some(l), Some(b)) => Some(l.min(b)),
                        _ => left,
                    };
                    members.push(d);
                }
                Err(TrainError::Stopped { .. }) => stopped = true,
                Err(e) => return Err(e.into()),
            }
        }
        if stopped {
            return Err(TrainError::Stopped { epochs: 0 }.into());
        }
        *budget = left;
        let phases: Vec<PhaseTimes> = members.iter().flat_map(|d| d.phases.clone()).collect();
        let reports: Vec<MemberReport> = members.iter().map(|d| d.report.clone()).collect();
        let ranked = population::ranked(&reports, cfg.select);
        let Some(&sel) = ranked.first() else {
            let why: Vec<String> = reports
                .iter()
                .filter_map(|m| match &m.status {
                    WindowStatus::Failed { error } => Some(error.clone()),
                    WindowStatus::Ok => None,
                })
                .collect();
            let mut report = failed_report(
                w,
                format!("every agent of the population failed: {}", why.join("; ")),
                Vec::new(),
            );
            report.population = Some(PopulationReport {
                select: cfg.select,
                selected: 0,
                ensemble: Vec::new(),
                members: reports,
            });
            tracing::error!("window {}: every agent of the population failed", w.index);
            return Ok(WindowOutcome {
                report,
                curves: None,
                phases,
            });
        };
        let cols = self.job.dataset.features.cols;
        let net = |k: usize| {
            let m = &self.members[k];
            let snapshot = members[k]
                .best
                .as_ref()
                .expect("a finished member has its best");
            HostQNetwork::from_flat(&m.cfg.agent_config(cols, w.index), &snapshot.state.online)
        };
        let chosen = &self.members[sel];
        tracing::info!(
            "window {}: agent {sel} ({}, seed {}) is best on validation by {:?}",
            w.index,
            population::describe(&chosen.settings),
            chosen.cfg.seed,
            cfg.select
        );
        let market = arena.market();
        let tested = (|| -> Result<_, TrainError> {
            let targets = crate::eval::host_targets(
                &net(sel),
                market,
                &self.exec,
                &chosen.cfg.env,
                splits.test.clone(),
            );
            let mut tested = crate::eval::test_with_baselines(
                &targets,
                market,
                &self.exec,
                &chosen.cfg,
                splits.test.clone(),
            )?;
            let vote: Vec<usize> = ranked.iter().copied().take(cfg.ensemble).collect();
            if !vote.is_empty() {
                let mut policy = Vote::new(vote.iter().map(|&k| net(k)).collect(), &cfg.env);
                let r = foxhunt_env::backtest(
                    market,
                    &self.exec,
                    &cfg.env,
                    splits.test.clone(),
                    cfg.capital,
                    &mut policy,
                )?;
                tested.insert(1, r);
            }
            Ok((tested, vote))
        })();
        let (tested, vote) = tested?;
        let report = WindowReport {
            index: w.index,
            train: w.train.clone(),
            val: w.val.clone(),
            test: w.test.clone(),
            status: WindowStatus::Ok,
            best_epoch: reports[sel].best_epoch,
            validation: reports[sel].validation.clone(),
            test_results: results_of(&tested),
            epochs: reports[sel].epochs.clone(),
            population: Some(PopulationReport {
                select: cfg.select,
                selected: sel,
                ensemble: vote,
                members: reports,
            }),
        };
        Ok(WindowOutcome {
            report,
            curves: Some(curves_of(&tested)),
            phases,
        })
    }

    /// One member of the population: read back when a resumed run finished it, else trained
    /// (or continued) in its folder and its file written. `Err(Stopped)` when `budget` ended
    /// inside its epochs (state written).
    #[allow(clippy::too_many_arguments)]
    fn member_run(
        &self,
        m: &Member,
        place: &Place<'_, '_>,
        arena: &HostArena<'_>,
        splits: &Splits,
        t_init: Instant,
        budget: &mut Option<usize>,
        upload: bool,
    ) -> Result<MemberDone, TrainError> {
        let dir = self.dir.member(m.index);
        let agent_cfg = m
            .cfg
            .agent_config(self.job.dataset.features.cols, self.w.index);
        if self.resume && dir.report().exists() {
            let f: MemberFile = read_json(&dir.report())?;
            let best = match f.report.best_epoch {
                Some(e) => Some(checkpoint::load_snapshot(&dir.best(e), &agent_cfg)?),
                None => None,
            };
            return Ok(MemberDone {
                report: f.report,
                phases: f.phases,
                best,
            });
        }
        let job = Job {
            dataset: self.job.dataset,
            spec: self.job.spec,
            windows: self.job.windows,
            cfg: &m.cfg,
            source: serde_json::Value::Null,
        };
        let ctx = WindowCtx {
            job: &job,
            dir: &dir,
            member: true,
            ..*self
        };
        let line = |status, prog: &Progress| MemberReport {
            index: m.index,
            seed: m.cfg.seed,
            settings: m.settings.clone(),
            status,
            best_epoch: prog.best_epoch,
            validation: prog.best_validation.clone(),
            epochs: prog.epochs.clone(),
        };
        let done = match ctx.agent(place, arena, splits, t_init, budget, false, upload) {
            Ok(t) => MemberDone {
                report: line(WindowStatus::Ok, &t.prog),
                phases: t.prog.phases,
                best: Some(t.best.agent),
            },
            Err(f) => match *f {
                WindowFailure {
                    error: error @ TrainError::NonFinite { .. },
                    phases,
                    epochs,
                } => {
                    let error = format!("agent {}: {error}", m.index);
                    tracing::error!("{error}; the rest of the population goes on");
                    let prog = Progress {
                        epochs,
                        ..Progress::default()
                    };
                    MemberDone {
                        report: line(WindowStatus::Failed { error }, &prog),
                        phases,
                        best: None,
                    }
                }
                f => return Err(f.error),
            },
        };
        dir.create()?;
        write_json(
            &dir.report(),
            &MemberFile {
                report: done.report.clone(),
                phases: done.phases.clone(),
            },
        )?;
        Ok(done)
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
                    agent: checkpoint::load_snapshot(&self.dir.best(e), &dqn)?,
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

    /// The window's epochs on `engine`, then (when asked) the test of the best one.
    fn epochs<E: Engine>(
        &self,
        mut engine: E,
        mut prog: Progress,
        mut best: Option<Best>,
        run: &Epochs<'_>,
        budget: &mut Option<usize>,
    ) -> Result<Trained, Box<WindowFailure>> {
        let (cfg, w) = (self.job.cfg, self.w);
        let (arena, splits) = (run.arena, run.splits);
        let init_ms = run.t_init.elapsed().as_secs_f64() * 1e3;
        let uploaded = match run.upload {
            true => arena.uploaded_bytes() + engine.uploaded_bytes(),
            false => 0,
        };
        let timing = engine.timing();
        let mut clock = PhaseClock::new(timing.sync, timing.marks);
        let learning_starts = cfg.learning_starts.max(cfg.dqn.batch_size);
        let data = EvalData {
            market: arena.market(),
            exec: &self.exec,
            env: &cfg.env,
        };
        let first_epoch = prog.epochs_done;
        // Checkpoints and progress are written beside the training, in order.
        let mut writer = StateWriter::new().map_err(|e| fail(e, &prog))?;
        if !self.member {
            self.bars.window_started(w.index, first_epoch);
        }
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
            let (val, improved) = clock
                .time(Phase::Eval, || -> Result<_, TrainError> {
                    let metrics =
                        engine.judge(Judged::Current, &data, splits.val.clone(), cfg.capital)?;
                    let score = cfg.select.score(&metrics);
                    let improved = prog.best_score.is_none_or(|b| score > b);
                    if improved {
                        prog.best_score = Some(score);
                        prog.best_epoch = Some(epoch);
                        prog.best_validation = Some(metrics.clone());
                    }
                    Ok((metrics, improved))
                })
                .map_err(|e| fail(e, &prog))?;
            let mut pt = clock.finish(w.index, epoch, cfg.max_steps_per_epoch, stat_steps.len());
            if epoch == first_epoch {
                pt.uploaded_bytes = uploaded;
            }
            tracing::info!("{pt}");
            let val_pnl = val.total_pnl;
            prog.epochs.push(crate::stats::summarize(
                epoch,
                &stats,
                engine.epsilon(),
                val_pnl,
            ));
            prog.phases.push(pt);
            prog.epochs_done = epoch + 1;
            self.bars.epoch_done(val_pnl);
            if improved {
                // Taken between epochs like the checkpoints (on a GPU a read of the device's
                // state), kept in memory and written outside the timed epoch.
                best = Some(Best {
                    epoch,
                    agent: engine.snapshot().map_err(|e| fail(e, &prog))?,
                    written: false,
                });
            }
            if let Some(b) = budget.as_mut() {
                *b = b.saturating_sub(1);
            }
            let stop = *budget == Some(0) && epoch + 1 < cfg.epochs;
            let due = cfg.checkpoint_every > 0 && (epoch + 1) % cfg.checkpoint_every == 0;
            if stop || (due && epoch + 1 < cfg.epochs) {
                // The best checkpoint first: the progress written after it names it.
                self.write_best(&engine, best.as_mut(), &mut writer)
                    .and_then(|()| {
                        // An agent that improved this epoch was read for the best a moment ago
                        // and nothing has run since: the same state, not read again (on a GPU,
                        // four synchronous downloads).
                        let state = match best.as_ref().filter(|b| b.epoch == epoch) {
                            Some(b) => b.agent.clone(),
                            None => engine.snapshot()?,
                        };
                        let replay = engine.replay_bytes();
                        let cfg = engine.agent_config();
                        writer.submit(self.dir.save_progress(cfg, state, replay, &prog)?)
                    })
                    .map_err(|e| fail(e, &prog))?;
            }
            if stop {
                writer.finish().map_err(|e| fail(e, &prog))?;
                return Err(fail(TrainError::Stopped { epochs: 0 }, &prog));
            }
        }
        // The best epoch's agent, judged once on the test split beside the baselines.
        let mut best = best.expect("at least one epoch ran");
        let tested = (|| -> Result<_, TrainError> {
            let tested = match run.test {
                true => {
                    let targets = engine.greedy_targets(
                        Judged::Kept(&best.agent),
                        &data,
                        splits.test.clone(),
                    )?;
                    Some(crate::eval::test_with_baselines(
                        &targets,
                        data.market,
                        &self.exec,
                        cfg,
                        splits.test.clone(),
                    )?)
                }
                false => None,
            };
            self.write_best(&engine, Some(&mut best), &mut writer)?;
            writer.finish()?;
            Ok(tested)
        })()
        .map_err(|e| fail(e, &prog))?;
        self.dir.finish(best.epoch, cfg.epochs);
        Ok(Trained { prog, best, tested })
    }
}

/// What [`WindowCtx::epochs`] runs over: the window's arena and splits, when the agent's init
/// began, whether to test and whether the upload is this agent's.
struct Epochs<'a> {
    arena: &'a HostArena<'a>,
    splits: &'a Splits,
    t_init: Instant,
    test: bool,
    upload: bool,
}

/// The test results of the reports `tested` (agent, vote, baselines).
fn results_of(tested: &[foxhunt_env::BacktestReport]) -> Vec<PolicyResult> {
    tested
        .iter()
        .map(|r| PolicyResult {
            policy: r.policy.clone(),
            metrics: r.metrics.clone(),
        })
        .collect()
}

/// Their test-period curves.
fn curves_of(tested: &[foxhunt_env::BacktestReport]) -> Vec<Curve> {
    tested
        .iter()
        .map(|r| Curve::from_backtest(&r.policy, r))
        .collect()
}
impl WindowCtx<'_> {
    /// Has `writer` write the best epoch's checkpoint (`best-epoch-E.ckpt`) unless it is
    /// written already.
    fn write_best<E: Engine>(
        &self,
        engine: &E,
        best: Option<&mut Best>,
        writer: &mut StateWriter,
    ) -> Result<(), TrainError> {
        let Some(b) = best.filter(|b| !b.written) else {
            return Ok(());
        };
        let job = self
            .dir
            .save_best(engine.agent_config(), b.agent.clone(), b.epoch);
        writer.submit(job)?;
        b.written = true;
        Ok(())
    }
}

/// Threads a window's population trains on: on a GPU, where every member's epochs can meet
/// (one-launch epochs, no prioritized replay), one per member up to [`MEET_AT_MOST`], so that
/// all meet; else one per core. `FOXHUNT_MEMBER_THREADS` sets the number (at most one per
/// member). On a GPU one when a member uses burn-cuda (prioritized replay), which is kept to one
/// thread. Measured on the H200 (docs/PERFORMANCE.md, 2026-12-03): 64 members meeting on 64
/// threads 100-109 ms a window-epoch, apart on 16 threads 129-133; 256 meeting 366, apart 464.
fn member_threads(members: &[Member], device: Resolved) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let asked = std::env::var(MEMBER_THREADS)
        .ok()
        .and_then(|v| match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                // Asked again where the members do not fit at once: said once.
                static SAID: std::sync::Once = std::sync::Once::new();
                let why = "is not a positive number of threads; using the default";
                SAID.call_once(|| tracing::warn!("{MEMBER_THREADS}={v:?} {why}"));
                None
            }
        });
    let meet = members.len() <= MEET_AT_MOST
        && members
            .iter()
            .all(|m| m.cfg.step_loop == crate::config::StepLoop::OneLaunch);
    match device {
        Resolved::Cuda if members.iter().any(|m| m.cfg.dqn.prioritized.is_some()) => 1,
        Resolved::Cuda if asked.is_none() && meet => members.len(),
        _ => asked.unwrap_or(cores).min(members.len()),
    }
}

/// The largest population whose members all meet by default (the largest measured).
const MEET_AT_MOST: usize = 256;

/// Logs how a window's meeting went: `rounds` (the members in each) of `what`.
#[cfg(feature = "cuda")]
fn log_rounds(whose: &str, what: &str, rounds_are: &str, members_are: &str, rounds: &[usize]) {
    if let (Some(lo), Some(hi)) = (rounds.iter().min(), rounds.iter().max()) {
        tracing::info!(
            "{whose} {what} met in {} {rounds_are} ({lo} to {hi} {members_are} each)",
            rounds.len()
        );
    }
}

/// The environment variable that sets a population's threads (more than the cores lets every
/// member of a larger GPU population meet the others).
const MEMBER_THREADS: &str = "FOXHUNT_MEMBER_THREADS";

fn epoch_seed(seed: u64, window: usize, epoch: usize) -> u64 {
    mix64(seed ^ mix64(((window as u64) << 32) | epoch as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StepLoop;

    fn population(agents: usize, edit: impl Fn(&mut TrainConfig)) -> Vec<Member> {
        let mut cfg = TrainConfig {
            agents,
            ..TrainConfig::default()
        };
        edit(&mut cfg);
        crate::population::members(&cfg).expect("a valid population")
    }

    #[test]
    fn members_that_can_meet_on_a_gpu_get_a_thread_each_and_others_a_core_each() {
        // The test runs without FOXHUNT_MEMBER_THREADS (CI's environment does not set it).
        if std::env::var_os(MEMBER_THREADS).is_some() {
            return;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let on_gpu = |m: &[Member]| member_threads(m, Resolved::Cuda);
        let on_cpu = |m: &[Member]| member_threads(m, Resolved::Cpu);
        let meeting = population(40, |_| {});
        assert_eq!(on_gpu(&meeting), 40, "one-launch members all meet");
        assert_eq!(on_cpu(&meeting), cores.min(40));
        let many = population(MEET_AT_MOST + 1, |_| {});
        assert_eq!(
            on_gpu(&many),
            cores.min(MEET_AT_MOST + 1),
            "too many to meet"
        );
        let eager = population(40, |c| c.step_loop = StepLoop::Eager);
        assert_eq!(on_gpu(&eager), cores.min(40), "eager members never meet");
        let prioritized = population(40, |c| {
            c.dqn.prioritized = Some(Default::default());
        });
        assert_eq!(on_gpu(&prioritized), 1, "burn-cuda is kept to one thread");
    }
}
