//! The CPU backend's configuration, read from the environment.
//!
//! * `UNIHAL_CPU_DEVICES` — number of virtual devices (default 4, at least 1, at most 64).
//! * `UNIHAL_CPU_MEMORY` — capacity of each device in bytes, with an optional `K`/`M`/`G`/`T` suffix
//!   (powers of 1024). Default: the machine's physical memory divided among the devices (each
//!   device's share, as `unihal devices` shows it), so an impossible request is an out-of-memory
//!   error, not an abort.
//! * `UNIHAL_CPU_THREADS` — compute threads per device for kernel launches (default: cores /
//!   devices, at least 1).
//! * `UNIHAL_CPU_MATMUL` — `gemm` (default: the `gemm` crate, vectorised up to AVX-512) or
//!   `dialect` (the portable library's tiled GEMM kernel, as GPUs without a vendor BLAS run it).

use unihal_hal::Result;

/// Environment variable: number of virtual devices.
pub const DEVICES_ENV: &str = "UNIHAL_CPU_DEVICES";
/// Environment variable: per-device memory capacity.
pub const MEMORY_ENV: &str = "UNIHAL_CPU_MEMORY";
/// Environment variable: compute threads per device.
pub const THREADS_ENV: &str = "UNIHAL_CPU_THREADS";
/// Environment variable: matmul engine.
pub const MATMUL_ENV: &str = "UNIHAL_CPU_MATMUL";

/// Which code runs `matmul` on the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulEngine {
    /// The `gemm` crate.
    #[default]
    Gemm,
    /// The portable library's tiled GEMM kernel.
    Dialect,
}

/// Settings of a CPU backend instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuConfig {
    pub devices: usize,
    pub memory_per_device: u64,
    pub threads_per_device: usize,
    pub matmul: MatmulEngine,
}

impl CpuConfig {
    /// Reads the environment.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::InvalidArgument`] naming the variable when a value does not parse or is out of
    /// range.
    pub fn from_env() -> Result<CpuConfig> {
        let get = unihal_hal::settings::get;
        let mut c = Self::from_values(
            get(DEVICES_ENV).as_deref(),
            get(MEMORY_ENV).as_deref(),
            get(THREADS_ENV).as_deref(),
        )?;
        c.matmul = match get(MATMUL_ENV).as_deref().map(str::trim) {
            None | Some("gemm") => MatmulEngine::Gemm,
            Some("dialect") => MatmulEngine::Dialect,
            Some(v) => return Err(unihal_hal::settings::refuse(MATMUL_ENV, v)),
        };
        Ok(c)
    }

    /// Builds a configuration from optional textual values (as found in the environment).
    ///
    /// # Errors
    /// As [`CpuConfig::from_env`].
    pub fn from_values(
        devices: Option<&str>,
        memory: Option<&str>,
        threads: Option<&str>,
    ) -> Result<CpuConfig> {
        let devices = match devices {
            None => 4,
            Some(v) => parse_count(DEVICES_ENV, v, 64)?,
        };
        let memory_per_device = match memory {
            None => physical_memory() / devices as u64,
            Some(v) => parse_bytes(v).ok_or_else(|| unihal_hal::settings::refuse(MEMORY_ENV, v))?,
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads_per_device = match threads {
            None => (cores / devices).max(1),
            Some(v) => parse_count(THREADS_ENV, v, 1024)?,
        };
        Ok(CpuConfig {
            devices,
            memory_per_device,
            threads_per_device,
            matmul: MatmulEngine::Gemm,
        })
    }
}

fn parse_count(var: &'static str, v: &str, max: usize) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(unihal_hal::settings::refuse_with(
            var,
            v,
            format!("an integer in 1..={max}"),
        )),
    }
}

/// Parses `123`, `64K`, `512M`, `2G`, `1T` (suffixes are powers of 1024, case-insensitive, an optional
/// trailing `B` or `iB` is accepted).
pub fn parse_bytes(v: &str) -> Option<u64> {
    let s = v.trim().to_ascii_uppercase();
    let s = s
        .strip_suffix("IB")
        .or_else(|| s.strip_suffix('B'))
        .unwrap_or(&s);
    let (num, shift) = match s.chars().last()? {
        'K' => (&s[..s.len() - 1], 10),
        'M' => (&s[..s.len() - 1], 20),
        'G' => (&s[..s.len() - 1], 30),
        'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// Physical memory of the machine from `/proc/meminfo`, or 16 GiB when it cannot be read.
fn physical_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(16 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_counts() {
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("1000"), Some(1000));
        assert_eq!(parse_bytes("x"), None);
        let c = CpuConfig::from_values(Some("2"), Some("1G"), Some("3")).unwrap();
        assert_eq!(
            (c.devices, c.memory_per_device, c.threads_per_device),
            (2, 1 << 30, 3)
        );
        let e = CpuConfig::from_values(Some("0"), None, None).unwrap_err();
        assert!(e.to_string().contains("UNIHAL_CPU_DEVICES"), "{e}");
        assert!(CpuConfig::from_values(None, Some("lots"), None).is_err());
    }
}
