//! Opening CANN at run time: the ACL runtime, the descriptor library (`libnnopbase.so`) and the
//! operator libraries, never unloaded; HCCL is opened by the collective engine on first use
//! ([`candidates`] with [`Role::Hccl`]).
//!
//! Where ([`candidates`]): a library's own override variable alone when set
//! (`UNIHAL_ACL_LIB`, `UNIHAL_NNOPBASE_LIB`, `UNIHAL_OPAPI_LIB` (a `:`-separated list of
//! operator libraries), `UNIHAL_HCCL_LIB`); else, when `UNIHAL_ASCEND_LIB` names a CANN `lib64`
//! directory, that directory alone; else the directory the runtime was found in, the names
//! through the system loader (`LD_LIBRARY_PATH`, as CANN's `set_env.sh` sets it), then
//! `$ASCEND_TOOLKIT_HOME/lib64`, `$ASCEND_HOME_PATH/lib64`,
//! `/usr/local/Ascend/ascend-toolkit/latest/lib64` and `/usr/local/Ascend/cann/lib64`.
//!
//! Both layouts: the classic one (`libascendcl.so`, one `libopapi.so`) and the split one of
//! recent CANN (`libacl_rt.so`, an operator library per package: `libopapi_math.so`,
//! `libopapi_nn.so`, ...). Operators are resolved as torch_npu's op-plugin does: every
//! `libopapi_*.so` of the runtime's directory, then `libopapi.so`; each symbol from the first
//! library that has it. `ASCEND_RT_VISIBLE_DEVICES` is the runtime's business: the backend
//! counts what `aclrtGetDeviceCount` reports.
//!
//! `aclInit` runs once per process (an "already initialised" answer is success) and
//! `aclFinalize` never: ACL cannot be initialised again in a process once finalised, and
//! devices and memory may outlive every handle of ours until exit.

use crate::conv::{codes, error_name};
use crate::ffi::acl::AclApi;
use crate::ffi::aclnn::AclnnApi;
use crate::ffi::nnopbase::NnopApi;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use unihal_dynlib::{mapped_file, Attempt, Candidates, Library};
use unihal_hal::{HalError, Result};

/// One CANN library the backend opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The ACL runtime (`libascendcl.so`; split layout `libacl_rt.so`).
    Runtime,
    /// The descriptor API (`libnnopbase.so`).
    Nnopbase,
    /// The classic single operator library (`libopapi.so`).
    Opapi,
    /// HCCL (`libhccl.so`).
    Hccl,
}

impl Role {
    /// What it is, for messages.
    pub fn what(self) -> &'static str {
        match self {
            Role::Runtime => "ACL runtime",
            Role::Nnopbase => "aclnn descriptor library (nnopbase)",
            Role::Opapi => "aclnn operator library",
            Role::Hccl => "HCCL",
        }
    }

    /// Its override variable.
    pub fn env(self) -> &'static str {
        match self {
            Role::Runtime => "UNIHAL_ACL_LIB",
            Role::Nnopbase => "UNIHAL_NNOPBASE_LIB",
            Role::Opapi => "UNIHAL_OPAPI_LIB",
            Role::Hccl => "UNIHAL_HCCL_LIB",
        }
    }

    /// Its file names, in order.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Role::Runtime => &["libascendcl.so", "libacl_rt.so"],
            Role::Nnopbase => &["libnnopbase.so"],
            Role::Opapi => &["libopapi.so"],
            Role::Hccl => &["libhccl.so"],
        }
    }
}

/// The directory named by `UNIHAL_ASCEND_LIB`, when set.
pub const ASCEND_LIB_ENV: &str = "UNIHAL_ASCEND_LIB";

fn env_dir(var: &str) -> Option<PathBuf> {
    std::env::var(var)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| PathBuf::from(s.trim()))
}

/// The install roots' `lib64` directories, in order (see the module docs).
pub fn install_dirs() -> Vec<PathBuf> {
    if let Some(d) = env_dir(ASCEND_LIB_ENV) {
        return vec![d];
    }
    let mut dirs: Vec<PathBuf> = ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"]
        .iter()
        .filter_map(|v| env_dir(v).map(|d| d.join("lib64")))
        .collect();
    dirs.push("/usr/local/Ascend/ascend-toolkit/latest/lib64".into());
    dirs.push("/usr/local/Ascend/cann/lib64".into());
    dirs.dedup();
    dirs
}

/// Where library `role` is looked for: `near` (the runtime's directory) first when given.
pub fn candidates(role: Role, near: Option<&Path>) -> Candidates {
    let mut names: Vec<String> = Vec::new();
    let mut add = |p: String| {
        if !names.contains(&p) {
            names.push(p);
        }
    };
    if let Some(d) = near {
        for n in role.names() {
            add(d.join(n).to_string_lossy().into_owned());
        }
    }
    let dirs = install_dirs();
    if env_dir(ASCEND_LIB_ENV).is_none() {
        for n in role.names() {
            add(n.to_string());
        }
    }
    for d in dirs {
        for n in role.names() {
            add(d.join(n).to_string_lossy().into_owned());
        }
    }
    Candidates {
        what: role.what().into(),
        env: role.env().into(),
        names,
    }
}

/// The opened CANN stack: symbol tables and what the probe found. One per process
/// ([`cann`]); `Send + Sync` (function pointers and plain values).
pub struct Cann {
    pub acl: AclApi,
    pub nnop: NnopApi,
    pub aclnn: AclnnApi,
    /// Where the runtime was opened from.
    pub runtime_path: String,
    /// `classic` (`libascendcl.so`) or `split` (`libacl_rt.so`).
    pub layout: &'static str,
    /// The runtime's directory (where the other libraries are looked for first).
    pub lib64: Option<PathBuf>,
    /// `libnnopbase.so`'s path.
    pub nnopbase_path: String,
    /// The operator libraries opened, in resolution order.
    pub opapi_paths: Vec<String>,
    /// Devices reported by `aclrtGetDeviceCount`.
    pub devices: usize,
    /// `aclrtGetSocName`, verbatim.
    pub soc: String,
    /// Whether it is unihal's simulated runtime ([`unihal_dynlib::Library::identity`]).
    pub identity: unihal_dynlib::Identity,
}

fn unavailable(reason: String) -> HalError {
    HalError::Unavailable {
        what: "Ascend (CANN)".into(),
        reason,
    }
}

/// The operator libraries: `UNIHAL_OPAPI_LIB`'s list when set; else every `libopapi_*.so` of
/// `dir` (sorted) then `libopapi.so` (in `dir`, else through the candidates).
fn open_opapi(dir: Option<&Path>) -> Result<Vec<Library>> {
    let role = Role::Opapi;
    let one = |name: &str| {
        Library::open(&Candidates {
            what: role.what().into(),
            env: String::new(),
            names: vec![name.to_string()],
        })
    };
    if let Some(list) = std::env::var(role.env())
        .ok()
        .filter(|s| !s.trim().is_empty())
    {
        return list.split(':').filter(|s| !s.is_empty()).map(one).collect();
    }
    let mut libs = Vec::new();
    let mut tried: Vec<Attempt> = Vec::new();
    if let Some(dir) = dir {
        let mut split: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("libopapi_") && n.ends_with(".so"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        split.sort();
        for p in split {
            match Library::open_with_attempts(&Candidates {
                what: role.what().into(),
                env: String::new(),
                names: vec![p.to_string_lossy().into_owned()],
            }) {
                Ok(l) => libs.push(l),
                Err(t) => tried.extend(t),
            }
        }
    }
    match Library::open_with_attempts(&candidates(role, dir)) {
        Ok(l) => libs.push(l),
        Err(t) => tried.extend(t),
    }
    if libs.is_empty() {
        let c = candidates(role, dir);
        return Err(HalError::Unavailable {
            what: role.what().into(),
            reason: unihal_dynlib::missing_reason(&c, &tried),
        });
    }
    Ok(libs)
}

fn open() -> Result<Cann> {
    let rt = Library::open(&candidates(Role::Runtime, None))?;
    let acl = AclApi::new(&rt)?;
    let runtime_path = rt.path().to_string();
    let file = mapped_file(acl.init as usize).unwrap_or_else(|| runtime_path.clone());
    let lib64 = Path::new(&file).parent().map(Path::to_path_buf);
    let layout = if Path::new(&file)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("libacl_rt"))
    {
        "split"
    } else {
        "classic"
    };
    let nnop_lib = Library::open(&candidates(Role::Nnopbase, lib64.as_deref()))?;
    let nnop = NnopApi::new(&nnop_lib)?;
    let op_libs = open_opapi(lib64.as_deref())?;
    let aclnn = AclnnApi::resolve(&op_libs);
    let at = format!("CANN ({layout} layout) from {file}");
    let _ = FOUND.set(file.clone());
    // SAFETY: NULL is documented as "no configuration file".
    let rc = unsafe { (acl.init)(std::ptr::null()) };
    if rc != 0 && rc != codes::REPEAT_INITIALIZE {
        return Err(unavailable(format!(
            "aclInit failed with {} ({rc}) ({at})",
            error_name(rc)
        )));
    }
    let mut count = 0u32;
    // SAFETY: an out-pointer to a local.
    let rc = unsafe { (acl.get_device_count)(&mut count) };
    if rc == codes::RT_NO_DEVICE || (rc == 0 && count == 0) {
        return Err(unavailable(format!(
            "no device: the runtime counts none ({at})"
        )));
    }
    if rc != 0 {
        return Err(unavailable(format!(
            "aclrtGetDeviceCount failed with {} ({rc}) ({at})",
            error_name(rc)
        )));
    }
    // SAFETY: no arguments; a static NUL-terminated string (or NULL).
    let soc = unsafe { unihal_dynlib::c_str((acl.get_soc_name)()) };
    tracing::info!(target: "unihal::init", "{at}: {count} device(s), SoC {soc:?}, {} operator entry points", aclnn.resolved());
    Ok(Cann {
        acl,
        nnop,
        aclnn,
        runtime_path: file,
        layout,
        lib64,
        nnopbase_path: nnop_lib.path().to_string(),
        opapi_paths: op_libs.iter().map(|l| l.path().to_string()).collect(),
        devices: count as usize,
        soc,
        identity: rt.identity(),
    })
}

/// The runtime library that loaded, whether or not it has a device.
static FOUND: OnceLock<String> = OnceLock::new();

/// The runtime file found by [`cann`], also when it reported no device.
pub fn found() -> Option<&'static String> {
    let _ = cann();
    FOUND.get()
}

/// The CANN stack, opened once per process.
///
/// # Errors
/// [`HalError::Unavailable`] with what was tried and why it failed (also on later calls).
pub fn cann() -> Result<&'static Cann> {
    static CANN: OnceLock<Result<Cann>> = OnceLock::new();
    CANN.get_or_init(open).as_ref().map_err(Clone::clone)
}
