//! `kernels.*`: raw launches: grid and block shapes, argument passing, shared memory, limits.

use crate::blocker::Blocker;
use crate::case::{
    bytes_u32, expect_invalid, foreign_formats, pattern, u32_bytes, Case, CaseResult, Ctx, Need,
};
use crate::{ensure, ensure_eq};
use unihal_hal::{Dim3, HalError, Invalid, KernelArgs, LaunchConfig, ModuleSource};
use unihal_kernels::testing::{names, Pair};

pub fn cases() -> Vec<Case> {
    const K: &[Need] = &[Need::TestKernels];
    // Cases that hold a stream (a Blocker) and run test kernels behind it.
    const KB: &[Need] = &[Need::TestKernels, Need::ConcurrentKernels];
    vec![
        Case::new("kernels.launch.iota_1d", iota).needs(K),
        Case::new("kernels.launch.grid_3d", grid_3d).needs(K),
        Case::new("kernels.launch.block_shapes", block_shapes).needs(K),
        Case::new("kernels.launch.scalar_and_struct_args", scalar_args).needs(K),
        Case::new("kernels.launch.axpy_f32", axpy).needs(K),
        Case::new("kernels.launch.shared_memory", shared_memory).needs(K),
        Case::new("kernels.launch.args_reusable_after_launch", args_reuse).needs(KB),
        Case::new("kernels.launch.buffer_kept_alive", kept_alive).needs(KB),
        Case::new("kernels.launch.invalid_config", invalid_config).needs(K),
        Case::new("kernels.launch.argument_mismatch", arg_mismatch).needs(K),
        Case::new("kernels.module.unknown_entry", unknown_entry).needs(K),
        Case::new("kernels.module.unsupported_format", unsupported_format),
    ]
}

fn launch_coords(ctx: &Ctx, grid: Dim3, block: Dim3) -> CaseResult {
    let n = (grid.volume() * block.volume()) as usize;
    let out = ctx.upload(&vec![0u8; n * 4])?;
    let f = ctx.kernel(names::COORDS)?;
    let mut args = KernelArgs::new();
    args.push_buffer(&out);
    let s = ctx.stream()?;
    // SAFETY: coords writes one u32 per launched thread; out holds exactly that many.
    unsafe {
        s.launch(
            &f,
            &LaunchConfig {
                grid,
                block,
                shared_mem_bytes: 0,
            },
            &args,
        )?
    };
    s.synchronize()?;
    let got = bytes_u32(&ctx.download(&out)?);
    let want: Vec<u32> = (1..=n as u32).collect();
    ensure!(
        got == want,
        "grid {grid:?} block {block:?}: first mismatch at {:?}",
        got.iter().zip(&want).position(|(a, b)| a != b)
    );
    Ok(())
}

fn iota(ctx: &Ctx) -> CaseResult {
    let f = ctx.kernel(names::IOTA_U32)?;
    let s = ctx.stream()?;
    for (blocks, threads, n) in [(1u32, 1u32, 1u32), (1, 64, 50), (7, 64, 448), (13, 32, 400)] {
        let out = ctx.upload(&vec![0xFF; n as usize * 4 + 8])?;
        let mut args = KernelArgs::new();
        args.push_buffer(&out).push(n);
        // SAFETY: iota writes out[g] for g < n; out holds n u32s plus 8 guard bytes.
        unsafe { s.launch(&f, &LaunchConfig::linear(blocks, threads), &args)? };
        s.synchronize()?;
        let got = ctx.download(&out)?;
        let want: Vec<u32> = (0..n).collect();
        ensure_eq!(
            bytes_u32(&got[..n as usize * 4]),
            want,
            "iota over {blocks}x{threads} for n={n}"
        );
        ensure_eq!(
            got[n as usize * 4..],
            [0xFF; 8],
            "guard bytes after iota n={n}"
        );
    }
    Ok(())
}

fn grid_3d(ctx: &Ctx) -> CaseResult {
    launch_coords(ctx, Dim3::new(2, 3, 4), Dim3::new(4, 2, 2))?;
    launch_coords(ctx, Dim3::new(5, 1, 3), Dim3::new(1, 1, 1))
}

fn block_shapes(ctx: &Ctx) -> CaseResult {
    let caps = ctx.device.capabilities().mandatory.clone();
    let max = caps.max_threads_per_block.min(caps.max_block[0]);
    for block in [
        Dim3::x(1),
        Dim3::x(33),
        Dim3::new(8, 8, 1),
        Dim3::new(2, 4, 8),
        Dim3::x(max),
    ] {
        launch_coords(ctx, Dim3::x(3), block)?;
    }
    Ok(())
}

fn scalar_args(ctx: &Ctx) -> CaseResult {
    let f = ctx.kernel(names::ARGS_PROBE)?;
    let out = ctx.upload(&[0u8; 35])?;
    let pair = Pair {
        a: 0xA1B2C3D4,
        b: -2.5,
    };
    let mut args = KernelArgs::new();
    args.push_buffer(&out)
        .push(0xABu8)
        .push(0xBEEFu16)
        .push(0xDEADBEEFu32)
        .push(0x0123_4567_89AB_CDEFu64)
        .push(1.5f32)
        .push(-3.25f64)
        .push(pair);
    let s = ctx.stream()?;
    // SAFETY: args_probe takes exactly these parameters and writes 35 bytes to out.
    unsafe { s.launch(&f, &LaunchConfig::linear(1, 1), &args)? };
    s.synchronize()?;
    let mut want = vec![0xAB];
    want.extend(0xBEEFu16.to_le_bytes());
    want.extend(0xDEADBEEFu32.to_le_bytes());
    want.extend(0x0123_4567_89AB_CDEFu64.to_le_bytes());
    want.extend(1.5f32.to_le_bytes());
    want.extend((-3.25f64).to_le_bytes());
    want.extend(0xA1B2C3D4u32.to_le_bytes());
    want.extend((-2.5f32).to_le_bytes());
    ensure_eq!(
        ctx.download(&out)?,
        want,
        "argument bytes seen by the kernel"
    );
    Ok(())
}

fn axpy(ctx: &Ctx) -> CaseResult {
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let (xb, yb) = (ctx.upload(&bytes(&x))?, ctx.upload(&bytes(&y))?);
    let f = ctx.kernel(names::AXPY_F32)?;
    let mut args = KernelArgs::new();
    args.push(n as u32)
        .push(2.0f32)
        .push_buffer(&xb)
        .push_buffer(&yb);
    let s = ctx.stream()?;
    // SAFETY: axpy reads x[0..n] and updates y[0..n]; both hold n f32s.
    unsafe { s.launch(&f, &LaunchConfig::linear(4, 256), &args)? };
    s.synchronize()?;
    let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| 2.0 * x + y).collect();
    ensure_eq!(
        ctx.download(&yb)?,
        bytes(&want),
        "axpy result (exact: one fma-free multiply-add per element)"
    );
    Ok(())
}

fn shared_memory(ctx: &Ctx) -> CaseResult {
    let (blocks, b) = (6u32, 128u32);
    let x: Vec<u32> = (0..blocks * b).map(|i| i * 3 + 1).collect();
    let xb = ctx.upload(&u32_bytes(&x))?;
    let out = ctx.upload(&u32_bytes(&vec![0; blocks as usize]))?;
    let f = ctx.kernel(names::BLOCK_SUM_U32)?;
    let mut args = KernelArgs::new();
    args.push_buffer(&xb).push_buffer(&out);
    let cfg = LaunchConfig {
        grid: Dim3::x(blocks),
        block: Dim3::x(b),
        shared_mem_bytes: b * 4,
    };
    let s = ctx.stream()?;
    // SAFETY: block_sum reads x[0..blocks*b] and writes out[0..blocks], with b*4 shared bytes.
    unsafe { s.launch(&f, &cfg, &args)? };
    s.synchronize()?;
    let want: Vec<u32> = x.chunks(b as usize).map(|c| c.iter().sum()).collect();
    ensure_eq!(
        bytes_u32(&ctx.download(&out)?),
        want,
        "per-block sums through shared memory"
    );
    Ok(())
}

fn args_reuse(ctx: &Ctx) -> CaseResult {
    let f = ctx.kernel(names::MUL_ADD_U32)?;
    let buf = ctx.upload(&u32_bytes(&[1, 1, 1, 1]))?;
    let s = ctx.stream()?;
    let mut blocker = Blocker::new(ctx, &s)?;
    for add in [10u32, 20] {
        let mut args = KernelArgs::new();
        args.push_buffer(&buf).push(4u32).push(2u32).push(add);
        // SAFETY: mul_add touches buf[0..4], which buf holds.
        unsafe { s.launch(&f, &LaunchConfig::linear(1, 4), &args)? };
        drop(args); // values must have been copied at launch
    }
    blocker.release()?;
    s.synchronize()?;
    ensure_eq!(
        bytes_u32(&ctx.download(&buf)?),
        vec![(2 + 10) * 2 + 20; 4], // 1 * 2 + 10, then * 2 + 20
        "launches with dropped args"
    );
    Ok(())
}

fn kept_alive(ctx: &Ctx) -> CaseResult {
    let f = ctx.kernel(names::MUL_ADD_U32)?;
    let s = ctx.stream()?;
    let buf = ctx.upload(&u32_bytes(&[3; 64]))?;
    let keep_view = buf.slice(0, 16)?;
    let mut blocker = Blocker::new(ctx, &s)?;
    let mut args = KernelArgs::new();
    args.push_buffer(&buf).push(64u32).push(1u32).push(1u32);
    // SAFETY: mul_add touches buf[0..64]; the args hold the buffer.
    unsafe { s.launch(&f, &LaunchConfig::linear(1, 64), &args)? };
    drop(args);
    drop(buf);
    blocker.release()?;
    s.synchronize()?;
    ensure_eq!(
        bytes_u32(&ctx.download(&keep_view)?),
        vec![4; 4],
        "kernel on a dropped buffer"
    );
    Ok(())
}

fn invalid_config(ctx: &Ctx) -> CaseResult {
    let f = ctx.kernel(names::FAIL)?;
    let s = ctx.stream()?;
    let caps = ctx.device.capabilities().mandatory.clone();
    let mut args = KernelArgs::new();
    args.push(0i32);
    let try_cfg = |cfg: LaunchConfig| {
        // SAFETY: the fail kernel touches no memory; these launches must be rejected anyway.
        unsafe { s.launch(&f, &cfg, &args) }
    };
    let zero = LaunchConfig::linear(0, 1);
    let r = expect_invalid(try_cfg(zero), "grid")?;
    ensure_eq!(
        r,
        Invalid::Value {
            value: "grid[0] = 0".into(),
            accepted: format!("1..={}", caps.max_grid[0])
        },
        "zero grid"
    );
    let big = caps.max_block[0].saturating_add(1);
    let r = expect_invalid(try_cfg(LaunchConfig::linear(1, big)), "block")?;
    ensure_eq!(
        r,
        Invalid::Value {
            value: format!("block[0] = {big}"),
            accepted: format!("1..={}", caps.max_block[0])
        },
        "oversized block"
    );
    let smem = caps.max_shared_mem_per_block.saturating_add(1);
    let r = expect_invalid(
        try_cfg(LaunchConfig {
            shared_mem_bytes: smem,
            ..LaunchConfig::linear(1, 1)
        }),
        "shared_mem_bytes",
    )?;
    ensure_eq!(
        r,
        Invalid::Value {
            value: smem.to_string(),
            accepted: format!("0..={}", caps.max_shared_mem_per_block)
        },
        "oversized shared memory"
    );
    s.synchronize()?;
    ensure!(
        s.async_error().is_none(),
        "a rejected launch left a sticky error"
    );
    Ok(())
}

fn arg_mismatch(ctx: &Ctx) -> CaseResult {
    let f = ctx.kernel(names::IOTA_U32)?;
    let Some(sizes) = f.param_sizes().map(<[usize]>::to_vec) else {
        return Ok(()); // the format does not record parameter sizes: nothing to check against
    };
    let s = ctx.stream()?;
    let mut args = KernelArgs::new();
    args.push(0u64);
    // SAFETY: must be rejected before running (one argument instead of two).
    let r = expect_invalid(
        unsafe { s.launch(&f, &LaunchConfig::linear(1, 1), &args) },
        "args",
    )?;
    ensure_eq!(
        r,
        Invalid::Value {
            value: "argument sizes [8]".into(),
            accepted: format!("the kernel's parameter sizes {sizes:?}")
        },
        "reason"
    );
    Ok(())
}

fn unknown_entry(ctx: &Ctx) -> CaseResult {
    let _ = ctx.kernel(names::IOTA_U32)?;
    match ctx.kernel("unihal_test_no_such_kernel") {
        Err(HalError::InvalidArgument {
            arg: "name",
            reason: Invalid::Value { value, .. },
        }) => {
            ensure_eq!(
                value,
                "kernel \"unihal_test_no_such_kernel\"",
                "offending name"
            );
            Ok(())
        }
        Err(e) => Err(crate::Failure::new(format!("unknown entry gave {e:?}"))),
        Ok(_) => Err(crate::Failure::new("an unknown entry name resolved")),
    }
}

fn unsupported_format(ctx: &Ctx) -> CaseResult {
    let Some(&fmt) = foreign_formats(&*ctx.device).first() else {
        return Ok(()); // loads every known format
    };
    let src = match fmt {
        unihal_hal::ModuleFormat::HostSymbols => {
            ModuleSource::HostSymbols(std::sync::Arc::new(unihal_kernels::testing::host_symbols()))
        }
        unihal_hal::ModuleFormat::Ptx => ModuleSource::Ptx(".version 8.0\n.target sm_80\n".into()),
        unihal_hal::ModuleFormat::Cubin => ModuleSource::Cubin(pattern(64, 1)),
        unihal_hal::ModuleFormat::HipCodeObject => ModuleSource::HipCodeObject(pattern(64, 1)),
        _ => ModuleSource::AscendBinary(pattern(64, 1)),
    };
    match ctx.device.load_module(&src) {
        Err(HalError::Unsupported { .. }) => Ok(()),
        Err(e) => Err(crate::Failure::new(format!(
            "loading an unlisted {fmt:?} module gave {e:?}"
        ))),
        Ok(_) => Err(crate::Failure::new(format!(
            "loaded a {fmt:?} module its capabilities do not list"
        ))),
    }
}
