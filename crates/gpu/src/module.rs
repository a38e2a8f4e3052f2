//! The kernel modules: each a CUDA source compiled by NVRTC as one unit, named by a typed id.
//! The sources live in this crate's kernels/ folder and are embedded in the binary.

/// A kernel module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Module {
    /// The trading environment (env_reset, env_step, env_step_record) and the replay sampler
    /// (replay_sample), which rebuilds observations with the environment's `observe`.
    Env,
    /// The fused DQN engine: forward, loss, backward, Adam, target update, action selection.
    Dqn,
    /// Greedy evaluation: a dense Q-network's decisions over a split, as the host's (eval_flat,
    /// eval_scan), with the environment's transition.
    Eval,
}

impl Module {
    /// Every module.
    pub const ALL: [Module; 3] = [Module::Env, Module::Dqn, Module::Eval];

    /// The module's name (in compile errors and the module cache).
    pub fn name(self) -> &'static str {
        match self {
            Module::Env => "env",
            Module::Dqn => "dqn",
            Module::Eval => "eval",
        }
    }

    /// The module's CUDA source.
    pub fn source(self) -> &'static str {
        match self {
            Module::Env => concat!(
                include_str!("../kernels/philox.cuh"),
                include_str!("../kernels/env.cuh"),
                include_str!("../kernels/env_step.cu"),
                include_str!("../kernels/replay.cu")
            ),
            Module::Dqn => concat!(
                include_str!("../kernels/philox.cuh"),
                include_str!("../kernels/dqn.cu")
            ),
            Module::Eval => concat!(
                include_str!("../kernels/env.cuh"),
                include_str!("../kernels/eval.cu")
            ),
        }
    }
}
