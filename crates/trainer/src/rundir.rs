//! The run directory: created for one run or continued by `--resume`, never overwritten by
//! another run; and a window's resumable state in its folder (checkpoints, replay, progress).

use std::path::{Path, PathBuf};

use foxhunt_dqn::{AgentConfig, Snapshot, checkpoint};
use serde::{Deserialize, Serialize};

use crate::TrainError;
use crate::phase::PhaseTimes;
use crate::report::{EpochSummary, read_json, sealed_json, write_json};

/// Creates the run directory, or checks that `--resume` continues the same run, and locks it
/// for this process's life (the returned lock; a second process on the directory fails at once).
/// A directory is used only if it is absent, empty, or a foxhunt run continued with `--resume`:
/// nothing in a directory foxhunt did not write is overwritten.
pub(crate) fn prepare(
    out: &Path,
    config: &serde_json::Value,
    plan: &foxhunt_data::walkforward::Plan,
    resume: bool,
) -> Result<foxhunt_fs::DirLock, TrainError> {
    let path = out.join("config.json");
    let taken = || {
        TrainError::Options(format!(
            "{} already holds a run; continue it with --resume or choose another --out",
            out.display()
        ))
    };
    // A directory foxhunt has locked before is probed first: while another process works in
    // it, its files (temporary ones included) are that run's, and the answer is "busy".
    let mut lock = match out.join(foxhunt_fs::LOCK_FILE).exists() {
        true => Some(foxhunt_fs::lock_dir(out)?),
        false => None,
    };
    if resume && !path.exists() {
        return Err(TrainError::Options(format!(
            "--resume: {} holds no foxhunt run (no config.json)",
            out.display()
        )));
    }
    // Checked before a lock file is made in a directory without one, so that a refused
    // directory of the user's is left as it was.
    let check_unused = || {
        if path.exists() {
            return Err(taken());
        }
        refuse_foreign(out)
    };
    if !resume {
        check_unused()?;
    }
    if lock.is_none() {
        create_dir(out)?;
        lock = Some(foxhunt_fs::lock_dir(out)?);
    }
    let lock = lock.expect("taken above");
    if resume {
        same_config(&path, config, "--resume")?;
        return Ok(lock);
    }
    // Another process may have run here between the check and the lock.
    check_unused()?;
    write_run(out, config, plan)?;
    Ok(lock)
}

/// Refuses a directory holding anything but foxhunt's lock file: nothing foxhunt did not
/// write is overwritten.
fn refuse_foreign(out: &Path) -> Result<(), TrainError> {
    if let Ok(entries) = std::fs::read_dir(out)
        && let Some(e) = entries
            .filter_map(|e| e.ok())
            .find(|e| e.file_name() != foxhunt_fs::LOCK_FILE)
    {
        return Err(TrainError::Options(format!(
            "{} is not empty (it holds {}) and is not a foxhunt run; --out takes a new or \
             empty directory",
            out.display(),
            e.file_name().to_string_lossy()
        )));
    }
    Ok(())
}

fn create_dir(out: &Path) -> Result<(), TrainError> {
    std::fs::create_dir_all(out).map_err(|source| {
        foxhunt_fs::FsError {
            path: out.to_path_buf(),
            what: "create the directory",
            source,
        }
        .into()
    })
}

/// Refuses a run directory whose config.json (`path`) differs from `config`, naming the
/// differing settings; `who` says what asked (`--resume`, a shard).
fn same_config(path: &Path, config: &serde_json::Value, who: &str) -> Result<(), TrainError> {
    let saved: serde_json::Value = read_json(path)?;
    if &saved != config {
        return Err(TrainError::Options(format!(
            "{who}: {} was written for another configuration; differing settings: {}",
            path.display(),
            foxhunt_fs::json_diff(&saved, config)
        )));
    }
    Ok(())
}

/// A new run's config.json, then its plan.json.
fn write_run(
    out: &Path,
    config: &serde_json::Value,
    plan: &foxhunt_data::walkforward::Plan,
) -> Result<(), TrainError> {
    write_json(&out.join("config.json"), config)?;
    write_json(&out.join(PLAN_FILE), plan)
}

/// The plan of a run's windows (`plan.json`), written with its config: what `foxhunt report`
/// aggregates and what every shard checks it shares.
pub(crate) const PLAN_FILE: &str = "plan.json";

/// Folder of the shards' markers (`shards/shard-K-of-N.json`).
const SHARDS_DIR: &str = "shards";

/// [`prepare`] for one shard of a run that several processes share: the first to arrive writes
/// the config and the plan, every other checks that its own are the same (refusing, naming the
/// setting, when they are not). The run directory is locked only for that check; each window's
/// folder is locked while it trains ([`WindowDir::lock`]). Unlike an unsharded `--resume`, a
/// shard's `--resume` may find no run yet and start it.
pub(crate) fn prepare_shared(
    out: &Path,
    config: &serde_json::Value,
    plan: &foxhunt_data::walkforward::Plan,
    shard: crate::Shard,
) -> Result<(), TrainError> {
    let path = out.join("config.json");
    // Whether or not --resume is given, the first of a run's shards to start makes the run: a
    // scheduler retries a task with the command line it first ran (docs/SCALING.md).
    // A first shard makes the run: the rules of a new run directory apply (a lock file means
    // another shard is making it, and this one waits for it rather than failing).
    if !path.exists() && !out.join(foxhunt_fs::LOCK_FILE).exists() {
        refuse_foreign(out)?;
    }
    create_dir(out)?;
    let _lock = foxhunt_fs::lock_dir_within(out, std::time::Duration::from_secs(60))?;
    if path.exists() {
        same_config(
            &path,
            config,
            &format!("shard {shard} (every shard of a run takes the same settings)"),
        )?;
        let saved: foxhunt_data::walkforward::Plan = read_json(&out.join(PLAN_FILE))?;
        if &saved != plan {
            return Err(TrainError::Options(format!(
                "shard {shard}: the walk-forward plan differs from the one in {} (other data?)",
                out.join(PLAN_FILE).display()
            )));
        }
    } else {
        write_run(out, config, plan)?;
    }
    write_json(
        &out.join(SHARDS_DIR)
            .join(format!("shard-{}-of-{}.json", shard.index, shard.count)),
        &shard,
    )
}

/// The shards that started on the run (from their markers' names), sorted by count and index.
pub(crate) fn shards_started(out: &Path) -> Vec<crate::Shard> {
    let mut shards: Vec<crate::Shard> = std::fs::read_dir(out.join(SHARDS_DIR))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_suffix(".json")?.strip_prefix("shard-")?;
            let (k, n) = rest.rsplit_once("-of-")?;
            crate::Shard::new(k.parse().ok()?, n.parse().ok()?).ok()
        })
        .collect();
    shards.sort_unstable_by_key(|s| (s.count, s.index));
    shards
}

/// The shard counts the run's shards were started with (from their markers), sorted.
pub(crate) fn shard_counts(out: &Path) -> Vec<usize> {
    let mut counts: Vec<usize> = shards_started(out).iter().map(|s| s.count).collect();
    counts.dedup();
    counts
}

/// An unfinished window's saved state (`progress.json`), written after the files it names.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Progress {
    pub epochs_done: usize,
    pub best_epoch: Option<usize>,
    /// The best epoch's validation score (`select`: net PnL by default).
    #[serde(alias = "best_val_pnl")]
    pub best_score: Option<f64>,
    pub best_validation: Option<foxhunt_env::Metrics>,
    pub epochs: Vec<EpochSummary>,
    pub phases: Vec<PhaseTimes>,
}

/// A window's folder in the run directory and the files in it.
#[derive(Clone)]
pub(crate) struct WindowDir {
    dir: PathBuf,
}

impl WindowDir {
    /// The folder of window `index` under the run directory `out`.
    pub fn new(out: &Path, index: usize) -> Self {
        Self {
            dir: out.join(format!("windows/window-{index:03}")),
        }
    }
    /// Creates the folder.
    pub fn create(&self) -> Result<(), TrainError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| TrainError::file(&self.dir, format!("cannot create: {e}")))
    }
    /// Creates the folder and locks it while the window trains: one process per window.
    pub fn lock(&self) -> Result<foxhunt_fs::DirLock, TrainError> {
        self.create()?;
        Ok(foxhunt_fs::lock_dir(&self.dir)?)
    }
    /// The folder of a population's member `index` inside the window's: the same files for
    /// its own state and best checkpoint; its `report.json` marks it finished.
    pub fn member(&self, index: usize) -> Self {
        Self {
            dir: self.dir.join(format!("agent-{index:03}")),
        }
    }
    /// Whether the window has results or saved state from an earlier invocation (its own, or
    /// a population member's).
    pub fn has_state(&self) -> bool {
        self.report().exists()
            || self.progress().exists()
            || std::fs::read_dir(&self.dir).is_ok_and(|mut d| {
                d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("agent-")))
            })
    }
    /// The window's report, written last: its presence marks the window finished.
    pub fn report(&self) -> PathBuf {
        self.dir.join("report.json")
    }
    /// The window's phase breakdowns.
    pub fn phases(&self) -> PathBuf {
        self.dir.join("phases.json")
    }
    /// The window's test-period curves.
    pub fn curves(&self) -> PathBuf {
        self.dir.join("curves.json")
    }
    /// An unfinished window's progress.
    pub fn progress(&self) -> PathBuf {
        self.dir.join("progress.json")
    }
    /// Agent checkpoint and host replay after `epoch`.
    pub fn state_files(&self, epoch: usize) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("epoch-{epoch:03}.ckpt")),
            self.dir.join(format!("epoch-{epoch:03}.replay")),
        )
    }
    /// The checkpoint of the best epoch so far.
    pub fn best(&self, epoch: usize) -> PathBuf {
        self.dir.join(format!("best-epoch-{epoch:03}.ckpt"))
    }

    /// The writing of the agent (`snapshot`, of `cfg`) and replay of the epoch just finished,
    /// then of `progress.json` naming them; older epochs' files are removed only after that.
    /// What is written is taken now (the agent's state, the progress serialized); the
    /// checkpoint is encoded and the files are written when the job runs ([`StateWriter`]).
    pub fn save_progress(
        &self,
        cfg: &AgentConfig,
        snapshot: Snapshot,
        replay: Option<Vec<u8>>,
        prog: &Progress,
    ) -> Result<WriteJob, TrainError> {
        let epoch = prog.epochs_done - 1;
        let (ckpt, rpl) = self.state_files(epoch);
        let progress = self.progress();
        let prog_bytes = sealed_json(&progress, prog)?;
        let (dir, cfg, best_epoch) = (self.clone(), cfg.clone(), prog.best_epoch);
        Ok(Box::new(move || {
            dir.create()?;
            let agent = checkpoint::encode_snapshot(&cfg, &snapshot, &ckpt)?;
            checkpoint::write(&ckpt, &agent)?;
            if let Some(bytes) = replay {
                foxhunt_fs::write_sealed(&rpl, &bytes)?;
            }
            foxhunt_fs::write_atomic(&progress, &prog_bytes)?;
            dir.remove_best_except(best_epoch, epoch);
            dir.remove_state_before(epoch);
            Ok(())
        }))
    }

    /// The writing of the agent `snapshot` holds (of `cfg`) as the best epoch's checkpoint
    /// (`best-epoch-E.ckpt`), encoded when the job runs.
    pub fn save_best(&self, cfg: &AgentConfig, snapshot: Snapshot, epoch: usize) -> WriteJob {
        let (path, dir, cfg) = (self.best(epoch), self.clone(), cfg.clone());
        Box::new(move || {
            dir.create()?;
            let bytes = checkpoint::encode_snapshot(&cfg, &snapshot, &path)?;
            Ok(checkpoint::write(&path, &bytes)?)
        })
    }

    /// Removes best-epoch checkpoints of epochs `< upto` other than `keep`'s.
    pub fn remove_best_except(&self, keep: Option<usize>, upto: usize) {
        for e in (0..upto).filter(|&e| Some(e) != keep) {
            let _ = std::fs::remove_file(self.best(e));
        }
    }

    /// Removes the resumable state of epochs `< upto`.
    pub fn remove_state_before(&self, upto: usize) {
        for e in 0..upto {
            let (a, b) = self.state_files(e);
            let _ = std::fs::remove_file(a);
            let _ = std::fs::remove_file(b);
        }
    }

    /// The window is done: its intermediate state goes, but for the best epoch's checkpoint.
    pub fn finish(&self, best: usize, epochs: usize) {
        let _ = std::fs::remove_file(self.progress());
        self.remove_best_except(Some(best), epochs);
        self.remove_state_before(epochs);
    }
}

/// A write of resumable state, made on the training thread and run by a [`StateWriter`].
pub(crate) type WriteJob = Box<dyn FnOnce() -> Result<(), TrainError> + Send>;

/// Writes an agent's resumable state off its training thread, in the order the jobs came in,
/// so that each epoch's checkpoint and progress (atomic writes, each flushed to disk: about 9
/// ms an epoch on the H200 host, more than a whole epoch's training) overlap the next epoch
/// instead of delaying it. The order is what `--resume` relies on: the best checkpoint before
/// the progress naming it, old files removed only after the progress that replaces them. The
/// first failed write stops the writer (nothing after it is written); the error comes back from
/// the next [`StateWriter::submit`] or from [`StateWriter::finish`]. Dropped, it waits for the
/// writes already asked for.
pub(crate) struct StateWriter {
    jobs: Option<std::sync::mpsc::Sender<WriteJob>>,
    thread: Option<std::thread::JoinHandle<Result<(), TrainError>>>,
}

impl StateWriter {
    pub fn new() -> Result<Self, TrainError> {
        let (tx, rx) = std::sync::mpsc::channel::<WriteJob>();
        let thread = std::thread::Builder::new()
            .name("foxhunt-state-writer".into())
            .spawn(move || rx.into_iter().try_for_each(|job| job()))
            .map_err(|e| TrainError::Options(format!("cannot start the state writer: {e}")))?;
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues `job` after the jobs before it; an earlier job's error, if one failed.
    pub fn submit(&mut self, job: WriteJob) -> Result<(), TrainError> {
        match self.jobs.as_ref().map(|tx| tx.send(job)) {
            Some(Ok(())) => Ok(()),
            // The writer stopped at a failed write: its error.
            _ => self
                .wait()
                .and(Err(TrainError::Options("the state writer stopped".into()))),
        }
    }

    /// Waits for every job queued; the first failed write's error.
    pub fn finish(mut self) -> Result<(), TrainError> {
        self.wait()
    }

    fn wait(&mut self) -> Result<(), TrainError> {
        drop(self.jobs.take());
        match self.thread.take().map(|t| t.join()) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(TrainError::Options("the state writer panicked".into())),
        }
    }
}

impl Drop for StateWriter {
    fn drop(&mut self) {
        // On an error path the caller reports its own error; the writes asked for still end
        // before the window's files are looked at again.
        let _ = self.wait();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A job that records `n` in `log` after `pause`, failing when `fail`.
    fn job(log: &Arc<Mutex<Vec<u32>>>, n: u32, pause: u64, fail: bool) -> WriteJob {
        let log = log.clone();
        Box::new(move || {
            std::thread::sleep(std::time::Duration::from_millis(pause));
            if fail {
                return Err(TrainError::file(
                    Path::new("state.ckpt"),
                    format!("job {n} failed"),
                ));
            }
            log.lock().expect("no job panics").push(n);
            Ok(())
        })
    }

    #[test]
    fn the_writer_runs_jobs_in_order_and_finish_waits_for_them() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut w = StateWriter::new().expect("a writer thread");
        // Earlier jobs slower than later ones: order is the queue's, not the clock's.
        for n in 0..5 {
            w.submit(job(&log, n, 10 - 2 * n as u64, false))
                .expect("queued");
        }
        w.finish().expect("queued");
        assert_eq!(*log.lock().expect("no job panics"), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_failed_write_stops_the_writer_and_its_error_comes_back() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut w = StateWriter::new().expect("a writer thread");
        w.submit(job(&log, 0, 0, false)).expect("queued");
        w.submit(job(&log, 1, 0, true)).expect("queued");
        // Queued before the failure is seen: never run.
        let _ = w.submit(job(&log, 2, 0, false));
        std::thread::sleep(std::time::Duration::from_millis(50));
        // The writer has stopped: the next submit returns the failure, and nothing runs.
        let e = w
            .submit(job(&log, 3, 0, false))
            .expect_err("the failed write");
        assert!(e.to_string().contains("state.ckpt: job 1 failed"), "{e}");
        assert_eq!(*log.lock().expect("no job panics"), vec![0]);

        let mut w = StateWriter::new().expect("a writer thread");
        w.submit(job(&log, 4, 20, true)).expect("queued");
        let e = w.finish().expect_err("the failed write");
        assert!(e.to_string().contains("job 4 failed"), "{e}");
    }

    #[test]
    fn a_dropped_writer_still_writes_what_was_asked() {
        let log = Arc::new(Mutex::new(Vec::new()));
        {
            let mut w = StateWriter::new().expect("a writer thread");
            w.submit(job(&log, 7, 30, false)).expect("queued");
        }
        assert_eq!(*log.lock().expect("no job panics"), vec![7]);
    }
}
