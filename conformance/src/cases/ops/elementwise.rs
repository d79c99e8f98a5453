//! `ops.<op>.<dtype>`: every elementwise op in every dtype it is defined for, over shape families
//! (empty, 0-d, one element, odd length with special values, numpy broadcasting, strided views
//! with padding, transposition and negative strides, large, in place), against the independent
//! references, checking that nothing outside the output view is written.

use super::reference::{backward, binary, is_exact, is_transcendental, unary};
use super::values::{decode, encode, eps, round_to};
use crate::case::{Case, CaseResult, Ctx, Failure, Need};
use std::sync::Arc;
use unihal_hal::{Buffer, DType, OpCall, OpClass, OpId, Scalar, Stream, TensorView};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::Bf16];
const ARITH: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::Bf16,
    DType::I32,
    DType::I64,
];

/// The dtypes an op is defined for (the contract, independent of any backend).
pub fn defined_dtypes(op: OpId) -> Vec<DType> {
    use OpId::*;
    match op {
        Fill | Copy | Where => DType::ALL.to_vec(),
        Cast | Neg | Abs | Relu | Add | Sub | Mul | Maximum | Minimum | AddScalar | SubScalar
        | MulScalar | MaximumScalar | MinimumScalar => ARITH.to_vec(),
        _ => FLOATS.to_vec(),
    }
}

/// Memory layout of one operand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Layout {
    Dense,
    /// Rows padded by 3 elements, 5 elements of offset.
    Padded,
    /// Column-major.
    Transposed,
    /// Last dim reversed (negative stride).
    Reversed,
}

/// A tensor placed in device memory with known contents.
pub(super) struct Placed {
    pub(super) view: TensorView,
    /// Memory image written before the op.
    pub(super) image: Vec<u8>,
    /// Byte position of each logical element (row-major).
    pub(super) pos: Vec<usize>,
}

fn strides_for(shape: &[u64], layout: Layout) -> (Vec<i64>, i64) {
    let nd = shape.len();
    let mut st = vec![0i64; nd];
    match layout {
        Layout::Dense | Layout::Padded | Layout::Reversed => {
            let pad = if layout == Layout::Padded { 3 } else { 0 };
            let mut s = 1i64;
            for d in (0..nd).rev() {
                st[d] = s;
                s *= shape[d].max(1) as i64 + if d == nd - 1 { pad } else { 0 };
            }
            if layout == Layout::Reversed && nd > 0 {
                st[nd - 1] = -st[nd - 1];
            }
        }
        Layout::Transposed => {
            let mut s = 1i64;
            for d in 0..nd {
                st[d] = s;
                s *= shape[d].max(1) as i64;
            }
        }
    }
    // Offset so the lowest element is at >= 5 (Padded) or 0.
    let low: i64 = shape
        .iter()
        .zip(&st)
        .map(|(&n, &s)| if s < 0 { (n as i64 - 1).max(0) * s } else { 0 })
        .sum();
    let base = if layout == Layout::Padded { 5 } else { 0 };
    (st, base - low)
}

pub(super) fn place(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    d: DType,
    shape: &[u64],
    layout: Layout,
    values: &[f64],
) -> unihal_hal::Result<Placed> {
    let (strides, off) = strides_for(shape, layout);
    let esz = d.size();
    let n: u64 = shape.iter().product();
    let high: i64 = shape
        .iter()
        .zip(&strides)
        .map(|(&k, &st)| {
            if st > 0 {
                (k as i64 - 1).max(0) * st
            } else {
                0
            }
        })
        .sum();
    let elems = if n == 0 {
        1
    } else {
        (off + high + 1) as usize + 4
    };
    let mut image: Vec<u8> = (0..elems * esz).map(|i| 0xA5u8 ^ (i as u8)).collect();
    let mut pos = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut rem = i;
        let mut e = off;
        for dd in (0..shape.len()).rev() {
            e += (rem % shape[dd]) as i64 * strides[dd];
            rem /= shape[dd];
        }
        let p = e as usize * esz;
        image[p..p + esz].copy_from_slice(&encode(d, values[i as usize]));
        pos.push(p);
    }
    let buf: Buffer = ctx.device.alloc(image.len())?;
    s.write(&buf, 0, &image)?;
    let view = TensorView::contiguous(&buf, d, shape).strided(off as u64 * esz as u64, &strides);
    Ok(Placed { view, image, pos })
}

/// Deterministic inputs in an op's domain, with special values for float dtypes when asked.
fn inputs(op: OpId, operand: usize, d: DType, n: usize, seed: u64, specials: bool) -> Vec<f64> {
    let mut x = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(operand as u64 * 7919 + 1);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let (lo, hi) = match (op, operand) {
        _ if d.is_integer() => (-1000.0, 1000.0),
        (OpId::Log | OpId::Sqrt | OpId::Rsqrt, 0) => (0.01, 8.0),
        (OpId::Pow, 0) | (OpId::PowScalar, 0) => (0.1, 4.0),
        (OpId::Pow, 1) => (-2.0, 2.0),
        (OpId::Exp, 0) => (-8.0, 8.0),
        (OpId::Cast, 0) => (-300.0, 300.0),
        _ => (-4.0, 4.0),
    };
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            let r = lo + (hi - lo) * next();
            if d.is_integer() {
                r.round()
            } else {
                r
            }
        })
        .collect();
    if op == OpId::Where && operand == 0 {
        v.iter_mut().for_each(|e| *e = (*e > 0.0) as u8 as f64);
        return v;
    }
    if matches!(op, OpId::Div | OpId::DivScalar) && operand == 1 {
        v.iter_mut()
            .for_each(|e| *e = if *e >= 0.0 { *e + 0.5 } else { *e - 0.5 });
    }
    if specials && n >= 16 {
        if d.is_float() {
            let tiny = match d {
                DType::F64 => 1e-310,
                DType::F32 | DType::Bf16 => 1e-40,
                _ => 3e-7,
            };
            let big = if d == DType::F16 { 60000.0 } else { 1e30 };
            let sp = [
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -0.0,
                0.0,
                tiny,
                -tiny,
                big,
                -big,
            ];
            let at = 1 + operand * 3;
            for (k, s) in sp.iter().enumerate() {
                v[(at + k * 5) % n] = *s;
            }
        } else if op != OpId::Cast {
            // Overflowing integer arithmetic wraps.
            let m = if d == DType::I32 {
                i32::MAX as f64
            } else {
                (1i64 << 40) as f64
            };
            v[2] = m - 3.0;
            v[3] = -m + 2.0;
        }
        if op == OpId::Cast && d.is_float() {
            for (k, s) in [1e10, -1e10, 3.7, -3.7, 2.5, 65519.0, 70000.0]
                .iter()
                .enumerate()
            {
                v[(40 + k * 3) % n] = *s;
            }
        }
    }
    v
}

/// The scalar as the kernels see it (single precision for f32, f16 and bf16; integer for ints).
fn scalar_value(d: DType, s: f64) -> f64 {
    match d {
        DType::F64 => s,
        _ if d.is_integer() => s.trunc(),
        _ => s as f32 as f64,
    }
}

/// Exact integer reference of an arithmetic op, wrapped to the dtype's width.
fn int_ref(op: OpId, d: DType, a: f64, b: f64) -> f64 {
    use OpId::*;
    let (a, b) = (a as i128, b as i128);
    let r: i128 = match op {
        Neg => -a,
        Abs => a.abs(),
        Relu => a.max(0),
        Add | AddScalar => a + b,
        Sub | SubScalar => a - b,
        Mul | MulScalar => a * b,
        Maximum | MaximumScalar => a.max(b),
        Minimum | MinimumScalar => a.min(b),
        _ => unreachable!("{op} has no integer form"),
    };
    if d == DType::I32 {
        r as i32 as f64
    } else {
        r as i64 as f64
    }
}

/// `got` against the exact result `exact_ref`, whose terms have absolute sum `scale` (so that
/// cancellation does not fail a correct kernel).
fn close(op: OpId, d: DType, got: f64, exact_ref: f64, scale: f64) -> bool {
    if !d.is_float() {
        return got == exact_ref;
    }
    let want = round_to(d, exact_ref);
    if want.is_nan() {
        return got.is_nan();
    }
    if is_exact(op) {
        return got == want && got.is_sign_negative() == want.is_sign_negative();
    }
    if want.is_infinite() || got.is_infinite() {
        return got == want;
    }
    let e = eps(d);
    let (rel, abs) = if is_transcendental(op) {
        match d {
            DType::F64 => (16.0 * e, 16.0 * e),
            DType::F32 => (8.0 * e, 16.0 * e),
            _ => (2.0 * e, 4.0 * e),
        }
    } else {
        (2.0 * e, 0.0)
    };
    let floor = match d {
        DType::F64 => 1e-300,
        DType::F32 => 1e-44,
        DType::F16 => 1.2e-7,
        _ => 1e-38,
    };
    (got - want).abs() <= rel * scale.max(exact_ref.abs()) + abs + floor
}

/// One shape family: output shape and, per input operand, its shape and layout.
struct Family {
    name: &'static str,
    out: Vec<u64>,
    out_layout: Layout,
    ins: Vec<(Vec<u64>, Layout)>,
    specials: bool,
    in_place: bool,
}

fn families(class: OpClass, n_in: usize) -> Vec<Family> {
    let same = |shape: Vec<u64>, l: Layout| vec![(shape, l); n_in];
    let mut f = vec![
        Family {
            name: "empty",
            out: vec![0],
            out_layout: Layout::Dense,
            ins: same(vec![0], Layout::Dense),
            specials: false,
            in_place: false,
        },
        Family {
            name: "0-d",
            out: vec![],
            out_layout: Layout::Dense,
            ins: same(vec![], Layout::Dense),
            specials: false,
            in_place: false,
        },
        Family {
            name: "one",
            out: vec![1],
            out_layout: Layout::Dense,
            ins: same(vec![1], Layout::Dense),
            specials: false,
            in_place: false,
        },
        Family {
            name: "odd",
            out: vec![1037],
            out_layout: Layout::Dense,
            ins: same(vec![1037], Layout::Dense),
            specials: true,
            in_place: false,
        },
        Family {
            name: "broadcast",
            out: vec![23, 17],
            out_layout: Layout::Dense,
            ins: (0..n_in)
                .map(|k| match k % 3 {
                    0 => (vec![23, 17], Layout::Dense),
                    1 => (vec![17], Layout::Dense),
                    _ => (vec![23, 1], Layout::Dense),
                })
                .collect(),
            specials: false,
            in_place: false,
        },
        Family {
            name: "strided",
            out: vec![17, 23],
            out_layout: Layout::Padded,
            ins: (0..n_in)
                .map(|k| {
                    (
                        vec![17, 23],
                        [Layout::Transposed, Layout::Reversed, Layout::Padded][k % 3],
                    )
                })
                .collect(),
            specials: false,
            in_place: false,
        },
        Family {
            name: "large",
            out: vec![65541],
            out_layout: Layout::Dense,
            ins: same(vec![65541], Layout::Dense),
            specials: false,
            in_place: false,
        },
    ];
    if matches!(
        class,
        OpClass::Unary
            | OpClass::UnaryBackward
            | OpClass::Binary
            | OpClass::BinaryScalar
            | OpClass::Copy
    ) {
        f.push(Family {
            name: "in_place",
            out: vec![1037],
            out_layout: Layout::Dense,
            ins: same(vec![1037], Layout::Dense),
            specials: true,
            in_place: true,
        });
    }
    f
}

/// Runs `op` (output dtype `d`, cast source `src`) over every family.
fn check_op(ctx: &Ctx, op: OpId, d: DType, src: DType) -> CaseResult {
    let class = op.class();
    let (n_t, _, _, first_out) = class.arity();
    let n_in = if class == OpClass::Axpy { 2 } else { first_out };
    let s = ctx.stream()?;
    for (fi, mut fam) in families(class, n_in).into_iter().enumerate() {
        if class == OpClass::Axpy {
            // y is read and written: it has the output's shape and layout; x broadcasts.
            fam.ins[1] = (fam.out.clone(), fam.out_layout);
        }
        let n: u64 = fam.out.iter().product();
        let in_dtype = |k: usize| match (class, k) {
            (OpClass::Where, 0) => DType::U8,
            (OpClass::Cast, 0) => src,
            _ => d,
        };
        // Inputs (for axpy, operand 1 is y: input and output).
        let mut vals = Vec::new();
        let mut placed = Vec::new();
        for (k, (shape, layout)) in fam.ins.iter().enumerate() {
            let cnt: u64 = shape.iter().product();
            let v = inputs(
                op,
                k,
                in_dtype(k),
                cnt as usize,
                fi as u64 + 1,
                fam.specials,
            );
            let p = place(ctx, &s, in_dtype(k), shape, *layout, &v)?;
            // Read back what the dtype stores.
            vals.push(
                v.iter()
                    .map(|&x| decode(in_dtype(k), &encode(in_dtype(k), x)))
                    .collect::<Vec<f64>>(),
            );
            placed.push(p);
        }
        let out = if class == OpClass::Axpy {
            None
        } else if fam.in_place {
            Some(Placed {
                view: placed[0].view.clone(),
                image: placed[0].image.clone(),
                pos: placed[0].pos.clone(),
            })
        } else {
            Some(place(
                ctx,
                &s,
                d,
                &fam.out,
                fam.out_layout,
                &vec![0.0; n as usize],
            )?)
        };
        let scalar = match op {
            OpId::PowScalar => 1.7,
            OpId::DivScalar => -2.5,
            OpId::Axpy => 1.5,
            _ => 0.75,
        };
        let sc = if d.is_integer() {
            Scalar::I64(3)
        } else {
            Scalar::F64(scalar)
        };
        let mut tensors: Vec<TensorView> = placed.iter().map(|p| p.view.clone()).collect();
        if let Some(o) = &out {
            tensors.push(o.view.clone());
        }
        let call = match class {
            OpClass::Fill => OpCall::fill(
                tensors[0].clone(),
                Scalar::F64(if d.is_integer() { -7.0 } else { 3.25 }),
            ),
            OpClass::BinaryScalar => {
                OpCall::binary_scalar(op, tensors[0].clone(), sc, tensors[1].clone())
            }
            OpClass::Axpy => OpCall::axpy(sc, tensors[0].clone(), tensors[1].clone()),
            _ => OpCall {
                op,
                tensors,
                scalars: vec![],
                rng: None,
            },
        };
        debug_assert_eq!(call.tensors.len(), n_t);
        s.run_op(&call)?;
        s.synchronize()?;
        // Reference, element by element over the output shape (inputs broadcast).
        let bidx = |k: usize, i: u64| -> usize {
            let shape = &fam.ins[k].0;
            let lead = fam.out.len() - shape.len();
            let (mut rem, mut idx, mut mul) = (i, 0u64, 1u64);
            for dd in (0..fam.out.len()).rev() {
                let c = rem % fam.out[dd];
                rem /= fam.out[dd];
                if dd >= lead {
                    let sz = shape[dd - lead];
                    idx += if sz == 1 { 0 } else { c } * mul;
                    mul *= sz;
                }
            }
            idx as usize
        };
        let sv = scalar_value(d, if d.is_integer() { 3.0 } else { scalar });
        let (target, tview_bytes) = match &out {
            Some(o) => (o, o.view.buffer.clone()),
            None => (&placed[1], placed[1].view.buffer.clone()),
        };
        let got_bytes = ctx.download(&tview_bytes)?;
        let esz = d.size();
        for i in 0..n {
            let x = |k: usize| vals[k][bidx(k, i)];
            let want = match class {
                OpClass::Fill => decode(d, &encode(d, if d.is_integer() { -7.0 } else { 3.25 })),
                OpClass::Copy => x(0),
                OpClass::Cast => {
                    if src.is_integer() && d.is_integer() {
                        round_to(d, x(0))
                    } else {
                        decode(d, &encode(d, x(0)))
                    }
                }
                OpClass::Unary if d.is_integer() => int_ref(op, d, x(0), 0.0),
                OpClass::Binary if d.is_integer() => int_ref(op, d, x(0), x(1)),
                OpClass::BinaryScalar if d.is_integer() => int_ref(op, d, x(0), sv),
                OpClass::Unary => unary(op, x(0)),
                OpClass::UnaryBackward => backward(op, x(0), x(1)),
                OpClass::Binary => binary(op, x(0), x(1)),
                OpClass::BinaryScalar => binary(op, x(0), sv),
                OpClass::Axpy => sv * x(0) + x(1),
                OpClass::Where => {
                    if x(0) != 0.0 {
                        x(1)
                    } else {
                        x(2)
                    }
                }
                _ => unreachable!(),
            };
            let p = target.pos[i as usize];
            let got = decode(d, &got_bytes[p..p + esz]);
            let scale = match (class, op) {
                (OpClass::Binary, OpId::Add | OpId::Sub) => x(0).abs() + x(1).abs(),
                (OpClass::BinaryScalar, OpId::AddScalar | OpId::SubScalar) => x(0).abs() + sv.abs(),
                (OpClass::Axpy, _) => (sv * x(0)).abs() + x(1).abs(),
                _ => want.abs(),
            };
            if !close(op, d, got, want, scale) {
                let inputs: Vec<f64> = (0..n_in).map(x).collect();
                return Err(Failure::new(format!(
                    "{op} {d} family {}: element {i} of {:?}: got {got:e}, expected {:e} (exact {want:e}) from inputs {inputs:?}",
                    fam.name, fam.out, round_to(d, want)
                )));
            }
        }
        // Nothing outside the output's elements changed.
        let mut expect = target.image.clone();
        for &p in &target.pos {
            expect[p..p + esz].copy_from_slice(&got_bytes[p..p + esz]);
        }
        if let Some(b) = expect.iter().zip(&got_bytes).position(|(a, b)| a != b) {
            return Err(Failure::new(format!(
                "{op} {d} family {}: byte {b} outside the output view was written",
                fam.name
            )));
        }
    }
    Ok(())
}

/// One case per op and dtype (and per source/destination pair for casts).
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for op in OpId::ALL {
        let class = op.class();
        if !class.is_elementwise()
            || matches!(
                class,
                OpClass::Random | OpClass::DropoutForward | OpClass::DropoutBackward
            )
        {
            continue;
        }
        for d in defined_dtypes(op) {
            if class == OpClass::Cast {
                for src in defined_dtypes(op) {
                    v.push(
                        Case::new(
                            format!("ops.cast.{}_to_{}", src.name(), d.name()),
                            move |ctx| check_op(ctx, op, d, src),
                        )
                        .needs(&[Need::Op(op, d), Need::Op(op, src)]),
                    );
                }
                continue;
            }
            v.push(
                Case::new(format!("ops.{}.{}", op.name(), d.name()), move |ctx| {
                    check_op(ctx, op, d, d)
                })
                .needs(&[Need::Op(op, d)]),
            );
        }
    }
    v
}
