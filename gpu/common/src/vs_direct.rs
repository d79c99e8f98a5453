//! The "unihal against direct vendor calls" benchmark every GPU backend runs, side by side in one
//! run on one device (rounds alternate the two), for the shared performance targets:
//!
//! | measure | unihal | direct | target |
//! |---|---|---|---|
//! | kernel launch | `Stream::launch` | the runtime's launch call | at most 0.5 µs slower |
//! | pinned copies | `copy_h2d`/`copy_d2h` | the runtime's async copies on its pinned memory | >= 0.95x |
//! | add, softmax, layer norm | `run_op` | a device-to-device copy of the same bytes | >= 0.85x / 0.7x of its bandwidth |
//! | matmul | `run_op` (the vendor BLAS) | the BLAS's own SGEMM call | >= 0.95x |
//!
//! The direct side calls the backend's [`Runtime`] entry points (one vendor call each: no
//! argument checks, no retention) on a stream and module of its own. Figures are medians; on a
//! simulated runtime they mean nothing (`small` shrinks every size for such smoke runs).

use crate::device::GpuDevice;
use crate::runtime::{Raw, Runtime};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;
use unihal_hal::{
    Buffer, DType, Device, FillValue, HalError, KernelArgs, LaunchConfig, ModuleSource, OpCall,
    OpId, Result, Stream, TensorView,
};
use unihal_kernels::testing::names;

/// One row of the table.
pub struct Row {
    pub what: String,
    pub unihal: String,
    pub direct: String,
    pub result: String,
}

/// A direct SGEMM of the vendor's BLAS: `(stream, a, b, c, n)` computes row-major `c = a · b`
/// of `n x n` f32 matrices on `stream` (the caller's handle, bound to it).
pub type DirectSgemm<'a> = Box<dyn FnMut(Raw, u64, u64, u64, i32) -> Result<()> + 'a>;

/// What to run.
pub struct Options<'a> {
    /// Smoke sizes.
    pub small: bool,
    /// Rounds per measure (medians over them).
    pub rounds: usize,
    /// The test kernels in a format the device loads.
    pub test_kernels: ModuleSource,
    /// The BLAS's name and its direct SGEMM, when the BLAS is installed.
    pub sgemm: Option<(&'static str, DirectSgemm<'a>)>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn verdict(ok: bool, detail: String) -> String {
    format!("{} {detail}", if ok { "met:" } else { "MISSED:" })
}

/// Seconds of `f`, after the stream drained.
fn timed(s: &Arc<dyn Stream>, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    s.synchronize()?;
    let t0 = Instant::now();
    f()?;
    s.synchronize()?;
    Ok(t0.elapsed().as_secs_f64())
}

/// The benchmark on `dev` (a device of runtime `R`).
///
/// # Errors
/// Any call's error; [`HalError::InvalidArgument`] for a device of another backend.
pub fn run<R: Runtime>(dev: &Arc<dyn Device>, mut opt: Options<'_>) -> Result<Vec<Row>> {
    let gpu = dev
        .as_any()
        .downcast_ref::<GpuDevice<R>>()
        .ok_or_else(|| HalError::Internal(format!("not a {} device", R::VENDOR)))?;
    let (rt, core) = (gpu.rt(), gpu.core().clone());
    let call = |what: &str, f: &mut dyn FnMut() -> Result<()>| core.call(what, f);
    let small = opt.small;
    let rounds = opt.rounds.max(1);
    let launches: usize = if small { 50 } else { 20_000 };
    let copy_bytes: usize = if small { 1 << 16 } else { 256 << 20 };
    let (rows, cols): (u64, u64) = if small { (64, 256) } else { (8192, 8192) };
    let mm: u64 = if small { 64 } else { 4096 };
    let s = dev.create_stream()?;
    let mut table = Vec::new();

    // Direct handles on the same device: a raw stream and the same module.
    let mut raw = Raw::NULL;
    call("stream create", &mut || {
        raw = rt.stream_create()?;
        Ok(())
    })?;
    let timed_raw = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        call("stream synchronize", &mut || rt.stream_synchronize(raw))?;
        let t0 = Instant::now();
        call("direct", f)?;
        call("stream synchronize", &mut || rt.stream_synchronize(raw))?;
        Ok(t0.elapsed().as_secs_f64())
    };
    let prepared = rt.prepare_module(&opt.test_kernels)?;
    let mut module = Raw::NULL;
    let mut func = Raw::NULL;
    call("module load", &mut || {
        module = rt.module_load(&prepared.image)?;
        let name = std::ffi::CString::new(names::MUL_ADD_U32).expect("no NUL");
        func = rt
            .module_function(module, &name)?
            .ok_or_else(|| HalError::Internal("no mul_add kernel".into()))?;
        Ok(())
    })?;

    // --- Kernel launch overhead: `launches` back-to-back launches of a 32-element kernel.
    let buf = dev.alloc(128)?;
    s.fill(&buf, 0, 128, FillValue::U32(1))?;
    let f = dev
        .load_module(&opt.test_kernels)?
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
        let (mut p, mut n, mut m, mut a) = (buf.device_addr(), 32u32, 1u32, 1u32);
        t_raw.push(timed_raw(&mut || {
            for _ in 0..launches {
                let mut params: [*mut c_void; 4] = [
                    &mut p as *mut _ as *mut c_void,
                    &mut n as *mut _ as *mut c_void,
                    &mut m as *mut _ as *mut c_void,
                    &mut a as *mut _ as *mut c_void,
                ];
                // SAFETY: the same kernel and arguments as above, on a live stream; `buf` lives
                // until the end of this function, after the stream drained.
                unsafe { rt.launch(func, [1, 1, 1], [32, 1, 1], 0, raw, &mut params)? };
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
        direct: format!("{r:.2}"),
        result: verdict(h - r <= 0.5, format!("{:+.2} µs (target <= +0.5)", h - r)),
    });

    // --- Pinned copies.
    let dbuf = dev.alloc(copy_bytes)?;
    let host = dev.alloc_host(copy_bytes)?;
    let mut pinned: *mut u8 = std::ptr::null_mut();
    call("host alloc", &mut || {
        pinned = rt.host_alloc(copy_bytes)?;
        Ok(())
    })?;
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
            t_raw.push(timed_raw(&mut || {
                // SAFETY: device and pinned ranges of `copy_bytes`, live until synchronised.
                unsafe {
                    if up {
                        rt.copy_h2d(dptr, pinned, copy_bytes, raw)
                    } else {
                        rt.copy_d2h(pinned, dptr, copy_bytes, raw)
                    }
                }
            })?);
        }
        let gb = |t: f64| copy_bytes as f64 / t / 1e9;
        let (h, r) = (gb(median(t_hal)), gb(median(t_raw)));
        table.push(Row {
            what: format!("pinned {name} copy of {} MiB, GB/s", copy_bytes >> 20),
            unihal: format!("{h:.1}"),
            direct: format!("{r:.1}"),
            result: verdict(h >= 0.95 * r, format!("{:.3}x (target >= 0.95x)", h / r)),
        });
    }

    // --- Ops against a device-to-device copy of the same bytes.
    let n = rows * cols;
    let t = |b: &Buffer, shape: &[u64]| TensorView::contiguous(b, DType::F32, shape);
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
    for (name, op, passes, target) in ops {
        s.run_op(&op)?; // compiles or loads the library, warms up
        let (mut t_op, mut t_copy) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            t_op.push(timed(&s, || s.run_op(&op))?);
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
            direct: format!("{c:.1} (d2d copy)"),
            result: verdict(
                o >= target * c,
                format!("{:.3}x (target >= {target}x)", o / c),
            ),
        });
    }

    // --- Matmul through the vendor BLAS against its direct SGEMM.
    match opt.sgemm.as_mut() {
        Some((blas, sgemm)) => {
            let bytes = (mm * mm * 4) as usize;
            let (a, bm, c) = (dev.alloc(bytes)?, dev.alloc(bytes)?, dev.alloc(bytes)?);
            for buf in [&a, &bm, &c] {
                s.fill(buf, 0, buf.len(), FillValue::U32(0x3c00_0000))?;
            }
            let sq = [mm, mm];
            let mcall = OpCall::matmul(t(&a, &sq), t(&bm, &sq), t(&c, &sq), 1.0, 0.0);
            s.run_op(&mcall)?;
            let (mut t_hal, mut t_raw) = (Vec::new(), Vec::new());
            let (pa, pb, pc) = (a.device_addr(), bm.device_addr(), c.device_addr());
            for _ in 0..rounds {
                t_hal.push(timed(&s, || s.run_op(&mcall))?);
                t_raw.push(timed_raw(&mut || sgemm(raw, pa, pb, pc, mm as i32))?);
            }
            let tf = |t: f64| 2.0 * (mm as f64).powi(3) / t / 1e12;
            let (h, r) = (tf(median(t_hal)), tf(median(t_raw)));
            table.push(Row {
                what: format!("matmul f32 {mm}^3, TFLOP/s"),
                unihal: format!("{h:.2}"),
                direct: format!("{r:.2} ({blas} SGEMM)"),
                result: verdict(h >= 0.95 * r, format!("{:.3}x (target >= 0.95x)", h / r)),
            });
        }
        None => table.push(Row {
            what: format!("matmul f32 {mm}^3"),
            unihal: "-".into(),
            direct: "-".into(),
            result: "not measured: no vendor BLAS is installed (matmul runs the tiled GEMM)".into(),
        }),
    }

    call("release", &mut || {
        let _ = rt.stream_synchronize(raw);
        // SAFETY: handles made above, released once, after their work drained.
        unsafe {
            let _ = rt.host_free(pinned);
            let _ = rt.module_unload(module);
            let _ = rt.stream_destroy(raw);
        }
        Ok(())
    })?;
    Ok(table)
}

/// Prints the table in markdown, under a line naming the device and run.
pub fn print(dev: &dyn Device, runtime_version: &str, rounds: usize, small: bool, table: &[Row]) {
    println!(
        "device: {} ({runtime_version}), {rounds} rounds, medians{}\n",
        dev.info().name,
        if small {
            ", --small (smoke sizes: figures mean nothing)"
        } else {
            ""
        }
    );
    println!("| measure | unihal | direct | result |\n|---|---|---|---|");
    for r in table {
        println!(
            "| {} | {} | {} | {} |",
            r.what, r.unihal, r.direct, r.result
        );
    }
}

/// `--small` and `--rounds R` (default 7) from the command line.
pub fn args() -> (bool, usize) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let small = args.iter().any(|a| a == "--small");
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(7);
    (small, rounds)
}
