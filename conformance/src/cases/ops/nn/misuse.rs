//! `ops.nn.misuse.<op>`: every training op rejects malformed calls with a typed
//! `InvalidArgument` naming the argument, before anything runs: bad axes, shapes, dtypes, options,
//! operands that are not dense along the normalised axis, and outputs overlapping inputs.

use crate::case::{expect_invalid, Case, CaseResult, Ctx, Need};
use unihal_hal::{Buffer, CeOptions, CeReduction, DType, OpCall, OpId, TensorView};

/// A fresh 64 KiB buffer viewed as a dense tensor.
fn t(ctx: &Ctx, d: DType, shape: &[u64]) -> unihal_hal::Result<TensorView> {
    let b: Buffer = ctx.device.alloc(64 * 1024)?;
    Ok(TensorView::contiguous(&b, d, shape))
}

/// (what, call, expected argument name).
type Bad = (&'static str, OpCall, &'static str);

fn calls(ctx: &Ctx, op: OpId) -> unihal_hal::Result<Vec<Bad>> {
    use DType::*;
    let f = |shape: &[u64]| t(ctx, F32, shape);
    let mut v: Vec<Bad> = Vec::new();
    match op {
        OpId::ReduceSum => {
            v.push((
                "axis 2 of a 2-d tensor",
                OpCall::reduce(op, f(&[3, 4])?, f(&[3, 1])?, 2),
                "axis",
            ));
            v.push((
                "axis -3 of a 2-d tensor",
                OpCall::reduce(op, f(&[3, 4])?, f(&[3, 1])?, -3),
                "axis",
            ));
            v.push((
                "output without keepdim",
                OpCall::reduce(op, f(&[3, 4])?, f(&[3])?, 1),
                "out",
            ));
            v.push((
                "output of another dtype",
                OpCall::reduce(op, f(&[3, 4])?, t(ctx, F64, &[3, 1])?, 1),
                "out",
            ));
            let x = f(&[3, 4])?;
            let alias = x.clone().strided(0, &[4, 1]);
            let out = TensorView {
                shape: vec![3, 1],
                strides: vec![4, 1],
                ..alias
            };
            v.push((
                "output inside the input",
                OpCall::reduce(op, x, out, 1),
                "output",
            ));
        }
        OpId::Argmax => {
            v.push((
                "f32 output",
                OpCall::reduce(op, f(&[3, 4])?, f(&[3, 1])?, 1),
                "out",
            ));
            v.push((
                "empty axis",
                OpCall::reduce(op, f(&[3, 0])?, t(ctx, I64, &[3, 1])?, 1),
                "x",
            ));
        }
        OpId::Softmax => {
            let x = f(&[4, 3])?;
            let xt = x.clone().strided(0, &[1, 4]);
            v.push((
                "transposed input",
                OpCall::softmax(op, xt, f(&[4, 3])?),
                "tensors",
            ));
            v.push((
                "output of another shape",
                OpCall::softmax(op, f(&[4, 3])?, f(&[3, 4])?),
                "y",
            ));
            v.push(("0-d input", OpCall::softmax(op, f(&[])?, f(&[])?), "x"));
            let y = x.clone();
            v.push((
                "output aliasing the input",
                OpCall::softmax(op, x, y),
                "output",
            ));
        }
        OpId::SoftmaxMasked => {
            v.push((
                "mask that does not broadcast",
                OpCall::softmax_masked(op, f(&[4, 3])?, f(&[2, 3])?, f(&[4, 3])?),
                "mask",
            ));
            v.push((
                "mask of another dtype",
                OpCall::softmax_masked(op, f(&[4, 3])?, t(ctx, F16, &[3])?, f(&[4, 3])?),
                "tensors",
            ));
        }
        OpId::CrossEntropy => {
            let o = CeOptions::default();
            let i64t = |s: &[u64]| t(ctx, I64, s);
            v.push((
                "3-d logits",
                OpCall::cross_entropy(f(&[2, 3, 4])?, i64t(&[2])?, f(&[])?, o),
                "logits",
            ));
            v.push((
                "f32 targets",
                OpCall::cross_entropy(f(&[2, 3])?, f(&[2])?, f(&[])?, o),
                "target",
            ));
            v.push((
                "targets of another length",
                OpCall::cross_entropy(f(&[2, 3])?, i64t(&[3])?, f(&[])?, o),
                "target",
            ));
            v.push((
                "f16 loss",
                OpCall::cross_entropy(f(&[2, 3])?, i64t(&[2])?, t(ctx, F16, &[])?, o),
                "loss",
            ));
            let none = CeOptions {
                reduction: CeReduction::None,
                ..o
            };
            v.push((
                "scalar loss with reduction none",
                OpCall::cross_entropy(f(&[2, 3])?, i64t(&[2])?, f(&[])?, none),
                "loss",
            ));
            let smooth = CeOptions {
                label_smoothing: 1.5,
                ..o
            };
            v.push((
                "label smoothing 1.5",
                OpCall::cross_entropy(f(&[2, 3])?, i64t(&[2])?, f(&[])?, smooth),
                "label_smoothing",
            ));
            let mut bad = OpCall::cross_entropy(f(&[2, 3])?, i64t(&[2])?, f(&[])?, o);
            bad.scalars[0] = unihal_hal::Scalar::I64(7);
            v.push(("reduction 7", bad, "reduction"));
            v.push((
                "no classes",
                OpCall::cross_entropy(f(&[2, 0])?, i64t(&[2])?, f(&[])?, o),
                "logits",
            ));
        }
        OpId::LayerNorm => {
            let (x, y) = (f(&[4, 8])?, f(&[4, 8])?);
            v.push((
                "weight of the wrong length",
                OpCall::layer_norm(
                    x.clone(),
                    f(&[7])?,
                    f(&[8])?,
                    y.clone(),
                    f(&[4])?,
                    f(&[4])?,
                    1e-5,
                ),
                "weight",
            ));
            v.push((
                "f16 statistics",
                OpCall::layer_norm(
                    x.clone(),
                    f(&[8])?,
                    f(&[8])?,
                    y.clone(),
                    t(ctx, F16, &[4])?,
                    f(&[4])?,
                    1e-5,
                ),
                "statistics",
            ));
            v.push((
                "negative eps",
                OpCall::layer_norm(
                    x.clone(),
                    f(&[8])?,
                    f(&[8])?,
                    y.clone(),
                    f(&[4])?,
                    f(&[4])?,
                    -1.0,
                ),
                "eps",
            ));
            v.push((
                "statistics of the wrong shape",
                OpCall::layer_norm(x, f(&[8])?, f(&[8])?, y, f(&[8])?, f(&[4])?, 1e-5),
                "statistics",
            ));
        }
        OpId::RmsNormBackward => {
            let x = f(&[4, 8])?;
            v.push((
                "dweight of the wrong length",
                OpCall::rms_norm_backward(
                    x.clone(),
                    f(&[4, 8])?,
                    f(&[8])?,
                    f(&[4])?,
                    f(&[4, 8])?,
                    f(&[4])?,
                ),
                "weight",
            ));
            let xt = x.clone().strided(0, &[1, 4]);
            v.push((
                "transposed dy",
                OpCall::rms_norm_backward(x, xt, f(&[8])?, f(&[4])?, f(&[4, 8])?, f(&[8])?),
                "tensors",
            ));
        }
        OpId::Matmul => {
            v.push((
                "inner dimensions differ",
                OpCall::matmul(f(&[3, 4])?, f(&[5, 2])?, f(&[3, 2])?, 1.0, 0.0),
                "tensors",
            ));
            v.push((
                "batches that do not broadcast",
                OpCall::matmul(f(&[2, 3, 4])?, f(&[3, 4, 2])?, f(&[2, 3, 2])?, 1.0, 0.0),
                "tensors",
            ));
            v.push((
                "1-d operand",
                OpCall::matmul(f(&[4])?, f(&[4, 2])?, f(&[2])?, 1.0, 0.0),
                "tensors",
            ));
            v.push((
                "mixed dtypes",
                OpCall::matmul(f(&[3, 4])?, t(ctx, F64, &[4, 2])?, f(&[3, 2])?, 1.0, 0.0),
                "tensors",
            ));
            let a = f(&[4, 4])?;
            v.push((
                "c is a",
                OpCall::matmul(a.clone(), f(&[4, 4])?, a, 1.0, 1.0),
                "output",
            ));
        }
        OpId::IndexSelect => {
            v.push((
                "2-d index",
                OpCall::index_select(f(&[5, 3])?, t(ctx, I64, &[2, 2])?, f(&[4, 3])?),
                "tensors",
            ));
            v.push((
                "f32 index",
                OpCall::index_select(f(&[5, 3])?, f(&[2])?, f(&[2, 3])?),
                "index",
            ));
            v.push((
                "rows of another length",
                OpCall::index_select(f(&[5, 3])?, t(ctx, I64, &[2])?, f(&[2, 4])?),
                "tensors",
            ));
            let table = f(&[5, 3])?.strided(0, &[1, 5]);
            v.push((
                "transposed table",
                OpCall::index_select(table, t(ctx, I64, &[2])?, f(&[2, 3])?),
                "tensors",
            ));
        }
        _ => {}
    }
    Ok(v)
}

fn run(ctx: &Ctx, op: OpId) -> CaseResult {
    let s = ctx.stream()?;
    for (what, call, arg) in calls(ctx, op)? {
        expect_invalid(s.run_op(&call), arg)
            .map_err(|e| crate::case::Failure::new(format!("{op}: {what}: {}", e.message)))?;
    }
    s.synchronize()?;
    Ok(())
}

/// Empty outputs whose other dims are huge (2^40): the op succeeds at once, with no work and no
/// allocation in proportion to any dim (a backend that plans per batch or per row first would
/// abort on an allocation of 2^40 entries, or run for hours).
fn empty_with_huge_dims(ctx: &Ctx) -> CaseResult {
    const HUGE: u64 = 1 << 40;
    let s = ctx.stream()?;
    let b = ctx.device.alloc(4096)?;
    let v = |shape: &[u64], strides: &[i64]| {
        TensorView::contiguous(&b, DType::F32, shape).strided(0, strides)
    };
    let caps = ctx.device.capabilities();
    let mut calls = Vec::new();
    if caps.supports(OpId::Matmul, DType::F32) {
        // c: 2^40 batches of 0 x 1; a (a broadcast batch) and b broadcast over the batch.
        calls.push((
            "matmul [2^40, 0, 1]",
            OpCall::matmul(
                v(&[HUGE, 0, 3], &[0, 3, 1]),
                v(&[1, 3, 1], &[0, 1, 1]),
                TensorView::contiguous(&b, DType::F32, &[HUGE, 0, 1]),
                1.0,
                0.0,
            ),
        ));
        calls.push((
            "matmul [0, 4, 4] with k = 2^40",
            OpCall::matmul(
                v(&[0, 4, HUGE], &[0, 0, 0]),
                v(&[0, HUGE, 4], &[0, 0, 0]),
                v(&[0, 4, 4], &[16, 4, 1]),
                1.0,
                0.0,
            ),
        ));
    }
    if caps.supports(OpId::Softmax, DType::F32) {
        calls.push((
            "softmax [2^40, 0]",
            OpCall::softmax(
                OpId::Softmax,
                v(&[HUGE, 0], &[0, 1]),
                v(&[HUGE, 0], &[0, 1]),
            ),
        ));
    }
    if caps.supports(OpId::ReduceSum, DType::F32) {
        calls.push((
            "reduce_sum [0, 2^40] along 1",
            OpCall::reduce(
                OpId::ReduceSum,
                v(&[0, HUGE], &[0, 0]),
                v(&[0, 1], &[1, 1]),
                1,
            ),
        ));
    }
    for (what, call) in calls {
        s.run_op(&call)
            .map_err(|e| crate::case::Failure::new(format!("{what}: {e}")))?;
    }
    s.synchronize()?;
    Ok(())
}

/// One misuse case per op family.
pub fn cases() -> Vec<Case> {
    let ops = [
        (OpId::ReduceSum, DType::F32),
        (OpId::Argmax, DType::F32),
        (OpId::Softmax, DType::F32),
        (OpId::SoftmaxMasked, DType::F32),
        (OpId::CrossEntropy, DType::F32),
        (OpId::LayerNorm, DType::F32),
        (OpId::RmsNormBackward, DType::F32),
        (OpId::Matmul, DType::F32),
        (OpId::IndexSelect, DType::F32),
    ];
    let mut v: Vec<Case> = ops
        .into_iter()
        .map(|(op, d)| {
            Case::new(format!("ops.nn.misuse.{}", op.name()), move |ctx| {
                run(ctx, op)
            })
            .needs(&[Need::Op(op, d)])
        })
        .collect();
    v.push(
        Case::new("ops.nn.empty_output_with_huge_dims", empty_with_huge_dims)
            .needs(&[Need::Op(OpId::Matmul, DType::F32)]),
    );
    v
}
