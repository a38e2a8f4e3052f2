//! Greedy evaluation on the device: the decisions of a dense Q-network's greedy policy at every
//! bar of a split of the resident window, equal to the host's, and the backtest's metrics booked
//! from them as the host books them (kernels/eval.cu says how both stay exact).

use std::ops::Range;
use std::sync::Arc;

use foxhunt_env::{EnvConfig, Execution, MetricParts, Metrics, SessionRule};
use foxhunt_gpu::{DeviceBuffer, Elem, EventMarks, GpuContext, Grid, Kernel, Launch, Module};

use crate::MemoryError;
use crate::device::{DeviceWindow, OnStream};

/// A dense Q-network on the device as the evaluation kernels read it: the parameters, flat in
/// foxhunt-dqn's `AgentState` order, and the layout words that say where each layer lies
/// (foxhunt-dqn's `fused::layout_words`).
#[derive(Clone, Copy)]
pub struct NetOnDevice<'a> {
    /// The parameters.
    pub params: &'a DeviceBuffer<f32>,
    /// The layout words.
    pub layout: &'a DeviceBuffer<u64>,
    /// Input floats.
    pub obs_dim: usize,
    /// The widest row a layer reads or writes (hidden widths, actions + 1).
    pub max_width: usize,
    /// Units of the first hidden layer (0 without hidden layers), as the layout words say: the
    /// evaluator sizes the flat pass's first-layer sums by it, and the kernels write that layer's
    /// width a bar.
    pub first_width: usize,
}

impl NetOnDevice<'_> {
    /// The network as the kernels take it, queued on `ctx`'s stream.
    pub(crate) fn member(&self, ctx: &GpuContext) -> MemberNet {
        MemberNet {
            params: ctx.address(self.params),
            layout: ctx.address(self.layout),
            n_params: self.params.len(),
            obs_dim: self.obs_dim,
            max_width: self.max_width,
            first_width: self.first_width,
        }
    }
}

/// A network by its device addresses (a member of a population's evaluation): what
/// [`NetOnDevice`] says, with the buffers' addresses in place of their borrows. Whoever makes
/// one keeps the buffers alive and unwritten until the evaluation given it has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberNet {
    /// The parameters' address (`n_params` floats).
    pub params: u64,
    /// The layout words' address.
    pub layout: u64,
    /// Parameters.
    pub n_params: usize,
    /// As [`NetOnDevice`]'s fields of the same names.
    pub obs_dim: usize,
    /// The widest row.
    pub max_width: usize,
    /// Units of the first hidden layer.
    pub first_width: usize,
}

impl MemberNet {
    /// The dimensions that size the kernels' blocks: equal for every member of one evaluation.
    fn shape(&self) -> (usize, usize, usize, usize) {
        (
            self.n_params,
            self.obs_dim,
            self.max_width,
            self.first_width,
        )
    }

    /// Whether `other` can be judged in one evaluation with this network.
    pub(crate) fn same_shape(&self, other: &MemberNet) -> bool {
        self.shape() == other.shape()
    }
}

/// Why the device cannot decide exactly as the host for this environment, if it cannot: holding
/// across sessions links every session to the one before (no parallel walk).
pub fn unsupported_env(env: &EnvConfig) -> Option<String> {
    (env.session_rule != SessionRule::FlattenAtClose)
        .then(|| "positions held across sessions (the device walks sessions apart)".to_owned())
}

/// Bars a warp of eval_flat decides at once (kernels/eval.cu's EVAL_R).
const ROWS: usize = 4;
/// Threads of eval_flat's block at most (EVAL_THREADS_MAX).
const THREADS_MAX: u32 = 512;
/// Bars of a chunk that one warp walks from a flat start (eval_chunks), by default for one
/// network: short chunks shorten the walks, long ones leave the stitch fewer chunk starts to
/// mend.
pub const CHUNK_BARS: usize = 64;

/// Chunk walks a multiprocessor takes, about, when many networks are judged together.
const CHUNKS_PER_SM: usize = 64;
/// The longest chunk the evaluator chooses.
const MAX_CHUNK_BARS: usize = 4096;

/// Bars of a chunk when `networks` networks judge a split of `bars` bars together on a device
/// of `sms` multiprocessors, by default: [`CHUNK_BARS`], or longer where the networks' chunk
/// walks would be more than [`CHUNKS_PER_SM`] a multiprocessor (up to [`MAX_CHUNK_BARS`]). Once
/// the walks fill the device, every chunk start the stitch mends is work on top: on the H200 a
/// month of 27,859 bars was judged by 64 networks in 19.0 ms with chunks of 256 bars against
/// 20.6 with 64, by 256 networks in 61.1 ms with 1,024 against 74.4; a month of 8,198 bars by
/// 64 networks in 6.8 ms with 64 against 7.3 with 256 (docs/PERFORMANCE.md, #16). Every value
/// gives the same decisions.
pub fn chunk_bars_for(networks: usize, bars: usize, sms: usize) -> usize {
    (networks * bars)
        .div_ceil(CHUNKS_PER_SM * sms.max(1))
        .clamp(CHUNK_BARS, MAX_CHUNK_BARS)
}
/// Threads of a chunk walk's block (eval_chunks), by default: small, so that every chunk's
/// block is resident at once. Wider blocks shorten a long round but fit fewer walks: 256
/// judged one network's month 1.3% faster and 64 networks' 12-24% slower on an H100
/// (docs/PERFORMANCE.md, 2026-12-06).
pub const WALK_THREADS: u32 = 128;
/// Bars a chunk walk decides a round in a position at most, by default (from a quarter of them
/// in a hold's first round, doubling while the position is held through a round).
pub const WALK_ROWS: u32 = 8;
/// Threads of the stitch's blocks (eval_stitch).
const STITCH_THREADS: u32 = 1024;
/// Blocks of a stitch team at most, and the bars a team's round decides at most (eval.cu's
/// EVAL_ROUND_ROWS).
const TEAM_MAX: u32 = 16;
const ROUND_ROWS: u32 = 256;
/// Bars each block of a stitch team decides a round at most, by default (a hold's rounds start
/// at a quarter of it and double while the position is held through them).
const TEAM_ROWS: u32 = 16;
/// Bytes of shared memory the evaluation kernels declare statically, at most (with a margin).
const STATIC_SHARED: u32 = 4096 + 13 * ROUND_ROWS;
/// Warps of a book_sessions block, each booking a slice of its session (eval.cu's BOOK_WARPS,
/// the most it takes).
pub const BOOK_WARPS: u32 = 8;
/// Blocks of a book_total row, one cluster, each summing a run of the split's rows (eval.cu's
/// BOOK_BLOCKS, the most it takes); one block where the device runs no such cluster.
pub const BOOK_BLOCKS: u32 = 8;
/// Threads of a book_total block.
const BOOK_THREADS: u32 = 1024;

/// The tables of one split: its sessions and their chunks, on the device.
struct SplitTables {
    split: Range<usize>,
    chunk_bars: usize,
    sessions: u32,
    chunks: u32,
}

/// A split's booked results, as book_total leaves them: enough for the backtest's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceBook {
    /// The capital the drawdown fraction was stated on.
    pub capital: f64,
    /// Bars of the split.
    pub bars: usize,
    /// Net PnL of each trading day (session), in order.
    pub daily_pnl: Vec<f64>,
    /// Largest fall of equity from a running peak.
    pub max_drawdown: f64,
    /// Maximum drawdown as a fraction of capital + peak.
    pub max_drawdown_fraction: f64,
    /// Closed trades.
    pub trades: u64,
    /// Closed trades with a positive PnL.
    pub winning_trades: u64,
    /// Bars the closed trades were held, summed.
    pub bars_held: u64,
    /// Contracts traded.
    pub contracts_traded: u64,
    /// Costs paid.
    pub total_costs: f64,
    /// Whether the equity curve was summed in parallel (exact for this split's steps) rather
    /// than as one chain.
    pub parallel_equity: bool,
}

impl DeviceBook {
    /// The backtest's metrics, computed as foxhunt-env computes them from a host backtest.
    pub fn metrics(&self) -> Metrics {
        Metrics::from_parts(&MetricParts {
            daily_pnl: &self.daily_pnl,
            max_drawdown: self.max_drawdown,
            max_drawdown_fraction: self.max_drawdown_fraction,
            trades: self.trades as usize,
            winning_trades: self.winning_trades as usize,
            bars_held: self.bars_held,
            capital: self.capital,
            contracts_traded: self.contracts_traded,
            total_costs: self.total_costs,
            bars: self.bars,
        })
    }
}

/// The evaluation's kernels.
struct Kernels {
    flat: Kernel,
    chunks: Kernel,
    stitch: Kernel,
    book_steps: Kernel,
    book_sessions: Kernel,
    book_total: Kernel,
}

/// The device's greedy evaluator over one window: its kernels and buffers sized for the window's
/// rows, and the tables of the split it was last asked about (the validation split, every
/// epoch).
pub struct DeviceEvaluator<'a> {
    ctx: Arc<GpuContext>,
    window: &'a DeviceWindow,
    exec: Execution,
    env: EnvConfig,
    k: Kernels,
    /// Multiprocessors, and dynamic shared memory a block may have.
    sms: u32,
    shared_max: u32,
    /// Per bar of the window.
    flat: DeviceBuffer<i8>,
    /// Per bar, the first hidden layer's sums in the flat state (eval_flat's, for the walks).
    first_sums: DeviceBuffer<f32>,
    /// Whether the walks start from `first_sums` (else they sum the first layer again).
    first_reuse: bool,
    targets: DeviceBuffer<i8>,
    /// Decisions given to [`DeviceEvaluator::book_targets`].
    given: DeviceBuffer<i8>,
    w_target: DeviceBuffer<i8>,
    w_pos: DeviceBuffer<i8>,
    w_entry: DeviceBuffer<f64>,
    /// Per chunk.
    chunk_start: DeviceBuffer<u32>,
    chunk_end: DeviceBuffer<u32>,
    w_end_pos: DeviceBuffer<i8>,
    w_end_entry: DeviceBuffer<f64>,
    /// Per session: rows and first chunk.
    sess_start: DeviceBuffer<u32>,
    sess_end: DeviceBuffer<u32>,
    sess_chunk: DeviceBuffer<u32>,
    /// The stitch teams' exchanged actions and barriers (two words a team, zero when new and
    /// after every barrier).
    team_act: DeviceBuffer<i32>,
    team_bar: DeviceBuffer<u32>,
    /// Blocks a stitch team and rows a block, when set for measuring (else [`Stitch::auto`]).
    stitch: Option<Stitch>,
    /// Rows a chunk walk decides a round at most.
    walk_rows: u32,
    /// Threads of a chunk walk's block.
    walk_threads: u32,
    book: BookBuffers,
    /// The first row of every session of the window.
    session_rows: Vec<usize>,
    tables: Option<SplitTables>,
    /// Bars a chunk, where set (measuring); else [`chunk_bars_for`] the networks and split.
    chunk_bars: Option<usize>,
    chain_only: bool,
    /// Warps of a book_sessions block (a session's), where set (measuring); else [`BOOK_WARPS`].
    book_warps: Option<u32>,
    /// Blocks of a book_total row, where set (measuring); else [`BOOK_BLOCKS`].
    book_blocks: Option<u32>,
    /// Whether stitch teams may be thread-block clusters (on by default; off for measuring).
    stitch_clusters: bool,
    /// Timestamps between the kernels, when asked for (measuring).
    marks: Option<EventMarks>,
    /// A population's member table: each member's parameters' and layout's addresses.
    members: DeviceBuffer<u64>,
}

/// The booking's scratch (kernels/eval.cu's book_sessions and book_total).
struct BookBuffers {
    /// Per bar: each step's hold PnL, bar PnL, cost, and its packed contracts and positions.
    step_hold: DeviceBuffer<f64>,
    step_bar: DeviceBuffer<f64>,
    step_cost: DeviceBuffer<f64>,
    step_word: DeviceBuffer<u32>,
    daily: DeviceBuffer<f64>,
    n_pnl: DeviceBuffer<u32>,
    n_cost: DeviceBuffer<u32>,
    trades: DeviceBuffer<u64>,
    wins: DeviceBuffer<u64>,
    bars: DeviceBuffer<u64>,
    contracts: DeviceBuffer<u64>,
    pnl: DeviceBuffer<f64>,
    seen: DeviceBuffer<u8>,
    cost: DeviceBuffer<f64>,
    e: DeviceBuffer<f64>,
    out: DeviceBuffer<f64>,
}

impl BookBuffers {
    fn new(ctx: &GpuContext) -> Result<Self, MemoryError> {
        Ok(Self {
            step_hold: ctx.alloc(0)?,
            step_bar: ctx.alloc(0)?,
            step_cost: ctx.alloc(0)?,
            step_word: ctx.alloc(0)?,
            daily: ctx.alloc(0)?,
            n_pnl: ctx.alloc(0)?,
            n_cost: ctx.alloc(0)?,
            trades: ctx.alloc(0)?,
            wins: ctx.alloc(0)?,
            bars: ctx.alloc(0)?,
            contracts: ctx.alloc(0)?,
            pnl: ctx.alloc(0)?,
            seen: ctx.alloc(0)?,
            cost: ctx.alloc(0)?,
            e: ctx.alloc(0)?,
            out: ctx.alloc(0)?,
        })
    }

    /// Room for `members` splits of `bars` bars in `sessions` sessions in all.
    fn fit(
        &mut self,
        ctx: &GpuContext,
        bars: usize,
        sessions: usize,
        members: usize,
    ) -> Result<(), MemoryError> {
        fit(ctx, &mut self.step_hold, bars)?;
        fit(ctx, &mut self.step_bar, bars)?;
        fit(ctx, &mut self.step_cost, bars)?;
        fit(ctx, &mut self.step_word, bars)?;
        fit(ctx, &mut self.pnl, bars)?;
        fit(ctx, &mut self.seen, bars)?;
        fit(ctx, &mut self.cost, bars)?;
        fit(ctx, &mut self.e, bars)?;
        fit(ctx, &mut self.daily, sessions)?;
        fit(ctx, &mut self.n_pnl, sessions)?;
        fit(ctx, &mut self.n_cost, sessions)?;
        fit(ctx, &mut self.trades, sessions)?;
        fit(ctx, &mut self.wins, sessions)?;
        fit(ctx, &mut self.bars, sessions)?;
        fit(ctx, &mut self.contracts, sessions)?;
        fit(ctx, &mut self.out, sessions + 8 * members)
    }
}

/// Makes `buf` hold at least `len` elements: a new (zeroed) buffer when it has room for fewer.
/// The evaluation's buffers grow to the largest split asked about, not to the window.
fn fit<T: Elem>(
    ctx: &GpuContext,
    buf: &mut DeviceBuffer<T>,
    len: usize,
) -> Result<(), MemoryError> {
    if buf.capacity() < len {
        *buf = ctx.alloc(len)?;
    }
    Ok(())
}

/// A walking kernel's blocks: threads, the rows a network pass decides, and whether the
/// parameters are in shared memory beside the scratch.
struct BlockLayout {
    threads: u32,
    rows: u32,
    params_shared: u32,
    shared_bytes: u32,
}

impl BlockLayout {
    fn grid(&self, blocks: u32) -> Grid {
        Grid {
            blocks: blocks.max(1),
            threads: self.threads,
            shared_bytes: self.shared_bytes,
        }
    }
}

/// The stitch's teams: blocks a session and bars each block decides a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stitch {
    /// Blocks that follow one session's path together (1 to 16).
    pub team: u32,
    /// Bars each of them decides a round at most (1 to 32; team x rows at most 256): a hold's
    /// first round decides a quarter of them (at least one), and each round the position is
    /// held through decides twice as many as the one before, up to `rows`.
    pub rows: u32,
}

impl Stitch {
    /// The default for `sessions` sessions on a device that holds `resident` stitch blocks at
    /// once: every session's team resident together, as wide as that allows.
    pub fn auto(sessions: u32, resident: u32) -> Self {
        let team = (resident / sessions.max(1)).clamp(1, TEAM_MAX);
        Self {
            team,
            rows: if team == 1 { EVAL_WALK_ROWS } else { TEAM_ROWS },
        }
    }

    fn check(self) -> Result<Self, MemoryError> {
        if !(1..=TEAM_MAX).contains(&self.team)
            || !(1..=EVAL_WALK_ROWS).contains(&self.rows)
            || self.team * self.rows > ROUND_ROWS
        {
            return Err(MemoryError::Config(format!(
                "a stitch of {} blocks of {} rows (1 to {TEAM_MAX} blocks of 1 to \
                 {EVAL_WALK_ROWS} rows, {ROUND_ROWS} rows in all)",
                self.team, self.rows
            )));
        }
        Ok(self)
    }
}

/// Bars a walk's block decides in a hold's first round when it may decide `rows` at most; each
/// round the position is held through doubles it. A chunk walk starts at a quarter (at least
/// one), so that short holds take quick rounds. The stitch starts at half: the holds it follows
/// are the ones that outlast a chunk's start, and each of its rounds ends at a team barrier
/// (measured against a quarter and a whole on an H100, 2026-12-06: 3% less a judge summed over
/// the bench's four agents; docs/PERFORMANCE.md).
fn first_rows(rows: u32, walk: Walk) -> u32 {
    match walk {
        Walk::Chunk => (rows / 4).max(1),
        Walk::Stitch => (rows / 2).max(1),
    }
}

/// Which walk a round's width is for ([`first_rows`]).
#[derive(Debug, Clone, Copy)]
enum Walk {
    /// A chunk walked from a flat start (`eval_chunks`).
    Chunk,
    /// A session's true path (`eval_stitch`).
    Stitch,
}

/// Rows a walking block decides a network pass at most (bounded by eval.cu's EVAL_ROUND_ROWS
/// over a team's blocks; `Stitch::check` holds it).
const EVAL_WALK_ROWS: u32 = 32;

/// How a kernel's blocks are laid out: warps, and whether the parameters fit in shared memory
/// beside every warp's scratch.
struct Layout {
    warps: u32,
    params_shared: u32,
    shared_bytes: u32,
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
        let k = Kernels {
            flat: ctx.kernel(Module::Eval, "eval_flat")?,
            chunks: ctx.kernel(Module::Eval, "eval_chunks")?,
            stitch: ctx.kernel(Module::Eval, "eval_stitch")?,
            book_steps: ctx.kernel(Module::Eval, "book_steps")?,
            book_sessions: ctx.kernel(Module::Eval, "book_sessions")?,
            book_total: ctx.kernel(Module::Eval, "book_total")?,
        };
        // What a block may take beside the kernels' own static shared memory: a few words,
        // and a round's merge states and actions in the walks (EVAL_ROUND_ROWS x 13 bytes).
        let shared_max = ctx.max_shared_per_block()?.saturating_sub(STATIC_SHARED);
        for f in [&k.flat, &k.chunks, &k.stitch] {
            f.allow_shared(shared_max)?;
        }
        Ok(Self {
            sms: ctx.sm_count()?,
            shared_max,
            k,
            // Sized for a split when the first is asked about (`prepare`).
            flat: ctx.alloc(0)?,
            first_sums: ctx.alloc(0)?,
            first_reuse: true,
            targets: ctx.alloc(0)?,
            given: ctx.alloc(0)?,
            w_target: ctx.alloc(0)?,
            w_pos: ctx.alloc(0)?,
            w_entry: ctx.alloc(0)?,
            chunk_start: ctx.alloc(0)?,
            chunk_end: ctx.alloc(0)?,
            w_end_pos: ctx.alloc(0)?,
            w_end_entry: ctx.alloc(0)?,
            sess_start: ctx.alloc(0)?,
            sess_end: ctx.alloc(0)?,
            sess_chunk: ctx.alloc(0)?,
            team_act: ctx.alloc(0)?,
            team_bar: ctx.alloc(0)?,
            stitch: None,
            walk_rows: WALK_ROWS,
            walk_threads: WALK_THREADS,
            book: BookBuffers::new(&ctx)?,
            window: arena.buffers(),
            exec: *arena.exec(),
            env: env.clone(),
            session_rows,
            tables: None,
            chunk_bars: None,
            chain_only: false,
            book_warps: None,
            book_blocks: None,
            stitch_clusters: true,
            marks: None,
            members: ctx.alloc(0)?,
            ctx,
        })
    }

    /// Bars per chunk of the walk (for measuring; `None`: [`chunk_bars_for`] the networks
    /// judged and the split, the default). Every value gives the same decisions.
    pub fn set_chunk_bars(&mut self, bars: Option<usize>) {
        self.chunk_bars = bars.map(|b| b.max(1));
    }

    /// The stitch's teams (for measuring and tests; `None`: [`Stitch::auto`], the default).
    /// Every value gives the same decisions.
    pub fn set_stitch(&mut self, stitch: Option<Stitch>) -> Result<(), MemoryError> {
        self.stitch = stitch.map(Stitch::check).transpose()?;
        Ok(())
    }

    /// Bars a chunk walk decides a round at most (for measuring; [`WALK_ROWS`] by default, 1 to
    /// 32). Every value gives the same decisions.
    pub fn set_walk_rows(&mut self, rows: u32) {
        self.walk_rows = rows.clamp(1, EVAL_WALK_ROWS);
    }

    /// Threads of a chunk walk's block (for measuring and tests; [`WALK_THREADS`] by default;
    /// 32 to 1,024, a multiple of 32, else refused). Every value gives the same decisions.
    pub fn set_walk_threads(&mut self, threads: u32) -> Result<(), MemoryError> {
        if !(32..=1024).contains(&threads) || !threads.is_multiple_of(32) {
            return Err(MemoryError::Config(format!(
                "a chunk walk's block of {threads} threads (32 to 1,024, a multiple of 32)"
            )));
        }
        self.walk_threads = threads;
        Ok(())
    }

    /// Whether the walks in a position take the first hidden layer's sums from the flat pass
    /// and add only the state's two inputs (the default), or sum every input again (for
    /// measuring). Both give the same decisions.
    pub fn set_first_layer_reuse(&mut self, on: bool) {
        self.first_reuse = on;
    }

    /// Sums the equity as one chain even where the parallel sum is exact (for measuring).
    pub fn set_chain_only(&mut self, on: bool) {
        self.chain_only = on;
    }

    /// Warps booking a session side by side, each a slice of it (for measuring; `None`:
    /// [`BOOK_WARPS`], the default; 1 to [`BOOK_WARPS`]). Every value books the same metrics.
    pub fn set_book_warps(&mut self, warps: Option<u32>) {
        self.book_warps = warps.map(|w| w.clamp(1, BOOK_WARPS));
    }

    /// Blocks summing a split's rows side by side, one cluster (for measuring and tests;
    /// `None`: [`BOOK_BLOCKS`], the default; 1 to [`BOOK_BLOCKS`], and 1 where the device runs
    /// no cluster of that many). Every value books the same metrics.
    pub fn set_book_blocks(&mut self, blocks: Option<u32>) {
        self.book_blocks = blocks.map(|b| b.clamp(1, BOOK_BLOCKS));
    }

    /// The blocks of a book_total row: those asked for where the device runs them as one
    /// cluster, else one.
    fn book_total_blocks(&self) -> Result<u32, MemoryError> {
        let want = self.book_blocks.unwrap_or(BOOK_BLOCKS);
        if want == 1 {
            return Ok(1);
        }
        let grid = Grid {
            blocks: want,
            threads: BOOK_THREADS,
            shared_bytes: 0,
        };
        Ok(if self.k.book_total.max_clusters(&self.ctx, grid)? >= 1 {
            want
        } else {
            1
        })
    }

    /// Whether a stitch team of several blocks is launched as one thread-block cluster where
    /// the device runs the teams so (the default), or meets at a barrier in global memory (for
    /// measuring and tests). Both give the same decisions.
    pub fn set_stitch_clusters(&mut self, on: bool) {
        self.stitch_clusters = on;
    }

    /// Records device timestamps between the kernels of every later call (for measuring).
    pub fn set_kernel_timing(&mut self, on: bool) {
        self.marks = on.then(|| self.ctx.marks());
    }

    /// Milliseconds each kernel of the last call took, in launch order (eval_flat, eval_chunks,
    /// eval_stitch, then book_steps, book_sessions and book_total for a judgement); empty unless
    /// [`DeviceEvaluator::set_kernel_timing`] is on.
    pub fn kernel_ms(&mut self) -> Result<Vec<f64>, MemoryError> {
        match self.marks.as_mut() {
            Some(m) => Ok(m.intervals()?),
            None => Ok(Vec::new()),
        }
    }

    /// The target position the greedy policy of `net` decides at every bar of `split`
    /// (`targets[t - split.start]`), read back (waits for the device).
    pub fn targets(
        &mut self,
        net: &NetOnDevice<'_>,
        split: Range<usize>,
    ) -> Result<Vec<i8>, MemoryError> {
        let net = net.member(&self.ctx);
        self.decide(&[net], &split)?;
        Ok(self.ctx.download_prefix(&self.targets, split.len())?)
    }

    /// [`DeviceEvaluator::targets`] of several networks of one shape at once (a population's),
    /// each network's decisions equal to its own evaluation's.
    pub fn targets_all(
        &mut self,
        nets: &[NetOnDevice<'_>],
        split: Range<usize>,
    ) -> Result<Vec<Vec<i8>>, MemoryError> {
        let members: Vec<MemberNet> = nets.iter().map(|n| n.member(&self.ctx)).collect();
        self.decide(&members, &split)?;
        let all = self
            .ctx
            .download_prefix(&self.targets, split.len() * members.len())?;
        Ok(all.chunks(split.len()).map(<[i8]>::to_vec).collect())
    }

    /// The backtest of the greedy policy of `net` over `split`, booked on the device: its
    /// metrics equal foxhunt-env's `backtest` of the same decisions with `capital` (waits for
    /// the device; one read of a few numbers).
    pub fn judge(
        &mut self,
        net: &NetOnDevice<'_>,
        split: Range<usize>,
        capital: f64,
    ) -> Result<Metrics, MemoryError> {
        let net = net.member(&self.ctx);
        self.decide(&[net], &split)?;
        let mut books = self.book(&split, capital, false, 1)?;
        Ok(books.remove(0).metrics())
    }

    /// [`DeviceEvaluator::judge`] of several networks of one shape at once (a population's):
    /// each one's metrics equal its own judgement's, in the order given.
    pub fn judge_all(
        &mut self,
        nets: &[NetOnDevice<'_>],
        split: Range<usize>,
        capital: f64,
    ) -> Result<Vec<Metrics>, MemoryError> {
        let members: Vec<MemberNet> = nets.iter().map(|n| n.member(&self.ctx)).collect();
        self.judge_members(&members, split, capital)
    }

    /// [`DeviceEvaluator::judge_all`] of networks given by address.
    pub(crate) fn judge_members(
        &mut self,
        members: &[MemberNet],
        split: Range<usize>,
        capital: f64,
    ) -> Result<Vec<Metrics>, MemoryError> {
        self.decide(members, &split)?;
        let books = self.book(&split, capital, false, members.len())?;
        Ok(books.iter().map(DeviceBook::metrics).collect())
    }

    /// The stream the evaluator queues its work on.
    pub(crate) fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The environment it decides in.
    pub(crate) fn env(&self) -> &EnvConfig {
        &self.env
    }

    /// Books decisions `targets` (one per bar of `split`, as [`DeviceEvaluator::targets`] gives
    /// them, each clamped to the position limit) on the device.
    pub fn book_targets(
        &mut self,
        targets: &[i8],
        split: Range<usize>,
        capital: f64,
    ) -> Result<DeviceBook, MemoryError> {
        self.check_split(&split)?;
        if targets.len() != split.len() {
            return Err(MemoryError::Config(format!(
                "{} decisions for a split of {} bars",
                targets.len(),
                split.len()
            )));
        }
        self.prepare(&split, 1)?;
        // The decisions of bar t live at t - split.start, the layout `decide` leaves.
        self.ctx.write(&mut self.given, targets)?;
        Ok(self.book(&split, capital, true, 1)?.remove(0))
    }

    fn check_split(&self, split: &Range<usize>) -> Result<(), MemoryError> {
        if split.is_empty() || split.end > self.window.rows {
            return Err(MemoryError::Config(format!(
                "evaluation split {split:?} of a window of {} rows",
                self.window.rows
            )));
        }
        Ok(())
    }

    /// The split's sessions and chunks on the device (kept while the split and chunk size stay),
    /// and room for `members` evaluations of it.
    fn prepare(&mut self, split: &Range<usize>, members: usize) -> Result<(), MemoryError> {
        let bars = self
            .chunk_bars
            .unwrap_or_else(|| chunk_bars_for(members, split.len(), self.sms as usize));
        if self
            .tables
            .as_ref()
            .is_none_or(|t| t.split != *split || t.chunk_bars != bars)
        {
            self.make_tables(split, bars)?;
        }
        let t = self.tables.as_ref().expect("made above");
        let (ctx, n) = (&self.ctx, split.len() * members);
        let (chunks, sessions) = (t.chunks as usize * members, t.sessions as usize * members);
        for b in [
            &mut self.flat,
            &mut self.targets,
            &mut self.w_target,
            &mut self.w_pos,
        ] {
            fit(ctx, b, n)?;
        }
        fit(ctx, &mut self.w_entry, n)?;
        fit(ctx, &mut self.w_end_pos, chunks)?;
        fit(ctx, &mut self.w_end_entry, chunks)?;
        self.book.fit(ctx, n, sessions, members)
    }

    /// The split's session and chunk tables (chunks of `bars` bars), written to the device.
    fn make_tables(&mut self, split: &Range<usize>, bars: usize) -> Result<(), MemoryError> {
        // Sessions cut by the split's edges keep the part inside.
        let mut starts = vec![split.start as u32];
        starts.extend(
            self.session_rows
                .iter()
                .filter(|&&t| t > split.start && t < split.end)
                .map(|&t| t as u32),
        );
        let mut ends: Vec<u32> = starts[1..].to_vec();
        ends.push(split.end as u32);
        let (mut c_start, mut c_end, mut first_chunk) = (Vec::new(), Vec::new(), Vec::new());
        for (&s, &e) in starts.iter().zip(&ends) {
            first_chunk.push(c_start.len() as u32);
            let mut t = s;
            while t < e {
                let u = e.min(t + bars as u32);
                c_start.push(t);
                c_end.push(u);
                t = u;
            }
        }
        let ctx = &self.ctx;
        fit(ctx, &mut self.given, split.len())?;
        for b in [&mut self.chunk_start, &mut self.chunk_end] {
            fit(ctx, b, c_start.len())?;
        }
        for b in [
            &mut self.sess_start,
            &mut self.sess_end,
            &mut self.sess_chunk,
        ] {
            fit(ctx, b, starts.len())?;
        }
        self.ctx.write(&mut self.sess_start, &starts)?;
        self.ctx.write(&mut self.sess_end, &ends)?;
        self.ctx.write(&mut self.sess_chunk, &first_chunk)?;
        self.ctx.write(&mut self.chunk_start, &c_start)?;
        self.ctx.write(&mut self.chunk_end, &c_end)?;
        self.tables = Some(SplitTables {
            split: split.clone(),
            chunk_bars: bars,
            sessions: starts.len() as u32,
            chunks: c_start.len() as u32,
        });
        Ok(())
    }

    /// Blocks of `warps_wanted` warps at most, with the parameters in shared memory when they
    /// fit beside the warps' scratch.
    fn layout(&self, net: &MemberNet, warps_wanted: u32) -> Result<Layout, MemoryError> {
        let scratch = 4 * (ROWS * net.obs_dim + 2 * ROWS * net.max_width + 3 * ROWS) as u64;
        let params = 4 * (net.n_params as u64).next_multiple_of(4);
        let max = u64::from(self.shared_max);
        let warps_wanted = u64::from(warps_wanted.clamp(1, THREADS_MAX / 32));
        let fit = |base: u64| (max.saturating_sub(base) / scratch).min(warps_wanted);
        let (params_shared, warps) = match fit(params) {
            0 => (0, fit(0)),
            w => (1, w),
        };
        if warps == 0 {
            return Err(MemoryError::Config(format!(
                "layers of {} units are too wide for device evaluation",
                net.max_width
            )));
        }
        Ok(Layout {
            warps: warps as u32,
            params_shared,
            shared_bytes: (warps * scratch + u64::from(params_shared) * params) as u32,
        })
    }

    /// Decides every bar of `split` into `targets` (queued).
    fn decide(&mut self, nets: &[MemberNet], split: &Range<usize>) -> Result<(), MemoryError> {
        self.check_split(split)?;
        let Some(net) = nets.first() else {
            return Err(MemoryError::Config("an evaluation of no network".into()));
        };
        if let Some(other) = nets.iter().find(|m| m.shape() != net.shape()) {
            return Err(MemoryError::Config(format!(
                "networks of one evaluation differ in shape: {:?} and {:?} (parameters, inputs, \
                 widest row, first layer)",
                net.shape(),
                other.shape()
            )));
        }
        let w = self.window;
        let dim = self.env.obs_dim(w.cols);
        if net.obs_dim != dim {
            return Err(MemoryError::Config(format!(
                "a network of {} inputs for observations of {dim}",
                net.obs_dim
            )));
        }
        let rows = nets.len() as u32;
        self.prepare(split, nets.len())?;
        // One network: its own buffers (no table); several: a row of blocks each, its
        // addresses from the member table.
        let table = match rows {
            1 => None,
            _ => {
                let words: Vec<u64> = nets.iter().flat_map(|m| [m.params, m.layout]).collect();
                fit(&self.ctx, &mut self.members, words.len())?;
                self.ctx.write(&mut self.members, &words)?;
                Some(&self.members)
            }
        };
        let t = self.tables.as_ref().expect("prepared");
        let (sessions, chunks) = (t.sessions, t.chunks);
        let scalars = Scalars {
            cols: w.cols as u32,
            lookback: self.env.lookback as u32,
            max_position: i32::from(self.env.max_position),
            upnl_scale: self.env.upnl_scale,
            tick_size: self.exec.tick_size,
            n_params: net.n_params as u32,
            max_width: net.max_width as u32,
            split_start: split.start as u32,
            split_end: split.end as u32,
            multiplier: self.exec.multiplier,
            cost: self.exec.cost_per_side,
            slippage: self.exec.slippage_price,
        };
        let s = &scalars;
        let first_on = u32::from(self.first_reuse && net.first_width > 0);
        if first_on == 1 {
            fit(
                &self.ctx,
                &mut self.first_sums,
                split.len() * net.first_width * nets.len(),
            )?;
        }
        if let Some(m) = self.marks.as_mut() {
            m.restart()?;
        }

        // The flat decisions: warps over the whole device, R bars at a time.
        let lf = self.layout(net, 16)?;
        let groups = split.len().div_ceil(ROWS) as u64;
        // The device's share of each member (the warps stride over its bars).
        let blocks = (groups.div_ceil(u64::from(lf.warps)) as u32).min(
            (self.sms
                * self
                    .k
                    .flat
                    .blocks_per_sm(lf.warps * 32, lf.shared_bytes)?
                    .max(1)
                / rows)
                .max(1),
        );
        let l = params(
            self.ctx.launch(&self.k.flat),
            w,
            s,
            net,
            &lf.params_shared,
            table,
        )
        .value(&s.split_start)
        .value(&s.split_end)
        .output(&mut self.flat)
        .output(&mut self.first_sums)
        .value(&first_on);
        // SAFETY: eval_flat(EVAL_PARAMS, split_start, split_end, flat_target, first_sums,
        // first_on) in kernels/eval.cu; the market buffers hold the window's rows and the split
        // lies inside them (checked); each network's layout words describe its parameters (made
        // together by foxhunt-dqn; the caller keeps them alive and unwritten until the
        // evaluation has run), whose first hidden layer has first_width units, every network of
        // this shape (checked); the member table, given for several, holds each row's two
        // addresses; first_sums holds that many floats a bar of the split for every row when
        // first_on (fitted above) and is not read otherwise; every warp writes flat[t -
        // split_start] (and its first sums) of its own bars only, inside its row's part of
        // the split's rows (`prepare`); the dynamic shared memory holds the parameters when
        // params_shared and each warp's scratch (`layout`).
        unsafe { l.run_rows(grid(blocks, &lf), rows) }?;
        if let Some(m) = self.marks.as_mut() {
            m.mark()?;
        }

        // The chunks' walks, a small block each: all resident at once (they wait on latency).
        let lc = self.block_layout(net, self.walk_threads, Some(self.walk_rows), false)?;
        let walk_first = first_rows(lc.rows, Walk::Chunk);
        let l = walk_params(
            self.ctx.launch(&self.k.chunks),
            w,
            s,
            net,
            &lc,
            table,
            (&self.flat, &self.first_sums, &first_on),
        )
        .input(&self.chunk_start)
        .input(&self.chunk_end)
        .value(&walk_first)
        .output(&mut self.w_target)
        .output(&mut self.w_pos)
        .output(&mut self.w_entry)
        .output(&mut self.w_end_pos)
        .output(&mut self.w_end_entry);
        // SAFETY: eval_chunks(WALK_PARAMS, chunk_start, chunk_end, rows_min, w_target, w_pos,
        // w_entry, w_end_pos, w_end_entry); WALK_PARAMS are EVAL_PARAMS, split_start, split_end,
        // multiplier, cost_per_side, slippage_price, rows_max, flat_target, first_sums,
        // first_on (eval_flat's, read at the split's bars only when first_on). One block per
        // chunk, whose bars lie in one session of the split (`prepare`), writing the walk's
        // arrays at its own bars and its own chunk's end state; flat holds the split's flat
        // decisions (queued before on this stream); the dynamic shared memory holds the
        // parameters when params_shared and the block's scratch for rows_max rows. A row of
        // blocks a network, each reading and writing its own part of those buffers (a split's
        // bars, a chunk table's chunks each: `prepare`).
        unsafe { l.run_rows(lc.grid(chunks), rows) }?;
        if let Some(m) = self.marks.as_mut() {
            m.mark()?;
        }

        // The true path, a team of blocks a session.
        let (team, ls, blocks, clustered) = self.stitch_grid(net, sessions, rows)?;
        let first_rows = first_rows(team.rows, Walk::Stitch);
        let per_team = 2 * team.team as usize * ls.rows as usize;
        let teams = (blocks / team.team) as usize * nets.len();
        fit(&self.ctx, &mut self.team_act, teams * per_team)?;
        fit(&self.ctx, &mut self.team_bar, 2 * teams)?;
        let l = walk_params(
            self.ctx.launch(&self.k.stitch),
            w,
            s,
            net,
            &ls,
            table,
            (&self.flat, &self.first_sums, &first_on),
        )
        .input(&self.sess_start)
        .input(&self.sess_end)
        .input(&self.sess_chunk)
        .input(&self.chunk_end)
        .input(&self.w_target)
        .input(&self.w_pos)
        .input(&self.w_entry)
        .input(&self.w_end_pos)
        .input(&self.w_end_entry)
        .value(&sessions)
        .value(&chunks)
        .value(&team.team)
        .value(&first_rows)
        .output(&mut self.team_act)
        .output(&mut self.team_bar)
        .output(&mut self.targets);
        // SAFETY: eval_stitch(WALK_PARAMS, sess_start, sess_end, sess_chunk, chunk_end,
        // w_target, w_pos, w_entry, w_end_pos, w_end_entry, n_sessions, n_chunks, team_size,
        // rows_min, team_act, team_bar, targets); `blocks` is a whole number of teams of
        // team_size blocks, each taking whole sessions and writing targets of their rows only;
        // the chunk table covers every session's rows in order (`prepare`); team_act holds 2 *
        // team_size * rows_max actions and team_bar two words (zero or left by a finished
        // barrier) for every team of every row; a row of blocks a network, its parts of the
        // buffers (bars, chunks, teams) as for eval_chunks; the walks were queued before on
        // this stream; shared memory as for eval_chunks. A team of several blocks waits at
        // barriers for all of them: as one cluster (its blocks run at once, `stitch_grid`
        // checked that the device holds them), or in a cooperative launch that makes every
        // block of every row resident at once, or fails.
        if clustered {
            unsafe { l.run_clusters_of(ls.grid(blocks), rows, team.team) }?;
        } else if team.team > 1 {
            unsafe { l.run_cooperative_rows(ls.grid(blocks), rows) }?;
        } else {
            unsafe { l.run_rows(ls.grid(blocks), rows) }?;
        }
        if let Some(m) = self.marks.as_mut() {
            m.mark()?;
        }
        Ok(())
    }

    /// The stitch's teams, its blocks' layout, the blocks of its launch a row (of `rows`
    /// networks) and whether each team is one thread-block cluster: with teams of several
    /// blocks, as many teams as the device holds at once (up to one a session), as clusters
    /// where the device runs that many clusters of a team's blocks at once (their barrier is
    /// the cluster's, cheaper than the barrier in global memory a cooperative launch's teams
    /// meet at).
    fn stitch_grid(
        &self,
        net: &MemberNet,
        sessions: u32,
        rows: u32,
    ) -> Result<(Stitch, BlockLayout, u32, bool), MemoryError> {
        let full = self.block_layout(net, STITCH_THREADS, None, true)?;
        let resident = |l: &BlockLayout| -> Result<u32, MemoryError> {
            Ok(self.sms
                * self
                    .k
                    .stitch
                    .blocks_per_sm(STITCH_THREADS, l.shared_bytes)?
                    .max(1))
        };
        let mut team = match self.stitch {
            Some(t) => t,
            None => Stitch::auto(sessions * rows, resident(&full)?),
        };
        team.rows = team.rows.min(full.rows);
        let ls = self.block_layout(net, STITCH_THREADS, Some(team.rows), true)?;
        if team.team == 1 {
            return Ok((team, ls, sessions, false));
        }
        let teams = (resident(&ls)? / rows / team.team).min(sessions);
        if teams == 0 {
            return Err(MemoryError::Config(format!(
                "a stitch team of {} blocks does not fit on the device",
                team.team
            )));
        }
        // Clusters only where the device runs as many teams so: fewer teams, each following
        // more sessions, cost more than the cheaper barrier saves (a month of 20 sessions on
        // the H100, teams of 6: a third slower), and narrower teams as clusters gain nothing
        // (the same month, teams of 5 as clusters against 6 at the global barrier: as fast
        // untrained, 7% slower trained; docs/PERFORMANCE.md).
        let clustered = self.stitch_clusters
            && self.k.stitch.max_clusters(&self.ctx, ls.grid(team.team))? >= teams * rows;
        Ok((team, ls, teams * team.team, clustered))
    }

    /// A walking kernel's blocks of `threads` threads: the rows a network pass decides (`rows`,
    /// or two (row, output) pairs a thread of the widest layer), and the parameters in shared
    /// memory when `params_shared` is wanted and they fit beside the scratch.
    fn block_layout(
        &self,
        net: &MemberNet,
        threads: u32,
        rows: Option<u32>,
        params_shared: bool,
    ) -> Result<BlockLayout, MemoryError> {
        let rows = rows.map_or(2 * threads as usize / net.max_width, |r| r as usize);
        let rows = rows.clamp(1, EVAL_WALK_ROWS as usize);
        let scratch = 4 * rows as u64 * (net.obs_dim + 2 * net.max_width + 3) as u64;
        let params = 4 * (net.n_params as u64).next_multiple_of(4);
        let max = u64::from(self.shared_max);
        if scratch > max {
            return Err(MemoryError::Config(format!(
                "layers of {} units are too wide for device evaluation",
                net.max_width
            )));
        }
        let shared = params_shared && scratch + params <= max;
        Ok(BlockLayout {
            threads,
            rows: rows as u32,
            params_shared: u32::from(shared),
            shared_bytes: (scratch + if shared { params } else { 0 }) as u32,
        })
    }

    /// Books the decisions of `split` (the queued walk's for each of `members` networks, or
    /// those given for one) on the device and reads the totals back, a book a network.
    fn book(
        &mut self,
        split: &Range<usize>,
        capital: f64,
        given: bool,
        members: usize,
    ) -> Result<Vec<DeviceBook>, MemoryError> {
        let w = self.window;
        let sessions = self.tables.as_ref().expect("prepared").sessions;
        let (split_start, split_end) = (split.start as u32, split.end as u32);
        let (n_bars, rows) = (split.len() as u32, members as u32);
        debug_assert!(!given || members == 1, "given decisions are one network's");
        let max_position = i32::from(self.env.max_position);
        let total_blocks = self.book_total_blocks()?;
        let x = &self.exec;
        let b = &mut self.book;
        let l = self
            .ctx
            .launch(&self.k.book_steps)
            .input(&w.open)
            .input(&w.close)
            .input(&w.session)
            .input(&w.contract)
            .value(&split_start)
            .value(&split_end)
            .value(&max_position)
            .value(&x.multiplier)
            .value(&x.cost_per_side)
            .value(&x.slippage_price)
            .input(if given { &self.given } else { &self.targets })
            .output(&mut b.step_hold)
            .output(&mut b.step_bar)
            .output(&mut b.step_cost)
            .output(&mut b.step_word);
        // SAFETY: book_steps(open, close, session, contract, split_start, split_end,
        // max_position, multiplier, cost_per_side, slippage_price, targets, step_hold, step_bar,
        // step_cost, step_word); a thread per bar of the split (the rest return), each writing
        // its own bar's entry of its row's part (a row a network); the targets and step buffers
        // hold the split's bars for every row (`prepare`), the market buffers the window's
        // rows, and the split lies inside them (checked).
        unsafe { l.run_rows(Grid::cover(split.len(), 256), rows) }?;
        if let Some(m) = self.marks.as_mut() {
            m.mark()?;
        }
        let l = self
            .ctx
            .launch(&self.k.book_sessions)
            .value(&split_start)
            .value(&n_bars)
            .value(&x.cost_per_side)
            .input(&self.sess_start)
            .input(&self.sess_end)
            .value(&sessions)
            .input(&b.step_hold)
            .input(&b.step_bar)
            .input(&b.step_cost)
            .input(&b.step_word)
            .output(&mut b.daily)
            .output(&mut b.n_pnl)
            .output(&mut b.n_cost)
            .output(&mut b.trades)
            .output(&mut b.wins)
            .output(&mut b.bars)
            .output(&mut b.contracts)
            .output(&mut b.pnl)
            .output(&mut b.seen)
            .output(&mut b.cost);
        // SAFETY: book_sessions(split_start, n_bars, cost_per_side, sess_start, sess_end,
        // n_sessions, step_hold, step_bar, step_cost, step_word, daily, n_pnl, n_cost,
        // n_trades, wins, bars, contracts, pnl_out, seen_out, cost_out); a block of 1 to
        // BOOK_WARPS warps (the kernel's shared arrays hold BOOK_WARPS warps') per session,
        // reading its own session's steps (book_steps, queued before) and writing its
        // session's entries and, from its first row relative to the split, at most its own
        // rows' count of steps; a row of blocks a network, in its own part of every buffer
        // (n_bars bars, n_sessions sessions); every buffer holds the split's bars or sessions
        // for every row (`prepare`).
        let warps = self.book_warps.unwrap_or(BOOK_WARPS);
        unsafe {
            l.run_rows(
                Grid {
                    blocks: sessions,
                    threads: warps * 32,
                    shared_bytes: 0,
                },
                rows,
            )
        }?;
        if let Some(m) = self.marks.as_mut() {
            m.mark()?;
        }
        let chain_only = u32::from(self.chain_only);
        let l = self
            .ctx
            .launch(&self.k.book_total)
            .value(&sessions)
            .input(&self.sess_start)
            .value(&split_start)
            .value(&n_bars)
            .input(&b.daily)
            .input(&b.n_pnl)
            .input(&b.n_cost)
            .input(&b.trades)
            .input(&b.wins)
            .input(&b.bars)
            .input(&b.contracts)
            .input(&b.pnl)
            .input(&b.seen)
            .input(&b.cost)
            .value(&capital)
            .value(&chain_only)
            .output(&mut b.e)
            .output(&mut b.out);
        // SAFETY: book_total(n_sessions, sess_start, split_start, n_bars, daily, n_pnl, n_cost,
        // n_trades, wins, bars, contracts, V, F, C, capital, chain_only, E, out); a row of 1 to
        // BOOK_BLOCKS blocks a network (the kernel's shared arrays hold BOOK_BLOCKS blocks'),
        // one cluster where there are several (`book_total_blocks` asked the device), each
        // block reading and writing only rows of the split inside its row's part of every
        // buffer (n_bars bars, n_sessions sessions, 8 + n_sessions values of out); the counts
        // of book_sessions (queued before) keep every session's steps inside its own rows; every
        // buffer holds that for every row (`prepare`).
        let grid = Grid {
            blocks: total_blocks,
            threads: BOOK_THREADS,
            shared_bytes: 0,
        };
        if total_blocks > 1 {
            unsafe { l.run_clusters_of(grid, rows, total_blocks) }?;
        } else {
            unsafe { l.run_rows(grid, rows) }?;
        }
        if let Some(m) = self.marks.as_mut() {
            m.mark()?;
        }
        let per = 8 + sessions as usize;
        let out = self.ctx.download_prefix(&b.out, per * members)?;
        let bits = |v: f64| v.to_bits();
        Ok(out
            .chunks(per)
            .map(|out| DeviceBook {
                capital,
                bars: split.len(),
                total_costs: out[0],
                max_drawdown: out[1],
                max_drawdown_fraction: out[2],
                trades: bits(out[3]),
                winning_trades: bits(out[4]),
                bars_held: bits(out[5]),
                contracts_traded: bits(out[6]),
                parallel_equity: out[7] == 1.0,
                daily_pnl: out[8..].to_vec(),
            })
            .collect())
    }
}

/// The scalars of a split's kernels.
struct Scalars {
    cols: u32,
    lookback: u32,
    max_position: i32,
    upnl_scale: f32,
    tick_size: f64,
    n_params: u32,
    max_width: u32,
    split_start: u32,
    split_end: u32,
    multiplier: f64,
    cost: f64,
    slippage: f64,
}

fn grid(blocks: u32, l: &Layout) -> Grid {
    Grid {
        blocks: blocks.max(1),
        threads: l.warps * 32,
        shared_bytes: l.shared_bytes,
    }
}

/// The leading arguments of a walk kernel, WALK_PARAMS (kernels/eval.cu): EVAL_PARAMS, the
/// split's bounds and costs, the rows a block decides at most (`layout`'s), then the flat pass's
/// decisions and first-layer sums with whether those sums are read.
fn walk_params<'l>(
    l: Launch<'l>,
    w: &'l DeviceWindow,
    s: &'l Scalars,
    net: &'l MemberNet,
    layout: &'l BlockLayout,
    members: Option<&'l DeviceBuffer<u64>>,
    (flat, first_sums, first_on): (&'l DeviceBuffer<i8>, &'l DeviceBuffer<f32>, &'l u32),
) -> Launch<'l> {
    params(l, w, s, net, &layout.params_shared, members)
        .value(&s.split_start)
        .value(&s.split_end)
        .value(&s.multiplier)
        .value(&s.cost)
        .value(&s.slippage)
        .value(&layout.rows)
        .input(flat)
        .input(first_sums)
        .value(first_on)
}

/// Pushes EVAL_PARAMS (kernels/eval.cu) in order.
fn params<'l>(
    l: Launch<'l>,
    w: &'l DeviceWindow,
    s: &'l Scalars,
    net: &'l MemberNet,
    params_shared: &'l u32,
    members: Option<&'l DeviceBuffer<u64>>,
) -> Launch<'l> {
    /// No member table: the kernels read the network given.
    const NO_TABLE: u64 = 0;
    let l = l
        .input(&w.features)
        .input(&w.open)
        .input(&w.close)
        .input(&w.session)
        .input(&w.contract)
        .value(&s.cols)
        .value(&s.lookback)
        .value(&s.max_position)
        .value(&s.upnl_scale)
        .value(&s.tick_size)
        .value(&net.params)
        .value(&net.layout)
        .value(&s.n_params)
        .value(params_shared)
        .value(&s.max_width);
    match members {
        Some(table) => l.input(table),
        None => l.value(&NO_TABLE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_lengthen_once_the_walks_fill_the_device_and_stay_bounded() {
        // One network, or a few over a month, on the H200's 132 multiprocessors: the default.
        for (k, bars) in [(0, 27_859), (1, 27_859), (16, 27_859), (64, 8_198), (1, 0)] {
            assert_eq!(chunk_bars_for(k, bars, 132), CHUNK_BARS, "{k} x {bars}");
        }
        // Many: about 64 walks a multiprocessor.
        let b = chunk_bars_for(64, 27_859, 132);
        assert!((200..=256).contains(&b), "{b}");
        assert!(64 * 27_859usize.div_ceil(b) <= CHUNKS_PER_SM * 132 + 64);
        assert!(chunk_bars_for(256, 27_859, 132) > 4 * CHUNK_BARS);
        // Fewer multiprocessors: longer chunks, never past the bound; no device count: one.
        assert!(chunk_bars_for(64, 27_859, 16) > b);
        assert_eq!(chunk_bars_for(100_000, 27_859, 132), MAX_CHUNK_BARS);
        assert_eq!(chunk_bars_for(1_000, 27_859, 0), MAX_CHUNK_BARS);
        let mut last = 0;
        for k in 0..2000 {
            let c = chunk_bars_for(k, 27_859, 132);
            assert!(c >= last, "{k} networks: {c} bars after {last}");
            last = c;
        }
    }

    #[test]
    fn stitch_teams_share_the_device_among_sessions_and_are_bounded() {
        // A month of sessions on 132 multiprocessors: six blocks a session, 4 to 16 rows each.
        assert_eq!(Stitch::auto(20, 132), Stitch { team: 6, rows: 16 });
        assert_eq!(first_rows(Stitch::auto(20, 132).rows, Walk::Stitch), 8);
        assert_eq!(first_rows(8, Walk::Chunk), 2);
        assert_eq!(first_rows(3, Walk::Chunk), 1);
        assert_eq!(first_rows(1, Walk::Stitch), 1);
        // More sessions than blocks: a block a session, its rounds as wide as it takes.
        assert_eq!(Stitch::auto(500, 132), Stitch { team: 1, rows: 32 });
        assert_eq!(Stitch::auto(1, 132).team, TEAM_MAX);
        assert_eq!(Stitch::auto(0, 0).team, 1);
        for (team, rows, ok) in [
            (1, 1, true),
            (8, 32, true),
            (16, 16, true),
            (16, 17, false),
            (0, 8, false),
            (17, 8, false),
            (2, 0, false),
            (2, 33, false),
        ] {
            assert_eq!(Stitch { team, rows }.check().is_ok(), ok, "{team} x {rows}");
        }
    }
}
