//! The client side of a c10d TCPStore: what a PyTorch worker's `TCPStore(is_master=False)` does,
//! with `PrefixStore`'s key layout.

use super::wire::{self, query};
use std::io::{ErrorKind, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use unihal_hal::{HalError, Result};

/// One connection to a store, with a key prefix. Keys are laid out as PyTorch lays them out, so a
/// Python process reading the same store sees the same keys: `TCPStore` puts `/` before every
/// key, and each [`TcpStore::with_prefix`] (PyTorch's `PrefixStore`) puts `prefix/` before it.
///
/// Thread safety: any thread; requests of clones made by `with_prefix` share the connection and
/// take turns on it. Every request has a deadline: a store that stops answering is a
/// [`HalError::Timeout`], never a hang. A request that fails half-way (its deadline passed, the
/// answer was cut or made no sense) closes the connection, so an answer still in flight can never
/// be read as the next request's: the next request opens a new connection (and handshake).
#[derive(Clone)]
pub struct TcpStore {
    /// The connection; `None` after a request failed half-way, until the next request.
    conn: Arc<Mutex<Option<TcpStream>>>,
    host: String,
    port: u16,
    addr: String,
    prefix: String,
    timeout: Duration,
}

/// Errors of a request: `Timeout` when the deadline passed, else `Unavailable` (the store went
/// away or answered something that is not the protocol).
fn io_error(addr: &str, what: &str, e: std::io::Error, timeout: Duration) -> HalError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => HalError::Timeout {
            what: format!("{what} on the store at {addr}"),
            millis: unihal_hal::deadline::millis(timeout),
        },
        _ => HalError::Unavailable {
            what: format!("the c10d TCPStore at {addr}"),
            reason: format!("{what}: {e}"),
        },
    }
}

/// A read timeout for `set_read_timeout`, which refuses zero.
fn read_timeout(t: Duration) -> Option<Duration> {
    Some(t.max(Duration::from_millis(1)))
}

impl TcpStore {
    /// Connects to the store at `host:port`, retrying until `timeout` (its server may not be up
    /// yet), then checks that it speaks the protocol: the validation handshake, then a ping whose
    /// nonce must come back.
    ///
    /// # Errors
    /// [`HalError::Timeout`] when nothing accepts the connection in time;
    /// [`HalError::AbiMismatch`] when the peer does not answer the handshake as a c10d TCPStore of
    /// PyTorch [`wire::PYTORCH_VERSION`] does.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStore> {
        let addr = format!("{host}:{port}");
        let conn = open(host, port, &addr, timeout, false)?;
        Ok(TcpStore {
            conn: Arc::new(Mutex::new(Some(conn))),
            host: host.to_string(),
            port,
            addr,
            prefix: "/".into(),
            timeout,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<TcpStream>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `talk` on the connection (opened again first when an earlier request closed it);
    /// when `talk` fails, the connection is closed with whatever is still in flight on it.
    fn on_conn<T>(&self, talk: impl FnOnce(&mut TcpStream) -> Result<T>) -> Result<T> {
        let mut g = self.lock();
        let c = match &mut *g {
            Some(c) => c,
            slot => slot.insert(open(&self.host, self.port, &self.addr, self.timeout, true)?),
        };
        let r = talk(c);
        if r.is_err() {
            *g = None;
        }
        r
    }

    /// The same store with `prefix/` before every key (PyTorch's `PrefixStore(prefix, store)`).
    pub fn with_prefix(&self, prefix: &str) -> TcpStore {
        TcpStore {
            prefix: format!("{}{prefix}/", self.prefix),
            ..self.clone()
        }
    }

    /// The address of the store (`host:port`).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The key as it travels: the prefixes, then `key`.
    fn key(&self, key: &str) -> Vec<u8> {
        format!("{}{key}", self.prefix).into_bytes()
    }

    /// Sends `req` and reads the answer with `read`, under the store's timeout.
    fn request<T>(
        &self,
        what: &str,
        req: &[u8],
        read: impl FnOnce(&mut TcpStream) -> std::io::Result<T>,
    ) -> Result<T> {
        self.on_conn(|c| {
            let _ = c.set_read_timeout(read_timeout(self.timeout));
            c.write_all(req)
                .and_then(|()| read(c))
                .map_err(|e| io_error(&self.addr, what, e, self.timeout))
        })
    }

    /// Sets `key` to `value` (`store.set`).
    ///
    /// # Errors
    /// [`HalError::Unavailable`] when the store is gone.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut req = vec![query::SET];
        wire::put_bytes(&mut req, &self.key(key));
        wire::put_bytes(&mut req, value);
        // No answer: a ping behind it confirms the store took it (and that it is still there).
        self.request(&format!("set {key:?}"), &req, |_| Ok(()))?;
        self.ping()
    }

    /// Checks the store still answers.
    ///
    /// # Errors
    /// As [`TcpStore::set`]; [`HalError::Timeout`] when it does not answer in time.
    pub fn ping(&self) -> Result<()> {
        let mut req = vec![query::PING];
        req.extend_from_slice(&7u32.to_le_bytes());
        self.on_conn(|c| {
            let _ = c.set_read_timeout(read_timeout(self.timeout));
            let n = c
                .write_all(&req)
                .and_then(|()| wire::get_u32(c))
                .map_err(|e| io_error(&self.addr, "ping", e, self.timeout))?;
            if n != 7 {
                return Err(HalError::Unavailable {
                    what: format!("the c10d TCPStore at {}", self.addr),
                    reason: format!("a ping came back as {n}: the connection is out of step"),
                });
            }
            Ok(())
        })
    }

    /// The value of `key`, waiting for it to be set for at most the store's timeout
    /// (`store.get`).
    ///
    /// # Errors
    /// [`HalError::Timeout`] naming the key when it is not set in time; as `set`.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.wait(&[key], self.timeout)?;
        let mut req = vec![query::GET];
        wire::put_bytes(&mut req, &self.key(key));
        self.request(&format!("get {key:?}"), &req, |c| {
            wire::get_bytes(c, wire::MAX_VALUE)
        })
    }

    /// Adds `delta` to the counter `key` (0 when unset) and returns the new value (`store.add`).
    ///
    /// # Errors
    /// As `set`.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut req = vec![query::ADD];
        wire::put_bytes(&mut req, &self.key(key));
        req.extend_from_slice(&delta.to_le_bytes());
        self.request(&format!("add to {key:?}"), &req, |c| {
            wire::get_u64(c).map(|v| v as i64)
        })
    }

    /// Whether every key is set, without waiting (`store.check`).
    ///
    /// # Errors
    /// As `set`.
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        let mut req = vec![query::CHECK];
        req.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for k in keys {
            wire::put_bytes(&mut req, &self.key(k));
        }
        let r = self.request("check", &req, wire::get_u8)?;
        Ok(r == wire::READY)
    }

    /// Removes `key`; true when it was set (`store.delete_key`).
    ///
    /// # Errors
    /// As `set`.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let mut req = vec![query::DELETE_KEY];
        wire::put_bytes(&mut req, &self.key(key));
        Ok(self.request(&format!("delete {key:?}"), &req, wire::get_u64)? > 0)
    }

    /// Waits until every key is set, for at most `timeout` (`store.wait`); on the deadline the
    /// wait is cancelled on the server (`CANCEL_WAIT`) so the connection stays usable.
    ///
    /// # Errors
    /// [`HalError::Timeout`] naming the keys; as `set`.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let mut req = vec![query::WAIT];
        req.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for k in keys {
            wire::put_bytes(&mut req, &self.key(k));
        }
        let gone = |e: std::io::Error| io_error(&self.addr, "wait", e, timeout);
        let unexpected = |what: &str, r: u8| HalError::Unavailable {
            what: format!("the c10d TCPStore at {}", self.addr),
            reason: format!("it answered {what} with {r}"),
        };
        self.on_conn(|c| {
            let _ = c.set_read_timeout(read_timeout(timeout));
            c.write_all(&req).map_err(gone)?;
            match wire::get_u8(c) {
                Ok(wire::STOP_WAITING) => return Ok(true),
                Ok(r) => return Err(unexpected("a wait", r)),
                Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(gone(e))
                }
                Err(_) => {}
            }
            // The deadline passed: cancel, and read the answers the server owes (a STOP_WAITING
            // that crossed the cancel comes first).
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            c.write_all(&[query::CANCEL_WAIT]).map_err(gone)?;
            let mut r = wire::get_u8(c).map_err(gone)?;
            if r == wire::STOP_WAITING {
                r = wire::get_u8(c).map_err(gone)?;
            }
            if r != wire::WAIT_CANCELED {
                return Err(unexpected("a cancelled wait", r));
            }
            Ok(false)
        })
        .and_then(|ready| {
            // Not ready: the wait was cancelled and answered, the connection is in step.
            ready.then_some(()).ok_or_else(|| HalError::Timeout {
                what: format!("waiting for {keys:?} on the store at {}", self.addr),
                millis: unihal_hal::deadline::millis(timeout),
            })
        })
    }

    /// The store's timeout (every request's deadline; `get` waits this long).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpStore({} prefix {:?})", self.addr, self.prefix)
    }
}

/// A connection to the store at `host:port` (`addr`) that passed the handshake. The first one is
/// retried until `timeout` (the server may not be up yet); a connection opened again after a
/// failed request (`again`) is tried once: that server was up, and one that no longer accepts
/// connections is gone, which the caller learns at once.
fn open(host: &str, port: u16, addr: &str, timeout: Duration, again: bool) -> Result<TcpStream> {
    let deadline = unihal_hal::deadline::after(if again { Duration::ZERO } else { timeout });
    let mut conn = loop {
        let attempt = (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)));
        match attempt {
            Some(Ok(c)) => break c,
            // The store this client reached before no longer accepts connections: it is gone.
            Some(Err(e)) if again => {
                return Err(HalError::Unavailable {
                    what: format!("the c10d TCPStore at {addr}"),
                    reason: format!("reconnecting after a failed request: {e}"),
                })
            }
            _ if Instant::now() >= deadline => {
                return Err(HalError::Timeout {
                    what: format!(
                        "connecting to the c10d TCPStore at {addr} (is MASTER_ADDR:MASTER_PORT \
                         the launcher's store, and is it up?)"
                    ),
                    millis: unihal_hal::deadline::millis(timeout),
                })
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = conn.set_nodelay(true);
    handshake(&mut conn, addr, timeout)?;
    Ok(conn)
}

/// The validation handshake, then a ping whose nonce must come back.
fn handshake(c: &mut TcpStream, addr: &str, timeout: Duration) -> Result<()> {
    let nonce = std::process::id() ^ 0x5eed_0000;
    let mut req = vec![query::VALIDATE];
    req.extend_from_slice(&wire::MAGIC.to_le_bytes());
    req.push(query::PING);
    req.extend_from_slice(&nonce.to_le_bytes());
    let mismatch = |why: String| HalError::AbiMismatch {
        what: format!(
            "{addr} does not answer the c10d TCPStore handshake of PyTorch {} ({why}); is \
             MASTER_PORT another service's port, or the store of an incompatible PyTorch?",
            wire::PYTORCH_VERSION
        ),
    };
    let _ = c.set_read_timeout(read_timeout(timeout));
    c.write_all(&req)
        .map_err(|e| mismatch(format!("sending it: {e}")))?;
    match wire::get_u32(c) {
        Ok(n) if n == nonce => Ok(()),
        Ok(n) => Err(mismatch(format!(
            "the ping came back as {n:#x}, not {nonce:#x}"
        ))),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
            Err(mismatch("it closed the connection".into()))
        }
        Err(e) => Err(mismatch(e.to_string())),
    }
}
