//! The phase-1 probe at device open: every op × dtype of the SoC's table is run once, on small
//! operands, through the same mapping as a real call but phase 1 only (the executors are
//! destroyed, nothing is enqueued, no workspace allocated). A pair whose operators the installed
//! CANN refuses (`ACLNN_ERR_PARAM_INVALID`, an operator missing from its libraries) is left out
//! of the capabilities, so the capabilities say what this machine's CANN really runs. Any other
//! failure (an allocation, an internal error, a code no header lists) fails the device's open:
//! a transient error must not silently turn an operator into "unsupported" (a fault sweep found
//! exactly that).

use super::{execute, Exec};
use crate::loader::Cann;
use crate::runtime::AscendDevice;
use std::collections::BTreeMap;
use unihal_hal::{
    AdamWOptions, Buffer, CeOptions, DType, Device, HalError, OpCall, OpClass, OpId, ParamGroup,
    Result, RngState, Scalar, SgdOptions, TensorView,
};

/// Views carved from one buffer, disjoint and 256-byte aligned.
struct Carve {
    buf: Buffer,
    next: u64,
}

impl Carve {
    fn view(&mut self, d: DType, shape: &[u64]) -> TensorView {
        let n: u64 = shape.iter().product::<u64>().max(1);
        let off = self.next;
        self.next += (n * d.size() as u64).div_ceil(256) * 256;
        TensorView::contiguous(&self.buf, d, shape)
            .strided(off, &unihal_hal::op::contiguous_strides(shape))
    }
}

/// A small call of `op` keyed on dtype `d`, over views of `c`.
fn sample(op: OpId, d: DType, c: &mut Carve) -> OpCall {
    let rng = RngState { seed: 1, offset: 0 };
    let x = |c: &mut Carve, t: DType| c.view(t, &[4, 8]);
    let acc = unihal_hal::op::nn::acc_dtype(d);
    match op.class() {
        OpClass::Fill => OpCall::fill(x(c, d), Scalar::I64(1)),
        OpClass::Copy => OpCall::copy(x(c, d), x(c, d)),
        OpClass::Cast => {
            let to = if d == DType::F32 {
                DType::F16
            } else {
                DType::F32
            };
            OpCall::cast(x(c, d), x(c, to))
        }
        OpClass::Unary => OpCall::unary(op, x(c, d), x(c, d)),
        OpClass::UnaryBackward => OpCall::unary_backward(op, x(c, d), x(c, d), x(c, d)),
        OpClass::Binary => OpCall::binary(op, x(c, d), x(c, d), x(c, d)),
        OpClass::BinaryScalar => OpCall::binary_scalar(op, x(c, d), Scalar::F64(2.0), x(c, d)),
        OpClass::Axpy => OpCall::axpy(Scalar::F64(2.0), x(c, d), x(c, d)),
        OpClass::Where => OpCall::where_(x(c, DType::Bool), x(c, d), x(c, d), x(c, d)),
        OpClass::Random if op == OpId::RandomNormal => OpCall::normal(x(c, d), 0.0, 1.0, rng),
        OpClass::Random => OpCall::uniform(x(c, d), 0.0, 1.0, rng),
        OpClass::DropoutForward => OpCall::dropout(x(c, d), x(c, d), x(c, DType::U8), 0.5, rng),
        OpClass::DropoutBackward => {
            OpCall::dropout_backward(x(c, d), x(c, DType::U8), x(c, d), 0.5)
        }
        OpClass::Reduce => {
            let out = if matches!(op, OpId::Argmax | OpId::Argmin) {
                DType::I64
            } else {
                d
            };
            OpCall::reduce(op, x(c, d), c.view(out, &[4, 1]), -1)
        }
        OpClass::Softmax => OpCall::softmax(op, x(c, d), x(c, d)),
        OpClass::SoftmaxMasked => OpCall::softmax_masked(op, x(c, d), c.view(d, &[8]), x(c, d)),
        OpClass::SoftmaxBackward => OpCall::softmax_backward(op, x(c, d), x(c, d), x(c, d)),
        OpClass::CrossEntropy => OpCall::cross_entropy(
            x(c, d),
            c.view(DType::I64, &[4]),
            c.view(DType::F32, &[]),
            CeOptions::default(),
        ),
        OpClass::CrossEntropyBackward => OpCall::cross_entropy_backward(
            x(c, d),
            c.view(DType::I64, &[4]),
            c.view(DType::F32, &[]),
            x(c, d),
            CeOptions::default(),
        ),
        OpClass::LayerNorm => {
            let (w, b) = (c.view(d, &[8]), c.view(d, &[8]));
            OpCall::layer_norm(
                x(c, d),
                w,
                b,
                x(c, d),
                c.view(acc, &[4]),
                c.view(acc, &[4]),
                1e-5,
            )
        }
        OpClass::LayerNormBackward => {
            let (xv, dy, w) = (x(c, d), x(c, d), c.view(d, &[8]));
            let (m, r) = (c.view(acc, &[4]), c.view(acc, &[4]));
            OpCall::layer_norm_backward(xv, dy, w, m, r, x(c, d), c.view(d, &[8]), c.view(d, &[8]))
        }
        OpClass::RmsNorm => {
            OpCall::rms_norm(x(c, d), c.view(d, &[8]), x(c, d), c.view(acc, &[4]), 1e-5)
        }
        OpClass::RmsNormBackward => {
            let (xv, dy, w, r) = (x(c, d), x(c, d), c.view(d, &[8]), c.view(acc, &[4]));
            OpCall::rms_norm_backward(xv, dy, w, r, x(c, d), c.view(d, &[8]))
        }
        OpClass::Matmul => OpCall::matmul(
            c.view(d, &[4, 8]),
            c.view(d, &[8, 4]),
            c.view(d, &[4, 4]),
            1.0,
            0.0,
        ),
        OpClass::IndexSelect => OpCall::index_select(
            c.view(d, &[8, 4]),
            c.view(DType::I64, &[4]),
            c.view(d, &[4, 4]),
        ),
        OpClass::IndexAdd => OpCall::index_add(
            c.view(d, &[4, 4]),
            c.view(DType::I64, &[4]),
            c.view(d, &[8, 4]),
        ),
        OpClass::Optimizer => {
            let width = if op == OpId::AdamW { 2 } else { 1 };
            let g = ParamGroup {
                param: c.view(DType::F32, &[8]),
                grad: c.view(d, &[8]),
                state: (0..width).map(|_| c.view(DType::F32, &[8])).collect(),
                copy: None,
            };
            if op == OpId::AdamW {
                OpCall::adamw(
                    &[g],
                    AdamWOptions {
                        lr: 1e-3,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                        weight_decay: 0.01,
                        step: 1,
                    },
                )
            } else {
                OpCall::sgd_momentum(
                    &[g],
                    SgdOptions {
                        lr: 0.1,
                        momentum: 0.9,
                        dampening: 0.0,
                        weight_decay: 0.0,
                        nesterov: false,
                        first_step: true,
                    },
                )
            }
        }
        OpClass::AmpUnscale => OpCall::amp_unscale(
            c.view(DType::F32, &[1]),
            c.view(DType::F32, &[1]),
            &[c.view(d, &[8])],
        ),
        OpClass::AmpUpdateScale => OpCall::amp_update_scale(
            c.view(DType::F32, &[1]),
            c.view(DType::I32, &[1]),
            c.view(DType::F32, &[1]),
            2.0,
            0.5,
            10,
        ),
        OpClass::ClipGradNorm => {
            OpCall::clip_grad_norm(c.view(DType::F32, &[1]), &[c.view(d, &[8])], 1.0)
        }
        OpClass::Attention | OpClass::AttentionBackward => {
            let qkv = |c: &mut Carve| c.view(d, &[1, 2, 4, 8]);
            let o = unihal_hal::AttentionOptions {
                causal: true,
                ..unihal_hal::AttentionOptions::new(8)
            };
            let (q, k, v) = (qkv(c), qkv(c), qkv(c));
            if op == OpId::Attention {
                OpCall::attention(q, k, v, None, qkv(c), c.view(acc, &[1, 2, 4]), o)
            } else {
                let (out, dout) = (qkv(c), qkv(c));
                let lse = c.view(acc, &[1, 2, 4]);
                OpCall::attention_backward(q, k, v, None, out, dout, lse, qkv(c), qkv(c), qkv(c), o)
            }
        }
        OpClass::Rope => {
            let (cos, sin) = (c.view(d, &[4, 8]), c.view(d, &[4, 8]));
            let (x, y) = (c.view(d, &[2, 4, 8]), c.view(d, &[2, 4, 8]));
            if op == OpId::Rope {
                OpCall::rope(x, cos, sin, y, false)
            } else {
                OpCall::rope_backward(x, cos, sin, y, false)
            }
        }
        OpClass::AddLayerNorm => OpCall::add_layer_norm(
            x(c, d),
            x(c, d),
            c.view(d, &[8]),
            c.view(d, &[8]),
            x(c, d),
            x(c, d),
            c.view(acc, &[4]),
            c.view(acc, &[4]),
            1e-5,
        ),
        OpClass::AddRmsNorm => OpCall::add_rms_norm(
            x(c, d),
            x(c, d),
            c.view(d, &[8]),
            x(c, d),
            x(c, d),
            c.view(acc, &[4]),
            1e-5,
        ),
    }
}

/// Whether `e` is CANN saying that it does not run this op × dtype here (the pair is left out):
/// phase 1 rejected the dtype, shape or attributes, or the operator's kernel or symbol is
/// missing from the installed packages.
fn refused_here(e: &HalError) -> bool {
    use crate::conv::aclnn;
    match e {
        HalError::Unsupported { .. } | HalError::InvalidArgument { .. } => true,
        HalError::Vendor { library, code, .. } if library == crate::conv::ACLNN => matches!(
            i32::try_from(*code),
            Ok(aclnn::PARAM_INVALID
                | aclnn::INNER_TILING
                | aclnn::INNER_FIND_KERNEL
                | aclnn::INNER_LOAD_KERNEL)
        ),
        _ => false,
    }
}

/// `dev`'s table (its capabilities' ops) restricted to the pairs whose operators phase 1
/// accepts here.
///
/// # Errors
/// The device's (allocating the probe's memory, creating its stream); a phase-1 failure
/// that is not CANN refusing the pair ([`refused_here`]).
pub fn supported(cann: &Cann, dev: &AscendDevice) -> Result<BTreeMap<OpId, Vec<DType>>> {
    let stream = dev.create_stream()?;
    let s = crate::runtime::AscendStream::of(&stream)?;
    let operands = dev.alloc(1 << 16)?;
    let scratch = dev.alloc(1 << 20)?;
    let mut out = BTreeMap::new();
    for (op, dtypes) in &dev.capabilities().optional.ops {
        let mut ok = Vec::new();
        for &d in dtypes {
            let mut c = Carve {
                buf: operands.clone(),
                next: 0,
            };
            let call = sample(*op, d, &mut c);
            let probe = Exec::probe(cann, s, scratch.clone());
            match execute(probe, &call) {
                Ok(()) => ok.push(d),
                Err(e) if refused_here(&e) => {
                    tracing::info!(target: "unihal::init", "{} {op} in {d}: left out by the probe: {e}", dev.id())
                }
                Err(e) => return Err(e),
            }
        }
        if !ok.is_empty() {
            out.insert(*op, ok);
        }
    }
    drop(stream);
    Ok(out)
}
