//! Reading `symbols.txt`: which library exports which symbols. Shared by build.rs (which makes
//! the forwarding libraries from it, through `#[path]`) and the tests (which check the built
//! objects against it).

use std::collections::BTreeMap;

/// The committed list, as the crate was built with it.
pub const SYMBOLS_TXT: &str = include_str!("../symbols.txt");

/// Library name → its symbols, from the section headers of `text`
/// (`[section] classic: libA.so; split: libB.so`, then one symbol per line; `#` comments).
pub fn libraries(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut libs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            current = line
                .split([':', ';'])
                .filter_map(|p| p.split_whitespace().next())
                .filter(|w| w.ends_with(".so"))
                .map(String::from)
                .collect();
            current.sort();
            current.dedup();
        } else if !line.is_empty() && !line.starts_with('#') {
            for lib in &current {
                libs.entry(lib.clone()).or_default().push(line.to_string());
            }
        }
    }
    libs
}
