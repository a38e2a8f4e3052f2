//! Kernel launches: a function of a compiled module, its arguments pushed in the order of its
//! CUDA signature, and the grid.

use cudarc::driver::{CudaFunction, LaunchArgs, LaunchConfig, PushKernelArg};

use crate::buffer::{DeviceBuffer, Elem};
use crate::{GpuContext, GpuError};

/// A kernel function of a compiled [`crate::Module`].
#[derive(Clone)]
pub struct Kernel {
    f: CudaFunction,
    name: &'static str,
}

impl Kernel {
    pub(crate) fn new(f: CudaFunction, name: &'static str) -> Self {
        Self { f, name }
    }
    /// The function's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// Lets launches of this kernel use up to `bytes` of dynamic shared memory (above the
    /// 48 KiB every kernel may use).
    pub fn allow_shared(&self, bytes: u32) -> Result<(), GpuError> {
        self.f
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(GpuError::driver(format!(
                "allowing {bytes} bytes of shared memory to {}",
                self.name
            )))
    }
    /// The most threads a block of this kernel may have: the `__launch_bounds__` it was compiled
    /// for, or fewer where its registers do not allow that many.
    pub fn max_threads(&self) -> Result<u32, GpuError> {
        self.f
            .max_threads_per_block()
            .map(|v| v.max(1) as u32)
            .map_err(GpuError::driver(format!(
                "asking the block size of {}",
                self.name
            )))
    }
    /// Bytes of static shared memory (`__shared__` arrays) a block of this kernel uses: what its
    /// dynamic shared memory cannot have.
    pub fn static_shared(&self) -> Result<u32, GpuError> {
        self.f
            .shared_size_bytes()
            .map(|v| v.max(0) as u32)
            .map_err(GpuError::driver(format!(
                "asking the static shared memory of {}",
                self.name
            )))
    }
    /// How many blocks of `threads` threads and `shared_bytes` of dynamic shared memory one
    /// multiprocessor holds at once.
    pub fn blocks_per_sm(&self, threads: u32, shared_bytes: u32) -> Result<u32, GpuError> {
        self.f
            .occupancy_max_active_blocks_per_multiprocessor(threads, shared_bytes as usize, None)
            .map_err(GpuError::driver(format!(
                "asking the occupancy of {}",
                self.name
            )))
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({})", self.name)
    }
}

/// Blocks and threads of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// Blocks.
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
}

impl Grid {
    /// At least `items` threads in blocks of `block` (one block at least).
    pub fn cover(items: usize, block: u32) -> Self {
        Self {
            blocks: (items as u64).div_ceil(u64::from(block)).max(1) as u32,
            threads: block,
            shared_bytes: 0,
        }
    }
    /// Exactly one block of `threads` threads.
    pub fn block(threads: u32) -> Self {
        Self {
            blocks: 1,
            threads,
            shared_bytes: 0,
        }
    }
}

/// One launch being put together: arguments in the order of the kernel's signature.
pub struct Launch<'a> {
    args: LaunchArgs<'a>,
    name: &'static str,
}

impl GpuContext {
    /// Starts a launch of `kernel` on this context's stream.
    pub fn launch<'a>(&'a self, kernel: &'a Kernel) -> Launch<'a> {
        Launch {
            args: self.stream().launch_builder(&kernel.f),
            name: kernel.name,
        }
    }
}

impl<'a> Launch<'a> {
    /// A buffer the kernel reads (`const T*`).
    pub fn input<T>(mut self, b: &'a DeviceBuffer<T>) -> Self {
        self.args.arg(b.raw());
        self
    }
    /// A buffer the kernel writes (`T*`).
    pub fn output<T>(mut self, b: &'a mut DeviceBuffer<T>) -> Self {
        self.args.arg(b.raw_mut());
        self
    }
    /// A scalar argument.
    pub fn value<T: Elem>(mut self, v: &'a T) -> Self {
        self.args.arg(v);
        self
    }
    /// Queues the launch as a cooperative launch: every block of `grid` is resident at once, so
    /// the blocks may wait for each other (grid barriers). The driver refuses a grid larger than
    /// the device holds. Asynchronous.
    ///
    /// # Safety
    /// As [`Launch::run`].
    pub unsafe fn run_cooperative(self, grid: Grid) -> Result<(), GpuError> {
        // SAFETY: the caller's contract, as for `run`.
        unsafe { self.run_cooperative_rows(grid, 1) }
    }

    /// As [`Launch::run_cooperative`], with `rows` rows of `grid.blocks` blocks (blockIdx.y is
    /// the row): every block of every row resident at once.
    ///
    /// # Safety
    /// As [`Launch::run`], for the whole grid of rows.
    pub unsafe fn run_cooperative_rows(mut self, grid: Grid, rows: u32) -> Result<(), GpuError> {
        let cfg = LaunchConfig {
            grid_dim: (grid.blocks, rows, 1),
            block_dim: (grid.threads, 1, 1),
            shared_mem_bytes: grid.shared_bytes,
        };
        // SAFETY: the caller's contract, as for `run`.
        unsafe { self.args.launch_cooperative(cfg) }
            .map(|_| ())
            .map_err(GpuError::driver(format!(
                "launching {} (cooperative, {} x {rows} blocks)",
                self.name, grid.blocks
            )))
    }

    /// Queues the launch on the stream (asynchronous).
    ///
    /// # Safety
    /// The arguments match the kernel's CUDA signature in number, order and type, and for this
    /// grid every element the kernel reads or writes lies within the buffers given. The caller
    /// states why, in a `// SAFETY:` comment at the call.
    pub unsafe fn run(self, grid: Grid) -> Result<(), GpuError> {
        // SAFETY: the caller's contract, as for `run_rows`.
        unsafe { self.run_rows(grid, 1) }
    }

    /// As [`Launch::run`], with `rows` rows of `grid.blocks` blocks (blockIdx.y is the row).
    ///
    /// # Safety
    /// As [`Launch::run`], for the whole grid of rows.
    pub unsafe fn run_rows(mut self, grid: Grid, rows: u32) -> Result<(), GpuError> {
        let cfg = LaunchConfig {
            grid_dim: (grid.blocks, rows, 1),
            block_dim: (grid.threads, 1, 1),
            shared_mem_bytes: grid.shared_bytes,
        };
        // SAFETY: the caller's contract above.
        unsafe { self.args.launch(cfg) }
            .map(|_| ())
            .map_err(GpuError::driver(format!("launching {}", self.name)))
    }
}
