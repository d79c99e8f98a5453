//! One rank's execution context: its device, its compute stream and its caching allocator, and the
//! few helpers the model needs on top of the op catalogue (tensors from the allocator, views,
//! uploads and reads). Nothing here knows which backend it runs on.

use crate::Error;
use std::sync::Arc;
use unihal::alloc::CachingAllocator;
use unihal::{DType, Device, OpCall, OpId, Scalar, Stream, TensorView};

/// A device, its compute stream and the caching allocator every buffer comes from.
///
/// Ownership: holds the device and stream; tensors it hands out keep their memory alive until
/// dropped (the allocator reuses it in stream order). Thread safety: one rank's thread.
pub struct Exec {
    pub dev: Arc<dyn Device>,
    pub s: Arc<dyn Stream>,
    pub alloc: CachingAllocator,
}

impl Exec {
    /// A compute stream and an allocator on `dev`, configured by `UNIHAL_ALLOC_CONF`
    /// (`max_split_size_mb:N`, `memory_fraction:F`) as every user of the allocator is.
    ///
    /// # Errors
    /// The backend's, when it cannot create a stream or an allocator; an invalid
    /// `UNIHAL_ALLOC_CONF`.
    pub fn new(dev: Arc<dyn Device>) -> Result<Exec, Error> {
        let s = dev.create_stream().map_err(Error::hal("create_stream"))?;
        let alloc = CachingAllocator::from_env(dev.clone())
            .map_err(Error::hal("the allocator (UNIHAL_ALLOC_CONF)"))?;
        Ok(Exec { dev, s, alloc })
    }

    /// An uninitialised dense tensor from the allocator, for work on the compute stream.
    ///
    /// # Errors
    /// Out of memory.
    pub fn tensor(&self, dt: DType, shape: &[u64]) -> Result<TensorView, Error> {
        let n: u64 = shape.iter().product();
        let b = self
            .alloc
            .alloc(&self.s, (n as usize * dt.size()).max(1))
            .map_err(Error::hal("alloc"))?;
        Ok(TensorView::contiguous(&b, dt, shape))
    }

    /// A tensor filled with `value`.
    ///
    /// # Errors
    /// As [`Exec::tensor`] and [`Exec::run`].
    pub fn full(&self, dt: DType, shape: &[u64], value: f64) -> Result<TensorView, Error> {
        let t = self.tensor(dt, shape)?;
        self.run(OpCall::fill(t.clone(), Scalar::F64(value)))?;
        Ok(t)
    }

    /// Enqueues `call` on the compute stream.
    ///
    /// # Errors
    /// The op's error, naming it.
    pub fn run(&self, call: OpCall) -> Result<(), Error> {
        self.s.run_op(&call).map_err(|e| Error::Op {
            op: call.op.to_string(),
            source: Box::new(e),
        })
    }

    /// `out = a @ b * alpha + beta * out`.
    ///
    /// # Errors
    /// As [`Exec::run`].
    pub fn matmul(
        &self,
        a: &TensorView,
        b: &TensorView,
        out: &TensorView,
        alpha: f64,
        beta: f64,
    ) -> Result<(), Error> {
        self.run(OpCall::matmul(
            a.clone(),
            b.clone(),
            out.clone(),
            alpha,
            beta,
        ))
    }

    /// `out = a + b` (b broadcasts).
    ///
    /// # Errors
    /// As [`Exec::run`].
    pub fn add(&self, a: &TensorView, b: &TensorView, out: &TensorView) -> Result<(), Error> {
        self.run(OpCall::binary(OpId::Add, a.clone(), b.clone(), out.clone()))
    }

    /// A dense tensor of `dt` holding the little-endian `bytes`, copied in stream order.
    fn upload(&self, bytes: &[u8], dt: DType, shape: &[u64]) -> Result<TensorView, Error> {
        let t = self.tensor(dt, shape)?;
        self.s
            .copy_h2d_staged(bytes, &t.buffer, 0)
            .map_err(Error::hal("copy_h2d_staged"))?;
        Ok(t)
    }

    /// A tensor holding `data` (i64), copied in stream order.
    ///
    /// # Errors
    /// As [`Exec::tensor`]; the copy's.
    pub fn upload_i64(&self, data: &[i64], shape: &[u64]) -> Result<TensorView, Error> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload(&bytes, DType::I64, shape)
    }

    /// A tensor of `dt` holding `data`, converted on the device from f32 when `dt` is not f32.
    ///
    /// # Errors
    /// As [`Exec::upload_i64`].
    pub fn upload_f32(&self, data: &[f32], dt: DType, shape: &[u64]) -> Result<TensorView, Error> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = self.upload(&bytes, DType::F32, shape)?;
        self.cast_to(&t, dt)
    }

    /// `t` converted to `dt` (`t` itself when it has that dtype).
    ///
    /// # Errors
    /// As [`Exec::run`].
    pub fn cast_to(&self, t: &TensorView, dt: DType) -> Result<TensorView, Error> {
        if t.dtype == dt {
            return Ok(t.clone());
        }
        let out = self.tensor(dt, &t.shape)?;
        self.run(OpCall::cast(t.clone(), out.clone()))?;
        Ok(out)
    }

    /// The values of `t` as f32, after all queued work (a synchronisation point).
    ///
    /// # Errors
    /// The stream's sticky error or the copy's.
    pub fn read_f32(&self, t: &TensorView) -> Result<Vec<f32>, Error> {
        let t = self.cast_to(t, DType::F32)?;
        let mut out = vec![0u8; t.numel() as usize * 4];
        self.s
            .read(&t.buffer, t.offset, &mut out)
            .map_err(Error::hal("read"))?;
        Ok(out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// The transpose of the last two dims (a stride swap, no copy).
pub fn tr(t: &TensorView) -> TensorView {
    let mut v = t.clone();
    let n = v.shape.len();
    v.shape.swap(n - 2, n - 1);
    v.strides.swap(n - 2, n - 1);
    v
}

/// `t` seen with another shape and strides, `elements` further into its storage.
pub fn view(t: &TensorView, elements: u64, shape: &[u64], strides: &[i64]) -> TensorView {
    TensorView {
        offset: t.offset + elements * t.dtype.size() as u64,
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        ..t.clone()
    }
}

/// A dense tensor seen with another shape of the same element count.
pub fn reshape(t: &TensorView, shape: &[u64]) -> TensorView {
    view(t, 0, shape, &unihal::op::contiguous_strides(shape))
}
