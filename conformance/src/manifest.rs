//! Per-backend manifests: the cases a backend declares unsupported or expected to fail, with reasons.
//!
//! A manifest is text, one entry per line: `<unsupported|xfail> <case-id or prefix.*> <reason>`;
//! `#` starts a comment. `unsupported` skips the case with the reason. `xfail` runs it: a failure
//! is reported as expected, a pass as unexpected (a failure in verify mode, so a manifest cannot go
//! stale silently).

use serde::Serialize;

/// What a manifest entry declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Unsupported,
    Xfail,
}

/// One manifest line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub kind: EntryKind,
    /// A case id, or a prefix ending in `.*`.
    pub pattern: String,
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
        let mut entries = Vec::new();
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
                other => return Err(format!("line {}: unknown kind {other:?}", n + 1)),
            };
            let (Some(pattern), Some(reason)) =
                (pattern, reason.map(str::trim).filter(|r| !r.is_empty()))
            else {
                return Err(format!("line {}: expected `<kind> <case> <reason>`", n + 1));
            };
            entries.push(Entry {
                kind,
                pattern: pattern.to_string(),
                reason: reason.to_string(),
            });
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

    /// The first entry covering case `id`.
    pub fn lookup(&self, id: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.matches(id))
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
    fn builtin_manifests_parse_and_cpu_is_empty() {
        let cpu = unihal_cpu::CpuBackend::new();
        assert!(Manifest::of(&cpu).unwrap().entries.is_empty());
    }
}
