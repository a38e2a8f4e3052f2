//! Greedy evaluation on the device: the decisions of a dense Q-network's greedy policy at every
//! bar of a split of the resident window, equal to the host's (kernels/eval.cu says how), for the
//! host's backtest bookkeeping to turn into metrics.

use std::ops::Range;
use std::sync::Arc;

use foxhunt_env::{EnvConfig, Execution, SessionRule};
use foxhunt_gpu::{DeviceBuffer, GpuContext, Grid, Kernel, Launch, Module};

use crate::MemoryError;
use crate::device::{DeviceWindow, OnStream};

/// A dense Q-network on the device as the evaluation kernels read it: the parameters, flat in
/// foxhunt-dqn's `AgentState` order, and the layout words that say where each layer lies
/// (foxhunt-dqn's `fused::layout_words`).
pub struct NetOnDevice<'a> {
    /// The parameters.
    pub params: &'a DeviceBuffer<f32>,
    /// The layout words.
    pub layout: &'a DeviceBuffer<u64>,
    /// Input floats.
    pub obs_dim: usize,
    /// The widest row a layer reads or writes (hidden widths, actions + 1).
    pub max_width: usize,
}

/// Why the device cannot decide exactly as the host for this environment, if it cannot: holding
/// across sessions links every session to the one before (no parallel walk).
pub fn unsupported_env(env: &EnvConfig) -> Option<String> {
    (env.session_rule != SessionRule::FlattenAtClose)
        .then(|| "positions held across sessions (the device walks sessions apart)".to_owned())
}

/// Bars decided per round of the walk (and per block of the flat pass).
const ROWS: usize = 16;
/// Threads per block.
const THREADS: u32 = 1024;
/// Dynamic shared memory a block may use without opting in to more.
const SHARED_LIMIT: usize = 48 * 1024;

/// The device's greedy evaluator over one window: its kernels and buffers sized for the longest
/// split it is asked about.
pub struct DeviceEvaluator<'a> {
    ctx: Arc<GpuContext>,
    window: &'a DeviceWindow,
    exec: Execution,
    env: EnvConfig,
    flat_fn: Kernel,
    scan_fn: Kernel,
    flat: DeviceBuffer<i8>,
    targets: DeviceBuffer<i8>,
    sess_start: DeviceBuffer<u32>,
    sess_end: DeviceBuffer<u32>,
    /// The first row of every session of the window.
    session_rows: Vec<usize>,
}

impl<'a> DeviceEvaluator<'a> {
    /// An evaluator over `arena` for environment `env` (which [`unsupported_env`] accepts).
    pub fn new(
        arena: impl Into<OnStream<'a>>,
        env: &EnvConfig,
        session: &[u32],
    ) -> Result<Self, MemoryError> {
        if let Some(why) = unsupported_env(env) {
            return Err(MemoryError::Config(format!("device evaluation: {why}")));
        }
        let arena = arena.into();
        let ctx = arena.context().clone();
        let rows = arena.rows();
        if session.len() != rows {
            return Err(MemoryError::Config(format!(
                "{} session indices for a window of {rows} rows",
                session.len()
            )));
        }
        let session_rows = (0..rows)
            .filter(|&t| t == 0 || session[t] != session[t - 1])
            .collect();
        Ok(Self {
            flat_fn: ctx.kernel(Module::Eval, "eval_flat")?,
            scan_fn: ctx.kernel(Module::Eval, "eval_scan")?,
            flat: ctx.alloc(rows)?,
            targets: ctx.alloc(rows)?,
            sess_start: ctx.alloc(rows.max(1))?,
            sess_end: ctx.alloc(rows.max(1))?,
            window: arena.buffers(),
            exec: *arena.exec(),
            env: env.clone(),
            session_rows,
            ctx,
        })
    }

    /// The sessions of `split`, each as its rows (a session cut by the split's edges keeps the
    /// part inside).
    fn sessions(&self, split: &Range<usize>) -> (Vec<u32>, Vec<u32>) {
        let mut starts = vec![split.start as u32];
        starts.extend(
            self.session_rows
                .iter()
                .filter(|&&t| t > split.start && t < split.end)
                .map(|&t| t as u32),
        );
        let mut ends: Vec<u32> = starts[1..].to_vec();
        ends.push(split.end as u32);
        (starts, ends)
    }

    /// The target position the greedy policy of `net` decides at every bar of `split`
    /// (`targets[t - split.start]`), read back (waits for the device).
    pub fn targets(
        &mut self,
        net: &NetOnDevice<'_>,
        split: Range<usize>,
    ) -> Result<Vec<i8>, MemoryError> {
        let w = self.window;
        if split.is_empty() || split.end > w.rows {
            return Err(MemoryError::Config(format!(
                "evaluation split {split:?} of a window of {} rows",
                w.rows
            )));
        }
        let dim = self.env.obs_dim(w.cols);
        if net.obs_dim != dim {
            return Err(MemoryError::Config(format!(
                "a network of {} inputs for observations of {dim}",
                net.obs_dim
            )));
        }
        // Shared memory per block: observations, two scratch rows sets, statistics, actions.
        let rows = (1..=ROWS)
            .rev()
            .find(|&r| 4 * (r * dim + 2 * r * net.max_width + 3 * r) <= SHARED_LIMIT)
            .ok_or_else(|| {
                MemoryError::Config(format!(
                    "layers of {} units are too wide for device evaluation",
                    net.max_width
                ))
            })?;
        let shared = (4 * (rows * dim + 2 * rows * net.max_width + 3 * rows)) as u32;
        let (starts, ends) = self.sessions(&split);
        let n_sessions = starts.len() as u32;
        self.ctx.write(&mut self.sess_start, &starts)?;
        self.ctx.write(&mut self.sess_end, &ends)?;
        let (split_start, split_end) = (split.start as u32, split.end as u32);
        let scalars = Scalars {
            cols: w.cols as u32,
            lookback: self.env.lookback as u32,
            max_position: i32::from(self.env.max_position),
            upnl_scale: self.env.upnl_scale,
            tick_size: self.exec.tick_size,
            max_width: net.max_width as u32,
            rows: rows as u32,
        };
        let l = params(self.ctx.launch(&self.flat_fn), w, &scalars, net)
            .value(&split_start)
            .value(&split_end)
            .output(&mut self.flat);
        let blocks = split.len().div_ceil(rows) as u32;
        // SAFETY: eval_flat(EVAL_PARAMS, split_start, split_end, flat_target) in
        // kernels/eval.cu; the market buffers hold the window's rows and the split lies inside
        // them (checked above); the layout words describe `params` (made together by
        // foxhunt-dqn); each block decides `rows` bars, writing flat[t - split_start] for its
        // own bars, and the grid covers the split; the dynamic shared memory holds rows
        // observations, two rows x max_width scratch sets, 2 x rows statistics and rows actions.
        unsafe {
            l.run(Grid {
                blocks,
                threads: THREADS,
                shared_bytes: shared,
            })
        }?;
        let (mult, cost, slip) = (
            self.exec.multiplier,
            self.exec.cost_per_side,
            self.exec.slippage_price,
        );
        let l = params(self.ctx.launch(&self.scan_fn), w, &scalars, net)
            .value(&split_start)
            .value(&split_end)
            .value(&mult)
            .value(&cost)
            .value(&slip)
            .input(&self.sess_start)
            .input(&self.sess_end)
            .value(&n_sessions)
            .input(&self.flat)
            .output(&mut self.targets);
        // SAFETY: eval_scan(EVAL_PARAMS, split_start, split_end, multiplier, cost_per_side,
        // slippage_price, sess_start, sess_end, n_sessions, flat_target, targets); one block per
        // session, whose rows [sess_start, sess_end) lie in the split and which writes only
        // targets of its own rows; flat holds the split's flat decisions (written above, same
        // stream); shared memory as for eval_flat.
        unsafe {
            l.run(Grid {
                blocks: n_sessions,
                threads: THREADS,
                shared_bytes: shared,
            })
        }?;
        Ok(self.ctx.download_prefix(&self.targets, split.len())?)
    }
}

/// The scalars both kernels take after the market buffers.
struct Scalars {
    cols: u32,
    lookback: u32,
    max_position: i32,
    upnl_scale: f32,
    tick_size: f64,
    max_width: u32,
    rows: u32,
}

/// Pushes EVAL_PARAMS (kernels/eval.cu) in order.
fn params<'l>(
    l: Launch<'l>,
    w: &'l DeviceWindow,
    s: &'l Scalars,
    net: &'l NetOnDevice<'_>,
) -> Launch<'l> {
    l.input(&w.features)
        .input(&w.open)
        .input(&w.close)
        .input(&w.session)
        .input(&w.contract)
        .value(&s.cols)
        .value(&s.lookback)
        .value(&s.max_position)
        .value(&s.upnl_scale)
        .value(&s.tick_size)
        .input(net.params)
        .input(net.layout)
        .value(&s.max_width)
        .value(&s.rows)
}
