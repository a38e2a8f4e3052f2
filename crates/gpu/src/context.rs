//! A CUDA device as foxhunt uses it: the primary context, one stream, the compiled modules (from
//! the on-disk kernel cache when it holds them), and every copy between host and device memory.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaModule, CudaStream};
use cudarc::nvrtc::{CompileError, Ptx, result as nvrtc, sys as nvrtc_sys};

use crate::buffer::{DeviceBuffer, Elem};
use crate::cache::KernelCache;
use crate::launch::{Kernel, OccupancyAnswers};
use crate::{EventMarks, GpuError, Module};

/// How the modules of a context came to be: compiled by NVRTC, or read from the kernel cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Modules compiled by NVRTC.
    pub compiled: usize,
    /// Modules loaded from the kernel cache.
    pub cached: usize,
    /// Cache entries found damaged, stale or unloadable, and rebuilt.
    pub rebuilt: usize,
    /// Why the cache could not be written, where it could not (it costs the next run a compile).
    pub cache_errors: Vec<String>,
}

/// A point in a stream's work ([`GpuContext::record`]) that another stream of the same device
/// can wait for.
pub struct GpuEvent(cudarc::driver::CudaEvent);

/// A CUDA device: its context (the primary one, shared with burn-cuda), the stream all of
/// foxhunt's work through this handle goes to, and the kernel modules compiled so far (shared
/// by the handles of one device's workers, [`GpuContext::worker`]).
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    cache: KernelCache,
    modules: Arc<Mutex<HashMap<Module, Arc<CudaModule>>>>,
    /// Each loaded function's occupancy answers, shared by all its handles and workers (the
    /// modules, and so the functions and their attributes, are shared with the workers).
    occupancy: Arc<Mutex<HashMap<(Module, &'static str), OccupancyAnswers>>>,
    stats: Arc<Mutex<CompileStats>>,
}

/// Makes the device's memory pool keep the memory freed into it instead of handing it back to
/// the driver at every synchronization (the pool's default). Buffers are freed stream-ordered
/// into that pool; a population's window frees thousands on its workers' streams, and the next
/// window allocates as many again on new streams while its first members already run and
/// synchronize. Measured on the H200 (docs/PERFORMANCE.md, 2026-12-03): with the default, a
/// member of the second window of 64 meeting took 0.46 s (median) in `FusedDqn::new` alone
/// (first window: 18 ms), of 256 meeting 7.65 s; kept, the memory is reused. The process holds
/// at most its own peak.
fn keep_pool_memory(ctx: &Arc<CudaContext>) -> Result<(), GpuError> {
    use cudarc::driver::sys;
    let pools = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        .map_err(GpuError::driver(
            "asking whether the device has memory pools",
        ))?;
    if pools == 0 {
        // cudarc allocates synchronously then: no pool to keep.
        return Ok(());
    }
    ctx.bind_to_thread()
        .map_err(GpuError::driver("binding the context"))?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the context is bound to this thread and its device lives while it does; `pool`
    // is a valid place for the handle.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .map_err(GpuError::driver("reading the device's memory pool"))?;
    let mut keep = u64::MAX;
    // SAFETY: `pool` is the device's default pool, just read; the release threshold attribute
    // takes a u64 by pointer, which `keep` is.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        )
    }
    .result()
    .map_err(GpuError::driver(
        "setting the memory pool's release threshold",
    ))
}

impl GpuContext {
    /// How many CUDA devices this machine has (an error where the driver cannot be loaded).
    pub fn device_count() -> Result<usize, GpuError> {
        // SAFETY: only tries to dlopen the library by name; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoCuda(
                "the CUDA driver library (libcuda) could not be loaded".into(),
            ));
        }
        let n = CudaContext::device_count().map_err(GpuError::driver("counting the devices"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Opens device `ordinal`, with the kernel cache the environment asks for
    /// ([`KernelCache::from_env`]).
    pub fn new(ordinal: usize) -> Result<Arc<Self>, GpuError> {
        Self::with_cache(ordinal, KernelCache::from_env())
    }

    /// Opens device `ordinal` with kernel cache `cache`. Checks that the driver and NVRTC
    /// libraries can be loaded before touching cudarc, which panics rather than returning an
    /// error when they cannot.
    pub fn with_cache(ordinal: usize, cache: KernelCache) -> Result<Arc<Self>, GpuError> {
        // SAFETY: only tries to dlopen the library by name; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoCuda(
                "the CUDA driver library (libcuda) could not be loaded".into(),
            ));
        }
        // SAFETY: as above, for NVRTC.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(GpuError::NoCuda(
                "the NVRTC library (libnvrtc) could not be loaded".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| GpuError::NoCuda(format!("device {ordinal}: {e}")))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(GpuError::driver("reading the compute capability"))?;
        keep_pool_memory(&ctx)?;
        let stream = ctx.default_stream();
        Ok(Arc::new(Self {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            cache,
            modules: Arc::new(Mutex::new(HashMap::new())),
            occupancy: Arc::default(),
            stats: Arc::new(Mutex::new(CompileStats::default())),
        }))
    }

    /// Another handle on the same device and context with a stream of its own (non-blocking),
    /// sharing the compiled modules: for a second worker on one GPU, whose launches and copies
    /// may then overlap this one's instead of queueing behind them on one stream.
    ///
    /// A worker's device buffers are allocated, used and freed on its own stream only (its
    /// environments, replay and engine are its own; the handles share modules), with one
    /// exception: a window's market data, uploaded once and then only read, may be read from
    /// several workers' streams after the upload has been waited for, and is handed back only
    /// after those workers' streams are done (foxhunt-memory's `GpuArena::on`, a population's
    /// members). So cudarc's cross-stream event tracking, which would record events on every
    /// buffer of every launch, is turned off for this context's buffers. Call it before any
    /// worker allocates.
    pub fn worker(&self) -> Result<Arc<Self>, GpuError> {
        // SAFETY: cudarc's conditions for untracked buffers hold by the rule above: a buffer is
        // written and freed only on the stream it was allocated on, and read on another stream
        // only between a synchronize after its last write and a synchronize of that stream
        // before it is freed or written again, so none is freed or written while another
        // stream uses it.
        unsafe { self.ctx.disable_event_tracking() };
        let stream = self
            .ctx
            .new_stream()
            .map_err(GpuError::driver("creating a worker's stream"))?;
        Ok(Arc::new(Self {
            ctx: self.ctx.clone(),
            stream,
            arch: self.arch.clone(),
            cache: self.cache.clone(),
            modules: self.modules.clone(),
            occupancy: self.occupancy.clone(),
            stats: self.stats.clone(),
        }))
    }

    /// Bytes of device memory free now (the driver's count, for every process on the GPU).
    pub fn free_memory(&self) -> Result<u64, GpuError> {
        let (free, _total) = self
            .ctx
            .mem_get_info()
            .map_err(GpuError::driver("reading the free device memory"))?;
        Ok(free as u64)
    }

    /// How this context's modules were obtained so far.
    pub fn compile_stats(&self) -> CompileStats {
        self.stats.lock().expect("stats lock").clone()
    }

    /// The device architecture kernels are compiled for (`sm_90` on Hopper).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Streaming multiprocessors of the device.
    pub fn sm_count(&self) -> Result<u32, GpuError> {
        self.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
    }

    /// The most dynamic shared memory one block may be given (after opting in).
    pub fn max_shared_per_block(&self) -> Result<u32, GpuError> {
        self.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
    }

    /// Whether the device launches thread-block clusters (Hopper and later).
    pub fn cluster_launch(&self) -> Result<bool, GpuError> {
        self.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)
            .map(|v| v != 0)
    }

    /// Makes the context current on this thread, for a call to the driver itself.
    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(GpuError::driver("binding the context"))
    }

    fn attribute(&self, a: cudarc::driver::sys::CUdevice_attribute) -> Result<u32, GpuError> {
        self.ctx
            .attribute(a)
            .map(|v| v.max(0) as u32)
            .map_err(GpuError::driver(format!("reading device attribute {a:?}")))
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Function `function` of `module`, compiling the module on first use.
    pub fn kernel(&self, module: Module, function: &'static str) -> Result<Kernel, GpuError> {
        let m = self.module(module)?;
        let f = m.load_function(function).map_err(GpuError::driver(format!(
            "loading kernel {function} of module {}",
            module.name()
        )))?;
        let occupancy = self
            .occupancy
            .lock()
            .expect("occupancy lock")
            .entry((module, function))
            .or_default()
            .clone();
        Ok(Kernel::new(f, function, occupancy))
    }

    fn module(&self, module: Module) -> Result<Arc<CudaModule>, GpuError> {
        let mut modules = self.modules.lock().expect("module cache lock");
        if let Some(m) = modules.get(&module) {
            return Ok(m.clone());
        }
        let options = compile_options(&self.arch);
        let source = module.source()?;
        let entry = self
            .cache
            .path(&source, &self.arch, &options, nvrtc_version()?);
        let load = |image: Vec<u8>| self.ctx.load_module(Ptx::from_binary(image));
        let mut stats = self.stats.lock().expect("stats lock");
        // A cache entry is trusted only once its checksum matched and the driver took it.
        if let Some(path) = &entry {
            match KernelCache::load(path).map(load) {
                Some(Ok(m)) => {
                    stats.cached += 1;
                    modules.insert(module, m.clone());
                    return Ok(m);
                }
                Some(Err(_)) => stats.rebuilt += 1,
                None if path.exists() => stats.rebuilt += 1,
                None => {}
            }
        }
        let (cubin, _) = compile_cubin(module, &source, &options)?;
        stats.compiled += 1;
        if let Some(path) = &entry
            && let Err(e) = KernelCache::store(path, &cubin)
        {
            stats.cache_errors.push(e.to_string());
        }
        let m = load(cubin).map_err(GpuError::driver(format!(
            "loading module {}",
            module.name()
        )))?;
        modules.insert(module, m.clone());
        Ok(m)
    }

    /// A zeroed buffer of `len` elements (at least one is allocated).
    pub fn alloc<T: Elem>(&self, len: usize) -> Result<DeviceBuffer<T>, GpuError> {
        let slice = self
            .stream
            .alloc_zeros::<T>(len.max(1))
            .map_err(GpuError::driver(format!(
                "allocating {} bytes",
                len.max(1) * size_of::<T>()
            )))?;
        Ok(DeviceBuffer::new(slice, len))
    }

    /// A new buffer holding `src`.
    pub fn upload<T: Elem>(&self, src: &[T]) -> Result<DeviceBuffer<T>, GpuError> {
        let mut b = self.alloc(src.len())?;
        self.write(&mut b, src)?;
        Ok(b)
    }

    /// An event marking the work queued on this context's stream so far, for another stream
    /// to wait on ([`GpuContext::wait`]).
    pub fn record(&self) -> Result<GpuEvent, GpuError> {
        self.stream
            .record_event(Some(
                cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
            ))
            .map(GpuEvent)
            .map_err(GpuError::driver("recording an event"))
    }

    /// Makes the work queued on this context's stream from now on wait for `event`'s work
    /// (without blocking the host).
    pub fn wait(&self, event: &GpuEvent) -> Result<(), GpuError> {
        self.stream
            .wait(&event.0)
            .map_err(GpuError::driver("waiting for an event"))
    }

    /// The device address of `b`, for a table of addresses that a kernel reads (a population's
    /// member table). The address is only a number: whoever launches a kernel that reads or
    /// writes through it answers, in that launch's `// SAFETY:`, for the buffer living and being
    /// the kernel's alone until the kernel ends.
    pub fn address<T: Elem>(&self, b: &DeviceBuffer<T>) -> u64 {
        use cudarc::driver::DevicePtr;
        // Where cudarc tracks events the guard records a read on this stream; the kernel that
        // uses the address is queued on the same stream, after the buffer's writes.
        let (ptr, _guard) = b.raw().device_ptr(&self.stream);
        ptr
    }

    /// Copies `src` into the first `src.len()` elements of `dst`, which becomes that long
    /// (queued on the stream; kernels queued after it see the data).
    pub fn write<T: Elem>(&self, dst: &mut DeviceBuffer<T>, src: &[T]) -> Result<(), GpuError> {
        if src.len() > dst.capacity() {
            return Err(GpuError::Shape(format!(
                "{} elements into a buffer of {}",
                src.len(),
                dst.capacity()
            )));
        }
        if !src.is_empty() {
            self.stream
                .memcpy_htod(src, &mut dst.raw_mut().slice_mut(0..src.len()))
                .map_err(GpuError::driver(format!(
                    "copying {} bytes to the device",
                    std::mem::size_of_val(src)
                )))?;
        }
        dst.set_len(src.len());
        Ok(())
    }

    /// The buffer's elements read back (waits for the work queued before).
    pub fn download<T: Elem>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>, GpuError> {
        self.download_prefix(src, src.len())
    }

    /// The first `len` elements read back (waits for the work queued before).
    pub fn download_prefix<T: Elem>(
        &self,
        src: &DeviceBuffer<T>,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        if len > src.len() {
            return Err(GpuError::Shape(format!(
                "{len} elements read from a buffer of {}",
                src.len()
            )));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        self.stream
            .clone_dtoh(&src.raw().slice(0..len))
            .map_err(GpuError::driver(format!(
                "copying {} bytes from the device",
                len * size_of::<T>()
            )))
    }

    /// Copies `src` into `dst` on the device (queued; same length).
    pub fn copy<T: Elem>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<(), GpuError> {
        if src.len() != dst.len() {
            return Err(GpuError::Shape(format!(
                "device copy of {} elements into {}",
                src.len(),
                dst.len()
            )));
        }
        let n = src.len();
        if n == 0 {
            return Ok(());
        }
        self.stream
            .memcpy_dtod(&src.raw().slice(0..n), &mut dst.raw_mut().slice_mut(0..n))
            .map_err(GpuError::driver("copying on the device"))
    }

    /// Waits for all work queued on the stream.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(GpuError::driver("waiting for the device"))
    }

    /// Timestamps on this context's stream.
    pub fn marks(&self) -> EventMarks {
        EventMarks::new(self.stream.clone())
    }
}

/// What compiling one module for an architecture gave ([`compile_check`]).
#[derive(Debug, Clone)]
pub struct CompileCheck {
    /// Bytes of the CUBIN.
    pub cubin_bytes: usize,
    /// NVRTC's wall time (a run's first epoch pays it where the kernel cache lacks the module).
    pub seconds: f64,
    /// ptxas's account of each kernel and out-of-line function, a line each (`NAME: ...`):
    /// stack, spill stores and loads, registers, static shared memory.
    pub resources: Vec<String>,
}

/// Compiles `module` for `arch` (e.g. `sm_90`) with the options a context uses, without a device:
/// the CUBIN's size, the compile's time and ptxas's resource lines, or NVRTC's log. Needs only
/// libnvrtc (for checking kernels on machines without a GPU).
pub fn compile_check(module: Module, arch: &str) -> Result<CompileCheck, GpuError> {
    // SAFETY: only tries to dlopen the library by name; no symbol is called.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoCuda(
            "the NVRTC library (libnvrtc) could not be loaded".into(),
        ));
    }
    let mut options = compile_options(arch);
    // Only ptxas's report: the CUBIN is the one a context builds.
    options.push("--ptxas-options=-v".to_owned());
    // NVRTC 12.9 and later may answer a compile it has seen from a cache of its own, without
    // running ptxas: no resource lines and no compile time (seen with NVRTC 13 on the H200 host).
    // A variable no other compile declares makes this compile new; it changes no function.
    static CHECKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let source = format!(
        "{}\n__device__ int foxhunt_compile_check_{}_{nonce}_{};\n",
        module.source()?,
        std::process::id(),
        CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let start = std::time::Instant::now();
    let (cubin, log) = compile_cubin(module, &source, &options)?;
    // A function's lines follow its "Function properties for NAME": joined into one line each.
    let mut resources: Vec<String> = Vec::new();
    for line in log.lines() {
        let l = line.trim_start_matches("ptxas").trim_start();
        let l = l.strip_prefix("info").unwrap_or(l).trim_start();
        let l = l.trim_start_matches([':', '.']).trim();
        if let Some(name) = l.strip_prefix("Function properties for ") {
            resources.push(format!("{name}:"));
        } else if let Some(last) = resources.last_mut()
            && (l.contains("spill") || l.starts_with("Used "))
        {
            last.push_str(if last.ends_with(':') { " " } else { "; " });
            last.push_str(l);
        }
    }
    Ok(CompileCheck {
        cubin_bytes: cubin.len(),
        seconds: start.elapsed().as_secs_f64(),
        resources,
    })
}

/// NVRTC's options for `arch`, the same for every module.
fn compile_options(arch: &str) -> Vec<String> {
    vec![
        // The CPU reference never fuses multiply-adds; results must round alike.
        "--fmad=false".to_owned(),
        format!("--gpu-architecture={arch}"),
    ]
}

/// NVRTC's version, part of every cache key.
fn nvrtc_version() -> Result<(i32, i32), GpuError> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through the pointers, which point at live locals.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| GpuError::NoCuda(format!("NVRTC does not answer: {e:?}")))?;
    Ok((major, minor))
}

/// Compiles `module` with NVRTC to a CUBIN for the architecture `options` name, and NVRTC's log
/// of the compile (empty unless an option asks for more).
fn compile_cubin(
    module: Module,
    source: &str,
    options: &[String],
) -> Result<(Vec<u8>, String), GpuError> {
    let fail = |source: CompileError| {
        let log = match &source {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        };
        GpuError::Compile {
            module: module.name(),
            log,
            source,
        }
    };
    let src = CString::new(source).map_err(|_| {
        GpuError::Shape(format!("kernel module {} holds a NUL byte", module.name()))
    })?;
    let name = CString::new(format!("{}.cu", module.name())).expect("module names hold no NUL");
    let prog = nvrtc::create_program(&src, Some(&name))
        .map_err(|e| fail(CompileError::CreationError(e)))?;
    let log = || {
        // SAFETY: `prog` was made by create_program above and is not destroyed yet.
        unsafe { nvrtc::get_program_log(prog) }
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
                CString::new(bytes).unwrap_or_default()
            })
            .unwrap_or_default()
    };
    let out = match cubin_of(prog, options) {
        Ok(cubin) => Ok((cubin, log().to_string_lossy().into_owned())),
        Err(Ok(nvrtc_err)) => Err(fail(CompileError::CompileError {
            nvrtc: nvrtc_err,
            options: options.to_vec(),
            log: log(),
        })),
        Err(Err(get)) => Err(fail(CompileError::GetPtxError(get))),
    };
    // SAFETY: `prog` was made by create_program above and is destroyed once, here.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    out
}

/// Compiles `prog` and reads its CUBIN: a compile error is `Err(Ok(e))` (the log is still to
/// read), a failure to read the result `Err(Err(e))`.
fn cubin_of(
    prog: nvrtc_sys::nvrtcProgram,
    options: &[String],
) -> Result<Vec<u8>, Result<nvrtc::NvrtcError, nvrtc::NvrtcError>> {
    // SAFETY: `prog` is a live program made by create_program (the caller destroys it after).
    unsafe { nvrtc::compile_program(prog, options) }.map_err(Ok)?;
    let mut size = 0usize;
    // SAFETY: as above; NVRTC writes the CUBIN's size into the live local.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(Err)?;
    let mut cubin = vec![0u8; size];
    // SAFETY: as above; `cubin` holds the `size` bytes NVRTC said the CUBIN takes.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(Err)?;
    Ok(cubin)
}
