//! The libraries of the NCCL C API: NVIDIA's NCCL on CUDA, AMD's RCCL on ROCm and Hygon DTK,
//! as one [`CollectiveLib`] ([`Nccl`]) in two [`Flavor`]s.
//!
//! NCCL and RCCL export the same C API (RCCL keeps the `nccl` prefix), with two differences a
//! flavor holds: the library's names and override variable, and the all-to-all entry
//! (`ncclAlltoAll` in NCCL >= 2.28.3, `ncclAllToAll` in RCCL); and the error label ("NCCL",
//! "RCCL") of [`unihal_hal::HalError::Vendor`]s.
//!
//! * [`ffi`]: the symbol table, opened through `unihal-dynlib` and never unloaded (NCCL's
//!   threads and memory may outlive every handle of ours).
//! * [`conv`]: dtypes, reductions and result codes (NCCL 2.30 added `ncclTimeout = 8`; RCCL and
//!   older NCCL stop at `ncclInProgress = 7`).
//! * Here: the description (128-byte unique ids; abort; a split of its own from NCCL 2.18, the
//!   engine's emulated one before; broadcast out of place; average native) and the raw calls.

pub mod conv;
pub mod ffi;

use crate::engine::Engine;
use crate::library::{c_arg, Call, CollectiveLib, P2p, RawComm, Round};
use crate::platform::Platform;
use conv::{IN_PROGRESS, REMOTE_ERROR};
use ffi::{Comm, Nccl, UniqueId as RawId};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;
use unihal_dynlib::Candidates;
use unihal_hal::ccl::Accumulation;
use unihal_hal::{CclCaps, CollectiveOp, HalError, ReduceOp, Result};

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

impl Engine<Nccl> {
    /// The engine of `flavor` on `platform` (nothing is opened yet).
    pub fn new(flavor: Flavor, platform: Arc<dyn Platform>) -> Engine<Nccl> {
        Engine::with_library(flavor.label, move || Nccl::load(&flavor), platform)
    }
}

/// The error of a failed blocking init or split: `ncclTimeout` (NCCL 2.30) as `Timeout`.
fn init_error(lib: &Nccl, call: &str, code: i32) -> HalError {
    match code {
        8 => HalError::Timeout {
            what: format!("{call}: not every rank joined"),
            millis: 0,
        },
        _ => conv::vendor(lib, call, code),
    }
}

/// A result of the NCCL API as ours (`ncclInProgress` is success: the call was enqueued).
fn check(lib: &Nccl, call: &str, code: i32) -> Result<()> {
    match code {
        0 | IN_PROGRESS => Ok(()),
        _ => Err(conv::vendor(lib, call, code)),
    }
}

impl Nccl {
    /// The `ncclDataType_t` of `d`.
    fn dt(&self, d: unihal_hal::DType) -> Result<i32> {
        conv::dtype(d)
            .ok_or_else(|| HalError::unsupported(format!("{d}: {} has no such type", self.label)))
    }
}

impl CollectiveLib for Nccl {
    fn label(&self) -> &'static str {
        self.label
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn version(&self) -> Option<String> {
        Some(self.version_string())
    }

    fn caps(&self) -> CclCaps {
        let dtypes = conv::DTYPES.to_vec();
        let mut ops = BTreeMap::new();
        for op in CollectiveOp::ALL {
            if op == CollectiveOp::AllToAll && self.all_to_all.is_none() {
                continue;
            }
            ops.insert(op, dtypes.clone());
        }
        CclCaps {
            engine: format!("{} {} ({})", self.label, self.version_string(), self.path),
            ops,
            reductions: dtypes
                .iter()
                .map(|&d| (d, ReduceOp::ALL.to_vec()))
                .collect(),
            accumulation: dtypes
                .iter()
                .map(|&d| {
                    let acc = Accumulation {
                        accumulate_in: d,
                        emulated: Vec::new(),
                    };
                    (d, acc)
                })
                .collect(),
            groups: true,
            // Emulated by the engine where the library lacks `ncclCommSplit`.
            split: true,
            survives_dead_rank: false,
            names_missing_ranks: false,
            timeout_aborts_peers: true,
            crosses_processes: true,
        }
    }

    fn id_kind(&self) -> (&'static str, usize) {
        ("ncclUniqueId", 128)
    }

    fn blocking_calls(&self) -> (&'static str, &'static str) {
        ("ncclCommInitRank", "ncclCommSplit")
    }

    fn unique_id(&self) -> Result<Vec<u8>> {
        let mut id = RawId { internal: [0; 128] };
        // SAFETY: an out-pointer to a local id.
        let code = unsafe { (self.get_unique_id)(&mut id) };
        if code != 0 {
            return Err(conv::vendor(self, "ncclGetUniqueId", code));
        }
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }

    fn init_rank(&self, id: &[u8], nranks: usize, rank: usize) -> Result<RawComm> {
        let n = c_arg("nranks", nranks as u64)?;
        let mut raw_id = RawId { internal: [0; 128] };
        for (d, &b) in raw_id.internal.iter_mut().zip(id) {
            *d = b as std::ffi::c_char;
        }
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the id by value; the device is current (the trait's
        // contract: the library uses the current device).
        let code = unsafe { (self.comm_init_rank)(&mut comm, n, raw_id, rank as i32) };
        if code != 0 {
            return Err(init_error(self, "ncclCommInitRank", code));
        }
        Ok(comm as RawComm)
    }

    fn init_all(&self, ordinals: &[i32]) -> Option<Result<Vec<RawComm>>> {
        let mut comms = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: room for one communicator per device, and the device list.
        let code = unsafe {
            (self.comm_init_all)(comms.as_mut_ptr(), ordinals.len() as i32, ordinals.as_ptr())
        };
        Some(if code != 0 {
            Err(init_error(self, "ncclCommInitAll", code))
        } else {
            Ok(comms.into_iter().map(|c| c as RawComm).collect())
        })
    }

    fn can_abort(&self) -> bool {
        true
    }

    fn has_split(&self) -> bool {
        self.comm_split.is_some()
    }

    fn broadcast_in_place_only(&self) -> bool {
        false
    }

    fn native_avg(&self) -> bool {
        true
    }

    unsafe fn release(&self, comm: RawComm, abort: bool) {
        let (call, f) = if abort {
            ("ncclCommAbort", self.comm_abort)
        } else {
            ("ncclCommDestroy", self.comm_destroy)
        };
        // SAFETY: the caller's contract: a live communicator nothing else uses now or after.
        let code = unsafe { f(comm as Comm) };
        if code != 0 {
            tracing::warn!(target: "unihal::coll", "{}", conv::vendor(self, call, code));
        }
    }

    unsafe fn async_error(&self, comm: RawComm) -> Result<Option<HalError>> {
        let mut err = 0;
        // SAFETY: the caller's contract (a live communicator used by this thread alone), and an
        // out-pointer to a local.
        let code = unsafe { (self.comm_get_async_error)(comm as Comm, &mut err) };
        if code != 0 {
            return Err(conv::vendor(self, "ncclCommGetAsyncError", code));
        }
        Ok(match err {
            0 | IN_PROGRESS => None,
            REMOTE_ERROR => {
                // SAFETY: ncclGetLastError returns a thread-local string valid until this
                // thread's next call.
                let last = self.get_last_error.map_or_else(String::new, |f| unsafe {
                    unihal_dynlib::c_str(f(comm as Comm))
                });
                Some(HalError::Aborted {
                    what: if last.is_empty() {
                        format!(
                            "a peer rank aborted the {} communicator or its process was lost",
                            self.label
                        )
                    } else {
                        format!("{} remote error: {last}", self.label)
                    },
                })
            }
            _ => Some(conv::vendor(self, "ncclCommGetAsyncError", err)),
        })
    }

    unsafe fn collective(
        &self,
        comm: RawComm,
        round: &Round,
        send: u64,
        recv: u64,
        stream: *mut c_void,
    ) -> Result<()> {
        let (c, st, n) = (comm as Comm, stream, round.count as usize);
        let (s, r) = (send as *const c_void, recv as *mut c_void);
        let dt = self.dt(round.dtype)?;
        let red = |op| conv::reduce_op(op);
        // SAFETY: in every arm, the caller's contract: a live communicator used by this thread
        // alone, and `send`/`recv` ranges of the call's extents in live buffers kept until the
        // work ran, on the current device's native stream `st`.
        let (call, code) = unsafe {
            match round.call {
                Call::AllReduce(op) => (
                    "ncclAllReduce",
                    (self.all_reduce)(s, r, n, dt, red(op), c, st),
                ),
                Call::Broadcast { root } => (
                    "ncclBroadcast",
                    (self.broadcast)(s, r, n, dt, root as i32, c, st),
                ),
                Call::Reduce { red: op, root } => (
                    "ncclReduce",
                    (self.reduce)(s, r, n, dt, red(op), root as i32, c, st),
                ),
                Call::AllGather => ("ncclAllGather", (self.all_gather)(s, r, n, dt, c, st)),
                Call::ReduceScatter(op) => (
                    "ncclReduceScatter",
                    (self.reduce_scatter)(s, r, n, dt, red(op), c, st),
                ),
                Call::AllToAll => {
                    let (f, name) = self.all_to_all.zip(self.all_to_all_name).ok_or_else(|| {
                        HalError::unsupported(format!(
                            "all-to-all: this {} has no ncclAlltoAll/ncclAllToAll",
                            self.label
                        ))
                    })?;
                    (name, f(s, r, n, dt, c, st))
                }
            }
        };
        check(self, call, code)
    }

    unsafe fn p2p(&self, comm: RawComm, calls: &[(P2p, u64)], stream: *mut c_void) -> Result<()> {
        let items: Vec<(P2p, u64, i32)> = calls
            .iter()
            .map(|&(p, a)| Ok((p, a, self.dt(p.dtype)?)))
            .collect::<Result<_>>()?;
        // SAFETY: the caller's contract (a live communicator used by this thread alone; each
        // range in a live buffer kept until the work ran); the group is closed on every path.
        unsafe {
            let code = (self.group_start)();
            if code != 0 {
                return Err(conv::vendor(self, "ncclGroupStart", code));
            }
            let mut first = None;
            for &(p, a, dt) in &items {
                let (name, f) = if p.recv {
                    ("ncclRecv", self.recv)
                } else {
                    ("ncclSend", self.send)
                };
                let code = f(
                    a as _,
                    p.count as usize,
                    dt,
                    p.peer as i32,
                    comm as Comm,
                    stream,
                );
                if code != 0 && code != IN_PROGRESS && first.is_none() {
                    first = Some((name, code));
                }
            }
            let end = (self.group_end)();
            match first {
                Some((name, code)) => check(self, name, code),
                None => check(self, "ncclGroupEnd", end),
            }
        }
    }

    unsafe fn split(&self, comm: RawComm, color: Option<u32>, key: i32) -> Result<RawComm> {
        let split = self.comm_split.ok_or_else(|| {
            HalError::unsupported(format!("split: {} lacks ncclCommSplit", self.path))
        })?;
        let color = match color {
            None => ffi::SPLIT_NOCOLOR,
            Some(c) => c_arg("color", c.into())?,
        };
        let mut child: Comm = std::ptr::null_mut();
        // SAFETY: the caller's contract (a live communicator used by this thread alone, the
        // device current), an out-pointer to a local and no configuration (the child inherits
        // the parent's).
        let code = unsafe { split(comm as Comm, color, key, &mut child, std::ptr::null_mut()) };
        if code != 0 {
            return Err(init_error(self, "ncclCommSplit", code));
        }
        Ok(child as RawComm)
    }

    unsafe fn rank_size(&self, comm: RawComm) -> Result<(usize, usize)> {
        let (mut rank, mut size) = (0, 0);
        // SAFETY: the caller's contract (a live communicator used by this thread alone) and
        // out-pointers to locals.
        let codes = unsafe {
            [
                (
                    "ncclCommUserRank",
                    (self.comm_user_rank)(comm as Comm, &mut rank),
                ),
                ("ncclCommCount", (self.comm_count)(comm as Comm, &mut size)),
            ]
        };
        if let Some(&(call, code)) = codes.iter().find(|c| c.1 != 0) {
            return Err(conv::vendor(self, call, code));
        }
        Ok((rank as usize, size as usize))
    }
}
