//! Element encodings and the reference rounding into each dtype, written independently of the
//! kernels (f16/bf16 nearest-even by exact midpoint comparison, not by the kernels' algorithm).

use unihal_hal::DType;

/// Bytes of one element of `d` holding `v` (floats rounded to nearest even, integers converted
/// as Rust's `as`: truncating and saturating).
pub fn encode(d: DType, v: f64) -> Vec<u8> {
    match d {
        DType::F64 => v.to_le_bytes().to_vec(),
        DType::F32 => (v as f32).to_le_bytes().to_vec(),
        DType::F16 => nearest_f16(v).to_le_bytes().to_vec(),
        DType::Bf16 => nearest_bf16(v).to_le_bytes().to_vec(),
        DType::I8 => (v as i8).to_le_bytes().to_vec(),
        DType::U8 => (v as u8).to_le_bytes().to_vec(),
        DType::Bool => vec![(v != 0.0) as u8],
        DType::I16 => (v as i16).to_le_bytes().to_vec(),
        DType::I32 => (v as i32).to_le_bytes().to_vec(),
        DType::I64 => (v as i64).to_le_bytes().to_vec(),
        DType::U32 => (v as u32).to_le_bytes().to_vec(),
        DType::U64 => (v as u64).to_le_bytes().to_vec(),
    }
}

/// The value of one element of `d`.
pub fn decode(d: DType, b: &[u8]) -> f64 {
    let a = |n: usize| -> [u8; 8] {
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(&b[..n]);
        x
    };
    match d {
        DType::F64 => f64::from_le_bytes(a(8)),
        DType::F32 => f32::from_le_bytes(a(4)[..4].try_into().unwrap()) as f64,
        DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
        DType::Bf16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
        DType::I8 => b[0] as i8 as f64,
        DType::U8 | DType::Bool => b[0] as f64,
        DType::I16 => i16::from_le_bytes([b[0], b[1]]) as f64,
        DType::I32 => i32::from_le_bytes(a(4)[..4].try_into().unwrap()) as f64,
        DType::I64 => i64::from_le_bytes(a(8)) as f64,
        DType::U32 => u32::from_le_bytes(a(4)[..4].try_into().unwrap()) as f64,
        DType::U64 => u64::from_le_bytes(a(8)) as f64,
    }
}

/// `v` rounded into `d` as a value (integers: wrapping, as integer arithmetic does).
pub fn round_to(d: DType, v: f64) -> f64 {
    match d {
        DType::I32 => (v as i128 as i32) as f64,
        DType::I64 => (v as i128 as i64) as f64,
        _ => decode(d, &encode(d, v)),
    }
}

/// Value of a 16-bit pattern, treating infinity as the first value past the largest finite one
/// (the rounding boundary), for exact midpoint comparison.
fn value16(bits: u16, to_f64: fn(u16) -> f64, exp_mask: u16, overflow: f64) -> Option<f64> {
    let mag = bits & 0x7fff;
    if mag & exp_mask == exp_mask {
        if mag != exp_mask {
            return None; // NaN
        }
        return Some(if bits & 0x8000 != 0 {
            -overflow
        } else {
            overflow
        });
    }
    Some(to_f64(bits))
}

/// Nearest-even rounding of `x` into a 16-bit format, by comparing `x` with the exact midpoints of
/// neighbouring patterns (`approx` is any rounding that is off by at most one pattern).
fn nearest16(
    x: f64,
    approx: fn(f64) -> u16,
    to_f64: fn(u16) -> f64,
    exp_mask: u16,
    overflow: f64,
) -> u16 {
    if x.is_nan() {
        return approx(x);
    }
    let c = approx(x);
    let mut cands: Vec<(u16, f64)> = [c.wrapping_sub(1), c, c.wrapping_add(1)]
        .into_iter()
        .filter(|&b| (b & 0x8000) == (c & 0x8000) || b & 0x7fff == 0)
        .filter_map(|b| value16(b, to_f64, exp_mask, overflow).map(|v| (b, v)))
        .collect();
    cands.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (first, last) = (cands[0], cands[cands.len() - 1]);
    if x <= first.1 {
        return first.0;
    }
    if x >= last.1 {
        return last.0;
    }
    for w in cands.windows(2) {
        let (lo, hi) = (w[0], w[1]);
        if lo.1 <= x && x <= hi.1 {
            // Midpoints of neighbouring 16-bit values are exact in f64.
            let m = (lo.1 + hi.1) / 2.0;
            return if x < m || (x == m && lo.0 & 1 == 0) {
                lo.0
            } else {
                hi.0
            };
        }
    }
    c
}

/// Correctly rounded f64 → f16 bits.
pub fn nearest_f16(x: f64) -> u16 {
    nearest16(
        x,
        |v| half::f16::from_f64(v).to_bits(),
        |b| half::f16::from_bits(b).to_f64(),
        0x7c00,
        65536.0,
    )
}

/// Correctly rounded f64 → bf16 bits.
pub fn nearest_bf16(x: f64) -> u16 {
    nearest16(
        x,
        |v| half::bf16::from_f64(v).to_bits(),
        |b| half::bf16::from_bits(b).to_f64(),
        0x7f80,
        2f64.powi(128),
    )
}

/// Unit roundoff scale (one ulp of 1.0) of a float dtype.
pub fn eps(d: DType) -> f64 {
    match d {
        DType::F64 => f64::EPSILON,
        DType::F32 => f32::EPSILON as f64,
        DType::F16 => 2f64.powi(-10),
        DType::Bf16 => 2f64.powi(-7),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rounding_agrees_with_half_on_f32_sources_and_fixes_f64_ties() {
        // For f32 sources, half's conversion is correctly rounded: the two must agree.
        let mut x = 0x3f80_0000u32;
        for _ in 0..20000 {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            let f = f32::from_bits(x);
            if !f.is_finite() {
                continue;
            }
            assert_eq!(
                nearest_f16(f as f64),
                half::f16::from_f32(f).to_bits(),
                "{f:e}"
            );
            assert_eq!(
                nearest_bf16(f as f64),
                half::bf16::from_f32(f).to_bits(),
                "{f:e}"
            );
        }
        // 1 + 2^-11 is an exact f16 tie (to even: 1.0); a hair above must round up.
        assert_eq!(nearest_f16(1.0 + 2f64.powi(-11)), 0x3c00);
        assert_eq!(nearest_f16(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 0x3c01);
        assert_eq!(nearest_f16(65520.0), 0x7c00);
        assert_eq!(nearest_f16(65519.0), 0x7bff);
        assert_eq!(nearest_f16(-0.0), 0x8000);
    }
}
