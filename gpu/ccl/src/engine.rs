//! The engine: [`Engine`], the HAL's `Collectives` over one [`CollectiveLib`] on a backend's
//! [`Platform`], and [`bounded`], how every blocking library call that waits for all ranks is
//! kept from hanging.

use crate::comm::{LibComm, Parts};
use crate::group::Group;
use crate::library::{CollectiveLib, RawComm};
use crate::platform::{with_current, Platform};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use unihal_hal::ccl::{check_distinct_devices, check_rank, log_created, timeout_of};
use unihal_hal::{
    CclCaps, Collectives, CommConfig, Communicator, Device, HalError, Invalid, Result, UniqueId,
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
            millis: unihal_hal::deadline::millis(timeout),
        }),
    }
}

/// Rank `rank` of `nranks` of the communicator of unique id `id` on `device`: the library's
/// init on a helper thread with the device current, bounded by `timeout` (a communicator made
/// after it is released there).
///
/// # Errors
/// As [`bounded`] and the library's init.
pub(crate) fn init_rank_bounded<L: CollectiveLib>(
    platform: &Arc<dyn Platform>,
    lib: &Arc<L>,
    id: &[u8],
    (nranks, rank): (usize, usize),
    device: &Arc<dyn Device>,
    timeout: Duration,
) -> Result<RawComm> {
    let (call_lib, late_lib) = (lib.clone(), lib.clone());
    let (platform, dev, id) = (platform.clone(), device.clone(), id.to_vec());
    let what = lib.blocking_calls().0;
    bounded(
        what,
        timeout,
        move || {
            with_current(&*platform, &dev, what, || {
                call_lib.init_rank(&id, nranks, rank)
            })
        },
        // SAFETY: a communicator made after its caller gave up: nobody else holds it.
        move |late| unsafe { late_lib.release(late, false) },
    )
}

/// Opens a library (on first use).
type Opener<L> = Box<dyn Fn() -> Result<L> + Send + Sync>;

/// A collective engine over one library ([`crate::NCCL`], [`crate::RCCL`], HCCL) on a backend's
/// [`Platform`]. The library is opened on first use; its outcome is kept.
///
/// Thread safety: any thread. Communicators it makes follow every library's rule: operations of
/// one communicator must be issued in the same order on every rank.
pub struct Engine<L: CollectiveLib> {
    label: &'static str,
    open: Opener<L>,
    platform: Arc<dyn Platform>,
    lib: OnceLock<Result<Arc<L>>>,
    caps: OnceLock<CclCaps>,
}

impl<L: CollectiveLib> Engine<L> {
    /// The engine of the library `label` that `open` opens, on `platform` (nothing is opened
    /// yet).
    pub fn with_library(
        label: &'static str,
        open: impl Fn() -> Result<L> + Send + Sync + 'static,
        platform: Arc<dyn Platform>,
    ) -> Engine<L> {
        Engine {
            label,
            open: Box::new(open),
            platform,
            lib: OnceLock::new(),
            caps: OnceLock::new(),
        }
    }

    /// The library's name ("NCCL", "HCCL").
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// The library, opened once.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] with the paths tried.
    pub fn lib(&self) -> Result<&Arc<L>> {
        self.lib
            .get_or_init(|| (self.open)().map(Arc::new))
            .as_ref()
            .map_err(Clone::clone)
    }

    fn comm(
        &self,
        lib: &Arc<L>,
        raw: RawComm,
        (rank, size): (usize, usize),
        device: &Arc<dyn Device>,
        group: Option<Arc<Group>>,
        config: &CommConfig,
    ) -> Arc<dyn Communicator> {
        LibComm::new(
            Parts {
                lib: lib.clone(),
                platform: self.platform.clone(),
                raw,
                rank,
                size,
                device: device.clone(),
                caps: self.capabilities().clone(),
                group,
            },
            config,
        )
    }
}

/// `Err` for an empty device list.
fn some_devices(devices: &[Arc<dyn Device>]) -> Result<()> {
    if devices.is_empty() {
        return Err(HalError::invalid(
            "devices",
            Invalid::Value {
                value: "no device".into(),
                accepted: "one or more devices".into(),
            },
        ));
    }
    Ok(())
}

impl<L: CollectiveLib> Collectives for Engine<L> {
    fn capabilities(&self) -> &CclCaps {
        self.caps.get_or_init(|| match self.lib() {
            Ok(l) => l.caps(),
            Err(_) => CclCaps::unavailable(format!("{} (unavailable)", self.label)),
        })
    }

    fn unique_id(&self) -> Result<UniqueId> {
        Ok(UniqueId(self.lib()?.unique_id()?))
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
        let (kind, bytes) = lib.id_kind();
        if id.0.len() != bytes {
            return Err(HalError::invalid(
                "id",
                Invalid::Value {
                    value: format!("{} bytes", id.0.len()),
                    accepted: format!("a {} unique id ({kind}, {bytes} bytes)", lib.label()),
                },
            ));
        }
        self.platform.device_ordinal(device)?;
        let timeout = timeout_of(config)?;
        let group = (!lib.can_abort()).then(|| Group::of(lib.label(), &id.0, nranks));
        if let Some(g) = &group {
            g.arrive(rank);
        }
        let raw = init_rank_bounded(&self.platform, &lib, &id.0, (nranks, rank), device, timeout)?;
        let comm = self.comm(&lib, raw, (rank, nranks), device, group, config);
        let engine = &self.capabilities().engine;
        log_created(
            std::slice::from_ref(&comm),
            engine,
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
        let lib = self.lib()?.clone();
        check_distinct_devices(devices)?;
        let ordinals: Vec<i32> = devices
            .iter()
            .map(|d| self.platform.device_ordinal(d))
            .collect::<Result<_>>()?;
        some_devices(devices)?;
        let n = devices.len();
        let group = || (!lib.can_abort()).then(|| Group::complete(n));
        let one_call = with_current(&*self.platform, &devices[0], "init_all", || {
            lib.init_all(&ordinals).transpose()
        })?;
        let made: Vec<RawComm> = match one_call {
            Some(made) => made,
            None => self.init_each(&lib, devices, config)?,
        };
        let group = group();
        let comms: Vec<Arc<dyn Communicator>> = made
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(r, (raw, d))| self.comm(&lib, raw, (r, n), d, group.clone(), config))
            .collect();
        let timeout = timeout_of(config)?;
        log_created(
            &comms,
            &self.capabilities().engine,
            "init_all",
            Some(timeout),
        );
        Ok(comms)
    }
}

impl<L: CollectiveLib> Engine<L> {
    /// `init_all` for a library without one call for it: one unique id, and every rank's init
    /// on a thread of its own; all or none (the ones made are released when one fails).
    fn init_each(
        &self,
        lib: &Arc<L>,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<RawComm>> {
        let n = devices.len();
        let id = lib.unique_id()?;
        let timeout = timeout_of(config)?;
        let made: Vec<Result<RawComm>> = std::thread::scope(|sc| {
            let hs: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(r, d)| {
                    let (id, platform) = (&id, &self.platform);
                    sc.spawn(move || init_rank_bounded(platform, lib, id, (n, r), d, timeout))
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
                // SAFETY: a communicator just made that nobody else holds.
                unsafe { lib.release(raw, false) };
            }
            return Err(e);
        }
        Ok(made.into_iter().flatten().collect())
    }
}
