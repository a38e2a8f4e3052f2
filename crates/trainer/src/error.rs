//! The trainer's error type: each variant carries what a user needs to find the problem.

use std::path::PathBuf;

/// Errors of foxhunt-trainer.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Reading or preparing the data failed.
    #[error(transparent)]
    Data(#[from] foxhunt_data::DataError),
    /// The environment refused a setting.
    #[error(transparent)]
    Env(#[from] foxhunt_env::EnvError),
    /// The agent refused a setting or a checkpoint.
    #[error(transparent)]
    Dqn(#[from] foxhunt_dqn::DqnError),
    /// Window memory on the device, the GPU environment or replay.
    #[error(transparent)]
    Memory(#[from] foxhunt_memory::MemoryError),
    /// The GPU: no CUDA, the driver, a kernel module.
    #[error(transparent)]
    Gpu(#[from] foxhunt_gpu::GpuError),
    /// A command-line or config-file setting is unusable.
    #[error("{0}")]
    Options(String),
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A loss or Q-value stopped being finite: the window is abandoned, the run goes on.
    #[error(
        "window {window}, epoch {epoch}, step {step}: {what} is not finite; last finite statistics: {last_finite}"
    )]
    NonFinite {
        /// Window index.
        window: usize,
        /// Epoch within the window.
        epoch: usize,
        /// Training step within the epoch (0-based) whose statistics were first not finite.
        step: usize,
        /// Which statistic.
        what: String,
        /// The statistics of the last step that was finite, or "none".
        last_finite: String,
    },
    /// A run's report was asked for before every window finished.
    #[error("{}: {} of the plan's windows not finished: {}", dir.display(), missing.len(), crate::error::owners_of(missing, owners))]
    Incomplete {
        /// The run directory.
        dir: PathBuf,
        /// The windows without a report.
        missing: Vec<usize>,
        /// The shard counts the run's shards were started with (none for an unsharded run).
        owners: Vec<usize>,
    },
    /// The run stopped on request (`--stop-after-epochs`) after writing its state; `--resume`
    /// continues it.
    #[error("stopped after {epochs} epochs as asked; continue with --resume")]
    Stopped {
        /// Epochs trained in this invocation.
        epochs: usize,
    },
}

impl From<foxhunt_fs::FsError> for TrainError {
    fn from(e: foxhunt_fs::FsError) -> Self {
        TrainError::File {
            message: format!("cannot {}: {}", e.what, e.source),
            path: e.path,
        }
    }
}

impl TrainError {
    pub(crate) fn file(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        TrainError::File {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }
}

/// "window 3 (shard 0/3), window 4 (shard 1/3)": which shard owns each missing window, where
/// the run's shards all had one count.
pub(crate) fn owners_of(missing: &[usize], counts: &[usize]) -> String {
    let list: Vec<String> = missing
        .iter()
        .map(|&w| match counts {
            [n] => format!("window {w} (shard {})", crate::Shard::owner(w, *n)),
            _ => format!("window {w}"),
        })
        .collect();
    let note = match counts {
        [] => "; no shard of this run has started (an unsharded run: continue it with --resume)"
            .to_string(),
        [_] => String::new(),
        many => format!("; shards were started with different counts {many:?}"),
    };
    format!("{}{note}", list.join(", "))
}
