//! Kernel launches: a function of a compiled module, its arguments pushed in the order of its
//! CUDA signature, and the grid.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaFunction, LaunchArgs, LaunchConfig, PushKernelArg, sys};

use crate::buffer::{DeviceBuffer, Elem};
use crate::{GpuContext, GpuError};

/// A kernel function of a compiled [`crate::Module`].
#[derive(Clone)]
pub struct Kernel {
    f: CudaFunction,
    name: &'static str,
    /// The driver's occupancy answers for this function, shared by every handle of it.
    occupancy: OccupancyAnswers,
}

/// The driver's occupancy answers given so far for one function of a loaded module, by
/// (threads, dynamic shared bytes, blocks of a cluster or 0 for blocks a multiprocessor): they
/// depend on nothing else but the function's attributes, so callers may ask before every launch
/// and the driver is asked once. The attributes belong to the function, not to a handle, so the
/// context keeps one list a function for all its handles ([`crate::GpuContext::kernel`]), and
/// [`Kernel::allow_shared`] through any of them forgets the answers of all.
pub(crate) type OccupancyAnswers = Arc<Mutex<Vec<([u32; 3], u32)>>>;

impl Kernel {
    pub(crate) fn new(f: CudaFunction, name: &'static str, occupancy: OccupancyAnswers) -> Self {
        Self { f, name, occupancy }
    }
    /// The answer remembered under `key`, else `ask`'s, remembered.
    fn occupancy(
        &self,
        key: [u32; 3],
        ask: impl FnOnce() -> Result<u32, GpuError>,
    ) -> Result<u32, GpuError> {
        let mut known = self
            .occupancy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(&(_, n)) = known.iter().find(|(k, _)| *k == key) {
            return Ok(n);
        }
        let n = ask()?;
        known.push((key, n));
        Ok(n)
    }
    /// The function's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// Lets launches of this kernel, through any handle, use up to `bytes` of dynamic shared
    /// memory (above the 48 KiB every kernel may use, or below what was allowed before).
    pub fn allow_shared(&self, bytes: u32) -> Result<(), GpuError> {
        self.occupancy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
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
    /// How many thread-block clusters of `grid`'s blocks (each of its threads and dynamic shared
    /// memory) the device runs at once: 0 where it runs none (a device without cluster
    /// launches, or clusters larger than its processing clusters hold).
    /// Clusters of more than 8 blocks (the portable size) are allowed to this kernel first.
    pub fn max_clusters(&self, ctx: &GpuContext, grid: Grid) -> Result<u32, GpuError> {
        let blocks = grid.blocks;
        if blocks == 0 {
            return Ok(0);
        }
        self.occupancy([grid.threads, grid.shared_bytes, blocks], || {
            self.ask_clusters(ctx, grid)
        })
    }
    /// The driver's answer behind `max_clusters`, asked afresh (`max_clusters` keeps it).
    fn ask_clusters(&self, ctx: &GpuContext, grid: Grid) -> Result<u32, GpuError> {
        let blocks = grid.blocks;
        if !ctx.cluster_launch()? {
            return Ok(0);
        }
        if blocks > 8 {
            self.f
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                    1,
                )
                .map_err(GpuError::driver(format!(
                    "allowing clusters of {blocks} blocks to {}",
                    self.name
                )))?;
        }
        let mut attr = cluster_attribute(blocks);
        let cfg = cluster_config(ctx, grid, 1, &mut attr);
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `n`, `cfg` and the attribute `cfg` points at are live locals; the function
        // handle belongs to a module its context keeps loaded while `self` lives.
        let r = unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, self.f.cu_function(), &cfg) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(n.max(0) as u32),
            // More blocks than a processing cluster of this device holds: it runs none.
            sys::CUresult::CUDA_ERROR_INVALID_CLUSTER_SIZE => Ok(0),
            e => Err(GpuError::driver(format!(
                "asking how many clusters of {blocks} blocks of {} run at once",
                self.name
            ))(cudarc::driver::DriverError(e))),
        }
    }
    /// How many blocks of `threads` threads and `shared_bytes` of dynamic shared memory one
    /// multiprocessor holds at once.
    pub fn blocks_per_sm(&self, threads: u32, shared_bytes: u32) -> Result<u32, GpuError> {
        self.occupancy([threads, shared_bytes, 0], || {
            self.f
                .occupancy_max_active_blocks_per_multiprocessor(
                    threads,
                    shared_bytes as usize,
                    None,
                )
                .map_err(GpuError::driver(format!(
                    "asking the occupancy of {}",
                    self.name
                )))
        })
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

/// The launch attribute that makes a launch's blocks clusters of `blocks` along x.
fn cluster_attribute(blocks: u32) -> sys::CUlaunchAttribute {
    // SAFETY: the attribute is plain data (ids, integers, a union of plain data); all zeros is
    // a valid value of it, completed below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = blocks;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    attr
}

/// The driver's launch configuration of `rows` rows of `grid` on `ctx`'s stream, each row one
/// cluster as `attr` (from [`cluster_attribute`]) says.
fn cluster_config(
    ctx: &GpuContext,
    grid: Grid,
    rows: u32,
    attr: &mut sys::CUlaunchAttribute,
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid.blocks,
        gridDimY: rows,
        gridDimZ: 1,
        blockDimX: grid.threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: grid.shared_bytes,
        hStream: ctx.stream().cu_stream(),
        attrs: attr,
        numAttrs: 1,
    }
}

/// One launch being put together: arguments in the order of the kernel's signature.
pub struct Launch<'a> {
    args: LaunchArgs<'a>,
    name: &'static str,
    ctx: &'a GpuContext,
    f: &'a CudaFunction,
    /// The arguments in order as the driver takes them, for a launch through the driver itself
    /// (clusters, which cudarc does not launch).
    raw: Vec<RawArg>,
}

/// One kernel argument as the driver takes it.
#[derive(Clone, Copy)]
enum RawArg {
    /// A scalar's address (the scalar borrowed for the launch's lifetime).
    Value(*mut c_void),
    /// A buffer's device address: the argument is the address itself, so the driver needs a
    /// place holding it, made only when launching.
    Buffer(u64),
}

impl GpuContext {
    /// Starts a launch of `kernel` on this context's stream.
    pub fn launch<'a>(&'a self, kernel: &'a Kernel) -> Launch<'a> {
        Launch {
            args: self.stream().launch_builder(&kernel.f),
            name: kernel.name,
            ctx: self,
            f: &kernel.f,
            raw: Vec::new(),
        }
    }
}

impl<'a> Launch<'a> {
    /// A buffer the kernel reads (`const T*`).
    pub fn input<T: Elem>(mut self, b: &'a DeviceBuffer<T>) -> Self {
        self.raw.push(RawArg::Buffer(self.ctx.address(b)));
        self.args.arg(b.raw());
        self
    }
    /// A buffer the kernel writes (`T*`).
    pub fn output<T: Elem>(mut self, b: &'a mut DeviceBuffer<T>) -> Self {
        self.raw.push(RawArg::Buffer(self.ctx.address(b)));
        self.args.arg(b.raw_mut());
        self
    }
    /// A scalar argument.
    pub fn value<T: Elem>(mut self, v: &'a T) -> Self {
        self.args.arg(v);
        self.raw.push(RawArg::Value(v as *const T as *mut c_void));
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

    /// Queues the launch with `rows` rows of `grid.blocks` blocks (blockIdx.y is the row), each
    /// row one thread-block cluster: its blocks run at once and may meet at the cluster's
    /// barrier and write each other's shared memory. Check [`Kernel::max_clusters`] first: the
    /// driver refuses clusters the device cannot hold. Asynchronous.
    ///
    /// # Safety
    /// As [`Launch::run`], for the whole grid of rows.
    pub unsafe fn run_clusters(self, grid: Grid, rows: u32) -> Result<(), GpuError> {
        // SAFETY: the caller's contract.
        unsafe { self.run_clusters_of(grid, rows, grid.blocks) }
    }

    /// As [`Launch::run_clusters`], each row's blocks in clusters of `cluster` neighbours
    /// (blocks `k * cluster ..` of a row; `grid.blocks` a multiple of `cluster`).
    ///
    /// # Safety
    /// As [`Launch::run`], for the whole grid of rows.
    pub unsafe fn run_clusters_of(
        self,
        grid: Grid,
        rows: u32,
        cluster: u32,
    ) -> Result<(), GpuError> {
        assert!(
            cluster > 0 && grid.blocks.is_multiple_of(cluster),
            "{} blocks in clusters of {cluster}",
            grid.blocks
        );
        let mut attr = cluster_attribute(cluster);
        let cfg = cluster_config(self.ctx, grid, rows, &mut attr);
        let what = || {
            format!(
                "launching {} ({} x {rows} blocks in clusters of {cluster})",
                self.name, grid.blocks
            )
        };
        // Each buffer's argument is its address where `raw` keeps it: `raw` grows no more and
        // lives to the end of this function.
        let mut values: Vec<*mut c_void> = self
            .raw
            .iter()
            .map(|a| match a {
                RawArg::Value(p) => *p,
                RawArg::Buffer(address) => address as *const u64 as *mut c_void,
            })
            .collect();
        self.ctx.bind()?;
        // SAFETY: `values` holds the address of every argument, in the kernel's order: each
        // scalar borrowed for 'a (alive here), each buffer's device address in `self.raw`
        // (alive and unmoved to the end of this function); `cfg` and its attribute are live
        // locals; the function belongs to a module its context keeps loaded; the caller's
        // contract covers what the kernel reads and writes.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                self.f.cu_function(),
                values.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| GpuError::driver(what())(e))
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
