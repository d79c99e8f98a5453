//! nccl-tests' output, byte for byte: C's number formats, the time stamp, and the JSON file of
//! `util.cu`.

use super::*;
use std::path::PathBuf;

/// Bytes of one rank's "Using devices" record (nccl-tests' `MAX_LINE`).
pub(crate) const RECORD: usize = 2048;

/// The host name as nccl-tests' `getHostName` gives it: up to the first dot.
pub(crate) fn host_name() -> String {
    let host = &unihal_hal::ccl::process_tag().host;
    host.split('.').next().unwrap_or(host).to_string()
}

/// The time now as nccl-tests formats it (`%Y-%m-%d %H:%M:%S`), in UTC.
pub(crate) fn now_string() -> String {
    unihal_hal::clock::UtcDateTime::from_unix(unihal_hal::clock::unix_now_s()).format(' ')
}

/// C's `%.{prec}e`: the exponent with a sign and at least two digits.
pub(crate) fn c_exp(v: f64, prec: usize) -> String {
    if !v.is_finite() {
        return c_nonfinite(v);
    }
    let s = format!("{v:.prec$e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// C's spelling of an infinite or NaN double.
pub(crate) fn c_nonfinite(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// C's `%g` (six significant digits, trailing zeros removed).
pub fn c_g(v: f64) -> String {
    if !v.is_finite() {
        return c_nonfinite(v);
    }
    if v == 0.0 {
        return "0".into();
    }
    let strip = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let e = format!("{v:.5e}");
    let x: i32 = e
        .split_once('e')
        .and_then(|(_, x)| x.parse().ok())
        .unwrap_or(0);
    if (-4..6).contains(&x) {
        strip(format!("{v:.*}", (5 - x) as usize))
    } else {
        let s = c_exp(v, 5);
        let (m, rest) = s.split_once('e').unwrap_or((&s, ""));
        format!("{}e{rest}", strip(m.to_string()))
    }
}

/// nccl-tests' `getFloatStr`: `value` in `width` characters, with 2, 1 or 0 decimals, else in
/// exponent form.
pub fn float_str(value: f64, width: usize) -> String {
    for prec in [2usize, 1, 0] {
        let s = format!("{value:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = format!("{:>width$}", c_exp(value, if width >= 7 { 1 } else { 0 }));
    s.chars().take(width).collect()
}

/// nccl-tests' `sanitizeJson`: `"`, `\`, `/`, tab and newline escaped; the text stops at the
/// first other control or non-ASCII character, or at 2047 characters.
pub(crate) fn sanitize_json(s: &str) -> String {
    const LIM: usize = 2048;
    let mut out = String::new();
    for ch in s.chars() {
        if out.len() + 1 >= LIM {
            break;
        }
        match ch {
            '"' | '\\' | '/' | '\t' | '\n' => {
                if out.len() + 2 > LIM {
                    break;
                }
                out.push('\\');
                out.push(match ch {
                    '\n' => 'n',
                    '\t' => 't',
                    c => c,
                });
            }
            c if (c as u32) >= 0x7F || (c as u32) <= 0x1F => break,
            c => out.push(c),
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonState {
    Key,
    ObjectEmpty,
    ObjectSome,
    ListEmpty,
    ListSome,
}

/// nccl-tests' JSON writer (`util.cu`): the same calls, states and spelling, into a string.
#[derive(Debug, Default)]
pub(crate) struct Json {
    pub(crate) s: String,
    pub(crate) states: Vec<JsonState>,
}

impl Json {
    pub(crate) fn key(&mut self, name: &str) {
        match self.states.last_mut() {
            Some(st @ JsonState::ObjectEmpty) => *st = JsonState::ObjectSome,
            Some(JsonState::ObjectSome) => self.s.push(','),
            _ => debug_assert!(false, "a JSON key outside an object"),
        }
        self.s.push('"');
        self.s.push_str(&sanitize_json(name));
        self.s.push_str("\":");
        self.states.push(JsonState::Key);
    }

    pub(crate) fn value(&mut self) {
        match self.states.last_mut() {
            Some(st @ JsonState::ListEmpty) => *st = JsonState::ListSome,
            Some(JsonState::ListSome) => self.s.push(','),
            Some(JsonState::Key) => {
                self.states.pop();
            }
            None => {}
            _ => debug_assert!(false, "a JSON value without a key"),
        }
    }

    pub(crate) fn start_object(&mut self) {
        self.value();
        self.s.push('{');
        self.states.push(JsonState::ObjectEmpty);
    }

    pub(crate) fn finish_object(&mut self) {
        self.states.pop();
        self.s.push('}');
    }

    pub(crate) fn start_list(&mut self) {
        self.value();
        self.s.push('[');
        self.states.push(JsonState::ListEmpty);
    }

    pub(crate) fn finish_list(&mut self) {
        self.states.pop();
        self.s.push(']');
    }

    pub(crate) fn null(&mut self) {
        self.value();
        self.s.push_str("null");
    }

    pub(crate) fn str(&mut self, v: &str) {
        self.value();
        self.s.push('"');
        self.s.push_str(&sanitize_json(v));
        self.s.push('"');
    }

    /// nccl-tests writes booleans as the strings `"true"` and `"false"`.
    pub(crate) fn bool(&mut self, v: bool) {
        self.str(if v { "true" } else { "false" });
    }

    pub(crate) fn int(&mut self, v: i64) {
        self.value();
        self.s.push_str(&v.to_string());
    }

    /// `%lf` (six decimals); NaN (and, to stay JSON, an infinity) as a string.
    pub(crate) fn double(&mut self, v: f64) {
        if v.is_finite() {
            self.value();
            self.s.push_str(&format!("{v:.6}"));
        } else {
            self.str(&c_nonfinite(v));
        }
    }

    pub(crate) fn key_int(&mut self, k: &str, v: i64) {
        self.key(k);
        self.int(v);
    }

    pub(crate) fn key_str(&mut self, k: &str, v: &str) {
        self.key(k);
        self.str(v);
    }

    /// `jsonOutputFinalize`: `end_time` when at the top level, then every open object and list
    /// closed (a key left open gets null).
    pub(crate) fn finalize(&mut self) {
        if self.states.len() == 1
            && matches!(
                self.states[0],
                JsonState::ObjectEmpty | JsonState::ObjectSome
            )
        {
            self.key_str("end_time", &now_string());
        }
        while let Some(st) = self.states.last() {
            match st {
                JsonState::Key => self.null(),
                JsonState::ObjectEmpty | JsonState::ObjectSome => self.finish_object(),
                JsonState::ListEmpty | JsonState::ListSome => self.finish_list(),
            }
        }
    }
}

/// The JSON document being written and the file it goes to.
pub(crate) struct JsonOut {
    pub(crate) json: Json,
    pub(crate) file: std::fs::File,
}

/// Opens `path` as nccl-tests' `jsonOutputInit` does: a new file, else `path.0`, `path.1`, ...
/// when it exists; prints where the JSON goes (or why it does not) to `out`.
pub(crate) fn open_json(path: &std::path::Path, out: &mut dyn Write) -> Option<std::fs::File> {
    let mut tries = 0;
    let mut p = path.to_path_buf();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => {
                let _ = writeln!(out, "# Writing JSON output to {}", p.display());
                return Some(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                p = PathBuf::from(format!("{}.{tries}", path.display()));
                tries += 1;
            }
            Err(_) => {
                let _ = writeln!(
                    out,
                    "# skipping json output; {} not accessible",
                    p.display()
                );
                return None;
            }
        }
    }
}

/// The NCCL version code (`ncclGetVersion`'s, 2.30.7 → 23007) of an engine named `NCCL x.y.z`;
/// 0 for other engines.
pub(crate) fn nccl_version(engine: &str) -> i64 {
    let Some(v) = engine.strip_prefix("NCCL ") else {
        return 0;
    };
    let mut p = v
        .split(|c: char| !c.is_ascii_digit())
        .map(|x| x.parse::<i64>().unwrap_or(0));
    let (a, b, c) = (
        p.next().unwrap_or(0),
        p.next().unwrap_or(0),
        p.next().unwrap_or(0),
    );
    if a > 2 || (a == 2 && b >= 9) {
        a * 10_000 + b * 100 + c
    } else {
        a * 1000 + b * 100 + c
    }
}

/// nccl-tests' binary name of collective `op`.
pub(crate) fn program_name(op: CollectiveOp) -> String {
    let name = COLLECTIVES
        .iter()
        .find(|c| c.1 == op)
        .map_or("unknown", |c| c.0);
    format!("{name}_perf")
}
