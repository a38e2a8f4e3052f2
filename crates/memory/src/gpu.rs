//! The CUDA implementation: one context and stream per device, NVRTC modules compiled for the
//! device's architecture and cached, and the GPU environment.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
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

/// N environments on the device over one split of market data uploaded once.
///
/// The same semantics as `foxhunt_env::VecEnv` step for step: the kernels in kernels/env_step.cu
/// transcribe `exec::transition`, `next_entry`, `observe` and `episode_start`.
pub struct GpuVecEnv {
    ctx: Arc<GpuContext>,
    step_fn: CudaFunction,
    reset_fn: CudaFunction,
    cfg: EnvConfig,
    exec: Execution,
    split: Range<usize>,
    seed: u64,
    n: usize,
    cols: usize,
    features: CudaSlice<f32>,
    open: CudaSlice<f64>,
    close: CudaSlice<f64>,
    session: CudaSlice<u32>,
    contract: CudaSlice<u32>,
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
        if split.end > market.rows || split.len() < 2 || n == 0 || market.rows > u32::MAX as usize {
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
            features: s.clone_htod(&market.features).map_err(driver)?,
            open: s.clone_htod(&market.open).map_err(driver)?,
            close: s.clone_htod(&market.close).map_err(driver)?,
            session: s.clone_htod(&market.session).map_err(driver)?,
            contract: s.clone_htod(&contract).map_err(driver)?,
            t: s.alloc_zeros(n).map_err(driver)?,
            position: s.alloc_zeros(n).map_err(driver)?,
            entry: s.alloc_zeros(n).map_err(driver)?,
            steps: s.alloc_zeros(n).map_err(driver)?,
            episode: s.alloc_zeros(n).map_err(driver)?,
            obs: s.alloc_zeros(n * dim).map_err(driver)?,
            rewards: s.alloc_zeros(n).map_err(driver)?,
            dones: s.alloc_zeros(n).map_err(driver)?,
            ctx: ctx.clone(),
            cfg,
            exec,
            split,
            seed,
            n,
            cols: market.cols,
        })
    }

    fn launch_cfg(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((self.n as u32).div_ceil(256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Starts episode 0 of every environment and writes the observations (asynchronous).
    pub fn reset(&mut self) -> Result<(), MemoryError> {
        let (cols, start, end, lookback, maxp) = (
            self.cols as u32,
            self.split.start as u32,
            self.split.end as u32,
            self.cfg.lookback as u32,
            i32::from(self.cfg.max_position),
        );
        let (upnl, tick, seed, n) = (
            self.cfg.upnl_scale,
            self.exec.tick_size,
            self.seed,
            self.n as u32,
        );
        let cfg = self.launch_cfg();
        let stream = self.ctx.stream().clone();
        let mut b = stream.launch_builder(&self.reset_fn);
        b.arg(&self.features)
            .arg(&self.open)
            .arg(&self.close)
            .arg(&self.session)
            .arg(&self.contract)
            .arg(&cols);
        b.arg(&start)
            .arg(&end)
            .arg(&lookback)
            .arg(&maxp)
            .arg(&upnl)
            .arg(&tick)
            .arg(&seed);
        b.arg(&mut self.t)
            .arg(&mut self.position)
            .arg(&mut self.entry)
            .arg(&mut self.steps)
            .arg(&mut self.episode)
            .arg(&mut self.obs)
            .arg(&n);
        // SAFETY: the argument list matches env_reset's signature in kernels/env_step.cu; every
        // buffer holds n (obs: n * obs_dim) elements and the grid covers n threads exactly once.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }

    /// Steps every environment with `actions` (`[n]`, on the device; asynchronous).
    pub fn step(&mut self, actions: &CudaSlice<u8>) -> Result<(), MemoryError> {
        if actions.len() != self.n {
            return Err(MemoryError::Config(format!(
                "{} actions for {} environments",
                actions.len(),
                self.n
            )));
        }
        let (cols, start, end, lookback, maxp) = (
            self.cols as u32,
            self.split.start as u32,
            self.split.end as u32,
            self.cfg.lookback as u32,
            i32::from(self.cfg.max_position),
        );
        let (upnl, tick, seed, n) = (
            self.cfg.upnl_scale,
            self.exec.tick_size,
            self.seed,
            self.n as u32,
        );
        let (mult, cps, slip, ep_steps) = (
            self.exec.multiplier,
            self.exec.cost_per_side,
            self.exec.slippage_price,
            self.cfg.episode_steps,
        );
        let (scale, penalty) = (self.cfg.reward_scale, self.cfg.risk_penalty);
        let flatten = i32::from(self.cfg.session_rule == SessionRule::FlattenAtClose);
        let cfg = self.launch_cfg();
        let stream = self.ctx.stream().clone();
        let mut b = stream.launch_builder(&self.step_fn);
        b.arg(&self.features)
            .arg(&self.open)
            .arg(&self.close)
            .arg(&self.session)
            .arg(&self.contract)
            .arg(&cols);
        b.arg(&start)
            .arg(&end)
            .arg(&lookback)
            .arg(&maxp)
            .arg(&upnl)
            .arg(&tick)
            .arg(&seed);
        b.arg(&mult)
            .arg(&cps)
            .arg(&slip)
            .arg(&ep_steps)
            .arg(&scale)
            .arg(&penalty)
            .arg(&flatten);
        b.arg(&mut self.t)
            .arg(&mut self.position)
            .arg(&mut self.entry)
            .arg(&mut self.steps)
            .arg(&mut self.episode);
        b.arg(actions)
            .arg(&mut self.obs)
            .arg(&mut self.rewards)
            .arg(&mut self.dones)
            .arg(&n);
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
