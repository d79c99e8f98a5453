//! `ops.random_*` and `ops.dropout_*`: the counter-based generator gives the documented bits (an
//! independent reference of Philox4x32-10 and of the documented transforms), consistent under
//! splitting a call by offset, with sane statistics; dropout masks come from the same stream.

use super::reference::{block, normal_f32, uniform24};
use super::values::{decode, encode};
use crate::case::{Case, CaseResult, Ctx, Failure, Need};
use crate::ensure;
use unihal_hal::{DType, OpCall, OpId, RngState, TensorView};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::Bf16];
const N: u64 = 4099;

fn run(
    ctx: &Ctx,
    d: DType,
    n: u64,
    make: impl Fn(TensorView) -> OpCall,
) -> unihal_hal::Result<Vec<f64>> {
    let buf = ctx.device.alloc(n as usize * d.size())?;
    let s = ctx.stream()?;
    s.run_op(&make(TensorView::contiguous(&buf, d, &[n])))?;
    s.synchronize()?;
    let bytes = ctx.download(&buf)?;
    Ok(bytes.chunks(d.size()).map(|c| decode(d, c)).collect())
}

/// The documented uniform value of element `i`, rounded into `d`.
fn uniform_ref(d: DType, rng: RngState, i: u64, low: f64, high: f64) -> f64 {
    let r = block(rng.seed, rng.offset, i);
    if d == DType::F64 {
        let u = (((r[0] as u64) << 21) | (r[1] as u64 >> 11)) as f64 * 2f64.powi(-53);
        return low + (high - low) * u;
    }
    let (l, h) = (low as f32, high as f32);
    let v = l + (h - l) * uniform24(r[0]);
    decode(d, &encode(d, v as f64))
}

fn normal_ref(d: DType, rng: RngState, i: u64, mean: f64, std: f64) -> f64 {
    let z = normal_f32(block(rng.seed, rng.offset, i));
    if d == DType::F64 {
        return mean + std * z as f64;
    }
    let v = mean as f32 + std as f32 * z;
    decode(d, &encode(d, v as f64))
}

fn same_bits(d: DType, got: &[f64], want: impl Fn(u64) -> f64, what: &str) -> CaseResult {
    for (i, &g) in got.iter().enumerate() {
        let w = want(i as u64);
        if encode(d, g) != encode(d, w) {
            return Err(Failure::new(format!(
                "{what} {d}: element {i}: got {g:e}, documented {w:e}"
            )));
        }
    }
    Ok(())
}

fn uniform(ctx: &Ctx, d: DType) -> CaseResult {
    let rng = RngState {
        seed: 0x1234_5678_9abc_def0,
        offset: 77,
    };
    let got = run(ctx, d, N, |t| OpCall::uniform(t, -2.0, 3.0, rng))?;
    same_bits(d, &got, |i| uniform_ref(d, rng, i, -2.0, 3.0), "uniform")?;
    // Splitting the call by offset gives the same stream.
    let tail = run(ctx, d, N - 1000, |t| {
        OpCall::uniform(
            t,
            -2.0,
            3.0,
            RngState {
                offset: rng.offset + 1000,
                ..rng
            },
        )
    })?;
    ensure!(
        tail[..] == got[1000..],
        "uniform {d}: a call at offset+1000 does not continue the stream"
    );
    let mean = got.iter().sum::<f64>() / N as f64;
    ensure!(
        (mean - 0.5).abs() < 0.1,
        "uniform {d}: mean {mean} of U(-2, 3)"
    );
    ensure!(
        got.iter().all(|&v| (-2.0..=3.0).contains(&v)),
        "uniform {d}: value outside [-2, 3]"
    );
    Ok(())
}

fn normal(ctx: &Ctx, d: DType) -> CaseResult {
    let rng = RngState {
        seed: 42,
        offset: 0,
    };
    let got = run(ctx, d, N, |t| OpCall::normal(t, 1.0, 2.0, rng))?;
    same_bits(d, &got, |i| normal_ref(d, rng, i, 1.0, 2.0), "normal")?;
    let mean = got.iter().sum::<f64>() / N as f64;
    let var = got.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / N as f64;
    ensure!(
        (mean - 1.0).abs() < 0.1 && (var.sqrt() - 2.0).abs() < 0.1,
        "normal {d}: mean {mean}, std {}",
        var.sqrt()
    );
    Ok(())
}

fn dropout(ctx: &Ctx, d: DType) -> CaseResult {
    let p = 0.3;
    let rng = RngState {
        seed: 9,
        offset: 1 << 33,
    };
    let n = N as usize;
    let xs: Vec<f64> = (0..n)
        .map(|i| decode(d, &encode(d, (i % 17) as f64 * 0.25 - 2.0)))
        .collect();
    let x = ctx.upload(&xs.iter().flat_map(|&v| encode(d, v)).collect::<Vec<u8>>())?;
    let (out, mask, dx) = (
        ctx.device.alloc(n * d.size())?,
        ctx.device.alloc(n)?,
        ctx.device.alloc(n * d.size())?,
    );
    let s = ctx.stream()?;
    let tv = |b, dt| TensorView::contiguous(b, dt, &[N]);
    s.run_op(&OpCall::dropout(
        tv(&x, d),
        tv(&out, d),
        tv(&mask, DType::U8),
        p,
        rng,
    ))?;
    // Backward with dy = x.
    s.run_op(&OpCall::dropout_backward(
        tv(&x, d),
        tv(&mask, DType::U8),
        tv(&dx, d),
        p,
    ))?;
    s.synchronize()?;
    let (outs, masks, dxs) = (
        ctx.download(&out)?,
        ctx.download(&mask)?,
        ctx.download(&dx)?,
    );
    let scale = (1.0 / (1.0 - p)) as f32;
    let mut kept = 0usize;
    for i in 0..n {
        let keep = uniform24(block(rng.seed, rng.offset, i as u64)[0]) >= p as f32;
        kept += keep as usize;
        ensure!(
            masks[i] == keep as u8,
            "dropout {d}: mask[{i}] = {}, documented {}",
            masks[i],
            keep as u8
        );
        let want = if keep {
            if d == DType::F64 {
                xs[i] * (1.0 / (1.0 - p))
            } else {
                (xs[i] as f32 * scale) as f64
            }
        } else {
            0.0
        };
        let want = decode(d, &encode(d, want));
        let g = decode(d, &outs[i * d.size()..(i + 1) * d.size()]);
        let gb = decode(d, &dxs[i * d.size()..(i + 1) * d.size()]);
        ensure!(
            encode(d, g) == encode(d, want),
            "dropout {d}: out[{i}] = {g}, documented {want}"
        );
        ensure!(
            encode(d, gb) == encode(d, want),
            "dropout backward {d}: dx[{i}] = {gb}, documented {want}"
        );
    }
    let rate = kept as f64 / n as f64;
    ensure!(
        (rate - 0.7).abs() < 0.05,
        "dropout {d}: kept {rate} of elements with p = {p}"
    );
    Ok(())
}

/// The random-op cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for d in FLOATS {
        v.push(
            Case::new(format!("ops.random_uniform.{}", d.name()), move |c| {
                uniform(c, d)
            })
            .needs(&[Need::Op(OpId::RandomUniform, d)]),
        );
        v.push(
            Case::new(format!("ops.random_normal.{}", d.name()), move |c| {
                normal(c, d)
            })
            .needs(&[Need::Op(OpId::RandomNormal, d)]),
        );
        v.push(
            Case::new(format!("ops.dropout.{}", d.name()), move |c| dropout(c, d)).needs(&[
                Need::Op(OpId::DropoutForward, d),
                Need::Op(OpId::DropoutBackward, d),
            ]),
        );
    }
    v
}
