//! The CUDA backend against direct driver and cuBLAS calls on the same GPU, side by side in one
//! run (rounds alternate the two), for the performance targets of the CUDA backend:
//!
//! | measure | unihal | peer | target |
//! |---|---|---|---|
//! | kernel launch | `Stream::launch` | `cuLaunchKernel` through cudarc | at most 0.5 µs slower |
//! | pinned copies | `copy_h2d`/`copy_d2h` | `cuMemcpy*Async` on `cuMemHostAlloc` memory | >= 0.95x |
//! | add, softmax, layer norm | `run_op` | a device-to-device copy of the same bytes | >= 0.85x / 0.7x of its bandwidth |
//! | matmul | `run_op` (cuBLAS) | `cublasSgemm` | >= 0.95x |
//!
//! Prints a markdown table of medians. `--small` shrinks every size (a smoke run, e.g. on the
//! simulated driver, whose figures mean nothing). Device 0 of the `cuda` backend.
//!
//! Run: `cargo run --release -p unihal-cuda --example cuda_vs_direct [-- --small] [--rounds R]`

use cudarc::driver::{result, sys};
use std::ffi::{c_void, CString};
use std::sync::Arc;
use std::time::Instant;
use unihal_cuda::CudaBackend;
use unihal_hal::{
    Backend, DType, Device, FillValue, HalError, KernelArgs, LaunchConfig, ModuleSource, OpCall,
    OpId, Result, Stream, TensorView,
};
use unihal_kernels::testing::{names, PTX};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn drv<T>(call: &str, r: std::result::Result<T, cudarc::driver::DriverError>) -> Result<T> {
    r.map_err(|e| HalError::Internal(format!("{call}: {e}")))
}

/// Seconds of `f`, after the stream drained.
fn timed(s: &Arc<dyn Stream>, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    s.synchronize()?;
    let t0 = Instant::now();
    f()?;
    s.synchronize()?;
    Ok(t0.elapsed().as_secs_f64())
}

/// Seconds of `f` on a raw stream, after it drained.
fn timed_raw(raw: sys::CUstream, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    // SAFETY: a live stream of the current context.
    drv("cuStreamSynchronize", unsafe {
        result::stream::synchronize(raw)
    })?;
    let t0 = Instant::now();
    f()?;
    // SAFETY: as above.
    drv("cuStreamSynchronize", unsafe {
        result::stream::synchronize(raw)
    })?;
    Ok(t0.elapsed().as_secs_f64())
}

struct Row {
    what: String,
    unihal: String,
    peer: String,
    result: String,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let small = args.iter().any(|a| a == "--small");
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(7);
    let launches: usize = if small { 50 } else { 20_000 };
    let copy_bytes: usize = if small { 1 << 16 } else { 256 << 20 };
    let (rows, cols): (u64, u64) = if small { (64, 256) } else { (8192, 8192) };
    let mm: u64 = if small { 64 } else { 4096 };

    let backend = CudaBackend::new();
    let dev: Arc<dyn Device> = backend.open(0)?;
    let s = dev.create_stream()?;
    let mut table = Vec::new();

    // Direct handles on the same device: its primary context, a raw stream, the same module.
    // SAFETY: plain driver calls with valid arguments; every handle is released at the end.
    let ctx = drv("cuDevicePrimaryCtxRetain", unsafe {
        result::primary_ctx::retain(drv("cuDeviceGet", result::device::get(0))?)
    })?;
    // SAFETY: the primary context retained above, released only at the end.
    let bind = || drv("cuCtxSetCurrent", unsafe { result::ctx::set_current(ctx) });
    bind()?;
    let raw = drv(
        "cuStreamCreate",
        result::stream::create(result::stream::StreamKind::NonBlocking),
    )?;
    let ptx = CString::new(PTX).expect("PTX has no NUL");
    // SAFETY: NUL-terminated PTX text.
    let module = drv("cuModuleLoadData", unsafe {
        result::module::load_data(ptx.as_ptr() as *const c_void)
    })?;
    // SAFETY: a live module and an entry it declares.
    let func = drv("cuModuleGetFunction", unsafe {
        result::module::get_function(module, CString::new(names::MUL_ADD_U32).expect("name"))
    })?;

    // --- Kernel launch overhead: `launches` back-to-back launches of a 32-element kernel.
    let buf = dev.alloc(128)?;
    s.fill(&buf, 0, 128, FillValue::U32(1))?;
    let f = dev
        .load_module(&ModuleSource::Ptx(PTX.to_string()))?
        .function(names::MUL_ADD_U32)?;
    let cfg = LaunchConfig::linear(1, 32);
    let mut ka = KernelArgs::new();
    ka.push_buffer(&buf).push(32u32).push(1u32).push(1u32);
    let (mut t_hal, mut t_raw) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        t_hal.push(timed(&s, || {
            for _ in 0..launches {
                // SAFETY: mul_add_u32 takes (buf, n, mul, add) and touches n = 32 words of `buf`
                // (128 bytes), which the arguments keep alive.
                unsafe { s.launch(&f, &cfg, &ka)? };
            }
            Ok(())
        })?);
        bind()?;
        let (mut p, mut n, mut m, mut a) = (buf.device_addr(), 32u32, 1u32, 1u32);
        t_raw.push(timed_raw(raw, || {
            for _ in 0..launches {
                let mut params: [*mut c_void; 4] = [
                    &mut p as *mut _ as *mut c_void,
                    &mut n as *mut _ as *mut c_void,
                    &mut m as *mut _ as *mut c_void,
                    &mut a as *mut _ as *mut c_void,
                ];
                // SAFETY: the same kernel and arguments as above, on a live stream.
                drv("cuLaunchKernel", unsafe {
                    result::launch_kernel(func, (1, 1, 1), (32, 1, 1), 0, raw, &mut params)
                })?;
            }
            Ok(())
        })?);
    }
    let (h, r) = (
        median(t_hal) / launches as f64 * 1e6,
        median(t_raw) / launches as f64 * 1e6,
    );
    table.push(Row {
        what: format!("kernel launch ({launches} back to back), µs each"),
        unihal: format!("{h:.2}"),
        peer: format!("{r:.2}"),
        result: verdict(h - r <= 0.5, format!("{:+.2} µs (target <= +0.5)", h - r)),
    });

    // --- Pinned copies.
    let dbuf = dev.alloc(copy_bytes)?;
    let host = dev.alloc_host(copy_bytes)?;
    // SAFETY: page-locked memory of `copy_bytes`, freed at the end.
    let pinned = drv("cuMemHostAlloc", unsafe {
        result::malloc_host(copy_bytes, 0)
    })?;
    // SAFETY: `pinned` holds `copy_bytes` bytes and outlives the copies (synchronised below).
    let pinned_slice = unsafe { std::slice::from_raw_parts_mut(pinned as *mut u8, copy_bytes) };
    let dptr = dbuf.device_addr();
    for (name, up) in [("h2d", true), ("d2h", false)] {
        let (mut t_hal, mut t_raw) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            t_hal.push(timed(&s, || {
                if up {
                    s.copy_h2d(&host, 0, &dbuf, 0, copy_bytes as u64)
                } else {
                    s.copy_d2h(&dbuf, 0, &host, 0, copy_bytes as u64)
                }
            })?);
            bind()?;
            t_raw.push(timed_raw(raw, || {
                if up {
                    // SAFETY: device and pinned ranges of `copy_bytes`, live until synchronised.
                    drv("cuMemcpyHtoDAsync", unsafe {
                        result::memcpy_htod_async(dptr, &pinned_slice[..], raw)
                    })
                } else {
                    // SAFETY: as above.
                    drv("cuMemcpyDtoHAsync", unsafe {
                        result::memcpy_dtoh_async(&mut pinned_slice[..], dptr, raw)
                    })
                }
            })?);
        }
        let gb = |t: f64| copy_bytes as f64 / t / 1e9;
        let (h, r) = (gb(median(t_hal)), gb(median(t_raw)));
        table.push(Row {
            what: format!("pinned {name} copy of {} MiB, GB/s", copy_bytes >> 20),
            unihal: format!("{h:.1}"),
            peer: format!("{r:.1}"),
            result: verdict(h >= 0.95 * r, format!("{:.3}x (target >= 0.95x)", h / r)),
        });
    }

    // --- Ops against a device-to-device copy of the same bytes.
    let n = rows * cols;
    let t = |b: &unihal_hal::Buffer, shape: &[u64]| TensorView::contiguous(b, DType::F32, shape);
    let (x, x2, y) = (
        dev.alloc(n as usize * 4)?,
        dev.alloc(n as usize * 4)?,
        dev.alloc(n as usize * 4)?,
    );
    let (w, b, st1, st2) = (
        dev.alloc(cols as usize * 4)?,
        dev.alloc(cols as usize * 4)?,
        dev.alloc(rows as usize * 4)?,
        dev.alloc(rows as usize * 4)?,
    );
    for buf in [&x, &x2, &y, &w, &b] {
        s.fill(buf, 0, buf.len(), FillValue::U32(0x3f80_0000))?; // 1.0f32
    }
    let shape = [rows, cols];
    let ops: [(&str, OpCall, f64, f64); 3] = [
        (
            "add",
            OpCall::binary(OpId::Add, t(&x, &shape), t(&x2, &shape), t(&y, &shape)),
            3.0,
            0.85,
        ),
        (
            "softmax",
            OpCall::softmax(OpId::Softmax, t(&x, &shape), t(&y, &shape)),
            2.0,
            0.7,
        ),
        (
            "layer_norm",
            OpCall::layer_norm(
                t(&x, &shape),
                t(&w, &[cols]),
                t(&b, &[cols]),
                t(&y, &shape),
                t(&st1, &[rows]),
                t(&st2, &[rows]),
                1e-5,
            ),
            2.0,
            0.7,
        ),
    ];
    for (name, call, passes, target) in ops {
        s.run_op(&call)?; // compiles or loads the library, warms up
        let (mut t_op, mut t_copy) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            t_op.push(timed(&s, || s.run_op(&call))?);
            t_copy.push(timed(&s, || s.copy_d2d(&x, 0, &y, 0, n * 4))?);
        }
        let bw = |bytes: f64, t: f64| bytes / t / 1e9;
        let (o, c) = (
            bw(passes * n as f64 * 4.0, median(t_op)),
            bw(2.0 * n as f64 * 4.0, median(t_copy)),
        );
        table.push(Row {
            what: format!("{name} f32 {rows}x{cols}, GB/s moved (copy: same bytes)"),
            unihal: format!("{o:.1}"),
            peer: format!("{c:.1} (d2d copy)"),
            result: verdict(
                o >= target * c,
                format!("{:.3}x (target >= {target}x)", o / c),
            ),
        });
    }

    // --- Matmul through cuBLAS against a direct cublasSgemm.
    // SAFETY: the probe does not panic (it only tries to open the library).
    let has_blas = std::panic::catch_unwind(|| unsafe { cudarc::cublas::sys::is_culib_present() })
        .unwrap_or(false);
    if has_blas {
        let bytes = (mm * mm * 4) as usize;
        let (a, bm, c) = (dev.alloc(bytes)?, dev.alloc(bytes)?, dev.alloc(bytes)?);
        for buf in [&a, &bm, &c] {
            s.fill(buf, 0, buf.len(), FillValue::U32(0x3c00_0000))?;
        }
        let sq = [mm, mm];
        let call = OpCall::matmul(t(&a, &sq), t(&bm, &sq), t(&c, &sq), 1.0, 0.0);
        s.run_op(&call)?;
        use cudarc::cublas::sys as blas;
        let mut handle: blas::cublasHandle_t = std::ptr::null_mut();
        bind()?;
        // SAFETY: an out-pointer to a local; then a live handle and stream of this context.
        unsafe {
            blas::cublasCreate_v2(&mut handle);
            blas::cublasSetStream_v2(handle, raw as _);
        }
        let (mut t_hal, mut t_raw) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            t_hal.push(timed(&s, || s.run_op(&call))?);
            bind()?;
            t_raw.push(timed_raw(raw, || {
                let (alpha, beta) = (1.0f32, 0.0f32);
                let k = mm as i32;
                // SAFETY: three live mm x mm f32 matrices; row-major C = A·B computed as
                // column-major Cᵀ = Bᵀ·Aᵀ, as the backend does.
                let st = unsafe {
                    blas::cublasSgemm_v2(
                        handle,
                        blas::cublasOperation_t::CUBLAS_OP_N,
                        blas::cublasOperation_t::CUBLAS_OP_N,
                        k,
                        k,
                        k,
                        &alpha,
                        bm.device_addr() as *const f32,
                        k,
                        a.device_addr() as *const f32,
                        k,
                        &beta,
                        c.device_addr() as *mut f32,
                        k,
                    )
                };
                if st != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                    return Err(HalError::Internal(format!("cublasSgemm: {st:?}")));
                }
                Ok(())
            })?);
        }
        // SAFETY: created above, destroyed once.
        unsafe { blas::cublasDestroy_v2(handle) };
        let tf = |t: f64| 2.0 * (mm as f64).powi(3) / t / 1e12;
        let (h, r) = (tf(median(t_hal)), tf(median(t_raw)));
        table.push(Row {
            what: format!("matmul f32 {mm}^3, TFLOP/s"),
            unihal: format!("{h:.2}"),
            peer: format!("{r:.2} (cublasSgemm)"),
            result: verdict(h >= 0.95 * r, format!("{:.3}x (target >= 0.95x)", h / r)),
        });
    } else {
        table.push(Row {
            what: format!("matmul f32 {mm}^3"),
            unihal: "-".into(),
            peer: "-".into(),
            result: "not measured: cuBLAS is not installed (matmul runs the tiled GEMM)".into(),
        });
    }

    // SAFETY: handles made above, released once, after their work drained.
    unsafe {
        let _ = result::stream::synchronize(raw);
        let _ = result::free_host(pinned);
        let _ = result::module::unload(module);
        let _ = result::stream::destroy(raw);
    }

    println!(
        "device: {} ({}), {rounds} rounds, medians{}\n",
        dev.info().name,
        backend
            .info()
            .libraries
            .first()
            .and_then(|l| l.version.clone())
            .unwrap_or_default(),
        if small {
            ", --small (smoke sizes: figures mean nothing)"
        } else {
            ""
        }
    );
    println!("| measure | unihal | direct | result |\n|---|---|---|---|");
    for r in table {
        println!("| {} | {} | {} | {} |", r.what, r.unihal, r.peer, r.result);
    }
    Ok(())
}

fn verdict(ok: bool, detail: String) -> String {
    format!("{} {detail}", if ok { "met:" } else { "MISSED:" })
}
