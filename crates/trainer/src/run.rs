//! The walk-forward loop: for each window build its arena (one copy), train epochs (collect,
//! train, sync, eval), keep the checkpoint that scores best on validation, test it once, and
//! report all of it; write resumable state as it goes.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use foxhunt_data::{Dataset, Normalizer, WalkForwardConfig, Window};
use foxhunt_dqn::model::QNetwork;
use foxhunt_dqn::replay::{NStep, Replay, StepEnd};
use foxhunt_dqn::{Batch, CpuBackend, DqnAgent, TrainStats, checkpoint};
use foxhunt_env::backtest::Decision;
use foxhunt_env::vec_env::{done, mix64};
use foxhunt_env::{
    Baseline, ContractSpec, EnvConfig, Execution, MarketData, Policy, VecEnv, backtest,
};
use foxhunt_memory::{GpuContext, HostPool, WindowData};
use serde::{Deserialize, Serialize};

use crate::TrainError;
use crate::config::{DeviceChoice, TrainConfig};
use crate::phase::{PhaseClock, PhaseTimes};
use crate::progress::Bars;
use crate::report::{
    self, Curve, EpochSummary, PolicyResult, RunReport, Skipped, WindowReport, WindowStatus,
    read_json, write_atomic, write_json,
};

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
}

/// The device a run trains on, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// burn NdArray, rayon environments.
    Cpu,
    /// burn-cuda.
    Cuda,
}

/// Resolves `--device`: `auto` takes the GPU when one can be used and otherwise says why and
/// takes the CPU; `cuda` without a usable GPU is an error ("no CUDA device found: ...").
pub fn resolve_device(choice: DeviceChoice) -> Result<Resolved, TrainError> {
    Ok(match open_device(choice)? {
        Some(_) => Resolved::Cuda,
        None => Resolved::Cpu,
    })
}

/// The device `--device` asks for, opened once: the context a CUDA run then works in.
fn open_device(choice: DeviceChoice) -> Result<Option<Arc<GpuContext>>, TrainError> {
    match choice {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Cuda => Ok(Some(GpuContext::new(0)?)),
        DeviceChoice::Auto => match GpuContext::new(0) {
            Ok(ctx) => Ok(Some(ctx)),
            Err(e) => {
                tracing::warn!("{e}; training on the CPU");
                Ok(None)
            }
        },
    }
}

/// Runs the job: every window of the plan, then the aggregate report. Returns the report that
/// was also written to `out/report.json`.
pub fn run(job: &Job<'_>, opts: &RunOptions) -> Result<RunReport, TrainError> {
    job.cfg.validate()?;
    let gpu_ctx = open_device(job.cfg.device)?;
    let device = match gpu_ctx {
        Some(_) => Resolved::Cuda,
        None => Resolved::Cpu,
    };
    let plan = foxhunt_data::walkforward::plan(&job.dataset.series.row_days(), job.windows)?;
    let out = &opts.out;
    let config = serde_json::json!({
        "source": job.source,
        "windows": job.windows,
        "train": job.cfg,
        "spec": job.spec,
    });
    prepare_run_dir(out, &config, opts.resume)?;
    let exec = Execution::new(job.spec, job.cfg.costs);
    let mut pool = HostPool::new();
    // On the GPU, experience is collected on the device unless prioritized replay is asked for
    // (its sum tree lives on the host).
    #[cfg(feature = "cuda")]
    let mut gpu_run = gpu_ctx
        .as_ref()
        .filter(|_| job.cfg.dqn.prioritized.is_none())
        .map(crate::gpu_collect::GpuRun::new);
    #[cfg(not(feature = "cuda"))]
    let mut gpu_run: Option<std::convert::Infallible> = None;
    let bars = Bars::new(opts.progress, plan.windows.len(), job.cfg.epochs);
    let mut budget = opts.stop_after_epochs;
    let mut reports = Vec::new();
    let mut phases = Vec::new();
    let mut curves: Vec<(usize, Vec<Curve>)> = Vec::new();
    for s in &plan.skipped {
        tracing::warn!("window {} skipped: {}", s.window.index, s.reason);
    }
    for w in &plan.windows {
        let dir = out.join(format!("windows/window-{:03}", w.index));
        let done_path = dir.join("report.json");
        if opts.resume && done_path.exists() {
            let r: WindowReport = read_json(&done_path)?;
            phases.extend(read_json::<Vec<PhaseTimes>>(&dir.join("phases.json"))?);
            if r.status == WindowStatus::Ok {
                curves.push((w.index, read_json(&dir.join("curves.json"))?));
            }
            tracing::info!("window {} already finished: read back", w.index);
            reports.push(r);
            bars.window_done();
            continue;
        }
        if budget == Some(0) {
            // The epochs asked for ended with the previous window: stop before this one.
            bars.finish();
            return Err(TrainError::Stopped {
                epochs: opts.stop_after_epochs.unwrap_or(0),
            });
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
            exec,
            dir: &dir,
            resume: opts.resume,
            bars: &bars,
        };
        let outcome = match device {
            // CUDA without the fused engine (prioritized replay): the agent trains on burn-cuda.
            #[cfg(feature = "cuda")]
            Resolved::Cuda if gpu_run.is_none() => ctx.train::<foxhunt_dqn::CudaBackend>(
                &Default::default(),
                &mut pool,
                None,
                &mut budget,
            ),
            // The CPU; or CUDA with the fused engine training on the device, where the burn
            // agent beside it only holds the state between epochs (checkpoints, evaluation),
            // which the CPU backend does best.
            _ => ctx.train::<CpuBackend>(
                &Default::default(),
                &mut pool,
                gpu_run.as_mut(),
                &mut budget,
            ),
        };
        let (report, window_phases) = match outcome.map_err(|f| *f) {
            Ok(o) => {
                write_json(&dir.join("curves.json"), &o.curves)?;
                curves.push((w.index, o.curves));
                (o.report, o.phases)
            }
            Err(WindowFailure {
                error: error @ TrainError::NonFinite { .. },
                phases,
                epochs,
            }) => {
                tracing::error!("{error}; going on with the next window");
                (failed_report(w, error.to_string(), epochs), phases)
            }
            Err(WindowFailure {
                error: TrainError::Stopped { .. },
                ..
            }) => {
                bars.finish();
                return Err(TrainError::Stopped {
                    epochs: opts.stop_after_epochs.unwrap_or(0),
                });
            }
            Err(WindowFailure { error, .. }) => {
                bars.finish();
                return Err(error);
            }
        };
        write_json(&dir.join("phases.json"), &window_phases)?;
        // Written last: its presence marks the window finished for --resume.
        write_json(&done_path, &report)?;
        phases.extend(window_phases);
        reports.push(report);
        bars.window_done();
    }
    bars.finish();
    let report = RunReport {
        device: match device {
            Resolved::Cpu => "cpu",
            Resolved::Cuda => "cuda",
        }
        .into(),
        windows: reports,
        skipped: plan
            .skipped
            .iter()
            .map(|s| Skipped {
                index: s.window.index,
                reason: s.reason.clone(),
            })
            .collect(),
        empty_windows: plan.empty,
        aggregate: aggregate(&curves, job.cfg.capital),
        phases,
        pool: pool.stats(),
    };
    write_outputs(out, &report, &curves)?;
    Ok(report)
}

/// Creates the run directory, or checks that `--resume` continues the same run. A directory
/// holding another run is never overwritten.
fn prepare_run_dir(out: &Path, config: &serde_json::Value, resume: bool) -> Result<(), TrainError> {
    let path = out.join("config.json");
    if resume {
        let saved: serde_json::Value = read_json(&path)?;
        if &saved != config {
            return Err(TrainError::Options(format!(
                "--resume: {} was written for another configuration; differing settings: {}",
                path.display(),
                json_diff(&saved, config, "")
            )));
        }
        return Ok(());
    }
    if path.exists() {
        return Err(TrainError::Options(format!(
            "{} already holds a run; continue it with --resume or choose another --out",
            out.display()
        )));
    }
    write_json(&path, config)
}

/// `key: saved -> wanted` for every leaf that differs.
fn json_diff(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> String {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.iter()
                .filter_map(|k| {
                    let (u, v) = (
                        x.get(*k).unwrap_or(&Value::Null),
                        y.get(*k).unwrap_or(&Value::Null),
                    );
                    (u != v).then(|| {
                        json_diff(
                            u,
                            v,
                            &format!("{at}{}{k}", if at.is_empty() { "" } else { "." }),
                        )
                    })
                })
                .collect::<Vec<_>>()
                .join(", ")
        }
        _ => format!("{at}: {a} -> {b}"),
    }
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

fn aggregate(curves: &[(usize, Vec<Curve>)], capital: f64) -> Vec<PolicyResult> {
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
    write_atomic(
        &out.join("equity.csv"),
        report::equity_csv(curves).as_bytes(),
    )?;
    if let Some((_, first)) = curves.first() {
        let series: Vec<(&str, Vec<f64>)> = (0..first.len())
            .map(|k| {
                let parts: Vec<&Curve> = curves.iter().map(|(_, c)| &c[k]).collect();
                (first[k].policy.as_str(), report::chained_equity(&parts))
            })
            .collect();
        crate::plot::equity_png(
            &out.join("equity.png"),
            "OUT-OF-SAMPLE EQUITY (NET OF COSTS)",
            &series,
        )?;
    }
    write_atomic(&out.join("summary.txt"), report::summary(report).as_bytes())
}

/// An unfinished window's saved state (`progress.json`), written after the files it names.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Progress {
    epochs_done: usize,
    best_epoch: Option<usize>,
    best_val_pnl: Option<f64>,
    best_validation: Option<foxhunt_env::Metrics>,
    epochs: Vec<EpochSummary>,
    phases: Vec<PhaseTimes>,
}

fn state_files(dir: &Path, epoch: usize) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("epoch-{epoch:03}.ckpt")),
        dir.join(format!("epoch-{epoch:03}.replay")),
    )
}

fn best_file(dir: &Path, epoch: usize) -> PathBuf {
    dir.join(format!("best-epoch-{epoch:03}.ckpt"))
}

struct WindowCtx<'a> {
    job: &'a Job<'a>,
    w: &'a Window,
    exec: Execution,
    dir: &'a Path,
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

fn rel(r: &Range<usize>, base: usize) -> Range<usize> {
    r.start - base..r.end - base
}

impl WindowCtx<'_> {
    fn train<B: AutodiffBackend>(
        &self,
        device: &B::Device,
        pool: &mut HostPool,
        gpu: Option<&mut GpuRunType>,
        budget: &mut Option<usize>,
    ) -> Result<WindowOutcome, Box<WindowFailure>> {
        let (cfg, w) = (self.job.cfg, self.w);
        // Our kernels run on foxhunt-memory's stream, burn's on its own: a phase boundary
        // waits for both.
        #[cfg(feature = "cuda")]
        let gpu_ctx = gpu.as_deref().map(|r| r.pool.context().clone());
        let sync = || {
            // A failed sync surfaces in the next read of a result; timing just ends here.
            let _ = B::sync(device);
            #[cfg(feature = "cuda")]
            if let Some(c) = &gpu_ctx {
                let _ = c.stream().synchronize();
            }
        };
        let t_init = Instant::now();
        std::fs::create_dir_all(self.dir)
            .map_err(|e| TrainError::file(self.dir, format!("cannot create: {e}")))?;
        let m = &self.job.dataset.features;
        let rows = w.train.rows.start..w.test.rows.end;
        let base = rows.start;
        let norm = Normalizer::fit(m, w.train.rows.clone());
        let data = WindowData {
            market: MarketData::from_features(m, rows, Some(&norm)),
            exec: self.exec,
        };
        let arena = pool.window(&data);
        let dqn = cfg.agent_config(m.cols, w.index);
        let on_gpu = gpu.is_some();
        let uploaded = arena.uploaded_bytes();
        let (train, val, test) = (
            rel(&w.train.rows, base),
            rel(&w.val.rows, base),
            rel(&w.test.rows, base),
        );
        let fail = |error: TrainError, prog: &Progress| {
            Box::new(WindowFailure {
                error,
                phases: prog.phases.clone(),
                epochs: prog.epochs.clone(),
            })
        };
        let progress_path = self.dir.join("progress.json");
        let (mut agent, mut replay, mut prog) = if self.resume && progress_path.exists() {
            let p: Progress = read_json(&progress_path)?;
            let (ckpt, rpl) = state_files(self.dir, p.epochs_done - 1);
            let agent = checkpoint::load::<B>(&ckpt, &dqn, device).map_err(TrainError::from)?;
            // The device replay ring is not saved: a GPU run resumes with an empty ring.
            let replay = if on_gpu {
                Replay::new(1, dqn.seed, None)
            } else {
                let bytes = std::fs::read(&rpl)
                    .map_err(|e| TrainError::file(&rpl, format!("cannot read: {e}")))?;
                Replay::from_bytes(&bytes, dqn.replay_capacity, dqn.prioritized)
                    .map_err(TrainError::from)?
            };
            tracing::info!(
                "window {}: resuming after epoch {}",
                w.index,
                p.epochs_done - 1
            );
            (agent, replay, p)
        } else {
            // On the device path the host replay is unused (the ring holds the transitions).
            let capacity = if on_gpu { 1 } else { dqn.replay_capacity };
            let replay = Replay::new(capacity, dqn.seed, dqn.prioritized);
            (
                DqnAgent::<B>::new(dqn.clone(), device).map_err(TrainError::from)?,
                replay,
                Progress::default(),
            )
        };
        // On the GPU: the window's device arena (one upload), the ring, and the fused engine
        // starting from the agent's state (fresh or resumed).
        #[cfg(feature = "cuda")]
        let mut gpu_win = match gpu {
            Some(r) => Some(
                crate::gpu_collect::GpuWindow::new(
                    r,
                    &data,
                    cfg.envs,
                    &dqn,
                    &agent.export_state(),
                    cfg.max_steps_per_epoch,
                )
                .map_err(|e| fail(e, &prog))?,
            ),
            None => None,
        };
        // The step loop's phases on the GPU are timed by events, not by waiting each step.
        #[cfg(feature = "cuda")]
        let mut gpu_marks = gpu_ctx.as_deref().map(crate::gpu_collect::EventMarks::new);
        drop(data);
        let init_ms = t_init.elapsed().as_secs_f64() * 1e3;
        let first_epoch = prog.epochs_done;
        self.bars.window_started(w.index, first_epoch);
        for epoch in first_epoch..cfg.epochs {
            #[cfg(feature = "cuda")]
            let marks = gpu_marks
                .as_mut()
                .map(|m| m as &mut dyn crate::phase::DeviceMarks);
            #[cfg(not(feature = "cuda"))]
            let marks = None;
            let mut clock = PhaseClock::new(&sync).with_device(marks);
            if epoch == first_epoch {
                clock.charge(0, init_ms);
            }
            let ep = clock.time(0, || arena.epoch(epoch));
            let market = ep.arena().market();
            let seed = epoch_seed(cfg.seed, w.index, epoch);
            #[cfg(feature = "cuda")]
            let (mut envs, mut device_side) = match gpu_win.as_mut() {
                Some(g) => (
                    Envs::Gpu(
                        crate::gpu_collect::GpuEnvs::new(
                            &g.arena,
                            &cfg.env,
                            train.clone(),
                            cfg.envs,
                            seed,
                        )
                        .map_err(|e| fail(e, &prog))?,
                    ),
                    Some((&g.arena, &mut g.ring, &mut g.sampler, &mut g.engine)),
                ),
                None => (
                    Envs::Host(
                        Collector::new(market, &self.exec, cfg, train.clone(), seed, &dqn)
                            .map_err(|e| fail(e, &prog))?,
                    ),
                    None,
                ),
            };
            #[cfg(not(feature = "cuda"))]
            let mut envs = Envs::Host(
                Collector::new(market, &self.exec, cfg, train.clone(), seed, &dqn)
                    .map_err(|e| fail(e, &prog))?,
            );
            let dim = cfg.env.obs_dim(m.cols);
            let mut stats = Vec::new();
            let mut stat_steps = Vec::new();
            let learning_starts = cfg.learning_starts.max(dqn.batch_size);
            for step in 0..cfg.max_steps_per_epoch {
                clock
                    .time_device(1, || -> Result<(), TrainError> {
                        let eps = agent.epsilon();
                        let seed = ActionSeed {
                            seed: cfg.seed,
                            window: w.index,
                            epoch,
                            step,
                        };
                        match &mut envs {
                            Envs::Host(col) => {
                                let actions = choose_actions(&agent, &col.obs, dim, eps, &seed);
                                col.step(&actions, &mut replay);
                            }
                            #[cfg(feature = "cuda")]
                            Envs::Gpu(g) => {
                                let (_, ring, _, engine) =
                                    device_side.as_mut().expect("device side with GPU envs");
                                g.step(engine, eps as f32, seed.seed, seed.counter(), ring)?;
                            }
                        }
                        agent.count_env_steps(cfg.envs as u64);
                        Ok(())
                    })
                    .map_err(|e| fail(e, &prog))?;
                #[cfg(feature = "cuda")]
                let available = match &device_side {
                    Some((_, ring, sampler, _)) => sampler.transitions(ring, cfg.envs),
                    None => replay.len(),
                };
                #[cfg(not(feature = "cuda"))]
                let available = replay.len();
                if available >= learning_starts {
                    let s = clock
                        .time_device(2, || -> Result<_, TrainError> {
                            // On the GPU the statistics stay in the engine until the epoch ends.
                            #[cfg(feature = "cuda")]
                            if let Some((arena, ring, sampler, engine)) = device_side.as_mut() {
                                sampler.sample(arena, ring, &cfg.env)?;
                                engine.learn(&sampler.batch)?;
                                return Ok(None);
                            }
                            let hb = replay.sample(dqn.batch_size, agent.updates());
                            let s = agent.learn(Batch::from_host(&hb, dim, device));
                            if dqn.prioritized.is_some() {
                                // Prioritized replay lives on the host: its new priorities are
                                // read back every update (uniform replay reads nothing).
                                let td: Vec<f32> =
                                    s.td_errors.clone().into_data().iter::<f32>().collect();
                                replay.update_priorities(&hb.slots, &td);
                            }
                            Ok(Some(s))
                        })
                        .map_err(|e| fail(e, &prog))?;
                    clock
                        .time_device(3, || -> Result<(), TrainError> {
                            #[cfg(feature = "cuda")]
                            if let Some((.., engine)) = device_side.as_mut() {
                                return Ok(engine.sync_target()?);
                            }
                            agent.sync_target();
                            Ok(())
                        })
                        .map_err(|e| fail(e, &prog))?;
                    stats.extend(s);
                    stat_steps.push(step);
                }
            }
            drop(envs);
            // The one read of the epoch's statistics, and the check that they are finite.
            #[cfg(feature = "cuda")]
            let host = match device_side.as_mut() {
                Some((.., engine)) => engine
                    .take_stats()
                    .map_err(|e| fail(TrainError::from(e), &prog))?,
                None => read_stats::<B>(&stats),
            };
            #[cfg(not(feature = "cuda"))]
            let host = read_stats::<B>(&stats);
            if let Some(k) = host.iter().position(|s| s.iter().any(|v| !v.is_finite())) {
                let names = ["loss", "mean Q", "mean |TD error|", "gradient norm"];
                let what = names[host[k].iter().position(|v| !v.is_finite()).unwrap_or(0)];
                let last_finite = k
                    .checked_sub(1)
                    .map(|j| {
                        let s = host[j];
                        format!(
                            "step {}: loss {} mean Q {} mean |TD| {} grad norm {}",
                            stat_steps[j], s[0], s[1], s[2], s[3]
                        )
                    })
                    .unwrap_or_else(|| "none in this epoch".into());
                return Err(fail(
                    TrainError::NonFinite {
                        window: w.index,
                        epoch,
                        step: stat_steps[k],
                        what: what.into(),
                        last_finite,
                    },
                    &prog,
                ));
            }
            let val_report = clock
                .time(4, || -> Result<_, TrainError> {
                    // The engine's weights, read once per epoch, become the agent's: evaluation
                    // and checkpoints work from it.
                    #[cfg(feature = "cuda")]
                    if let Some((.., engine)) = device_side.as_ref() {
                        agent.import_state(&engine.state()?);
                    }
                    let mut policy = AgentPolicy::new(&agent.online_net(), &cfg.env);
                    let r = backtest(
                        market,
                        &self.exec,
                        &cfg.env,
                        val.clone(),
                        cfg.capital,
                        &mut policy,
                    )?;
                    if prog.best_val_pnl.is_none_or(|b| r.metrics.total_pnl > b) {
                        checkpoint::save(&agent, &best_file(self.dir, epoch))?;
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
                #[cfg(feature = "cuda")]
                if let Some(g) = &gpu_win {
                    pt.uploaded_bytes += g.arena.uploaded_bytes();
                }
            }
            tracing::info!("{pt}");
            let mean = |i: usize| {
                (!host.is_empty())
                    .then(|| host.iter().map(|s| s[i]).sum::<f32>() / host.len() as f32)
            };
            prog.epochs.push(EpochSummary {
                epoch,
                loss: mean(0),
                mean_q: mean(1),
                td_abs_mean: mean(2),
                grad_norm: mean(3),
                epsilon: agent.epsilon(),
                val_pnl: val_report.metrics.total_pnl,
            });
            prog.phases.push(pt);
            prog.epochs_done = epoch + 1;
            self.bars.epoch_done(val_report.metrics.total_pnl);
            if let Some(b) = budget.as_mut() {
                *b = b.saturating_sub(1);
            }
            let stop = *budget == Some(0) && epoch + 1 < cfg.epochs;
            let due = cfg.checkpoint_every > 0 && (epoch + 1) % cfg.checkpoint_every == 0;
            if stop || (due && epoch + 1 < cfg.epochs) {
                self.save_progress(&agent, (!on_gpu).then_some(&replay), &prog)
                    .map_err(|e| fail(e, &prog))?;
            }
            if stop {
                return Err(fail(TrainError::Stopped { epochs: 0 }, &prog));
            }
        }
        // The best epoch's weights, judged once on the test split beside the baselines.
        let best = prog.best_epoch.expect("at least one epoch ran");
        let market = arena.market();
        let tested = (|| -> Result<_, TrainError> {
            let agent = checkpoint::load::<B>(&best_file(self.dir, best), &dqn, device)?;
            let mut policy = AgentPolicy::new(&agent.online_net(), &cfg.env);
            let mut runs = vec![(
                "agent".to_owned(),
                backtest(
                    market,
                    &self.exec,
                    &cfg.env,
                    test.clone(),
                    cfg.capital,
                    &mut policy,
                )?,
            )];
            for b in Baseline::ALL {
                let r = b.run(
                    market,
                    &self.exec,
                    &cfg.env,
                    test.clone(),
                    cfg.capital,
                    cfg.seed,
                )?;
                runs.push((r.policy.clone(), r));
            }
            Ok(runs)
        })()
        .map_err(|e| fail(e, &prog))?;
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
                .map(|(n, r)| PolicyResult {
                    policy: n.clone(),
                    metrics: r.metrics.clone(),
                })
                .collect(),
            epochs: prog.epochs.clone(),
        };
        let curves = tested
            .iter()
            .map(|(n, r)| Curve::from_backtest(n, r))
            .collect();
        // The window is done: its intermediate state is no longer needed.
        let _ = std::fs::remove_file(&progress_path);
        remove_best_except(self.dir, Some(best), cfg.epochs);
        for e in 0..cfg.epochs {
            let (a, b) = state_files(self.dir, e);
            let _ = std::fs::remove_file(a);
            let _ = std::fs::remove_file(b);
        }
        Ok(WindowOutcome {
            report,
            curves,
            phases: prog.phases,
        })
    }

    /// Agent and replay of the epoch just finished, then `progress.json` naming them; older
    /// epochs' files are removed only after that.
    fn save_progress<B: AutodiffBackend>(
        &self,
        agent: &DqnAgent<B>,
        replay: Option<&Replay>,
        prog: &Progress,
    ) -> Result<(), TrainError> {
        let epoch = prog.epochs_done - 1;
        let (ckpt, rpl) = state_files(self.dir, epoch);
        std::fs::create_dir_all(self.dir).map_err(|e| TrainError::file(self.dir, e))?;
        checkpoint::save(agent, &ckpt)?;
        if let Some(r) = replay {
            write_atomic(&rpl, &r.to_bytes())?;
        }
        write_json(&self.dir.join("progress.json"), prog)?;
        remove_best_except(self.dir, prog.best_epoch, epoch);
        for e in 0..epoch {
            let (a, b) = state_files(self.dir, e);
            let _ = std::fs::remove_file(a);
            let _ = std::fs::remove_file(b);
        }
        Ok(())
    }
}

/// Removes best-epoch checkpoints of epochs `< upto` other than `keep`'s.
fn remove_best_except(dir: &Path, keep: Option<usize>, upto: usize) {
    for e in (0..upto).filter(|&e| Some(e) != keep) {
        let _ = std::fs::remove_file(best_file(dir, e));
    }
}

fn epoch_seed(seed: u64, window: usize, epoch: usize) -> u64 {
    mix64(seed ^ mix64(((window as u64) << 32) | epoch as u64))
}

#[cfg(feature = "cuda")]
type GpuRunType = crate::gpu_collect::GpuRun;
#[cfg(not(feature = "cuda"))]
type GpuRunType = std::convert::Infallible;

/// An epoch's environments: on the CPU (host replay) or on the GPU (device replay ring).
// One per epoch, made once and never moved in the step loop: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Envs<'m> {
    Host(Collector<'m>),
    #[cfg(feature = "cuda")]
    Gpu(crate::gpu_collect::GpuEnvs<'m>),
}

/// The N environments of one epoch on the CPU and their n-step accumulators.
struct Collector<'m> {
    env: VecEnv<'m>,
    dim: usize,
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    rewards: Vec<f32>,
    dones: Vec<u8>,
    nstep: Vec<NStep>,
    out: Vec<foxhunt_dqn::replay::Transition>,
}

impl<'m> Collector<'m> {
    fn new(
        market: &'m MarketData,
        exec: &Execution,
        cfg: &TrainConfig,
        split: Range<usize>,
        seed: u64,
        dqn: &foxhunt_dqn::DqnConfig,
    ) -> Result<Self, TrainError> {
        let n = cfg.envs;
        let mut env = VecEnv::new(market, *exec, cfg.env.clone(), split, n, seed)?;
        let dim = env.obs_dim();
        let mut obs = vec![0f32; n * dim];
        env.reset(&mut obs);
        Ok(Self {
            env,
            dim,
            next_obs: obs.clone(),
            obs,
            rewards: vec![0.0; n],
            dones: vec![0; n],
            nstep: (0..n).map(|_| NStep::new(dqn.n_step, dqn.gamma)).collect(),
            out: Vec::new(),
        })
    }

    /// Steps every environment and writes the completed n-step transitions to `replay`.
    fn step(&mut self, actions: &[u8], replay: &mut Replay) {
        self.env.step(
            actions,
            &mut self.next_obs,
            &mut self.rewards,
            &mut self.dones,
        );
        let dim = self.dim;
        for (i, acc) in self.nstep.iter_mut().enumerate() {
            let end = match self.dones[i] {
                done::TERMINAL => StepEnd::Terminal,
                done::TRUNCATED => StepEnd::Truncated,
                _ => StepEnd::Running,
            };
            acc.push(
                &self.obs[i * dim..(i + 1) * dim],
                actions[i],
                self.rewards[i],
                &self.next_obs[i * dim..(i + 1) * dim],
                end,
                &mut self.out,
            );
        }
        for t in self.out.drain(..) {
            replay.push(t);
        }
        std::mem::swap(&mut self.obs, &mut self.next_obs);
    }
}

/// Where an exploration draw comes from: counter-based, so a resumed run draws the same.
struct ActionSeed {
    seed: u64,
    window: usize,
    epoch: usize,
    step: usize,
}

impl ActionSeed {
    /// The draw's counter, unique per (window, epoch, step).
    fn counter(&self) -> u64 {
        ((self.window as u64) << 40) ^ ((self.epoch as u64) << 24) ^ self.step as u64
    }
}

/// Epsilon-greedy actions for every environment: greedy from the online network, replaced with
/// a uniform action where a draw falls under epsilon.
fn choose_actions<B: AutodiffBackend>(
    agent: &DqnAgent<B>,
    obs: &[f32],
    dim: usize,
    epsilon: f64,
    s: &ActionSeed,
) -> Vec<u8> {
    let n = obs.len() / dim;
    let device = agent.device();
    let q =
        agent.q_values(Tensor::<B::InnerBackend, 1>::from_floats(obs, device).reshape([n, dim]));
    let greedy = q.argmax(1).into_data();
    let actions = agent.config().actions as u64;
    let base = mix64(s.seed ^ mix64(s.counter()));
    greedy
        .iter::<i64>()
        .enumerate()
        .map(|(i, g)| {
            let h = mix64(base ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
            let u = (h >> 11) as f64 / (1u64 << 53) as f64;
            if u < epsilon {
                (mix64(h) % actions) as u8
            } else {
                g as u8
            }
        })
        .collect()
}

/// Reads the statistics of an epoch's updates in one go: `[loss, mean Q, mean |TD|, grad norm]`
/// per update.
fn read_stats<B: AutodiffBackend>(stats: &[TrainStats<B::InnerBackend>]) -> Vec<[f32; 4]> {
    if stats.is_empty() {
        return Vec::new();
    }
    let col = |f: fn(&TrainStats<B::InnerBackend>) -> Tensor<B::InnerBackend, 1>| -> Vec<f32> {
        Tensor::cat(stats.iter().map(f).collect(), 0)
            .into_data()
            .iter::<f32>()
            .collect()
    };
    let (l, q, td, g) = (
        col(|s| s.loss.clone()),
        col(|s| s.mean_q.clone()),
        col(|s| s.td_abs_mean.clone()),
        col(|s| s.grad_norm.clone()),
    );
    (0..l.len()).map(|i| [l[i], q[i], td[i], g[i]]).collect()
}

/// The greedy policy of a trained network, for backtests, on a host snapshot of the weights: a
/// backtest decides bar by bar, and neither a device round trip nor a tensor dispatch per bar
/// is worth paying.
struct AgentPolicy {
    net: foxhunt_dqn::model::HostQNetwork,
    env: EnvConfig,
}

impl AgentPolicy {
    fn new<B: burn::tensor::backend::Backend>(net: &QNetwork<B>, env: &EnvConfig) -> Self {
        Self {
            net: net.to_host(),
            env: env.clone(),
        }
    }
}

impl Policy for AgentPolicy {
    fn name(&self) -> String {
        "agent".into()
    }
    fn target(&mut self, d: &Decision<'_>) -> i32 {
        self.env.target(self.net.greedy(d.obs) as u8)
    }
}
