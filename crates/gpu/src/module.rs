//! The kernel modules: each a CUDA source compiled by NVRTC as one unit, named by a typed id.
//! The sources live in this crate's kernels/ folder and are embedded in the binary.

use std::borrow::Cow;
use std::path::PathBuf;

use crate::GpuError;

/// A kernel module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Module {
    /// The trading environment (env_reset, env_step, env_step_record) and the replay sampler
    /// (replay_sample), which rebuilds observations with the environment's `observe`.
    Env,
    /// The fused DQN engine: forward, loss, backward, Adam, target update, action selection.
    Dqn,
    /// Greedy evaluation: a dense Q-network's decisions over a split, as the host's (eval_flat,
    /// eval_chunks, eval_stitch), and their backtest's booking (book_sessions, book_total), with
    /// the environment's transition.
    Eval,
    /// The one-launch epoch: acting, the environment step, replay, sampling and the update of
    /// every step of an epoch in one persistent kernel (epoch_steps, cooperative, on the grid
    /// barrier; epoch_steps_cluster, the same body for a member that is one cluster).
    Epoch,
}

impl Module {
    /// Every module.
    pub const ALL: [Module; 4] = [Module::Env, Module::Dqn, Module::Eval, Module::Epoch];

    /// The module's name (in compile errors and the module cache).
    pub fn name(self) -> &'static str {
        match self {
            Module::Env => "env",
            Module::Dqn => "dqn",
            Module::Eval => "eval",
            Module::Epoch => "epoch",
        }
    }

    /// The module's source files, in the order they are compiled as one unit: each file's name
    /// under kernels/ and its text as built into the binary.
    pub fn files(self) -> &'static [(&'static str, &'static str)] {
        macro_rules! files {
            ($($f:literal),*) => { &[$(($f, include_str!(concat!("../kernels/", $f)))),*] };
        }
        match self {
            Module::Env => files!("philox.cuh", "env.cuh", "env_step.cu", "replay.cu"),
            Module::Dqn => files!("philox.cuh", "dqn.cuh", "dqn.cu"),
            Module::Eval => files!("env.cuh", "sync.cuh", "eval.cu"),
            Module::Epoch => files!(
                "philox.cuh",
                "env.cuh",
                "env_step.cu",
                "replay.cu",
                "dqn.cuh",
                "sync.cuh",
                "epoch.cu"
            ),
        }
    }

    /// The module's CUDA source: its files as built in, or, where the environment variable
    /// [`SOURCES_ENV`] names a folder, as they are in that folder now. The override is for
    /// kernel work on a machine without a Rust toolchain (a GPU host the binaries are copied
    /// to): a changed kernel is tried without a rebuild. The kernel cache keys on the text, so
    /// the two never mix.
    pub fn source(self) -> Result<Cow<'static, str>, GpuError> {
        let Some(dir) = std::env::var_os(SOURCES_ENV) else {
            let mut text = String::new();
            for (_, f) in self.files() {
                text.push_str(f);
            }
            return Ok(Cow::Owned(text));
        };
        let dir = PathBuf::from(dir);
        let mut text = String::new();
        for (name, _) in self.files() {
            let path = dir.join(name);
            let f = std::fs::read_to_string(&path).map_err(|e| {
                GpuError::Shape(format!(
                    "{SOURCES_ENV}: cannot read kernel source {}: {e}",
                    path.display()
                ))
            })?;
            text.push_str(&f);
        }
        Ok(Cow::Owned(text))
    }
}

/// The environment variable that points kernel compilation at a folder of sources
/// ([`Module::source`]).
pub const SOURCES_ENV: &str = "FOXHUNT_KERNEL_SOURCES";
