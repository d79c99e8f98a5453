//! Per-backend manifests: the cases a backend declares unsupported, expected to fail, or
//! supported, with reasons.
//!
//! A manifest is text, one entry per line: `<kind> <pattern> <reason>`; `#` starts a comment.
//!
//! * `<kind>`: `unsupported` skips the case with the reason. `xfail` runs it: a failure is
//!   reported as expected, a pass as unexpected (a failure in verify mode, so a manifest cannot
//!   go stale silently). `supported` runs it and judges it as any case (the reason is optional:
//!   a note for the reader); it exists to carve exceptions out of a wider entry.
//! * `<pattern>`: a case id (`memory.copy.peer`), a prefix ending in `.*` (`memory.copy.*`,
//!   which covers every id that starts with `memory.copy.`), or `*` (every case).
//! * **The most specific entry covering a case decides**: a case id before any prefix, a longer
//!   prefix before a shorter one, `*` last. So "everything except" is a catch-all and its
//!   exceptions, in any order:
//!
//!   ```text
//!   unsupported * not implemented yet
//!   supported memory.*
//!   supported streams.*
//!   supported events.*
//!   xfail memory.copy.peer the DMA engine drops the last 4 bytes (bug 123)
//!   ```
//!
//!   runs the memory, stream and event cases (`memory.copy.peer` as an expected failure) and
//!   skips every other case as unsupported. Two entries with the same pattern are refused.

use serde::Serialize;

/// What a manifest entry declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Unsupported,
    Xfail,
    /// Runs as if no entry covered the case: an exception to a wider `unsupported` or `xfail`.
    Supported,
}

/// One manifest line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub kind: EntryKind,
    /// A case id, a prefix ending in `.*`, or `*`.
    pub pattern: String,
    /// Why (empty for a `supported` entry without a note).
    pub reason: String,
}

impl Entry {
    /// True when the entry covers case `id`.
    pub fn matches(&self, id: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => id.starts_with(prefix),
            None => self.pattern == id,
        }
    }

    /// How specific the pattern is: a case id above every prefix, a longer prefix above a
    /// shorter one, `*` lowest.
    fn specificity(&self) -> usize {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => prefix.len(),
            None => usize::MAX,
        }
    }
}

/// A backend's manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Manifest {
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// Parses manifest text.
    ///
    /// # Errors
    /// A message naming the line when a line is malformed or has no reason.
    pub fn parse(text: &str) -> Result<Manifest, String> {
        let mut entries: Vec<Entry> = Vec::new();
        let mut lines: Vec<usize> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.splitn(3, char::is_whitespace);
            let (kind, pattern, reason) = (parts.next(), parts.next(), parts.next());
            let kind = match kind {
                Some("unsupported") => EntryKind::Unsupported,
                Some("xfail") => EntryKind::Xfail,
                Some("supported") => EntryKind::Supported,
                other => {
                    return Err(format!(
                        "line {}: unknown kind {other:?} (unsupported, xfail or supported)",
                        n + 1
                    ))
                }
            };
            let reason = reason.map(str::trim).unwrap_or("");
            let Some(pattern) =
                pattern.filter(|_| kind == EntryKind::Supported || !reason.is_empty())
            else {
                return Err(format!("line {}: expected `<kind> <case> <reason>`", n + 1));
            };
            if let Some(bad) = pattern
                .find('*')
                .filter(|&i| i + 1 != pattern.len() || !(pattern == "*" || pattern.ends_with(".*")))
            {
                return Err(format!(
                    "line {}: `{pattern}`: `*` only as the whole pattern or after a final `.` \
                     (a case id, `prefix.*` or `*`; found at byte {bad})",
                    n + 1
                ));
            }
            if let Some(i) = entries.iter().position(|e| e.pattern == pattern) {
                return Err(format!(
                    "line {}: `{pattern}` has an entry already (line {}); one entry per pattern",
                    n + 1,
                    lines[i]
                ));
            }
            entries.push(Entry {
                kind,
                pattern: pattern.to_string(),
                reason: reason.to_string(),
            });
            lines.push(n + 1);
        }
        Ok(Manifest { entries })
    }

    /// The manifest `backend` ships ([`unihal_hal::Backend::conformance_manifest`]).
    ///
    /// # Errors
    /// The parse error, naming the backend: a broken manifest fails the run, never skips.
    pub fn of(backend: &dyn unihal_hal::Backend) -> Result<Manifest, String> {
        Manifest::parse(backend.conformance_manifest()).map_err(|e| {
            format!(
                "the conformance manifest of backend {}: {e}",
                backend.name()
            )
        })
    }

    /// The entry that decides case `id`: the most specific one covering it (see the module's
    /// documentation). A `supported` entry is returned as such; [`Manifest::verdict`] reads it.
    pub fn lookup(&self, id: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .filter(|e| e.matches(id))
            .max_by_key(|e| e.specificity())
    }

    /// What the manifest says of case `id`: `None` when no entry covers it or a `supported`
    /// entry decides it, else the deciding `unsupported` or `xfail` entry.
    pub fn verdict(&self, id: &str) -> Option<&Entry> {
        self.lookup(id).filter(|e| e.kind != EntryKind::Supported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_matches_prefixes() {
        let m = Manifest::parse(
            "# c\nxfail memory.copy.peer no peer dma # trailing\nunsupported kernels.* no loader\n",
        )
        .unwrap();
        assert_eq!(m.entries.len(), 2);
        assert_eq!(m.lookup("memory.copy.peer").unwrap().kind, EntryKind::Xfail);
        assert_eq!(
            m.lookup("kernels.launch.iota_1d").unwrap().reason,
            "no loader"
        );
        assert!(m.lookup("memory.copy.d2d").is_none());
        assert!(Manifest::parse("xfail a.b").is_err());
        assert!(Manifest::parse("skip a.b why").is_err());
    }

    #[test]
    fn everything_except_is_a_catch_all_and_more_specific_entries() {
        // The exceptions come before and after the catch-all: order does not matter.
        let m = Manifest::parse(
            "supported memory.*\nunsupported * not yet\nsupported streams.* milestone 1\n\
             xfail memory.copy.peer dma bug\nunsupported memory.copy.staged.* no staging\n\
             supported memory.copy.staged.h2d\n",
        )
        .unwrap();
        let kind = |id: &str| m.lookup(id).map(|e| e.kind);
        assert_eq!(kind("memory.alloc.zero"), Some(EntryKind::Supported));
        assert!(m.verdict("memory.alloc.zero").is_none());
        assert!(m.verdict("streams.query.empty").is_none());
        assert_eq!(m.verdict("ops.add.f32.x").unwrap().reason, "not yet");
        assert_eq!(
            m.verdict("events.record").unwrap().kind,
            EntryKind::Unsupported
        );
        assert_eq!(kind("memory.copy.peer"), Some(EntryKind::Xfail));
        assert_eq!(
            m.verdict("memory.copy.staged.d2h").unwrap().reason,
            "no staging"
        );
        assert!(m.verdict("memory.copy.staged.h2d").is_none());
        // `memory.*` covers the ids under `memory.`, not a sibling area `memoryx`.
        assert_eq!(kind("memoryx.a"), Some(EntryKind::Unsupported));
        // A supported entry needs no reason; the others do.
        assert!(Manifest::parse("supported a.*").is_ok());
        assert!(Manifest::parse("unsupported a.*").is_err());
        // `*` only at the end of a prefix or alone; one entry per pattern.
        assert!(Manifest::parse("unsupported mem* why").is_err());
        assert!(Manifest::parse("unsupported *.copy why").is_err());
        let dup = Manifest::parse("unsupported a.* x\nsupported a.*").unwrap_err();
        assert!(dup.contains("line 2") && dup.contains("line 1"), "{dup}");
    }

    #[test]
    fn builtin_manifests_parse_and_cpu_is_empty() {
        let cpu = unihal_cpu::CpuBackend::new();
        assert!(Manifest::of(&cpu).unwrap().entries.is_empty());
    }
}
