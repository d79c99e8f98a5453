//! Every `UNIHAL_*` environment variable: one table, and the one way to read and refuse them.
//!
//! A setting that is accepted silently is the worst kind of wrong: a user who typed
//! `UNIHAL_CPU_ISA=avx9000` or `UNIHAL_CCL_TIMEOUT=abc` believes the run honoured it. So every
//! variable a user may set is listed in [`SETTINGS`] with the values it accepts, and code reads
//! it through [`get`] and refuses a bad value with [`refuse`], whose error names the variable, the
//! value and what is accepted (the table's words). README.md's table of variables is
//! [`markdown_table`], checked by a test; another test checks that every `"UNIHAL_…"` name in the
//! sources is in the table, so a new variable cannot be added without its row.
//!
//! [`unknown_in_env`] finds `UNIHAL_*` variables that are set but not in the table (a misspelt
//! name is silently ignored otherwise); the `unihal` binary and [`crate::log`]'s users warn about
//! them.
//!
//! Thread-safety: everything here only reads the process environment.

use crate::error::{HalError, Invalid, Result};

/// Who sets a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// A user of unihal, at run time.
    User,
    /// A user of a simulated vendor runtime (`UNIHAL_SIM_*`).
    Simulator,
    /// A build of unihal (read by build scripts).
    Build,
    /// The test suites and CI only.
    Test,
}

/// One environment variable.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The variable's name; a trailing `*` stands for any suffix (`UNIHAL_TEST_*`).
    pub name: &'static str,
    /// What it accepts, in words that complete "expected …".
    pub accepted: &'static str,
    /// The value when unset.
    pub default: &'static str,
    /// What it does.
    pub meaning: &'static str,
    /// Who sets it.
    pub audience: Audience,
}

const fn s(
    name: &'static str,
    accepted: &'static str,
    default: &'static str,
    meaning: &'static str,
    audience: Audience,
) -> Setting {
    Setting {
        name,
        accepted,
        default,
        meaning,
        audience,
    }
}

use Audience::{Build, Simulator, Test, User};

/// Every `UNIHAL_*` variable, users' first.
pub const SETTINGS: &[Setting] = &[
    s("UNIHAL_LOG", "NONE, ERROR, WARN, INFO, DEBUG (or VERSION) or TRACE (or ALL), any case", "WARN", "log level, as NCCL_DEBUG", User),
    s("UNIHAL_LOG_SUBSYS", "a comma-separated list of INIT, BOOTSTRAP, COLL, ALLOC, PLUGIN, KERNEL, DEVICE, LAYER, ENV or ALL; a leading ^ excludes the list", "ALL", "which subsystems log at INFO and below, as NCCL_DEBUG_SUBSYS (warnings always show)", User),
    s("UNIHAL_LOG_FILE", "a file name; %h is replaced by the host name, %p by the process id", "standard error", "where the log goes, as NCCL_DEBUG_FILE", User),
    s("UNIHAL_BACKENDS", "a comma-separated list of backend names (cuda, hip, ascend, cpu or a plugin's)", "every registered backend", "which backends are used, in order of preference", User),
    s("UNIHAL_VALIDATE", "1 (or report), error, 0 (or off)", "0", "the validation layer: report misuse, or fail on it", User),
    s("UNIHAL_TRACE", "a file name (%r: the launcher's rank, %p: the process id)", "no trace", "write a timeline of every stream (Trace Event Format, for Perfetto) to this file when the program ends", User),
    s("UNIHAL_TRACE_MAX_EVENTS", "an integer of 1 or more", "2000000", "the most events a timeline keeps", User),
    s("UNIHAL_ALLOC_CONF", "comma-separated key:value pairs, as PYTORCH_CUDA_ALLOC_CONF (max_split_size_mb, memory_fraction)", "empty", "the caching allocator's settings", User),
    s("UNIHAL_MEMORY_SNAPSHOT", "a file name (%d: the device ordinal)", "no snapshot", "write the caching allocator's history in PyTorch's snapshot layout at exit", User),
    s("UNIHAL_CCL_TIMEOUT", "a number of seconds, at least 0.001", "300", "how long a collective may wait before it fails with a timeout", User),
    s("UNIHAL_CPU_DEVICES", "an integer in 1..=64", "4", "the CPU backend's number of virtual devices", User),
    s("UNIHAL_CPU_MEMORY", "a byte count such as 1073741824, 512M or 2G", "the host's memory divided among the devices", "each virtual CPU device's memory", User),
    s("UNIHAL_CPU_THREADS", "an integer in 1..=1024", "cores / devices", "compute threads per CPU device", User),
    s("UNIHAL_CPU_MATMUL", "gemm or dialect", "gemm", "the CPU backend's matmul code", User),
    s("UNIHAL_CPU_ISA", "base, avx2 or avx512, and available on this CPU", "the widest available", "the CPU kernels' instruction set", User),
    s("UNIHAL_CPU_CCL", "inprocess, mpi or gloo (mpi and gloo need their cargo features)", "mpi under mpirun, gloo under another launcher, else inprocess", "the CPU backend's collective engine", User),
    s("UNIHAL_PLUGIN_PATH", "a colon-separated list of absolute paths of plugin libraries or directories", "no plugins", "out-of-tree backends to load", User),
    s("UNIHAL_PLUGIN_REPLACE", "a comma-separated list of built-in backend names", "none", "built-in backends a plugin may replace", User),
    s("UNIHAL_KERNEL_CACHE", "a directory, or off", "$XDG_CACHE_HOME/unihal/kernels", "where compiled kernels are kept between runs", User),
    s("UNIHAL_CUDA_LIB", "a path to libcuda.so (or a simulated driver)", "the loader's search", "the CUDA driver to open", User),
    s("UNIHAL_NVRTC_LIB", "a path to libnvrtc.so", "the loader's search", "the NVRTC library to open", User),
    s("UNIHAL_NCCL_LIB", "a path to libnccl.so", "the loader's search", "the NCCL library to open", User),
    s("UNIHAL_HIP_LIB", "a path to libamdhip64.so (or a simulated runtime)", "the loader's search", "the HIP runtime to open", User),
    s("UNIHAL_HIPRTC_LIB", "a path to libhiprtc.so", "the loader's search", "the hiprtc library to open", User),
    s("UNIHAL_HIPRTC_HELPER", "a path to the unihal-hiprtc-helper program", "next to the running program", "the helper process for hiprtc compiles that abort", User),
    s("UNIHAL_RCCL_LIB", "a path to librccl.so", "the loader's search", "the RCCL library to open", User),
    s("UNIHAL_ROCBLAS_LIB", "a path to librocblas.so", "the loader's search", "the rocBLAS library to open", User),
    s("UNIHAL_ASCEND_LIB", "a directory holding the CANN libraries", "$ASCEND_HOME_PATH/lib64, then the loader's search", "where the Ascend libraries are", User),
    s("UNIHAL_ACL_LIB", "a path to libascendcl.so", "under UNIHAL_ASCEND_LIB", "the ACL runtime to open", User),
    s("UNIHAL_NNOPBASE_LIB", "a path to libnnopbase.so", "under UNIHAL_ASCEND_LIB", "the aclnn base library to open", User),
    s("UNIHAL_OPAPI_LIB", "a path to libopapi.so", "under UNIHAL_ASCEND_LIB", "the aclnn operator library to open", User),
    s("UNIHAL_HCCL_LIB", "a path to libhccl.so", "under UNIHAL_ASCEND_LIB", "the HCCL library to open", User),
    s("UNIHAL_CONFORMANCE_TIMEOUT_S", "a number of seconds, at least 0.001", "60", "the conformance suite's watchdog per case", User),
    s("UNIHAL_CONFORMANCE_REPORT", "a directory", "no report", "where `cargo test`'s conformance trials write their report", User),
    s("UNIHAL_CONFORMANCE_ISOLATE", "1 or 0 (or true, false, yes, no, on, off)", "0", "run each conformance case in its own process", User),
    s("UNIHAL_CONFORMANCE_VERIFY", "1 or 0 (or true, false, yes, no, on, off)", "0", "fail on an unexpected pass of a case the manifest marks xfail", User),
    s("UNIHAL_PROGRESS", "0 (or off, false, no), plain, or 1 (or on, true, yes, auto)", "auto: a line redrawn on a terminal, plain lines every 10 s elsewhere", "the conformance run's progress on standard error", User),
    s("UNIHAL_GPT_BACKEND", "a backend name", "the preferred backend", "the backend of the GPT example's tests", User),
    s("UNIHAL_GRAPH_BACKEND", "a backend name", "cpu", "the backend of the captured training step's test (tests/all/graph_step.rs)", User),
    s("UNIHAL_SOCKET_IFNAME", "interface-name prefixes, comma-separated (^ excludes, = exact), as NCCL_SOCKET_IFNAME", "unset: the host name's address", "the network interface the gloo engine's sockets use (GLOO_SOCKET_IFNAME wins); logged at bootstrap", User),
    s("UNIHAL_SIM_MODE", "deferred, eager or concurrent", "deferred", "how a simulated GPU runtime runs device work", Simulator),
    s("UNIHAL_SIM_DEVICES", "an integer of 1 or more", "2", "a simulated runtime's number of devices", Simulator),
    s("UNIHAL_SIM_MEMORY", "an integer number of bytes", "8589934592 (8 GiB)", "each simulated device's memory", Simulator),
    s("UNIHAL_SIM_WATCHDOG_MS", "an integer number of milliseconds", "60000", "how long simulated device work may block before it faults", Simulator),
    s("UNIHAL_SIM_NODE", "a name", "the host name", "the node a simulated runtime's process is on (two ranks of one node may not share a device)", Simulator),
    s("UNIHAL_SIM_NCCL_FLAVOR", "nccl or rccl", "nccl", "which library the simulated collectives behave as", Simulator),
    s("UNIHAL_SIM_NCCL_CALL_US", "an integer number of microseconds", "0", "a simulated collective call's host latency", Simulator),
    s("UNIHAL_SIM_SOC", "Ascend910B2 or Ascend910A", "Ascend910B2", "the chip the simulated CANN stack reports", Simulator),
    s("UNIHAL_SIM_HIP_ARCH", "gfx90a or gfx906", "gfx90a", "the architecture the simulated HIP runtime reports", Simulator),
    s("UNIHAL_SIM_HIP_NUMBERING", "rocm5 or legacy", "rocm5", "the attribute numbering the simulated HIP runtime speaks", Simulator),
    s("UNIHAL_SIM_FAIL", "a fault plan (see conformance/sim/src/fault.rs)", "no faults", "vendor calls a simulated runtime fails, for fault tests", Simulator),
    s("UNIHAL_KERNELS_BUILD_CACHE", "a directory", "no cache", "where builds keep the CPU kernel library's archives", Build),
    s("UNIHAL_HIP_INCLUDE", "a directory", "/usr/include", "HIP headers for the ABI check", Build),
    s("UNIHAL_GLOO_PREFIX", "a directory", "/usr", "where gloo is installed (feature gloo)", Build),
    s("UNIHAL_TORCH_NPU_INCLUDE", "a directory", "found in the torch-npu wheel", "ACL and HCCL headers for the ABI check", Build),
    s("UNIHAL_BUILD_*", "set by build.rs", "", "build information compiled into the binary", Build),
    s("UNIHAL_KERNELS_LIB_*", "set by the kernels' build script", "", "the kernel library's archives, for its tests", Build),
    s("UNIHAL_MYCHIP_LIB", "a path", "the loader's search", "the porting template's runtime (backends/null)", Test),
    s("UNIHAL_TEST_*", "set by .ci/run", "", "components the tests require in CI (a test fails, not skips, when one is set and missing)", Test),
    s("UNIHAL_DYNLIB_TEST_*", "set by the dynlib tests", "", "the loader's tests", Test),
    s("UNIHAL_ABI_TEST_*", "set by the ABI tests", "", "the ABI checks' tests", Test),
    s("UNIHAL_PYTHON", "a Python interpreter", "python3", "the Python of the numpy/DLPack tests", Test),
    s("UNIHAL_TORCH_PYTHON", "a Python interpreter with torch", "none", "the Python of the tests against PyTorch", Test),
    s("UNIHAL_MPIRUN", "an mpirun program", "mpirun", "the launcher of the MPI tests", Test),
    s("UNIHAL_TORCHRUN", "a torchrun program", "torchrun", "the launcher of the torchrun tests", Test),
    s("UNIHAL_BLESS", "1", "0", "rewrite the golden files of the tests that have them", Test),
    s("UNIHAL_SWEEP_*", "set by the fault-sweep tests", "", "limits of the fault sweeps", Test),
    s("UNIHAL_STRESS_OPS", "an integer", "the test's default", "operations per stress test", Test),
    s("UNIHAL_RTC_ARCHS", "architectures, comma-separated", "all", "what the real-compiler gates compile for", Test),
    s("UNIHAL_CI_SLICE", "all, or a submission number", ".ci/submission", "which slices of CI's rotated matrices run", Test),
    s("UNIHAL_TORCH_VENV", "a directory", "~/.cache/unihal/venv-torch-2.15.0", "PyTorch's venv of .ci/run and its scripts", Test),
    s("UNIHAL_FUZZ_PLANTED", "1", "0", "plant a bug for the fuzzers to find", Test),
    s("UNIHAL_OWN_PROCESS_CHILD", "set by tests/support/isolation.rs", "", "marks the child process of a test that runs in a process of its own", Test),
    s("UNIHAL_CONFORMANCE_CHILD", "set by the conformance runner", "", "marks an isolated case's child process", Test),
    s("UNIHAL_SIM_CCL_TEST_CHILD", "set by conformance/sim/tests/all/ccl_processes.rs", "", "the scenario, rank and unique id of a child rank process", Test),
    s("UNIHAL_SIM_CCL_TEST_POSTED", "set by conformance/sim/tests/all/ccl_processes.rs", "", "the file a child rank writes once its part is posted", Test),
];

/// The table's row for `name` (a `*` row matches any suffix).
pub fn lookup(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| match s.name.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => s.name == name,
    })
}

/// The value of `name`, trimmed; `None` when unset or blank (an empty variable is unset).
/// Debug builds assert that `name` is in [`SETTINGS`].
pub fn get(name: &'static str) -> Option<String> {
    debug_assert!(
        lookup(name).is_some(),
        "{name} is not in settings::SETTINGS"
    );
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The error for a value of `name` that cannot be honoured: [`HalError::InvalidArgument`] naming
/// the variable, the value and what the table says it accepts.
pub fn refuse(name: &'static str, value: &str) -> HalError {
    let accepted = lookup(name).map_or("a value listed in README.md", |s| s.accepted);
    refuse_with(name, value, accepted)
}

/// As [`refuse`], with the accepted values in other words (a range known only at run time).
pub fn refuse_with(name: &'static str, value: &str, accepted: impl Into<String>) -> HalError {
    HalError::invalid(
        name,
        Invalid::Value {
            value: format!("{name}={value:?}"),
            accepted: accepted.into(),
        },
    )
}

/// `name` parsed by `parse`: `Ok(None)` when unset, the [`refuse`] error when `parse` says no.
///
/// # Errors
/// [`HalError::InvalidArgument`] naming the variable.
pub fn parse<T>(name: &'static str, parse: impl FnOnce(&str) -> Option<T>) -> Result<Option<T>> {
    match get(name) {
        None => Ok(None),
        Some(v) => parse(&v).map(Some).ok_or_else(|| refuse(name, &v)),
    }
}

/// A timeout in seconds: a finite number of at least 0.001 (a shorter timeout cannot work:
/// [`crate::deadline::MIN_TIMEOUT`]), as a duration; one longer than a `Duration` holds is
/// `Duration::MAX`, which [`crate::deadline::after`] makes no deadline. `None` for anything else.
pub fn seconds(v: &str) -> Option<std::time::Duration> {
    let min = crate::deadline::MIN_TIMEOUT.as_secs_f64();
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= min)
        .map(|s| std::time::Duration::try_from_secs_f64(s).unwrap_or(std::time::Duration::MAX))
}

/// A yes/no switch: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case).
pub fn switch(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `UNIHAL_*` variables set in the environment that are not in [`SETTINGS`], each with a
/// suggestion when a listed name is close (a misspelling).
pub fn unknown_in_env() -> Vec<String> {
    let mut out = Vec::new();
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if !k.starts_with("UNIHAL_") || lookup(k).is_some() {
            continue;
        }
        let near = SETTINGS
            .iter()
            .filter(|s| !s.name.ends_with('*'))
            .map(|s| (distance(k, s.name), s.name))
            .min();
        out.push(match near {
            Some((d, n)) if d <= 3 => format!("{k} is not a unihal variable (did you mean {n}?)"),
            _ => format!("{k} is not a unihal variable (README.md lists them)"),
        });
    }
    out.sort();
    out
}

/// Levenshtein distance, for [`unknown_in_env`]'s suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// README.md's table of the variables users and simulator users set (build and test variables
/// are listed in docs/RELIABILITY.md's CI section, not here).
pub fn markdown_table() -> String {
    let mut t =
        String::from("| variable | accepts | default | what it does |\n|---|---|---|---|\n");
    for st in SETTINGS
        .iter()
        .filter(|s| matches!(s.audience, User | Simulator))
    {
        t.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            st.name, st.accepted, st.default, st.meaning
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_unique_and_complete() {
        for (i, a) in SETTINGS.iter().enumerate() {
            assert!(a.name.starts_with("UNIHAL_"), "{}", a.name);
            assert!(
                !a.accepted.is_empty() && !a.meaning.is_empty(),
                "{}",
                a.name
            );
            for b in &SETTINGS[i + 1..] {
                assert_ne!(a.name, b.name);
            }
        }
    }

    #[test]
    fn lookup_matches_names_and_prefixes() {
        assert_eq!(lookup("UNIHAL_LOG").unwrap().name, "UNIHAL_LOG");
        assert_eq!(lookup("UNIHAL_TEST_NUMPY").unwrap().name, "UNIHAL_TEST_*");
        assert!(lookup(concat!("UNIHAL_", "LOGG")).is_none());
    }

    #[test]
    fn a_refusal_names_the_variable_the_value_and_what_is_accepted() {
        let e = refuse("UNIHAL_CPU_DEVICES", "abc").to_string();
        assert!(e.contains("UNIHAL_CPU_DEVICES=\"abc\""), "{e}");
        assert!(e.contains("expected an integer in 1..=64"), "{e}");
    }

    #[test]
    fn seconds_refuse_negative_zero_nan_and_words() {
        for bad in ["-1", "0", "nan", "inf", "abc", ""] {
            assert_eq!(seconds(bad), None, "{bad}");
        }
        assert_eq!(
            seconds(" 2.5 "),
            Some(std::time::Duration::from_millis(2500))
        );
    }

    #[test]
    fn misspellings_are_suggested() {
        assert_eq!(distance(concat!("UNIHAL_", "LOGG"), "UNIHAL_LOG"), 1);
        assert_eq!(
            distance(concat!("UNIHAL_", "CPU_DEVICE"), "UNIHAL_CPU_DEVICES"),
            1
        );
        assert_eq!(distance("abc", "abc"), 0);
    }
}
