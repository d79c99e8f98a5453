//! Log levels, `UNIHAL_LOG`, spelled as NCCL_DEBUG is (`WARN`, `INFO`, `TRACE`).
//!
//! The HAL and the backends emit `tracing` events and spans; the application (or the `unihal` binary)
//! installs a subscriber. [`filter_directive`] turns `UNIHAL_LOG` into a filter for it.

/// Environment variable holding the log level.
pub const LOG_ENV: &str = "UNIHAL_LOG";

/// Maps a `UNIHAL_LOG` value to a `tracing` filter directive (`off`, `error`, `warn`, `info`, `debug`,
/// `trace`). Unknown or missing values give `warn`.
pub fn filter_directive(value: Option<&str>) -> &'static str {
    match value.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
        Some("NONE") | Some("OFF") | Some("0") => "off",
        Some("ERROR") => "error",
        Some("INFO") => "info",
        Some("DEBUG") | Some("VERSION") => "debug",
        Some("TRACE") | Some("ALL") => "trace",
        _ => "warn",
    }
}

/// [`filter_directive`] of the current `UNIHAL_LOG`.
pub fn filter_directive_from_env() -> &'static str {
    filter_directive(std::env::var(LOG_ENV).ok().as_deref())
}

#[cfg(test)]
mod tests {
    #[test]
    fn levels_parse_like_nccl_debug() {
        use super::filter_directive as f;
        assert_eq!(f(Some("TRACE")), "trace");
        assert_eq!(f(Some("info")), "info");
        assert_eq!(f(Some("WARN")), "warn");
        assert_eq!(f(None), "warn");
        assert_eq!(f(Some("bogus")), "warn");
        assert_eq!(f(Some("OFF")), "off");
    }
}
