//! The in-process engine connects the ranks of one process only: an id made by another process
//! (this test binary run again as a child) is refused at once, naming the engines that cross
//! processes, instead of waiting for ranks that can never join until the timeout.

use std::time::{Duration, Instant};
use unihal_hal::{Backend, CommConfig, HalError, UniqueId};

const CHILD: &str = "UNIHAL_TEST_PRINT_CPU_ID";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

#[test]
fn an_id_from_another_process_is_refused_at_once() {
    let backend = unihal_cpu::CpuBackend::new();
    let ccl = backend.collectives().unwrap();
    if std::env::var_os(CHILD).is_some() {
        println!("ID={}", hex(&ccl.unique_id().unwrap().0));
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "foreign_id::an_id_from_another_process_is_refused_at_once",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("ID="))
        .unwrap_or_else(|| panic!("the child printed no id:\n{text}"));
    let device = backend.open(0).unwrap();
    let cfg = CommConfig {
        timeout: Some(Duration::from_secs(60)),
    };
    let t0 = Instant::now();
    let e = match ccl.init_rank(&UniqueId(unhex(id)), 2, 0, &device, &cfg) {
        Err(e) => e,
        Ok(_) => panic!("a communicator from another process's id"),
    };
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        matches!(e, HalError::InvalidArgument { arg: "id", .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("another process") && msg.contains("gloo"),
        "{msg}"
    );
    // This process's own id still forms communicators (a one-rank one here).
    let own = ccl.unique_id().unwrap();
    assert!(ccl.init_rank(&own, 1, 0, &device, &cfg).is_ok());
}
