//! The statistics as a text table, in the shape of PyTorch's `torch.cuda.memory_summary()`: the
//! same rows, columns, units and rounding (so a reader of one reads the other, and a test holds
//! every cell against torch's own table over the same statistics), with unihal's device name and
//! vendor-neutral row names ("Reserved memory" where torch says "GPU reserved memory"). Rows of
//! unihal's own follow torch's only once graph pools have been used ([`crate::graph`]), so the
//! table of a run without them is torch's, line for line.

use crate::stats::MemoryStats;
use std::fmt::Display;

/// A size cell: the unit chosen by the row's first value (`pref`), as torch chooses it.
fn size(mut v: i64, pref: i64) -> String {
    let mut unit = "B  ";
    let mut pref = pref as f64;
    for next in ["KiB", "MiB", "GiB", "TiB", "PiB"] {
        if pref < 768.0 * 1024.0 {
            break;
        }
        unit = next;
        v = v.div_euclid(1024);
        pref /= 1024.0;
    }
    format!("{v:6} {unit}")
}

/// A count cell, as torch writes it.
fn count(mut v: i64, pref: i64) -> String {
    let mut unit = " ";
    let mut pref = pref as f64;
    for next in ["K", "M"] {
        if pref < 750.0 * 1000.0 {
            break;
        }
        unit = next;
        v = v.div_euclid(1000);
        pref /= 1000.0;
    }
    format!("{v:7} {unit} ")
}

impl MemoryStats {
    /// The table of `torch.cuda.memory_summary(device)` over these statistics, for `device`.
    pub fn summary(&self, device: impl Display) -> String {
        let m = self.to_map();
        let get = |k: &str| m.get(k).copied().unwrap_or(0);
        let rule = |c: char| c.to_string().repeat(75);
        let mut lines = vec![
            rule('='),
            format!(
                " {:<73} ",
                format!("{:16} unihal memory summary, device {device}", "")
            ),
            rule('-'),
            format!(
                "  {:9} OOMs: {:<12} | {:6} device alloc retries: {:<8}  ",
                "",
                get("num_ooms"),
                "",
                get("num_alloc_retries")
            ),
            rule('='),
            "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".into(),
        ];
        type Cell = fn(i64, i64) -> String;
        let rows: [(&str, &str, Cell); 9] = [
            ("allocated_bytes", "Allocated memory", size),
            ("active_bytes", "Active memory", size),
            ("requested_bytes", "Requested memory", size),
            ("reserved_bytes", "Reserved memory", size),
            ("inactive_split_bytes", "Non-releasable memory", size),
            ("allocation", "Allocations", count),
            ("active", "Active allocs", count),
            ("segment", "Reserved segments", count),
            ("inactive_split", "Non-releasable allocs", count),
        ];
        let cells = |prefix: &str, pref: [i64; 4], cell: Cell| {
            let v =
                ["current", "peak", "allocated", "freed"].map(|w| get(&format!("{prefix}.{w}")));
            format!(
                "{} | {} | {} | {} ",
                cell(v[0], pref[0]),
                cell(v[1], pref[1]),
                cell(v[2], pref[2]),
                cell(v[3], pref[3])
            )
        };
        for (key, name, cell) in rows {
            lines.push(rule('-'));
            let all =
                ["current", "peak", "allocated", "freed"].map(|w| get(&format!("{key}.all.{w}")));
            for (pool, label) in [
                ("all", name),
                ("large_pool", "      from large pool"),
                ("small_pool", "      from small pool"),
            ] {
                lines.push(format!(
                    " {label:<21} | {}",
                    cells(&format!("{key}.{pool}"), all, cell)
                ));
            }
        }
        for (key, name) in [
            ("oversize_allocations", "Oversize allocations"),
            ("oversize_segments", "Oversize segments"),
        ] {
            lines.push(rule('-'));
            let own = ["current", "peak", "allocated", "freed"].map(|w| get(&format!("{key}.{w}")));
            lines.push(format!(" {name:<21} | {}", cells(key, own, count)));
        }
        if self.graph_pools.allocated > 0 {
            let rows: [(&str, &str, Cell); 4] = [
                ("graph_pools", "Graph pools", count),
                ("graph_pool_segment", "Graph pool segments", count),
                ("graph_pool_reserved_bytes", "Graph pool reserved", size),
                ("graph_pool_allocated_bytes", "Graph pool allocated", size),
            ];
            for (key, name, cell) in rows {
                lines.push(rule('-'));
                let own =
                    ["current", "peak", "allocated", "freed"].map(|w| get(&format!("{key}.{w}")));
                lines.push(format!(" {name:<21} | {}", cells(key, own, cell)));
            }
        }
        lines.push(rule('='));
        format!("|{}|\n", lines.join("|\n|"))
    }
}
