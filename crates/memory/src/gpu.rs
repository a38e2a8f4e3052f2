//! The CUDA implementation: one context and stream per device, NVRTC modules compiled for the
//! device's architecture and cached, and the GPU environment.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchArgs, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};
use foxhunt_env::{EnvConfig, Execution, MarketData, SessionRule};

use crate::MemoryError;

fn driver(e: impl std::fmt::Display) -> MemoryError {
    MemoryError::Driver(e.to_string())
}

/// A CUDA device: its context (the primary one, shared with burn-cuda), one stream, and the
/// kernel modules compiled so far.
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
}

impl GpuContext {
    /// Opens device `ordinal`. Checks that the driver and NVRTC libraries can be loaded before
    /// touching cudarc, which panics rather than returning an error when they cannot.
    pub fn new(ordinal: usize) -> Result<Arc<Self>, MemoryError> {
        // SAFETY: only tries to dlopen the libraries by name; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(MemoryError::NoCuda(
                "the CUDA driver library (libcuda) could not be loaded".into(),
            ));
        }
        // SAFETY: as above, for NVRTC.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(MemoryError::NoCuda(
                "the NVRTC library (libnvrtc) could not be loaded".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| MemoryError::NoCuda(format!("device {ordinal}: {e}")))?;
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let stream = ctx.default_stream();
        Ok(Arc::new(Self {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            modules: Mutex::new(HashMap::new()),
        }))
    }

    /// The stream all of foxhunt's work on this device goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device architecture kernels are compiled for (`sm_90` on Hopper).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// A function of module `name` (source `src`), compiling the module on first use.
    pub fn function(
        &self,
        name: &'static str,
        src: &str,
        function: &str,
    ) -> Result<CudaFunction, MemoryError> {
        let mut modules = self.modules.lock().expect("module cache lock");
        let module = match modules.get(name) {
            Some(m) => m.clone(),
            None => {
                let opts = CompileOptions {
                    // The CPU reference never fuses multiply-adds; f64 results must round alike.
                    fmad: Some(false),
                    options: vec![format!("--gpu-architecture={}", self.arch)],
                    name: Some(format!("{name}.cu")),
                    ..Default::default()
                };
                let ptx = compile_ptx_with_opts(src, opts).map_err(|e| match e {
                    CompileError::CompileError { log, .. } => MemoryError::Compile {
                        module: name.into(),
                        log: log.to_string_lossy().into_owned(),
                    },
                    other => MemoryError::Compile {
                        module: name.into(),
                        log: other.to_string(),
                    },
                })?;
                let m = self.ctx.load_module(ptx).map_err(driver)?;
                modules.insert(name, m.clone());
                m
            }
        };
        module.load_function(function).map_err(driver)
    }
}

/// The market data on the device, with the scalars that env_reset and env_step both take first.
struct DeviceMarket {
    features: CudaSlice<f32>,
    open: CudaSlice<f64>,
    close: CudaSlice<f64>,
    session: CudaSlice<u32>,
    contract: CudaSlice<u32>,
    cols: u32,
    split_start: u32,
    split_end: u32,
    lookback: u32,
    max_position: i32,
    upnl_scale: f32,
    tick_size: f64,
    seed: u64,
}

impl DeviceMarket {
    /// Pushes the arguments both kernels begin with, in their order in kernels/env_step.cu.
    fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.features)
            .arg(&self.open)
            .arg(&self.close)
            .arg(&self.session)
            .arg(&self.contract)
            .arg(&self.cols);
        b.arg(&self.split_start)
            .arg(&self.split_end)
            .arg(&self.lookback)
            .arg(&self.max_position);
        b.arg(&self.upnl_scale).arg(&self.tick_size).arg(&self.seed);
    }
}

/// The scalars only env_step takes.
struct StepParams {
    multiplier: f64,
    cost_per_side: f64,
    slippage_price: f64,
    episode_steps: u32,
    reward_scale: f64,
    risk_penalty: f64,
    flatten_at_close: i32,
}

/// N environments on the device over one split of market data uploaded once.
///
/// The same semantics as `foxhunt_env::VecEnv` step for step: the kernels in kernels/env_step.cu
/// transcribe `exec::transition`, `next_entry`, `observe` and `episode_start`.
pub struct GpuVecEnv {
    ctx: Arc<GpuContext>,
    step_fn: CudaFunction,
    reset_fn: CudaFunction,
    market: DeviceMarket,
    params: StepParams,
    n: u32,
    t: CudaSlice<u32>,
    position: CudaSlice<i32>,
    entry: CudaSlice<f64>,
    steps: CudaSlice<u32>,
    episode: CudaSlice<u32>,
    /// Observations, `[n * obs_dim]`.
    pub obs: CudaSlice<f32>,
    /// Rewards of the last step, `[n]`.
    pub rewards: CudaSlice<f32>,
    /// Done codes of the last step, `[n]` (foxhunt_env::done).
    pub dones: CudaSlice<u8>,
}

impl GpuVecEnv {
    /// Uploads `market` (one copy) and makes `n` environments over rows `split`.
    pub fn new(
        ctx: &Arc<GpuContext>,
        market: &MarketData,
        exec: Execution,
        cfg: EnvConfig,
        split: Range<usize>,
        n: usize,
        seed: u64,
    ) -> Result<Self, MemoryError> {
        if split.end > market.rows
            || split.len() < 2
            || n == 0
            || n > u32::MAX as usize
            || market.rows > u32::MAX as usize
        {
            return Err(MemoryError::Config(format!(
                "split {split:?} of {} rows with {n} environments",
                market.rows
            )));
        }
        let s = ctx.stream();
        let contract: Vec<u32> = market.contract.iter().map(|&c| u32::from(c)).collect();
        let dim = cfg.obs_dim(market.cols);
        Ok(Self {
            step_fn: ctx.function("env_step", crate::ENV_KERNELS, "env_step")?,
            reset_fn: ctx.function("env_step", crate::ENV_KERNELS, "env_reset")?,
            market: DeviceMarket {
                features: s.clone_htod(&market.features).map_err(driver)?,
                open: s.clone_htod(&market.open).map_err(driver)?,
                close: s.clone_htod(&market.close).map_err(driver)?,
                session: s.clone_htod(&market.session).map_err(driver)?,
                contract: s.clone_htod(&contract).map_err(driver)?,
                cols: market.cols as u32,
                split_start: split.start as u32,
                split_end: split.end as u32,
                lookback: cfg.lookback as u32,
                max_position: i32::from(cfg.max_position),
                upnl_scale: cfg.upnl_scale,
                tick_size: exec.tick_size,
                seed,
            },
            params: StepParams {
                multiplier: exec.multiplier,
                cost_per_side: exec.cost_per_side,
                slippage_price: exec.slippage_price,
                episode_steps: cfg.episode_steps,
                reward_scale: cfg.reward_scale,
                risk_penalty: cfg.risk_penalty,
                flatten_at_close: i32::from(cfg.session_rule == SessionRule::FlattenAtClose),
            },
            t: s.alloc_zeros(n).map_err(driver)?,
            position: s.alloc_zeros(n).map_err(driver)?,
            entry: s.alloc_zeros(n).map_err(driver)?,
            steps: s.alloc_zeros(n).map_err(driver)?,
            episode: s.alloc_zeros(n).map_err(driver)?,
            obs: s.alloc_zeros(n * dim).map_err(driver)?,
            rewards: s.alloc_zeros(n).map_err(driver)?,
            dones: s.alloc_zeros(n).map_err(driver)?,
            ctx: ctx.clone(),
            n: n as u32,
        })
    }

    fn launch_cfg(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.n.div_ceil(256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Starts episode 0 of every environment and writes the observations (asynchronous).
    pub fn reset(&mut self) -> Result<(), MemoryError> {
        let cfg = self.launch_cfg();
        let stream = self.ctx.stream().clone();
        let mut b = stream.launch_builder(&self.reset_fn);
        self.market.push(&mut b);
        b.arg(&mut self.t)
            .arg(&mut self.position)
            .arg(&mut self.entry)
            .arg(&mut self.steps)
            .arg(&mut self.episode);
        b.arg(&mut self.obs).arg(&self.n);
        // SAFETY: the argument list matches env_reset's signature in kernels/env_step.cu; every
        // buffer holds n (obs: n * obs_dim) elements and the grid covers n threads exactly once.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }

    /// Steps every environment with `actions` (`[n]`, on the device; asynchronous).
    pub fn step(&mut self, actions: &CudaSlice<u8>) -> Result<(), MemoryError> {
        if actions.len() != self.n as usize {
            return Err(MemoryError::Config(format!(
                "{} actions for {} environments",
                actions.len(),
                self.n
            )));
        }
        let cfg = self.launch_cfg();
        let stream = self.ctx.stream().clone();
        let mut b = stream.launch_builder(&self.step_fn);
        self.market.push(&mut b);
        let p = &self.params;
        b.arg(&p.multiplier)
            .arg(&p.cost_per_side)
            .arg(&p.slippage_price)
            .arg(&p.episode_steps);
        b.arg(&p.reward_scale)
            .arg(&p.risk_penalty)
            .arg(&p.flatten_at_close);
        b.arg(&mut self.t)
            .arg(&mut self.position)
            .arg(&mut self.entry)
            .arg(&mut self.steps)
            .arg(&mut self.episode);
        b.arg(actions)
            .arg(&mut self.obs)
            .arg(&mut self.rewards)
            .arg(&mut self.dones)
            .arg(&self.n);
        // SAFETY: the argument list matches env_step's signature in kernels/env_step.cu; every
        // buffer holds n (obs: n * obs_dim) elements, the market arrays hold the rows the split
        // indexes, and the grid covers n threads exactly once.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }

    /// Copies a device buffer to the host (synchronizes), for tests and logging.
    pub fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        buf: &CudaSlice<T>,
    ) -> Result<Vec<T>, MemoryError> {
        self.ctx.stream().clone_dtoh(buf).map_err(driver)
    }

    /// Uploads actions.
    pub fn upload_actions(&self, actions: &[u8]) -> Result<CudaSlice<u8>, MemoryError> {
        self.ctx.stream().clone_htod(actions).map_err(driver)
    }

    /// Waits for all work queued on the stream.
    pub fn synchronize(&self) -> Result<(), MemoryError> {
        self.ctx.stream().synchronize().map_err(driver)
    }

    /// Current bar and position of every environment (synchronizes).
    pub fn state(&self) -> Result<(Vec<u32>, Vec<i32>), MemoryError> {
        Ok((self.download(&self.t)?, self.download(&self.position)?))
    }
}
