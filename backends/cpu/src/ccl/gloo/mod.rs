//! The CPU backend's collective engine across processes without `mpirun`: gloo (PyTorch's CPU
//! collective library; Debian's `libgloo`, TCP transport), behind the `gloo` cargo feature.
//!
//! It is what PyTorch users run CPU data parallelism on under torchrun. Ranks meet through a c10d
//! TCPStore ([`unihal_launch`]): under a launcher, the job's store (torchrun's agent store, or
//! rank 0's) backs gloo's `rendezvous::Store` ([`Collectives::connected_world`]); with ids from
//! [`Collectives::unique_id`], a store served by the process that made the id, whose address the
//! id carries (as NCCL's id carries its bootstrap root's). gloo is C++: it is reached through
//! a small shim (`shim.cpp`, [`ffi`]) that turns every exception into an error code.
//!
//! Every operation first meets its peers in an **arrival handshake** (each rank sends every other
//! a token naming the operation, with a deadline), as the MPI engine does: a rank that never
//! arrives is a `Timeout` naming it, mismatched calls are an `InvalidArgument`. The data then
//! moves with gloo's own algorithms (ring all-reduce, ...). Abort closes the rank's connections,
//! which ends the operations waiting on them here and at every peer (`Aborted`); a rank whose
//! process dies breaks its connections the same way, so the others fail promptly rather than
//! at their timeout.
//!
//! Reductions combine two partial results at a time in the element type (gloo's ring), so f16
//! and bf16 round at each step; avg is sum then one division (reported as emulated). gloo has no
//! reduce-scatter: it is an all-reduce then this rank's part, as in PyTorch's gloo group.

mod comm;
mod conv;
mod ffi;

pub use comm::GlooComm;

use comm::Link;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use unihal_hal::ccl::{timeout_from_env, Accumulation, DEFAULT_TIMEOUT};
use unihal_hal::{
    CclCaps, CollectiveOp, Collectives, CommConfig, Communicator, DType, Device, HalError, Invalid,
    ReduceOp, Result, UniqueId,
};
use unihal_launch::{JobStore, LaunchInfo, TcpStore, TcpStoreServer};

/// The first bytes of this engine's ids.
const ID_MAGIC: &[u8; 16] = b"unihal-gloo-id-1";
const ID_LEN: usize = 128;
/// The Debian package the engine is built against (`libgloo-dev`).
pub const GLOO_VERSION: &str = "0.0~git20220518.5b14351";

/// Where a communicator's ranks meet: a store client under this communicator's prefix, and what
/// keeps the store alive (a server in this process, or the job's store).
#[derive(Clone)]
pub(crate) struct Rendezvous {
    store: TcpStore,
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Rendezvous {
    /// The rendezvous of a communicator made from this one (a split), under `name`.
    pub(crate) fn child(&self, name: &str) -> Rendezvous {
        Rendezvous {
            store: self.store.with_prefix(name),
            _keep: self._keep.clone(),
        }
    }
}

/// The engine. Thread safety: any thread.
pub struct GlooCollectives {
    caps: Arc<CclCaps>,
    timeout: Duration,
}

fn caps() -> CclCaps {
    let reducible: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|&d| unihal_hal::host_reduce::reducible(d))
        .collect();
    let ops = CollectiveOp::ALL
        .into_iter()
        .map(|op| {
            let dtypes = if op.reduces() {
                reducible.clone()
            } else {
                DType::ALL.to_vec()
            };
            (op, dtypes)
        })
        .collect();
    CclCaps {
        engine: format!("gloo ({GLOO_VERSION})"),
        ops,
        reductions: reducible
            .iter()
            .map(|&d| (d, ReduceOp::ALL.to_vec()))
            .collect(),
        accumulation: reducible
            .iter()
            .map(|&d| {
                (
                    d,
                    Accumulation {
                        accumulate_in: d,
                        emulated: vec![ReduceOp::Avg],
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
        groups: true,
        split: true,
        survives_dead_rank: true,
        names_missing_ranks: true,
        timeout_aborts_peers: false,
        crosses_processes: true,
    }
}

/// The engine of this process.
pub fn engine() -> &'static GlooCollectives {
    static ENGINE: OnceLock<GlooCollectives> = OnceLock::new();
    ENGINE.get_or_init(|| GlooCollectives {
        caps: Arc::new(caps()),
        timeout: timeout_from_env().unwrap_or(DEFAULT_TIMEOUT),
    })
}

/// The address gloo's transport binds, as PyTorch's gloo group chooses it: the interface
/// `GLOO_SOCKET_IFNAME` names, else the address of the interface `UNIHAL_SOCKET_IFNAME` selects
/// ([`unihal_launch::net`]), else the host name when it resolves to an address of this machine,
/// else the loopback address. Returns `(hostname, iface)`.
///
/// # Errors
/// `UNIHAL_SOCKET_IFNAME`'s, when it selects no interface.
fn transport_address() -> Result<(String, String)> {
    if let Ok(iface) = std::env::var("GLOO_SOCKET_IFNAME") {
        if !iface.is_empty() {
            return Ok((String::new(), iface));
        }
    }
    if let Some(chosen) = unihal_launch::net::selected()? {
        return Ok((chosen.addr.to_string(), String::new()));
    }
    let host = unihal_hal::ccl::process_tag().host.clone();
    let usable = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), 0))
        .ok()
        .and_then(|mut a| a.find(|a| a.is_ipv4()))
        .is_some_and(|a| std::net::TcpListener::bind((a.ip(), 0)).is_ok());
    Ok(if usable {
        (host, String::new())
    } else {
        ("127.0.0.1".into(), String::new())
    })
}

/// State of one connect: the store, and the first error a store callback met (gloo's own
/// message for it is generic).
struct StoreCtx {
    store: TcpStore,
    error: Mutex<Option<HalError>>,
}

impl StoreCtx {
    fn keep(&self, e: HalError) -> c_int {
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
        1
    }
}

/// `len` bytes at `p` (none when `len` is 0, whatever `p` is: C++ passes `data()` of empty
/// vectors, which may be null).
///
/// # Safety
/// `p` is valid for reads of `len` bytes when `len` is not 0.
unsafe fn bytes<'a>(p: *const c_char, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(p.cast(), len)
    }
}

/// # Safety
/// `user` is the connect's `StoreCtx`; `key` and `val` hold `klen` and `vlen` bytes.
unsafe extern "C" fn store_set(
    user: *mut c_void,
    key: *const c_char,
    klen: usize,
    val: *const c_char,
    vlen: usize,
) -> c_int {
    let s = &*(user as *const StoreCtx);
    let key = String::from_utf8_lossy(bytes(key, klen));
    let val = bytes(val, vlen);
    match s.store.set(&key, val) {
        Ok(()) => 0,
        Err(e) => s.keep(e),
    }
}

/// # Safety
/// As `store_set`; `put` copies into `sink`.
unsafe extern "C" fn store_get(
    user: *mut c_void,
    key: *const c_char,
    klen: usize,
    sink: *mut c_void,
    put: ffi::SinkFn,
) -> c_int {
    let s = &*(user as *const StoreCtx);
    let key = String::from_utf8_lossy(bytes(key, klen));
    match s.store.get(&key) {
        Ok(v) => {
            put(sink, v.as_ptr().cast(), v.len());
            0
        }
        Err(e) => s.keep(e),
    }
}

/// # Safety
/// As `store_set`; `keys` and `klens` hold `n` entries.
unsafe extern "C" fn store_wait(
    user: *mut c_void,
    keys: *const *const c_char,
    klens: *const usize,
    n: usize,
    timeout_ms: i64,
) -> c_int {
    let s = &*(user as *const StoreCtx);
    let owned: Vec<String> = (0..n)
        .map(|i| String::from_utf8_lossy(bytes(*keys.add(i), *klens.add(i))).into_owned())
        .collect();
    let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
    // gloo's default wait is 30 s; the store's own deadline (the engine's timeout) rules.
    let t = Duration::from_millis(timeout_ms.max(0) as u64).max(s.store.timeout());
    match s.store.wait(&refs, t) {
        Ok(()) => 0,
        Err(e) => s.keep(e),
    }
}

/// Connects rank `rank` of `size` through `rv`: gloo's full mesh over TCP, its addresses
/// exchanged in the store. Ranks that claim one rank twice are refused.
pub(crate) fn connect(
    rv: Rendezvous,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> Result<Arc<Link>> {
    if size == 0 || rank >= size {
        return Err(HalError::invalid(
            "rank",
            Invalid::Value {
                value: format!("rank {rank} of {size}"),
                accepted: "0 <= rank < nranks".into(),
            },
        ));
    }
    let claims = rv.store.add(&format!("claims/{rank}"), 1)?;
    if claims != 1 {
        return Err(HalError::invalid(
            "rank",
            Invalid::Value {
                value: format!("rank {rank}"),
                accepted: "a rank no other init_rank call with this id has taken".into(),
            },
        ));
    }
    let (host, iface) = transport_address()?;
    tracing::info!(
        target: "unihal::bootstrap",
        "gloo rank {rank} of {size}: TCP transport on {}",
        if iface.is_empty() {
            format!("address {host}")
        } else {
            format!("interface {iface} (GLOO_SOCKET_IFNAME)")
        }
    );
    let (host, iface) = (
        CString::new(host).map_err(|e| HalError::Internal(e.to_string()))?,
        CString::new(iface).map_err(|e| HalError::Internal(e.to_string()))?,
    );
    let ctx = StoreCtx {
        store: rv.store.clone(),
        error: Mutex::new(None),
    };
    let ms = unihal_hal::deadline::clock_millis(timeout);
    let mut out = std::ptr::null_mut();
    let mut err = conv::ErrBuf::new();
    // SAFETY: `ctx` outlives the call (the store callbacks run inside it); the strings are
    // NUL-terminated; `out` is written on success.
    let rc = unsafe {
        ffi::uh_gloo_connect(
            (&ctx as *const StoreCtx).cast_mut().cast(),
            store_set,
            store_get,
            store_wait,
            rank as c_int,
            size as c_int,
            host.as_ptr(),
            iface.as_ptr(),
            ms,
            &mut out,
            err.ptr(),
            err.0.len(),
        )
    };
    if rc != 0 {
        if let Some(e) = ctx.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        conv::check(rc, &format!("connecting rank {rank} of {size}"), &err, ms)?;
    }
    let link = Link::new(out, rank, size, timeout, rv);
    // A rank returns only once every rank has connected: gloo's full mesh may be complete on one
    // side of a pair before the other, and a rank that went on and closed its connections at
    // once (a communicator made and dropped) failed a peer still connecting ("connection closed
    // by peer"; seen under ASan's timing).
    let store = &link.rendezvous.store;
    if store.add("connected", 1)? == size as i64 {
        store.set("all-connected", b"1")?;
    }
    store.wait(&["all-connected"], timeout)?;
    Ok(link)
}

/// The store this process serves for the ids it makes, and the address the ids give for it.
fn id_server() -> Result<&'static (TcpStoreServer, String)> {
    static SERVER: OnceLock<std::result::Result<(TcpStoreServer, String), HalError>> =
        OnceLock::new();
    SERVER
        .get_or_init(|| {
            let server = TcpStoreServer::bind("0.0.0.0:0")?;
            let (host, _) = transport_address()?;
            let host = if host.is_empty() {
                "127.0.0.1".into()
            } else {
                host
            };
            Ok((server, host))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The job's store when a launcher started several processes (kept for the process's life: rank
/// 0 may serve it).
fn job_store(info: &LaunchInfo, timeout: Duration) -> Result<Arc<JobStore>> {
    static JOB: OnceLock<std::result::Result<Arc<JobStore>, HalError>> = OnceLock::new();
    JOB.get_or_init(|| JobStore::connect(info, timeout).map(Arc::new))
        .as_ref()
        .map(Arc::clone)
        .map_err(Clone::clone)
}

impl GlooCollectives {
    /// The communicator of a connected `link`, logged as made by `how`.
    fn comm(
        &self,
        link: Arc<Link>,
        device: &Arc<dyn Device>,
        how: &str,
        timeout: Duration,
    ) -> Arc<dyn Communicator> {
        let comm: Arc<dyn Communicator> =
            Arc::new(GlooComm::new(link, device.clone(), self.caps.clone()));
        unihal_hal::ccl::log_created(
            std::slice::from_ref(&comm),
            &self.caps.engine,
            how,
            Some(timeout),
        );
        comm
    }
}

impl Collectives for GlooCollectives {
    fn capabilities(&self) -> &CclCaps {
        &self.caps
    }

    /// 128 bytes: the magic, the port and host of the store this process serves for its ids,
    /// and a random name under which the id's ranks meet there.
    fn unique_id(&self) -> Result<UniqueId> {
        static N: AtomicU64 = AtomicU64::new(0);
        let (server, host) = id_server()?;
        let mut id = vec![0u8; ID_LEN];
        id[..16].copy_from_slice(ID_MAGIC);
        id[16..18].copy_from_slice(&server.port().to_le_bytes());
        id[18..26].copy_from_slice(&unihal_hal::ccl::process_tag().nonce.to_le_bytes());
        id[26..34].copy_from_slice(&N.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        let h = host.as_bytes();
        if h.len() > ID_LEN - 35 {
            return Err(HalError::unsupported(format!(
                "a gloo id for host name {host:?} (longer than {} bytes)",
                ID_LEN - 35
            )));
        }
        id[34] = h.len() as u8;
        id[35..35 + h.len()].copy_from_slice(h);
        Ok(UniqueId(id))
    }

    fn init_rank(
        &self,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Result<Arc<dyn Communicator>> {
        super::check_device(device)?;
        let b = &id.0;
        let bad = || {
            HalError::invalid(
                "id",
                Invalid::Value {
                    value: format!("{} bytes", b.len()),
                    accepted: "a 128-byte id from the gloo engine's unique_id".into(),
                },
            )
        };
        if b.len() != ID_LEN || !b.starts_with(ID_MAGIC) || b[34] as usize > ID_LEN - 35 {
            return Err(bad());
        }
        let port = u16::from_le_bytes([b[16], b[17]]);
        let host = std::str::from_utf8(&b[35..35 + b[34] as usize]).map_err(|_| bad())?;
        let name: String = b[18..34].iter().map(|x| format!("{x:02x}")).collect();
        let timeout = unihal_hal::ccl::timeout_or(config, self.timeout)?;
        let store =
            TcpStore::connect(host, port, timeout)?.with_prefix(&format!("unihal/gloo/{name}"));
        // One rank per device of a process: two ranks on one device would share its memory.
        let me = format!(
            "{:016x}/{}",
            unihal_hal::ccl::process_tag().nonce,
            device.id()
        );
        store.set(&format!("device/{rank}"), me.as_bytes())?;
        let link = connect(
            Rendezvous {
                store: store.clone(),
                _keep: None,
            },
            rank,
            nranks,
            timeout,
        )?;
        for r in (0..nranks).filter(|&r| r != rank) {
            if store.get(&format!("device/{r}"))? == me.as_bytes() {
                return Err(HalError::invalid(
                    "device",
                    Invalid::Value {
                        value: format!("{} as ranks {r} and {rank}", device.id()),
                        accepted: "each device at most once per communicator (one rank per device)"
                            .into(),
                    },
                ));
            }
        }
        Ok(self.comm(link, device, "init_rank", timeout))
    }

    /// One thread per device joins a fresh id (gloo connects ranks over TCP, in this process too).
    fn init_all(
        &self,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        if devices.is_empty() {
            return Err(HalError::invalid(
                "devices",
                Invalid::Other("no devices".into()),
            ));
        }
        devices.iter().try_for_each(super::check_device)?;
        unihal_hal::ccl::check_distinct_devices(devices)?;
        let id = self.unique_id()?;
        let n = devices.len();
        std::thread::scope(|s| {
            let joins: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(r, d)| {
                    let id = &id;
                    s.spawn(move || self.init_rank(id, n, r, d, config))
                })
                .collect();
            joins
                .into_iter()
                .map(|j| {
                    j.join().unwrap_or_else(|_| {
                        Err(HalError::Internal("init_all thread panicked".into()))
                    })
                })
                .collect()
        })
    }

    /// Under a launcher that started several processes and names a store address: this
    /// process's rank of the job, meeting the others through the job's store (torchrun's agent
    /// store, or rank 0's). `None` for a single process or a launch without a store address.
    fn connected_world(
        &self,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Option<Result<Arc<dyn Communicator>>> {
        let info = match LaunchInfo::from_env() {
            Ok(i) if i.world_size > 1 && i.master.is_some() => i,
            // No store address (mpirun): ranks join with an id, carried over MPI by the
            // bootstrap.
            Ok(_) => return None,
            Err(e) => return Some(Err(e)),
        };
        static WORLDS: AtomicU64 = AtomicU64::new(0);
        let timeout = match unihal_hal::ccl::timeout_or(config, self.timeout) {
            Ok(t) => t,
            Err(e) => return Some(Err(e)),
        };
        Some((|| {
            super::check_device(device)?;
            let job = job_store(&info, timeout)?;
            let k = WORLDS.fetch_add(1, Ordering::SeqCst);
            let rv = Rendezvous {
                store: job.store().with_prefix(&format!("unihal/gloo/world{k}")),
                _keep: Some(job),
            };
            let link = connect(rv, info.rank, info.world_size, timeout)?;
            Ok(self.comm(link, device, "the launcher's store", timeout))
        })())
    }
}
