//! Shared by the tests that run the Ascend backend's HCCL engine on the simulated CANN stack
//! (`unihal-sim-cann`, built next to the tests).
#![allow(dead_code)] // each test uses what it needs

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use unihal_ascend::AscendBackend;
use unihal_hal::{Backend, Buffer, CommConfig, Communicator, DType, Device, Stream};
use unihal_sim_cann::layout::{self, Layout};

/// The simulated CANN install of this test binary (the classic layout under a directory of its
/// own): its `lib64`.
pub fn lib64() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = std::env::temp_dir().join(format!(
            "unihal-ascend-hccl-{}-{}",
            std::process::id(),
            std::env::current_exe()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default()
        ));
        layout::make(&root, Layout::Classic, &unihal_sim_cann::built_library())
            .expect("the simulated CANN install")
    })
}

/// The backend on the simulated CANN stack with four devices and the simulator settings `env`
/// (set before the runtime loads; each test binary loads it once, so every call of one binary
/// must pass the same settings).
pub fn simulated(env: &[(&str, &str)]) -> Arc<AscendBackend> {
    static BACKEND: OnceLock<Arc<AscendBackend>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            std::env::set_var("UNIHAL_ASCEND_LIB", lib64());
            std::env::set_var("UNIHAL_SIM_DEVICES", "4");
            for (k, v) in env {
                std::env::set_var(k, v);
            }
            Arc::new(AscendBackend::new())
        })
        .clone()
}

/// Devices `0..n`.
pub fn devices(b: &AscendBackend, n: usize) -> Vec<Arc<dyn Device>> {
    (0..n).map(|i| b.open(i).unwrap()).collect()
}

/// `n` ranks made by `init_all` with `timeout`, on devices `0..n`.
pub fn ranks(b: &AscendBackend, n: usize, timeout: Duration) -> Vec<Arc<dyn Communicator>> {
    let ccl = b.collectives().expect("the simulated HCCL loads");
    ccl.init_all(
        &devices(b, n),
        &CommConfig {
            timeout: Some(timeout),
        },
    )
    .unwrap()
}

/// Runs `body(rank)` for every communicator on a thread of its own, each with a stream of its
/// device; returns the results in rank order.
pub fn each<T: Send>(
    comms: &[Arc<dyn Communicator>],
    body: impl Fn(&Arc<dyn Communicator>, &Arc<dyn Stream>) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let body = &body;
                sc.spawn(move || {
                    let s = c.device().create_stream().unwrap();
                    body(c, &s)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `v` in `d` (f32, f16, i32, i64 or u8).
pub fn encode(d: DType, v: &[f64]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match d {
            DType::F32 => (x as f32).to_le_bytes().to_vec(),
            DType::F16 => half::f16::from_f64(x).to_le_bytes().to_vec(),
            DType::Bf16 => half::bf16::from_f64(x).to_le_bytes().to_vec(),
            DType::I32 => (x as i32).to_le_bytes().to_vec(),
            DType::I64 => (x as i64).to_le_bytes().to_vec(),
            DType::U8 => vec![x as u8],
            other => panic!("no test encoding for {other}"),
        })
        .collect()
}

/// The inverse of [`encode`].
pub fn decode(d: DType, b: &[u8]) -> Vec<f64> {
    b.chunks(d.size())
        .map(|c| match d {
            DType::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::F16 => half::f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            DType::Bf16 => half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            DType::I32 => i32::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::U8 => c[0] as f64,
            other => panic!("no test encoding for {other}"),
        })
        .collect()
}

/// A buffer of `dev` holding `v` in `d`.
pub fn upload(dev: &Arc<dyn Device>, s: &Arc<dyn Stream>, d: DType, v: &[f64]) -> Buffer {
    let bytes = encode(d, v);
    let b = dev.alloc(bytes.len().max(1)).unwrap();
    s.write(&b, 0, &bytes).unwrap();
    b
}

/// `b` read back (after the stream's work) as `d`.
pub fn download(s: &Arc<dyn Stream>, d: DType, b: &Buffer) -> Vec<f64> {
    let mut out = vec![0u8; b.len() as usize];
    s.read(b, 0, &mut out).unwrap();
    decode(d, &out)
}

/// The simulator's test controls and HCCL's own entry points, called in the copy of the
/// simulated stack the backend loaded (the same files: the loader hands back the same copy).
pub mod sim {
    use std::ffi::{c_char, c_int, c_uint, c_void, CString};
    use std::sync::OnceLock;
    use unihal_dynlib::{Candidates, Library};

    fn open(name: &str) -> Library {
        Library::open(&Candidates {
            what: name.into(),
            env: String::new(),
            names: vec![super::lib64().join(name).to_string_lossy().into_owned()],
        })
        .unwrap()
    }

    fn core() -> &'static Library {
        static LIB: OnceLock<Library> = OnceLock::new();
        LIB.get_or_init(|| open("libunihal_sim_cann.so"))
    }

    fn hccl() -> &'static Library {
        static LIB: OnceLock<Library> = OnceLock::new();
        LIB.get_or_init(|| open("libhccl.so"))
    }

    /// The calling thread's `n`th call (from now) of entry point `name` returns `code`.
    pub fn fail(name: &str, n: u32, code: i32) {
        let name = CString::new(name).unwrap();
        // SAFETY: the signature of `unihal_sim_fail`; a NUL-terminated name.
        let r = unsafe {
            let f: unsafe extern "C" fn(*const c_char, c_uint, c_int) -> c_int =
                core().get("unihal_sim_fail").unwrap();
            f(name.as_ptr(), n, code)
        };
        assert_eq!(r, 0);
    }

    /// Disarms the calling thread's injected failures.
    pub fn clear() {
        // SAFETY: the signature of `unihal_sim_fail_clear`.
        unsafe {
            let f: unsafe extern "C" fn() = core().get("unihal_sim_fail_clear").unwrap();
            f()
        }
    }

    /// `HcclGetRankSize` of the communicator at address `comm`: Ok(size) or the HCCL code
    /// (`HCCL_E_PTR` = 2 once it was destroyed).
    pub fn rank_size(comm: usize) -> Result<u32, i32> {
        let mut n = 0u32;
        // SAFETY: the signature of `HcclGetRankSize`; the simulated HCCL looks the handle up in
        // its table (an unknown one is an error, never dereferenced).
        let code = unsafe {
            let f: unsafe extern "C" fn(*mut c_void, *mut u32) -> i32 =
                hccl().get("HcclGetRankSize").unwrap();
            f(comm as *mut c_void, &mut n)
        };
        if code == 0 {
            Ok(n)
        } else {
            Err(code)
        }
    }
}

/// The HCCL handle of `comm` (0 once given up).
pub fn native(comm: &Arc<dyn Communicator>) -> usize {
    comm.as_any()
        .downcast_ref::<unihal_ascend::ccl::HcclComm>()
        .expect("an HCCL communicator")
        .native()
}

/// Waits up to `limit` for `f` to hold.
pub fn eventually(limit: Duration, f: impl Fn() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}
