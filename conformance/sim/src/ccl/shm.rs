//! The shared-memory file of one communicator: where its ranks meet ([`super::rendezvous`]) and,
//! when they live in several processes, what carries their data ([`super::xproc`]).
//!
//! The file is named by a hash of the unique id (`/dev/shm/unihal-sim-ccl-<hash>`), so the id a
//! launcher hands every process names the rendezvous, as the root's address in NCCL's id does.
//! Every rank maps the same file of a fixed size ([`LEN`]), so no rank can shrink it under
//! another; the file is sparse, and a communicator whose ranks share one process touches only its
//! first pages. The name is removed once every rank has mapped it (or the last waiting rank gave
//! up); the mappings live until the communicator is dropped.
//!
//! Layout (all offsets fixed):
//!
//! | offset | what |
//! |---|---|
//! | 0 | [`Header`]: magic, rank count, ranks that took the file, the failure every rank sees |
//! | [`RANKS_AT`] | one [`RankBlock`] per rank: its state, process, node and device, abort flag, collective step counters and the descriptor of its current step |
//! | [`SLOTS_AT`] | one collective slot of [`SLOT`] bytes per rank |
//! | [`CHANNELS_AT`] | one point-to-point ring of [`RING`] bytes per ordered pair of ranks |
//!
//! Every field another process reads is an atomic; data in slots and rings is published by a
//! release store of a counter and read after an acquire load of it.

use crate::{SimError, SimResult};
use std::sync::atomic::{AtomicU64, Ordering};

/// The most ranks a communicator spanning processes may have (a simulator's limit, named in the
/// error that refuses more).
pub const MAX_RANKS: usize = 16;
/// Bytes of one rank's collective slot: a collective moves its data in steps of at most this
/// much per rank.
pub const SLOT: usize = 1 << 20;
/// Bytes of one point-to-point ring (sender to receiver).
pub const RING: usize = 64 << 10;
/// The length of the message a failure carries.
pub const MESSAGE: usize = 1024;

const MAGIC: u64 = 0x756e_6968_616c_6363; // "unihalcc"
pub const RANKS_AT: usize = 4096;
const RANK_BLOCK: usize = 256;
pub const SLOTS_AT: usize = 64 << 10;
pub const CHANNELS_AT: usize = SLOTS_AT + MAX_RANKS * SLOT;
const CHANNEL: usize = 64 + RING;
/// The file's size: every rank maps all of it.
pub const LEN: usize = CHANNELS_AT + MAX_RANKS * MAX_RANKS * CHANNEL;

/// The file's first page.
#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    /// The communicator's size, set by the first rank to arrive (0 before).
    pub nranks: AtomicU64,
    /// Ranks that saw every rank join and took the communicator (the last removes the name).
    pub taken: AtomicU64,
    /// 0: no failure; 1: being written; 2: written ([`Failure`]).
    pub failed: AtomicU64,
    /// The failure's kind (1: timeout, 2: launch failure) and the length of its message.
    pub failed_kind: AtomicU64,
    pub failed_len: AtomicU64,
    pub failed_msg: [AtomicU64; MESSAGE / 8],
}

/// One rank's block.
#[repr(C)]
pub struct RankBlock {
    /// 0: free; 1: being claimed; 2: joined.
    pub state: AtomicU64,
    pub pid: AtomicU64,
    /// A hash of the node's name ([`node`]).
    pub node: AtomicU64,
    pub ordinal: AtomicU64,
    pub aborted: AtomicU64,
    /// The last collective step whose data this rank put in its slot.
    pub posted: AtomicU64,
    /// The last collective step this rank finished reading from every slot.
    pub consumed: AtomicU64,
    /// What the posted step belongs to (see `xproc::Desc`).
    pub desc: [AtomicU64; 6],
}

/// A point-to-point ring's counters: bytes written and read since the communicator formed.
#[repr(C)]
pub struct Channel {
    pub written: AtomicU64,
    pub read: AtomicU64,
}

/// A mapped communicator file. Thread-safe: every shared field is atomic, and the data areas are
/// reached only through raw pointers under the protocols of [`super::xproc`].
pub struct Segment {
    base: *mut u8,
    path: std::path::PathBuf,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or through raw
// copies that the transport's protocol orders.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn io(what: &str, path: &std::path::Path) -> SimError {
    SimError::InvalidUsage(format!(
        "communicator rendezvous: {what} {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    ))
}

impl Segment {
    /// Opens (creating it if needed) the file of the communicator named `id`, and maps it.
    ///
    /// # Errors
    /// [`SimError::InvalidUsage`] naming the file when it cannot be created, sized or mapped, or
    /// holds something else.
    pub fn open(id: &[u8]) -> SimResult<Segment> {
        let dir = std::path::Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("unihal-sim-ccl-{}", name(id)));
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io("a path with a NUL", &path))?;
        // SAFETY: `c` is a NUL-terminated path; the flags and mode are plain integers.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600) };
        if fd < 0 {
            return Err(io("cannot open", &path));
        }
        // Every rank sizes the file to the same constant, so no ftruncate shrinks another's.
        // SAFETY: `fd` is the descriptor opened above.
        let sized = unsafe { libc::ftruncate(fd, LEN as libc::off_t) };
        let base = if sized == 0 {
            // SAFETY: a fresh shared mapping of `LEN` bytes of the open file.
            unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            }
        } else {
            libc::MAP_FAILED
        };
        let err = (base == libc::MAP_FAILED).then(|| io("cannot size or map", &path));
        // SAFETY: `fd` is ours; the mapping (if any) outlives it.
        unsafe { libc::close(fd) };
        if let Some(e) = err {
            return Err(e);
        }
        let seg = Segment {
            base: base.cast(),
            path,
        };
        let magic = seg.header().magic.load(Ordering::Acquire);
        if magic == 0 {
            let _ =
                seg.header()
                    .magic
                    .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
        } else if magic != MAGIC {
            return Err(SimError::InvalidUsage(format!(
                "communicator rendezvous: {} is not a unihal simulated communicator",
                seg.path.display()
            )));
        }
        Ok(seg)
    }

    /// Removes the file's name (mappings stay valid). Idempotent.
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is `LEN` bytes, page-aligned; `Header` is atomics only and fits
        // before `RANKS_AT`.
        unsafe { &*(self.base as *const Header) }
    }

    /// Rank `r`'s block (`r < MAX_RANKS`).
    pub fn rank(&self, r: usize) -> &RankBlock {
        assert!(r < MAX_RANKS);
        // SAFETY: inside the rank area (checked above), aligned to 256 bytes; atomics only.
        unsafe { &*(self.base.add(RANKS_AT + r * RANK_BLOCK) as *const RankBlock) }
    }

    /// The start of rank `r`'s collective slot ([`SLOT`] bytes).
    pub fn slot(&self, r: usize) -> *mut u8 {
        assert!(r < MAX_RANKS);
        // SAFETY: inside the mapping (slots end at `CHANNELS_AT`).
        unsafe { self.base.add(SLOTS_AT + r * SLOT) }
    }

    /// The ring from `src` to `dst`: its counters and its [`RING`] data bytes.
    pub fn channel(&self, src: usize, dst: usize) -> (&Channel, *mut u8) {
        assert!(src < MAX_RANKS && dst < MAX_RANKS);
        // SAFETY: inside the channel area; each channel is 64 bytes of counters, then data.
        unsafe {
            let at = self
                .base
                .add(CHANNELS_AT + (src * MAX_RANKS + dst) * CHANNEL);
            (&*(at as *const Channel), at.add(64))
        }
    }

    /// Records the communicator's failure (the first one wins) for every rank to see.
    pub fn fail(&self, e: &SimError) {
        self.record(e, None);
    }

    /// Records that rank `rank`'s process exited (a launch failure naming it, `message`).
    pub fn fail_exited(&self, rank: usize, message: String) {
        self.record(&SimError::LaunchFailed(message), Some(rank));
    }

    fn record(&self, e: &SimError, exited: Option<usize>) {
        let h = self.header();
        if h.failed
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let (kind, msg) = match e {
            SimError::Timeout(m) => (1, m.clone()),
            SimError::LaunchFailed(m) => (2, m.clone()),
            other => (2, other.to_string()),
        };
        let bytes = &msg.as_bytes()[..msg.len().min(MESSAGE)];
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            h.failed_msg[i].store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        let kind = exited.map_or(kind, |r| 3 | (r as u64) << 8);
        h.failed_kind.store(kind, Ordering::Relaxed);
        h.failed_len.store(bytes.len() as u64, Ordering::Relaxed);
        h.failed.store(2, Ordering::Release);
    }

    /// The communicator's failure, if a rank recorded one.
    pub fn failure(&self) -> Option<SimError> {
        let h = self.header();
        if h.failed.load(Ordering::Acquire) != 2 {
            return None;
        }
        let len = h.failed_len.load(Ordering::Relaxed) as usize;
        let mut bytes: Vec<u8> = h
            .failed_msg
            .iter()
            .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
            .collect();
        bytes.truncate(len);
        let msg = String::from_utf8_lossy(&bytes).into_owned();
        Some(match h.failed_kind.load(Ordering::Relaxed) {
            1 => SimError::Timeout(msg),
            _ => SimError::LaunchFailed(msg),
        })
    }

    /// The rank whose process exited, when that is the communicator's failure.
    pub fn exited(&self) -> Option<usize> {
        let h = self.header();
        if h.failed.load(Ordering::Acquire) != 2 {
            return None;
        }
        let kind = h.failed_kind.load(Ordering::Relaxed);
        (kind & 0xff == 3).then_some((kind >> 8) as usize)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once (nothing borrows it past `self`).
        unsafe { libc::munmap(self.base.cast(), LEN) };
    }
}

/// 32 hex digits naming the file of the communicator `id` (two FNV-1a hashes with different
/// bases: ids are up to 128 bytes, longer than a file name may be).
fn name(id: &[u8]) -> String {
    let fnv = |basis: u64| {
        id.iter().fold(basis, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    format!(
        "{:016x}{:016x}",
        fnv(0xcbf2_9ce4_8422_2325),
        fnv(0x6c62_272e_07bb_0142)
    )
}

/// This node's identity: a hash of `UNIHAL_SIM_NODE` if set (two simulated hosts on one
/// machine), else of the host name. Two ranks of one node must not share a device.
pub fn node() -> (u64, String) {
    let name = std::env::var("UNIHAL_SIM_NODE").ok().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    });
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (h, name)
}

/// Whether process `pid` still runs (a zombie, dead but not yet reaped, does not).
pub fn alive(pid: u64) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(p, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next()),
            Some(Some('Z' | 'X'))
        ),
        Err(_) => true,
    }
}
