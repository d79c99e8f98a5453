//! `ops.misuse.*` and `ops.special.*`: typed errors for misused op calls, and conversions that must
//! match bit for bit.

use crate::case::{expect_invalid, Case, CaseResult, Ctx, Failure, Need};
use crate::{ensure, ensure_eq};
use unihal_hal::{DType, HalError, Invalid, OpCall, OpId, RngState, Scalar, TensorView};

fn tv(b: &unihal_hal::Buffer, d: DType, shape: &[u64]) -> TensorView {
    TensorView::contiguous(b, d, shape)
}

fn shape_mismatch(ctx: &Ctx) -> CaseResult {
    let (a, b, o) = (
        ctx.device.alloc(48)?,
        ctx.device.alloc(20)?,
        ctx.device.alloc(48)?,
    );
    let s = ctx.stream()?;
    let r = expect_invalid(
        s.run_op(&OpCall::binary(
            OpId::Add,
            tv(&a, DType::F32, &[3, 4]),
            tv(&b, DType::F32, &[5]),
            tv(&o, DType::F32, &[3, 4]),
        )),
        "input",
    )?;
    ensure!(
        matches!(&r, Invalid::Value { value, .. } if value.contains("[5]")),
        "{r:?}"
    );
    let r = expect_invalid(
        s.run_op(&OpCall::unary(
            OpId::Exp,
            tv(&a, DType::F32, &[12]),
            tv(&o, DType::F32, &[3, 4]),
        )),
        "input",
    )?;
    ensure!(
        matches!(&r, Invalid::Value { value, .. } if value.contains("[12]")),
        "{r:?}"
    );
    Ok(())
}

fn wrong_dtype(ctx: &Ctx) -> CaseResult {
    let (a, b, o) = (
        ctx.device.alloc(64)?,
        ctx.device.alloc(64)?,
        ctx.device.alloc(64)?,
    );
    let s = ctx.stream()?;
    let r = expect_invalid(
        s.run_op(&OpCall::binary(
            OpId::Mul,
            tv(&a, DType::F32, &[8]),
            tv(&b, DType::F16, &[8]),
            tv(&o, DType::F32, &[8]),
        )),
        "tensors",
    )?;
    ensure!(
        matches!(&r, Invalid::Value { value, .. } if value.contains("f16")),
        "{r:?}"
    );
    // An op outside its dtypes is Unsupported, and the capability says so.
    ensure!(
        !ctx.device.capabilities().supports(OpId::Exp, DType::I32),
        "capabilities claim exp on i32"
    );
    match s.run_op(&OpCall::unary(
        OpId::Exp,
        tv(&a, DType::I32, &[8]),
        tv(&o, DType::I32, &[8]),
    )) {
        Err(HalError::Unsupported { .. }) => Ok(()),
        other => Err(Failure::new(format!("exp on i32 gave {other:?}"))),
    }
}

fn partial_overlap(ctx: &Ctx) -> CaseResult {
    let b = ctx.device.alloc(4 * 64)?;
    let s = ctx.stream()?;
    let x = tv(&b, DType::F32, &[32]);
    let shifted = tv(&b, DType::F32, &[32]).strided(4, &[1]);
    let r = expect_invalid(
        s.run_op(&OpCall::unary(OpId::Neg, x.clone(), shifted)),
        "output",
    )?;
    ensure_eq!(
        r,
        Invalid::Overlap {
            src: b.device_addr(),
            dst: b.device_addr() + 4,
            len: 124
        },
        "overlap"
    );
    // Exact aliasing is allowed, also with dims of size 1 (whose strides do not matter).
    s.run_op(&OpCall::unary(OpId::Neg, x.clone(), x.clone()))?;
    let column = tv(&b, DType::F32, &[32, 1]);
    s.run_op(&OpCall::unary(OpId::Neg, column.clone(), column))?;
    let one = tv(&b, DType::F32, &[1]);
    s.run_op(&OpCall::unary(OpId::Neg, one.clone(), one))?;
    // An output whose elements overlap each other is refused.
    let r = expect_invalid(
        s.run_op(&OpCall::fill(
            tv(&b, DType::F32, &[4, 4]).strided(0, &[0, 1]),
            Scalar::F64(1.0),
        )),
        "output",
    )?;
    ensure!(matches!(r, Invalid::Value { .. }), "{r:?}");
    s.synchronize()?;
    Ok(())
}

fn out_of_bounds(ctx: &Ctx) -> CaseResult {
    let b = ctx.device.alloc(40)?;
    let s = ctx.stream()?;
    let r = expect_invalid(
        s.run_op(&OpCall::fill(tv(&b, DType::F32, &[11]), Scalar::F64(0.0))),
        "output",
    )?;
    ensure_eq!(
        r,
        Invalid::OutOfRange {
            offset: 0,
            len: 44,
            size: 40
        },
        "view past the end"
    );
    let r = expect_invalid(
        s.run_op(&OpCall::fill(
            tv(&b, DType::F32, &[2]).strided(0, &[-1]),
            Scalar::F64(0.0),
        )),
        "output",
    )?;
    ensure!(
        matches!(r, Invalid::OutOfRange { .. }),
        "negative stride before the start: {r:?}"
    );
    Ok(())
}

fn bad_arguments(ctx: &Ctx) -> CaseResult {
    let b = ctx.device.alloc(64)?;
    let m = ctx.device.alloc(16)?;
    let s = ctx.stream()?;
    let call = OpCall {
        op: OpId::Fill,
        tensors: vec![tv(&b, DType::F32, &[16])],
        scalars: vec![],
        rng: None,
    };
    let r = expect_invalid(s.run_op(&call), "call")?;
    ensure!(
        matches!(r, Invalid::Value { .. }),
        "fill without a value: {r:?}"
    );
    let rng = RngState { seed: 1, offset: 0 };
    let r = expect_invalid(
        s.run_op(&OpCall::dropout(
            tv(&b, DType::F32, &[16]),
            tv(&b, DType::F32, &[16]),
            tv(&m, DType::U8, &[16]),
            1.0,
            rng,
        )),
        "p",
    )?;
    ensure_eq!(
        r,
        Invalid::Value {
            value: "1".into(),
            accepted: "[0, 1)".into()
        },
        "dropout p = 1"
    );
    let other = ctx.other_device();
    if let Ok(o) = other {
        if o.id() != ctx.device.id() {
            let theirs = o.alloc(64)?;
            let r = expect_invalid(
                s.run_op(&OpCall::fill(
                    tv(&theirs, DType::F32, &[16]),
                    Scalar::F64(0.0),
                )),
                "tensors",
            )?;
            ensure_eq!(
                r,
                Invalid::WrongDevice {
                    expected: ctx.device.id(),
                    found: o.id()
                },
                "buffer of another device"
            );
        }
    }
    Ok(())
}

/// f32 → f16/bf16 ties and edges, bit for bit against the `half` crate.
fn rounding_ties(ctx: &Ctx) -> CaseResult {
    let mut vals: Vec<f32> = Vec::new();
    for h in [
        0x3c00u16, 0x3c01, 0x0001, 0x03ff, 0x0400, 0x7bff, 0xbc00, 0x5555,
    ] {
        let a = half::f16::from_bits(h).to_f32();
        let b = half::f16::from_bits(h + 1).to_f32();
        let mid = (a + b) / 2.0; // exact in f32
        vals.extend([
            mid,
            f32::from_bits(mid.to_bits() + 1),
            f32::from_bits(mid.to_bits() - 1),
            a,
        ]);
    }
    for h in [0x3f80u16, 0x3f81, 0x0001, 0x7f7f, 0xbf80] {
        let a = half::bf16::from_bits(h).to_f32();
        let b = half::bf16::from_bits(h + 1).to_f32();
        let mid = f32::from_bits(((a.to_bits() as u64 + b.to_bits() as u64) / 2) as u32); // the tie pattern
        vals.extend([
            mid,
            f32::from_bits(mid.to_bits() + 1),
            f32::from_bits(mid.to_bits() - 1),
        ]);
    }
    vals.extend([
        65519.0,
        65520.0,
        1e-8,
        -1e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        1e-45,
        3.4e38,
    ]);
    let n = vals.len() as u64;
    let src = ctx.upload(
        &vals
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    let s = ctx.stream()?;
    for (d, conv) in [
        (
            DType::F16,
            (|v: f32| half::f16::from_f32(v).to_bits()) as fn(f32) -> u16,
        ),
        (DType::Bf16, |v: f32| half::bf16::from_f32(v).to_bits()),
    ] {
        let dst = ctx.device.alloc(n as usize * 2)?;
        s.run_op(&OpCall::cast(tv(&src, DType::F32, &[n]), tv(&dst, d, &[n])))?;
        s.synchronize()?;
        let got = ctx.download(&dst)?;
        for (i, v) in vals.iter().enumerate() {
            let g = u16::from_le_bytes([got[2 * i], got[2 * i + 1]]);
            ensure!(
                g == conv(*v),
                "f32 {v:e} ({:#x}) -> {d}: got {g:#06x}, half gives {:#06x}",
                v.to_bits(),
                conv(*v)
            );
        }
    }
    Ok(())
}

/// The op misuse and special-value cases.
pub fn cases() -> Vec<Case> {
    let f32_ops = |ops: &[OpId]| {
        ops.iter()
            .map(|&o| Need::Op(o, DType::F32))
            .collect::<Vec<_>>()
    };
    vec![
        Case::new("ops.misuse.shape_mismatch", shape_mismatch)
            .needs(&f32_ops(&[OpId::Add, OpId::Exp])),
        Case::new("ops.misuse.wrong_dtype", wrong_dtype).needs(&f32_ops(&[OpId::Mul])),
        Case::new("ops.misuse.partial_overlap", partial_overlap)
            .needs(&f32_ops(&[OpId::Neg, OpId::Fill])),
        Case::new("ops.misuse.out_of_bounds", out_of_bounds).needs(&f32_ops(&[OpId::Fill])),
        Case::new("ops.misuse.bad_arguments", bad_arguments)
            .needs(&f32_ops(&[OpId::Fill, OpId::DropoutForward])),
        Case::new(
            "ops.special.f32_to_half_rounding_matches_half_crate",
            rounding_ties,
        )
        .needs(&[
            Need::Op(OpId::Cast, DType::F16),
            Need::Op(OpId::Cast, DType::Bf16),
            Need::Op(OpId::Cast, DType::F32),
        ]),
    ]
}
