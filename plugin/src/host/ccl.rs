//! A plugin's collective engine as the HAL's [`Collectives`] and [`Communicator`].

use super::device::PluginDevice;
use super::stream::PluginStream;
use super::Plugin;
use crate::conv;
use std::any::Any;
use std::sync::Arc;
use unihal_hal::ccl::check_call;
use unihal_hal::{
    Buffer, CclCaps, CollectiveOp, Collectives, CommConfig, Communicator, DType, Device, GroupCall,
    HalError, Invalid, ReduceOp, Result, Stream, UniqueId,
};
use unihal_plugin_abi::*;

/// The plugin's collective engine (present when its `ccl_caps` entry is).
pub struct PluginCollectives {
    p: &'static Plugin,
    caps: CclCaps,
}

impl PluginCollectives {
    pub(super) fn new(p: &'static Plugin, caps: CclCaps) -> PluginCollectives {
        PluginCollectives { p, caps }
    }

    fn device<'a>(&self, d: &'a Arc<dyn Device>) -> Result<&'a PluginDevice> {
        d.as_any()
            .downcast_ref::<PluginDevice>()
            .filter(|pd| std::ptr::eq(pd.plugin(), self.p))
            .ok_or_else(|| {
                HalError::invalid(
                    "device",
                    Invalid::ForeignHandle {
                        expected: format!("a device of plugin {}", self.p.name),
                        found: d.id().to_string(),
                    },
                )
            })
    }

    /// Wraps a communicator `entry` returned, after checking it: not NULL, and the rank and
    /// size `comm_rank_size` reports within `expect`. A handle that fails is released here.
    fn comm(
        &self,
        entry: &str,
        raw: *mut UhComm,
        device: Arc<dyn Device>,
        expect: Expect,
    ) -> Result<Arc<dyn Communicator>> {
        if raw.is_null() {
            return Err(self
                .p
                .broke(entry, "returned UH_OK with a NULL communicator"));
        }
        // What a plugin that writes nothing reports: refused below.
        let (mut rank, mut size) = (u32::MAX, 0u32);
        if let Some(f) = self.p.api.comm_rank_size {
            // SAFETY: the entry's contract; a live handle.
            unsafe { f(raw, &mut rank, &mut size) };
        }
        let (rank, size) = (rank as usize, size as usize);
        let fits = rank < size
            && match expect {
                Expect::Exactly { rank: r, size: n } => rank == r && size == n,
                Expect::AtMost(n) => size <= n,
            };
        if !fits {
            if let Some(f) = self.p.api.comm_release {
                // SAFETY: the handle the plugin just returned, released once, never kept.
                unsafe { f(raw) }
            }
            let wanted = match expect {
                Expect::Exactly { rank, size } => format!("rank {rank} of {size}"),
                Expect::AtMost(n) => format!("a communicator of at most {n} ranks"),
            };
            return Err(self.p.broke(
                entry,
                format!(
                    "returned a communicator of rank {rank} of {size} (`comm_rank_size`) for \
                     {wanted}"
                ),
            ));
        }
        let comm: Arc<dyn Communicator> = Arc::new(PluginComm {
            p: self.p,
            raw,
            rank,
            size,
            device,
            caps: self.caps.clone(),
        });
        // The plugin applies its own default when the config names no timeout.
        unihal_hal::ccl::log_created(std::slice::from_ref(&comm), &self.caps.engine, entry, None);
        Ok(comm)
    }
}

/// The rank and size a new communicator must have.
#[derive(Clone, Copy)]
enum Expect {
    /// What `init_rank` asked for, or rank i of `init_all`'s n.
    Exactly { rank: usize, size: usize },
    /// A split's child: no more ranks than its parent.
    AtMost(usize),
}

/// The config's timeout in the ABI's milliseconds (0: the plugin's default; `u64::MAX` for a
/// timeout longer than 64 bits of them, which the plugin's deadline treats as none).
///
/// # Errors
/// [`HalError::InvalidArgument`] for a timeout under 1 ms, checked here so that every plugin
/// refuses it as the built-in engines do, before its entry is called.
fn timeout_ms(c: &CommConfig) -> Result<u64> {
    c.timeout.map_or(Ok(0), |t| {
        unihal_hal::deadline::check_timeout("CommConfig::timeout", t)
            .map(unihal_hal::deadline::millis)
    })
}

impl Collectives for PluginCollectives {
    fn capabilities(&self) -> &CclCaps {
        &self.caps
    }

    fn unique_id(&self) -> Result<UniqueId> {
        let mut buf = vec![0u8; 8192];
        let mut len = 0u64;
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.ccl_unique_id,
                "ccl_unique_id",
                "unique id",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(buf.as_mut_ptr(), buf.len() as u64, &mut len, e) },
            )?;
        if len > buf.len() as u64 {
            return Err(self.p.broke(
                "ccl_unique_id",
                format!(
                    "returned an id of {len} bytes into a buffer of {}",
                    buf.len()
                ),
            ));
        }
        buf.truncate(len as usize);
        Ok(UniqueId(buf))
    }

    fn init_rank(
        &self,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Result<Arc<dyn Communicator>> {
        let d = self.device(device)?;
        let ms = timeout_ms(config)?;
        let mut raw = std::ptr::null_mut();
        let n = u32::try_from(nranks).unwrap_or(u32::MAX);
        let r = u32::try_from(rank).unwrap_or(u32::MAX);
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.ccl_init_rank,
                "ccl_init_rank",
                "init rank",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe {
                    f(
                        id.0.as_ptr(),
                        id.0.len() as u64,
                        n,
                        r,
                        d.raw(),
                        ms,
                        &mut raw,
                        e,
                    )
                },
            )?;
        self.comm(
            "ccl_init_rank",
            raw,
            device.clone(),
            Expect::Exactly { rank, size: nranks },
        )
    }

    fn init_all(
        &self,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        let raws = devices
            .iter()
            .map(|d| Ok(self.device(d)?.raw()))
            .collect::<Result<Vec<_>>>()?;
        let ms = timeout_ms(config)?;
        let mut out = vec![std::ptr::null_mut(); raws.len()];
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.ccl_init_all,
                "ccl_init_all",
                "init all",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(raws.as_ptr(), raws.len() as u32, ms, out.as_mut_ptr(), e) },
            )?;
        // Every handle is checked; after a refusal, the rest are released unwrapped (and the
        // ones wrapped so far when `comms` drops).
        let n = devices.len();
        let mut comms = Vec::with_capacity(n);
        let mut refused = None;
        for (i, (raw, d)) in out.into_iter().zip(devices).enumerate() {
            if refused.is_some() {
                if let (false, Some(f)) = (raw.is_null(), self.p.api.comm_release) {
                    // SAFETY: a handle the plugin just returned, released once, never kept.
                    unsafe { f(raw) }
                }
                continue;
            }
            let expect = Expect::Exactly { rank: i, size: n };
            match self.comm("ccl_init_all", raw, d.clone(), expect) {
                Ok(c) => comms.push(c),
                Err(e) => refused = Some(e),
            }
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(comms),
        }
    }
}

/// One rank of a plugin communicator.
pub struct PluginComm {
    p: &'static Plugin,
    raw: *mut UhComm,
    rank: usize,
    size: usize,
    device: Arc<dyn Device>,
    caps: CclCaps,
}

// SAFETY: the raw handle is an opaque token the plugin accepts from any thread (header rule 6).
unsafe impl Send for PluginComm {}
// SAFETY: as above.
unsafe impl Sync for PluginComm {}

impl Drop for PluginComm {
    fn drop(&mut self) {
        if let Some(f) = self.p.api.comm_release {
            // SAFETY: our handle, released once.
            unsafe { f(self.raw) }
        }
    }
}

impl PluginComm {
    /// One collective: checks on the host (sticky error, stream device, capabilities), the
    /// plugin's call, what the host keeps for the stream.
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        op: CollectiveOp,
        (send, recv): (&Buffer, &Buffer),
        count: u64,
        dtype: DType,
        red: Option<ReduceOp>,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        check_call(&self.device, &self.caps, None, (op, dtype, red), stream)?;
        let s = PluginStream::of(stream, self.p)?;
        let id = self.device.id();
        let (sm, so) = s.mem(send, "send", id, 0, 0)?;
        let (rm, ro) = s.mem(recv, "recv", id, 0, 0)?;
        let call = UhCollective {
            size: std::mem::size_of::<UhCollective>() as u32,
            op: conv::coll_num(op),
            send: sm,
            send_offset: so,
            send_len: send.len(),
            recv: rm,
            recv_offset: ro,
            recv_len: recv.len(),
            count,
            dtype: conv::dtype_num(dtype),
            red: red.map_or(0, conv::red_num),
            root: u32::try_from(root).unwrap_or(u32::MAX),
            reserved: 0,
        };
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.comm_collective,
                "comm_collective",
                op.name(),
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(self.raw, &call, s.raw(), e) },
            )?;
        s.keep_for_work([send, recv], None);
        Ok(())
    }
}

impl Communicator for PluginComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    fn all_reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let k = CollectiveOp::AllReduce;
        self.collective(k, (send, recv), count, dtype, Some(op), 0, stream)
    }

    fn broadcast(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let k = CollectiveOp::Broadcast;
        self.collective(k, (send, recv), count, dtype, None, root, stream)
    }

    fn reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let k = CollectiveOp::Reduce;
        self.collective(k, (send, recv), count, dtype, Some(op), root, stream)
    }

    fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let k = CollectiveOp::AllGather;
        self.collective(k, (send, recv), count, dtype, None, 0, stream)
    }

    fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let k = CollectiveOp::ReduceScatter;
        self.collective(k, (send, recv), count, dtype, Some(op), 0, stream)
    }

    fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let k = CollectiveOp::AllToAll;
        self.collective(k, (send, recv), count, dtype, None, 0, stream)
    }

    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        let s = PluginStream::of(stream, self.p)?;
        let id = self.device.id();
        let mut raw = Vec::with_capacity(calls.len());
        for c in calls {
            let parts = c.parts();
            let (m, off) = s.mem(parts.buf, "calls", id, 0, 0)?;
            raw.push(UhP2p {
                recv: parts.recv as u32,
                dtype: conv::dtype_num(parts.dtype),
                mem: m,
                offset: off,
                len: parts.buf.len(),
                count: parts.count,
                peer: parts.peer as u64,
            });
        }
        // SAFETY: the entry's contract; `raw` outlives the call.
        self.p.call(
            self.p.api.comm_group,
            "comm_group",
            "group",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(self.raw, raw.as_ptr(), raw.len() as u64, s.raw(), e) },
        )?;
        s.keep_for_work(calls.iter().map(|c| c.parts().buf), None);
        Ok(())
    }

    fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        let ms = timeout_ms(config)?;
        let mut raw = std::ptr::null_mut();
        let c = color.map_or(-1, i64::from);
        // SAFETY: the entry's contract.
        self.p.call(
            self.p.api.comm_split,
            "comm_split",
            "split",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(self.raw, c, key, ms, &mut raw, e) },
        )?;
        match (color, raw.is_null()) {
            (None, true) => return Ok(None),
            (None, false) => {
                if let Some(f) = self.p.api.comm_release {
                    // SAFETY: the handle the plugin just returned, released once, never kept.
                    unsafe { f(raw) }
                }
                return Err(self.p.broke(
                    "comm_split",
                    "returned a communicator for a rank that joins none (color < 0)",
                ));
            }
            (Some(_), _) => {}
        }
        let ccl = PluginCollectives::new(self.p, self.caps.clone());
        ccl.comm(
            "comm_split",
            raw,
            self.device.clone(),
            Expect::AtMost(self.size),
        )
        .map(Some)
    }

    fn abort(&self) {
        unihal_hal::ccl::log_aborted(self);
        if let Some(f) = self.p.api.comm_abort {
            // SAFETY: the entry's contract.
            unsafe { f(self.raw) }
        }
    }

    fn async_error(&self) -> Option<HalError> {
        // SAFETY: the entry's contract.
        self.p
            .call(
                self.p.api.comm_async_error,
                "comm_async_error",
                "communicator async error",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(self.raw, e) },
            )
            .err()
            .filter(|e| !matches!(e, HalError::Unsupported { .. }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
