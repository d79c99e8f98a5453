//! The `tracing` subscriber [`init_logging`] installs: NCCL's line layout
//! (`host:pid:tid [rank] unihal LEVEL SUBSYS message`), `UNIHAL_LOG`'s level,
//! `UNIHAL_LOG_SUBSYS`'s subsystems and `UNIHAL_LOG_FILE`'s file ([`unihal_hal::log`] parses them).

use std::io::Write as _;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer as _;
use unihal_hal::log::{self, SubsysMask, Subsystem};
use unihal_hal::{settings, Result};

/// The operating system's id of the calling thread (as NCCL prints it), read once per thread
/// from `/proc/thread-self`; 0 where that does not exist.
fn os_thread_id() -> u64 {
    thread_local! {
        static TID: u64 = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .unwrap_or(0);
    }
    TID.with(|t| *t)
}

/// Formats events as NCCL's log lines.
struct NcclLines {
    host: String,
    pid: u32,
}

impl<S, N> FormatEvent<S, N> for NcclLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let subsys = Subsystem::of_target(meta.target()).map_or("-", Subsystem::name);
        writer.write_str(&log::prefix(
            &self.host,
            self.pid,
            os_thread_id(),
            log::rank(),
            meta.level().as_str(),
            subsys,
        ))?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Installs a `tracing` subscriber at the level of `UNIHAL_LOG` (default WARN) for the
/// subsystems of `UNIHAL_LOG_SUBSYS` (default all; warnings and errors always show), writing
/// NCCL-style lines to `UNIHAL_LOG_FILE` (`%h` host, `%p` pid) or standard error. Does nothing
/// if the application installed a subscriber already. Warns about `UNIHAL_*` variables that are
/// set but unknown (misspelt names).
///
/// # Errors
/// [`unihal_hal::HalError::InvalidArgument`] naming the variable for a bad `UNIHAL_LOG` or
/// `UNIHAL_LOG_SUBSYS`, or naming `UNIHAL_LOG_FILE` when the file
/// cannot be created.
pub fn init_logging() -> Result<()> {
    let level = log::filter_directive_from_env()?;
    let mask = SubsysMask::from_env()?;
    let host = unihal_hal::ccl::process_tag().host.clone();
    let pid = std::process::id();
    let writer = match settings::get(log::FILE_ENV) {
        None => tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
        Some(pattern) => {
            let name = log::file_name(&pattern, &host, pid);
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&name)
                .map_err(|e| {
                    settings::refuse_with(
                        log::FILE_ENV,
                        &pattern,
                        format!("a file that can be created ({name}: {e})"),
                    )
                })?;
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::sync::Mutex::new(file))
        }
    };
    let subsystems = tracing_subscriber::filter::filter_fn(move |meta| {
        *meta.level() <= Level::WARN
            || Subsystem::of_target(meta.target()).is_none_or(|s| mask.contains(s))
    });
    let layer = tracing_subscriber::fmt::layer()
        .event_format(NcclLines { host, pid })
        .with_writer(writer)
        .with_filter(tracing_subscriber::EnvFilter::new(level))
        .with_filter(subsystems);
    if tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).is_ok() {
        for why in settings::unknown_in_env() {
            tracing::warn!(target: "unihal::env", "{why}");
        }
    }
    Ok(())
}

/// [`init_logging`] and [`crate::check_settings`] for programs: a bad setting is printed to
/// standard error and the process exits with status 2 (a run must not go on with a setting it
/// cannot honour).
pub fn init_logging_or_exit(program: &str) {
    if let Err(e) = init_logging().and_then(|()| crate::check_settings()) {
        let _ = writeln!(std::io::stderr(), "{program}: {e}");
        std::process::exit(2);
    }
}
