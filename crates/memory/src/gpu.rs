//! The CUDA implementation: one context and stream per device, NVRTC modules compiled for the
//! device's architecture and cached, the window arena and its buffer pool in device memory, the
//! GPU environment, and the device replay ring with on-device sampling.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchArgs,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};
use foxhunt_env::{EnvConfig, Execution, SessionRule};

use crate::MemoryError;
use crate::arena::{Epoch, FreeLists, PoolStats, WindowData, take_fitting};

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

/// Device buffers of one window's market data (what the kernels read).
pub struct DeviceWindow {
    features: CudaSlice<f32>,
    open: CudaSlice<f64>,
    close: CudaSlice<f64>,
    session: CudaSlice<u32>,
    contract: CudaSlice<u32>,
    rows: usize,
    cols: usize,
}

/// A pool of device buffers that window arenas are built in: a window whose shapes fit in
/// buffers an earlier window released allocates nothing (no cudaMalloc between windows in the
/// steady state).
pub struct DevicePool {
    ctx: Arc<GpuContext>,
    free: FreeLists<CudaSlice<f32>, CudaSlice<f64>, CudaSlice<u32>, CudaSlice<i64>>,
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

    /// The pool's bookkeeping so far.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// The device.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn fill<T: DeviceRepr + ValidAsZeroBits>(
        free: &mut Vec<CudaSlice<T>>,
        stats: &mut PoolStats,
        held: &mut u64,
        stream: &Arc<CudaStream>,
        src: &[T],
    ) -> Result<CudaSlice<T>, MemoryError> {
        let bytes = std::mem::size_of_val(src) as u64;
        let reused = take_fitting(free, src.len(), CudaSlice::len);
        stats.count(bytes, reused.is_some(), held);
        let mut buf = match reused {
            Some(b) => b,
            None => stream.alloc_zeros::<T>(src.len().max(1)).map_err(driver)?,
        };
        if !src.is_empty() {
            stream
                .memcpy_htod(src, &mut buf.slice_mut(0..src.len()))
                .map_err(driver)?;
        }
        stats.uploaded += bytes;
        Ok(buf)
    }

    /// Builds the arena of one window: one upload of its market data into pooled buffers (the
    /// copy is queued on the stream; kernels queued after it see the data). The arena holds the
    /// pool until it is dropped, so windows are strictly one after another.
    pub fn window(&mut self, data: &WindowData) -> Result<GpuArena<'_>, MemoryError> {
        let m = &data.market;
        if m.rows > u32::MAX as usize {
            return Err(MemoryError::Config(format!("{} rows exceed u32", m.rows)));
        }
        let contract: Vec<u32> = m.contract.iter().map(|&c| u32::from(c)).collect();
        let stream = self.ctx.stream().clone();
        let before = self.stats.uploaded;
        let (free, stats, held) = (&mut self.free, &mut self.stats, &mut self.held);
        let features = Self::fill(&mut free.f32, stats, held, &stream, &m.features)?;
        let open = Self::fill(&mut free.f64, stats, held, &stream, &m.open)?;
        let close = Self::fill(&mut free.f64, stats, held, &stream, &m.close)?;
        let session = Self::fill(&mut free.u32, stats, held, &stream, &m.session)?;
        let contract = Self::fill(&mut free.u32, stats, held, &stream, &contract)?;
        let uploaded = stats.uploaded - before;
        Ok(GpuArena {
            window: Some(DeviceWindow {
                features,
                open,
                close,
                session,
                contract,
                rows: m.rows,
                cols: m.cols,
            }),
            pool: self,
            exec: data.exec,
            uploaded,
        })
    }
}

/// One window's market data resident on the device for the window's life.
pub struct GpuArena<'p> {
    pool: &'p mut DevicePool,
    /// Present from construction until drop hands the buffers back.
    window: Option<DeviceWindow>,
    exec: Execution,
    uploaded: u64,
}

impl GpuArena<'_> {
    /// Bytes uploaded when the window began (the only host-to-device copy of window data).
    pub fn uploaded_bytes(&self) -> u64 {
        self.uploaded
    }
    /// Lends the window's data to epoch `index`. Nothing is copied.
    pub fn epoch(&self, index: usize) -> Epoch<'_, Self> {
        Epoch::new(self, index)
    }
    /// The pool's bookkeeping.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats
    }
    /// Execution terms.
    pub fn exec(&self) -> &Execution {
        &self.exec
    }
    /// Rows of market data.
    pub fn rows(&self) -> usize {
        self.buffers().rows
    }
    /// The device.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.pool.ctx
    }
    /// The device buffers (for kernels of other crates that read the window).
    pub fn buffers(&self) -> &DeviceWindow {
        self.window
            .as_ref()
            .expect("the window's buffers are present until the arena drops")
    }
}

impl Drop for GpuArena<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.window.take() {
            let free = &mut self.pool.free;
            free.f32.push(w.features);
            free.f64.push(w.open);
            free.f64.push(w.close);
            free.u32.push(w.session);
            free.u32.push(w.contract);
        }
    }
}

/// The scalars env_reset and env_step both take after the market buffers.
struct EnvScalars {
    cols: u32,
    split_start: u32,
    split_end: u32,
    lookback: u32,
    max_position: i32,
    upnl_scale: f32,
    tick_size: f64,
    seed: u64,
}

/// Pushes the arguments both kernels begin with, in their order in kernels/env_step.cu.
fn push_market<'a>(b: &mut LaunchArgs<'a>, w: &'a DeviceWindow, s: &'a EnvScalars) {
    b.arg(&w.features)
        .arg(&w.open)
        .arg(&w.close)
        .arg(&w.session)
        .arg(&w.contract)
        .arg(&s.cols);
    b.arg(&s.split_start)
        .arg(&s.split_end)
        .arg(&s.lookback)
        .arg(&s.max_position);
    b.arg(&s.upnl_scale).arg(&s.tick_size).arg(&s.seed);
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

/// N environments on the device over one split of a window resident in a [`GpuArena`]; the
/// environment borrows the arena, so it cannot outlive the window or copy its data.
///
/// The same semantics as `foxhunt_env::VecEnv` step for step: the kernels in kernels/env_step.cu
/// transcribe `exec::transition`, `next_entry`, `observe` and `episode_start`.
pub struct GpuVecEnv<'a> {
    ctx: Arc<GpuContext>,
    step_fn: CudaFunction,
    record_fn: CudaFunction,
    reset_fn: CudaFunction,
    window: &'a DeviceWindow,
    scalars: EnvScalars,
    params: StepParams,
    n: u32,
    dim: usize,
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

impl<'a> GpuVecEnv<'a> {
    /// `n` environments over rows `split` of the arena's window (nothing is uploaded but the
    /// environments' own zeroed state).
    pub fn new(
        arena: &'a GpuArena<'_>,
        cfg: EnvConfig,
        split: Range<usize>,
        n: usize,
        seed: u64,
    ) -> Result<Self, MemoryError> {
        let ctx = arena.context().clone();
        let exec = *arena.exec();
        if split.end > arena.rows() || split.len() < 2 || n == 0 || n > u32::MAX as usize {
            return Err(MemoryError::Config(format!(
                "split {split:?} of {} rows with {n} environments",
                arena.rows()
            )));
        }
        let s = ctx.stream().clone();
        let dim = cfg.obs_dim(arena.buffers().cols);
        Ok(Self {
            step_fn: ctx.function("env_step", crate::ENV_KERNELS, "env_step")?,
            record_fn: ctx.function("env_step", crate::ENV_KERNELS, "env_step_record")?,
            reset_fn: ctx.function("env_step", crate::ENV_KERNELS, "env_reset")?,
            window: arena.buffers(),
            scalars: EnvScalars {
                cols: arena.buffers().cols as u32,
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
            ctx,
            n: n as u32,
            dim,
        })
    }

    /// Number of environments.
    pub fn len(&self) -> usize {
        self.n as usize
    }
    /// Whether there are none (never: `new` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Observation length.
    pub fn obs_dim(&self) -> usize {
        self.dim
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
        push_market(&mut b, self.window, &self.scalars);
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
        self.launch_step(actions, None)
    }

    /// Steps every environment and writes this step's replay row into `replay` (asynchronous).
    pub fn step_record(
        &mut self,
        actions: &CudaSlice<u8>,
        replay: &mut DeviceReplay,
    ) -> Result<(), MemoryError> {
        if replay.n_env != self.n as usize {
            return Err(MemoryError::Config(format!(
                "replay rows of {} environments for {}",
                replay.n_env, self.n
            )));
        }
        self.launch_step(actions, Some(replay))
    }

    fn launch_step(
        &mut self,
        actions: &CudaSlice<u8>,
        replay: Option<&mut DeviceReplay>,
    ) -> Result<(), MemoryError> {
        if actions.len() != self.n as usize {
            return Err(MemoryError::Config(format!(
                "{} actions for {} environments",
                actions.len(),
                self.n
            )));
        }
        let cfg = self.launch_cfg();
        let stream = self.ctx.stream().clone();
        let f = if replay.is_some() {
            &self.record_fn
        } else {
            &self.step_fn
        };
        let mut b = stream.launch_builder(f);
        push_market(&mut b, self.window, &self.scalars);
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
        let row_base;
        if let Some(r) = replay {
            row_base = (r.written_rows % r.cap_rows as u64) * r.n_env as u64;
            r.written_rows += 1;
            b.arg(&mut r.t)
                .arg(&mut r.position)
                .arg(&mut r.entry)
                .arg(&mut r.action)
                .arg(&mut r.reward)
                .arg(&mut r.done)
                .arg(&row_base);
        }
        // SAFETY: the argument list matches env_step's (env_step_record's, with the ring
        // buffers and row base) signature in kernels/env_step.cu; every environment buffer holds
        // n (obs: n * obs_dim) elements, the ring holds cap_rows * n slots and row_base + n is
        // within it, the market arrays hold the rows the split indexes, and the grid covers n
        // threads exactly once.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }

    /// Copies a device buffer to the host (synchronizes), for tests and logging.
    pub fn download<T: DeviceRepr + Default + Clone>(
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

/// The device replay ring: one row per environment step of all N environments, holding the
/// state before the step (bar, position, entry), the action, the reward and the done code.
/// Written by [`GpuVecEnv::step_record`]; sampled on the device by [`DeviceReplay::sample`].
pub struct DeviceReplay {
    ctx: Arc<GpuContext>,
    sample_fn: CudaFunction,
    n_env: usize,
    cap_rows: usize,
    written_rows: u64,
    draws: u64,
    t: CudaSlice<u32>,
    position: CudaSlice<i32>,
    entry: CudaSlice<f64>,
    action: CudaSlice<u8>,
    reward: CudaSlice<f32>,
    done: CudaSlice<u8>,
}

/// A sampled batch on the device (written by [`DeviceReplay::sample`]).
pub struct DeviceBatch {
    /// `[batch * obs_dim]`.
    pub obs: CudaSlice<f32>,
    /// `[batch]`.
    pub actions: CudaSlice<i32>,
    /// n-step discounted returns, `[batch]`.
    pub returns: CudaSlice<f32>,
    /// `[batch * obs_dim]`.
    pub next_obs: CudaSlice<f32>,
    /// gamma^k, 0 after a terminal step, `[batch]`.
    pub discounts: CudaSlice<f32>,
    /// 1, or 0 for a start whose n steps were cut by truncation, `[batch]`.
    pub weights: CudaSlice<f32>,
    batch: usize,
}

/// What a replay sample needs besides the ring: the environment's observation settings.
pub struct SampleSpec<'a> {
    /// The arena the ring's bars index.
    pub arena: &'a GpuArena<'a>,
    /// The environment configuration (look-back, scales).
    pub env: &'a EnvConfig,
    /// n of n-step returns.
    pub n_step: u32,
    /// Discount.
    pub gamma: f32,
    /// Seed of the sampler (Philox key).
    pub seed: u64,
}

impl DeviceReplay {
    /// A ring of `cap_rows` steps of `n_env` environments.
    pub fn new(ctx: &Arc<GpuContext>, n_env: usize, cap_rows: usize) -> Result<Self, MemoryError> {
        if n_env == 0 || cap_rows < 2 {
            return Err(MemoryError::Config(format!(
                "replay of {cap_rows} rows of {n_env} environments"
            )));
        }
        let s = ctx.stream().clone();
        let slots = n_env * cap_rows;
        Ok(Self {
            sample_fn: ctx.function("env_step", crate::ENV_KERNELS, "replay_sample")?,
            ctx: ctx.clone(),
            n_env,
            cap_rows,
            written_rows: 0,
            draws: 0,
            t: s.alloc_zeros(slots).map_err(driver)?,
            position: s.alloc_zeros(slots).map_err(driver)?,
            entry: s.alloc_zeros(slots).map_err(driver)?,
            action: s.alloc_zeros(slots).map_err(driver)?,
            reward: s.alloc_zeros(slots).map_err(driver)?,
            done: s.alloc_zeros(slots).map_err(driver)?,
        })
    }

    /// Rows (steps) written so far.
    pub fn written_rows(&self) -> u64 {
        self.written_rows
    }
    /// Rows the ring holds.
    pub fn capacity_rows(&self) -> usize {
        self.cap_rows
    }
    /// Samples drawn so far (the Philox counter of the next draw).
    pub fn draws(&self) -> u64 {
        self.draws
    }

    /// Device buffers for a batch of `batch` transitions of `obs_dim`.
    pub fn batch_buffers(&self, batch: usize, obs_dim: usize) -> Result<DeviceBatch, MemoryError> {
        let s = self.ctx.stream();
        Ok(DeviceBatch {
            obs: s.alloc_zeros(batch * obs_dim).map_err(driver)?,
            actions: s.alloc_zeros(batch).map_err(driver)?,
            returns: s.alloc_zeros(batch).map_err(driver)?,
            next_obs: s.alloc_zeros(batch * obs_dim).map_err(driver)?,
            discounts: s.alloc_zeros(batch).map_err(driver)?,
            weights: s.alloc_zeros(batch).map_err(driver)?,
            batch,
        })
    }

    /// Draws `out`'s batch uniformly from the ring on the device (Philox keyed by the seed,
    /// counter by the draw number): no host round trip (asynchronous).
    pub fn sample(
        &mut self,
        spec: &SampleSpec<'_>,
        out: &mut DeviceBatch,
    ) -> Result<(), MemoryError> {
        let w = spec.arena.buffers();
        let (cols, lookback) = (w.cols as u32, spec.env.lookback as u32);
        let max_position = i32::from(spec.env.max_position);
        let tick = spec.arena.exec.tick_size;
        let (n_env, cap, written) = (self.n_env as u32, self.cap_rows as u64, self.written_rows);
        let batch = out.batch as u32;
        let draw = self.draws;
        self.draws += 1;
        let stream = self.ctx.stream().clone();
        let mut b = stream.launch_builder(&self.sample_fn);
        b.arg(&w.features)
            .arg(&w.close)
            .arg(&cols)
            .arg(&lookback)
            .arg(&max_position)
            .arg(&spec.env.upnl_scale)
            .arg(&tick);
        b.arg(&self.t)
            .arg(&self.position)
            .arg(&self.entry)
            .arg(&self.action)
            .arg(&self.reward)
            .arg(&self.done);
        b.arg(&n_env)
            .arg(&cap)
            .arg(&written)
            .arg(&spec.n_step)
            .arg(&spec.gamma)
            .arg(&spec.seed)
            .arg(&draw);
        b.arg(&mut out.obs)
            .arg(&mut out.actions)
            .arg(&mut out.returns)
            .arg(&mut out.next_obs)
            .arg(&mut out.discounts)
            .arg(&mut out.weights)
            .arg(&batch);
        let cfg = LaunchConfig {
            grid_dim: (batch.div_ceil(128), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the argument list matches replay_sample's signature in kernels/replay.cu; the
        // ring buffers hold cap_rows * n_env slots and every index the kernel forms is taken
        // modulo that; the batch buffers hold batch (obs: batch * obs_dim) elements for the
        // obs_dim the arena's columns and the look-back give; the grid covers batch threads.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }

    /// The ring read back: (t, position, entry, action, reward, done) per slot (synchronizes;
    /// for tests).
    #[allow(clippy::type_complexity)]
    pub fn download(
        &self,
    ) -> Result<(Vec<u32>, Vec<i32>, Vec<f64>, Vec<u8>, Vec<f32>, Vec<u8>), MemoryError> {
        let s = self.ctx.stream();
        Ok((
            s.clone_dtoh(&self.t).map_err(driver)?,
            s.clone_dtoh(&self.position).map_err(driver)?,
            s.clone_dtoh(&self.entry).map_err(driver)?,
            s.clone_dtoh(&self.action).map_err(driver)?,
            s.clone_dtoh(&self.reward).map_err(driver)?,
            s.clone_dtoh(&self.done).map_err(driver)?,
        ))
    }
}

impl DeviceBatch {
    /// The batch read back (synchronizes): obs, actions, returns, next_obs, discounts, weights.
    #[allow(clippy::type_complexity)]
    pub fn download(
        &self,
        ctx: &GpuContext,
    ) -> Result<(Vec<f32>, Vec<i32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>), MemoryError> {
        let s = ctx.stream();
        Ok((
            s.clone_dtoh(&self.obs).map_err(driver)?,
            s.clone_dtoh(&self.actions).map_err(driver)?,
            s.clone_dtoh(&self.returns).map_err(driver)?,
            s.clone_dtoh(&self.next_obs).map_err(driver)?,
            s.clone_dtoh(&self.discounts).map_err(driver)?,
            s.clone_dtoh(&self.weights).map_err(driver)?,
        ))
    }
}
