//! A batch of n-step transitions on the device: what the replay sampler writes and the learner
//! reads, neither knowing the other.

use crate::{DeviceBuffer, GpuContext, GpuError};

/// `batch` sampled transitions, on the device.
pub struct DeviceBatch {
    /// Observations, `[batch * obs_dim]`.
    pub obs: DeviceBuffer<f32>,
    /// Actions taken, `[batch]`.
    pub actions: DeviceBuffer<i32>,
    /// n-step discounted returns, `[batch]`.
    pub returns: DeviceBuffer<f32>,
    /// Observations n steps later, `[batch * obs_dim]`.
    pub next_obs: DeviceBuffer<f32>,
    /// gamma^k, 0 after a terminal step, `[batch]`.
    pub discounts: DeviceBuffer<f32>,
    /// Importance weights: 1, or 0 for a start whose n steps were cut by truncation, `[batch]`.
    pub weights: DeviceBuffer<f32>,
    batch: usize,
    obs_dim: usize,
}

/// A batch on the host, in [`DeviceBatch`]'s layout.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostBatchParts {
    /// `[batch * obs_dim]`.
    pub obs: Vec<f32>,
    /// `[batch]`.
    pub actions: Vec<i32>,
    /// `[batch]`.
    pub returns: Vec<f32>,
    /// `[batch * obs_dim]`.
    pub next_obs: Vec<f32>,
    /// `[batch]`.
    pub discounts: Vec<f32>,
    /// `[batch]`.
    pub weights: Vec<f32>,
}

impl DeviceBatch {
    /// Zeroed buffers for `batch` transitions of `obs_dim` floats.
    pub fn new(ctx: &GpuContext, batch: usize, obs_dim: usize) -> Result<Self, GpuError> {
        Ok(Self {
            obs: ctx.alloc(batch * obs_dim)?,
            actions: ctx.alloc(batch)?,
            returns: ctx.alloc(batch)?,
            next_obs: ctx.alloc(batch * obs_dim)?,
            discounts: ctx.alloc(batch)?,
            weights: ctx.alloc(batch)?,
            batch,
            obs_dim,
        })
    }

    /// Transitions in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Floats per observation.
    pub fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    /// Copies a host batch in (for tests and benchmarks; the trainer samples on the device).
    pub fn upload(&mut self, ctx: &GpuContext, h: &HostBatchParts) -> Result<(), GpuError> {
        if h.actions.len() != self.batch || h.obs.len() != self.batch * self.obs_dim {
            return Err(GpuError::Shape(format!(
                "a host batch of {} actions into a device batch of {}",
                h.actions.len(),
                self.batch
            )));
        }
        ctx.write(&mut self.obs, &h.obs)?;
        ctx.write(&mut self.actions, &h.actions)?;
        ctx.write(&mut self.returns, &h.returns)?;
        ctx.write(&mut self.next_obs, &h.next_obs)?;
        ctx.write(&mut self.discounts, &h.discounts)?;
        ctx.write(&mut self.weights, &h.weights)
    }

    /// The batch read back (waits for the device).
    pub fn download(&self, ctx: &GpuContext) -> Result<HostBatchParts, GpuError> {
        Ok(HostBatchParts {
            obs: ctx.download(&self.obs)?,
            actions: ctx.download(&self.actions)?,
            returns: ctx.download(&self.returns)?,
            next_obs: ctx.download(&self.next_obs)?,
            discounts: ctx.download(&self.discounts)?,
            weights: ctx.download(&self.weights)?,
        })
    }
}
