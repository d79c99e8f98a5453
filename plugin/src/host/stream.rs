//! A plugin's stream as a HAL [`Stream`].
//!
//! The host makes the HAL's checks (the buffer is this plugin's, on this device, not freed, in
//! range; host buffers not mapped) before calling the plugin, and keeps what the plugin cannot
//! know it must keep: host-buffer uses (the HAL's map protocol lives on the host) and blocks of
//! a host-side caching allocator (whose owner must learn which streams still use them). These go
//! into the HAL's [`Retention`], sealed behind plugin events, exactly as a GPU backend keeps
//! what its vendor queue uses. Whole allocations passed as handles need nothing: the plugin's
//! queued work keeps its own handle of the memory (header rule 5); a launch's argument buffers
//! cross as bare addresses, so the host keeps those, whole or not. A stream that never keeps anything (no host
//! copy, no allocator block) never takes the retention lock.

use super::device::{PluginDevice, PluginHostMem, PluginMem};
use super::event::PluginEvent;
use super::module::PluginFunction;
use super::node::NodePool;
use super::Plugin;
use crate::conv;
use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use unihal_hal::retention::Retention;
use unihal_hal::{
    Buffer, Device, DeviceId, Event, FillValue, Function, HalError, HostBuffer, HostUse, Invalid,
    Keep, KernelArgs, LaunchConfig, NativeHandle, OpCall, Result, Stream, StreamId, UseHolder,
};
use unihal_plugin_abi::*;

/// A plugin stream. Dropping it never waits: what its queued work still keeps is released by a
/// thread that waits for the work.
///
/// Thread safety: enqueue from any thread (the plugin serialises its own queue, rule 6).
pub struct PluginStream {
    p: &'static Plugin,
    raw: *mut UhStream,
    dev: Arc<PluginDevice>,
    dyn_dev: Arc<dyn Device>,
    id: DeviceId,
    sid: StreamId,
    /// What queued work keeps (events are raw `*mut UhEvent` as `usize`).
    kept: parking_lot::Mutex<Retention<usize>>,
    /// Set at the first keep: until then nothing is kept and no lock is taken.
    keeps: AtomicBool,
    /// A host callback that panicked (sticky, as the HAL's streams make it).
    callback_error: OnceLock<HalError>,
    /// Host callback nodes, recycled (used with a plugin that has `host_callback_node`).
    nodes: Arc<NodePool>,
    me: Weak<PluginStream>,
}

// SAFETY: the raw handle is an opaque token the plugin accepts from any thread (header rule 6).
unsafe impl Send for PluginStream {}
// SAFETY: as above.
unsafe impl Sync for PluginStream {}

impl PluginStream {
    pub(super) fn create(dev: Arc<PluginDevice>) -> Result<Arc<PluginStream>> {
        let p = dev.plugin();
        let mut raw = std::ptr::null_mut();
        // SAFETY: the entry's contract.
        p.call(
            p.api.stream_create,
            "stream_create",
            "stream create",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(dev.raw(), &mut raw, e) },
        )?;
        if raw.is_null() {
            return Err(p.broke("stream_create", "returned UH_OK with a NULL stream"));
        }
        let id = dev.id();
        Ok(Arc::new_cyclic(|me| PluginStream {
            p,
            raw,
            dyn_dev: dev.clone() as Arc<dyn Device>,
            dev,
            id,
            sid: StreamId::fresh(),
            kept: parking_lot::Mutex::new(Retention::new()),
            keeps: AtomicBool::new(false),
            callback_error: OnceLock::new(),
            nodes: NodePool::new(),
            me: me.clone(),
        }))
    }

    /// The plugin stream behind a HAL stream of this plugin.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] for another backend's stream.
    pub(crate) fn of<'a>(s: &'a Arc<dyn Stream>, p: &'static Plugin) -> Result<&'a PluginStream> {
        s.as_any()
            .downcast_ref::<PluginStream>()
            .filter(|ps| std::ptr::eq(ps.p, p))
            .ok_or_else(|| {
                HalError::invalid(
                    "stream",
                    Invalid::ForeignHandle {
                        expected: format!("a stream of plugin {}", p.name),
                        found: format!("a stream of {}", s.device_id()),
                    },
                )
            })
    }

    pub(crate) fn raw(&self) -> *mut UhStream {
        self.raw
    }

    /// The plugin allocation and offset of `[offset, offset+len)` of `b`, after the HAL's checks
    /// on `device` (this stream's, or a peer's for peer copies).
    pub(crate) fn mem(
        &self,
        b: &Buffer,
        arg: &'static str,
        device: DeviceId,
        offset: u64,
        len: u64,
    ) -> Result<(*mut UhMem, u64)> {
        let m = b.downcast_allocation::<PluginMem>(arg)?;
        if !std::ptr::eq(m.p, self.p) {
            return Err(HalError::invalid(
                arg,
                Invalid::ForeignHandle {
                    expected: format!("a buffer of plugin {}", self.p.name),
                    found: format!("a buffer of plugin {}", m.p.name),
                },
            ));
        }
        b.check_use(arg, device, offset, len)?;
        Ok((m.raw, b.offset() + offset))
    }

    fn host_mem(h: &HostBuffer, arg: &'static str, p: &'static Plugin) -> Result<*mut UhHostMem> {
        match h.allocation().as_any().downcast_ref::<PluginHostMem>() {
            Some(m) if std::ptr::eq(m.p, p) => Ok(m.raw),
            _ => Err(HalError::invalid(
                arg,
                Invalid::ForeignHandle {
                    expected: format!("a host buffer of plugin {}", p.name),
                    found: format!("a host buffer of {}", h.device()),
                },
            )),
        }
    }

    /// Keeps, until the work queued so far has run, what the plugin cannot keep for the host:
    /// blocks of a host-side sub-allocator among `bufs` (the plugin keeps the allocation, not
    /// the block's owner informed), and `extra` (host-buffer uses; the buffers of a launch's
    /// arguments, which cross as bare addresses the plugin cannot know to keep).
    pub(crate) fn keep_for_work<'a>(
        &self,
        bufs: impl IntoIterator<Item = &'a Buffer>,
        extra: impl IntoIterator<Item = Keep>,
    ) {
        let mut keep: Vec<Keep> = bufs
            .into_iter()
            .filter(|b| b.is_sub_allocated())
            .map(|b| b.use_on(self.sid))
            .collect();
        keep.extend(extra);
        if keep.is_empty() {
            return;
        }
        self.keeps.store(true, Ordering::Release);
        let (p, dev, raw) = (self.p, self.dev.raw(), self.raw);
        let sealed = self.kept.lock().keep(
            keep,
            || {
                let mut ev = std::ptr::null_mut();
                // SAFETY: the entry's contract; flags 1: no timing.
                p.call(
                    p.api.event_create,
                    "event_create",
                    "event create",
                    |f, e| unsafe { f(dev, 1, &mut ev, e) },
                )
                .and_then(|_| {
                    if ev.is_null() {
                        Err(p.broke("event_create", "returned UH_OK with a NULL event"))
                    } else {
                        Ok(ev as usize)
                    }
                })
                .map_err(|e| e.to_string())
            },
            |ev| {
                // SAFETY: the entry's contract.
                p.call(
                    p.api.event_record,
                    "event_record",
                    "event record",
                    |f, e| unsafe { f(raw, ev as *mut UhEvent, e) },
                )
                .map_err(|e| e.to_string())
            },
        );
        if let Err(e) = sealed {
            tracing::warn!(target: "unihal::plugin", "{e}; kept until a synchronisation");
        }
    }

    fn event_done(p: &'static Plugin, ev: usize) -> bool {
        let mut done = 0u32;
        // SAFETY: the entry's contract.
        p.call(
            p.api.event_query,
            "event_query",
            "event query",
            |f, e| unsafe { f(ev as *mut UhEvent, &mut done, e) },
        )
        .is_ok_and(|_| done != 0)
    }

    fn sticky(&self) -> Result<()> {
        match self.callback_error.get() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// A host copy: the host buffer's use begins here (map protocol) and is kept until the
    /// copy ran.
    fn host_copy(
        &self,
        (host, host_arg, host_offset): (&HostBuffer, &'static str, u64),
        enqueue: impl FnOnce(*mut UhHostMem) -> Result<()>,
        len: u64,
    ) -> Result<()> {
        self.sticky()?;
        let raw = Self::host_mem(host, host_arg, self.p)?;
        let holder: Weak<dyn UseHolder> = self.me.clone();
        let range = host.begin_use_by(host_arg, host_offset, len, holder)?;
        if len == 0 {
            return Ok(());
        }
        enqueue(raw)?;
        self.keep_for_work([], Some(Box::new(range) as Keep));
        Ok(())
    }

    /// Releases what covered work kept after a plugin call that saw it complete (`ok`).
    fn settle(&self, cover: unihal_hal::retention::SyncCover, ok: bool) {
        let p = self.p;
        self.kept
            .lock()
            .end_sync(cover, ok, |ev| Self::event_done(p, ev));
    }
}

impl PluginStream {
    /// Host-buffer uses of a host callback that never runs, back to the stream: released once
    /// the work before it is known to have run.
    pub(super) fn give_back_uses(&self, uses: Vec<HostUse>) {
        self.kept.lock().give_back(uses);
    }

    /// A host callback failed (it panicked): the stream's sticky error.
    pub(super) fn callback_failed(&self, e: HalError) {
        let _ = self.callback_error.set(e);
    }
}

impl UseHolder for PluginStream {
    fn release_completed(&self) {
        let p = self.p;
        self.kept.lock().retire(|ev| Self::event_done(p, ev));
    }
}

/// A host callback crossing the boundary through `host_callback` (a plugin without
/// `host_callback_node`, ABI 1.2: `node.rs`), with the host-buffer uses it ends.
struct HostCall {
    f: Box<dyn FnOnce() + Send>,
    uses: Vec<HostUse>,
    stream: Weak<PluginStream>,
}

unsafe extern "C" fn run_host_call(user: *mut c_void, status: UhStatus) {
    // SAFETY: `user` is the box leaked by host_callback; the plugin calls this exactly once
    // (header).
    let call = unsafe { Box::from_raw(user as *mut HostCall) };
    let HostCall { f, uses, stream } = *call;
    if status != UH_OK {
        // Never runs: the work before it may still hold the uses (a refused enqueue), so they
        // go back to the stream, released once that work is known to have run.
        if let Some(s) = stream.upgrade() {
            if !uses.is_empty() {
                s.kept.lock().give_back(uses);
            }
        }
        return;
    }
    // The work before the callback has completed: the uses end.
    drop(uses);
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        if let Some(s) = stream.upgrade() {
            let _ = s
                .callback_error
                .set(HalError::Internal("a host callback panicked".into()));
        }
    }
}

impl Stream for PluginStream {
    fn device(&self) -> &Arc<dyn Device> {
        &self.dyn_dev
    }

    fn stream_id(&self) -> StreamId {
        self.sid
    }

    fn copy_h2d(
        &self,
        src: &HostBuffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let (d, doff) = self.mem(dst, "dst", self.id, dst_offset, len)?;
        self.host_copy(
            (src, "src", src_offset),
            |h| {
                // SAFETY: the entry's contract; the ranges were checked.
                self.p
                    .call(self.p.api.copy_h2d, "copy_h2d", "copy h2d", |f, e| unsafe {
                        f(self.raw, h, src_offset, d, doff, len, e)
                    })
            },
            len,
        )?;
        self.keep_for_work([dst], None);
        Ok(())
    }

    fn copy_h2d_staged(&self, src: &[u8], dst: &Buffer, dst_offset: u64) -> Result<()> {
        self.mem(dst, "dst", self.id, dst_offset, src.len() as u64)?;
        let staging = self.dev.alloc_host(src.len())?;
        staging.map()?.copy_from_slice(src);
        self.copy_h2d(&staging, 0, dst, dst_offset, src.len() as u64)
    }

    fn copy_d2h(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &HostBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let (s, soff) = self.mem(src, "src", self.id, src_offset, len)?;
        self.host_copy(
            (dst, "dst", dst_offset),
            |h| {
                // SAFETY: the entry's contract; the ranges were checked.
                self.p
                    .call(self.p.api.copy_d2h, "copy_d2h", "copy d2h", |f, e| unsafe {
                        f(self.raw, s, soff, h, dst_offset, len, e)
                    })
            },
            len,
        )?;
        self.keep_for_work([src], None);
        Ok(())
    }

    fn copy_d2d(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.sticky()?;
        let (s, soff) = self.mem(src, "src", self.id, src_offset, len)?;
        let (d, doff) = self.mem(dst, "dst", self.id, dst_offset, len)?;
        let (a, b) = (
            src.device_addr() + src_offset,
            dst.device_addr() + dst_offset,
        );
        if len > 0 && a < b + len && b < a + len {
            return Err(HalError::invalid(
                "dst",
                Invalid::Overlap {
                    src: a,
                    dst: b,
                    len,
                },
            ));
        }
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(self.p.api.copy_d2d, "copy_d2d", "copy d2d", |f, e| unsafe {
                f(self.raw, s, soff, d, doff, len, e)
            })?;
        self.keep_for_work([src, dst], None);
        Ok(())
    }

    fn copy_peer(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.sticky()?;
        unihal_hal::check_peer_copy(
            self.id,
            &self.dev.capabilities().optional.peer_devices,
            src.device(),
            dst.device(),
        )?;
        let (s, soff) = self.mem(src, "src", src.device(), src_offset, len)?;
        let (d, doff) = self.mem(dst, "dst", dst.device(), dst_offset, len)?;
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.copy_peer,
                "copy_peer",
                "copy peer",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(self.raw, s, soff, d, doff, len, e) },
            )?;
        self.keep_for_work([src, dst], None);
        Ok(())
    }

    fn fill(&self, dst: &Buffer, offset: u64, len: u64, value: FillValue) -> Result<()> {
        self.sticky()?;
        let (d, doff) = self.mem(dst, "dst", self.id, offset, len)?;
        value.check_aligned(dst.device_addr() + offset, len)?;
        let (width, v) = match value {
            FillValue::U8(v) => (1, v as u32),
            FillValue::U16(v) => (2, v as u32),
            FillValue::U32(v) => (4, v),
        };
        // SAFETY: the entry's contract; the range was checked.
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(self.p.api.fill, "fill", "fill", |f, e| unsafe {
                f(self.raw, d, doff, len, width, v, e)
            })?;
        self.keep_for_work([dst], None);
        Ok(())
    }

    unsafe fn launch(
        &self,
        function: &Arc<dyn Function>,
        config: &LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        self.sticky()?;
        let func = function
            .as_any()
            .downcast_ref::<PluginFunction>()
            .filter(|f| std::ptr::eq(f.plugin(), self.p))
            .ok_or_else(|| {
                HalError::invalid(
                    "function",
                    Invalid::ForeignHandle {
                        expected: format!("a function of plugin {}", self.p.name),
                        found: format!(
                            "function {:?} of {}",
                            function.name(),
                            function.device_id()
                        ),
                    },
                )
            })?;
        if func.device_id() != self.id {
            return Err(HalError::invalid(
                "function",
                Invalid::WrongDevice {
                    expected: self.id,
                    found: func.device_id(),
                },
            ));
        }
        config.validate(&self.dev.capabilities().mandatory)?;
        if let Some(expected) = func.param_sizes() {
            args.check_against(expected)?;
        }
        let ptrs = args.param_ptrs();
        let sizes: Vec<u64> = args.sizes().iter().map(|&n| n as u64).collect();
        let c = UhLaunchConfig {
            size: std::mem::size_of::<UhLaunchConfig>() as u32,
            shared_mem_bytes: config.shared_mem_bytes,
            grid: config.grid.to_array(),
            block: config.block.to_array(),
        };
        // SAFETY: the entry's contract; the caller vouches for the arguments.
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(self.p.api.launch, "launch", "launch", |f, e| unsafe {
                f(
                    self.raw,
                    func.raw(),
                    &c,
                    ptrs.len() as u64,
                    ptrs.as_ptr(),
                    sizes.as_ptr(),
                    e,
                )
            })?;
        // The arguments' buffers crossed as addresses: the plugin cannot keep them, the host
        // does, every one (whole allocations too) until the launch ran.
        self.keep_for_work([], args.buffers().iter().map(|b| b.use_on(self.sid)));
        Ok(())
    }

    fn run_op(&self, call: &OpCall) -> Result<()> {
        self.sticky()?;
        if call.tensors.iter().any(|t| t.shape.len() > UH_MAX_DIMS) {
            return Err(HalError::invalid(
                "tensors",
                Invalid::Value {
                    value: "a view of more dimensions".into(),
                    accepted: format!("at most {UH_MAX_DIMS} dimensions"),
                },
            ));
        }
        let op = conv::op_num(call.op);
        if op == u32::MAX {
            return Err(HalError::unsupported(format!(
                "op {} through plugin ABI {UH_ABI_MAJOR}.{UH_ABI_MINOR}",
                call.op
            )));
        }
        let mut tensors = Vec::with_capacity(call.tensors.len());
        for t in &call.tensors {
            let (m, off) = self.mem(&t.buffer, "tensors", self.id, 0, 0)?;
            tensors.push(conv::put_tensor(t, (m, off, t.buffer.len())));
        }
        let scalars: Vec<UhScalar> = call.scalars.iter().map(conv::put_scalar).collect();
        let c = UhOpCall {
            size: std::mem::size_of::<UhOpCall>() as u32,
            op,
            n_tensors: tensors.len() as u32,
            n_scalars: scalars.len() as u32,
            tensors: tensors.as_ptr(),
            scalars: scalars.as_ptr(),
            has_rng: call.rng.is_some() as u32,
            reserved: 0,
            rng_seed: call.rng.map_or(0, |r| r.seed),
            rng_offset: call.rng.map_or(0, |r| r.offset),
        };
        let what = format!("op {}", call.op);
        // SAFETY: the entry's contract; the call's arrays outlive it.
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(self.p.api.run_op, "run_op", &what, |f, e| unsafe {
                f(self.raw, &c, e)
            })?;
        self.keep_for_work(call.tensors.iter().map(|t| &t.buffer), None);
        Ok(())
    }

    fn host_callback(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.sticky()?;
        let Some(entry) = self.p.api.host_callback else {
            return Err(self.p.unsupported("host callbacks"));
        };
        // The work before the callback has completed when it runs: the host-buffer uses that
        // work holds end in it (given back if it cannot be queued).
        let uses = if self.keeps.load(Ordering::Acquire) {
            self.kept.lock().take_host_uses()
        } else {
            Vec::new()
        };
        if let Some(entry) = self.p.api.host_callback_node {
            // ABI 1.2: a recycled node, returned by its `run` (exactly once, whatever the
            // entry returns).
            let node = self.nodes.node(&self.me, f, uses);
            return self.p.call(
                Some(entry),
                "host_callback_node",
                "host callback",
                // SAFETY: the entry's contract (unihal_plugin.h): a live stream, and a queued
                // node that stays valid until the plugin runs it.
                |g, e| unsafe { g(self.raw, node, e) },
            );
        }
        let user = Box::into_raw(Box::new(HostCall {
            f,
            uses,
            stream: self.me.clone(),
        })) as *mut c_void;
        // `user`, whatever it returns (the box is freed there).
        // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
        self.p.call(
            Some(entry),
            "host_callback",
            "host callback",
            |g, e| unsafe { g(self.raw, Some(run_host_call), user, e) },
        )
    }

    fn record_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        self.sticky()?;
        let e = PluginEvent::of(event.as_ref(), "event", self.p)?;
        if e.device_id() != self.id {
            return Err(HalError::invalid(
                "event",
                Invalid::WrongDevice {
                    expected: self.id,
                    found: e.device_id(),
                },
            ));
        }
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.event_record,
                "event_record",
                "event record",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, err| unsafe { f(self.raw, e.raw(), err) },
            )?;
        e.mark_recorded();
        Ok(())
    }

    fn wait_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        self.sticky()?;
        let e = PluginEvent::of(event.as_ref(), "event", self.p)?;
        // SAFETY: the entry's contract.
        self.p.call(
            self.p.api.stream_wait_event,
            "stream_wait_event",
            "stream wait event",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, err| unsafe { f(self.raw, e.raw(), err) },
        )
    }

    fn alloc_async(&self, len: usize) -> Result<Buffer> {
        self.sticky()?;
        // Memory that exists now is valid for work enqueued after this call (ABI 1.0 has no
        // stream-ordered allocation entry).
        self.dev.alloc(len)
    }

    fn free_async(&self, buffer: &Buffer) -> Result<()> {
        self.mem(buffer, "buffer", self.id, 0, 0)?;
        buffer.mark_free_enqueued("buffer")?;
        // The memory returns when the last handle is dropped; the plugin's queued work keeps
        // its own, so release in stream order needs no call.
        self.keep_for_work([buffer], None);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        let kept = self.keeps.load(Ordering::Acquire);
        let cover = kept.then(|| self.kept.lock().begin_sync());
        // SAFETY: the entry's contract.
        let r = self.p.call(
            self.p.api.stream_synchronize,
            "stream_synchronize",
            "stream synchronize",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(self.raw, e) },
        );
        if let Some(c) = cover {
            self.settle(c, r.is_ok());
        }
        self.sticky()?;
        r
    }

    fn query(&self) -> Result<bool> {
        self.sticky()?;
        let kept = self.keeps.load(Ordering::Acquire);
        let cover = kept.then(|| self.kept.lock().begin_sync());
        let mut done = 0u32;
        let r = self
            .p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.stream_query,
                "stream_query",
                "stream query",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(self.raw, &mut done, e) },
            );
        if let Some(c) = cover {
            self.settle(c, r.is_ok() && done != 0);
        }
        r.map(|_| done != 0)
    }

    fn async_error(&self) -> Option<HalError> {
        if let Some(e) = self.callback_error.get() {
            return Some(e.clone());
        }
        // SAFETY: the entry's contract.
        self.p
            .call(
                self.p.api.stream_async_error,
                "stream_async_error",
                "stream async error",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(self.raw, e) },
            )
            .err()
            .filter(|e| !matches!(e, HalError::Unsupported { .. }))
    }

    fn native_handle(&self) -> NativeHandle {
        let Some(f) = self.p.api.stream_native else {
            return NativeHandle::None;
        };
        let mut n = conv::put_native(NativeHandle::None);
        // SAFETY: the entry's contract.
        unsafe { f(self.raw, &mut n) };
        conv::get_native(&n)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What a dropped stream hands to the thread that waits for its work.
struct Remains {
    p: &'static Plugin,
    raw: usize,
    parts: unihal_hal::retention::Parts<usize>,
}

impl Remains {
    fn release(self) {
        let p = self.p;
        let raw = self.raw as *mut UhStream;
        if !self.parts.keep.is_empty() || !self.parts.events.is_empty() {
            // SAFETY: the entry's contract.
            let _ = p.call(
                p.api.stream_synchronize,
                "stream_synchronize",
                "stream synchronize",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(raw, e) },
            );
        }
        drop(self.parts.keep);
        for ev in self.parts.events {
            // SAFETY: our event handles, released once, their records complete.
            unsafe { (p.api.event_release.expect("required"))(ev as *mut UhEvent) };
        }
        // SAFETY: our stream handle, released once (the plugin lets its work finish).
        unsafe { (p.api.stream_release.expect("required"))(raw) };
    }
}

impl Drop for PluginStream {
    fn drop(&mut self) {
        // Free nodes go now; queued ones free themselves when the plugin runs them.
        self.nodes.close();
        let parts = std::mem::take(&mut *self.kept.lock()).into_parts();
        let remains = Remains {
            p: self.p,
            raw: self.raw as usize,
            parts,
        };
        if remains.parts.keep.is_empty() && remains.parts.events.is_empty() {
            remains.release();
            return;
        }
        // Never wait in a drop: a thread waits for the work, then releases what it kept.
        let spawned = std::thread::Builder::new()
            .name("unihal-plugin-stream-drop".into())
            .spawn(move || remains.release());
        if let Err(e) = spawned {
            tracing::warn!(target: "unihal::plugin", "dropping a stream: no thread to wait for its work ({e})");
        }
    }
}
