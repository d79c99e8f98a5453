//! The kernel library cache: compiled images in memory for the process and on disk across
//! processes, keyed on everything that changes them, verified before use.
//!
//! Directory: `UNIHAL_KERNEL_CACHE` (`off` disables the disk cache), default
//! `$XDG_CACHE_HOME/unihal/kernels` or `~/.cache/unihal/kernels`. One file per entry,
//! `<source hash>-<target>-<hash of the rest of the key>.uhk`:
//!
//! ```text
//! "UNIHAL-KERNEL-CACHE 1\n"  key line ("\n"-terminated, the whole key in words)
//! per part: u32 name length, name, u64 length, bytes      (little-endian)
//! u64 FNV-1a of everything before it
//! ```
//!
//! A file whose magic, key, layout or checksum does not match (a truncated write, another
//! version's format, a hash collision of file names, bit rot) is reported, removed and
//! recompiled, never loaded. Writes go to a temporary file renamed into place, so concurrent
//! processes never read half an entry.
//!
//! One compile per key: a lookup that misses memory takes an exclusive advisory lock on the
//! entry's `<entry>.lock` file (`flock`) before it reads the disk and compiles, so the threads
//! and processes that start together (the ranks of a job on one node, tests run side by side)
//! compile a key once; the others wait, then read the entry. The wait is bounded
//! ([`LOCK_WAIT`]: a holder that hangs cannot hang the others, who then compile unlocked), and a
//! directory where the lock file cannot be made compiles unlocked.
//!
//! Thread safety: [`KernelCache`] is `Send + Sync`. Without a disk directory two threads asking
//! for one key at once may both compile (the result is the same), and one entry wins.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use unihal_hal::Result;
use unihal_kernels::source::fnv1a;

const MAGIC: &[u8] = b"UNIHAL-KERNEL-CACHE 1\n";

/// How long a lookup waits for another thread's or process's compile of the same entry before it
/// compiles on its own.
pub const LOCK_WAIT: Duration = Duration::from_secs(600);

/// Everything a compiled image depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// Hash of the whole translation unit (`unihal_kernels::source::fnv1a`).
    pub source_hash: u64,
    /// Target architecture (`sm_90`, `gfx90a`).
    pub target: String,
    /// Compiler and version (`NVRTC 13.0`).
    pub compiler: String,
    /// Compile options, in order.
    pub options: Vec<String>,
    /// Driver or runtime version the images are for (`CUDA driver 13000`).
    pub runtime: String,
}

impl CacheKey {
    /// The key in words (the file's key line).
    pub fn describe(&self) -> String {
        format!(
            "source {:016x} target {} compiler {} options [{}] runtime {}",
            self.source_hash,
            self.target,
            self.compiler,
            self.options.join(" "),
            self.runtime
        )
        .replace('\n', " ")
    }

    /// The entry's file name: readable source hash and target, the rest hashed.
    pub fn file_name(&self) -> String {
        let target: String = self
            .target
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!(
            "{:016x}-{target}-{:016x}.uhk",
            self.source_hash,
            fnv1a(self.describe())
        )
    }
}

/// Named images of one compile (`("cubin", ..)`, `("ptx", ..)`).
pub type Parts = Vec<(String, Vec<u8>)>;

/// Where a lookup found the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Memory,
    Disk,
    Compiled,
}

/// The cache: a memory map for the process in front of a directory.
pub struct KernelCache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<CacheKey, Arc<Parts>>>,
}

/// The directory `UNIHAL_KERNEL_CACHE` and the XDG defaults name, or None when disabled.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var("UNIHAL_KERNEL_CACHE") {
        Ok(v) if v.trim() == "off" => None,
        Ok(v) if !v.trim().is_empty() => Some(PathBuf::from(v.trim())),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("unihal").join("kernels"))
        }
    }
}

/// Encodes an entry (see the module docs).
fn encode(key: &CacheKey, parts: &Parts) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(key.describe().as_bytes());
    out.push(b'\n');
    for (name, bytes) in parts {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Decodes an entry for `key`, or says why it cannot be trusted.
fn decode(key: &CacheKey, data: &[u8]) -> std::result::Result<Parts, String> {
    let body_len = data
        .len()
        .checked_sub(8)
        .ok_or_else(|| format!("{} bytes: truncated", data.len()))?;
    let (body, sum) = data.split_at(body_len);
    let sum = u64::from_le_bytes(sum.try_into().map_err(|_| "no checksum")?);
    if fnv1a(body) != sum {
        return Err("checksum mismatch".into());
    }
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| "not a unihal kernel cache file of this version".to_string())?;
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| "no key line".to_string())?;
    if rest[..nl] != *key.describe().as_bytes() {
        return Err(format!(
            "made for another key ({})",
            String::from_utf8_lossy(&rest[..nl])
        ));
    }
    let mut rest = &rest[nl + 1..];
    let mut take = |n: usize| -> std::result::Result<&[u8], String> {
        if rest.len() < n {
            return Err("truncated part".into());
        }
        let (a, b) = rest.split_at(n);
        rest = b;
        Ok(a)
    };
    let mut parts = Vec::new();
    while let Ok(len) = take(4) {
        let name_len = u32::from_le_bytes(len.try_into().map_err(|_| "bad length")?) as usize;
        let name = String::from_utf8_lossy(take(name_len)?).into_owned();
        let n = u64::from_le_bytes(take(8)?.try_into().map_err(|_| "bad length")?);
        let n = usize::try_from(n).map_err(|_| "part too large".to_string())?;
        parts.push((name, take(n)?.to_vec()));
    }
    Ok(parts)
}

impl KernelCache {
    /// The process's cache over [`default_dir`] (read once).
    pub fn global() -> &'static KernelCache {
        static CACHE: OnceLock<KernelCache> = OnceLock::new();
        CACHE.get_or_init(|| KernelCache::new(default_dir()))
    }

    /// A cache over `dir` (None: memory only).
    pub fn new(dir: Option<PathBuf>) -> KernelCache {
        KernelCache {
            dir,
            memory: Mutex::new(HashMap::new()),
        }
    }

    /// The disk directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The entry for `key`: from memory, else from disk (verified), else `compile()`d and
    /// stored in both. A corrupt disk entry is logged, removed and recompiled.
    ///
    /// # Errors
    /// `compile`'s. A disk that cannot be written is logged, not an error.
    pub fn get_or_compile(
        &self,
        key: &CacheKey,
        compile: impl FnOnce() -> Result<Parts>,
    ) -> Result<(Arc<Parts>, Source)> {
        if let Some(p) = self.memory.lock().get(key) {
            return Ok((p.clone(), Source::Memory));
        }
        let path = self.dir.as_ref().map(|d| d.join(key.file_name()));
        // Held until the entry is on disk: a concurrent lookup of the same key waits here and
        // then reads it instead of compiling it again.
        let _lock = path.as_deref().and_then(EntryLock::acquire);
        if let Some(path) = &path {
            match std::fs::read(path) {
                Ok(data) => match decode(key, &data) {
                    Ok(parts) => {
                        let parts = Arc::new(parts);
                        self.memory.lock().insert(key.clone(), parts.clone());
                        return Ok((parts, Source::Disk));
                    }
                    Err(why) => {
                        tracing::warn!(target: "unihal::kernel",
                            "kernel cache entry {} is not usable ({why}): recompiling", path.display());
                        let _ = std::fs::remove_file(path);
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(target: "unihal::kernel",
                    "kernel cache entry {}: {e}", path.display()),
            }
        }
        let parts = Arc::new(compile()?);
        if let Some(path) = &path {
            if let Err(e) = write_atomically(path, &encode(key, &parts)) {
                tracing::warn!(target: "unihal::kernel", "kernel cache {}: {e}", path.display());
            }
        }
        self.memory.lock().insert(key.clone(), parts.clone());
        Ok((parts, Source::Compiled))
    }

    /// Deletes the disk cache and forgets the memory one.
    ///
    /// # Errors
    /// The I/O error, except when there is nothing to delete.
    pub fn clear(&self) -> std::io::Result<()> {
        self.memory.lock().clear();
        match &self.dir {
            Some(d) if d.exists() => std::fs::remove_dir_all(d),
            _ => Ok(()),
        }
    }
}

/// An exclusive advisory lock on an entry's `.lock` file, released when dropped (or when the
/// process ends, however it ends).
struct EntryLock {
    _file: std::fs::File,
}

impl EntryLock {
    /// Locks the entry at `path`, waiting up to [`LOCK_WAIT`]; None (compile unlocked) when the
    /// lock file cannot be made or the wait ran out.
    #[cfg(unix)]
    fn acquire(path: &Path) -> Option<EntryLock> {
        use std::os::fd::AsRawFd;
        let lock_path = path.with_extension("lock");
        let file = std::fs::create_dir_all(path.parent()?)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&lock_path)
            })
            .inspect_err(|e| {
                tracing::warn!(target: "unihal::kernel",
                    "kernel cache lock {}: {e}: compiling unlocked", lock_path.display());
            })
            .ok()?;
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock(2) on a descriptor `file` owns and keeps open for the call; no memory
            // is passed. The lock belongs to this open file description: it is released when
            // `file` is closed (the EntryLock dropped) or the process ends.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(EntryLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            let busy = e.raw_os_error() == Some(libc::EWOULDBLOCK);
            if !busy || Instant::now() >= deadline {
                tracing::warn!(target: "unihal::kernel",
                    "kernel cache lock {}: {}: compiling unlocked", lock_path.display(),
                    if busy { format!("still held after {LOCK_WAIT:?}") } else { e.to_string() });
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[cfg(not(unix))]
    fn acquire(_path: &Path) -> Option<EntryLock> {
        None
    }
}

/// Writes `bytes` to a temporary file next to `path` and renames it into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir)?;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = path.with_extension(format!(
        "tmp.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn key() -> CacheKey {
        CacheKey {
            source_hash: 0x1234,
            target: "sm_90".into(),
            compiler: "NVRTC 13.0".into(),
            options: vec!["--fmad=false".into(), "--std=c++14".into()],
            runtime: "CUDA driver 13000".into(),
        }
    }

    fn parts() -> Parts {
        vec![
            ("cubin".into(), vec![1, 2, 3]),
            ("ptx".into(), b".entry x()".to_vec()),
        ]
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("unihal-kc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn every_part_of_the_key_changes_the_entry() {
        let k = key();
        let mut variants = vec![k.clone()];
        let mut v = k.clone();
        v.source_hash = 0x1235;
        variants.push(v);
        let mut v = k.clone();
        v.target = "sm_80".into();
        variants.push(v);
        let mut v = k.clone();
        v.compiler = "NVRTC 13.1".into();
        variants.push(v);
        let mut v = k.clone();
        v.options.push("-G".into());
        variants.push(v);
        let mut v = k.clone();
        v.runtime = "CUDA driver 13010".into();
        variants.push(v);
        let names: std::collections::HashSet<String> =
            variants.iter().map(CacheKey::file_name).collect();
        assert_eq!(names.len(), variants.len(), "{names:?}");
        assert!(k.file_name().starts_with("0000000000001234-sm_90-"));
    }

    #[test]
    fn lookups_that_start_together_compile_once() {
        // Two caches over one directory stand for two processes; two threads of each.
        let dir = temp_dir("together");
        let compiles = std::sync::atomic::AtomicUsize::new(0);
        let caches = [
            KernelCache::new(Some(dir.clone())),
            KernelCache::new(Some(dir.clone())),
        ];
        std::thread::scope(|s| {
            for cache in caches.iter().chain(caches.iter()) {
                s.spawn(|| {
                    let (p, _) = cache
                        .get_or_compile(&key(), || {
                            compiles.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(200));
                            Ok(parts())
                        })
                        .unwrap();
                    assert_eq!(*p, parts());
                });
            }
        });
        assert_eq!(compiles.into_inner(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn compiles_once_then_reads_memory_then_disk() {
        let dir = temp_dir("roundtrip");
        let compiles = Cell::new(0);
        let compile = || {
            compiles.set(compiles.get() + 1);
            Ok(parts())
        };
        let c = KernelCache::new(Some(dir.clone()));
        let (p, src) = c.get_or_compile(&key(), compile).unwrap();
        assert_eq!(((*p).clone(), src), (parts(), Source::Compiled));
        let (_, src) = c.get_or_compile(&key(), compile).unwrap();
        assert_eq!(src, Source::Memory);
        // Another process: the disk entry.
        let c2 = KernelCache::new(Some(dir.clone()));
        let (p2, src) = c2.get_or_compile(&key(), compile).unwrap();
        assert_eq!(((*p2).clone(), src), (parts(), Source::Disk));
        assert_eq!(compiles.get(), 1);
        c2.clear().unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn a_corrupt_or_foreign_entry_is_recompiled_not_trusted() {
        let dir = temp_dir("corrupt");
        let k = key();
        let path = dir.join(k.file_name());
        let good = encode(&k, &parts());
        let mut flipped = good.clone();
        flipped[MAGIC.len() + 40] ^= 1;
        let mut other = k.clone();
        other.runtime = "CUDA driver 12000".into();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", good[..good.len() - 5].to_vec()),
            ("a flipped bit", flipped),
            ("empty", Vec::new()),
            (
                "another key's entry under this name",
                encode(&other, &parts()),
            ),
            ("garbage", b"not a cache file at all".to_vec()),
        ];
        for (what, bytes) in cases {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
            let c = KernelCache::new(Some(dir.clone()));
            let compiled = Cell::new(false);
            let (p, src) = c
                .get_or_compile(&k, || {
                    compiled.set(true);
                    Ok(parts())
                })
                .unwrap();
            assert!(compiled.get(), "{what}: trusted");
            assert_eq!((src, (*p).clone()), (Source::Compiled, parts()), "{what}");
            // Rewritten good.
            assert_eq!(std::fs::read(&path).unwrap(), good, "{what}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_compile_caches_nothing() {
        let c = KernelCache::new(None);
        let e = c
            .get_or_compile(&key(), || Err(unihal_hal::HalError::Internal("no".into())))
            .unwrap_err();
        assert!(e.to_string().contains("no"));
        let (_, src) = c.get_or_compile(&key(), || Ok(parts())).unwrap();
        assert_eq!(src, Source::Compiled);
    }
}
