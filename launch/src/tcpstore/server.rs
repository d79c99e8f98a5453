//! The server side of a c10d TCPStore: what PyTorch's `TCPStore(is_master=True)` serves, for runs
//! whose launcher serves no store (rank 0 serves it then).

use super::wire::{self, query};
use std::collections::HashMap;
use std::io::{BufReader, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use unihal_hal::{HalError, Result};

#[derive(Default)]
struct Table {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Vec<u8>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A store served on a TCP port until dropped. Any client of the protocol may use it: unihal's
/// [`super::TcpStore`], PyTorch's `TCPStore(is_master=False)`, gloo through unihal's engine.
///
/// Each connection is served by its own thread; a connection that breaks the protocol (a bad
/// handshake, an unknown query, a field over the limits of [`wire`]) is closed and the others are
/// served on. Thread safety: any thread.
pub struct TcpStoreServer {
    table: Arc<Table>,
    port: u16,
    stop: Arc<AtomicBool>,
}

impl TcpStoreServer {
    /// Listens on `addr` (`host:port`; port 0 picks one).
    ///
    /// # Errors
    /// [`HalError::Unavailable`] when the address cannot be bound (the message names it).
    pub fn bind(addr: &str) -> Result<TcpStoreServer> {
        let listener = TcpListener::bind(addr).map_err(|e| HalError::Unavailable {
            what: format!("a c10d TCPStore on {addr}"),
            reason: e.to_string(),
        })?;
        let port = listener
            .local_addr()
            .map_err(|e| HalError::Internal(e.to_string()))?
            .port();
        let table = Arc::new(Table::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (table.clone(), stop.clone());
        std::thread::Builder::new()
            .name("unihal-tcpstore".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let t = t.clone();
                    let _ = std::thread::Builder::new()
                        .name("unihal-tcpstore-conn".into())
                        .spawn(move || {
                            let _ = Conn::new(conn, t).map(|mut c| c.serve());
                        });
                }
            })
            .map_err(|e| HalError::Internal(e.to_string()))?;
        Ok(TcpStoreServer { table, port, stop })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sets `key` (a key as it travels, prefixes included) to `value`.
    pub fn set_raw(&self, key: &[u8], value: &[u8]) {
        self.table.lock().insert(key.to_vec(), value.to_vec());
        self.table.changed.notify_all();
    }

    /// The number of keys set.
    pub fn num_keys(&self) -> usize {
        self.table.lock().len()
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        // Stop accepting: wake the accept loop with a connection of our own.
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_millis(200),
        );
    }
}

/// A protocol error: the connection is closed.
fn bad(why: String) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, why)
}

struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
    table: Arc<Table>,
}

impl Conn {
    fn new(conn: TcpStream, table: Arc<Table>) -> std::io::Result<Conn> {
        let _ = conn.set_nodelay(true);
        Ok(Conn {
            r: BufReader::new(conn.try_clone()?),
            w: conn,
            table,
        })
    }

    /// A request's list of keys: at most [`wire::MAX_KEYS`] of them, of at most
    /// [`wire::MAX_MESSAGE`] bytes together.
    fn keys(&mut self) -> std::io::Result<Vec<Vec<u8>>> {
        let n = wire::get_u64(&mut self.r)?;
        if n > wire::MAX_KEYS {
            return Err(bad(format!("{n} keys in one request")));
        }
        let mut total = 0u64;
        (0..n)
            .map(|_| {
                let k = wire::get_bytes(&mut self.r, wire::MAX_KEY)?;
                total += k.len() as u64;
                if total > wire::MAX_MESSAGE {
                    return Err(bad(format!(
                        "keys of over {} bytes in one request",
                        wire::MAX_MESSAGE
                    )));
                }
                Ok(k)
            })
            .collect()
    }

    fn key(&mut self) -> std::io::Result<Vec<u8>> {
        wire::get_bytes(&mut self.r, wire::MAX_KEY)
    }

    fn value(&mut self) -> std::io::Result<Vec<u8>> {
        wire::get_bytes(&mut self.r, wire::MAX_VALUE)
    }

    fn set(&self, k: Vec<u8>, v: Vec<u8>) {
        self.table.lock().insert(k, v);
        self.table.changed.notify_all();
    }

    /// Serves requests until the client leaves or breaks the protocol.
    fn serve(&mut self) -> std::io::Result<()> {
        if wire::get_u8(&mut self.r)? != query::VALIDATE {
            return Err(bad("no validation handshake".into()));
        }
        let magic = wire::get_u32(&mut self.r)?;
        if magic != wire::MAGIC {
            tracing::warn!(
                target: "unihal::launch",
                "c10d TCPStore: a client sent the handshake magic {magic:#x}, not {:#x} \
                 (another protocol, or not a c10d TCPStore client): connection closed",
                wire::MAGIC
            );
            return Err(bad("wrong magic".into()));
        }
        loop {
            let q = match wire::get_u8(&mut self.r) {
                Ok(q) => q,
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            };
            let mut out = Vec::new();
            match q {
                query::SET => {
                    let (k, v) = (self.key()?, self.value()?);
                    self.set(k, v);
                }
                query::COMPARE_SET => {
                    let (k, expected, desired) = (self.key()?, self.value()?, self.value()?);
                    let mut m = self.table.lock();
                    let now = match m.get(&k) {
                        None if expected.is_empty() => {
                            m.insert(k, desired.clone());
                            desired
                        }
                        None => expected,
                        Some(cur) if *cur == expected => {
                            m.insert(k, desired.clone());
                            desired
                        }
                        Some(cur) => cur.clone(),
                    };
                    drop(m);
                    self.table.changed.notify_all();
                    wire::put_bytes(&mut out, &now);
                }
                query::GET => {
                    let k = self.key()?;
                    let v = self.table.lock().get(&k).cloned().unwrap_or_default();
                    wire::put_bytes(&mut out, &v);
                }
                query::ADD => {
                    let k = self.key()?;
                    let delta = wire::get_u64(&mut self.r)? as i64;
                    let mut m = self.table.lock();
                    let cur = m
                        .get(&k)
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                        .unwrap_or(0);
                    let new = cur.wrapping_add(delta);
                    // Stored as PyTorch stores counters: decimal text.
                    m.insert(k, new.to_string().into_bytes());
                    drop(m);
                    self.table.changed.notify_all();
                    out.extend_from_slice(&new.to_le_bytes());
                }
                query::CHECK => {
                    let ks = self.keys()?;
                    let m = self.table.lock();
                    let ready = ks.iter().all(|k| m.contains_key(k));
                    out.push(if ready { wire::READY } else { wire::NOT_READY });
                }
                query::WAIT => {
                    let ks = self.keys()?;
                    self.wait(&ks)?;
                    continue;
                }
                query::GETNUMKEYS => {
                    out.extend_from_slice(&(self.table.lock().len() as u64).to_le_bytes());
                }
                query::DELETE_KEY => {
                    let k = self.key()?;
                    let n = self.table.lock().remove(&k).is_some() as u64;
                    out.extend_from_slice(&n.to_le_bytes());
                }
                query::APPEND => {
                    let (k, v) = (self.key()?, self.value()?);
                    let mut m = self.table.lock();
                    let cur = m.entry(k).or_default();
                    if cur.len() as u64 + v.len() as u64 > wire::MAX_VALUE {
                        return Err(bad("an append past the value limit".into()));
                    }
                    cur.extend_from_slice(&v);
                    drop(m);
                    self.table.changed.notify_all();
                }
                query::MULTI_GET => {
                    let ks = self.keys()?;
                    let m = self.table.lock();
                    // The reply's size is known before it is built: one over the limit (a key
                    // named many times over a large value) closes the connection instead.
                    let size: u64 = ks
                        .iter()
                        .map(|k| 8 + m.get(k).map_or(0, |v| v.len() as u64))
                        .sum();
                    if size > wire::MAX_MESSAGE {
                        return Err(bad(format!(
                            "a MULTI_GET reply of {size} bytes, over the {} accepted",
                            wire::MAX_MESSAGE
                        )));
                    }
                    out.reserve(size as usize);
                    for k in &ks {
                        wire::put_bytes(&mut out, m.get(k).map_or(&[][..], |v| v));
                    }
                }
                query::MULTI_SET => {
                    let n = wire::get_u64(&mut self.r)?;
                    if n > wire::MAX_KEYS {
                        return Err(bad(format!("{n} keys in one request")));
                    }
                    for _ in 0..n {
                        let (k, v) = (self.key()?, self.value()?);
                        self.set(k, v);
                    }
                }
                query::CANCEL_WAIT => out.push(wire::WAIT_CANCELED),
                query::PING => {
                    out.extend_from_slice(&wire::get_u32(&mut self.r)?.to_le_bytes());
                }
                other => return Err(bad(format!("unknown query {other}"))),
            }
            if !out.is_empty() {
                self.w.write_all(&out)?;
            }
        }
    }

    /// Answers `STOP_WAITING` once every key is set; meanwhile watches the connection for the
    /// client's `CANCEL_WAIT` (answered `WAIT_CANCELED`) or its departure.
    fn wait(&mut self, keys: &[Vec<u8>]) -> std::io::Result<()> {
        loop {
            {
                let m = self.table.lock();
                if keys.iter().all(|k| m.contains_key(k)) {
                    drop(m);
                    return self.w.write_all(&[wire::STOP_WAITING]);
                }
                let _ = self
                    .table
                    .changed
                    .wait_timeout(m, Duration::from_millis(20))
                    .unwrap_or_else(|e| e.into_inner());
            }
            // Anything the client sends while waiting must be a cancel.
            if self.r.buffer().is_empty() {
                self.r.get_ref().set_nonblocking(true)?;
                let mut b = [0u8; 1];
                let got = self.r.get_ref().peek(&mut b);
                self.r.get_ref().set_nonblocking(false)?;
                match got {
                    Ok(0) => return Err(bad("the client left while waiting".into())),
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            return match wire::get_u8(&mut self.r)? {
                query::CANCEL_WAIT => self.w.write_all(&[wire::WAIT_CANCELED]),
                q => Err(bad(format!("query {q} during a wait"))),
            };
        }
    }
}
