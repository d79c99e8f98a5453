//! unihal's c10d TCPStore against PyTorch's, both ways: PyTorch's client (every request its
//! workers make, a cancelled wait included) against unihal's server, and unihal's client against
//! the server torchrun's agent runs, through PrefixStore's key layout. Python comes from
//! `UNIHAL_TORCH_PYTHON`; without PyTorch the test says so and passes, unless
//! `UNIHAL_TEST_TORCH=1` (set by `.ci/run`, which installs the pinned PyTorch): then it fails.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use unihal_launch::{TcpStore, TcpStoreServer};

fn python() -> Option<String> {
    let python = std::env::var("UNIHAL_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let required = std::env::var("UNIHAL_TEST_TORCH").as_deref() == Ok("1");
    let ok = Command::new(&python)
        .args(["-c", "import torch.distributed"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            !required,
            "UNIHAL_TEST_TORCH=1 but {python} cannot import torch"
        );
        eprintln!("SKIPPED: {python} cannot import torch; set UNIHAL_TORCH_PYTHON, and UNIHAL_TEST_TORCH=1 to require it");
        return None;
    }
    Some(python)
}

fn script() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/torch_store.py").into()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn pytorch_client_against_the_unihal_server() {
    let Some(python) = python() else { return };
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let me = TcpStore::connect("127.0.0.1", server.port(), Duration::from_secs(10)).unwrap();
    me.set("from-unihal", b"rust").unwrap();
    let out = Command::new(python)
        .args([&script(), "client", &server.port().to_string()])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("every request answered"), "{text}");
    assert_eq!(me.get("from-torch").unwrap(), b"hello");
    assert_eq!(me.get("ctr").unwrap(), b"7");
    assert_eq!(me.with_prefix("/worker/attempt_2").get("pk").unwrap(), b"p");
}

#[test]
fn unihal_client_against_the_pytorch_server() {
    let Some(python) = python() else { return };
    let port = free_port();
    let mut child = Command::new(python)
        .args([&script(), "serve", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        seen += &l;
        seen.push('\n');
        if l == "serving" {
            break;
        }
    }
    let c = TcpStore::connect("127.0.0.1", port, Duration::from_secs(20))
        .unwrap()
        .with_prefix("/worker/attempt_0");
    // The counter first: the server reads it once it sees "from-unihal" (one connection, taken
    // in order).
    assert_eq!(c.add("ctr", 2).unwrap(), 2);
    assert_eq!(c.add("ctr", 3).unwrap(), 5);
    c.set("from-unihal", b"rust").unwrap();
    assert_eq!(c.get("from-torch").unwrap(), b"hello");
    assert!(c.check(&["from-torch", "ctr"]).unwrap());
    let e = c.wait(&["never"], Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, unihal_hal::HalError::Timeout { .. }), "{e}");
    c.set("unihal-done", b"1").unwrap();
    for l in lines {
        seen += &l.unwrap();
        seen.push('\n');
    }
    let st = child.wait().unwrap();
    assert!(st.success(), "{seen}");
    assert!(
        seen.contains("unihal's keys read through PrefixStore"),
        "{seen}"
    );
    assert!(
        seen.contains("torch 2.15.0"),
        "checked against PyTorch 2.15.0:\n{seen}"
    );
}
