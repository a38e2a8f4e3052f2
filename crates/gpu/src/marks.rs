//! Timestamps on the stream (CUDA events): recording one costs a few microseconds and no wait;
//! the intervals are read once, when the caller asks.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::GpuError;

/// A series of marks on a stream; the events are made once and reused series after series.
pub struct EventMarks {
    stream: Arc<CudaStream>,
    events: Vec<CudaEvent>,
    used: usize,
}

impl EventMarks {
    pub(crate) fn new(stream: Arc<CudaStream>) -> Self {
        Self {
            stream,
            events: Vec::new(),
            used: 0,
        }
    }

    /// Starts a new series: forgets earlier marks and records the first one.
    pub fn restart(&mut self) -> Result<(), GpuError> {
        self.used = 0;
        self.mark()
    }

    /// Records a mark after all the work queued so far (does not wait). A mark that fails is
    /// left out of the series.
    pub fn mark(&mut self) -> Result<(), GpuError> {
        if self.used == self.events.len() {
            let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
            let e = self
                .stream
                .context()
                .new_event(Some(flags))
                .map_err(GpuError::driver("creating a timing event"))?;
            self.events.push(e);
        }
        self.events[self.used]
            .record(&self.stream)
            .map_err(GpuError::driver("recording a timing event"))?;
        self.used += 1;
        Ok(())
    }

    /// Milliseconds between consecutive marks of the series, in order (waits for the device).
    pub fn intervals(&mut self) -> Result<Vec<f64>, GpuError> {
        let Some(last) = self.used.checked_sub(1) else {
            return Ok(Vec::new());
        };
        self.events[last]
            .synchronize()
            .map_err(GpuError::driver("waiting for a timing event"))?;
        (1..self.used)
            .map(|i| {
                self.events[i - 1]
                    .elapsed_ms(&self.events[i])
                    .map(f64::from)
                    .map_err(GpuError::driver("reading a timing event"))
            })
            .collect()
    }
}
