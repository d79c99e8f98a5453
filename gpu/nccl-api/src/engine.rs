//! The engine: [`Engine`], the HAL's `Collectives` over one library of the NCCL API, and the
//! [`Flavor`]s it comes in.

use crate::comm::NcclComm;
use crate::conv;
use crate::ffi::{self, Nccl, UniqueId as RawId};
use crate::platform::{with_current, Platform};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use unihal_dynlib::Candidates;
use unihal_hal::ccl::Accumulation;
use unihal_hal::{
    CclCaps, CollectiveOp, Collectives, CommConfig, Communicator, Device, HalError, Invalid,
    ReduceOp, Result, UniqueId,
};

/// One library of the NCCL API: its names, where to look, and its spelling of all-to-all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flavor {
    /// The library's name in messages and in `HalError::Vendor::library` ("NCCL", "RCCL").
    pub label: &'static str,
    /// The override variable (its value is the only path tried when set).
    pub env: &'static str,
    /// Names for the system loader, in order.
    pub names: &'static [&'static str],
    /// Install roots searched after the names.
    pub roots: &'static [InstallRoot],
    /// The all-to-all entry point, the flavor's own spelling first.
    pub all_to_all: [&'static str; 2],
}

impl Flavor {
    /// Where to look for the library, in order (the override alone when set).
    pub fn candidates(&self) -> Candidates {
        let mut c = Candidates::new(self.label, self.env, self.names);
        for r in self.roots {
            c = c.under_root(r.vars, r.default, r.sub, r.names);
        }
        c
    }
}

/// Library files under an install root: `$VAR/sub/name` for the first set variable of `vars`,
/// else `default/sub/name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstallRoot {
    pub vars: &'static [&'static str],
    pub default: Option<&'static str>,
    pub sub: &'static str,
    pub names: &'static [&'static str],
}

/// NVIDIA's NCCL (`libnccl.so.2`, `UNIHAL_NCCL_LIB`, `ncclAlltoAll`).
pub const NCCL: Flavor = Flavor {
    label: "NCCL",
    env: "UNIHAL_NCCL_LIB",
    names: &["libnccl.so.2", "libnccl.so"],
    roots: &[],
    all_to_all: ["ncclAlltoAll", "ncclAllToAll"],
};

/// AMD's RCCL (`librccl.so.1`, `UNIHAL_RCCL_LIB`, `ncclAllToAll`), also under `ROCM_PATH`
/// (default `/opt/rocm`) and Hygon DTK's root (`DTKROOT`, default `/opt/dtk`: `lib/librccl.so.1`,
/// older DTKs `rccl/lib/librccl.so`).
pub const RCCL: Flavor = Flavor {
    label: "RCCL",
    env: "UNIHAL_RCCL_LIB",
    names: &["librccl.so.1", "librccl.so"],
    roots: &[
        InstallRoot {
            vars: &["ROCM_PATH"],
            default: Some("/opt/rocm"),
            sub: "lib",
            names: &["librccl.so.1", "librccl.so"],
        },
        InstallRoot {
            vars: &["DTKROOT"],
            default: Some("/opt/dtk"),
            sub: "lib",
            names: &["librccl.so.1"],
        },
        InstallRoot {
            vars: &["DTKROOT"],
            default: Some("/opt/dtk"),
            sub: "rccl/lib",
            names: &["librccl.so"],
        },
    ],
    all_to_all: ["ncclAllToAll", "ncclAlltoAll"],
};

/// Runs `call`, a blocking library call that waits for every rank (`ncclCommInitRank`,
/// `HcclCommInitRootInfo`), on a helper thread and waits for it up to `timeout`. Past it the
/// caller gets `Timeout` naming `what`; when the call completes later, its result goes to `late`
/// on the helper thread (which destroys a communicator nobody will use). Neither NCCL nor HCCL gives a way to cancel such a call; the helper thread stays
/// blocked until it returns.
///
/// # Errors
/// `call`'s error; [`HalError::Timeout`]; [`HalError::Internal`] when the thread cannot start.
pub fn bounded<T: Send + 'static>(
    what: &str,
    timeout: std::time::Duration,
    call: impl FnOnce() -> Result<T> + Send + 'static,
    late: impl FnOnce(T) + Send + 'static,
) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("unihal-ccl {what}"))
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

/// A collective engine over one library of the NCCL API ([`NCCL`] or [`RCCL`]) on a backend's
/// [`Platform`]. The library is opened on first use; its outcome is kept.
///
/// Thread safety: any thread. Communicators it makes follow the library's rule: operations of
/// one communicator must be issued in the same order on every rank.
pub struct Engine {
    flavor: Flavor,
    platform: Arc<dyn Platform>,
    lib: OnceLock<Result<Arc<Nccl>>>,
    caps: OnceLock<CclCaps>,
}

impl Engine {
    /// The engine of `flavor` on `platform` (nothing is opened yet).
    pub fn new(flavor: Flavor, platform: Arc<dyn Platform>) -> Engine {
        Engine {
            flavor,
            platform,
            lib: OnceLock::new(),
            caps: OnceLock::new(),
        }
    }

    /// The flavor.
    pub fn flavor(&self) -> &Flavor {
        &self.flavor
    }

    /// The library, opened once.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] with the names tried.
    pub fn lib(&self) -> Result<&Arc<Nccl>> {
        self.lib
            .get_or_init(|| Nccl::load(&self.flavor).map(Arc::new))
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
        CclCaps {
            engine: format!("{} {} ({})", lib.label, lib.version_string(), lib.path),
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
            crosses_processes: true,
        }
    }

    pub fn init_error(lib: &Nccl, call: &str, code: i32) -> HalError {
        match code {
            8 => HalError::Timeout {
                what: format!("{call}: not every rank joined"),
                millis: 0,
            },
            _ => conv::vendor(lib, call, code),
        }
    }
}

impl Collectives for Engine {
    fn capabilities(&self) -> &CclCaps {
        self.caps.get_or_init(|| match self.lib() {
            Ok(l) => Engine::caps_of(l),
            Err(_) => CclCaps::unavailable(format!("{} (unavailable)", self.flavor.label)),
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
                    accepted: format!("a {} unique id (128 bytes)", self.flavor.label),
                },
            ));
        }
        let mut raw_id = RawId { internal: [0; 128] };
        for (d, &b) in raw_id.internal.iter_mut().zip(&id.0) {
            *d = b as std::ffi::c_char;
        }
        self.platform.device_ordinal(device)?;
        let timeout = config
            .timeout
            .unwrap_or_else(unihal_hal::ccl::timeout_from_env);
        let (call_lib, late_lib) = (lib.clone(), lib.clone());
        let (platform, dev) = (self.platform.clone(), device.clone());
        let comm = bounded(
            "ncclCommInitRank",
            timeout,
            move || {
                with_current(&*platform, &dev, "ncclCommInitRank", || {
                    let mut comm: ffi::Comm = std::ptr::null_mut();
                    // SAFETY: an out-pointer to a local; the id by value; the device is current
                    // (the library uses the current device).
                    let code = unsafe {
                        (call_lib.comm_init_rank)(&mut comm, nranks as i32, raw_id, rank as i32)
                    };
                    if code != 0 {
                        return Err(Engine::init_error(&call_lib, "ncclCommInitRank", code));
                    }
                    Ok(comm as usize)
                })
            },
            // A communicator nobody else holds.
            move |late| crate::comm::release(&late_lib, &mut { late }, false),
        )? as ffi::Comm;
        Ok(NcclComm::new(
            (lib, self.platform.clone()),
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
            .map(|d| self.platform.device_ordinal(d))
            .collect::<Result<_>>()?;
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        let first = devices.first().ok_or_else(|| {
            HalError::invalid(
                "devices",
                Invalid::Value {
                    value: "no device".into(),
                    accepted: "one or more devices".into(),
                },
            )
        })?;
        with_current(&*self.platform, first, "ncclCommInitAll", || {
            // SAFETY: room for one communicator per device, and the device list.
            let code = unsafe {
                (lib.comm_init_all)(comms.as_mut_ptr(), ordinals.len() as i32, ordinals.as_ptr())
            };
            if code != 0 {
                return Err(Engine::init_error(&lib, "ncclCommInitAll", code));
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
                    (lib.clone(), self.platform.clone()),
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
