//! The CPU backend's collective engine across processes and machines: MPI (Open MPI 4 in CI),
//! behind the `mpi` cargo feature.
//!
//! One process holds one rank. Every operation first meets its peers in a small **arrival
//! handshake** on a control communicator (each rank sends every other rank a token naming the
//! operation, with a deadline), then moves the data with MPI's own blocking collective
//! (`MPI_Allreduce`, `MPI_Bcast`, ... with their tuned algorithms); an all-reduce of at most 256
//! bytes per rank sends its data with the token instead (one message each way per peer, reduced in
//! rank order). The handshake is what makes
//! MPI honour unihal's failure contract: a rank that never arrives is a `Timeout` naming it,
//! mismatched calls are an `InvalidArgument` instead of undefined behaviour inside MPI, and
//! `abort` (which notifies the peers on the control communicator) unblocks waiting ranks. Once all
//! ranks have arrived the data phase cannot be interrupted; a rank that dies then ends the whole
//! job through `mpirun`, since Open MPI 4 has no fault tolerance (`survives_dead_rank: false`).
//!
//! MPI has no f16, bf16 or bool arithmetic and no avg: those dtypes only move (broadcast,
//! gathers, all-to-all, send/recv), and avg is emulated as sum then division (reported in
//! [`unihal_hal::ccl::Accumulation::emulated`]). The engine requires `MPI_THREAD_MULTIPLE`, since
//! operations run on stream workers; it calls `MPI_Finalize` when the process exits.

mod comm;
mod conv;
mod ffi;

pub use comm::MpiComm;

use comm::Link;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use unihal_hal::ccl::{timeout_from_env, Accumulation, DEFAULT_TIMEOUT};
use unihal_hal::{
    CclCaps, CollectiveOp, Collectives, CommConfig, Communicator, DType, Device, HalError,
    ReduceOp, Result, UniqueId,
};

/// The first bytes of this engine's unique ids.
const ID_MAGIC: &[u8] = b"unihal-mpi-world";

/// True when the environment selects the MPI engine ([`super::selected`]).
pub fn selected() -> bool {
    super::selected() == Ok(super::Engine::Mpi)
}

/// The MPI engine of this process (MPI is initialised on first use).
///
/// # Errors
/// [`HalError::Vendor`] when `MPI_Init_thread` fails; [`HalError::Unavailable`] when the library
/// does not provide `MPI_THREAD_MULTIPLE`.
pub fn engine() -> Result<&'static MpiCollectives> {
    static ENGINE: OnceLock<Result<MpiCollectives>> = OnceLock::new();
    ENGINE
        .get_or_init(MpiCollectives::init)
        .as_ref()
        .map_err(Clone::clone)
}

/// The engine: MPI's world, the capabilities and the default timeout. Thread safety: any thread.
pub struct MpiCollectives {
    caps: CclCaps,
    timeout: Duration,
    world_rank: usize,
    world_size: usize,
}

extern "C" fn finalize_at_exit() {
    let mut done = 0;
    // SAFETY: MPI_Finalized may be called at any time; MPI_Finalize once, after initialisation.
    unsafe {
        if ffi::MPI_Finalized(&mut done) == 0 && done == 0 {
            ffi::MPI_Finalize();
        }
    }
}

fn caps(version: String) -> CclCaps {
    let reducible: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|&d| conv::datatype(d).is_some())
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
        engine: format!("MPI ({version})"),
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
        survives_dead_rank: false,
        names_missing_ranks: true,
        timeout_aborts_peers: false,
        crosses_processes: true,
    }
}

impl MpiCollectives {
    fn init() -> Result<MpiCollectives> {
        let (mut inited, mut provided) = (0, 0);
        // SAFETY: MPI_Initialized may be called before MPI_Init; MPI_Init_thread accepts null
        // argc/argv; `provided` is written by the call.
        unsafe {
            conv::check(ffi::MPI_Initialized(&mut inited), "MPI_Initialized")?;
            if inited == 0 {
                conv::check(
                    ffi::MPI_Init_thread(
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        ffi::RSMPI_THREAD_MULTIPLE,
                        &mut provided,
                    ),
                    "MPI_Init_thread",
                )?;
                ffi::atexit(finalize_at_exit);
            } else {
                conv::check(ffi::MPI_Query_thread(&mut provided), "MPI_Query_thread")?;
            }
            if provided < ffi::RSMPI_THREAD_MULTIPLE {
                return Err(HalError::Unavailable {
                    what: "MPI collective engine".into(),
                    reason: format!(
                        "the MPI library provides thread level {provided}, the engine needs \
                         MPI_THREAD_MULTIPLE"
                    ),
                });
            }
            ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN);
        }
        let (mut rank, mut size) = (0, 0);
        // SAFETY: MPI is initialised; the outputs are plain ints.
        unsafe {
            conv::check(
                ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank),
                "MPI_Comm_rank",
            )?;
            conv::check(
                ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size),
                "MPI_Comm_size",
            )?;
        }
        let library = library_version();
        tracing::info!(
            target: "unihal::coll",
            "MPI engine: rank {rank} of {size} initialised ({library})"
        );
        Ok(MpiCollectives {
            caps: caps(library),
            timeout: timeout_from_env().unwrap_or(DEFAULT_TIMEOUT),
            world_rank: rank as usize,
            world_size: size as usize,
        })
    }

    /// This process's rank in MPI's world.
    pub fn world_rank(&self) -> usize {
        self.world_rank
    }

    /// The number of processes in MPI's world.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    fn world(
        &self,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Result<Arc<dyn Communicator>> {
        super::check_device(device)?;
        let timeout = unihal_hal::ccl::timeout_or(config, self.timeout)?;
        // SAFETY: a constant handle set up by the MPI library.
        let world = ffi::Comm(unsafe { ffi::RSMPI_COMM_WORLD });
        let link = Link::dup(world, timeout)?;
        let comm: Arc<dyn Communicator> = Arc::new(MpiComm::new(
            link,
            device.clone(),
            Arc::new(self.caps.clone()),
        ));
        let engine = &self.caps.engine;
        unihal_hal::ccl::log_created(
            std::slice::from_ref(&comm),
            engine,
            "the MPI world",
            Some(timeout),
        );
        Ok(comm)
    }
}

/// The first line of `MPI_Get_library_version`.
pub(crate) fn library_version() -> String {
    // SAFETY: a constant set up by the MPI library.
    let max = unsafe { ffi::RSMPI_MAX_LIBRARY_VERSION_STRING }.max(1) as usize;
    let mut buf = vec![0u8; max];
    let mut len = 0;
    // SAFETY: the buffer holds MPI_MAX_LIBRARY_VERSION_STRING bytes, as the call requires.
    let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return "unknown MPI".into();
    }
    buf.truncate(len.clamp(0, max as i32) as usize);
    let s = String::from_utf8_lossy(&buf);
    // "Open MPI v4.1.4, package: ..., ident: ..." -> "Open MPI v4.1.4"
    s.split([',', '\n']).next().unwrap_or("").trim().to_string()
}

impl Collectives for MpiCollectives {
    fn capabilities(&self) -> &CclCaps {
        &self.caps
    }

    /// An id naming MPI's world (the processes are already connected, so it carries no address).
    fn unique_id(&self) -> Result<UniqueId> {
        let mut id = vec![0u8; 128];
        id[..ID_MAGIC.len()].copy_from_slice(ID_MAGIC);
        id[ID_MAGIC.len()..ID_MAGIC.len() + 8]
            .copy_from_slice(&(self.world_size as u64).to_le_bytes());
        Ok(UniqueId(id))
    }

    /// Every process of MPI's world must call, with its own world rank: the communicator spans
    /// the world (use `split` for fewer ranks).
    fn init_rank(
        &self,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Result<Arc<dyn Communicator>> {
        let bad = |arg: &'static str, value: String, accepted: String| {
            Err(HalError::invalid(
                arg,
                unihal_hal::Invalid::Value { value, accepted },
            ))
        };
        if id.0.len() != 128 || !id.0.starts_with(ID_MAGIC) {
            return bad(
                "id",
                format!("{} bytes", id.0.len()),
                "an id from the MPI engine's unique_id".into(),
            );
        }
        if nranks != self.world_size {
            return bad(
                "nranks",
                nranks.to_string(),
                format!("the MPI world size {}", self.world_size),
            );
        }
        if rank != self.world_rank {
            return bad(
                "rank",
                rank.to_string(),
                format!("this process's MPI rank {}", self.world_rank),
            );
        }
        self.world(device, config)
    }

    fn init_all(
        &self,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        if devices.len() != 1 || self.world_size != 1 {
            return Err(HalError::unsupported(format!(
                "init_all of {} devices on the MPI engine: one process holds one rank of the {}-process \
                 world (use init_rank or connected_world)",
                devices.len(),
                self.world_size
            )));
        }
        Ok(vec![self.world(&devices[0], config)?])
    }

    fn connected_world(
        &self,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Option<Result<Arc<dyn Communicator>>> {
        Some(self.world(device, config))
    }
}

/// Runs `MPI_Allreduce` directly on MPI's world, synchronously, from `send` into `recv` (CPU
/// device buffers, not aliased): the baseline that benchmarks compare the engine with. Every
/// process of the world must call it.
///
/// # Errors
/// [`HalError::InvalidArgument`] for buffers too small or not CPU buffers;
/// [`HalError::Unsupported`] for dtypes MPI does not reduce; MPI's errors as `Vendor`.
pub fn direct_all_reduce(
    send: &unihal_hal::Buffer,
    recv: &unihal_hal::Buffer,
    count: u64,
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    engine()?;
    let bytes = count * dtype.size() as u64;
    let sa = crate::stream::cpu_addr(send, "send", send.device(), 0, bytes)?;
    let ra = crate::stream::cpu_addr(recv, "recv", recv.device(), 0, bytes)?;
    let dt = conv::datatype(dtype)
        .ok_or_else(|| HalError::unsupported(format!("MPI reductions of {dtype}")))?;
    let n = conv::count(count, "all_reduce")?;
    // SAFETY: both ranges were checked above and the caller's buffers outlive this synchronous
    // call; MPI is initialised (engine()).
    conv::check(
        unsafe {
            ffi::MPI_Allreduce(
                sa as *const std::ffi::c_void,
                ra as *mut std::ffi::c_void,
                n,
                dt,
                conv::op(op),
                ffi::RSMPI_COMM_WORLD,
            )
        },
        "MPI_Allreduce",
    )
}

/// Broadcasts `bytes` from rank 0 of MPI's world to every process (every process must call):
/// how a launch by `mpirun` without a store address hands another engine's unique id (NCCL's,
/// gloo's) to the other ranks. Returns rank 0's bytes on every process.
///
/// # Errors
/// The engine's initialisation errors; [`HalError::InvalidArgument`] for more than 1 MiB; MPI's
/// errors as `Vendor`.
pub fn broadcast_from_rank0(bytes: &[u8]) -> Result<Vec<u8>> {
    let e = engine()?;
    let mut len = if e.world_rank == 0 {
        bytes.len() as u64
    } else {
        0
    };
    // SAFETY: MPI is initialised (engine()); `len` is one u64 on every rank.
    let rc = unsafe {
        ffi::MPI_Bcast(
            (&mut len as *mut u64).cast(),
            1,
            ffi::RSMPI_UINT64_T,
            0,
            ffi::RSMPI_COMM_WORLD,
        )
    };
    conv::check(rc, "MPI_Bcast")?;
    if len > 1 << 20 {
        return Err(HalError::invalid(
            "bytes",
            unihal_hal::Invalid::Value {
                value: format!("{len} bytes"),
                accepted: "at most 1 MiB".into(),
            },
        ));
    }
    let mut out = if e.world_rank == 0 {
        bytes.to_vec()
    } else {
        vec![0u8; len as usize]
    };
    // SAFETY: `out` holds `len` bytes on every rank (the length was broadcast first).
    let rc = unsafe {
        ffi::MPI_Bcast(
            out.as_mut_ptr().cast(),
            len as i32,
            conv::bytes(),
            0,
            ffi::RSMPI_COMM_WORLD,
        )
    };
    conv::check(rc, "MPI_Bcast")?;
    Ok(out)
}
