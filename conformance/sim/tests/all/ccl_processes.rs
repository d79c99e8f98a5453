//! Ranks in several processes: this test binary starts itself again as the other ranks (each
//! process with its own simulated devices, as on a real node) and the ranks meet through the
//! unique id alone. Every collective and a ring of sends and receives move the right data, larger
//! than one step of the shared-memory transport, in a communicator that mixes two ranks of one
//! process with a rank of another; a mismatch fails every process; a process killed in the middle
//! of a collective is the survivor's communicator error within milliseconds, naming the dead rank
//! and process, and its abort ends the wait.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{DType, ReduceOp};
use unihal_sim::ccl::{fresh_id, Collective, Comm, CommError, Kind, P2p, Registry};
use unihal_sim::{Device, Mode, SimError, StreamId};

const MB: u64 = 1 << 20;
const JOIN: Duration = Duration::from_secs(30);
/// Elements per rank of the large calls: more than one 1 MiB step of i32 per rank.
const BIG: usize = 300_000;
const CHILD: &str = "UNIHAL_SIM_CCL_TEST_CHILD";

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// This binary again, as rank `rank` of `scenario` (the `child` test below).
fn spawn_child(scenario: &str, rank: usize, id: &[u8]) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ccl_processes::child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, format!("{scenario}:{rank}:{}", hex(id)))
        .env("UNIHAL_SIM_CCL_TEST_POSTED", posted_marker(id))
        // Its harness lines would mix with ours; its failures go to standard error.
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// The file a child writes once its part of a collective is posted.
fn posted_marker(id: &[u8]) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("unihal-sim-ccl-test-{}", hex(&id[..8])))
}

struct Rank {
    comm: Comm,
    stream: StreamId,
}

fn join(id: &[u8], n: usize, rank: usize, mode: Mode) -> Rank {
    let d = Arc::new(
        Device::new(64 * MB, mode)
            .with_ordinal(rank as u32)
            .with_watchdog(Duration::from_secs(60)),
    );
    let stream = d.create_stream().unwrap();
    let comm = Registry::new().init_rank(id, n, rank, d, JOIN).unwrap();
    Rank { comm, stream }
}

fn upload(r: &Rank, data: &[i32]) -> u64 {
    let d = r.comm.device();
    let a = d.alloc((data.len() * 4).max(4) as u64).unwrap();
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    d.write(a, &bytes).unwrap();
    a
}

fn download(r: &Rank, addr: u64, n: usize) -> Vec<i32> {
    let mut bytes = vec![0u8; n * 4];
    r.comm.device().read(addr, &mut bytes).unwrap();
    bytes
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn value(rank: usize, i: usize) -> i32 {
    (rank * 1_000_000 + i) as i32
}

fn coll(kind: Kind, count: usize, send: u64, recv: u64) -> Collective {
    Collective {
        kind,
        dtype: DType::I32,
        count: count as u64,
        send,
        recv,
    }
}

/// Every collective (small and large) and a ring of sends and receives, checked on this rank.
fn every_collective(r: &Rank) {
    let (me, n) = (r.comm.rank(), r.comm.nranks());
    for count in [7, BIG] {
        let mine: Vec<i32> = (0..count * n).map(|i| value(me, i)).collect();
        let send = upload(r, &mine);
        let recv = upload(r, &vec![-1; count * n]);
        let run = |kind: Kind, send: u64| {
            r.comm
                .collective(r.stream, coll(kind, count, send, recv))
                .unwrap();
            r.comm.device().stream_synchronize(r.stream).unwrap();
        };
        run(Kind::AllReduce(ReduceOp::Sum), send);
        let want: Vec<i32> = (0..count)
            .map(|i| (0..n).map(|k| value(k, i)).sum())
            .collect();
        assert_eq!(download(r, recv, count), want, "all-reduce of {count}");
        run(Kind::Broadcast { root: 1 }, send);
        let want: Vec<i32> = (0..count).map(|i| value(1, i)).collect();
        assert_eq!(download(r, recv, count), want, "broadcast of {count}");
        run(Kind::AllGather, send);
        let want: Vec<i32> = (0..n)
            .flat_map(|k| (0..count).map(move |i| value(k, i)))
            .collect();
        assert_eq!(download(r, recv, count * n), want, "all-gather of {count}");
        run(Kind::ReduceScatter(ReduceOp::Max), send);
        let want: Vec<i32> = (0..count).map(|i| value(n - 1, me * count + i)).collect();
        assert_eq!(download(r, recv, count), want, "reduce-scatter of {count}");
        run(Kind::AllToAll, send);
        let want: Vec<i32> = (0..n)
            .flat_map(|k| (0..count).map(move |i| value(k, me * count + i)))
            .collect();
        assert_eq!(download(r, recv, count * n), want, "all-to-all of {count}");
        // A ring: send to the next rank, receive from the previous one, in one group.
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        r.comm
            .group(
                r.stream,
                &[
                    P2p::Send {
                        peer: next,
                        addr: send,
                        count: count as u64,
                        dtype: DType::I32,
                    },
                    P2p::Recv {
                        peer: prev,
                        addr: recv,
                        count: count as u64,
                        dtype: DType::I32,
                    },
                ],
            )
            .unwrap();
        r.comm.device().stream_synchronize(r.stream).unwrap();
        let want: Vec<i32> = (0..count).map(|i| value(prev, i)).collect();
        assert_eq!(download(r, recv, count), want, "ring of {count}");
    }
}

/// The other ranks' side: runs only in a process started by a test below.
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = spec.split(':');
    let (scenario, rank, id) = (
        parts.next().unwrap().to_string(),
        parts.next().unwrap().parse::<usize>().unwrap(),
        unhex(parts.next().unwrap()),
    );
    match scenario.as_str() {
        "collectives" => {
            let r = join(&id, 3, rank, Mode::Deferred);
            assert!(r.comm.spans_processes());
            every_collective(&r);
        }
        "mismatch" => {
            let r = join(&id, 2, rank, Mode::Deferred);
            let buf = upload(&r, &[1; 16]);
            let c = coll(Kind::AllReduce(ReduceOp::Sum), 11, buf, buf);
            r.comm.collective(r.stream, c).unwrap();
            let e = r.comm.device().stream_synchronize(r.stream).unwrap_err();
            assert!(e.to_string().contains("mismatch"), "{e}");
        }
        "dies" => {
            let r = join(&id, 2, rank, Mode::Concurrent);
            let buf = upload(&r, &vec![1; BIG]);
            // Concurrent: the stream reaches the gate at once, so this rank's part is posted.
            r.comm
                .collective(
                    r.stream,
                    coll(Kind::AllReduce(ReduceOp::Sum), BIG, buf, buf),
                )
                .unwrap();
            std::fs::write(
                std::env::var("UNIHAL_SIM_CCL_TEST_POSTED").unwrap(),
                b"posted",
            )
            .unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
fn every_collective_moves_the_right_data_across_processes() {
    if crate::own_process() {
        return;
    }
    let id = fresh_id();
    let mut child = spawn_child("collectives", 1, &id);
    // Ranks 0 and 2 here (two threads, two devices), rank 1 in the child.
    let here: Vec<_> = [0, 2]
        .into_iter()
        .map(|rank| {
            std::thread::spawn(move || {
                let r = join(&id, 3, rank, Mode::Concurrent);
                assert!(r.comm.spans_processes());
                every_collective(&r);
            })
        })
        .collect();
    for t in here {
        t.join().unwrap();
    }
    assert!(child.wait().unwrap().success(), "rank 1 failed");
}

#[test]
fn a_mismatch_across_processes_fails_every_process() {
    if crate::own_process() {
        return;
    }
    let id = fresh_id();
    let mut child = spawn_child("mismatch", 1, &id);
    let r = join(&id, 2, 0, Mode::Deferred);
    let buf = upload(&r, &[1; 16]);
    r.comm
        .collective(r.stream, coll(Kind::AllReduce(ReduceOp::Sum), 10, buf, buf))
        .unwrap();
    let e = r.comm.device().stream_synchronize(r.stream).unwrap_err();
    assert!(
        matches!(&e, SimError::LaunchFailed(m) if m.contains("collective #0 mismatch") && m.contains("10") && m.contains("11")),
        "{e}"
    );
    assert!(matches!(r.comm.error(), Some(CommError::Failed(_))));
    assert!(
        child.wait().unwrap().success(),
        "rank 1 did not see the mismatch"
    );
}

/// As NCCL: the peer's exit is the communicator's asynchronous error within milliseconds, naming
/// the rank and process; the survivor's operation waits (a kernel spinning) until it aborts, and
/// then finishes without data.
#[test]
fn a_process_killed_mid_collective_is_the_survivors_error_at_once() {
    if crate::own_process() {
        return;
    }
    let id = fresh_id();
    let mut child = spawn_child("dies", 1, &id);
    let r = Arc::new(join(&id, 2, 0, Mode::Deferred));
    let marker = posted_marker(&id);
    let waited = Instant::now();
    while !marker.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "rank 1 ended before posting its part"
        );
        assert!(waited.elapsed() < JOIN, "rank 1 never posted its part");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(&marker);
    let pid = child.id();
    child.kill().unwrap();
    child.wait().unwrap();
    let buf = upload(&r, &vec![1; BIG]);
    r.comm
        .collective(
            r.stream,
            coll(Kind::AllReduce(ReduceOp::Sum), BIG, buf, buf),
        )
        .unwrap();
    let start = Instant::now();
    let sync = {
        let r = r.clone();
        std::thread::spawn(move || r.comm.device().stream_synchronize(r.stream))
    };
    let message = loop {
        match r.comm.error() {
            Some(CommError::PeerExited { rank: 1, message }) => break message,
            None => {}
            other => panic!("{other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no error after 5 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(
        message.contains(&format!("rank 1 (process {pid})")) && message.contains("exited"),
        "{message}"
    );
    assert!(
        !sync.is_finished(),
        "the operation finished without its peer"
    );
    r.comm.abort();
    sync.join().unwrap().unwrap();
    eprintln!(
        "the survivor's error {:?} after the kill: {message}",
        start.elapsed()
    );
}
