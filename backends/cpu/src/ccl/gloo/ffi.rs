//! The gloo shim's C interface (`shim.cpp`, compiled by `build.rs` with feature `gloo` and linked
//! with Debian's `libgloo`): the one place its functions are declared.

use std::ffi::{c_char, c_int, c_void};

/// A deadline passed.
pub const TIMEOUT: c_int = 1;
/// The connection to a peer broke (it closed its connections: aborted, or died).
pub const IO: c_int = 2;

pub type SinkFn = unsafe extern "C" fn(sink: *mut c_void, data: *const c_char, len: usize);
pub type StoreSetFn = unsafe extern "C" fn(
    user: *mut c_void,
    key: *const c_char,
    klen: usize,
    val: *const c_char,
    vlen: usize,
) -> c_int;
pub type StoreGetFn = unsafe extern "C" fn(
    user: *mut c_void,
    key: *const c_char,
    klen: usize,
    sink: *mut c_void,
    put: SinkFn,
) -> c_int;
pub type StoreWaitFn = unsafe extern "C" fn(
    user: *mut c_void,
    keys: *const *const c_char,
    klens: *const usize,
    n: usize,
    timeout_ms: i64,
) -> c_int;
pub type ReduceFn = unsafe extern "C" fn(
    user: *const c_void,
    c: *mut c_void,
    a: *const c_void,
    b: *const c_void,
    n: usize,
);

/// One send or receive of a group.
#[repr(C)]
pub struct P2p {
    pub ptr: *mut c_void,
    pub bytes: usize,
    pub peer: c_int,
    pub recv: c_int,
    pub slot: u64,
}

extern "C" {
    pub fn uh_gloo_connect(
        store_user: *mut c_void,
        set: StoreSetFn,
        get: StoreGetFn,
        wait: StoreWaitFn,
        rank: c_int,
        size: c_int,
        hostname: *const c_char,
        iface: *const c_char,
        timeout_ms: i64,
        out: *mut *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn uh_gloo_close(ctx: *mut c_void);
    pub fn uh_gloo_free(ctx: *mut c_void);
    pub fn uh_gloo_exchange(
        ctx: *mut c_void,
        token: u64,
        slot: u64,
        timeout_ms: i64,
        tokens: *mut u64,
        arrived: *mut u8,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn uh_gloo_allreduce(
        ctx: *mut c_void,
        input: *const c_void,
        out: *mut c_void,
        count: usize,
        elsize: usize,
        f: ReduceFn,
        f_user: *const c_void,
        tag: u32,
        timeout_ms: i64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn uh_gloo_reduce(
        ctx: *mut c_void,
        input: *const c_void,
        out: *mut c_void,
        count: usize,
        elsize: usize,
        f: ReduceFn,
        f_user: *const c_void,
        root: c_int,
        tag: u32,
        timeout_ms: i64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn uh_gloo_broadcast(
        ctx: *mut c_void,
        input: *const c_void,
        out: *mut c_void,
        bytes: usize,
        root: c_int,
        tag: u32,
        timeout_ms: i64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn uh_gloo_allgather(
        ctx: *mut c_void,
        input: *const c_void,
        out: *mut c_void,
        bytes: usize,
        tag: u32,
        timeout_ms: i64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn uh_gloo_alltoall(
        ctx: *mut c_void,
        input: *const c_void,
        out: *mut c_void,
        bytes: usize,
        tag: u32,
        timeout_ms: i64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn uh_gloo_p2p(
        ctx: *mut c_void,
        calls: *const P2p,
        n: usize,
        timeout_ms: i64,
        done: *mut u8,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
}
