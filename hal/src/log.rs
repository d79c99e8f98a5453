//! Logging settings, spelled as NCCL's are: `UNIHAL_LOG` (as `NCCL_DEBUG`: `WARN`, `INFO`,
//! `TRACE`), `UNIHAL_LOG_SUBSYS` (as `NCCL_DEBUG_SUBSYS`) and `UNIHAL_LOG_FILE` (as
//! `NCCL_DEBUG_FILE`, with `%h` and `%p`), and the line prefix NCCL users already read:
//! `host:pid:tid [rank] unihal LEVEL SUBSYS message`.
//!
//! The HAL and the backends emit `tracing` events whose target is a [`Subsystem`]'s
//! ([`Subsystem::target`], e.g. `unihal::coll`); the application (or the `unihal` binary, through
//! `unihal::init_logging`) installs a subscriber. This module only parses and formats: it holds no
//! subscriber, so a framework with its own logging keeps it.
//!
//! Thread-safety: the rank ([`set_rank`]) is a process-wide atomic; everything else is pure.

use crate::error::Result;
use crate::settings;
use std::sync::atomic::{AtomicI64, Ordering};

/// Environment variable holding the log level.
pub const LOG_ENV: &str = "UNIHAL_LOG";
/// Environment variable holding the subsystem filter.
pub const SUBSYS_ENV: &str = "UNIHAL_LOG_SUBSYS";
/// Environment variable holding the log file's name.
pub const FILE_ENV: &str = "UNIHAL_LOG_FILE";

/// Maps a `UNIHAL_LOG` value to a `tracing` filter directive (`off`, `error`, `warn`, `info`,
/// `debug`, `trace`); unset or blank gives `warn`.
///
/// # Errors
/// [`crate::HalError::InvalidArgument`] naming `UNIHAL_LOG` for any other value.
pub fn filter_directive(value: Option<&str>) -> Result<&'static str> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok("warn");
    };
    Ok(match v.to_ascii_uppercase().as_str() {
        "NONE" | "OFF" | "0" => "off",
        "ERROR" => "error",
        "WARN" => "warn",
        "INFO" => "info",
        "DEBUG" | "VERSION" => "debug",
        "TRACE" | "ALL" => "trace",
        _ => return Err(settings::refuse(LOG_ENV, v)),
    })
}

/// [`filter_directive`] of the current `UNIHAL_LOG`.
///
/// # Errors
/// As [`filter_directive`].
pub fn filter_directive_from_env() -> Result<&'static str> {
    filter_directive(settings::get(LOG_ENV).as_deref())
}

/// What a log line is about; `UNIHAL_LOG_SUBSYS` chooses among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsystem {
    /// Backends found, libraries opened, devices opened, versions.
    Init,
    /// Launchers, stores, addresses: how the processes of a job meet.
    Bootstrap,
    /// Communicators and collectives: creation, abort, timeouts.
    Coll,
    /// The caching allocator.
    Alloc,
    /// Plugins loaded or refused.
    Plugin,
    /// Kernel libraries and compilers.
    Kernel,
    /// Streams, events and memory of a device.
    Device,
    /// The validation and tracing layer.
    Layer,
    /// Settings read from the environment.
    Env,
}

impl Subsystem {
    /// Every subsystem.
    pub const ALL: [Subsystem; 9] = [
        Subsystem::Init,
        Subsystem::Bootstrap,
        Subsystem::Coll,
        Subsystem::Alloc,
        Subsystem::Plugin,
        Subsystem::Kernel,
        Subsystem::Device,
        Subsystem::Layer,
        Subsystem::Env,
    ];

    /// Its name in `UNIHAL_LOG_SUBSYS` and in log lines (`INIT`, `COLL`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Subsystem::Init => "INIT",
            Subsystem::Bootstrap => "BOOTSTRAP",
            Subsystem::Coll => "COLL",
            Subsystem::Alloc => "ALLOC",
            Subsystem::Plugin => "PLUGIN",
            Subsystem::Kernel => "KERNEL",
            Subsystem::Device => "DEVICE",
            Subsystem::Layer => "LAYER",
            Subsystem::Env => "ENV",
        }
    }

    /// The `tracing` target its events use.
    pub fn target(self) -> &'static str {
        match self {
            Subsystem::Init => "unihal::init",
            Subsystem::Bootstrap => "unihal::bootstrap",
            Subsystem::Coll => "unihal::coll",
            Subsystem::Alloc => "unihal::alloc",
            Subsystem::Plugin => "unihal::plugin",
            Subsystem::Kernel => "unihal::kernel",
            Subsystem::Device => "unihal::device",
            Subsystem::Layer => "unihal::layer",
            Subsystem::Env => "unihal::env",
        }
    }

    /// The subsystem of an event's target: [`Subsystem::target`]'s, or a crate's module path
    /// (`unihal_cpu::ccl::…` is COLL, `unihal_launch::…` BOOTSTRAP, other unihal crates DEVICE);
    /// `None` for targets outside unihal.
    pub fn of_target(target: &str) -> Option<Subsystem> {
        if let Some(s) = Subsystem::ALL.iter().find(|s| target == s.target()) {
            return Some(*s);
        }
        let crate_name = target.split("::").next().unwrap_or(target);
        if !crate_name.starts_with("unihal") {
            return None;
        }
        Some(if target.contains("::ccl") {
            Subsystem::Coll
        } else if crate_name == "unihal_launch" || target.contains("bootstrap") {
            Subsystem::Bootstrap
        } else if crate_name == "unihal_alloc" {
            Subsystem::Alloc
        } else if crate_name == "unihal_plugin" {
            Subsystem::Plugin
        } else if crate_name == "unihal_kernels" {
            Subsystem::Kernel
        } else if crate_name == "unihal_layer" {
            Subsystem::Layer
        } else {
            Subsystem::Device
        })
    }
}

/// The subsystems `UNIHAL_LOG_SUBSYS` lets through at INFO and below (warnings and errors pass
/// whatever it says, as NCCL's do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubsysMask(u16);

impl SubsysMask {
    /// Every subsystem (the default).
    pub const ALL: SubsysMask = SubsysMask(u16::MAX);

    /// Parses `INIT,COLL` or `^ALLOC,DEVICE` (a leading `^` excludes the list), any case;
    /// unset or blank is [`SubsysMask::ALL`].
    ///
    /// # Errors
    /// [`crate::HalError::InvalidArgument`] naming `UNIHAL_LOG_SUBSYS` for an unknown name.
    pub fn parse(value: Option<&str>) -> Result<SubsysMask> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(SubsysMask::ALL);
        };
        let (invert, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let mut bits = 0u16;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let upper = name.to_ascii_uppercase();
            if upper == "ALL" {
                bits = u16::MAX;
                continue;
            }
            let s = Subsystem::ALL
                .iter()
                .find(|s| s.name() == upper)
                .ok_or_else(|| settings::refuse(SUBSYS_ENV, v))?;
            bits |= 1 << *s as u16;
        }
        Ok(SubsysMask(if invert { !bits } else { bits }))
    }

    /// [`SubsysMask::parse`] of the current `UNIHAL_LOG_SUBSYS`.
    ///
    /// # Errors
    /// As [`SubsysMask::parse`].
    pub fn from_env() -> Result<SubsysMask> {
        SubsysMask::parse(settings::get(SUBSYS_ENV).as_deref())
    }

    /// True when `s` logs at INFO and below.
    pub fn contains(self, s: Subsystem) -> bool {
        self.0 & (1 << s as u16) != 0
    }
}

/// `UNIHAL_LOG_FILE`'s pattern with `%h` replaced by `host`, `%p` by `pid` and `%%` by `%`
/// (as `NCCL_DEBUG_FILE`).
pub fn file_name(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

static RANK: AtomicI64 = AtomicI64::new(i64::MIN);

/// Sets the rank log lines carry (the bootstrap calls it once it knows the process's rank).
pub fn set_rank(rank: usize) {
    RANK.store(rank as i64, Ordering::Relaxed);
}

/// The rank log lines carry: the one [`set_rank`] set, else the launcher's (`RANK`,
/// `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`), else `None` (one process, any number
/// of devices).
pub fn rank() -> Option<usize> {
    let r = RANK.load(Ordering::Relaxed);
    if r >= 0 {
        return Some(r as usize);
    }
    if r == i64::MIN {
        let from_env = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
            .iter()
            .find_map(|k| std::env::var(k).ok()?.trim().parse::<usize>().ok());
        let v = from_env.map_or(-1, |r| r as i64);
        let _ = RANK.compare_exchange(i64::MIN, v, Ordering::Relaxed, Ordering::Relaxed);
        return from_env;
    }
    None
}

/// The start of a log line, as NCCL's: `host:pid:tid [rank] unihal LEVEL SUBSYS ` (`[-]` when
/// the process has no rank).
pub fn prefix(
    host: &str,
    pid: u32,
    tid: u64,
    rank: Option<usize>,
    level: &str,
    subsys: &str,
) -> String {
    let rank = rank.map_or_else(|| "-".to_string(), |r| r.to_string());
    format!("{host}:{pid}:{tid} [{rank}] unihal {level} {subsys} ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_like_nccl_debug_and_refuse_the_rest() {
        let f = filter_directive;
        assert_eq!(f(Some("TRACE")).unwrap(), "trace");
        assert_eq!(f(Some("info")).unwrap(), "info");
        assert_eq!(f(Some("WARN")).unwrap(), "warn");
        assert_eq!(f(None).unwrap(), "warn");
        assert_eq!(f(Some(" ")).unwrap(), "warn");
        assert_eq!(f(Some("OFF")).unwrap(), "off");
        let e = f(Some("nonsense")).unwrap_err().to_string();
        assert!(e.contains("UNIHAL_LOG=\"nonsense\""), "{e}");
        assert!(e.contains("INFO"), "{e}");
    }

    #[test]
    fn subsystems_parse_like_nccl_debug_subsys() {
        let m = SubsysMask::parse(Some("init,COLL")).unwrap();
        assert!(m.contains(Subsystem::Init) && m.contains(Subsystem::Coll));
        assert!(!m.contains(Subsystem::Alloc));
        let m = SubsysMask::parse(Some("^ALLOC")).unwrap();
        assert!(!m.contains(Subsystem::Alloc) && m.contains(Subsystem::Coll));
        assert_eq!(SubsysMask::parse(None).unwrap(), SubsysMask::ALL);
        let e = SubsysMask::parse(Some("INIT,NET")).unwrap_err().to_string();
        assert!(
            e.contains("UNIHAL_LOG_SUBSYS") && e.contains("BOOTSTRAP"),
            "{e}"
        );
    }

    #[test]
    fn targets_map_to_subsystems() {
        assert_eq!(Subsystem::of_target("unihal::coll"), Some(Subsystem::Coll));
        assert_eq!(
            Subsystem::of_target("unihal_cpu::ccl::gloo"),
            Some(Subsystem::Coll)
        );
        assert_eq!(
            Subsystem::of_target("unihal_launch::tcpstore::server"),
            Some(Subsystem::Bootstrap)
        );
        assert_eq!(
            Subsystem::of_target("unihal_cpu::worker"),
            Some(Subsystem::Device)
        );
        assert_eq!(Subsystem::of_target("hyper::client"), None);
    }

    #[test]
    fn file_names_expand_host_and_pid() {
        assert_eq!(
            file_name("/tmp/log.%h.%p", "node1", 42),
            "/tmp/log.node1.42"
        );
        assert_eq!(file_name("100%%-%x%", "h", 1), "100%-%x%");
    }

    #[test]
    fn the_prefix_reads_as_nccls() {
        assert_eq!(
            prefix("node1", 42, 43, Some(1), "INFO", "COLL"),
            "node1:42:43 [1] unihal INFO COLL "
        );
        assert_eq!(
            prefix("node1", 42, 43, None, "WARN", "INIT"),
            "node1:42:43 [-] unihal WARN INIT "
        );
    }
}
