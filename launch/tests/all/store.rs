//! The c10d TCPStore client against unihal's own server: every request, waits with deadlines,
//! cancelled waits, hostile peers and the handshake.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use unihal_hal::HalError;
use unihal_launch::tcpstore::wire;
use unihal_launch::{TcpStore, TcpStoreServer};

fn pair() -> (TcpStoreServer, TcpStore) {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let client = TcpStore::connect("127.0.0.1", server.port(), Duration::from_secs(10)).unwrap();
    (server, client)
}

#[test]
fn every_request_round_trips() {
    let (server, c) = pair();
    c.set("a", b"1").unwrap();
    assert_eq!(c.get("a").unwrap(), b"1");
    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -2).unwrap(), 3);
    assert_eq!(
        c.get("n").unwrap(),
        b"3",
        "counters are decimal text, as PyTorch keeps them"
    );
    assert!(c.check(&["a", "n"]).unwrap());
    assert!(!c.check(&["a", "missing"]).unwrap());
    assert!(c.delete("a").unwrap());
    assert!(!c.delete("a").unwrap());
    // Keys travel as PyTorch lays them out: "/" + key, and PrefixStore's "prefix/".
    let p = c.with_prefix("/worker/attempt_1");
    p.set("id", b"x").unwrap();
    assert!(c.check(&["/worker/attempt_1/id"]).unwrap());
    assert_eq!(server.num_keys(), 2);
    server.set_raw(b"//worker/attempt_1/raw", b"y");
    assert_eq!(p.get("raw").unwrap(), b"y");
}

#[test]
fn a_get_waits_for_the_key_and_a_wait_past_its_deadline_is_cancelled() {
    let (_server, c) = pair();
    let writer = c.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        // Another connection: the first is busy waiting.
        let w = TcpStore::connect("127.0.0.1", port_of(&writer), Duration::from_secs(5)).unwrap();
        w.set("late", b"here").unwrap();
    });
    assert_eq!(c.get("late").unwrap(), b"here");
    t.join().unwrap();
    let t0 = Instant::now();
    let e = c.wait(&["never"], Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, HalError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("never"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    // The connection is still in step after the cancelled wait.
    c.set("after", b"ok").unwrap();
    assert_eq!(c.get("after").unwrap(), b"ok");
}

fn port_of(c: &TcpStore) -> u16 {
    c.addr().rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn a_peer_that_is_not_a_tcpstore_is_named_as_a_handshake_mismatch() {
    // A service that answers anything with text (an HTTP server on the port, say).
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let e = TcpStore::connect("127.0.0.1", port, Duration::from_secs(2)).unwrap_err();
    assert!(matches!(e, HalError::AbiMismatch { .. }), "{e}");
    assert!(e.to_string().contains("c10d TCPStore handshake"), "{e}");
    // One that closes at once.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            drop(c);
        }
    });
    let e = TcpStore::connect("127.0.0.1", port, Duration::from_secs(2)).unwrap_err();
    assert!(matches!(e, HalError::AbiMismatch { .. }), "{e}");
}

#[test]
fn nobody_listening_is_a_timeout_within_the_bound() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    let e = TcpStore::connect("127.0.0.1", port, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, HalError::Timeout { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
}

/// Sends `bytes` raw and returns what the server answered before closing.
fn raw(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = c.write_all(bytes);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    out
}

fn hello() -> Vec<u8> {
    let mut v = vec![wire::query::VALIDATE];
    v.extend_from_slice(&wire::MAGIC.to_le_bytes());
    v
}

#[test]
fn hostile_clients_are_closed_and_the_server_serves_on() {
    let (server, c) = pair();
    let port = server.port();
    // A wrong magic, garbage, an unknown query, a 2^60-byte key, 2^40 keys in a wait, a
    // truncated set: each closes its own connection without an answer (and without allocating
    // what the lengths announce).
    assert_eq!(raw(port, &[0, 1, 2, 3, 4]), b"");
    assert_eq!(raw(port, b"\xff\xffgarbage"), b"");
    let mut unknown = hello();
    unknown.push(200);
    assert_eq!(raw(port, &unknown), b"");
    let mut huge = hello();
    huge.push(wire::query::GET);
    huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert_eq!(raw(port, &huge), b"");
    let mut many = hello();
    many.push(wire::query::WAIT);
    many.extend_from_slice(&(1u64 << 40).to_le_bytes());
    assert_eq!(raw(port, &many), b"");
    let mut cut = hello();
    cut.push(wire::query::SET);
    cut.extend_from_slice(&8u64.to_le_bytes());
    cut.extend_from_slice(b"abc");
    assert_eq!(raw(port, &cut), b"");
    // A client that leaves in the middle of a wait.
    let mut w = hello();
    w.push(wire::query::WAIT);
    w.extend_from_slice(&1u64.to_le_bytes());
    wire::put_bytes(&mut w, b"/nobody");
    assert_eq!(raw(port, &w), b"");
    // The well-behaved client is still served.
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k").unwrap(), b"v");
}

#[test]
fn a_hostile_server_is_an_error_never_a_huge_allocation() {
    // Answers the handshake's ping correctly, then announces a 2^62-byte value.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut b = [0u8; 10];
            let _ = c.read_exact(&mut b);
            let _ = c.write_all(&b[6..10]);
            // Whatever comes next (wait, get): "ready", then an absurd length.
            let mut sink = [0u8; 256];
            let _ = c.read(&mut sink);
            let _ = c.write_all(&[wire::STOP_WAITING]);
            let _ = c.read(&mut sink);
            let _ = c.write_all(&(1u64 << 62).to_le_bytes());
        }
    });
    let c = TcpStore::connect("127.0.0.1", port, Duration::from_secs(2)).unwrap();
    let e = c.get("k").unwrap_err();
    assert!(matches!(e, HalError::Unavailable { .. }), "{e}");
}

/// A request that times out leaves its answer in flight: the next request must not take it for
/// its own. A store that answers the first `add` late (after the client's deadline) and the
/// second at once; the second `add` must return its own value (once it returned the first's, and
/// the connection stayed out of step).
#[test]
fn a_late_answer_is_never_taken_for_the_next_requests() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut adds = 0i64;
        for mut c in l.incoming().flatten() {
            // The handshake (validate + magic, then a ping and its nonce).
            let mut b = [0u8; 10];
            if c.read_exact(&mut b).is_err() {
                continue;
            }
            let _ = c.write_all(&b[6..10]);
            // Then adds: query byte, key (u64 length + bytes), delta (i64).
            loop {
                let mut q = [0u8; 1];
                if c.read_exact(&mut q).is_err() {
                    break;
                }
                let Ok(key) = wire::get_bytes(&mut c, 1 << 10) else {
                    break;
                };
                let Ok(delta) = wire::get_u64(&mut c) else {
                    break;
                };
                assert_eq!(q[0], wire::query::ADD, "{key:?}");
                adds += 1;
                let value = 1000 * adds + delta as i64;
                if adds == 1 {
                    // Past the client's deadline.
                    std::thread::sleep(Duration::from_millis(600));
                }
                if c.write_all(&value.to_le_bytes()).is_err() {
                    break;
                }
            }
        }
    });
    let c = TcpStore::connect("127.0.0.1", port, Duration::from_millis(300)).unwrap();
    let e = c.add("n", 1).unwrap_err();
    assert!(matches!(e, HalError::Timeout { .. }), "{e}");
    // Let the late answer arrive before the next request.
    std::thread::sleep(Duration::from_millis(500));
    match c.add("n", 2) {
        // The second add's own answer: 1000 * 2 + 2.
        Ok(v) => assert_eq!(v, 2002, "the second add returned the first one's answer"),
        // Or a typed refusal naming the broken connection: never the other request's value.
        Err(e) => assert!(matches!(e, HalError::Unavailable { .. }), "{e}"),
    }
}

/// One `MULTI_GET` naming one large value many times must not make the server build a reply of
/// their total size: the request is refused (its connection closed) once the reply would pass
/// `wire::MAX_MESSAGE`, before anything that size is allocated, and the server serves on.
#[test]
fn a_multi_get_past_the_reply_limit_is_refused_and_the_server_serves_on() {
    let (server, c) = pair();
    let value = vec![7u8; 1 << 20];
    c.set("big", &value).unwrap();
    let copies = wire::MAX_MESSAGE / value.len() as u64 + 1;
    let mut req = hello();
    req.push(wire::query::MULTI_GET);
    req.extend_from_slice(&copies.to_le_bytes());
    for _ in 0..copies {
        wire::put_bytes(&mut req, b"/big");
    }
    let got = raw(server.port(), &req);
    assert!(
        got.is_empty(),
        "{} bytes answered to a MULTI_GET of {copies} MiB",
        got.len()
    );
    // Under the limit it is answered in full.
    let mut ok = hello();
    ok.push(wire::query::MULTI_GET);
    ok.extend_from_slice(&2u64.to_le_bytes());
    wire::put_bytes(&mut ok, b"/big");
    wire::put_bytes(&mut ok, b"/big");
    assert_eq!(raw(server.port(), &ok).len(), 2 * (8 + value.len()));
    assert_eq!(c.get("big").unwrap(), value);
}

/// A store timeout longer than the clock holds is no deadline (once `Instant::now() + timeout`
/// panicked in `connect`): connecting, requests and a wait that is answered all work.
#[test]
fn a_timeout_longer_than_the_clock_holds_is_no_deadline() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    for t in [Duration::MAX, Duration::from_secs_f64(1e19)] {
        let c = TcpStore::connect("127.0.0.1", server.port(), t).unwrap();
        assert!(c.add("n", 1).unwrap() > 0);
        c.set("k", b"v").unwrap();
        c.wait(&["k"], t).unwrap();
        assert_eq!(c.get("k").unwrap(), b"v");
    }
}
