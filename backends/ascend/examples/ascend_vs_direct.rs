//! The Ascend backend against direct aclnn calls on the same NPU, side by side in one run
//! (rounds alternate the two): what unihal's op path costs over a hand-written aclnn call.
//!
//! | measure | unihal | direct | target |
//! |---|---|---|---|
//! | enqueue overhead (small `add`) | `Stream::run_op` | descriptors, `aclnnAddGetWorkspaceSize`, `aclnnAdd`, descriptors destroyed | at most 10 µs more per op |
//! | `add` throughput (large) | `run_op` | the same direct call | >= 0.95x |
//! | `softmax` throughput | `run_op` | `aclnnSoftmax` | >= 0.95x |
//! | `matmul` throughput (f32 where the chip runs it, else f16) | `run_op` | `aclnnBatchMatMul` | >= 0.95x |
//!
//! The direct side uses the backend's own symbol tables (one vendor call each, no checks, no
//! retention) on a stream of its own. Figures are medians; on the simulated CANN runtime they
//! mean nothing (`--small` shrinks every size for such smoke runs).
//!
//! Run: `cargo run --release -p unihal-ascend --example ascend_vs_direct [-- --small] [--rounds R]`

use std::sync::Arc;
use std::time::Instant;
use unihal_ascend::conv::{acl_dtype, FORMAT_ND};
use unihal_ascend::ffi::aclnn::Executor;
use unihal_ascend::ffi::nnopbase::Desc;
use unihal_ascend::{AscendBackend, AscendStream, Cann};
use unihal_hal::{Backend, Buffer, DType, HalError, OpCall, OpId, Result, Stream, TensorView};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A contiguous tensor descriptor over `b`.
fn tensor(c: &Cann, b: &Buffer, d: DType, shape: &[i64]) -> Desc {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let n = [shape.iter().product::<i64>()];
    // SAFETY: arrays of the lengths passed; device memory of a live buffer.
    unsafe {
        (c.nnop.create_tensor)(
            shape.as_ptr(),
            shape.len() as u64,
            acl_dtype(d),
            strides.as_ptr(),
            0,
            FORMAT_ND,
            n.as_ptr(),
            1,
            b.device_addr() as *mut std::ffi::c_void,
        )
    }
}

/// One direct operator call on `raw`: phase 1 by `p1`, a preallocated workspace, phase 2.
fn direct(
    run: unihal_ascend::ffi::aclnn::Run,
    ws_buf: &Buffer,
    raw: *mut std::ffi::c_void,
    p1: impl FnOnce(*mut u64, *mut Executor) -> i32,
) -> Result<()> {
    let (mut ws, mut ex): (u64, Executor) = (0, std::ptr::null_mut());
    let rc = p1(&mut ws, &mut ex);
    if rc != 0 || ws > ws_buf.len() {
        return Err(HalError::Internal(format!("phase 1: {rc}, workspace {ws}")));
    }
    let p = if ws > 0 {
        ws_buf.device_addr() as *mut std::ffi::c_void
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: phase 1's executor, run once with a large enough workspace on a live stream.
    match unsafe { run(p, ws, ex, raw) } {
        0 => Ok(()),
        rc => Err(HalError::Internal(format!("phase 2: {rc}"))),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let small = args.iter().any(|a| a == "--small");
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if small { 3 } else { 20 });
    let backend = AscendBackend::new();
    let dev = backend.open(0)?;
    let cann = unihal_ascend::loader::cann()?;
    let s = dev.create_stream()?;
    let ds = dev.create_stream()?;
    let raw = AscendStream::of(&ds)?.native_handle();
    let raw = match raw {
        unihal_hal::NativeHandle::Ptr(p) => p,
        _ => return Err(HalError::Internal("no native stream".into())),
    };
    let ws = dev.alloc(64 << 20)?;
    let a = cann
        .aclnn
        .add
        .ok_or_else(|| HalError::unsupported("no aclnnAdd"))?;
    let mut rows = Vec::new();

    // Enqueue overhead: K small adds, host time per op (then drained).
    let (n_small, k) = (256u64, if small { 20 } else { 2000 });
    let bufs: Vec<Buffer> = (0..3)
        .map(|_| dev.alloc(n_small as usize * 4))
        .collect::<Result<_>>()?;
    let views: Vec<TensorView> = bufs
        .iter()
        .map(|b| TensorView::contiguous(b, DType::F32, &[n_small]))
        .collect();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..k {
            s.run_op(&OpCall::binary(
                OpId::Add,
                views[0].clone(),
                views[1].clone(),
                views[2].clone(),
            ))?;
        }
        ours.push(t.elapsed().as_secs_f64() / k as f64);
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..k {
            let sh = [n_small as i64];
            let (x, y, o) = (
                tensor(cann, &bufs[0], DType::F32, &sh),
                tensor(cann, &bufs[1], DType::F32, &sh),
                tensor(cann, &bufs[2], DType::F32, &sh),
            );
            let mut one = 1.0f32.to_le_bytes();
            // SAFETY: 4 readable bytes of an f32, copied by the call.
            let al = unsafe {
                (cann.nnop.create_scalar)(one.as_mut_ptr() as *mut _, acl_dtype(DType::F32))
            };
            // SAFETY: live descriptors and out-pointers.
            direct(a.run, &ws, raw, |w, e| unsafe { (a.ws)(x, y, al, o, w, e) })?;
            // SAFETY: descriptors made above, destroyed once after phase 2 returned.
            unsafe {
                (cann.nnop.destroy_tensor)(x);
                (cann.nnop.destroy_tensor)(y);
                (cann.nnop.destroy_tensor)(o);
                (cann.nnop.destroy_scalar)(al);
            }
        }
        theirs.push(t.elapsed().as_secs_f64() / k as f64);
        ds.synchronize()?;
    }
    let (u, d) = (median(ours) * 1e6, median(theirs) * 1e6);
    rows.push((
        format!("enqueue overhead: add of {n_small} f32"),
        format!("{u:.2} µs/op"),
        format!("{d:.2} µs/op"),
        format!(
            "{} +{:.2} µs (target <= 10 µs)",
            if u - d <= 10.0 { "met:" } else { "MISSED:" },
            u - d
        ),
    ));

    // Throughput: large add and softmax, matmul; time of one op with the stream drained.
    let timed = |st: &Arc<dyn Stream>, f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        st.synchronize()?;
        let t = Instant::now();
        f()?;
        st.synchronize()?;
        Ok(t.elapsed().as_secs_f64())
    };
    let n = if small { 1 << 12 } else { 1 << 24 };
    let (rows_n, cols) = (n / 1024, 1024u64);
    let big: Vec<Buffer> = (0..3)
        .map(|_| dev.alloc(n as usize * 4))
        .collect::<Result<_>>()?;
    let mm = if small { 64u64 } else { 2048 };
    let mt = if dev.capabilities().supports(OpId::Matmul, DType::F32) {
        DType::F32
    } else {
        DType::F16
    };
    let mats: Vec<Buffer> = (0..3)
        .map(|_| dev.alloc((mm * mm) as usize * mt.size()))
        .collect::<Result<_>>()?;
    for (what, op) in [("add", 0), ("softmax", 1), ("matmul", 2)] {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let call = match op {
                0 => OpCall::binary(
                    OpId::Add,
                    TensorView::contiguous(&big[0], DType::F32, &[n]),
                    TensorView::contiguous(&big[1], DType::F32, &[n]),
                    TensorView::contiguous(&big[2], DType::F32, &[n]),
                ),
                1 => OpCall::softmax(
                    OpId::Softmax,
                    TensorView::contiguous(&big[0], DType::F32, &[rows_n, cols]),
                    TensorView::contiguous(&big[2], DType::F32, &[rows_n, cols]),
                ),
                _ => OpCall::matmul(
                    TensorView::contiguous(&mats[0], mt, &[mm, mm]),
                    TensorView::contiguous(&mats[1], mt, &[mm, mm]),
                    TensorView::contiguous(&mats[2], mt, &[mm, mm]),
                    1.0,
                    0.0,
                ),
            };
            ours.push(timed(&s, &mut || s.run_op(&call))?);
            theirs.push(timed(&ds, &mut || {
                let mut made: Vec<Desc> = Vec::new();
                let r = match op {
                    0 => {
                        let sh = [n as i64];
                        let (x, y, o) = (
                            tensor(cann, &big[0], DType::F32, &sh),
                            tensor(cann, &big[1], DType::F32, &sh),
                            tensor(cann, &big[2], DType::F32, &sh),
                        );
                        made.extend([x, y, o]);
                        let mut one = 1.0f32.to_le_bytes();
                        // SAFETY: 4 readable bytes, copied by the call.
                        let al = unsafe {
                            (cann.nnop.create_scalar)(
                                one.as_mut_ptr() as *mut _,
                                acl_dtype(DType::F32),
                            )
                        };
                        // SAFETY: live descriptors and out-pointers.
                        let r =
                            direct(a.run, &ws, raw, |w, e| unsafe { (a.ws)(x, y, al, o, w, e) });
                        // SAFETY: made above, destroyed once.
                        unsafe { (cann.nnop.destroy_scalar)(al) };
                        r
                    }
                    1 => {
                        let sm = cann
                            .aclnn
                            .softmax
                            .ok_or_else(|| HalError::unsupported("no aclnnSoftmax"))?;
                        let sh = [rows_n as i64, cols as i64];
                        let (x, o) = (
                            tensor(cann, &big[0], DType::F32, &sh),
                            tensor(cann, &big[2], DType::F32, &sh),
                        );
                        made.extend([x, o]);
                        // SAFETY: live descriptors and out-pointers.
                        direct(sm.run, &ws, raw, |w, e| unsafe { (sm.ws)(x, 1, o, w, e) })
                    }
                    _ => {
                        let bm = cann
                            .aclnn
                            .batch_mat_mul
                            .ok_or_else(|| HalError::unsupported("no aclnnBatchMatMul"))?;
                        let sh = [1, mm as i64, mm as i64];
                        let (x, y, o) = (
                            tensor(cann, &mats[0], mt, &sh),
                            tensor(cann, &mats[1], mt, &sh),
                            tensor(cann, &mats[2], mt, &sh),
                        );
                        made.extend([x, y, o]);
                        // SAFETY: live descriptors and out-pointers; KEEP_DTYPE as the backend.
                        direct(bm.run, &ws, raw, |w, e| unsafe {
                            (bm.ws)(x, y, o, 0, w, e)
                        })
                    }
                };
                for d in made {
                    // SAFETY: descriptors made above, destroyed once after phase 2 returned.
                    unsafe { (cann.nnop.destroy_tensor)(d) };
                }
                r
            })?);
        }
        let (u, d) = (median(ours), median(theirs));
        let ratio = d / u;
        rows.push((
            format!("{what} throughput"),
            format!("{:.3} ms", u * 1e3),
            format!("{:.3} ms", d * 1e3),
            format!(
                "{} {ratio:.2}x (target >= 0.95x)",
                if ratio >= 0.95 { "met:" } else { "MISSED:" }
            ),
        ));
    }
    println!(
        "# ascend_vs_direct on {} ({}, {} rounds{})\n",
        dev.info().name,
        cann.soc,
        rounds,
        if small { ", smoke sizes" } else { "" }
    );
    println!("| measure | unihal | direct aclnn | result |\n|---|---|---|---|");
    for (w, u, d, r) in rows {
        println!("| {w} | {u} | {d} | {r} |");
    }
    Ok(())
}
