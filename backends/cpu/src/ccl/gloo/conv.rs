//! Conversions for the gloo engine: the shim's return codes to unihal's errors, and the
//! element-wise reductions gloo calls back into.

use super::ffi;
use std::ffi::{c_char, c_int, c_void};
use unihal_hal::host_reduce;
use unihal_hal::{DType, HalError, ReduceOp, Result};

/// The shim's message buffer.
pub(crate) struct ErrBuf(pub [c_char; 1024]);

impl ErrBuf {
    pub(crate) fn new() -> ErrBuf {
        ErrBuf([0; 1024])
    }
    pub(crate) fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr()
    }
    fn text(&self) -> String {
        let bytes: Vec<u8> = self
            .0
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// `Ok` for 0; else the error of `what`: `Timeout` past a deadline, `Aborted` when a peer's
/// connection broke (it aborted or died: gloo cannot tell which), `Vendor` otherwise.
pub(crate) fn check(rc: c_int, what: &str, err: &ErrBuf, timeout_ms: i64) -> Result<()> {
    let msg = err.text();
    match rc {
        0 => Ok(()),
        ffi::TIMEOUT => Err(HalError::Timeout {
            what: format!("{what}: {msg}"),
            millis: timeout_ms.max(0) as u64,
        }),
        ffi::IO => Err(HalError::Aborted {
            what: format!(
                "{what}: a peer's connection broke (the peer aborted, or its process died): {msg}"
            ),
        }),
        code => Err(HalError::Vendor {
            library: "gloo".into(),
            call: what.into(),
            code: code as i64,
            name: "exception".into(),
            message: msg,
        }),
    }
}

/// What a reduction callback reduces: gloo hands its `user` pointer back (a `'static` value).
pub(crate) struct Reduction {
    pub dtype: DType,
    /// `Avg` reduces as `Sum` (the engine divides once at the end).
    pub op: ReduceOp,
}

/// The `Reduction` for `(dtype, op)`, `'static` so gloo may hold its address for the call.
pub(crate) fn reduction(dtype: DType, op: ReduceOp) -> &'static Reduction {
    use std::sync::OnceLock;
    static ALL: OnceLock<Vec<Reduction>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        DType::ALL
            .into_iter()
            .flat_map(|d| {
                ReduceOp::ALL.into_iter().map(move |o| Reduction {
                    dtype: d,
                    op: if o == ReduceOp::Avg { ReduceOp::Sum } else { o },
                })
            })
            .collect()
    });
    let i = DType::ALL
        .iter()
        .position(|&d| d == dtype)
        .expect("a dtype")
        * ReduceOp::ALL.len()
        + ReduceOp::ALL.iter().position(|&o| o == op).expect("an op");
    &all[i]
}

/// gloo's reduction callback: `c = a (op) b` over `n` elements.
///
/// # Safety
/// `user` is a [`Reduction`] from [`reduction`]; `a`, `b` and `c` hold `n` elements of its dtype
/// (gloo passes its own buffers of the operation's element size).
pub(crate) unsafe extern "C" fn reduce_cb(
    user: *const c_void,
    c: *mut c_void,
    a: *const c_void,
    b: *const c_void,
    n: usize,
) {
    let r = &*(user as *const Reduction);
    host_reduce::reduce(r.dtype, r.op, &[a.cast(), b.cast()], c.cast(), n);
}
