//! Wrapped collectives: each operation is a tracked enqueue on its (unwrapped) stream, reading
//! its send ranges and writing its receive ranges.

use crate::backend::LayerDevice;
use crate::layer::Layer;
use crate::stream::{device_touch, foreign, Arg, LayerStream};
use crate::trace::Detail;
use crate::validate::tracker::Touch;
use std::any::Any;
use std::panic::Location;
use std::sync::Arc;
use unihal_hal::{
    Backend, Buffer, CclCaps, Collectives, CommConfig, Communicator, DType, Device, GroupCall,
    HalError, ReduceOp, Result, Stream, UniqueId,
};

/// The collective engine of a [`crate::LayerBackend`].
///
/// Ownership: shares the backend. Thread safety: as the engine's.
pub struct LayerCollectives {
    backend: Arc<dyn Backend>,
    layer: Arc<Layer>,
}

impl LayerCollectives {
    pub(crate) fn new(backend: Arc<dyn Backend>, layer: Arc<Layer>) -> Self {
        LayerCollectives { backend, layer }
    }

    fn engine(&self) -> &dyn Collectives {
        self.backend
            .collectives()
            .expect("the layer offers collectives only where the backend has them")
    }

    /// The backend's device behind `device`, or `device` itself (a foreign one: reported, or
    /// refused in error mode; a device cannot be told from a communicator's later use, so it is
    /// reported at once).
    #[track_caller]
    fn device_arg(&self, device: &Arc<dyn Device>) -> Result<Arc<dyn Device>> {
        match device.as_any().downcast_ref::<LayerDevice>() {
            Some(v) if Arc::ptr_eq(v.layer(), &self.layer) => Ok(v.inner().clone()),
            _ => Arg::<dyn Device, ()>::Foreign(
                device,
                foreign("a device", device.id(), Location::caller()),
            )
            .call(&self.layer, |d, _| Ok(d.clone())),
        }
    }

    fn wrap(&self, inner: Arc<dyn Communicator>, device: Arc<dyn Device>) -> Arc<dyn Communicator> {
        Arc::new(LayerCommunicator {
            inner,
            device,
            layer: self.layer.clone(),
        })
    }
}

impl Collectives for LayerCollectives {
    fn capabilities(&self) -> &CclCaps {
        self.engine().capabilities()
    }

    fn unique_id(&self) -> Result<UniqueId> {
        self.engine().unique_id()
    }

    fn init_rank(
        &self,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Result<Arc<dyn Communicator>> {
        let inner = self.device_arg(device)?;
        let comm = self.engine().init_rank(id, nranks, rank, &inner, config)?;
        Ok(self.wrap(comm, device.clone()))
    }

    fn init_all(
        &self,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        let inner = devices
            .iter()
            .map(|d| self.device_arg(d))
            .collect::<Result<Vec<_>>>()?;
        let comms = self.engine().init_all(&inner, config)?;
        Ok(comms
            .into_iter()
            .zip(devices)
            .map(|(c, d)| self.wrap(c, d.clone()))
            .collect())
    }

    fn connected_world(
        &self,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Option<Result<Arc<dyn Communicator>>> {
        let inner = match self.device_arg(device) {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        let comm = self.engine().connected_world(&inner, config)?;
        Some(comm.map(|c| self.wrap(c, device.clone())))
    }
}

/// One rank of a communicator of a [`crate::LayerBackend`].
///
/// Ownership: owns the engine's communicator; keeps its (wrapped) device alive. Thread safety:
/// any thread.
pub struct LayerCommunicator {
    inner: Arc<dyn Communicator>,
    device: Arc<dyn Device>,
    layer: Arc<Layer>,
}

/// Bytes of `count` elements of `dtype`, saturating (an absurd count is the engine's to refuse).
fn bytes(count: u64, dtype: DType) -> u64 {
    count.saturating_mul(dtype.size() as u64)
}

/// A group's trace detail: its sends and receives, the bytes they move.
fn group_detail(calls: &[GroupCall]) -> Detail {
    let (mut sends, mut recvs, mut total) = (0u64, 0u64, 0u64);
    for c in calls {
        let (GroupCall::Send { count, dtype, .. } | GroupCall::Recv { count, dtype, .. }) = c;
        match c {
            GroupCall::Send { .. } => sends += 1,
            GroupCall::Recv { .. } => recvs += 1,
        }
        total = total.saturating_add(bytes(*count, *dtype));
    }
    Detail::new("group", "collective")
        .arg("sends", sends)
        .arg("receives", recvs)
        .bytes(total)
}

fn read(arg: &'static str, buf: &Buffer, offset: u64, len: u64) -> Touch {
    device_touch(arg, buf, offset, len, false)
}

fn write(arg: &'static str, buf: &Buffer, offset: u64, len: u64) -> Touch {
    device_touch(arg, buf, offset, len, true)
}

impl LayerCommunicator {
    /// The engine's communicator.
    pub fn inner(&self) -> &Arc<dyn Communicator> {
        &self.inner
    }

    /// Runs `call` on the backend's stream behind `stream`, tracked as `what` touching `touches`
    /// (untracked on a stream the layer did not make, which is reported).
    fn on(
        &self,
        stream: &Arc<dyn Stream>,
        what: &'static str,
        site: crate::Site,
        touches: &[Touch],
        detail: impl FnOnce() -> Detail,
        call: impl FnOnce(&Arc<dyn Stream>) -> Result<()>,
    ) -> Result<()> {
        LayerStream::unwrap_arg(&self.layer, stream, site).call(&self.layer, |inner, ours| {
            match ours {
                Some(v) => v.tracked(what, site, touches, detail, || call(inner)),
                None => call(inner),
            }
        })
    }

    /// A collective's trace detail: `count` elements of `dtype`, `bytes` moved per rank (as
    /// nccl-tests counts them for its algorithm bandwidth).
    fn detail(&self, what: &'static str, count: u64, dtype: DType, bytes: u64) -> Detail {
        Detail::new(what, "collective")
            .arg("count", count)
            .arg("dtype", dtype.to_string())
            .arg("rank", self.rank() as u64)
            .arg("ranks", self.n())
            .bytes(bytes)
    }

    fn n(&self) -> u64 {
        self.inner.size() as u64
    }
}

impl Communicator for LayerCommunicator {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    #[track_caller]
    fn all_reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let b = bytes(count, dtype);
        let t = [read("send", send, 0, b), write("recv", recv, 0, b)];
        self.on(
            stream,
            "all_reduce",
            Location::caller(),
            &t,
            || {
                self.detail("all_reduce", count, dtype, b)
                    .arg("op", format!("{op:?}"))
            },
            |s| self.inner.all_reduce(send, recv, count, dtype, op, s),
        )
    }

    #[track_caller]
    fn broadcast(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let b = bytes(count, dtype);
        let mut t = vec![write("recv", recv, 0, b)];
        if self.rank() == root {
            t.insert(0, read("send", send, 0, b));
        }
        self.on(
            stream,
            "broadcast",
            Location::caller(),
            &t,
            || {
                self.detail("broadcast", count, dtype, b)
                    .arg("root", root as u64)
            },
            |s| self.inner.broadcast(send, recv, count, dtype, root, s),
        )
    }

    #[track_caller]
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
        let b = bytes(count, dtype);
        let mut t = vec![read("send", send, 0, b)];
        if self.rank() == root {
            t.push(write("recv", recv, 0, b));
        }
        self.on(
            stream,
            "reduce",
            Location::caller(),
            &t,
            || {
                self.detail("reduce", count, dtype, b)
                    .arg("op", format!("{op:?}"))
                    .arg("root", root as u64)
            },
            |s| self.inner.reduce(send, recv, count, dtype, op, root, s),
        )
    }

    #[track_caller]
    fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let b = bytes(count, dtype);
        let t = [
            read("send", send, 0, b),
            write("recv", recv, 0, b.saturating_mul(self.n())),
        ];
        self.on(
            stream,
            "all_gather",
            Location::caller(),
            &t,
            || self.detail("all_gather", count, dtype, b.saturating_mul(self.n())),
            |s| self.inner.all_gather(send, recv, count, dtype, s),
        )
    }

    #[track_caller]
    fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let b = bytes(count, dtype);
        let t = [
            read("send", send, 0, b.saturating_mul(self.n())),
            write("recv", recv, 0, b),
        ];
        self.on(
            stream,
            "reduce_scatter",
            Location::caller(),
            &t,
            || {
                self.detail("reduce_scatter", count, dtype, b.saturating_mul(self.n()))
                    .arg("op", format!("{op:?}"))
            },
            |s| self.inner.reduce_scatter(send, recv, count, dtype, op, s),
        )
    }

    #[track_caller]
    fn send(
        &self,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let t = [read("buf", buf, 0, bytes(count, dtype))];
        self.on(
            stream,
            "send",
            Location::caller(),
            &t,
            || {
                self.detail("send", count, dtype, bytes(count, dtype))
                    .arg("peer", peer as u64)
            },
            |s| self.inner.send(buf, count, dtype, peer, s),
        )
    }

    #[track_caller]
    fn recv(
        &self,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let t = [write("buf", buf, 0, bytes(count, dtype))];
        self.on(
            stream,
            "recv",
            Location::caller(),
            &t,
            || {
                self.detail("recv", count, dtype, bytes(count, dtype))
                    .arg("peer", peer as u64)
            },
            |s| self.inner.recv(buf, count, dtype, peer, s),
        )
    }

    #[track_caller]
    fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let b = bytes(count, dtype).saturating_mul(self.n());
        let t = [read("send", send, 0, b), write("recv", recv, 0, b)];
        self.on(
            stream,
            "all_to_all",
            Location::caller(),
            &t,
            || self.detail("all_to_all", count, dtype, b),
            |s| self.inner.all_to_all(send, recv, count, dtype, s),
        )
    }

    #[track_caller]
    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        let t: Vec<Touch> = calls
            .iter()
            .map(|c| match c {
                GroupCall::Send {
                    buf, count, dtype, ..
                } => read("send", buf, 0, bytes(*count, *dtype)),
                GroupCall::Recv {
                    buf, count, dtype, ..
                } => write("recv", buf, 0, bytes(*count, *dtype)),
            })
            .collect();
        self.on(
            stream,
            "group",
            Location::caller(),
            &t,
            || group_detail(calls),
            |s| self.inner.group(calls, s),
        )
    }

    #[track_caller]
    fn all_to_allv(
        &self,
        send: &Buffer,
        send_counts: &[u64],
        send_displs: &[u64],
        recv: &Buffer,
        recv_counts: &[u64],
        recv_displs: &[u64],
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let part = |arg, buf, displs: &[u64], counts: &[u64], w: bool| -> Vec<Touch> {
            displs
                .iter()
                .zip(counts)
                .map(|(&d, &c)| device_touch(arg, buf, bytes(d, dtype), bytes(c, dtype), w))
                .collect()
        };
        let mut t = part("send", send, send_displs, send_counts, false);
        t.extend(part("recv", recv, recv_displs, recv_counts, true));
        self.on(
            stream,
            "all_to_allv",
            Location::caller(),
            &t,
            || {
                self.detail(
                    "all_to_allv",
                    send_counts.iter().sum(),
                    dtype,
                    bytes(send_counts.iter().sum(), dtype),
                )
            },
            |s| {
                self.inner.all_to_allv(
                    send,
                    send_counts,
                    send_displs,
                    recv,
                    recv_counts,
                    recv_displs,
                    dtype,
                    s,
                )
            },
        )
    }

    fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        Ok(self.inner.split(color, key, config)?.map(|c| {
            Arc::new(LayerCommunicator {
                inner: c,
                device: self.device.clone(),
                layer: self.layer.clone(),
            }) as Arc<dyn Communicator>
        }))
    }

    fn abort(&self) {
        self.inner.abort()
    }

    fn async_error(&self) -> Option<HalError> {
        self.inner.async_error()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
