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
/// [`HalError::Timeout`], never a hang.
#[derive(Clone)]
pub struct TcpStore {
    conn: Arc<Mutex<TcpStream>>,
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
            millis: timeout.as_millis() as u64,
        },
        _ => HalError::Unavailable {
            what: format!("the c10d TCPStore at {addr}"),
            reason: format!("{what}: {e}"),
        },
    }
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
        let deadline = Instant::now() + timeout;
        let conn = loop {
            let attempt = (host, port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .map(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)));
            match attempt {
                Some(Ok(c)) => break c,
                _ if Instant::now() >= deadline => {
                    return Err(HalError::Timeout {
                        what: format!(
                            "connecting to the c10d TCPStore at {addr} (is MASTER_ADDR:MASTER_PORT \
                             the launcher's store, and is it up?)"
                        ),
                        millis: timeout.as_millis() as u64,
                    })
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let _ = conn.set_nodelay(true);
        let store = TcpStore {
            conn: Arc::new(Mutex::new(conn)),
            addr,
            prefix: "/".into(),
            timeout,
        };
        store.handshake()?;
        Ok(store)
    }

    fn handshake(&self) -> Result<()> {
        let nonce = std::process::id() ^ 0x5eed_0000;
        let mut req = vec![query::VALIDATE];
        req.extend_from_slice(&wire::MAGIC.to_le_bytes());
        req.push(query::PING);
        req.extend_from_slice(&nonce.to_le_bytes());
        let mismatch = |why: String| HalError::AbiMismatch {
            what: format!(
                "{} does not answer the c10d TCPStore handshake of PyTorch {} ({why}); is \
                 MASTER_PORT another service's port, or the store of an incompatible PyTorch?",
                self.addr,
                wire::PYTORCH_VERSION
            ),
        };
        let mut c = self.lock();
        let _ = c.set_read_timeout(Some(self.timeout.max(Duration::from_millis(1))));
        c.write_all(&req)
            .map_err(|e| mismatch(format!("sending it: {e}")))?;
        match wire::get_u32(&mut *c) {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, TcpStream> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
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
        let mut c = self.lock();
        let _ = c.set_read_timeout(Some(self.timeout.max(Duration::from_millis(1))));
        c.write_all(req)
            .and_then(|()| read(&mut c))
            .map_err(|e| io_error(&self.addr, what, e, self.timeout))
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
        let n = self.request("ping", &req, wire::get_u32)?;
        if n != 7 {
            return Err(HalError::Unavailable {
                what: format!("the c10d TCPStore at {}", self.addr),
                reason: format!("a ping came back as {n}: the connection is out of step"),
            });
        }
        Ok(())
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
        let mut c = self.lock();
        let gone = |e: std::io::Error| io_error(&self.addr, "wait", e, timeout);
        let _ = c.set_read_timeout(Some(timeout.max(Duration::from_millis(1))));
        c.write_all(&req).map_err(gone)?;
        match wire::get_u8(&mut *c) {
            Ok(wire::STOP_WAITING) => return Ok(()),
            Ok(r) => {
                return Err(HalError::Unavailable {
                    what: format!("the c10d TCPStore at {}", self.addr),
                    reason: format!("it answered a wait with {r}"),
                })
            }
            Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(gone(e))
            }
            Err(_) => {}
        }
        // The deadline passed: cancel, and read the answers the server owes (a STOP_WAITING that
        // crossed the cancel comes first).
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        c.write_all(&[query::CANCEL_WAIT]).map_err(gone)?;
        let mut r = wire::get_u8(&mut *c).map_err(gone)?;
        if r == wire::STOP_WAITING {
            r = wire::get_u8(&mut *c).map_err(gone)?;
        }
        if r != wire::WAIT_CANCELED {
            return Err(HalError::Unavailable {
                what: format!("the c10d TCPStore at {}", self.addr),
                reason: format!("it answered a cancelled wait with {r}"),
            });
        }
        Err(HalError::Timeout {
            what: format!("waiting for {keys:?} on the store at {}", self.addr),
            millis: timeout.as_millis() as u64,
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
