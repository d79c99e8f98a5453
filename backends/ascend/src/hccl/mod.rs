//! Collectives through HCCL: [`Engine`], the backend's `Collectives`, and a [`HcclComm`] per
//! rank.
//!
//! * **Loading** ([`ffi`]): `libhccl.so` next to the ACL runtime first (`UNIHAL_HCCL_LIB`
//!   alone when set; see [`crate::loader`]), opened on first use and never unloaded.
//! * **Values** ([`conv`]): `HcclDataType` (every HAL dtype but `bool` moves; int8, int16,
//!   int32, fp16, fp32 and bf16 reduce, the facts sheet's list for every chip), `HcclReduceOp`
//!   (sum, prod, max, min) and `HcclResult` as `HalError::Vendor { library: "HCCL", .. }`.
//! * **Average**: HCCL has none. unihal runs `SUM`, then divides the result by the number of
//!   ranks on the same stream (`div_scalar` through the device's aclnn path): reported as an
//!   emulated reduction in `CclCaps::accumulation`, for the float dtypes whose division the
//!   SoC's op table lists.
//! * **Communicators** ([`comm`]): the unique id is HCCL's 4108-byte root info;
//!   `HcclCommInitRootInfo` runs with the device current on a helper thread, bounded by the
//!   communicator's timeout (`unihal_nccl_api::engine::bounded`: it cannot be cancelled; a call
//!   that completes later has its communicator destroyed); `init_all` is one such call per device
//!   from threads with one root info. Operations enqueue on the caller's stream through the
//!   shared GPU layer's platform (`unihal_gpu::platform::GpuPlatform`), which keeps the buffers
//!   until the work ran. Broadcast is in place in HCCL: an out-of-place broadcast first copies
//!   the root's send buffer into its receive buffer on the stream. Grouped sends and receives
//!   are one `HcclBatchSendRecv` (groups are claimed only when the library has it); send and
//!   receive alone are `HcclSend`/`HcclRecv`; a count of 0 moves nothing and issues nothing on
//!   either side.
//! * **Split** ([`split`]): HCCL has none; unihal emulates it (`CclCaps::split` true). The
//!   ranks all-gather their `(color, key)` on the parent and place themselves with
//!   `unihal_hal::ccl::split_place`, as every engine does; each color's leader (its new rank 0)
//!   makes a root info, a second all-gather on the parent hands the leaders' root infos to every
//!   rank, and each member makes its communicator with `HcclCommInitRootInfo`, bounded as
//!   `init_rank`'s. Both exchanges are operations of the parent (watched, in its order); a rank
//!   that cannot finish them fails the parent, as a timeout would.
//! * **Never hang, without an abort**: each operation has a completion event and a deadline; a
//!   watchdog polls them and `HcclGetCommAsyncError`. HCCL has no abort, so a timeout, an
//!   asynchronous error or [`unihal_hal::Communicator::abort`] stops issuing (later calls return
//!   the sticky error: `Aborted` after an abort), fails the streams with pending work, and
//!   destroys the communicator once the completion events say those operations drained, or
//!   leaks it (logged) when they do not. Operations already posted cannot be cancelled: where
//!   every rank lives in this process, the failing communicator's ranks post stand-ins for what
//!   their peers wait for, so those operations end at once ([`group`]); a peer in another
//!   process ends its wait at HCCL's own execution timeout (`HCCL_EXEC_TIMEOUT`), and a stream
//!   synchronisation already waiting on it waits with it. The capabilities' engine string says
//!   so.
//! * **Open points**: HCCL's accumulation type is not documented (reported as the element
//!   type); `unique_id` calls `HcclGetRootInfo` without a current device (torch_npu sets one
//!   first; a split's leaders have theirs current); `HcclAlltoAllV` is resolved but
//!   all-to-all-v is one `HcclBatchSendRecv`; a split costs two collectives on the parent and
//!   a full `HcclCommInitRootInfo` per child (real HCCL's init is the slow part, as for any new
//!   communicator).

pub mod comm;
pub mod conv;
pub mod ffi;
pub mod group;
pub mod split;

pub use comm::HcclComm;

use crate::loader::Cann;
use comm::Parts;
use ffi::{Comm as RawComm, Hccl, RootInfo};
use group::Group;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use unihal_gpu::platform::GpuPlatform;
use unihal_hal::ccl::{check_distinct_devices, check_rank, timeout_from_env, Accumulation};
use unihal_hal::{
    CclCaps, CollectiveOp, Collectives, CommConfig, Communicator, DType, Device, HalError, Invalid,
    LibraryInfo, OpId, ReduceOp, Result, UniqueId,
};
use unihal_nccl_api::engine::bounded;
use unihal_nccl_api::platform::with_current;
use unihal_nccl_api::Platform;

/// The HCCL engine: the library opened on first use (its outcome kept), the capabilities, and
/// the platform of the shared GPU layer on Ascend devices and streams. Thread-safe.
pub struct Engine {
    platform: Arc<dyn Platform>,
    lib: OnceLock<Result<Arc<Hccl>>>,
    caps: OnceLock<CclCaps>,
}

impl Default for Engine {
    fn default() -> Engine {
        Engine {
            platform: Arc::new(GpuPlatform::<Cann>::default()),
            lib: OnceLock::new(),
            caps: OnceLock::new(),
        }
    }
}

/// What the engine string says of the missing abort.
const NO_ABORT: &str = "no abort: a timeout, an asynchronous error or abort stops issuing and \
     fails the streams with pending work; in-process ranks' posted operations end through \
     stand-ins, other processes' at HCCL's execution timeout";

impl Engine {
    /// HCCL, opened once.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] with every path tried.
    pub fn lib(&self) -> Result<&Arc<Hccl>> {
        self.lib
            .get_or_init(|| Hccl::load().map(Arc::new))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The float dtypes whose average the engine emulates: those the SoC's op table divides.
    fn averaged() -> Vec<DType> {
        let Ok(cann) = crate::loader::cann() else {
            return Vec::new();
        };
        let table = crate::ops::soc::table(crate::ops::soc::classify(&cann.soc));
        let div = table.get(&OpId::DivScalar).cloned().unwrap_or_default();
        conv::REDUCED
            .into_iter()
            .filter(|d| d.is_float() && div.contains(d))
            .collect()
    }

    fn caps_of(lib: &Hccl) -> CclCaps {
        let averaged = Engine::averaged();
        let mut ops = BTreeMap::new();
        for op in CollectiveOp::ALL {
            let dtypes = match op {
                CollectiveOp::AllToAll if lib.all_to_all.is_none() => continue,
                _ if op.reduces() => conv::REDUCED.to_vec(),
                _ => conv::MOVED.to_vec(),
            };
            ops.insert(op, dtypes);
        }
        let reductions = conv::REDUCED
            .iter()
            .map(|&d| {
                let reds = ReduceOp::ALL
                    .into_iter()
                    .filter(|&r| r != ReduceOp::Avg || averaged.contains(&d))
                    .collect();
                (d, reds)
            })
            .collect();
        let accumulation = conv::REDUCED
            .iter()
            .map(|&d| {
                let emulated = if averaged.contains(&d) {
                    vec![ReduceOp::Avg]
                } else {
                    Vec::new()
                };
                (
                    d,
                    Accumulation {
                        accumulate_in: d,
                        emulated,
                    },
                )
            })
            .collect();
        CclCaps {
            engine: format!("HCCL ({}) ({NO_ABORT})", lib.path),
            ops,
            reductions,
            accumulation,
            groups: lib.batch_send_recv.is_some(),
            split: true,
            survives_dead_rank: false,
            names_missing_ranks: false,
            timeout_aborts_peers: true,
            crosses_processes: true,
        }
    }

    /// The error of a failed `HcclCommInitRootInfo`: HCCL's own timeout (whose message names
    /// the ranks that never came) as `Timeout`.
    fn init_error(lib: &Hccl, code: i32) -> HalError {
        let e = conv::vendor(lib, "HcclCommInitRootInfo", code);
        match (code, e) {
            (conv::E_TIMEOUT, HalError::Vendor { message, .. }) => HalError::Timeout {
                what: format!("HcclCommInitRootInfo: not every rank joined: {message}"),
                millis: 0,
            },
            (_, e) => e,
        }
    }

    fn comm(
        &self,
        lib: &Arc<Hccl>,
        raw: usize,
        (rank, size): (usize, usize),
        device: &Arc<dyn Device>,
        group: &Arc<Group>,
        config: &CommConfig,
    ) -> Arc<dyn Communicator> {
        HcclComm::new(
            Parts {
                lib: lib.clone(),
                platform: self.platform.clone(),
                raw: raw as RawComm,
                rank,
                size,
                device: device.clone(),
                caps: self.capabilities().clone(),
                group: group.clone(),
            },
            config,
        )
    }
}

/// A new root info (`HcclGetRootInfo`, on the calling thread).
pub(crate) fn root_info(lib: &Hccl) -> Result<Box<RootInfo>> {
    let mut root = RootInfo::zeroed();
    // SAFETY: an out-pointer to a 4108-byte root info.
    let code = unsafe { (lib.get_root_info)(&mut *root) };
    if code != conv::SUCCESS {
        return Err(conv::vendor(lib, "HcclGetRootInfo", code));
    }
    Ok(root)
}

/// `HcclCommInitRootInfo` for rank `rank` of `nranks` on `device`, on a helper thread with
/// the device current, bounded by `timeout`; the rank and size checked.
pub(crate) fn init_comm(
    platform: &Arc<dyn Platform>,
    lib: &Arc<Hccl>,
    root: &Arc<RootInfo>,
    (nranks, rank): (u32, u32),
    device: &Arc<dyn Device>,
    timeout: Duration,
) -> Result<usize> {
    let (call_lib, late_lib) = (lib.clone(), lib.clone());
    let (platform, dev, root) = (platform.clone(), device.clone(), root.clone());
    bounded(
        "HcclCommInitRootInfo",
        timeout,
        move || {
            with_current(&*platform, &dev, "HcclCommInitRootInfo", || {
                let mut comm: RawComm = std::ptr::null_mut();
                // SAFETY: a 4108-byte root info and an out-pointer to a local; the device
                // is current (HCCL uses the current device).
                let code =
                    unsafe { (call_lib.comm_init_root_info)(nranks, &*root, rank, &mut comm) };
                if code != conv::SUCCESS {
                    return Err(Engine::init_error(&call_lib, code));
                }
                let (mut size, mut id) = (0u32, 0u32);
                // SAFETY: a live communicator just made and out-pointers to locals.
                let codes = unsafe {
                    [
                        (call_lib.get_rank_size)(comm, &mut size),
                        (call_lib.get_rank_id)(comm, &mut id),
                    ]
                };
                let checked = match codes {
                    [conv::SUCCESS, conv::SUCCESS] if (size, id) == (nranks, rank) => Ok(()),
                    [conv::SUCCESS, conv::SUCCESS] => Err(HalError::Internal(format!(
                        "HcclCommInitRootInfo made rank {id} of {size}, asked for rank \
                         {rank} of {nranks}"
                    ))),
                    [conv::SUCCESS, c] => Err(conv::vendor(&call_lib, "HcclGetRankId", c)),
                    [c, _] => Err(conv::vendor(&call_lib, "HcclGetRankSize", c)),
                };
                if let Err(e) = checked {
                    comm::destroy(&call_lib, comm as usize);
                    return Err(e);
                }
                Ok(comm as usize)
            })
        },
        // A communicator nobody else holds.
        move |late| comm::destroy(&late_lib, late),
    )
}

/// `nranks` as HCCL's `uint32_t`.
fn ranks_u32(nranks: usize) -> Result<u32> {
    u32::try_from(nranks).map_err(|_| {
        HalError::invalid(
            "nranks",
            Invalid::Value {
                value: nranks.to_string(),
                accepted: format!("1..={}", u32::MAX),
            },
        )
    })
}

/// HCCL's report line, and the engine as the backend's collectives when HCCL opened (else
/// `None`, logged).
impl unihal_gpu::backend::CollectiveEngine for Engine {
    fn info(&self) -> LibraryInfo {
        match self.lib() {
            Ok(l) => LibraryInfo::found("collectives", "HCCL", l.path.clone(), None),
            Err(e) => LibraryInfo::missing("collectives", "HCCL", e.to_string()),
        }
    }

    fn available(&self) -> Option<&dyn Collectives> {
        match self.lib() {
            Ok(_) => Some(self),
            Err(e) => {
                tracing::info!(target: "unihal::ascend", "no collectives: {e}");
                None
            }
        }
    }
}

impl Collectives for Engine {
    fn capabilities(&self) -> &CclCaps {
        self.caps.get_or_init(|| match self.lib() {
            Ok(l) => Engine::caps_of(l),
            Err(_) => CclCaps::unavailable("HCCL (unavailable)".into()),
        })
    }

    fn unique_id(&self) -> Result<UniqueId> {
        Ok(UniqueId(root_info(self.lib()?)?.bytes()))
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
        check_rank("rank", rank, nranks)?;
        let n = ranks_u32(nranks)?;
        let root = RootInfo::from_bytes(&id.0).ok_or_else(|| {
            HalError::invalid(
                "id",
                Invalid::Value {
                    value: format!("{} bytes", id.0.len()),
                    accepted: format!("an HCCL root info ({} bytes)", ffi::ROOT_INFO_BYTES),
                },
            )
        })?;
        self.platform.device_ordinal(device)?;
        let timeout = config.timeout.unwrap_or_else(timeout_from_env);
        let group = Group::of(&id.0, nranks);
        group.arrive(rank);
        let root = Arc::from(root);
        let raw = init_comm(
            &self.platform,
            &lib,
            &root,
            (n, rank as u32),
            device,
            timeout,
        )?;
        Ok(self.comm(&lib, raw, (rank, nranks), device, &group, config))
    }

    fn init_all(
        &self,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<Arc<dyn Communicator>>> {
        let lib = self.lib()?.clone();
        check_distinct_devices(devices)?;
        for d in devices {
            self.platform.device_ordinal(d)?;
        }
        if devices.is_empty() {
            return Err(HalError::invalid(
                "devices",
                Invalid::Value {
                    value: "no device".into(),
                    accepted: "one or more devices".into(),
                },
            ));
        }
        let n = devices.len();
        let nranks = ranks_u32(n)?;
        let id = self.unique_id()?;
        let root: Arc<RootInfo> = Arc::from(RootInfo::from_bytes(&id.0).ok_or_else(|| {
            HalError::Internal("HcclGetRootInfo gave a root info of another size".into())
        })?);
        let group = Group::of(&id.0, n);
        for r in 0..n {
            group.arrive(r);
        }
        let timeout = config.timeout.unwrap_or_else(timeout_from_env);
        let made: Vec<Result<usize>> = std::thread::scope(|sc| {
            let hs: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(r, d)| {
                    let (lib, root) = (&lib, &root);
                    let platform = &self.platform;
                    sc.spawn(move || init_comm(platform, lib, root, (nranks, r as u32), d, timeout))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(HalError::Internal("an init_all thread panicked".into()))
                    })
                })
                .collect()
        });
        if let Some(e) = HalError::root_cause(made.iter().filter_map(|r| r.as_ref().err())).cloned()
        {
            for raw in made.into_iter().flatten() {
                comm::destroy(&lib, raw);
            }
            return Err(e);
        }
        Ok(made
            .into_iter()
            .flatten()
            .zip(devices)
            .enumerate()
            .map(|(r, (raw, d))| self.comm(&lib, raw, (r, n), d, &group, config))
            .collect())
    }
}
