//! Bootstrap of multi-process runs: who am I (from the launcher's environment), and a small TCP
//! rendezvous store on `MASTER_ADDR:MASTER_PORT` through which rank 0 hands a vendor unique id (NCCL's
//! 128 bytes, HCCL's 4108) to every other rank.
//!
//! Launchers recognised, in order: torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`), Open MPI (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`),
//! Slurm (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`), PMI (`PMI_RANK`, `PMI_SIZE`); none means
//! a single process. Every wait of the store has a deadline: a rank that never arrives is a
//! `Timeout`, never a hang.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use unihal_hal::{HalError, Invalid, Result};

/// The launcher a process was started by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    OpenMpi,
    Slurm,
    Pmi,
    Single,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    pub launcher: Launcher,
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    /// `MASTER_ADDR:MASTER_PORT`, when set.
    pub master: Option<(String, u16)>,
}

fn num(var: &'static str, v: Option<String>) -> Result<Option<usize>> {
    match v {
        None => Ok(None),
        Some(s) => s.trim().parse().map(Some).map_err(|_| {
            HalError::invalid(
                var,
                Invalid::Value {
                    value: format!("{var}={s:?}"),
                    accepted: "a non-negative integer".into(),
                },
            )
        }),
    }
}

impl LaunchInfo {
    /// Reads the launcher variables through `get` (the environment in [`LaunchInfo::from_env`]).
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming the variable when a value does not parse or a rank is
    /// not below the world size.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<LaunchInfo> {
        let sets: [(Launcher, [&'static str; 4]); 4] = [
            (
                Launcher::Torchrun,
                ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
            ),
            (
                Launcher::OpenMpi,
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                ],
            ),
            (
                Launcher::Slurm,
                [
                    "SLURM_PROCID",
                    "SLURM_NTASKS",
                    "SLURM_LOCALID",
                    "SLURM_NTASKS_PER_NODE",
                ],
            ),
            (
                Launcher::Pmi,
                ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"],
            ),
        ];
        let master = match (get("MASTER_ADDR"), get("MASTER_PORT")) {
            (Some(a), Some(p)) => {
                let port = num("MASTER_PORT", Some(p))?
                    .filter(|&p| p <= u16::MAX as usize)
                    .ok_or_else(|| {
                        HalError::invalid(
                            "MASTER_PORT",
                            Invalid::Value {
                                value: "MASTER_PORT".into(),
                                accepted: "1..=65535".into(),
                            },
                        )
                    })?;
                Some((a, port as u16))
            }
            _ => None,
        };
        for (launcher, [r, w, lr, lw]) in sets {
            let (Some(rank), Some(world)) = (num(r, get(r))?, num(w, get(w))?) else {
                continue;
            };
            if world == 0 || rank >= world {
                return Err(HalError::invalid(
                    r,
                    Invalid::Value {
                        value: format!("{r}={rank} with {w}={world}"),
                        accepted: format!("{r} < {w}"),
                    },
                ));
            }
            let local_rank = num(lr, get(lr))?.unwrap_or(0);
            // Slurm's tasks-per-node may read "4(x2)": keep the leading number.
            let lw_val = get(lw).map(|v| v.split('(').next().unwrap_or("").to_string());
            let local_world = num(lw, lw_val)?.unwrap_or(1).max(local_rank + 1);
            return Ok(LaunchInfo {
                launcher,
                rank,
                world_size: world,
                local_rank,
                local_world_size: local_world,
                master,
            });
        }
        Ok(LaunchInfo {
            launcher: Launcher::Single,
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master,
        })
    }

    /// [`LaunchInfo::from_vars`] over the process environment.
    ///
    /// # Errors
    /// As `from_vars`.
    pub fn from_env() -> Result<LaunchInfo> {
        Self::from_vars(&|k| std::env::var(k).ok())
    }
}

type Table = Arc<(Mutex<HashMap<String, Vec<u8>>>, Condvar)>;

/// Rank 0's side of the store: a key-value table served on a TCP port until dropped.
pub struct StoreServer {
    table: Table,
    port: u16,
}

impl StoreServer {
    /// Listens on `addr` (port 0 picks one).
    ///
    /// # Errors
    /// [`HalError::Unavailable`] when the address cannot be bound.
    pub fn bind(addr: &str) -> Result<StoreServer> {
        let listener = TcpListener::bind(addr).map_err(|e| HalError::Unavailable {
            what: format!("rendezvous store on {addr}"),
            reason: e.to_string(),
        })?;
        let port = listener
            .local_addr()
            .map_err(|e| HalError::Internal(e.to_string()))?
            .port();
        let table: Table = Arc::default();
        let t = table.clone();
        std::thread::Builder::new()
            .name("unihal-store".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    let t = t.clone();
                    std::thread::spawn(move || serve(conn, t));
                }
            })
            .map_err(|e| HalError::Internal(e.to_string()))?;
        Ok(StoreServer { table, port })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Publishes `value` under `key`.
    pub fn set(&self, key: &str, value: &[u8]) {
        self.table
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), value.to_vec());
        self.table.1.notify_all();
    }
}

/// The longest request line the store reads (`GET <key> <timeout_ms>`); a longer one closes
/// the connection, so a peer cannot make the store buffer without bound.
const MAX_REQUEST: u64 = 4096;
/// The largest value a client accepts (a unique id is at most HCCL's 4,108 bytes); a larger
/// announced length is refused before anything is allocated.
pub const MAX_VALUE: usize = 1 << 20;
/// The longest wait a request may ask for (longer ones are cut to it).
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// One client connection: `GET <key> <timeout_ms>\n` answered by `OK <len>\n<bytes>` or
/// `TIMEOUT\n`. Anything else (garbage, a line over [`MAX_REQUEST`] bytes, a truncated line)
/// closes the connection; the store goes on serving the others.
fn serve(conn: TcpStream, t: Table) {
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut w = conn;
    let mut line = String::new();
    while (&mut reader)
        .take(MAX_REQUEST)
        .read_line(&mut line)
        .is_ok_and(|n| n > 0)
    {
        if !line.ends_with('\n') {
            return;
        }
        let mut parts = line.split_whitespace();
        let (Some("GET"), Some(key), Some(ms)) = (
            parts.next(),
            parts.next(),
            parts.next().and_then(|m| m.parse::<u64>().ok()),
        ) else {
            return;
        };
        let deadline = Instant::now() + Duration::from_millis(ms).min(MAX_WAIT);
        let (lock, cv) = &*t;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        let value = loop {
            if let Some(v) = g.get(key) {
                break Some(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                break None;
            }
            g = cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        drop(g);
        let ok = match value {
            Some(v) => w
                .write_all(format!("OK {}\n", v.len()).as_bytes())
                .and_then(|_| w.write_all(&v)),
            None => w.write_all(b"TIMEOUT\n"),
        };
        if ok.is_err() {
            return;
        }
        line.clear();
    }
}

/// Fetches `key` from the store at `addr`, retrying the connection until `timeout`.
///
/// # Errors
/// [`HalError::Timeout`] when the store cannot be reached or the key is not set in time.
pub fn store_get(addr: &str, key: &str, timeout: Duration) -> Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let tmo = |what: String| HalError::Timeout {
        what,
        millis: timeout.as_millis() as u64,
    };
    let conn = loop {
        let attempt = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| TcpStream::connect_timeout(&a, Duration::from_millis(200)));
        match attempt {
            Some(Ok(c)) => break c,
            _ if Instant::now() >= deadline => {
                return Err(tmo(format!("connecting to the rendezvous store at {addr}")))
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let _ = conn.set_read_timeout(Some(left + Duration::from_secs(2)));
    let mut w = conn
        .try_clone()
        .map_err(|e| HalError::Internal(e.to_string()))?;
    w.write_all(format!("GET {key} {}\n", left.as_millis()).as_bytes())
        .map_err(|e| tmo(format!("store at {addr}: {e}")))?;
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| tmo(format!("store at {addr}: {e}")))?;
    match line
        .trim()
        .strip_prefix("OK ")
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) if n > MAX_VALUE => Err(HalError::Unavailable {
            what: format!("rendezvous store at {addr}"),
            reason: format!("it announced a value of {n} bytes for {key:?}, over the {MAX_VALUE} a client accepts"),
        }),
        Some(n) => {
            let mut v = vec![0u8; n];
            r.read_exact(&mut v)
                .map_err(|e| tmo(format!("store at {addr}: {e}")))?;
            Ok(v)
        }
        None => Err(tmo(format!("key {key:?} was not published at {addr}"))),
    }
}

/// This process's rank of the world when `backend`'s collective engine connects the processes
/// already (MPI under `mpirun`), on device `local_rank % devices`; `None` for engines that need a
/// unique id exchange (then use [`init_world`]). Collective over every process of the job.
///
/// # Errors
/// Errors of the launcher variables, of opening the device, or of the engine.
pub fn connected_world(
    backend: &dyn unihal_hal::Backend,
    config: &unihal_hal::CommConfig,
) -> Result<Option<Arc<dyn unihal_hal::Communicator>>> {
    let Some(ccl) = backend.collectives() else {
        return Ok(None);
    };
    let local = LaunchInfo::from_env()?.local_rank % backend.probe()?.max(1);
    ccl.connected_world(&backend.open(local)?, config)
        .transpose()
}

/// The key under which rank 0 publishes the world communicator's unique id.
pub const WORLD_KEY: &str = "unihal/world/unique-id";

/// Creates this rank's world communicator. Engines whose processes are connected already (MPI)
/// give it directly ([`unihal_hal::Collectives::connected_world`]). Otherwise rank 0 makes a unique id and serves it from a store on
/// `MASTER_PORT`; every other rank fetches it from `MASTER_ADDR:MASTER_PORT`; then all call
/// `init_rank`. Rank 0 returns the store, which must live until every rank has joined.
///
/// # Errors
/// [`HalError::Unsupported`] when the backend has no collectives; [`HalError::InvalidArgument`]
/// when a multi-rank job has no `MASTER_ADDR`/`MASTER_PORT`; [`HalError::Timeout`] when ranks or
/// the store do not answer within `config.timeout` (or `UNIHAL_CCL_TIMEOUT`).
pub fn init_world(
    backend: &dyn unihal_hal::Backend,
    device: &Arc<dyn unihal_hal::Device>,
    info: &LaunchInfo,
    config: &unihal_hal::CommConfig,
) -> Result<(Arc<dyn unihal_hal::Communicator>, Option<StoreServer>)> {
    let ccl = backend.collectives().ok_or_else(|| {
        HalError::unsupported(format!("collectives on backend {}", backend.name()))
    })?;
    let timeout = config
        .timeout
        .unwrap_or_else(unihal_hal::ccl::timeout_from_env);
    if let Some(world) = ccl.connected_world(device, config) {
        // The engine's processes are connected already (MPI): no id to exchange.
        return Ok((world?, None));
    }
    if info.world_size == 1 {
        let id = ccl.unique_id()?;
        return Ok((ccl.init_rank(&id, 1, 0, device, config)?, None));
    }
    let (addr, port) = info.master.clone().ok_or_else(|| {
        HalError::invalid(
            "MASTER_ADDR",
            Invalid::Other(format!(
                "a {}-rank job needs MASTER_ADDR and MASTER_PORT",
                info.world_size
            )),
        )
    })?;
    let (id, server) = if info.rank == 0 {
        let server = StoreServer::bind(&format!("0.0.0.0:{port}"))?;
        let id = ccl.unique_id()?;
        server.set(WORLD_KEY, &id.0);
        (id, Some(server))
    } else {
        (
            unihal_hal::UniqueId(store_get(&format!("{addr}:{port}"), WORLD_KEY, timeout)?),
            None,
        )
    };
    let comm = ccl.init_rank(&id, info.world_size, info.rank, device, config)?;
    Ok((comm, server))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn reads_every_launcher() {
        let t = LaunchInfo::from_vars(&vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(
            t,
            LaunchInfo {
                launcher: Launcher::Torchrun,
                rank: 3,
                world_size: 8,
                local_rank: 1,
                local_world_size: 4,
                master: Some(("10.0.0.1".into(), 29500))
            }
        );
        let o = LaunchInfo::from_vars(&vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]))
        .unwrap();
        assert_eq!(
            (o.launcher, o.rank, o.world_size, o.local_rank),
            (Launcher::OpenMpi, 1, 2, 1)
        );
        let s = LaunchInfo::from_vars(&vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "3(x2)"),
        ]))
        .unwrap();
        assert_eq!(
            (s.launcher, s.rank, s.local_world_size),
            (Launcher::Slurm, 5, 3)
        );
        let p = LaunchInfo::from_vars(&vars(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")])).unwrap();
        assert_eq!(p.launcher, Launcher::Pmi);
        assert_eq!(
            LaunchInfo::from_vars(&vars(&[])).unwrap().launcher,
            Launcher::Single
        );
        let e = LaunchInfo::from_vars(&vars(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.to_string().contains("RANK=4"), "{e}");
        assert!(LaunchInfo::from_vars(&vars(&[("RANK", "x"), ("WORLD_SIZE", "4")])).is_err());
    }

    #[test]
    fn store_hands_an_hccl_sized_id_to_other_ranks() {
        let server = StoreServer::bind("127.0.0.1:0").unwrap();
        let addr = format!("127.0.0.1:{}", server.port());
        let id: Vec<u8> = (0..4108u32).map(|i| (i * 7) as u8).collect();
        let getters: Vec<_> = (0..3)
            .map(|_| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    store_get(&addr, "unihal/world", Duration::from_secs(10))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        server.set("unihal/world", &id);
        for g in getters {
            assert_eq!(g.join().unwrap().unwrap(), id);
        }
    }

    /// Sends `request` raw to the store and returns what it answered before closing.
    fn raw(port: u16, request: &[u8]) -> Vec<u8> {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = c.write_all(request);
        let _ = c.shutdown(std::net::Shutdown::Write);
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        out
    }

    #[test]
    fn hostile_requests_close_their_connection_and_the_store_keeps_serving() {
        let server = StoreServer::bind("127.0.0.1:0").unwrap();
        server.set("k", b"v");
        let port = server.port();
        // An absurd wait (overflowed the deadline: a panic), garbage, a truncated line, an
        // oversized line without end, a replayed request after the answer.
        assert_eq!(raw(port, b"GET k 18446744073709551615\n"), b"OK 1\nv");
        assert_eq!(raw(port, b"\x00\xffgarbage\n"), b"");
        assert_eq!(raw(port, b"GET k"), b"");
        assert_eq!(raw(port, &vec![b'A'; 10 << 20]), b"");
        assert_eq!(raw(port, b"GET k 0\nGET k 0\n"), b"OK 1\nvOK 1\nv");
        assert_eq!(raw(port, b"GET missing 0\n"), b"TIMEOUT\n");
        assert_eq!(
            store_get(&format!("127.0.0.1:{port}"), "k", Duration::from_secs(5)).unwrap(),
            b"v"
        );
    }

    /// A fake store that answers every connection with `reply`.
    fn fake_store(reply: &'static [u8]) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut line = String::new();
                let _ = BufReader::new(c.try_clone().unwrap()).read_line(&mut line);
                let _ = c.write_all(reply);
            }
        });
        port
    }

    #[test]
    fn a_hostile_store_is_an_error_never_a_huge_allocation_or_a_panic() {
        let get = |reply: &'static [u8]| {
            store_get(
                &format!("127.0.0.1:{}", fake_store(reply)),
                "k",
                Duration::from_millis(500),
            )
        };
        let e = get(b"OK 99999999999999\n").unwrap_err();
        assert!(
            matches!(e, HalError::Unavailable { .. }) && e.to_string().contains("99999999999999"),
            "{e}"
        );
        for reply in [&b"OK 8\nabc"[..], b"garbage\n", b"OK -1\n", b""] {
            let e = get(reply).unwrap_err();
            assert!(matches!(e, HalError::Timeout { .. }), "{reply:?}: {e}");
        }
    }

    #[test]
    fn a_missing_rank_or_store_is_a_timeout_within_the_bound() {
        let server = StoreServer::bind("127.0.0.1:0").unwrap();
        let t0 = Instant::now();
        let e = store_get(
            &format!("127.0.0.1:{}", server.port()),
            "never",
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(matches!(e, HalError::Timeout { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_millis(300 + 1500));
        // Nobody listens on the port of a dropped listener.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t0 = Instant::now();
        let e = store_get(
            &format!("127.0.0.1:{port}"),
            "k",
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(matches!(e, HalError::Timeout { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_millis(300 + 1500));
    }
}
