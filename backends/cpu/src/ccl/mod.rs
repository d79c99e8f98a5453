//! The CPU backend's collective engine: communicators among its virtual devices in one process.
//!
//! Ranks meet in a [`rendezvous::Rendezvous`] per communicator; each operation runs on the rank's
//! stream worker. Reductions are chunked across ranks (every rank reduces 1/n of the data from all
//! ranks, then copies the others' chunks), accumulate f16/bf16 in f32, and are deterministic (ranks
//! are combined in rank order). Timeouts come from `UNIHAL_CCL_TIMEOUT`.

mod comm;
#[cfg(feature = "gloo")]
pub mod gloo;
#[cfg(feature = "mpi")]
pub mod mpi;
mod rendezvous;

pub use comm::CpuComm;

use crate::device::CpuDevice;
use comm::CommShared;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use unihal_hal::ccl::{log_created, timeout_from_env, Accumulation, DEFAULT_TIMEOUT};
use unihal_hal::{
    CclCaps, CollectiveOp, Collectives, CommConfig, Communicator, DType, Device, DeviceId,
    HalError, Invalid, ReduceOp, Result, UniqueId,
};

/// Environment variable choosing the CPU backend's engine: `inprocess`, `mpi` or `gloo`.
pub const ENGINE_ENV: &str = "UNIHAL_CPU_CCL";

/// The CPU backend's collective engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Ranks are devices of this process ([`CpuCollectives`]).
    InProcess,
    /// One rank per process under `mpirun` (feature `mpi`).
    Mpi,
    /// One rank per process, meeting through the launcher's c10d store (feature `gloo`).
    Gloo,
}

/// The engine the environment selects. `UNIHAL_CPU_CCL` names it; unset: MPI when `mpirun`
/// started the process (`OMPI_COMM_WORLD_SIZE` or `PMI_SIZE`) and the build has it, else gloo
/// when a launcher started several processes (`WORLD_SIZE` or `SLURM_NTASKS` over 1) and the
/// build has it, else the in-process engine (whose bootstrap then refuses ranks in other
/// processes, naming these engines).
///
/// # Errors
/// [`HalError::InvalidArgument`] for an unknown value; [`HalError::Unavailable`] naming the
/// cargo feature when the named engine is not in this build.
pub fn selected() -> Result<Engine> {
    let built = |e: Engine| match e {
        Engine::InProcess => true,
        Engine::Mpi => cfg!(feature = "mpi"),
        Engine::Gloo => cfg!(feature = "gloo"),
    };
    match unihal_hal::settings::get(ENGINE_ENV).as_deref() {
        Some(v) => {
            let e = match v {
                "inprocess" => Engine::InProcess,
                "mpi" => Engine::Mpi,
                "gloo" => Engine::Gloo,
                other => return Err(unihal_hal::settings::refuse(ENGINE_ENV, other)),
            };
            if !built(e) {
                let feature = if e == Engine::Mpi { "mpi" } else { "gloo" };
                return Err(HalError::Unavailable {
                    what: format!("the CPU backend's {feature} collective engine"),
                    reason: format!(
                        "{ENGINE_ENV}={v}, but this build has no {feature} engine: build with \
                         --features {feature}"
                    ),
                });
            }
            Ok(e)
        }
        None => {
            let var = |k: &str| std::env::var(k).ok();
            let many = |k: &str| {
                var(k)
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .is_some_and(|n| n > 1)
            };
            if (var("OMPI_COMM_WORLD_SIZE").is_some() || var("PMI_SIZE").is_some())
                && built(Engine::Mpi)
            {
                Ok(Engine::Mpi)
            } else if (many("WORLD_SIZE") || many("SLURM_NTASKS")) && built(Engine::Gloo) {
                Ok(Engine::Gloo)
            } else {
                Ok(Engine::InProcess)
            }
        }
    }
}

/// The engine.
pub struct CpuCollectives {
    caps: Arc<CclCaps>,
    timeout: Duration,
}

fn engine_caps() -> CclCaps {
    let reducible: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|&d| comm::reduces(d))
        .collect();
    let mut ops = BTreeMap::new();
    for op in CollectiveOp::ALL {
        ops.insert(
            op,
            if op.reduces() {
                reducible.clone()
            } else {
                DType::ALL.to_vec()
            },
        );
    }
    CclCaps {
        engine: format!("unihal-cpu in-process {}", env!("CARGO_PKG_VERSION")),
        ops,
        reductions: reducible
            .iter()
            .map(|&d| (d, ReduceOp::ALL.to_vec()))
            .collect(),
        accumulation: reducible
            .iter()
            .map(|&d| {
                let acc = if matches!(d, DType::F16 | DType::Bf16) {
                    DType::F32
                } else {
                    d
                };
                (
                    d,
                    Accumulation {
                        accumulate_in: acc,
                        emulated: Vec::new(),
                    },
                )
            })
            .collect(),
        groups: true,
        split: true,
        survives_dead_rank: true,
        names_missing_ranks: true,
        timeout_aborts_peers: false,
        crosses_processes: false,
    }
}

/// Communicators being formed by `init_rank`, by id.
struct Pending {
    shared: Arc<CommShared>,
    /// The device of each rank that has joined.
    ranks: Vec<Option<DeviceId>>,
    joined: usize,
}

/// An id's state: being joined, spent (its communicator was formed; an id makes one
/// communicator, as NCCL's, whose bootstrap root is gone once every rank connected), or refused
/// (two ranks came on one device: every rank of the id fails, as NCCL's init does).
enum Slot {
    Joining(Pending),
    Spent,
    Refused(String),
}

/// The error of every rank of a communicator whose ranks share a device (`why` names them).
fn shared_device(why: &str) -> HalError {
    HalError::invalid(
        "device",
        Invalid::Value {
            value: why.to_string(),
            accepted: "each device at most once per communicator (one rank per device)".into(),
        },
    )
}

/// The length of the engine's ids, and their first bytes.
const ID_LEN: usize = 128;
const ID_MAGIC: &[u8; 16] = b"unihal-cpu-local";

/// Refuses an id this engine did not make, and at once an id made by another process: this
/// engine connects the ranks of one process only, and waiting for ranks that can never join would
/// end only at the timeout.
fn check_id(id: &UniqueId) -> Result<()> {
    let b = &id.0;
    if b.len() != ID_LEN || !b.starts_with(ID_MAGIC) {
        return Err(HalError::invalid(
            "id",
            Invalid::Value {
                value: format!("{} bytes", b.len()),
                accepted: "a 128-byte id from this engine's unique_id".into(),
            },
        ));
    }
    let nonce = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    if nonce != unihal_hal::ccl::process_tag().nonce {
        let host = String::from_utf8_lossy(&b[32..]);
        return Err(HalError::invalid(
            "id",
            Invalid::Other(format!(
                "an id made by another process (on host {}): the CPU backend's in-process engine \
                 connects the ranks of one process only; across processes use its gloo engine \
                 (UNIHAL_CPU_CCL=gloo, a build with --features gloo) or its MPI engine (mpirun, \
                 --features mpi), or a GPU backend's NCCL, RCCL or HCCL",
                host.trim_end_matches('\0')
            )),
        ));
    }
    Ok(())
}

type PendingTable = (Mutex<HashMap<Vec<u8>, Slot>>, Condvar);

fn pending() -> &'static PendingTable {
    static P: OnceLock<PendingTable> = OnceLock::new();
    P.get_or_init(Default::default)
}

impl CpuCollectives {
    pub(crate) fn new() -> CpuCollectives {
        CpuCollectives {
            caps: Arc::new(engine_caps()),
            timeout: timeout_from_env().unwrap_or(DEFAULT_TIMEOUT),
        }
    }

    /// The same engine with another timeout (tests, benchmarks).
    pub fn with_timeout(mut self, timeout: Duration) -> CpuCollectives {
        self.timeout = timeout;
        self
    }

    fn shared(&self, nranks: usize, timeout: Duration) -> Arc<CommShared> {
        CommShared::new(nranks, timeout, self.caps.clone())
    }
}

/// The HAL's checks common to every operation ([`unihal_hal::ccl::check_call`]), then the CPU
/// stream behind `stream`.
pub(crate) fn checked_stream<'s>(
    device: &Arc<dyn Device>,
    caps: &CclCaps,
    sticky: Option<HalError>,
    call: (CollectiveOp, DType, Option<ReduceOp>),
    stream: &'s Arc<dyn unihal_hal::Stream>,
) -> Result<&'s crate::stream::CpuStream> {
    unihal_hal::ccl::check_call(device, caps, sticky, call, stream)?;
    stream
        .as_any()
        .downcast_ref::<crate::stream::CpuStream>()
        .ok_or_else(|| {
            HalError::invalid(
                "stream",
                Invalid::ForeignHandle {
                    expected: "CPU stream".into(),
                    found: format!("stream of {}", stream.device_id()),
                },
            )
        })
}

pub(crate) use unihal_hal::ccl::{check_not_in_place as not_in_place, check_rank as rank_arg};

/// FNV-1a of an operation's number and description: the arrival token every rank of a
/// cross-process engine (MPI, gloo) compares before an operation.
#[cfg(any(feature = "mpi", feature = "gloo"))]
pub(crate) fn arrival_token(seq: u64, what: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seq.to_le_bytes().iter().chain(what.as_bytes()) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// An address that crosses to a stream worker (the operation holds the buffers it points into).
#[cfg(any(feature = "mpi", feature = "gloo"))]
#[derive(Clone, Copy)]
pub(crate) struct Addr(pub(crate) u64);

#[cfg(any(feature = "mpi", feature = "gloo"))]
impl Addr {
    pub(crate) fn ptr(self) -> *mut std::ffi::c_void {
        self.0 as *mut std::ffi::c_void
    }

    /// Null when `self` is `other` (gloo's in-place form).
    #[cfg(feature = "gloo")]
    pub(crate) fn or_null_if(self, other: Addr) -> *const std::ffi::c_void {
        if self.0 == other.0 {
            std::ptr::null()
        } else {
            self.0 as *const std::ffi::c_void
        }
    }
}

pub(crate) fn check_device(d: &Arc<dyn Device>) -> Result<()> {
    if d.as_any().downcast_ref::<CpuDevice>().is_none() {
        return Err(HalError::invalid(
            "device",
            Invalid::ForeignHandle {
                expected: "CPU device".into(),
                found: d.id().to_string(),
            },
        ));
    }
    Ok(())
}

impl Collectives for CpuCollectives {
    fn capabilities(&self) -> &CclCaps {
        &self.caps
    }

    /// 128 bytes: [`ID_MAGIC`], this process's random [`unihal_hal::ccl::ProcessTag`] value, a
    /// counter, and the host name (for messages), so that an id carried to another process is
    /// refused there at once.
    fn unique_id(&self) -> Result<UniqueId> {
        static N: AtomicU64 = AtomicU64::new(0);
        let tag = unihal_hal::ccl::process_tag();
        let mut id = vec![0u8; ID_LEN];
        id[..16].copy_from_slice(ID_MAGIC);
        id[16..24].copy_from_slice(&tag.nonce.to_le_bytes());
        id[24..32].copy_from_slice(&N.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        let host = tag.host.as_bytes();
        let n = host.len().min(ID_LEN - 32);
        id[32..32 + n].copy_from_slice(&host[..n]);
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
        check_device(device)?;
        if nranks == 0 || rank >= nranks {
            return Err(HalError::invalid(
                "rank",
                Invalid::Value {
                    value: format!("rank {rank} of {nranks}"),
                    accepted: "0 <= rank < nranks".into(),
                },
            ));
        }
        check_id(id)?;
        let timeout = unihal_hal::ccl::timeout_or(config, self.timeout)?;
        let (lock, cv) = pending();
        let mut g = lock.lock();
        let slot = g.entry(id.0.clone()).or_insert_with(|| {
            Slot::Joining(Pending {
                shared: self.shared(nranks, timeout),
                ranks: vec![None; nranks],
                joined: 0,
            })
        });
        let p = match slot {
            Slot::Joining(p) => p,
            Slot::Refused(why) => return Err(shared_device(why)),
            Slot::Spent => {
                return Err(HalError::invalid(
                    "id",
                    Invalid::Value {
                        value: "an id whose communicator was already formed".into(),
                        accepted: "a fresh id from unique_id (an id makes one communicator)".into(),
                    },
                ))
            }
        };
        if p.shared.rv.nranks != nranks {
            return Err(HalError::invalid(
                "nranks",
                Invalid::Value {
                    value: nranks.to_string(),
                    accepted: format!("{} as the other ranks said", p.shared.rv.nranks),
                },
            ));
        }
        if p.ranks[rank].is_some() {
            return Err(HalError::invalid(
                "rank",
                Invalid::Value {
                    value: format!("rank {rank}"),
                    accepted: "a rank no other init_rank call with this id has taken".into(),
                },
            ));
        }
        // One rank per device: two ranks on one device would share its memory, and a collective
        // between them would read and write one range as two (a broadcast's root send and
        // receive overlapping). Every rank of the id fails, those waiting included.
        if let Some(other) = p.ranks.iter().position(|d| *d == Some(device.id())) {
            let why = format!("{} as ranks {other} and {rank}", device.id());
            *slot = Slot::Refused(why.clone());
            cv.notify_all();
            return Err(shared_device(&why));
        }
        p.ranks[rank] = Some(device.id());
        p.joined += 1;
        let shared = p.shared.clone();
        cv.notify_all();
        let deadline = unihal_hal::deadline::after(timeout);
        let joining = |g: &HashMap<Vec<u8>, Slot>| match g.get(&id.0) {
            Some(Slot::Joining(p)) => Some(p.joined < nranks),
            _ => None,
        };
        while joining(&g) == Some(true) {
            if cv.wait_until(&mut g, deadline).timed_out() && joining(&g) == Some(true) {
                // Leave: a rank that comes later must not count this one as present.
                let mut missing = Vec::new();
                if let Some(Slot::Joining(p)) = g.get_mut(&id.0) {
                    p.ranks[rank] = None;
                    p.joined -= 1;
                    missing = (0..nranks)
                        .filter(|&r| p.ranks[r].is_none() && r != rank)
                        .collect();
                    if p.joined == 0 {
                        g.remove(&id.0);
                    }
                }
                return Err(HalError::Timeout {
                    what: format!("init_rank {rank}: ranks {missing:?} never joined"),
                    millis: unihal_hal::deadline::millis(timeout),
                });
            }
        }
        if let Some(Slot::Refused(why)) = g.get(&id.0) {
            return Err(shared_device(why));
        }
        g.insert(id.0.clone(), Slot::Spent);
        drop(g);
        let comm: Arc<dyn Communicator> = Arc::new(CpuComm::new(rank, device.clone(), shared));
        log_created(
            std::slice::from_ref(&comm),
            &self.caps.engine,
            "init_rank",
            Some(timeout),
        );
        Ok(comm)
    }

    fn init_all(
        &self,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        crate::fault::point("communicator_init")?;
        if devices.is_empty() {
            return Err(HalError::invalid(
                "devices",
                Invalid::Other("no devices".into()),
            ));
        }
        devices.iter().try_for_each(check_device)?;
        unihal_hal::ccl::check_distinct_devices(devices)?;
        let timeout = unihal_hal::ccl::timeout_or(config, self.timeout)?;
        let shared = self.shared(devices.len(), timeout);
        let comms: Vec<Arc<dyn Communicator>> = devices
            .iter()
            .enumerate()
            .map(|(r, d)| {
                Arc::new(CpuComm::new(r, d.clone(), shared.clone())) as Arc<dyn Communicator>
            })
            .collect();
        log_created(&comms, &self.caps.engine, "init_all", Some(timeout));
        Ok(comms)
    }
}
