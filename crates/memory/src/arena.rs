//! The window arena: a walk-forward window's market data copied once into buffers taken from a
//! pool (on the host, or on a device), borrowed by every epoch, and handed back to the pool when
//! the window ends. One [`Arena`] type serves both; a [`Pool`] says where the buffers live.
//!
//! The lifetimes carry the rule. [`HostPool::window`] (and `DevicePool::window`) borrows the
//! pool mutably for as long as the arena lives, so a second arena cannot be made while one
//! exists; an [`Epoch`] borrows the arena, so no epoch can outlive its window or re-create its
//! data.
//!
//! ```compile_fail,E0597
//! # use foxhunt_memory::{HostPool, WindowData};
//! # fn f(data: &WindowData) {
//! let mut pool = HostPool::new();
//! let epoch = {
//!     let arena = pool.window(data);
//!     arena.epoch(1) // error: the epoch would outlive the window's arena
//! };
//! # }
//! ```
//!
//! ```compile_fail,E0499
//! # use foxhunt_memory::{HostPool, WindowData};
//! # fn f(data: &WindowData) {
//! let mut pool = HostPool::new();
//! let first = pool.window(data);
//! let second = pool.window(data); // error: the pool is lent to `first` until it is dropped
//! drop(first);
//! # }
//! ```

use foxhunt_env::{Execution, MarketColumns, MarketData};

/// What a window's arena is built from: its rows of market data and the execution terms.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowData {
    /// The window's rows (train, validation and test), features normalized on train.
    pub market: MarketData,
    /// Contract terms and costs.
    pub exec: Execution,
}

impl WindowData {
    /// Bytes of market data a host arena copies.
    pub fn bytes(&self) -> u64 {
        let m = &self.market;
        (size_of_val(m.features())
            + size_of_val(m.open())
            + size_of_val(m.close())
            + size_of_val(m.session())
            + size_of_val(m.contract())
            + size_of_val(m.ts())) as u64
    }
}

/// A pool's bookkeeping, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    /// Bytes newly allocated (host heap or cudaMalloc) over the pool's life.
    pub allocated: u64,
    /// Bytes served from buffers that earlier windows released.
    pub reused: u64,
    /// Largest number of bytes the pool held at once (lent and free).
    pub peak: u64,
    /// Bytes of window data copied into arenas (uploads) over the pool's life.
    pub uploaded: u64,
    /// Allocations made (cudaMalloc calls on the GPU).
    pub allocations: u64,
}

impl PoolStats {
    /// Adds the bookkeeping of another pool that lived beside this one (a second worker's):
    /// counts add up, and so do the peaks, which may have coincided.
    pub fn add(&mut self, other: &PoolStats) {
        self.allocated += other.allocated;
        self.reused += other.reused;
        self.peak += other.peak;
        self.uploaded += other.uploaded;
        self.allocations += other.allocations;
    }

    /// Counts a request for `bytes`, served from a released buffer or newly allocated (then
    /// `held`, the bytes the pool holds, grows and the peak follows it).
    pub(crate) fn count(&mut self, bytes: u64, reused: bool, held: &mut u64) {
        if reused {
            self.reused += bytes;
        } else {
            self.allocated += bytes;
            self.allocations += 1;
            *held += bytes;
            self.peak = self.peak.max(*held);
        }
    }
}

/// Free buffers by element type, each reused by any later request it is large enough for.
#[derive(Debug)]
pub(crate) struct FreeLists<F32, F64, U32, I64> {
    pub f32: Vec<F32>,
    pub f64: Vec<F64>,
    pub u32: Vec<U32>,
    pub i64: Vec<I64>,
}

impl<A, B, C, D> Default for FreeLists<A, B, C, D> {
    fn default() -> Self {
        Self {
            f32: Vec::new(),
            f64: Vec::new(),
            u32: Vec::new(),
            i64: Vec::new(),
        }
    }
}

/// Takes the smallest free buffer of at least `len` elements (capacity by `cap`), if any.
pub(crate) fn take_fitting<T>(
    free: &mut Vec<T>,
    len: usize,
    cap: impl Fn(&T) -> usize,
) -> Option<T> {
    let best = free
        .iter()
        .enumerate()
        .filter(|(_, b)| cap(b) >= len)
        .min_by_key(|(_, b)| cap(b))
        .map(|(i, _)| i)?;
    Some(free.swap_remove(best))
}

/// Where an [`Arena`]'s buffers come from and go back to.
pub trait Pool {
    /// A window's data as this pool holds it.
    type Window;
    /// Takes back the buffers of a window whose arena ends.
    fn release(&mut self, window: Self::Window);
    /// The pool's bookkeeping so far.
    fn stats(&self) -> PoolStats;
}

/// One window's data, resident in pool `P`'s buffers for the window's life.
pub struct Arena<'p, P: Pool> {
    pool: &'p mut P,
    /// Present from construction until drop hands the buffers back.
    window: Option<P::Window>,
    exec: Execution,
    uploaded: u64,
}

impl<'p, P: Pool> Arena<'p, P> {
    pub(crate) fn new(pool: &'p mut P, window: P::Window, exec: Execution, uploaded: u64) -> Self {
        Self {
            pool,
            window: Some(window),
            exec,
            uploaded,
        }
    }
    /// The window's data as the pool holds it.
    pub fn window(&self) -> &P::Window {
        self.window
            .as_ref()
            .expect("the window's data is present until the arena drops")
    }
    /// The execution terms.
    pub fn exec(&self) -> &Execution {
        &self.exec
    }
    /// Bytes copied in when the window began (the only copy of window data it ever makes).
    pub fn uploaded_bytes(&self) -> u64 {
        self.uploaded
    }
    /// Lends the window's data to epoch `index`. Nothing is copied.
    pub fn epoch(&self, index: usize) -> Epoch<'_, Self> {
        Epoch::new(self, index)
    }
    /// The pool's bookkeeping (the arena holds the pool while it lives).
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }
    #[cfg(feature = "cuda")]
    pub(crate) fn pool(&self) -> &P {
        self.pool
    }
}

impl<P: Pool> Drop for Arena<'_, P> {
    fn drop(&mut self) {
        if let Some(w) = self.window.take() {
            self.pool.release(w);
        }
    }
}

/// A pool of host buffers that window arenas are built in, reused from window to window.
#[derive(Debug, Default)]
pub struct HostPool {
    free: FreeLists<Vec<f32>, Vec<f64>, Vec<u32>, Vec<i64>>,
    contract: Vec<Vec<u16>>,
    stats: PoolStats,
    held: u64,
}

impl HostPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A free buffer for `src` (the smallest that fits, else a new one), counted.
    fn take<T>(free: &mut Vec<Vec<T>>, stats: &mut PoolStats, held: &mut u64, src: &[T]) -> Vec<T> {
        let bytes = std::mem::size_of_val(src) as u64;
        let reused = take_fitting(free, src.len(), Vec::capacity);
        stats.count(bytes, reused.is_some(), held);
        stats.uploaded += bytes;
        reused.unwrap_or_else(|| Vec::with_capacity(src.len()))
    }

    /// Builds the arena of one window: one copy of `data` into pooled buffers. The arena holds
    /// the pool until it is dropped, so windows are strictly one after another.
    pub fn window(&mut self, data: &WindowData) -> HostArena<'_> {
        let m = &data.market;
        let (free, stats, held) = (&mut self.free, &mut self.stats, &mut self.held);
        let buffers = MarketColumns {
            cols: m.cols(),
            features: Self::take(&mut free.f32, stats, held, m.features()),
            open: Self::take(&mut free.f64, stats, held, m.open()),
            close: Self::take(&mut free.f64, stats, held, m.close()),
            session: Self::take(&mut free.u32, stats, held, m.session()),
            contract: Self::take(&mut self.contract, stats, held, m.contract()),
            ts: Self::take(&mut free.i64, stats, held, m.ts()),
        };
        let market = m.copy_into(buffers);
        Arena::new(self, market, data.exec, data.bytes())
    }
}

impl Pool for HostPool {
    type Window = MarketData;
    fn release(&mut self, window: MarketData) {
        let c = window.into_columns();
        self.free.f32.push(c.features);
        self.free.f64.push(c.open);
        self.free.f64.push(c.close);
        self.free.u32.push(c.session);
        self.free.i64.push(c.ts);
        self.contract.push(c.contract);
    }
    fn stats(&self) -> PoolStats {
        self.stats
    }
}

/// One window's data on the host.
pub type HostArena<'p> = Arena<'p, HostPool>;

impl HostArena<'_> {
    /// The window's market data.
    pub fn market(&self) -> &MarketData {
        self.window()
    }
}

/// An epoch's loan of its window's arena: it cannot outlive the arena, and holds no copy.
#[derive(Debug, Clone, Copy)]
pub struct Epoch<'a, A> {
    arena: &'a A,
    index: usize,
}

impl<'a, A> Epoch<'a, A> {
    pub(crate) fn new(arena: &'a A, index: usize) -> Self {
        Self { arena, index }
    }
    /// The arena lent.
    pub fn arena(&self) -> &'a A {
        self.arena
    }
    /// The epoch's index within its window.
    pub fn index(&self) -> usize {
        self.index
    }
}
