//! Independent f64 references of the ops (they never call the kernels), and a reference of the
//! counter-based generator and the random ops, bit-exact by construction.

use unihal_hal::OpId;

const GELU_K: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Reference of a unary op.
pub fn unary(op: OpId, x: f64) -> f64 {
    match op {
        OpId::Neg => -x,
        OpId::Abs => x.abs(),
        OpId::Exp => x.exp(),
        OpId::Log => x.ln(),
        OpId::Sqrt => x.sqrt(),
        OpId::Rsqrt => 1.0 / x.sqrt(),
        OpId::Tanh => x.tanh(),
        OpId::Sigmoid => sigmoid(x),
        OpId::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        OpId::GeluTanh => 0.5 * x * (1.0 + (GELU_K * (x + 0.044715 * x * x * x)).tanh()),
        OpId::GeluErf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        OpId::Silu => x * sigmoid(x),
        _ => unreachable!("{op} is not unary"),
    }
}

/// Reference of a unary backward op: dy * f'(x).
pub fn backward(op: OpId, x: f64, dy: f64) -> f64 {
    let d = match op {
        OpId::ReluBackward => return if x > 0.0 { dy } else { 0.0 },
        OpId::GeluTanhBackward => {
            let t = (GELU_K * (x + 0.044715 * x * x * x)).tanh();
            let sech2 = 1.0 - t * t;
            // The second term vanishes where tanh saturates (its limit is 0, also at infinity).
            let second = if sech2 == 0.0 {
                0.0
            } else {
                0.5 * x * sech2 * GELU_K * (1.0 + 3.0 * 0.044715 * x * x)
            };
            0.5 * (1.0 + t) + second
        }
        OpId::GeluErfBackward => {
            0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
                + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
        }
        OpId::SiluBackward => {
            let s = sigmoid(x);
            s * (1.0 + x * (1.0 - s))
        }
        _ => unreachable!("{op} is not a backward op"),
    };
    dy * d
}

/// Reference of a binary op (also the `*_scalar` forms).
pub fn binary(op: OpId, a: f64, b: f64) -> f64 {
    use OpId::*;
    match op {
        Add | AddScalar => a + b,
        Sub | SubScalar => a - b,
        Mul | MulScalar => a * b,
        Div | DivScalar => a / b,
        Maximum | MaximumScalar => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        Minimum | MinimumScalar => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        Pow | PowScalar => a.powf(b),
        _ => unreachable!("{op} is not binary"),
    }
}

/// True for ops whose result is exactly determined (compared bit for bit, sign of zero included).
pub fn is_exact(op: OpId) -> bool {
    use OpId::*;
    matches!(
        op,
        Fill | Copy
            | Cast
            | Neg
            | Abs
            | Relu
            | ReluBackward
            | Maximum
            | Minimum
            | MaximumScalar
            | MinimumScalar
            | Where
    )
}

/// True for ops computed through transcendental functions (looser float tolerance).
pub fn is_transcendental(op: OpId) -> bool {
    use OpId::*;
    matches!(
        op,
        Exp | Log
            | Tanh
            | Sigmoid
            | GeluTanh
            | GeluErf
            | Silu
            | GeluTanhBackward
            | GeluErfBackward
            | SiluBackward
            | Pow
            | PowScalar
    )
}

/// Philox4x32-10 on a full 128-bit counter and 64-bit key.
pub fn philox(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for r in 0..10 {
        if r > 0 {
            k[0] = k[0].wrapping_add(0x9E37_79B9);
            k[1] = k[1].wrapping_add(0xBB67_AE85);
        }
        let p0 = 0xD251_1F53u64 * c[0] as u64;
        let p1 = 0xCD9E_8D57u64 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The block for element `i` of a call with `(seed, offset)`: counter `offset + i`, key `seed`.
pub fn block(seed: u64, offset: u64, i: u64) -> [u32; 4] {
    let c = offset.wrapping_add(i);
    philox(
        [c as u32, (c >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// Top 24 bits as a float in [0, 1).
pub fn uniform24(w: u32) -> f32 {
    (w >> 8) as f32 * 2f32.powi(-24)
}

/// The documented float algorithm of the normal generator, replicated operation for operation.
pub fn normal_f32(r: [u32; 4]) -> f32 {
    let u1 = ((r[0] >> 8) + 1) as f32 * 2f32.powi(-24);
    let u2 = uniform24(r[1]);
    // log(u1): exponent and mantissa split, then 2 atanh series.
    let b = u1.to_bits();
    let mut e = ((b >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((b & 0x7f_ffff) | 0x3f80_0000);
    if m > std::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = 1.0f32 / 11.0;
    for c in [1.0f32 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0] {
        p = p * s2 + c;
    }
    let ln = e as f32 * std::f32::consts::LN_2 + 2.0 * s * p;
    // cos(2 pi u2) by quadrant and Taylor polynomials.
    let q4 = u2 * 4.0;
    let q = q4 as i32;
    let t = (q4 - q as f32) * std::f32::consts::FRAC_PI_2;
    let t2 = t * t;
    let mut c = 1.0f32 / 479_001_600.0;
    for k in [
        -1.0f32 / 3_628_800.0,
        1.0 / 40320.0,
        -1.0 / 720.0,
        1.0 / 24.0,
        -0.5,
        1.0,
    ] {
        c = c * t2 + k;
    }
    let mut sn = -1.0f32 / 39_916_800.0;
    for k in [
        1.0f32 / 362_880.0,
        -1.0 / 5040.0,
        1.0 / 120.0,
        -1.0 / 6.0,
        1.0,
    ] {
        sn = sn * t2 + k;
    }
    sn *= t;
    let cos = match q {
        0 => c,
        1 => -sn,
        2 => -c,
        _ => sn,
    };
    (-2.0f32 * ln).sqrt() * cos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_random123_known_answer() {
        assert_eq!(
            philox([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
    }

    #[test]
    fn normal_reference_is_close_to_the_exact_transform() {
        for i in 0..1000u64 {
            let r = block(7, 0, i);
            let u1 = ((r[0] >> 8) + 1) as f64 * 2f64.powi(-24);
            let u2 = uniform24(r[1]) as f64;
            let exact = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            assert!(
                (normal_f32(r) as f64 - exact).abs() < 2e-6 * (1.0 + exact.abs()),
                "{i}"
            );
        }
    }
}
