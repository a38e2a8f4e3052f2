//! The GPU crate's error type: what failed, with the driver's or NVRTC's own error as the source.

/// Errors of foxhunt-gpu.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable CUDA: built without the `cuda` feature, or no driver or device on this machine.
    #[error("no CUDA device found: {0}")]
    NoCuda(String),
    /// The CUDA driver refused an operation.
    #[cfg(feature = "cuda")]
    #[error("CUDA driver error while {what}")]
    Driver {
        /// What foxhunt was doing.
        what: String,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// NVRTC could not compile a kernel module; `log` is NVRTC's log.
    #[cfg(feature = "cuda")]
    #[error("NVRTC could not compile kernel module {module}: {log}")]
    Compile {
        /// The module.
        module: &'static str,
        /// NVRTC's compile log.
        log: String,
        /// NVRTC's error.
        #[source]
        source: cudarc::nvrtc::CompileError,
    },
    /// Sizes that do not fit together (a programmer's or a user's setting).
    #[error("{0}")]
    Shape(String),
}

#[cfg(feature = "cuda")]
impl GpuError {
    /// A `map_err` adapter: the driver refused `what`.
    pub(crate) fn driver(
        what: impl Into<String>,
    ) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        let what = what.into();
        move |source| Self::Driver { what, source }
    }
}
