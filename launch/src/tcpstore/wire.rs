//! The c10d TCPStore wire protocol, as PyTorch 2.15.0's `TCPStore` client and its libuv server
//! speak it (`torch/csrc/distributed/c10d/TCPStore*.cpp`), checked against that release by
//! `launch/tests/all/torch_store.rs`.
//!
//! A connection opens with `VALIDATE` and the 32-bit magic number (no reply; a server that does
//! not recognise it closes the connection). Every request is one query byte and its arguments;
//! integers are little-endian (the host order of every machine PyTorch ships for); a string or
//! byte vector is a `u64` length and the bytes.

/// The magic number of the validation handshake.
pub const MAGIC: u32 = 0x3C85_F7CE;

/// The PyTorch release the protocol is checked against.
pub const PYTORCH_VERSION: &str = "2.15.0";

/// Query bytes (`c10d::detail::QueryType`).
pub mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
}

/// `CHECK`'s answers.
pub const READY: u8 = 0;
pub const NOT_READY: u8 = 1;
/// `WAIT`'s answers: the keys are there; the wait was cancelled (`CANCEL_WAIT`).
pub const STOP_WAITING: u8 = 0;
pub const WAIT_CANCELED: u8 = 1;

/// The longest key either side accepts: a longer announced length is refused before anything is
/// allocated.
pub const MAX_KEY: u64 = 64 << 10;
/// The largest value either side accepts (a unique id is at most HCCL's 4,108 bytes; gloo's
/// addresses are a few hundred).
pub const MAX_VALUE: u64 = 16 << 20;
/// The most keys one `WAIT`, `CHECK`, `MULTI_GET` or `MULTI_SET` may name.
pub const MAX_KEYS: u64 = 1 << 16;
/// The most bytes the server holds for one request's keys or builds for one reply (four of the
/// largest values): a `MULTI_GET` naming one large value many times is refused, its connection
/// closed, before its reply is built, so a connection's memory stays bounded whatever it asks.
pub const MAX_MESSAGE: u64 = 4 * MAX_VALUE;

/// Appends `bytes` as a length-prefixed vector.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads a length-prefixed vector of at most `max` bytes.
///
/// # Errors
/// The reader's error, or `InvalidData` when the announced length is over `max`.
pub fn get_bytes(r: &mut impl std::io::Read, max: u64) -> std::io::Result<Vec<u8>> {
    let n = get_u64(r)?;
    if n > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a {n}-byte field, over the {max} accepted"),
        ));
    }
    let mut v = vec![0u8; n as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

/// Reads a little-endian `u64`.
///
/// # Errors
/// The reader's.
pub fn get_u64(r: &mut impl std::io::Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Reads a little-endian `u32`.
///
/// # Errors
/// The reader's.
pub fn get_u32(r: &mut impl std::io::Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Reads one byte.
///
/// # Errors
/// The reader's.
pub fn get_u8(r: &mut impl std::io::Read) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}
