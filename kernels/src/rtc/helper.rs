//! Compiling in a process of its own: hiprtc 5.x aborts the whole process when given an
//! architecture it does not know (gfx94x, gfx11xx, Hygon gfx92x/93x). So only the architectures
//! that hiprtc is known to handle ([`super::hiprtc::SAFE_ARCHS`]) are compiled in the calling
//! process; every other one is compiled by the helper executable `unihal-hiprtc-helper` (built by
//! the HIP backend), shipped with unihal and found through `UNIHAL_HIPRTC_HELPER` or beside the
//! running executable (never the executable itself, which inside many engines is Python). A
//! helper that crashes is an error naming the architecture and the hiprtc version, remembered for
//! the process, never the host's death.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use unihal_hal::{HalError, Result};

/// The helper's file name.
pub const HELPER: &str = "unihal-hiprtc-helper";

/// How long the helper may take for one compilation.
const HELPER_TIMEOUT: Duration = Duration::from_secs(600);

/// Where the helper is: `UNIHAL_HIPRTC_HELPER`, else beside the running executable (or one
/// directory up, where cargo puts binaries next to a test's `deps/`).
///
/// # Errors
/// [`HalError::Unavailable`] naming the places looked at.
pub fn helper_path() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("UNIHAL_HIPRTC_HELPER") {
        if !p.trim().is_empty() {
            return Ok(PathBuf::from(p.trim()));
        }
    }
    let exe = std::env::current_exe().map_err(|e| HalError::Unavailable {
        what: HELPER.into(),
        reason: format!("the running executable's path is unknown: {e}"),
    })?;
    let dirs: Vec<PathBuf> = exe.ancestors().skip(1).take(2).map(PathBuf::from).collect();
    dirs.iter()
        .map(|d| d.join(HELPER))
        .find(|p| p.is_file())
        .ok_or_else(|| HalError::Unavailable {
            what: HELPER.into(),
            reason: format!(
                "not found in {dirs:?} (set UNIHAL_HIPRTC_HELPER to its path); it compiles the \
                 architectures this hiprtc may abort on"
            ),
        })
}

/// Failures of the helper, per (hiprtc version, architecture): not retried in this process.
fn failures() -> std::sync::MutexGuard<'static, HashMap<(String, String), HalError>> {
    static FAILURES: OnceLock<Mutex<HashMap<(String, String), HalError>>> = OnceLock::new();
    let m = FAILURES.get_or_init(|| Mutex::new(HashMap::new()));
    // A panic while holding it leaves a map that is still whole.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Compiles `src` (file name `name`) for `arch` with hiprtc `version` in the helper process; a
/// failure is remembered per (version, architecture) and not retried in this process.
///
/// # Errors
/// [`HalError::Unavailable`] without the helper; the compiler's log; a crash of the helper
/// naming the architecture and hiprtc's version.
pub fn compile_in_helper(src: &str, name: &str, arch: &str, version: &str) -> Result<Vec<u8>> {
    let key = (version.to_string(), arch.to_string());
    if let Some(e) = failures().get(&key) {
        return Err(e.clone());
    }
    let r = run_helper(src, name, arch, version);
    if let Err(e) = &r {
        failures().insert(key, e.clone());
    }
    r
}

/// A source file for the helper in the temporary directory, deleted when dropped.
struct SourceFile(PathBuf);

impl SourceFile {
    fn write(src: &str) -> Result<SourceFile> {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("unihal-hiprtc-{}-{n}.hip", std::process::id()));
        std::fs::write(&path, src).map_err(|e| HalError::Unavailable {
            what: HELPER.into(),
            reason: format!("writing the source to {}: {e}", path.display()),
        })?;
        Ok(SourceFile(path))
    }
}

impl Drop for SourceFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run_helper(src: &str, name: &str, arch: &str, version: &str) -> Result<Vec<u8>> {
    let helper = helper_path()?;
    let failed = |why: String| HalError::Vendor {
        library: "hiprtc".into(),
        call: format!("hiprtcCompileProgram (in {HELPER})"),
        code: -1,
        name: format!("compiling for {arch} failed"),
        message: format!("hiprtc {version} {why}"),
    };
    // The source goes in a file of its own, not a pipe: writing to a pipe whose reader crashed
    // raises SIGPIPE, which kills a host process that does not ignore it.
    let file = SourceFile::write(src)?;
    let mut child = Command::new(&helper)
        .args(["--arch", arch, "--name", name, "--source"])
        .arg(&file.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| HalError::Unavailable {
            what: HELPER.into(),
            reason: format!("{} cannot be started: {e}", helper.display()),
        })?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).map(|_| out)
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > HELPER_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!("did not finish within {HELPER_TIMEOUT:?}")));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(failed(format!("could not be waited for: {e}"))),
        }
    };
    let out = reader.join().ok().and_then(|r| r.ok()).unwrap_or_default();
    let log = err_reader.join().unwrap_or_default();
    if status.success() {
        return Ok(out);
    }
    use std::os::unix::process::ExitStatusExt;
    Err(match status.signal() {
        Some(sig) => failed(format!(
            "crashed (signal {sig}) compiling for {arch}: this hiprtc does not handle {arch}; \
             a newer ROCm or Hygon DTK's own hiprtc does{}",
            if log.trim().is_empty() {
                String::new()
            } else {
                format!(" ({})", log.trim())
            }
        )),
        None => failed(format!("failed: {}", log.trim())),
    })
}
