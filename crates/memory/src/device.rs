//! The window arena on the device: one upload of a window's market data into pooled device
//! buffers, lent to every epoch, handed back to the pool when the window ends (the host arena's
//! twin, see [`crate::arena`]).

use std::sync::Arc;

use foxhunt_gpu::{DeviceBuffer, Elem, GpuContext};

use crate::MemoryError;
use crate::arena::{Arena, FreeLists, Pool, PoolStats, WindowData, take_fitting};

/// Device buffers of one window's market data (what the kernels read), `rows` rows of `cols`
/// features.
pub struct DeviceWindow {
    /// Normalized features, row-major `[rows * cols]`.
    pub features: DeviceBuffer<f32>,
    /// Adjusted open, `[rows]`.
    pub open: DeviceBuffer<f64>,
    /// Adjusted close, `[rows]`.
    pub close: DeviceBuffer<f64>,
    /// Session index, `[rows]`.
    pub session: DeviceBuffer<u32>,
    /// Front contract, `[rows]`.
    pub contract: DeviceBuffer<u32>,
    /// Rows.
    pub rows: usize,
    /// Features per row.
    pub cols: usize,
}

/// A pool of device buffers that window arenas are built in: a window whose shapes fit in
/// buffers an earlier window released allocates nothing (no cudaMalloc between windows in the
/// steady state).
pub struct DevicePool {
    ctx: Arc<GpuContext>,
    free: FreeLists<DeviceBuffer<f32>, DeviceBuffer<f64>, DeviceBuffer<u32>, DeviceBuffer<i64>>,
    stats: PoolStats,
    held: u64,
}

impl DevicePool {
    /// An empty pool on `ctx`'s device.
    pub fn new(ctx: &Arc<GpuContext>) -> Self {
        Self {
            ctx: ctx.clone(),
            free: FreeLists::default(),
            stats: PoolStats::default(),
            held: 0,
        }
    }

    /// The device.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn fill<T: Elem>(
        ctx: &GpuContext,
        free: &mut Vec<DeviceBuffer<T>>,
        stats: &mut PoolStats,
        held: &mut u64,
        src: &[T],
    ) -> Result<DeviceBuffer<T>, MemoryError> {
        let bytes = std::mem::size_of_val(src) as u64;
        let reused = take_fitting(free, src.len(), DeviceBuffer::capacity);
        stats.count(bytes, reused.is_some(), held);
        let mut buf = match reused {
            Some(b) => b,
            None => ctx.alloc::<T>(src.len())?,
        };
        ctx.write(&mut buf, src)?;
        stats.uploaded += bytes;
        Ok(buf)
    }

    /// Builds the arena of one window: one upload of its market data into pooled buffers (the
    /// copy is queued on the stream; kernels queued after it see the data). The arena holds the
    /// pool until it is dropped, so windows are strictly one after another.
    pub fn window(&mut self, data: &WindowData) -> Result<GpuArena<'_>, MemoryError> {
        let m = &data.market;
        if m.rows() > u32::MAX as usize {
            return Err(MemoryError::Config(format!("{} rows exceed u32", m.rows())));
        }
        let contract: Vec<u32> = m.contract().iter().map(|&c| u32::from(c)).collect();
        let ctx = self.ctx.clone();
        let before = self.stats.uploaded;
        let (free, stats, held) = (&mut self.free, &mut self.stats, &mut self.held);
        let features = Self::fill(&ctx, &mut free.f32, stats, held, m.features())?;
        let open = Self::fill(&ctx, &mut free.f64, stats, held, m.open())?;
        let close = Self::fill(&ctx, &mut free.f64, stats, held, m.close())?;
        let session = Self::fill(&ctx, &mut free.u32, stats, held, m.session())?;
        let contract = Self::fill(&ctx, &mut free.u32, stats, held, &contract)?;
        let uploaded = stats.uploaded - before;
        let window = DeviceWindow {
            features,
            open,
            close,
            session,
            contract,
            rows: m.rows(),
            cols: m.cols(),
        };
        Ok(Arena::new(self, window, data.exec, uploaded))
    }
}

impl Pool for DevicePool {
    type Window = DeviceWindow;
    fn release(&mut self, w: DeviceWindow) {
        self.free.f32.push(w.features);
        self.free.f64.push(w.open);
        self.free.f64.push(w.close);
        self.free.u32.push(w.session);
        self.free.u32.push(w.contract);
    }
    fn stats(&self) -> PoolStats {
        self.stats
    }
}

/// One window's market data resident on the device for the window's life.
pub type GpuArena<'p> = Arena<'p, DevicePool>;

impl GpuArena<'_> {
    /// Rows of market data.
    pub fn rows(&self) -> usize {
        self.window().rows
    }
    /// The device.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.pool().ctx
    }
    /// The device buffers (for kernels of other crates that read the window).
    pub fn buffers(&self) -> &DeviceWindow {
        self.window()
    }
    /// The window as seen from the stream of `ctx` (a context of the same device, e.g. a
    /// [`GpuContext::worker`]): for several agents that share one upload, each queuing its own
    /// work. The caller waits for the arena's upload on its own stream before work on `ctx`
    /// reads the window, and ends that work before the arena is dropped; nothing writes the
    /// window once it is uploaded.
    pub fn on(&self, ctx: &Arc<GpuContext>) -> OnStream<'_> {
        OnStream {
            window: self.window(),
            exec: self.exec(),
            ctx: ctx.clone(),
        }
    }
}

/// A window resident on the device and the stream that work over it is queued on: what the
/// GPU environments and the evaluator are made from (an arena converts to its own stream's).
#[derive(Clone)]
pub struct OnStream<'a> {
    window: &'a DeviceWindow,
    exec: &'a foxhunt_env::Execution,
    ctx: Arc<GpuContext>,
}

impl<'a> From<&'a GpuArena<'_>> for OnStream<'a> {
    fn from(arena: &'a GpuArena<'_>) -> Self {
        arena.on(arena.context())
    }
}

impl<'a> OnStream<'a> {
    /// Rows of market data.
    pub fn rows(&self) -> usize {
        self.window.rows
    }
    /// The context whose stream the work is queued on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }
    /// The device buffers.
    pub fn buffers(&self) -> &'a DeviceWindow {
        self.window
    }
    /// Contract terms and costs.
    pub fn exec(&self) -> &'a foxhunt_env::Execution {
        self.exec
    }
}
