//! Data parallelism's gradient reduction: gradients live in a few flat buckets, and each bucket
//! is all-reduced on a communication stream as soon as the backward pass has finished every
//! gradient in it, overlapped with the backward pass of the earlier layers (PyTorch DDP's scheme).
//!
//! Ordering is by events only: the compute stream records a bucket's "ready" event after the
//! bucket's last gradient op, the communication stream waits for it and all-reduces the bucket;
//! after the backward pass the compute stream waits for the communication stream's last record.
//! Two timing events on the compute stream, recorded just before and just after that wait, give
//! the time it spent waiting for communication (both on one stream: ACL times no other pair).

use crate::exec::{view, Exec};
use crate::model::ParamSpec;
use crate::Error;
use std::sync::Arc;
use unihal::{Buffer, Communicator, DType, Event, EventFlags, ReduceOp, Stream, TensorView};

/// Gradient elements are placed at multiples of this many elements in their bucket (64 bytes in
/// f32), so every gradient view starts aligned for vector loads.
const ALIGN_ELEMENTS: u64 = 16;

struct Bucket {
    buffer: Buffer,
    elements: u64,
    params: usize,
    ready: Arc<dyn Event>,
}

/// The gradients of one rank and their reduction across the data-parallel ranks.
///
/// Ownership: owns the bucket buffers (from the rank's caching allocator) and the communication
/// stream; the gradient views borrow the buffers. Thread safety: the rank's thread.
pub struct Reducer {
    /// Every parameter's gradient (layout order, compute dtype): views into the buckets.
    pub grads: Vec<TensorView>,
    buckets: Vec<Bucket>,
    bucket_of: Vec<usize>,
    pending: Vec<usize>,
    dtype: DType,
    overlap: bool,
    comm: Option<(Arc<dyn Communicator>, Arc<dyn Stream>)>,
    comm_done: Arc<dyn Event>,
    /// Timing events on the compute stream around its wait for `comm_done`.
    wait_start: Arc<dyn Event>,
    wait_end: Arc<dyn Event>,
}

impl Reducer {
    /// Buckets of at most `bucket_bytes` (a larger gradient gets a bucket of its own) over the
    /// parameters `specs`, in their order, zeroed. With `comm` (more than one rank), gradients are
    /// summed over the ranks: started per bucket during the backward pass with `overlap`, all after
    /// it without.
    ///
    /// # Errors
    /// The backend's.
    pub fn new(
        x: &Exec,
        specs: &[ParamSpec],
        dtype: DType,
        bucket_bytes: usize,
        comm: Option<Arc<dyn Communicator>>,
        overlap: bool,
    ) -> Result<Reducer, Error> {
        let comm = match comm.filter(|c| c.size() > 1) {
            None => None,
            Some(c) => {
                let cs = x.dev.create_stream().map_err(Error::hal("create_stream"))?;
                Some((c, cs))
            }
        };
        // Place the gradients: consecutive parameters share a bucket up to the size limit.
        let esize = dtype.size() as u64;
        let mut places = Vec::with_capacity(specs.len()); // (bucket, element offset)
        let mut sizes: Vec<(u64, usize)> = Vec::new(); // (elements, params) per bucket
        for p in specs {
            let n = p.numel().next_multiple_of(ALIGN_ELEMENTS);
            let last = sizes.len().wrapping_sub(1);
            match sizes.last_mut() {
                Some((used, params)) if (*used + n) * esize <= bucket_bytes as u64 => {
                    places.push((last, *used));
                    *used += n;
                    *params += 1;
                }
                _ => {
                    places.push((sizes.len(), 0));
                    sizes.push((n, 1));
                }
            }
        }
        let event = |timing: bool| {
            x.dev
                .create_event(EventFlags {
                    disable_timing: !timing,
                })
                .map_err(Error::hal("create_event"))
        };
        let mut buckets = Vec::with_capacity(sizes.len());
        for &(elements, params) in &sizes {
            let t = x.full(dtype, &[elements], 0.0)?;
            buckets.push(Bucket {
                buffer: t.buffer,
                elements,
                params,
                ready: event(false)?,
            });
        }
        let grads = specs
            .iter()
            .zip(&places)
            .map(|(p, &(b, off))| {
                let whole =
                    TensorView::contiguous(&buckets[b].buffer, dtype, &[buckets[b].elements]);
                view(
                    &whole,
                    off,
                    &p.shape,
                    &unihal::op::contiguous_strides(&p.shape),
                )
            })
            .collect();
        Ok(Reducer {
            grads,
            bucket_of: places.iter().map(|&(b, _)| b).collect(),
            pending: vec![0; buckets.len()],
            buckets,
            dtype,
            overlap,
            comm,
            comm_done: event(false)?,
            wait_start: event(true)?,
            wait_end: event(true)?,
        })
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Starts a step's last backward pass: every bucket waits for all its gradients again.
    pub fn begin(&mut self) {
        for (p, b) in self.pending.iter_mut().zip(&self.buckets) {
            *p = b.params;
        }
    }

    /// Parameter `p`'s gradient is complete (its op is enqueued on the compute stream); starts its
    /// bucket's all-reduce when it was the bucket's last and overlap is on.
    ///
    /// # Errors
    /// The engine's.
    pub fn ready(&mut self, x: &Exec, p: usize) -> Result<(), Error> {
        let b = self.bucket_of[p];
        self.pending[b] -= 1;
        if self.pending[b] == 0 && self.overlap {
            self.reduce(x, b)?;
        }
        Ok(())
    }

    fn reduce(&self, x: &Exec, b: usize) -> Result<(), Error> {
        let Some((comm, cs)) = &self.comm else {
            return Ok(());
        };
        let bucket = &self.buckets[b];
        x.s.record_event(&bucket.ready)
            .map_err(Error::hal("record_event"))?;
        cs.wait_event(&bucket.ready)
            .map_err(Error::hal("wait_event"))?;
        comm.all_reduce(
            &bucket.buffer,
            &bucket.buffer,
            bucket.elements,
            self.dtype,
            ReduceOp::Sum,
            cs,
        )
        .map_err(Error::hal("all_reduce"))
    }

    /// Ends the backward pass: starts what has not started and makes the compute stream wait for
    /// every reduction.
    ///
    /// # Errors
    /// The engine's or the backend's.
    pub fn finish(&mut self, x: &Exec) -> Result<(), Error> {
        let Some((_, cs)) = &self.comm else {
            return Ok(());
        };
        if !self.overlap {
            for b in 0..self.buckets.len() {
                self.reduce(x, b)?;
            }
        }
        debug_assert!(self.pending.iter().all(|&p| p == 0));
        cs.record_event(&self.comm_done)
            .map_err(Error::hal("record_event"))?;
        let record = |e: &Arc<dyn Event>| x.s.record_event(e).map_err(Error::hal("record_event"));
        record(&self.wait_start)?;
        x.s.wait_event(&self.comm_done)
            .map_err(Error::hal("wait_event"))?;
        record(&self.wait_end)
    }

    /// Milliseconds the compute stream waited for communication in the last step: from the end of
    /// its backward pass to the end of the last reduction (0 when communication finished first or
    /// there is none). Call after the step's work completed.
    ///
    /// # Errors
    /// The backend's when it cannot time events.
    pub fn wait_ms(&self) -> Result<f64, Error> {
        if self.comm.is_none() {
            return Ok(0.0);
        }
        let ms = self
            .wait_start
            .elapsed_ms(&*self.wait_end)
            .map_err(Error::hal("elapsed_ms"))?;
        Ok(f64::from(ms).max(0.0))
    }

    /// Waits for the communication stream and returns its sticky error: a failed all-reduce
    /// fails the communication stream, not the compute stream that waited for it, so every step
    /// checks here (the wait itself is free: the compute stream already waited for that work).
    ///
    /// # Errors
    /// The communication stream's sticky error.
    pub fn synchronize(&self) -> Result<(), Error> {
        match &self.comm {
            Some((_, cs)) => cs.synchronize().map_err(Error::hal("synchronize")),
            None => Ok(()),
        }
    }
}
