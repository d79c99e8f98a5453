//! Collectives through NCCL, with unihal's own run-time binding of its C API ([`ffi`]; cudarc's
//! wrapper panics on drop, is not `Send`, lacks all-to-all and async-error queries, and never finds
//! `libnccl.so.2`). Written so RCCL can reuse it unchanged (same API, another library).
//!
//! * Unique ids are NCCL's 128 bytes, exchanged by the caller (the collectives bootstrap).
//! * Operations validate like every engine ([`unihal_hal::ccl::check_call`]), then enqueue the
//!   NCCL call on the CUDA stream, which keeps the buffers until the work ran.
//! * **Never hang**: a communicator's watchdog thread (alive while operations are in flight)
//!   polls each operation's completion event and `ncclCommGetAsyncError`; past the timeout
//!   (`UNIHAL_CCL_TIMEOUT`, or the config's) it aborts the NCCL communicator, which ends the
//!   stuck kernels, and fails the operation's stream and the communicator with `Timeout`. A peer's
//!   abort (`ncclRemoteError`) aborts this rank too: its pending operations fail with `Aborted`.
//!   The blocking host calls that wait for every rank (`ncclCommInitRank`, `ncclCommSplit`) run on
//!   a helper thread (`bounded`): past the timeout the caller gets `Timeout`, and a call that
//!   completes later has its communicator destroyed by the helper.
//! * **One caller at a time**: NCCL communicators are not thread-safe, so every call on a
//!   communicator (collectives, the watchdog's and `async_error`'s `ncclCommGetAsyncError`,
//!   split, abort, destroy) holds its lock. Abort never waits for a call blocked on its peers: the
//!   holder aborts when that call returns. Once aborted, the handle is gone and later uses get
//!   `Aborted`. Dropping the last handle destroys the communicator, or aborts it when operations
//!   are still in flight or it failed (`ncclCommDestroy` would wait for them).
//! * Capabilities are NCCL's: ten dtypes, five reductions, reductions *in the element type*
//!   (f16/bf16 accumulate in f16/bf16 along the ring), grouped calls, split when the library has
//!   `ncclCommSplit`.

pub mod comm;
pub mod conv;
pub mod ffi;

use crate::device::CudaDevice;
use comm::NcclComm;
use ffi::{Nccl, UniqueId as RawId};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use unihal_hal::ccl::Accumulation;
use unihal_hal::{
    CclCaps, CollectiveOp, Collectives, CommConfig, Communicator, Device, HalError, Invalid,
    ReduceOp, Result, UniqueId,
};

/// Runs `call`, a blocking NCCL call that waits for every rank, on a helper thread and waits for
/// it up to `timeout`. Past it the caller gets `Timeout` naming `what`; when the call completes
/// later, its result goes to `late` on the helper thread (which destroys a communicator nobody
/// will use). NCCL gives no way to cancel such a call; the helper thread stays blocked until it
/// returns.
///
/// # Errors
/// `call`'s error; [`HalError::Timeout`]; [`HalError::Internal`] when the thread cannot start.
pub(crate) fn bounded<T: Send + 'static>(
    what: &str,
    timeout: std::time::Duration,
    call: impl FnOnce() -> Result<T> + Send + 'static,
    late: impl FnOnce(T) + Send + 'static,
) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("unihal-nccl {what}"))
        .spawn(move || {
            if let Err(std::sync::mpsc::SendError(Ok(v))) = tx.send(call()) {
                late(v);
            }
        })
        .map_err(|e| HalError::Internal(format!("{what}: no helper thread: {e}")))?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(HalError::Timeout {
            what: format!("{what}: not every rank called within {timeout:?}"),
            millis: timeout.as_millis() as u64,
        }),
    }
}

/// The NCCL collective engine of the CUDA backend (NCCL opened on first use).
#[derive(Default)]
pub struct NcclCollectives {
    lib: OnceLock<Result<Arc<Nccl>>>,
    caps: OnceLock<CclCaps>,
}

impl NcclCollectives {
    /// NCCL, opened once.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] with the names tried.
    pub fn lib(&self) -> Result<&Arc<Nccl>> {
        self.lib
            .get_or_init(|| Nccl::load().map(Arc::new))
            .as_ref()
            .map_err(Clone::clone)
    }

    fn caps_of(lib: &Nccl) -> CclCaps {
        let dtypes = conv::DTYPES.to_vec();
        let mut ops = BTreeMap::new();
        for op in CollectiveOp::ALL {
            if op == CollectiveOp::AllToAll && lib.all_to_all.is_none() {
                continue;
            }
            ops.insert(op, dtypes.clone());
        }
        let v = lib.version();
        CclCaps {
            engine: format!(
                "NCCL {}.{}.{} ({})",
                v / 10000,
                v / 100 % 100,
                v % 100,
                lib.path
            ),
            ops,
            reductions: dtypes
                .iter()
                .map(|&d| (d, ReduceOp::ALL.to_vec()))
                .collect(),
            accumulation: dtypes
                .iter()
                .map(|&d| {
                    (
                        d,
                        Accumulation {
                            accumulate_in: d,
                            emulated: Vec::new(),
                        },
                    )
                })
                .collect(),
            groups: true,
            split: lib.comm_split.is_some(),
            survives_dead_rank: false,
            names_missing_ranks: false,
            timeout_aborts_peers: true,
        }
    }

    fn cuda_device(device: &Arc<dyn Device>) -> Result<Arc<CudaDevice>> {
        device
            .as_any()
            .downcast_ref::<CudaDevice>()
            .ok_or_else(|| {
                HalError::invalid(
                    "device",
                    Invalid::ForeignHandle {
                        expected: "CUDA device".into(),
                        found: device.id().to_string(),
                    },
                )
            })?
            .arc()
    }

    pub(crate) fn init_error(lib: &Nccl, call: &str, code: i32) -> HalError {
        match code {
            8 => HalError::Timeout {
                what: format!("{call}: not every rank joined"),
                millis: 0,
            },
            _ => conv::vendor(lib, call, code),
        }
    }
}

impl Collectives for NcclCollectives {
    fn capabilities(&self) -> &CclCaps {
        self.caps.get_or_init(|| match self.lib() {
            Ok(l) => NcclCollectives::caps_of(l),
            Err(_) => CclCaps {
                engine: "NCCL (unavailable)".into(),
                ops: BTreeMap::new(),
                reductions: BTreeMap::new(),
                accumulation: BTreeMap::new(),
                groups: false,
                split: false,
                survives_dead_rank: false,
                names_missing_ranks: false,
                timeout_aborts_peers: true,
            },
        })
    }

    fn unique_id(&self) -> Result<UniqueId> {
        let lib = self.lib()?;
        let mut id = RawId { internal: [0; 128] };
        // SAFETY: an out-pointer to a local id.
        let code = unsafe { (lib.get_unique_id)(&mut id) };
        if code != 0 {
            return Err(conv::vendor(lib, "ncclGetUniqueId", code));
        }
        Ok(UniqueId(id.internal.iter().map(|&c| c as u8).collect()))
    }

    fn init_rank(
        &self,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Result<Arc<dyn Communicator>> {
        let lib = self.lib()?.clone();
        unihal_hal::ccl::check_rank("rank", rank, nranks)?;
        if id.0.len() != 128 {
            return Err(HalError::invalid(
                "id",
                Invalid::Value {
                    value: format!("{} bytes", id.0.len()),
                    accepted: "an NCCL unique id (128 bytes)".into(),
                },
            ));
        }
        let mut raw_id = RawId { internal: [0; 128] };
        for (d, &b) in raw_id.internal.iter_mut().zip(&id.0) {
            *d = b as std::ffi::c_char;
        }
        let dev = NcclCollectives::cuda_device(device)?;
        let timeout = config
            .timeout
            .unwrap_or_else(unihal_hal::ccl::timeout_from_env);
        let (call_lib, late_lib) = (lib.clone(), lib.clone());
        let comm = bounded(
            "ncclCommInitRank",
            timeout,
            move || {
                dev.call("ncclCommInitRank", || {
                    let mut comm: ffi::Comm = std::ptr::null_mut();
                    // SAFETY: an out-pointer to a local; the id by value; the device's context
                    // is current (NCCL uses the current device).
                    let code = unsafe {
                        (call_lib.comm_init_rank)(&mut comm, nranks as i32, raw_id, rank as i32)
                    };
                    if code != 0 {
                        return Err(NcclCollectives::init_error(
                            &call_lib,
                            "ncclCommInitRank",
                            code,
                        ));
                    }
                    Ok(comm as usize)
                })
            },
            // A communicator nobody else holds.
            move |late| comm::release(&late_lib, &mut { late }, false),
        )? as ffi::Comm;
        Ok(NcclComm::new(
            lib,
            comm,
            rank,
            nranks,
            device.clone(),
            self.capabilities().clone(),
            config,
        ))
    }

    fn init_all(
        &self,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        let lib = self.lib()?.clone();
        unihal_hal::ccl::check_distinct_devices(devices)?;
        let ordinals: Vec<i32> = devices
            .iter()
            .map(|d| NcclCollectives::cuda_device(d).map(|_| d.id().ordinal as i32))
            .collect::<Result<_>>()?;
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        let first = NcclCollectives::cuda_device(devices.first().ok_or_else(|| {
            HalError::invalid(
                "devices",
                Invalid::Value {
                    value: "no device".into(),
                    accepted: "one or more devices".into(),
                },
            )
        })?)?;
        first.call("ncclCommInitAll", || {
            // SAFETY: room for one communicator per device, and the device list.
            let code = unsafe {
                (lib.comm_init_all)(comms.as_mut_ptr(), ordinals.len() as i32, ordinals.as_ptr())
            };
            if code != 0 {
                return Err(NcclCollectives::init_error(&lib, "ncclCommInitAll", code));
            }
            Ok(())
        })?;
        let n = devices.len();
        Ok(comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (c, d))| {
                NcclComm::new(
                    lib.clone(),
                    c,
                    rank,
                    n,
                    d.clone(),
                    self.capabilities().clone(),
                    config,
                ) as Arc<dyn Communicator>
            })
            .collect())
    }
}
