//! Streams: in-order queues of device work.

use crate::buffer::Buffer;
use crate::device::{Device, DeviceId, NativeHandle};
use crate::error::{HalError, Invalid, Result};
use crate::event::Event;
use crate::graph::{CaptureMode, CaptureStatus, Graph};
use crate::host::HostBuffer;
use crate::launch::{KernelArgs, LaunchConfig};
use crate::module::Function;
use crate::op::OpCall;
use std::any::Any;
use std::sync::Arc;

/// The identity of a stream, unique in the process for its whole run (never reused, unlike an
/// address). Sub-allocators key their stream-ordered reuse on it (see [`Buffer::use_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(u64);

impl StreamId {
    /// A new identity, different from every other one handed out in this process. For backends:
    /// one per stream, made when the stream is created.
    pub fn fresh() -> StreamId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        StreamId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    /// The number behind the identity (for logs and snapshots).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The identity numbered `n`, for [`crate::CaptureId::stream_id`], whose numbers come from
    /// [`StreamId::fresh`].
    pub(crate) fn from_raw(n: u64) -> StreamId {
        StreamId(n)
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream#{}", self.0)
    }
}

/// Something a backend's queued work uses (a buffer, host-buffer use, function or event
/// handle), kept alive until the work ran. For backends.
pub type Keep = Box<dyn std::any::Any + Send + Sync>;

/// The checks of [`Stream::copy_peer`] on a stream of device `me` whose peers are `peers`
/// (`OptionalCaps::peer_devices`): one side must be `me`, the other `me` or a peer.
///
/// # Errors
/// [`HalError::InvalidArgument`] when neither side is on `me`; [`HalError::Unsupported`] when a
/// side is on a device without peer access.
pub fn check_peer_copy(me: DeviceId, peers: &[u32], src: DeviceId, dst: DeviceId) -> Result<()> {
    if src != me && dst != me {
        return Err(HalError::invalid(
            "src",
            Invalid::WrongDevice {
                expected: me,
                found: src,
            },
        ));
    }
    let reachable =
        |d: DeviceId| d == me || (d.backend == me.backend && peers.contains(&d.ordinal));
    for (arg, d) in [("src", src), ("dst", dst)] {
        if !reachable(d) {
            return Err(HalError::unsupported(format!(
                "peer copy between {me} and {d}: no peer access ({arg})"
            )));
        }
    }
    Ok(())
}

/// The value pattern of a fill: a byte, or a 16- or 32-bit word repeated (the range's length must be
/// a multiple of the word size). Wide fills need `OptionalCaps::wide_fill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillValue {
    U8(u8),
    U16(u16),
    U32(u32),
}

impl FillValue {
    /// Width of the pattern in bytes.
    pub const fn width(self) -> u64 {
        match self {
            FillValue::U8(_) => 1,
            FillValue::U16(_) => 2,
            FillValue::U32(_) => 4,
        }
    }

    /// The check every backend makes on a fill of `len` bytes at device address `addr`: both
    /// multiples of the pattern width.
    ///
    /// # Errors
    /// [`Invalid::Value`] for argument `dst`.
    pub fn check_aligned(self, addr: u64, len: u64) -> Result<()> {
        let w = self.width();
        if addr % w != 0 || len % w != 0 {
            return Err(HalError::invalid(
                "dst",
                Invalid::Value {
                    value: format!("address {addr:#x}, length {len}"),
                    accepted: format!("multiples of the {w}-byte pattern width"),
                },
            ));
        }
        Ok(())
    }
}

/// An in-order queue of work on one device.
///
/// Every method that enqueues returns as soon as the work is queued; the work runs asynchronously to
/// the host, in enqueue order. Arguments are validated at enqueue: misuse returns
/// [`HalError::InvalidArgument`] and enqueues nothing. Failures that happen while the work runs are
/// *sticky*: the stream keeps the first one, and every later enqueue, `synchronize` and `query`
/// returns it (as on CUDA; create a new stream to continue).
///
/// Ownership: `Arc<dyn Stream>`; queued work keeps its buffers, events and functions alive. Dropping
/// the last handle lets queued work finish, then releases the stream.
/// Thread safety: enqueue from any number of host threads; each enqueue is atomic with respect to the
/// others.
pub trait Stream: Send + Sync {
    /// The device the stream runs on.
    fn device(&self) -> &Arc<dyn Device>;

    /// This stream's identity, made by [`StreamId::fresh`] at creation. Queued work keeps its
    /// buffers with [`Buffer::use_on`] under this identity: a caching allocator reuses a block on
    /// the stream its last uses are queued on, so the identity must be this stream's own.
    fn stream_id(&self) -> StreamId;

    /// Copies `len` bytes from HAL-owned host memory to device memory.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for a buffer of another device, a freed buffer, a busy host
    /// buffer or a range out of bounds.
    #[track_caller]
    fn copy_h2d(
        &self,
        src: &HostBuffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()>;

    /// Copies `src` to device memory, staging it into HAL-owned memory before returning, so `src` may
    /// be freed right away. One extra host copy compared with [`Stream::copy_h2d`].
    ///
    /// # Errors
    /// As [`Stream::copy_h2d`], plus [`HalError::OutOfMemory`] for the staging buffer.
    #[track_caller]
    fn copy_h2d_staged(&self, src: &[u8], dst: &Buffer, dst_offset: u64) -> Result<()>;

    /// Copies `len` bytes from device memory to HAL-owned host memory.
    ///
    /// # Errors
    /// As [`Stream::copy_h2d`].
    #[track_caller]
    fn copy_d2h(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &HostBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()>;

    /// Copies `len` bytes between two buffers of this stream's device.
    ///
    /// # Errors
    /// As [`Stream::copy_h2d`]; [`crate::Invalid::Overlap`] when the ranges overlap (vendor copies
    /// do not define overlap, so no backend accepts it).
    #[track_caller]
    fn copy_d2d(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()>;

    /// Copies between devices of the same backend; either side may be this stream's device, the other
    /// must be listed in `OptionalCaps::peer_devices`. Ordered on this stream only. Overlap is as
    /// for [`Stream::copy_d2d`].
    ///
    /// # Errors
    /// [`HalError::Unsupported`] without peer access; otherwise as [`Stream::copy_h2d`].
    #[track_caller]
    fn copy_peer(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()>;

    /// Fills `len` bytes at `offset` with a repeated pattern.
    ///
    /// # Errors
    /// As [`Stream::copy_h2d`]; [`HalError::InvalidArgument`] when `offset`/`len` are not multiples
    /// of the pattern width; [`HalError::Unsupported`] for wide patterns without `wide_fill`.
    #[track_caller]
    fn fill(&self, dst: &Buffer, offset: u64, len: u64, value: FillValue) -> Result<()>;

    /// Launches a kernel.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in meaning, not only in size, and every
    /// device address they contain must stay valid, inside its allocation, until the kernel has run;
    /// in a stream capture, the kernel runs at every replay, so until the graph is destroyed (the
    /// graph keeps the buffers in `args`, not memory reached only through raw addresses).
    /// The HAL cannot check what a kernel does with them.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for a function of another device or backend, a shape outside the
    /// device limits, or argument sizes that do not match the recorded parameter sizes.
    #[track_caller]
    unsafe fn launch(
        &self,
        function: &Arc<dyn Function>,
        config: &LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()>;

    /// Enqueues a library operation (see [`crate::op`]).
    ///
    /// # Errors
    /// [`HalError::Unsupported`] when the op/dtype pair is not in `OptionalCaps::ops`;
    /// [`HalError::InvalidArgument`] from [`OpCall::validate`] or for buffers of another device.
    #[track_caller]
    fn run_op(&self, call: &OpCall) -> Result<()> {
        Err(HalError::unsupported(format!(
            "op {} on {}",
            call.op,
            self.device_id()
        )))
    }

    /// Runs `f` on a host thread once all previously enqueued work has completed; later work waits
    /// for it. `f` must not enqueue on or synchronize this stream.
    ///
    /// # Errors
    /// [`HalError::Unsupported`] without `OptionalCaps::host_callbacks`.
    #[track_caller]
    fn host_callback(&self, f: Box<dyn FnOnce() + Send>) -> Result<()>;

    /// Records `event` at the current end of this stream.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for an event of another device or backend.
    #[track_caller]
    fn record_event(&self, event: &Arc<dyn Event>) -> Result<()>;

    /// Makes later work on this stream wait for the event's most recent record. The event may belong
    /// to another device of the same backend.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for an event of another backend.
    #[track_caller]
    fn wait_event(&self, event: &Arc<dyn Event>) -> Result<()>;

    /// Allocates device memory usable by work enqueued on this stream after this call.
    ///
    /// # Errors
    /// [`HalError::OutOfMemory`].
    #[track_caller]
    fn alloc_async(&self, len: usize) -> Result<Buffer>;

    /// Frees the allocation behind `buffer` in stream order. Every handle of the allocation becomes
    /// unusable at once (later use is [`crate::Invalid::FreeEnqueued`]). The memory returns to the
    /// device when the stream reaches this point and no other handle remains (queued work on other
    /// streams and host clones keep it alive, so safe code never reaches freed memory).
    ///
    /// # Errors
    /// [`crate::Invalid::FreeEnqueued`] when already freed; a buffer of another device.
    #[track_caller]
    fn free_async(&self, buffer: &Buffer) -> Result<()>;

    /// Blocks until all enqueued work has completed.
    ///
    /// # Errors
    /// The sticky error, if any work failed; [`crate::Invalid::Capture`] while the stream is
    /// capturing (the capture is then invalidated).
    #[track_caller]
    fn synchronize(&self) -> Result<()>;

    /// True when all enqueued work has completed.
    ///
    /// # Errors
    /// The sticky error, if any work failed; [`crate::Invalid::Capture`] while the stream is
    /// capturing (the capture is then invalidated).
    #[track_caller]
    fn query(&self) -> Result<bool>;

    /// Begins capturing: work enqueued on this stream from now on is recorded into a graph instead
    /// of running (see [`crate::graph`] for joining other streams and the rules while capturing).
    ///
    /// # Errors
    /// [`HalError::Unsupported`] without `OptionalCaps::graphs`; [`crate::Invalid::Capture`] when
    /// the stream is already capturing or joined to a capture; the sticky error.
    #[track_caller]
    fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        let _ = mode;
        Err(HalError::unsupported(format!(
            "stream capture on {}",
            self.device_id()
        )))
    }

    /// Ends the capture this stream began and returns the executable graph of the captured work.
    /// The stream (and every stream that joined) leaves capture whether or not this succeeds.
    ///
    /// # Errors
    /// [`crate::Invalid::Capture`] when the stream did not begin a capture (a joined stream cannot
    /// end it), when the capture was invalidated by an illegal call, or when a stream that joined
    /// has not rejoined the origin; the vendor's instantiation error.
    #[track_caller]
    fn end_capture(&self) -> Result<Arc<dyn Graph>> {
        Err(HalError::unsupported(format!(
            "stream capture on {}",
            self.device_id()
        )))
    }

    /// Whether this stream is capturing (as the origin or joined).
    fn capture_status(&self) -> CaptureStatus {
        CaptureStatus::None
    }

    /// Enqueues a replay of `graph`. It runs after earlier work on this stream and after earlier
    /// replays of the same graph on any stream; later work on this stream waits for it.
    ///
    /// # Errors
    /// [`HalError::Unsupported`] without graphs; [`crate::Invalid::WrongDevice`] or
    /// [`crate::Invalid::ForeignHandle`] for a graph of another device or backend;
    /// [`crate::Invalid::Capture`] on a capturing stream (graphs are not nested here); the sticky
    /// error.
    #[track_caller]
    fn launch_graph(&self, graph: &Arc<dyn Graph>) -> Result<()> {
        let _ = graph;
        Err(HalError::unsupported(format!(
            "graph launch on {}",
            self.device_id()
        )))
    }

    /// The sticky asynchronous error, if work on this stream has failed.
    fn async_error(&self) -> Option<HalError>;

    /// The vendor stream handle (`CUstream`, `hipStream_t`, `aclrtStream`).
    fn native_handle(&self) -> NativeHandle;

    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;

    /// The device's id (shorthand).
    fn device_id(&self) -> DeviceId {
        self.device().id()
    }

    /// Writes `src` to device memory and waits for the copy (and all earlier work on the stream).
    ///
    /// # Errors
    /// As [`Stream::copy_h2d_staged`] and [`Stream::synchronize`].
    #[track_caller]
    fn write(&self, dst: &Buffer, dst_offset: u64, src: &[u8]) -> Result<()> {
        self.copy_h2d_staged(src, dst, dst_offset)?;
        self.synchronize()
    }

    /// Reads device memory into `out`, waiting for the copy and all earlier work on the stream.
    /// Goes through a HAL-owned staging buffer, so `out` is never written by a stream worker.
    ///
    /// # Errors
    /// As [`Stream::copy_d2h`] and [`Stream::synchronize`].
    #[track_caller]
    fn read(&self, src: &Buffer, src_offset: u64, out: &mut [u8]) -> Result<()> {
        let staging = self.device().alloc_host(out.len())?;
        self.copy_d2h(src, src_offset, &staging, 0, out.len() as u64)?;
        self.synchronize()?;
        out.copy_from_slice(&staging.map()?);
        Ok(())
    }
}

impl std::fmt::Debug for dyn Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({})", self.device_id())
    }
}
