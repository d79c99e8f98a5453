//! torchrun's error file: a failing rank writes its error where `TORCHELASTIC_ERROR_FILE` says,
//! and torchrun prints it in its failure summary instead of "To enable traceback see ...".

use std::path::Path;

/// Writes `message` to `path` in the layout torch's elastic `ProcessFailure` reads
/// (`{"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}`), once:
/// an existing file (the first error of the rank) is kept, as torch's `record` keeps it.
///
/// # Errors
/// The file system's.
pub fn write(path: &Path, message: &str, rank: usize) -> std::io::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let body = format!(
        "{{\"message\": {{\"message\": {}, \"extraInfo\": {{\"py_callstack\": {}, \"timestamp\": \"{secs}\"}}}}}}\n",
        json_string(&format!("unihal error: {message}")),
        json_string(&format!("rank {rank} (a native unihal process; no Python call stack)\n{message}")),
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, body)
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_and_keeps_the_first_error() {
        let dir = std::env::temp_dir().join(format!("unihal-errfile-{}", std::process::id()));
        let path = dir.join("sub/error.json");
        super::write(&path, "bad \"launch\"\n\tsee README", 1).unwrap();
        super::write(&path, "a later error", 1).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(r#"unihal error: bad \"launch\"\n\tsee README"#),
            "{text}"
        );
        assert!(!text.contains("later"), "{text}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
