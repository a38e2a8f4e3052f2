//! A CUDA device as foxhunt uses it: the primary context, one stream, the compiled modules, and
//! every copy between host and device memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaModule, CudaStream};
use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};

use crate::buffer::{DeviceBuffer, Elem};
use crate::launch::Kernel;
use crate::{EventMarks, GpuError, Module};

/// A CUDA device: its context (the primary one, shared with burn-cuda), the stream all of
/// foxhunt's work on it goes to, and the kernel modules compiled so far.
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    modules: Mutex<HashMap<Module, Arc<CudaModule>>>,
}

impl GpuContext {
    /// Opens device `ordinal`. Checks that the driver and NVRTC libraries can be loaded before
    /// touching cudarc, which panics rather than returning an error when they cannot.
    pub fn new(ordinal: usize) -> Result<Arc<Self>, GpuError> {
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
        let stream = ctx.default_stream();
        Ok(Arc::new(Self {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            modules: Mutex::new(HashMap::new()),
        }))
    }

    /// The device architecture kernels are compiled for (`sm_90` on Hopper).
    pub fn arch(&self) -> &str {
        &self.arch
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
        Ok(Kernel::new(f, function))
    }

    fn module(&self, module: Module) -> Result<Arc<CudaModule>, GpuError> {
        let mut modules = self.modules.lock().expect("module cache lock");
        if let Some(m) = modules.get(&module) {
            return Ok(m.clone());
        }
        let opts = CompileOptions {
            // The CPU reference never fuses multiply-adds; f64 results must round alike.
            fmad: Some(false),
            options: vec![format!("--gpu-architecture={}", self.arch)],
            name: Some(format!("{}.cu", module.name())),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(module.source(), opts).map_err(|source| {
            let log = match &source {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => other.to_string(),
            };
            GpuError::Compile {
                module: module.name(),
                log,
                source,
            }
        })?;
        let m = self.ctx.load_module(ptx).map_err(GpuError::driver(format!(
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
