//! `ops.random_*` and `ops.dropout_*`.
//!
//! On a device with `OptionalCaps::bitwise_rng` the counter-based generator gives the documented
//! bits (an independent reference of Philox4x32-10 and of the documented transforms), consistent
//! under splitting a call by offset; dropout masks come from the same stream. On a device that uses
//! its own generator the values are checked statistically instead (range, moments, a
//! Kolmogorov–Smirnov distance; dropout's keep rate, scale and mask). Both kinds of device also
//! pass the statistical checks, and on both the same `(seed, offset)` on the same device gives the
//! same bits twice while another seed or offset gives other values.
//!
//! The statistical bounds are set for [`N`] samples so that a correct generator fails a check with
//! a probability below about 1e-5: moments within [`Z`] standard errors, the KS distance below
//! `sqrt(ln(2 / KS_ALPHA) / 2) / sqrt(N)`, widened by the dtype's rounding.

use super::reference::{block, normal_f32, uniform24};
use super::values::{decode, encode, eps};
use crate::case::{Case, CaseResult, Ctx, Failure, Need};
use crate::ensure;
use unihal_hal::{DType, OpCall, OpId, RngState, TensorView};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::Bf16];
const N: u64 = 4099;
/// Moments must lie within this many standard errors of their expected values.
const Z: f64 = 5.0;
/// The false-alarm probability the Kolmogorov–Smirnov bound is set for.
const KS_ALPHA: f64 = 1e-5;

/// True when the device's random ops give the kernel library's Philox bits.
fn bitwise(ctx: &Ctx) -> bool {
    ctx.device.capabilities().optional.bitwise_rng
}

/// Runs a random op into a fresh contiguous tensor of `n` elements and returns its bytes.
fn run_raw(
    ctx: &Ctx,
    d: DType,
    n: u64,
    make: impl Fn(TensorView) -> OpCall,
) -> unihal_hal::Result<Vec<u8>> {
    let buf = ctx.device.alloc(n as usize * d.size())?;
    let s = ctx.stream()?;
    s.run_op(&make(TensorView::contiguous(&buf, d, &[n])))?;
    s.synchronize()?;
    ctx.download(&buf)
}

fn values(d: DType, bytes: &[u8]) -> Vec<f64> {
    bytes.chunks(d.size()).map(|c| decode(d, c)).collect()
}

fn run(
    ctx: &Ctx,
    d: DType,
    n: u64,
    make: impl Fn(TensorView) -> OpCall,
) -> unihal_hal::Result<Vec<f64>> {
    Ok(values(d, &run_raw(ctx, d, n, make)?))
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

/// Mean, variance (biased), skewness and excess kurtosis.
fn moments(v: &[f64]) -> (f64, f64, f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let m = |k: i32| v.iter().map(|x| (x - mean).powi(k)).sum::<f64>() / n;
    let (m2, m3, m4) = (m(2), m(3), m(4));
    (mean, m2, m3 / m2.powf(1.5), m4 / (m2 * m2) - 3.0)
}

/// The Kolmogorov–Smirnov distance between the sample and a continuous CDF (ties included: the
/// empirical CDF jumps by their count).
fn ks_distance(v: &[f64], cdf: impl Fn(f64) -> f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    s.iter()
        .enumerate()
        .map(|(i, &x)| {
            let f = cdf(x);
            (((i + 1) as f64 / n) - f).max(f - i as f64 / n)
        })
        .fold(0.0, f64::max)
}

/// The KS bound for `n` samples, plus `rounding` (how far the dtype's rounding can move the CDF).
fn ks_bound(n: usize, rounding: f64) -> f64 {
    ((2.0 / KS_ALPHA).ln() / 2.0).sqrt() / (n as f64).sqrt() + rounding
}

/// How many elements of two equally long byte images differ (elements of `size` bytes).
fn differing(a: &[u8], b: &[u8], size: usize) -> usize {
    a.chunks(size)
        .zip(b.chunks(size))
        .filter(|(x, y)| x != y)
        .count()
}

/// Same `(seed, offset)` twice: identical bits; another seed and another offset: other values in at
/// least `min_differ` elements.
fn reproducible(
    what: &str,
    size: usize,
    rng: RngState,
    min_differ: usize,
    draw: impl Fn(RngState) -> unihal_hal::Result<Vec<u8>>,
) -> CaseResult {
    let first = draw(rng)?;
    let again = draw(rng)?;
    let n = differing(&first, &again, size);
    ensure!(
        n == 0,
        "{what}: the same seed and offset twice on the same device differ in {n} elements"
    );
    let others = [
        (
            "another seed",
            RngState {
                seed: rng.seed ^ 0x5DEE_CE66,
                ..rng
            },
        ),
        (
            "another offset",
            RngState {
                offset: rng.offset.wrapping_add(1 << 20),
                ..rng
            },
        ),
    ];
    for (how, other) in others {
        let n = differing(&first, &draw(other)?, size);
        ensure!(
            n >= min_differ,
            "{what}: {how} changes only {n} of {} elements (at least {min_differ} expected)",
            first.len() / size
        );
    }
    Ok(())
}

/// Range, mean, variance and KS distance of a sample of U(low, high) rounded into `d`.
fn uniform_stats(d: DType, got: &[f64], low: f64, high: f64) -> CaseResult {
    let n = got.len();
    // Rounding into a half type may reach `high` itself (as the documented reference does); in
    // f32 and f64 the interval is half open.
    let half = matches!(d, DType::F16 | DType::Bf16);
    if let Some((i, v)) = got
        .iter()
        .enumerate()
        .find(|(_, &v)| !(v >= low && (v < high || (half && v == high))))
    {
        return Err(Failure::new(format!(
            "uniform {d}: element {i} = {v:e} outside [{low}, {high}{}",
            if half { "]" } else { ")" }
        )));
    }
    let (mean, var, _, _) = moments(got);
    let w = high - low;
    let (want_mean, want_var) = ((low + high) / 2.0, w * w / 12.0);
    let se_mean = w / (12.0 * n as f64).sqrt();
    // Var(sample variance) = (mu4 - sigma^4) / n, mu4 = w^4 / 80 for a uniform distribution.
    let se_var = w * w * ((1.0 / 80.0 - 1.0 / 144.0) / n as f64).sqrt();
    ensure!(
        (mean - want_mean).abs() <= Z * se_mean,
        "uniform {d}: mean {mean} of {n} samples of U({low}, {high}), expected {want_mean} \
         within {Z} standard errors ({})",
        Z * se_mean
    );
    ensure!(
        (var - want_var).abs() <= Z * se_var,
        "uniform {d}: variance {var} of {n} samples of U({low}, {high}), expected {want_var} \
         within {Z} standard errors ({})",
        Z * se_var
    );
    // Rounding into `d` moves a value by at most half an ulp of the larger bound (allowed twice
    // over), under a density of 1 / w.
    let rounding = eps(d) * low.abs().max(high.abs()) / w;
    let (dist, bound) = (
        ks_distance(got, |x| ((x - low) / w).clamp(0.0, 1.0)),
        ks_bound(n, rounding),
    );
    ensure!(
        dist <= bound,
        "uniform {d}: Kolmogorov–Smirnov distance {dist:.4} from U({low}, {high}) over {n} \
         samples exceeds {bound:.4}"
    );
    Ok(())
}

/// Mean, standard deviation, skewness, excess kurtosis and KS distance of a sample of
/// N(mean, std²) rounded into `d`.
fn normal_stats(d: DType, got: &[f64], mean: f64, std: f64) -> CaseResult {
    let n = got.len() as f64;
    if let Some((i, v)) = got.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(Failure::new(format!("normal {d}: element {i} = {v}")));
    }
    let (m, var, skew, kurt) = moments(got);
    let s = var.sqrt();
    let checks = [
        ("mean", m, mean, std / n.sqrt()),
        ("standard deviation", s, std, std / (2.0 * n).sqrt()),
        ("skewness", skew, 0.0, (6.0 / n).sqrt()),
        ("excess kurtosis", kurt, 0.0, (24.0 / n).sqrt()),
    ];
    for (what, got, want, se) in checks {
        ensure!(
            (got - want).abs() <= Z * se,
            "normal {d}: {what} {got:.4} of {n} samples of N({mean}, {std}²), expected {want} \
             within {Z} standard errors ({:.4})",
            Z * se
        );
    }
    // Rounding into `d` moves a value by at most half an ulp of |mean| + 6 std (allowed twice
    // over); the density is at most 1 / (std sqrt(2 pi)).
    let rounding = eps(d) * (mean.abs() + 6.0 * std) / (std * (2.0 * std::f64::consts::PI).sqrt());
    let cdf = |x: f64| 0.5 * (1.0 + libm::erf((x - mean) / (std * std::f64::consts::SQRT_2)));
    let (dist, bound) = (ks_distance(got, cdf), ks_bound(got.len(), rounding));
    ensure!(
        dist <= bound,
        "normal {d}: Kolmogorov–Smirnov distance {dist:.4} from N({mean}, {std}²) over {n} \
         samples exceeds {bound:.4}"
    );
    Ok(())
}

fn uniform(ctx: &Ctx, d: DType) -> CaseResult {
    let rng = RngState {
        seed: 0x1234_5678_9abc_def0,
        offset: 77,
    };
    let draw = |rng| run_raw(ctx, d, N, |t| OpCall::uniform(t, -2.0, 3.0, rng));
    let got = values(d, &draw(rng)?);
    if bitwise(ctx) {
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
    }
    uniform_stats(d, &got, -2.0, 3.0)?;
    // Two independent draws coincide in an element with a probability of at most one in a few
    // hundred (bf16's grid over [-2, 3)).
    reproducible(&format!("uniform {d}"), d.size(), rng, N as usize / 2, draw)
}

fn normal(ctx: &Ctx, d: DType) -> CaseResult {
    let rng = RngState {
        seed: 42,
        offset: 0,
    };
    let draw = |rng| run_raw(ctx, d, N, |t| OpCall::normal(t, 1.0, 2.0, rng));
    let got = values(d, &draw(rng)?);
    if bitwise(ctx) {
        same_bits(d, &got, |i| normal_ref(d, rng, i, 1.0, 2.0), "normal")?;
        let mean = got.iter().sum::<f64>() / N as f64;
        let var = got.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / N as f64;
        ensure!(
            (mean - 1.0).abs() < 0.1 && (var.sqrt() - 2.0).abs() < 0.1,
            "normal {d}: mean {mean}, std {}",
            var.sqrt()
        );
    }
    normal_stats(d, &got, 1.0, 2.0)?;
    reproducible(&format!("normal {d}"), d.size(), rng, N as usize / 2, draw)
}

/// One dropout forward of `xs` (and, when `backward`, the backward with dy = x from its mask):
/// output, mask and dx bytes.
fn dropout_run(
    ctx: &Ctx,
    d: DType,
    xs: &[f64],
    p: f64,
    rng: RngState,
    backward: bool,
) -> unihal_hal::Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let n = xs.len();
    let x = ctx.upload(&xs.iter().flat_map(|&v| encode(d, v)).collect::<Vec<u8>>())?;
    let (out, mask, dx) = (
        ctx.device.alloc(n * d.size())?,
        ctx.device.alloc(n)?,
        ctx.device.alloc(n * d.size())?,
    );
    let s = ctx.stream()?;
    let tv = |b, dt| TensorView::contiguous(b, dt, &[n as u64]);
    s.run_op(&OpCall::dropout(
        tv(&x, d),
        tv(&out, d),
        tv(&mask, DType::U8),
        p,
        rng,
    ))?;
    if backward {
        // Backward with dy = x.
        s.run_op(&OpCall::dropout_backward(
            tv(&x, d),
            tv(&mask, DType::U8),
            tv(&dx, d),
            p,
        ))?;
    }
    s.synchronize()?;
    let dxs = if backward {
        ctx.download(&dx)?
    } else {
        Vec::new()
    };
    Ok((ctx.download(&out)?, ctx.download(&mask)?, dxs))
}

/// The documented bits: the mask from the Philox stream, the kept values `x * f32(1 / (1 - p))`.
fn dropout_bits(
    d: DType,
    xs: &[f64],
    p: f64,
    rng: RngState,
    (outs, masks, dxs): (&[u8], &[u8], &[u8]),
) -> CaseResult {
    let n = xs.len();
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

/// What holds for any generator: masks of 0 and 1 kept at rate 1 - p (within [`Z`] standard
/// errors); a kept element is `x / (1 - p)` within two ulps of `d`, a dropped one is 0;
/// the backward (dy = x) gives the same from the mask.
fn dropout_stats(
    d: DType,
    xs: &[f64],
    p: f64,
    (outs, masks, dxs): (&[u8], &[u8], &[u8]),
) -> CaseResult {
    let n = xs.len();
    let mut kept = 0usize;
    for i in 0..n {
        let m = masks[i];
        ensure!(m <= 1, "dropout {d}: mask[{i}] = {m}, neither 0 nor 1");
        kept += m as usize;
        let want = if m == 1 { xs[i] / (1.0 - p) } else { 0.0 };
        let tol = 2.0 * eps(d) * want.abs();
        for (what, bytes) in [("out", outs), ("backward dx", dxs)] {
            let g = decode(d, &bytes[i * d.size()..(i + 1) * d.size()]);
            ensure!(
                (g - want).abs() <= tol,
                "dropout {d}: {what}[{i}] = {g} with mask {m} and x = {}: expected {want} \
                 (x / (1 - p) when kept, 0 when dropped) within {tol:e}",
                xs[i]
            );
        }
    }
    let rate = kept as f64 / n as f64;
    let se = (p * (1.0 - p) / n as f64).sqrt();
    ensure!(
        (rate - (1.0 - p)).abs() <= Z * se,
        "dropout {d}: kept {rate:.4} of {n} elements with p = {p}, expected {} within {Z} \
         standard errors ({:.4})",
        1.0 - p,
        Z * se
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
    let (outs, masks, dxs) = dropout_run(ctx, d, &xs, p, rng, true)?;
    let got = (&outs[..], &masks[..], &dxs[..]);
    if bitwise(ctx) {
        dropout_bits(d, &xs, p, rng, got)?;
    }
    dropout_stats(d, &xs, p, got)?;
    // Reproducibility of the mask and output; two independent masks differ in 2 p (1 - p) = 42% of
    // the elements, so at least a quarter must.
    reproducible(&format!("dropout {d} mask"), 1, rng, n / 4, |rng| {
        Ok(dropout_run(ctx, d, &xs, p, rng, false)?.1)
    })?;
    let again = dropout_run(ctx, d, &xs, p, rng, false)?.0;
    let differ = differing(&outs, &again, d.size());
    ensure!(
        differ == 0,
        "dropout {d}: the same seed and offset twice on the same device give outputs differing \
         in {differ} elements"
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The statistical checks accept the documented Philox streams and refuse skewed ones, so a
    /// device with its own generator is held to something.
    #[test]
    fn statistics_accept_the_reference_and_refuse_a_skewed_generator() {
        let rng = RngState { seed: 3, offset: 5 };
        for d in FLOATS {
            let u: Vec<f64> = (0..N).map(|i| uniform_ref(d, rng, i, -2.0, 3.0)).collect();
            uniform_stats(d, &u, -2.0, 3.0).unwrap();
            let z: Vec<f64> = (0..N).map(|i| normal_ref(d, rng, i, 1.0, 2.0)).collect();
            normal_stats(d, &z, 1.0, 2.0).unwrap();
        }
        // Squared uniforms: right range, wrong distribution.
        let sq: Vec<f64> = (0..N)
            .map(|i| -2.0 + 5.0 * (uniform_ref(DType::F64, rng, i, 0.0, 1.0)).powi(2))
            .collect();
        assert!(uniform_stats(DType::F64, &sq, -2.0, 3.0).is_err());
        // A uniform that never reaches the top tenth of its range.
        let short: Vec<f64> = (0..N)
            .map(|i| uniform_ref(DType::F64, rng, i, -2.0, 2.5))
            .collect();
        assert!(uniform_stats(DType::F64, &short, -2.0, 3.0).is_err());
        // Uniform values standing in for normal ones, with the right mean and deviation.
        let flat: Vec<f64> = (0..N)
            .map(|i| uniform_ref(DType::F64, rng, i, 1.0 - 12f64.sqrt(), 1.0 + 12f64.sqrt()))
            .collect();
        assert!(normal_stats(DType::F64, &flat, 1.0, 2.0).is_err());
        // A value at the open end of an f32 uniform.
        let mut top = (0..N)
            .map(|i| uniform_ref(DType::F32, rng, i, -2.0, 3.0))
            .collect::<Vec<_>>();
        top[7] = 3.0;
        assert!(uniform_stats(DType::F32, &top, -2.0, 3.0).is_err());
    }

    #[test]
    fn dropout_statistics_check_scale_mask_and_rate() {
        let (d, p, n) = (DType::F32, 0.3, N as usize);
        let xs: Vec<f64> = (0..n).map(|i| (i % 17) as f64 * 0.25 - 2.0).collect();
        let rng = RngState { seed: 1, offset: 0 };
        let mask: Vec<u8> = (0..n)
            .map(|i| (uniform24(block(rng.seed, rng.offset, i as u64)[0]) >= p as f32) as u8)
            .collect();
        let out = |scale: f64, mask: &[u8]| -> Vec<u8> {
            xs.iter()
                .zip(mask)
                .flat_map(|(&x, &m)| encode(d, if m == 1 { x * scale } else { 0.0 }))
                .collect()
        };
        let good = out(1.0 / (1.0 - p), &mask);
        dropout_stats(d, &xs, p, (&good, &mask, &good)).unwrap();
        // Unscaled kept values.
        let unscaled = out(1.0, &mask);
        assert!(dropout_stats(d, &xs, p, (&unscaled, &mask, &unscaled)).is_err());
        // An output that does not follow its mask.
        let mut flipped = mask.clone();
        flipped[1] ^= 1;
        assert!(dropout_stats(d, &xs, p, (&good, &flipped, &good)).is_err());
        // Keeping with probability p instead of 1 - p.
        let inverted: Vec<u8> = mask.iter().map(|m| m ^ 1).collect();
        let wrong_rate = out(1.0 / (1.0 - p), &inverted);
        assert!(dropout_stats(d, &xs, p, (&wrong_rate, &inverted, &wrong_rate)).is_err());
    }
}
