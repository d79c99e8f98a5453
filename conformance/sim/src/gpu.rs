//! The state every GPU-like face shares (CUDA driver today, the HIP runtime next): the device
//! table with its settings, each thread's current device, the legacy default stream of each
//! device, the pinned host table, peer access, and the host-function flag. A face keeps only its
//! API: handle encodings, entry points and result codes.
//!
//! Settings (read once, when the face starts):
//!
//! * `UNIHAL_SIM_MODE`: `deferred` (default), `eager` or `concurrent` ([`Mode`]);
//! * `UNIHAL_SIM_DEVICES`: number of devices, 1 to the face's maximum (default 2);
//! * `UNIHAL_SIM_MEMORY`: capacity of each device in bytes (default 8 GiB);
//! * `UNIHAL_SIM_WATCHDOG_MS`: how long a synchronisation, or a communicator's initialisation,
//!   waits for peers that never come before failing (default 60000).
//!
//! Thread safety: a [`GpuFace`] is shared by every thread (`Send + Sync`); the current device
//! and the host-function flag are per thread.

pub mod ops;

use crate::{Device, Kernels, Limits, Mode, SimError, SimResult, StreamId};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The largest `UNIHAL_SIM_DEVICES`.
pub const MAX_DEVICES: usize = 8;

/// The process's GPU face (one per simulated library: its runtime face and its collective face
/// share it), started from the environment on first use with unihal's host kernels.
///
/// # Errors
/// The settings' or the start's error (kept: every later call gets it too).
pub fn global() -> SimResult<&'static GpuFace> {
    static FACE: std::sync::OnceLock<SimResult<GpuFace>> = std::sync::OnceLock::new();
    FACE.get_or_init(|| {
        let settings = Settings::from_env(MAX_DEVICES)?;
        GpuFace::start(&settings, host_kernels())
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The `UNIHAL_SIM_*` settings of a GPU face.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub mode: Mode,
    pub devices: usize,
    pub memory: u64,
    pub watchdog: Duration,
}

fn env_number(name: &str, default: u64) -> SimResult<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| SimError::InvalidValue(format!("{name}={v} is not a number"))),
        Err(_) => Ok(default),
    }
}

/// `UNIHAL_SIM_MODE` ([`Mode`], default deferred).
///
/// # Errors
/// [`SimError::InvalidValue`] for another value.
pub fn mode_from_env() -> SimResult<Mode> {
    match std::env::var("UNIHAL_SIM_MODE").as_deref().map(str::trim) {
        Ok("eager") => Ok(Mode::Eager),
        Ok("concurrent") => Ok(Mode::Concurrent),
        Ok("deferred") | Err(_) => Ok(Mode::Deferred),
        Ok(other) => Err(SimError::InvalidValue(format!(
            "UNIHAL_SIM_MODE={other} (deferred, eager or concurrent)"
        ))),
    }
}

/// `unihal_dynlib::SIMULATED_SYMBOL`, exported by every simulated runtime built on this crate:
/// the one way a backend learns that its runtime is simulated, and whether device work runs
/// while the host goes on (`concurrent` mode) or only at synchronisation points.
#[no_mangle]
pub extern "C" fn unihal_simulated_runtime() -> *const std::ffi::c_char {
    match mode_from_env() {
        Ok(Mode::Concurrent) => c"unihal simulated runtime, concurrent mode".as_ptr(),
        Ok(Mode::Eager) => c"unihal simulated runtime, eager mode".as_ptr(),
        _ => c"unihal simulated runtime, deferred mode".as_ptr(),
    }
}

impl Settings {
    /// The settings from the environment, with at most `max_devices` devices.
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] naming the variable with a bad value.
    pub fn from_env(max_devices: usize) -> SimResult<Settings> {
        let mode = mode_from_env()?;
        let devices = env_number("UNIHAL_SIM_DEVICES", 2)? as usize;
        if !(1..=max_devices).contains(&devices) {
            return Err(SimError::InvalidValue(format!(
                "UNIHAL_SIM_DEVICES={devices} (1 to {max_devices})"
            )));
        }
        Ok(Settings {
            mode,
            devices,
            memory: env_number("UNIHAL_SIM_MEMORY", 8 << 30)?,
            watchdog: Duration::from_millis(env_number("UNIHAL_SIM_WATCHDOG_MS", 60_000)?),
        })
    }
}

/// The host functions a simulated device runs for kernel entries: unihal's portable library and
/// the conformance test kernels, by entry name.
pub fn host_kernels() -> Kernels {
    let tables = [
        unihal_kernels::cpu::host_symbols(),
        Arc::new(unihal_kernels::testing::host_symbols()),
    ];
    let mut kernels = Kernels::new();
    for table in &tables {
        for name in table.names() {
            if let Some(k) = table.get(name) {
                kernels.insert(name.to_string(), k.func);
            }
        }
    }
    kernels
}

/// A pinned host allocation.
struct Pinned {
    len: u64,
    layout: std::alloc::Layout,
    /// Queued copies that read or write it (a free while any is queued is refused).
    in_use: Arc<AtomicUsize>,
}

/// Marks a pinned allocation in use by one queued copy, until dropped (with the copy's work,
/// run or not).
pub struct PinnedUse(Arc<AtomicUsize>);

impl Drop for PinnedUse {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a pinned free was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnpinError {
    /// Not an address the face pinned.
    Unknown,
    /// A queued copy still uses it (freeing now would race with the copy).
    InUse,
}

/// The devices of a GPU face and the state its API shares across them.
pub struct GpuFace {
    /// The devices, by ordinal.
    pub devices: Vec<Arc<Device>>,
    /// The legacy default stream (the null stream) of each device.
    pub default_streams: Vec<StreamId>,
    /// How long waits for peers last.
    pub watchdog: Duration,
    pinned: Mutex<BTreeMap<u64, Pinned>>,
    /// `(device, peer)` pairs with peer access enabled.
    peer_access: Mutex<BTreeSet<(usize, usize)>>,
}

thread_local! {
    /// The calling thread's current device (the face's current context).
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
    /// True while this thread runs a host function.
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

impl GpuFace {
    /// `settings.devices` devices running `kernels`, each with its legacy default stream.
    ///
    /// # Errors
    /// A device's error creating its default stream.
    pub fn start(settings: &Settings, kernels: Kernels) -> SimResult<GpuFace> {
        let mut devices = Vec::with_capacity(settings.devices);
        let mut default_streams = Vec::with_capacity(settings.devices);
        for ordinal in 0..settings.devices {
            let dev = Device::with_kernels(
                settings.memory,
                settings.mode,
                kernels.clone(),
                Limits::default(),
            )
            .with_ordinal(ordinal as u32)
            .with_watchdog(settings.watchdog);
            default_streams.push(dev.create_legacy_stream()?);
            devices.push(Arc::new(dev));
        }
        Ok(GpuFace {
            devices,
            default_streams,
            watchdog: settings.watchdog,
            pinned: Mutex::new(BTreeMap::new()),
            peer_access: Mutex::new(BTreeSet::new()),
        })
    }

    /// The device with this ordinal.
    pub fn device(&self, ordinal: i64) -> Option<&Arc<Device>> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|o| self.devices.get(o))
    }

    /// The calling thread's current device ordinal.
    pub fn current(&self) -> Option<usize> {
        CURRENT.get().filter(|&o| o < self.devices.len())
    }

    /// Makes `ordinal` (None: no device) current on the calling thread.
    pub fn set_current(&self, ordinal: Option<usize>) {
        CURRENT.set(ordinal);
    }

    /// The device a handle (stream, event, module, function) belongs to.
    pub fn owner(&self, handle: u64) -> Option<&Arc<Device>> {
        self.devices.get(Device::ordinal_of(handle) as usize)
    }

    /// A stream handle's device and stream: the null handle is the current device's legacy
    /// default stream; others carry their device's ordinal. None without a current device or
    /// for a handle of no device.
    pub fn stream(&self, handle: u64) -> Option<(&Arc<Device>, StreamId)> {
        if handle == 0 {
            let o = self.current()?;
            Some((&self.devices[o], self.default_streams[o]))
        } else {
            Some((self.owner(handle)?, StreamId(handle)))
        }
    }

    /// The device whose memory holds `addr`, if any.
    pub fn memory_owner(&self, addr: u64) -> Option<&Arc<Device>> {
        self.devices.iter().find(|d| d.owns(addr))
    }

    /// Registers pinned host memory `[addr, addr + len)` allocated with `layout`.
    pub fn pin(&self, addr: u64, len: u64, layout: std::alloc::Layout) {
        self.pinned.lock().insert(
            addr,
            Pinned {
                len,
                layout,
                in_use: Default::default(),
            },
        );
    }

    /// Unregisters the pinned allocation at `addr` and returns its layout for the face to free.
    ///
    /// # Errors
    /// [`UnpinError::Unknown`]; [`UnpinError::InUse`] while a queued copy uses it.
    pub fn unpin(&self, addr: u64) -> Result<std::alloc::Layout, UnpinError> {
        let mut table = self.pinned.lock();
        let e = table.get(&addr).ok_or(UnpinError::Unknown)?;
        if e.in_use.load(Ordering::Acquire) > 0 {
            return Err(UnpinError::InUse);
        }
        table
            .remove(&addr)
            .map(|p| p.layout)
            .ok_or(UnpinError::Unknown)
    }

    /// A use of the pinned allocation holding `[addr, addr + len)`, if it is pinned.
    pub fn pinned_use(&self, addr: u64, len: u64) -> Option<PinnedUse> {
        let table = self.pinned.lock();
        let (_, p) = table
            .range(..=addr)
            .next_back()
            .filter(|(&start, p)| addr.saturating_add(len) <= start + p.len)?;
        p.in_use.fetch_add(1, Ordering::AcqRel);
        Some(PinnedUse(p.in_use.clone()))
    }

    /// Enables access from `me` to `peer`'s memory; false when it was enabled already.
    pub fn enable_peer(&self, me: usize, peer: usize) -> bool {
        self.peer_access.lock().insert((me, peer))
    }

    /// True when access from `me` to `peer`'s memory is enabled.
    pub fn peer_enabled(&self, me: usize, peer: usize) -> bool {
        self.peer_access.lock().contains(&(me, peer))
    }

    /// Disables access from `me` to `peer`'s memory; false when it was not enabled.
    pub fn disable_peer(&self, me: usize, peer: usize) -> bool {
        self.peer_access.lock().remove(&(me, peer))
    }
}

/// Runs `f` as a host function on the calling thread (runtime calls from it are refused by
/// the face: see [`in_host_fn`]).
pub fn run_host_fn(f: impl FnOnce()) {
    let outer = IN_HOST_FN.replace(true);
    f();
    IN_HOST_FN.set(outer);
}

/// True while the calling thread runs a host function.
pub fn in_host_fn() -> bool {
    IN_HOST_FN.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn face(n: usize) -> GpuFace {
        let s = Settings {
            mode: Mode::Deferred,
            devices: n,
            memory: 1 << 20,
            watchdog: Duration::from_millis(100),
        };
        GpuFace::start(&s, Kernels::new()).unwrap()
    }

    #[test]
    fn devices_current_device_and_peers() {
        let f = face(2);
        assert!(f.device(1).is_some() && f.device(2).is_none() && f.device(-1).is_none());
        assert_eq!(f.current(), None);
        f.set_current(Some(1));
        assert_eq!(f.current(), Some(1));
        assert_eq!(
            std::thread::scope(|s| s.spawn(|| f.current()).join().unwrap()),
            None
        );
        f.set_current(Some(7));
        assert_eq!(
            f.current(),
            None,
            "an ordinal beyond the devices is no device"
        );
        assert!(f.enable_peer(0, 1) && !f.enable_peer(0, 1));
        assert!(f.disable_peer(0, 1) && !f.disable_peer(0, 1));
        let s = f.devices[1].create_stream().unwrap();
        assert!(std::ptr::eq(
            f.owner(s.0).unwrap().as_ref(),
            f.devices[1].as_ref()
        ));
    }

    #[test]
    fn pinned_memory_in_use_cannot_be_unpinned() {
        let f = face(1);
        let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
        f.pin(0x10000, 4096, layout);
        assert!(
            f.pinned_use(0x10000 + 4000, 200).is_none(),
            "runs past the allocation"
        );
        let u = f.pinned_use(0x10000 + 100, 200).unwrap();
        assert_eq!(f.unpin(0x10000), Err(UnpinError::InUse));
        drop(u);
        assert_eq!(f.unpin(0x10000), Ok(layout));
        assert_eq!(f.unpin(0x10000), Err(UnpinError::Unknown));
    }

    #[test]
    fn host_functions_are_flagged_on_their_thread() {
        assert!(!in_host_fn());
        run_host_fn(|| {
            assert!(in_host_fn());
            run_host_fn(|| assert!(in_host_fn()));
            assert!(in_host_fn(), "the outer flag is restored");
        });
        assert!(!in_host_fn());
    }
}
