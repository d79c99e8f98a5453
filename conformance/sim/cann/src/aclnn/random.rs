//! Random numbers and dropout (op map A.4 "RNG and dropout"). The NPU's generator is not
//! unihal's Philox (A2 parts use the DSA hardware engine, whose algorithm is not documented), so
//! the simulator has a generator of its own, just as different: element `i` of a call with
//! `(seed, offset)` draws from a SplitMix64 hash of `seed` and `offset + i`. Same seed and
//! offset, same numbers; nothing is bitwise equal to another backend's.
//!
//! The dropout mask is a bit mask in UINT8 of `ceil(numel / 128) * 128 / 8` bytes, as the op
//! map documents; bit `i % 8` of byte `i / 8` (least significant first: assumed, the layout is
//! not documented) is 1 for a kept element.

use super::host::{addrs, read, write};
use super::{invalid, Build};
use crate::aclnn_op;
use crate::conv::Err;
use crate::nnopbase::{IntArray, Tensor};
use std::sync::Arc;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [0, 1) for element `i`.
pub fn uniform(seed: u64, offset: u64, i: u64) -> f64 {
    let bits = splitmix(seed ^ splitmix(offset.wrapping_add(i)));
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Standard normal for element `i` (Box-Muller on two draws).
pub fn normal(seed: u64, offset: u64, i: u64) -> f64 {
    let u1 = uniform(seed, offset, 2 * i).max(f64::MIN_POSITIVE);
    let u2 = uniform(seed, offset, 2 * i + 1);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Bytes of the mask of `n` elements.
pub fn mask_bytes(n: u64) -> u64 {
    n.div_ceil(128) * 128 / 8
}

fn kept(seed: u64, offset: u64, i: u64, p: f64) -> bool {
    uniform(seed, offset, i) >= p
}

// Declared from: OM `random/dsa_random_uniform/op_host/op_api/aclnn_uniform.{h,cpp}`; OP `UniformKernelNpuOpApi.cpp`
aclnn_op!(aclnnInplaceUniform, aclnnInplaceUniformGetWorkspaceSize, "InplaceUniform",
(self_ref: *const super::Tensor, from: f64, to: f64, seed: u64, offset: u64) |a| {
    let t = a.tensor(self_ref, "selfRef")?;
    let dt = a.dtype(&t)?;
    if from > to {
        return Err(invalid(format!("from {from} > to {to}")));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let t = t.clone();
        b.host(move || {
            for (i, e) in addrs(&t).into_iter().enumerate() {
                let v = from + (to - from) * uniform(seed, offset, i as u64);
                // SAFETY: an element of a live descriptor (checked at enqueue).
                unsafe { write(e, dt, v) };
            }
            Ok(())
        });
        Ok(())
    }))
});

// Declared from: OM `random/dsa_random_normal/op_host/op_api/aclnn_normal.h`
aclnn_op!(aclnnInplaceNormal, aclnnInplaceNormalGetWorkspaceSize, "InplaceNormal",
(self_ref: *const super::Tensor, mean: f32, std: f32, seed: i64, offset: i64) |a| {
    let t = a.tensor(self_ref, "selfRef")?;
    let dt = a.dtype(&t)?;
    if std < 0.0 {
        return Err(invalid(format!("std {std} < 0")));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let t = t.clone();
        b.host(move || {
            for (i, e) in addrs(&t).into_iter().enumerate() {
                let v = mean as f64 + std as f64 * normal(seed as u64, offset as u64, i as u64);
                // SAFETY: an element of a live descriptor (checked at enqueue).
                unsafe { write(e, dt, v) };
            }
            Ok(())
        });
        Ok(())
    }))
});

fn check_p(p: f64) -> Result<(), Err> {
    if !(0.0..=1.0).contains(&p) {
        return Err(invalid(format!("probability {p} outside [0, 1]")));
    }
    Ok(())
}

fn check_mask(mask: &Tensor, n: i64) -> Result<(), Err> {
    if mask.dtype != 4 || mask.numel() as u64 != mask_bytes(n as u64) {
        return Err(invalid(format!(
            "the mask must be UINT8 of {} bytes for {n} elements",
            mask_bytes(n as u64)
        )));
    }
    Ok(())
}

/// Writes the mask bits of `n` elements.
fn gen_mask(mask: &Tensor, n: u64, p: f64, seed: u64, offset: u64) {
    let bytes = addrs(mask);
    for (k, &e) in bytes.iter().enumerate() {
        let mut byte = 0u8;
        for bit in 0..8u64 {
            let i = k as u64 * 8 + bit;
            if i < n && kept(seed, offset, i, p) {
                byte |= 1 << bit;
            }
        }
        // SAFETY: a byte of a live UINT8 descriptor (checked at enqueue).
        unsafe { (e as *mut u8).write(byte) };
    }
}

/// `out = x * bit * scale`.
fn apply_mask(x: &Tensor, mask: &Tensor, scale: f64, out: &Tensor) -> Result<(), String> {
    let dt = x.dt().map_err(|e| e.msg)?;
    let bytes = addrs(mask);
    for (i, (xe, oe)) in addrs(x).into_iter().zip(addrs(out)).enumerate() {
        // SAFETY: bytes and elements of live descriptors (checked at enqueue).
        let bit = unsafe { (bytes[i / 8] as *const u8).read() } >> (i % 8) & 1;
        // SAFETY: as above.
        unsafe { write(oe, dt, if bit == 1 { read(xe, dt) * scale } else { 0.0 }) };
    }
    Ok(())
}

// Declared from: OM `random/dsa_gen_bit_mask/op_host/op_api/aclnn_dropout_gen_mask.h`; OP `DropoutGenMaskKernelNpuOpApi.cpp` (`length = (numel+127)/128*128/8`)
aclnn_op!(aclnnDropoutGenMaskV2, aclnnDropoutGenMaskV2GetWorkspaceSize, "DropoutGenMaskV2",
(shape: *const IntArray, prob: f64, seed: i64, offset: i64, prob_data_type: i32, out: *const Tensor) |a| {
    let s = a.ints(shape, "shape")?;
    let m = a.tensor(out, "out")?;
    let pt = crate::conv::dtype_of_acl(prob_data_type).ok_or_else(|| invalid("probDataType"))?;
    if !a.soc().supports(a.op, pt) {
        return Err(invalid(format!("probDataType {pt} is not supported")));
    }
    check_p(prob)?;
    let n: i64 = s.iter().product();
    check_mask(&m, n)?;
    Ok(Arc::new(move |b: &mut Build| {
        let m = m.clone();
        b.host(move || {
            gen_mask(&m, n as u64, prob, seed as u64, offset as u64);
            Ok(())
        });
        Ok(())
    }))
});

// Declared from: OM `random/drop_out_do_mask/op_api/aclnn_dropout_do_mask.h`; OP `NativeDropoutKernelNpuOpApi.cpp`
aclnn_op!(aclnnDropoutDoMask, aclnnDropoutDoMaskGetWorkspaceSize, "DropoutDoMask",
(self_: *const Tensor, mask: *const Tensor, prob: f64, out: *const Tensor) |a| {
    let (x, m, o) = (a.tensor(self_, "self")?, a.tensor(mask, "mask")?, a.tensor(out, "out")?);
    a.dtype(&x)?;
    a.same_dtype(&x, &o, "self and out")?;
    check_p(prob)?;
    check_mask(&m, x.numel())?;
    if x.view != o.view {
        return Err(invalid("self and out shapes differ"));
    }
    let scale = if prob < 1.0 { 1.0 / (1.0 - prob) } else { 0.0 };
    Ok(Arc::new(move |b: &mut Build| {
        let (x, m, o) = (x.clone(), m.clone(), o.clone());
        b.host(move || apply_mask(&x, &m, scale, &o));
        Ok(())
    }))
});

// Declared from: OM `random/drop_out_do_mask/op_api/aclnn_dropout_backward.h`; OP `npu_dropout_backward`
aclnn_op!(aclnnDropoutBackward, aclnnDropoutBackwardGetWorkspaceSize, "DropoutBackward",
(grad_output: *const Tensor, mask: *const Tensor, scale: f64, out: *const Tensor) |a| {
    let (g, m, o) = (a.tensor(grad_output, "gradOutput")?, a.tensor(mask, "mask")?, a.tensor(out, "out")?);
    a.dtype(&g)?;
    a.same_dtype(&g, &o, "gradOutput and out")?;
    check_mask(&m, g.numel())?;
    if scale != 0.0 && scale < 1.0 {
        return Err(invalid(format!("scale {scale} (0 or at least 1)")));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (g, m, o) = (g.clone(), m.clone(), o.clone());
        b.host(move || apply_mask(&g, &m, scale, &o));
        Ok(())
    }))
});

// Declared from: OM `random/dsa_gen_bit_mask/op_host/op_api/aclnn_dropout.h`, `random/drop_out_v3/op_api/aclnn_dropout_v3.h`
aclnn_op!(aclnnDropout, aclnnDropoutGetWorkspaceSize, "Dropout",
(input: *const Tensor, p: f64, train: bool, seed: i64, offset: i64, out: *const Tensor, mask_out: *const Tensor) |a| {
    let (x, o, m) = (a.tensor(input, "input")?, a.tensor(out, "out")?, a.tensor(mask_out, "maskOut")?);
    a.dtype(&x)?;
    a.same_dtype(&x, &o, "input and out")?;
    check_p(p)?;
    check_mask(&m, x.numel())?;
    let (p, scale) = if train {
        (p, if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 })
    } else {
        (0.0, 1.0)
    };
    Ok(Arc::new(move |b: &mut Build| {
        let (x, m, o) = (x.clone(), m.clone(), o.clone());
        b.host(move || {
            gen_mask(&m, x.numel() as u64, p, seed as u64, offset as u64);
            apply_mask(&x, &m, scale, &o)
        });
        Ok(())
    }))
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_uniform_and_reproducible() {
        let n = 100_000u64;
        let mean: f64 = (0..n).map(|i| uniform(7, 0, i)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert_eq!(
            uniform(7, 3, 5),
            uniform(7, 0, 8),
            "offset shifts the stream"
        );
        assert_ne!(uniform(7, 0, 5), uniform(8, 0, 5));
        let m2: f64 = (0..n).map(|i| normal(1, 0, i).powi(2)).sum::<f64>() / n as f64;
        assert!((m2 - 1.0).abs() < 0.03, "variance {m2}");
        assert_eq!(mask_bytes(1), 16);
        assert_eq!(mask_bytes(129), 32);
    }
}
