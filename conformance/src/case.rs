//! What a conformance case is: a stable id, its needs, and a body that never names a backend.

use std::sync::{Arc, OnceLock};
use std::time::Duration;
use unihal_hal::{
    Backend, Buffer, Device, Function, HalError, Invalid, Module, ModuleFormat,
    Result as HalResult, Stream,
};

/// Why a case failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub message: String,
}

impl Failure {
    /// A failure with a message.
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
        }
    }
}

impl From<HalError> for Failure {
    fn from(e: HalError) -> Failure {
        match e {
            HalError::Unsupported { what } => Failure::new(format!(
                "the backend returned Unsupported ({what}) for something its capabilities claim"
            )),
            e => Failure::new(format!("unexpected error: {e} [{e:?}]")),
        }
    }
}

/// What a case body returns.
pub type CaseResult = Result<(), Failure>;

/// Fails the case with a formatted message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        let ok: bool = $cond;
        if !ok {
            return Err($crate::Failure::new(format!($($fmt)+)));
        }
    };
}

/// Fails the case unless the two values are equal, printing both.
#[macro_export]
macro_rules! ensure_eq {
    ($a:expr, $b:expr, $($fmt:tt)+) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err($crate::Failure::new(format!(
                "{}: left {:?} != right {:?}", format!($($fmt)+), a, b
            )));
        }
    }};
}

/// A capability a case needs; missing needs skip the case with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Events measure elapsed time.
    EventTiming,
    /// 16- and 32-bit fills.
    WideFill,
    /// `Stream::host_callback`.
    HostCallbacks,
    /// `Stream::alloc_async`/`free_async`.
    StreamOrderedAlloc,
    /// At least one peer device with direct copies.
    PeerDevice,
    /// At least this many devices in the backend.
    Devices(usize),
    /// A communicator of this many ranks: devices of this process, or processes of an SPMD run.
    Ranks(usize),
    /// The collective engine runs grouped calls (and so `all_to_allv`).
    CclGroups,
    /// The collective engine splits communicators.
    CclSplit,
    /// The case makes communicators among this process's devices itself (`init_rank` from
    /// threads, `init_all`): not in an SPMD run, where each process holds one rank.
    InProcess,
    /// In an SPMD run, a world of exactly this many processes (a case that makes its
    /// communicator with `init_rank` in every process: engines whose processes are connected
    /// already, MPI, make the whole world). Always met in one process.
    WholeWorld(usize),
    /// The conformance test kernels exist in a module format the device loads.
    TestKernels,
    /// A [`crate::blocker::Blocker`] can hold a stream: the backend has the test kernels for the
    /// device (the spinning kernel) or the device has host callbacks (a blocking callback).
    StreamHold,
    /// Device work runs while the host and the device's other streams go on (a
    /// [`crate::blocker::Blocker`] holds a stream with a spinning kernel or a blocking host
    /// callback): `BackendInfo::concurrent` (hardware, the CPU backend, a simulated runtime in its
    /// concurrent mode).
    ConcurrentKernels,
    /// `Stream::run_op` runs this op in this dtype.
    Op(unihal_hal::OpId, unihal_hal::DType),
    /// The backend's collective engine runs this operation in this dtype.
    Collective(unihal_hal::CollectiveOp, unihal_hal::DType),
    /// DLPack has a device type for the backend's device memory (a plugin backend unknown to
    /// DLPack has none).
    DlpackDevice,
    /// Stream capture, and capturing this kind of operation (`OptionalCaps::graphs`).
    Capture(CaptureKind),
}

/// What a graph case captures (a field of [`unihal_hal::GraphCaps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureKind {
    /// Capture at all (the rules about captures themselves).
    Any,
    Copies,
    Fills,
    Kernels,
    Ops,
    Collectives,
    HostCallbacks,
    StreamAlloc,
}

impl CaptureKind {
    /// Whether `g` captures this kind.
    pub fn supported(self, g: &unihal_hal::GraphCaps) -> bool {
        g.available()
            && match self {
                CaptureKind::Any => true,
                CaptureKind::Copies => g.copies,
                CaptureKind::Fills => g.fills,
                CaptureKind::Kernels => g.kernels,
                CaptureKind::Ops => g.ops,
                CaptureKind::Collectives => g.collectives,
                CaptureKind::HostCallbacks => g.host_callbacks,
                CaptureKind::StreamAlloc => g.stream_alloc,
            }
    }
}

impl Need {
    /// `Err(reason)` when `ctx`'s device (or its backend) lacks this need.
    pub fn check(
        &self,
        backend: &dyn unihal_hal::Backend,
        device: &dyn Device,
        device_count: usize,
        ranks: usize,
        spmd: bool,
    ) -> Result<(), String> {
        let ccl = backend.collectives().map(|c| c.capabilities());
        let caps = device.capabilities();
        let ok = match self {
            Need::EventTiming => caps.optional.event_timing,
            Need::WideFill => caps.optional.wide_fill,
            Need::HostCallbacks => caps.optional.host_callbacks,
            Need::StreamOrderedAlloc => caps.optional.stream_ordered_alloc,
            Need::PeerDevice => !caps.optional.peer_devices.is_empty(),
            Need::Devices(n) => device_count >= *n,
            Need::Ranks(n) => ranks >= *n,
            Need::CclGroups => ccl.is_some_and(|c| c.groups),
            Need::CclSplit => ccl.is_some_and(|c| c.split),
            Need::InProcess => !spmd,
            Need::WholeWorld(n) => !spmd || ranks == *n,
            Need::TestKernels => backend.test_kernels(device).is_some(),
            Need::StreamHold => crate::blocker::HoldMode::of(backend, device).is_some(),
            Need::ConcurrentKernels => backend.info().concurrent,
            Need::Op(op, d) => caps.supports(*op, *d),
            Need::Collective(op, d) => ccl.is_some_and(|c| c.supports(*op, *d, None)),
            Need::DlpackDevice => unihal_dlpack::conv::device_type_of(device.id()).is_ok(),
            Need::Capture(k) => k.supported(&caps.optional.graphs),
        };
        if ok {
            return Ok(());
        }
        Err(match self {
            Need::EventTiming => "device events cannot measure time".into(),
            Need::WideFill => "device has no 16/32-bit fills".into(),
            Need::HostCallbacks => "device has no host callbacks".into(),
            Need::StreamOrderedAlloc => "device has no stream-ordered allocation".into(),
            Need::PeerDevice => "device has no peer device".into(),
            Need::Devices(n) => format!("needs {n} devices, backend has {device_count}"),
            Need::Ranks(n) => format!("needs {n} ranks, {ranks} available"),
            Need::CclGroups => "collective engine has no grouped calls".into(),
            Need::CclSplit => "collective engine cannot split communicators".into(),
            Need::InProcess => "makes in-process communicators; this is an SPMD run".into(),
            Need::WholeWorld(n) => format!(
                "makes a {n}-rank communicator with init_rank in every process; the SPMD world \
                 has {ranks}"
            ),
            Need::Op(op, d) => format!("device does not run op {op} in {d}"),
            Need::Collective(op, d) => format!("backend has no collective {} in {d}", op.name()),
            Need::DlpackDevice => {
                format!("DLPack has no device type for backend {}", backend.name())
            }
            Need::Capture(k) => {
                let g = &caps.optional.graphs;
                if g.available() {
                    format!("device cannot capture {k:?} ({})", g.note)
                } else {
                    format!("device has no stream capture: {}", g.note)
                }
            }
            Need::ConcurrentKernels => "needs a kernel running concurrently with the host; the \
                 simulated runtime runs device work only at synchronisation points (hardware and \
                 the simulator's concurrent mode run this case)"
                .into(),
            Need::TestKernels => format!(
                "backend {} has no conformance test kernels for this device (module formats {:?})",
                backend.name(),
                caps.mandatory.module_formats
            ),
            Need::StreamHold => format!(
                "cannot hold a stream: backend {} has no conformance test kernels for this device \
                 (module formats {:?}) and the device has no host callbacks",
                backend.name(),
                caps.mandatory.module_formats
            ),
        })
    }
}

/// The body of a case.
pub type CaseFn = Arc<dyn Fn(&Ctx) -> CaseResult + Send + Sync>;

/// One conformance case.
#[derive(Clone)]
pub struct Case {
    /// Stable hierarchical id, e.g. `memory.copy.h2d.async`.
    pub id: String,
    /// Capabilities the case needs.
    pub needs: Vec<Need>,
    /// Watchdog limit; `None` uses the run's default.
    pub timeout: Option<Duration>,
    /// May run while other cases use the same device.
    pub concurrent: bool,
    /// Provokes a device fault on purpose: on devices whose faults poison the context
    /// (`fault_poisons_device`) it runs in its own process.
    pub faults: bool,
    /// The body.
    pub run: CaseFn,
}

impl Case {
    /// A case with no needs, the default timeout and exclusive use of its device.
    pub fn new(
        id: impl Into<String>,
        run: impl Fn(&Ctx) -> CaseResult + Send + Sync + 'static,
    ) -> Case {
        Case {
            id: id.into(),
            needs: Vec::new(),
            timeout: None,
            concurrent: false,
            faults: false,
            run: Arc::new(run),
        }
    }

    /// The same case with needs.
    pub fn needs(mut self, needs: &[Need]) -> Case {
        self.needs = needs.to_vec();
        self
    }

    /// The same case, marked as provoking a device fault (see [`Case::faults`]).
    pub fn faulting(mut self) -> Case {
        self.faults = true;
        self
    }
}

/// What a case body gets: the device under test and its backend.
pub struct Ctx {
    pub backend: Arc<dyn Backend>,
    pub device: Arc<dyn Device>,
    /// This process's rank of an SPMD world (see [`crate::runner::Target::world`]).
    pub world: Option<Arc<dyn unihal_hal::Communicator>>,
    module: OnceLock<Arc<dyn Module>>,
}

impl Ctx {
    /// A context for `device` of `backend`.
    pub fn new(backend: Arc<dyn Backend>, device: Arc<dyn Device>) -> Ctx {
        Ctx {
            backend,
            device,
            world: None,
            module: OnceLock::new(),
        }
    }

    /// A new stream on the device.
    pub fn stream(&self) -> HalResult<Arc<dyn Stream>> {
        self.device.create_stream()
    }

    /// Another device of the backend: the first peer when there is one, else the next ordinal.
    pub fn other_device(&self) -> HalResult<Arc<dyn Device>> {
        let me = self.device.id().ordinal;
        let peers = &self.device.capabilities().optional.peer_devices;
        let ordinal = match peers.first() {
            Some(&p) => p as usize,
            None => {
                let n = self.backend.probe()?;
                (me as usize + 1) % n.max(1)
            }
        };
        self.backend.open(ordinal)
    }

    /// A test kernel, loaded from the test module (loaded once per context).
    pub fn kernel(&self, name: &str) -> HalResult<Arc<dyn Function>> {
        if self.module.get().is_none() {
            let src = self.backend.test_kernels(&*self.device).ok_or_else(|| {
                HalError::unsupported(format!(
                    "backend {} has no test kernels",
                    self.backend.name()
                ))
            })?;
            let m = self.device.load_module(&src)?;
            let _ = self.module.set(m);
        }
        self.module.get().expect("set above").function(name)
    }

    /// Loads the test module for `device` (another device than the context's).
    pub fn kernel_on(&self, device: &Arc<dyn Device>, name: &str) -> HalResult<Arc<dyn Function>> {
        let src = self.backend.test_kernels(&**device).ok_or_else(|| {
            HalError::unsupported(format!(
                "backend {} has no test kernels",
                self.backend.name()
            ))
        })?;
        device.load_module(&src)?.function(name)
    }

    /// Allocates a buffer holding `data`, synchronously.
    pub fn upload(&self, data: &[u8]) -> HalResult<Buffer> {
        let b = self.device.alloc(data.len())?;
        self.stream()?.write(&b, 0, data)?;
        Ok(b)
    }

    /// Reads a whole buffer, synchronously, through a fresh stream.
    pub fn download(&self, b: &Buffer) -> HalResult<Vec<u8>> {
        let mut out = vec![0u8; b.len() as usize];
        let s = b_stream(self, b)?;
        s.read(b, 0, &mut out)?;
        Ok(out)
    }
}

fn b_stream(ctx: &Ctx, b: &Buffer) -> HalResult<Arc<dyn Stream>> {
    if b.device() == ctx.device.id() {
        ctx.stream()
    } else {
        ctx.backend
            .open(b.device().ordinal as usize)?
            .create_stream()
    }
}

/// Expects an `InvalidArgument` for `arg` and returns its reason for the caller to match exactly.
pub fn expect_invalid<T: std::fmt::Debug>(r: HalResult<T>, arg: &str) -> Result<Invalid, Failure> {
    match r {
        Err(HalError::InvalidArgument { arg: a, reason }) if a == arg => Ok(reason),
        other => Err(Failure::new(format!(
            "expected InvalidArgument for `{arg}`, got {other:?}"
        ))),
    }
}

/// Expects an `InvalidArgument` for `arg` with `Invalid::ForeignHandle` whose `found` names the
/// offending handle: every text of `names` (its kind, the device it claims, its address or name)
/// appears in it, and the message names the argument.
pub fn expect_foreign<T: std::fmt::Debug>(
    r: HalResult<T>,
    arg: &str,
    names: &[&str],
) -> Result<(), Failure> {
    let msg = match &r {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    match expect_invalid(r, arg)? {
        Invalid::ForeignHandle { expected, found } => {
            let missing: Vec<&&str> = names.iter().filter(|n| !found.contains(**n)).collect();
            if !missing.is_empty() {
                return Err(Failure::new(format!(
                    "the foreign-handle error for `{arg}` does not name the handle: found \
                     {found:?} lacks {missing:?}"
                )));
            }
            if expected.is_empty() || !msg.contains(&format!("`{arg}`")) {
                return Err(Failure::new(format!(
                    "the foreign-handle error for `{arg}` does not say what was expected or \
                     which argument: {msg:?}"
                )));
            }
            Ok(())
        }
        other => Err(Failure::new(format!(
            "expected ForeignHandle for `{arg}`, got {other:?}"
        ))),
    }
}

/// The formats a device does *not* load, among the known ones.
pub fn foreign_formats(device: &dyn Device) -> Vec<ModuleFormat> {
    let have = &device.capabilities().mandatory.module_formats;
    [
        ModuleFormat::HostSymbols,
        ModuleFormat::Ptx,
        ModuleFormat::Cubin,
        ModuleFormat::HipCodeObject,
        ModuleFormat::AscendBinary,
    ]
    .into_iter()
    .filter(|f| !have.contains(f))
    .collect()
}

/// Little-endian bytes of `u32`s.
pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `u32`s from little-endian bytes.
pub fn bytes_u32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A deterministic byte pattern (so a shifted or partial copy never matches by luck).
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as u8
        })
        .collect()
}
