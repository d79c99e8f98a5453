//! Each catalogue op as aclnn operator calls (the op map's A.4 rows; compositions from A.5
//! where aclnn has no single operator). Operands are the call's views as they are; the
//! compositions' intermediates are caching-allocator blocks of the stream ([`Exec::temp`]).
//!
//! Compositions, and why:
//! * `axpy`: `aclnnInplaceAdd(y, x, alpha)` (no standard `aclnnAxpy`).
//! * masked softmax: `aclnnAdd(x, mask)` then `aclnnSoftmax`/`aclnnLogSoftmax`.
//! * cross-entropy forward and backward: `aclnnLogSoftmax` + `aclnnNLLLoss` in f32 (the fused
//!   `aclnnCrossEntropyLossGrad` takes label smoothing 0 only and is absent on the 910); label
//!   smoothing from row sums of the log-probabilities, ignored rows found by an NLL of a
//!   constant (-1) tensor. Backward: `aclnnNLLLossBackward` gives `-g'` at the targets, so
//!   `dlogits = (1-s)·A + (softmax - s/C)·rowsum(-A)`.
//! * dropout: the catalogue's mask is one byte per element, aclnn's a bit mask: the bits from
//!   `aclnnDropoutGenMaskV2`, the output from `aclnnDropoutDoMask`, the byte mask from the same
//!   bits applied to ones and cast to bool; backward: cast mask, multiply, scale.
//! * matmul with `alpha`/`beta`: the product into a temporary, then `aclnnMuls` and
//!   `aclnnInplaceAdd`; batch dims that do not merge into one are run batch by batch.
//! * SGD and AdamW without the fused operators (910): their update rules from elementwise
//!   operators; gradients in f16/bf16 are cast to f32 first (the fused operators take one dtype).
//! * clip by global norm: `ForeachNorm` → `Stack` → `LinalgVectorNorm` → `Adds` →
//!   `Reciprocal` → `Muls` → `ClampMax` → `ForeachMulScalar` (A.5).

use super::desc::Descs;
use super::Exec;
use crate::conv::acl_dtype;
use unihal_hal::{
    op::contiguous_strides, DType, HalError, OpCall, OpId, OptimizerStep, Result, RngState, Scalar,
    TensorView,
};

type D = crate::ffi::nnopbase::Desc;

/// The common start of the cross-entropy compositions ([`Exec::ce_setup`]).
struct Ce {
    n: u64,
    c: u64,
    reduction: i64,
    ignore: i64,
    /// Label smoothing.
    s: f64,
    /// The reduction in `aclnnNLLLoss`'s numbering.
    nll_red: i64,
    /// The logits in f32.
    x: TensorView,
    /// Their log-softmax.
    logp: TensorView,
}

fn f(v: f64) -> Scalar {
    Scalar::F64(v)
}

/// The call's scalar `k` as f64 (the elementwise classes' scalars: the training classes read
/// theirs through the HAL's typed accessors, `unihal_hal::op::args`).
fn sc(call: &OpCall, k: usize) -> f64 {
    call.scalars.get(k).map_or(0.0, |s| s.as_f64())
}

/// A dim of `ndim` from a possibly negative axis.
fn axis(a: i64, ndim: usize) -> i64 {
    if a < 0 {
        a + ndim as i64
    } else {
        a
    }
}

/// `t` seen as `shape` (contiguous strides: `t` must be dense).
fn reshaped(t: &TensorView, shape: &[u64]) -> TensorView {
    TensorView {
        shape: shape.to_vec(),
        strides: contiguous_strides(shape),
        ..t.clone()
    }
}

/// `t` with a trailing dim of 1 (aclnn's `[A..., 1]` statistics).
fn keepdim(t: &TensorView) -> TensorView {
    let mut v = t.clone();
    v.shape.push(1);
    v.strides.push(1);
    v
}

impl Exec<'_> {
    pub(super) fn unary(&mut self, which: OpId, x: &TensorView, y: &TensorView) -> Result<()> {
        let a = &self.cann.aclnn;
        let (op, name) = match which {
            OpId::Neg => (a.neg, "Neg"),
            OpId::Abs => (a.abs, "Abs"),
            OpId::Exp => (a.exp, "Exp"),
            OpId::Log => (a.log, "Log"),
            OpId::Sqrt => (a.sqrt, "Sqrt"),
            OpId::Rsqrt => (a.rsqrt, "Rsqrt"),
            OpId::Tanh => (a.tanh, "Tanh"),
            OpId::Sigmoid => (a.sigmoid, "Sigmoid"),
            OpId::Relu => (a.relu, "Relu"),
            OpId::Silu => (a.silu, "Silu"),
            // OpId::ClipGradNorm: the reciprocal step of clipping.
            _ => (a.reciprocal, "Reciprocal"),
        };
        let mut d = Descs::new(self.cann);
        let (x, y) = (d.tensor(x), d.tensor(y));
        // Every phase-1 call in this file passes live descriptors of the call's `Descs`, the
        // out-pointers `Exec::call` gives, and arguments as the operator's row declares them.
        // SAFETY: as above.
        self.call(op, name, d, |f, w, e| unsafe { f(x, y, w, e) })
    }

    fn binary(
        &mut self,
        which: OpId,
        x: &TensorView,
        o: &TensorView,
        out: &TensorView,
    ) -> Result<()> {
        let a = &self.cann.aclnn;
        let (op, name) = match which {
            OpId::Mul => (a.mul, "Mul"),
            OpId::Div => (a.div, "Div"),
            OpId::Maximum => (a.maximum, "Maximum"),
            OpId::Minimum => (a.minimum, "Minimum"),
            _ => (a.pow_tensor_tensor, "PowTensorTensor"),
        };
        let mut d = Descs::new(self.cann);
        let (x, o, y) = (d.tensor(x), d.tensor(o), d.tensor(out));
        // SAFETY: see `unary`.
        self.call(op, name, d, |f, w, e| unsafe { f(x, o, y, w, e) })
    }

    /// `out = x + alpha * o` (or minus for `sub`).
    pub(super) fn add(
        &mut self,
        x: &TensorView,
        o: &TensorView,
        alpha: f64,
        out: &TensorView,
        sub: bool,
    ) -> Result<()> {
        let a = &self.cann.aclnn;
        let (op, name) = if sub { (a.sub, "Sub") } else { (a.add, "Add") };
        let mut d = Descs::new(self.cann);
        let (xd, od, al, yd) = (
            d.tensor(x),
            d.tensor(o),
            d.scalar(f(alpha), out.dtype),
            d.tensor(out),
        );
        // SAFETY: see `unary`.
        self.call(op, name, d, |f, w, e| unsafe { f(xd, od, al, yd, w, e) })
    }

    /// `y += alpha * x`.
    fn inplace_add(&mut self, y: &TensorView, x: &TensorView, alpha: f64) -> Result<()> {
        let mut d = Descs::new(self.cann);
        let (yd, xd, al) = (d.tensor(y), d.tensor(x), d.scalar(f(alpha), y.dtype));
        let op = self.cann.aclnn.inplace_add;
        // SAFETY: see `unary`.
        self.call(op, "InplaceAdd", d, |f, w, e| unsafe {
            f(yd, xd, al, w, e)
        })
    }

    /// A tensor-scalar op: `Adds`/`Subs` (with alpha 1), `Muls`, `Divs`, `ClampMin`, `ClampMax`,
    /// `PowTensorScalar`.
    pub(super) fn scalar_op(
        &mut self,
        which: OpId,
        x: &TensorView,
        v: Scalar,
        out: &TensorView,
    ) -> Result<()> {
        let a = &self.cann.aclnn;
        let mut d = Descs::new(self.cann);
        let (xd, yd) = (d.tensor(x), d.tensor(out));
        let vd = d.scalar(v, out.dtype);
        match which {
            OpId::AddScalar | OpId::SubScalar => {
                let one = d.scalar(f(1.0), out.dtype);
                let (op, name) = if which == OpId::AddScalar {
                    (a.adds, "Adds")
                } else {
                    (a.subs, "Subs")
                };
                // SAFETY: see `unary`.
                self.call(op, name, d, |f, w, e| unsafe { f(xd, vd, one, yd, w, e) })
            }
            _ => {
                let (op, name) = match which {
                    OpId::MulScalar => (a.muls, "Muls"),
                    OpId::DivScalar => (a.divs, "Divs"),
                    OpId::MaximumScalar => (a.clamp_min, "ClampMin"),
                    OpId::MinimumScalar => (a.clamp_max, "ClampMax"),
                    _ => (a.pow_tensor_scalar, "PowTensorScalar"),
                };
                // SAFETY: see `unary`.
                self.call(op, name, d, |f, w, e| unsafe { f(xd, vd, yd, w, e) })
            }
        }
    }

    fn muls(&mut self, x: &TensorView, v: f64, out: &TensorView) -> Result<()> {
        self.scalar_op(OpId::MulScalar, x, f(v), out)
    }

    pub(super) fn fill(&mut self, t: &TensorView, v: Scalar) -> Result<()> {
        let mut d = Descs::new(self.cann);
        let (td, vd) = (d.tensor(t), d.scalar(v, t.dtype));
        let op = self.cann.aclnn.inplace_fill_scalar;
        // SAFETY: see `unary`.
        self.call(op, "InplaceFillScalar", d, |f, w, e| unsafe {
            f(td, vd, w, e)
        })
    }

    pub(super) fn copy(&mut self, src: &TensorView, dst: &TensorView) -> Result<()> {
        let mut d = Descs::new(self.cann);
        let (dd, sd) = (d.tensor(dst), d.tensor(src));
        let op = self.cann.aclnn.inplace_copy;
        // SAFETY: see `unary`.
        self.call(op, "InplaceCopy", d, |f, w, e| unsafe { f(dd, sd, w, e) })
    }

    pub(super) fn cast(&mut self, src: &TensorView, dst: &TensorView) -> Result<()> {
        let mut d = Descs::new(self.cann);
        let (sd, dd) = (d.tensor(src), d.tensor(dst));
        let dt = acl_dtype(dst.dtype);
        let op = self.cann.aclnn.cast;
        // SAFETY: see `unary`.
        self.call(op, "Cast", d, |f, w, e| unsafe { f(sd, dt, dd, w, e) })
    }

    /// `t` in f32: itself, or a cast copy.
    fn as_f32(&mut self, t: &TensorView) -> Result<TensorView> {
        if t.dtype == DType::F32 {
            return Ok(t.clone());
        }
        let tmp = self.temp(DType::F32, &t.shape)?;
        self.cast(t, &tmp)?;
        Ok(tmp)
    }

    /// `out = sum over dims` (keep-dims as given), in `out`'s dtype.
    fn reduce_sum(
        &mut self,
        x: &TensorView,
        dims: &[i64],
        keep: bool,
        out: &TensorView,
    ) -> Result<()> {
        let mut d = Descs::new(self.cann);
        let (xd, dd, od) = (d.tensor(x), d.ints(dims), d.tensor(out));
        let dt = acl_dtype(out.dtype);
        let op = self.cann.aclnn.reduce_sum;
        // SAFETY: see `unary`.
        self.call(op, "ReduceSum", d, |f, w, e| unsafe {
            f(xd, dd, keep, dt, od, w, e)
        })
    }

    fn softmax(&mut self, log: bool, x: &TensorView, dim: i64, y: &TensorView) -> Result<()> {
        let a = &self.cann.aclnn;
        let (op, name) = if log {
            (a.log_softmax, "LogSoftmax")
        } else {
            (a.softmax, "Softmax")
        };
        let mut d = Descs::new(self.cann);
        let (xd, yd) = (d.tensor(x), d.tensor(y));
        // SAFETY: see `unary`.
        self.call(op, name, d, |f, w, e| unsafe { f(xd, dim, yd, w, e) })
    }

    /// NLL loss of f32 log-probabilities with unit weights; `reduction` 0 none, 1 mean, 2 sum.
    fn nll(
        &mut self,
        logp: &TensorView,
        target: &TensorView,
        reduction: i64,
        ignore: i64,
        out: &TensorView,
    ) -> Result<()> {
        let c = logp.shape[1];
        let w = self.temp(DType::F32, &[c])?;
        self.fill(&w, f(1.0))?;
        let tw = self.temp(DType::F32, &[1])?;
        let mut d = Descs::new(self.cann);
        let (xd, td, wd, od, twd) = (
            d.tensor(logp),
            d.tensor(target),
            d.tensor(&w),
            d.tensor(out),
            d.tensor(&tw),
        );
        let op = self.cann.aclnn.nll_loss;
        // SAFETY: see `unary`.
        self.call(op, "NLLLoss", d, |f, ws, e| unsafe {
            f(xd, td, wd, reduction, ignore, od, twd, ws, e)
        })
    }

    /// Per-row indicator (f32, `[N]`) of the rows whose target is not `ignore`: the NLL of a
    /// tensor of -1 (A.5 has no comparison to spare).
    fn counted(&mut self, n: u64, c: u64, target: &TensorView, ignore: i64) -> Result<TensorView> {
        let neg = self.temp(DType::F32, &[n, c])?;
        self.fill(&neg, f(-1.0))?;
        let valid = self.temp(DType::F32, &[n])?;
        self.nll(&neg, target, 0, ignore, &valid)?;
        Ok(valid)
    }

    /// What both cross-entropy directions start from: the sizes and options, the logits in
    /// f32 and their log-softmax.
    fn ce_setup(&mut self, call: &OpCall) -> Result<Ce> {
        let logits = &call.tensors[0];
        let (n, c) = (logits.shape[0], logits.shape[1]);
        let o = call.ce_options()?;
        let reduction = o.reduction as i64;
        // HAL reduction: 0 mean, 1 sum, 2 none; NLL: 0 none, 1 mean, 2 sum.
        let nll_red = match reduction {
            0 => 1,
            1 => 2,
            _ => 0,
        };
        let x = self.as_f32(logits)?;
        let logp = self.temp(DType::F32, &[n, c])?;
        self.softmax(true, &x, 1, &logp)?;
        Ok(Ce {
            n,
            c,
            reduction,
            ignore: o.ignore_index,
            s: o.label_smoothing,
            nll_red,
            x,
            logp,
        })
    }

    fn cross_entropy(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let (target, loss) = (&t[1], &t[2]);
        let Ce {
            n,
            c,
            reduction,
            ignore,
            s,
            nll_red,
            x: _,
            logp,
        } = self.ce_setup(call)?;
        if s == 0.0 {
            return self.nll(&logp, target, nll_red, ignore, loss);
        }
        let nll = self.temp(DType::F32, &[n])?;
        self.nll(&logp, target, 0, ignore, &nll)?;
        let valid = self.counted(n, c, target, ignore)?;
        let rs = self.temp(DType::F32, &[n])?;
        self.reduce_sum(&logp, &[1], false, &rs)?;
        // per row: (1-s)·nll - s/C·Σlogp, zero on ignored rows (nll is zero there already).
        self.muls(&rs.clone(), -s / c as f64, &rs)?;
        self.binary(OpId::Mul, &rs.clone(), &valid, &rs)?;
        let l = self.temp(DType::F32, &[n])?;
        self.add(&rs, &nll, 1.0 - s, &l, false)?;
        match reduction {
            2 => self.copy(&l, loss),
            1 => self.reduce_sum(&l, &[0], false, loss),
            _ => {
                let (sl, cnt) = (self.temp(DType::F32, &[])?, self.temp(DType::F32, &[])?);
                self.reduce_sum(&l, &[0], false, &sl)?;
                self.reduce_sum(&valid, &[0], false, &cnt)?;
                self.binary(OpId::Div, &sl, &cnt, loss)
            }
        }
    }

    fn cross_entropy_backward(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let (target, dloss, dlogits) = (&t[1], &t[2], &t[3]);
        let Ce {
            n,
            c,
            reduction: _,
            ignore,
            s,
            nll_red,
            x,
            logp,
        } = self.ce_setup(call)?;
        // A = NLL backward: -g' at each counted row's target (g' = dloss, / count for mean).
        let a_t = self.temp(DType::F32, &[n, c])?;
        {
            let w = self.temp(DType::F32, &[c])?;
            self.fill(&w, f(1.0))?;
            // The total weight of the forward: the number of counted rows.
            let tw = self.temp(DType::F32, &[1])?;
            let valid = self.counted(n, c, target, ignore)?;
            self.reduce_sum(&valid, &[0], true, &tw)?;
            let g = self.as_f32(dloss)?;
            let mut d = Descs::new(self.cann);
            let (gd, xd, td, wd, twd, od) = (
                d.tensor(&g),
                d.tensor(&logp),
                d.tensor(target),
                d.tensor(&w),
                d.tensor(&tw),
                d.tensor(&a_t),
            );
            let op = self.cann.aclnn.nll_loss_backward;
            // SAFETY: see `unary`.
            self.call(op, "NLLLossBackward", d, |f, ws, e| unsafe {
                f(gd, xd, td, wd, nll_red, ignore, twd, od, ws, e)
            })?;
        }
        // r = rowsum(-A) = g' per counted row; dlogits = (1-s)·A + (softmax - s/C)·r.
        let r = self.temp(DType::F32, &[n, 1])?;
        self.reduce_sum(&a_t, &[1], true, &r)?;
        self.muls(&r.clone(), -1.0, &r)?;
        let sm = self.temp(DType::F32, &[n, c])?;
        self.softmax(false, &x, 1, &sm)?;
        if s != 0.0 {
            self.scalar_op(OpId::AddScalar, &sm.clone(), f(-s / c as f64), &sm)?;
        }
        self.binary(OpId::Mul, &sm.clone(), &r, &sm)?;
        let out = if dlogits.dtype == DType::F32 {
            dlogits.clone()
        } else {
            self.temp(DType::F32, &[n, c])?
        };
        self.add(&sm, &a_t, 1.0 - s, &out, false)?;
        if dlogits.dtype != DType::F32 {
            self.cast(&out, dlogits)?;
        }
        Ok(())
    }

    fn dropout(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let (x, out, mask) = (&t[0], &t[1], &t[2]);
        let p = sc(call, 0);
        let rng = call.rng.unwrap_or(RngState { seed: 0, offset: 0 });
        let n = x.numel();
        let bits = self.temp(DType::U8, &[n.div_ceil(128) * 16])?;
        {
            let mut d = Descs::new(self.cann);
            let (sd, bd) = (d.ints(&[n as i64]), d.tensor(&bits));
            let pdt = acl_dtype(x.dtype);
            let op = self.cann.aclnn.dropout_gen_mask_v2;
            let (seed, off) = (rng.seed as i64, rng.offset as i64);
            // SAFETY: see `unary`.
            self.call(op, "DropoutGenMaskV2", d, |f, w, e| unsafe {
                f(sd, p, seed, off, pdt, bd, w, e)
            })?;
        }
        self.do_mask(x, &bits, p, out)?;
        // The byte mask: the same bits applied to ones, as bool.
        let ones = self.temp(x.dtype, &x.shape)?;
        self.fill(&ones, f(1.0))?;
        let kept = self.temp(x.dtype, &x.shape)?;
        self.do_mask(&ones, &bits, p, &kept)?;
        if mask.dtype == DType::Bool {
            self.cast(&kept, mask)
        } else {
            let b = self.temp(DType::Bool, &x.shape)?;
            self.cast(&kept, &b)?;
            self.cast(&b, mask)
        }
    }

    fn do_mask(
        &mut self,
        x: &TensorView,
        bits: &TensorView,
        p: f64,
        out: &TensorView,
    ) -> Result<()> {
        let mut d = Descs::new(self.cann);
        let (xd, bd, od) = (d.tensor(x), d.tensor(bits), d.tensor(out));
        let op = self.cann.aclnn.dropout_do_mask;
        // SAFETY: see `unary`.
        self.call(op, "DropoutDoMask", d, |f, w, e| unsafe {
            f(xd, bd, p, od, w, e)
        })
    }

    fn dropout_backward(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let (dy, mask, dx) = (&t[0], &t[1], &t[2]);
        let p = sc(call, 0);
        if p >= 1.0 {
            return self.fill(dx, f(0.0));
        }
        let m = self.temp(dy.dtype, &mask.shape)?;
        self.cast(mask, &m)?;
        let prod = self.temp(dy.dtype, &dx.shape)?;
        self.binary(OpId::Mul, dy, &m, &prod)?;
        self.muls(&prod, 1.0 / (1.0 - p), dx)
    }

    fn matmul(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let (a, b, c) = (&t[0], &t[1], &t[2]);
        let (alpha, beta) = call.matmul_scales()?;
        let direct = alpha == 1.0 && beta == 0.0;
        // With alpha/beta, f16/bf16 products are made in f32 (one rounding into c, as the HAL
        // says). The 910 takes f32 only as ALLOW_FP32_DOWN_PRECISION, which rounds the inputs
        // to f16 and accumulates in f32: exact here, the inputs being f16 values already.
        let half = matches!(c.dtype, DType::F16 | DType::Bf16);
        let wide = !direct && half;
        let (a, b) = if wide {
            (&self.as_f32(a)?, &self.as_f32(b)?)
        } else {
            (a, b)
        };
        let prod = if direct {
            c.clone()
        } else {
            self.temp(if wide { DType::F32 } else { c.dtype }, &c.shape)?
        };
        let nd = c.shape.len();
        let batch: Vec<u64> = c.shape[..nd - 2].to_vec();
        let bview = |v: &TensorView| -> (Vec<i64>, [u64; 2], [i64; 2]) {
            let k = v.shape.len();
            let mat = [v.shape[k - 2], v.shape[k - 1]];
            let ms = [v.strides[k - 2], v.strides[k - 1]];
            // Batch strides broadcast to c's batch dims (0 where broadcast).
            let lead = nd - 2 - (k - 2);
            let mut bs = vec![0i64; nd - 2];
            for i in 0..k - 2 {
                bs[lead + i] = if v.shape[i] == 1 { 0 } else { v.strides[i] };
            }
            (bs, mat, ms)
        };
        let (ab, am, ams) = bview(a);
        let (bb, bm, bms) = bview(b);
        let (cb, cm, cms) = bview(&prod);
        // One 3-D call when the batch dims merge (each operand's batch strides are those of a
        // single dim over c's batch shape), else one call per batch element.
        let merged = |bs: &[i64]| -> Option<i64> {
            let mut stride = None;
            let mut expect = 0i64;
            for (i, &d) in batch.iter().enumerate().rev() {
                if d == 1 {
                    continue;
                }
                match stride {
                    None => {
                        stride = Some(bs[i]);
                        expect = bs[i] * d as i64;
                    }
                    Some(_) => {
                        if bs[i] != expect {
                            return None;
                        }
                        expect = bs[i] * d as i64;
                    }
                }
            }
            Some(stride.unwrap_or(0))
        };
        let nb: u64 = batch.iter().product();
        // KEEP_DTYPE (f32 stays f32; the 910 refuses it for f32, so its table has no f32
        // matmul), except for the widened half inputs above.
        let cube: i8 = if wide && self.force_composed() { 1 } else { 0 };
        let run3 = |ex: &mut Exec, off: [u64; 3], nbat: u64, bst: [i64; 3]| -> Result<()> {
            let view = |v: &TensorView, o: u64, m: [u64; 2], ms: [i64; 2], s: i64| TensorView {
                offset: v.offset + o * v.dtype.size() as u64,
                shape: vec![nbat, m[0], m[1]],
                strides: vec![s, ms[0], ms[1]],
                ..v.clone()
            };
            let (av, bv, cv) = (
                view(a, off[0], am, ams, bst[0]),
                view(b, off[1], bm, bms, bst[1]),
                view(&prod, off[2], cm, cms, bst[2]),
            );
            let mut d = Descs::new(ex.cann);
            let (ad, bd, cd) = (d.tensor(&av), d.tensor(&bv), d.tensor(&cv));
            let op = ex.cann.aclnn.batch_mat_mul;
            // SAFETY: see `unary`.
            ex.call(op, "BatchMatMul", d, |f, w, e| unsafe {
                f(ad, bd, cd, cube, w, e)
            })
        };
        match (merged(&ab), merged(&bb), merged(&cb)) {
            (Some(sa), Some(sb), Some(scb)) => run3(self, [0, 0, 0], nb.max(1), [sa, sb, scb])?,
            _ => {
                for i in 0..nb {
                    let mut rem = i;
                    let mut off = [0u64; 3];
                    for (k, &d) in batch.iter().enumerate().rev() {
                        let idx = (rem % d) as i64;
                        rem /= d;
                        off[0] = (off[0] as i64 + idx * ab[k]) as u64;
                        off[1] = (off[1] as i64 + idx * bb[k]) as u64;
                        off[2] = (off[2] as i64 + idx * cb[k]) as u64;
                    }
                    run3(self, off, 1, [0, 0, 0])?;
                }
            }
        }
        if direct {
            return Ok(());
        }
        // alpha·prod + beta·c, in f32 for f16/bf16 (one rounding into c, as the HAL says).
        let half = matches!(c.dtype, DType::F16 | DType::Bf16);
        let (p, acc) = if half {
            let p = self.as_f32(&prod)?;
            let acc = self.temp(DType::F32, &c.shape)?;
            (p, acc)
        } else {
            (prod.clone(), c.clone())
        };
        if beta == 0.0 {
            self.muls(&p, alpha, &acc)?;
        } else {
            if half {
                self.cast(c, &acc)?;
            }
            self.muls(&acc.clone(), beta, &acc)?;
            self.inplace_add(&acc, &p, alpha)?;
        }
        if half {
            self.cast(&acc, c)?;
        }
        Ok(())
    }

    fn sgd(&mut self, call: &OpCall) -> Result<()> {
        let (OptimizerStep::Sgd(o), copy) = call.optimizer_step()? else {
            return Err(HalError::Internal(format!("{} is not SGD", call.op)));
        };
        let (lr, mom, damp, wd) = (o.lr, o.momentum, o.dampening, o.weight_decay);
        let (nesterov, first) = (o.nesterov, o.first_step);
        let width = 3 + copy as usize;
        // Empty tensors have nothing to update (and aclnn's lists need none).
        let groups: Vec<&[TensorView]> = call
            .tensors
            .chunks(width)
            .filter(|g| g[0].numel() > 0)
            .collect();
        let mut grads = Vec::new();
        for g in &groups {
            grads.push(self.as_f32(&reshaped(&g[1], &g[0].shape))?);
        }
        if self.cann.aclnn.fused_sgd.is_some() && !self.force_composed() {
            let params: Vec<TensorView> = groups.iter().map(|g| g[0].clone()).collect();
            let bufs: Vec<TensorView> = groups.iter().map(|g| g[2].clone()).collect();
            let mut d = Descs::new(self.cann);
            let (pl, gl, bl) = (d.list(&params), d.list(&grads), d.list(&bufs));
            let op = self.cann.aclnn.fused_sgd;
            let null: D = std::ptr::null_mut();
            // SAFETY: see `unary` (gradScale NULL: none).
            self.call(op, "FusedSgd", d, |f, w, e| unsafe {
                f(
                    pl,
                    gl,
                    bl,
                    null,
                    wd as f32,
                    mom as f32,
                    lr as f32,
                    damp as f32,
                    nesterov,
                    false,
                    first,
                    w,
                    e,
                )
            })?;
        } else {
            for (g, grad) in groups.iter().zip(&grads) {
                let (p, buf) = (&g[0], &reshaped(&g[2], &g[0].shape));
                let gg = self.temp(DType::F32, &p.shape)?;
                self.add(grad, p, wd, &gg, false)?;
                if mom == 0.0 {
                    // No momentum: d = g, the buffer untouched.
                    self.inplace_add(p, &gg, -lr)?;
                    continue;
                }
                if first {
                    self.copy(&gg, buf)?;
                } else {
                    self.muls(&buf.clone(), mom, buf)?;
                    self.inplace_add(buf, &gg, 1.0 - damp)?;
                }
                if nesterov {
                    self.inplace_add(&gg, buf, mom)?;
                    self.inplace_add(p, &gg, -lr)?;
                } else {
                    self.inplace_add(p, buf, -lr)?;
                }
            }
        }
        if copy {
            for g in &groups {
                self.cast(&g[0], &reshaped(&g[3], &g[0].shape))?;
            }
        }
        Ok(())
    }

    /// True when the SoC's table composes what the fused operators do (the 910).
    fn force_composed(&self) -> bool {
        crate::ops::soc::classify(&self.cann.soc) == crate::ops::soc::Class::Training910
    }

    fn adamw(&mut self, call: &OpCall) -> Result<()> {
        let (OptimizerStep::AdamW(o), copy) = call.optimizer_step()? else {
            return Err(HalError::Internal(format!("{} is not AdamW", call.op)));
        };
        let (lr, b1, b2, eps, wd) = (o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
        let step = o.step as f64;
        let width = 4 + copy as usize;
        let groups: Vec<Vec<TensorView>> = call
            .tensors
            .chunks(width)
            .filter(|g| g[0].numel() > 0)
            .map(|c| c.to_vec())
            .collect();
        // Composed on every chip: aclnnApplyAdamWV2 takes beta2 as a float, and 1 - beta2 of
        // 0.999f is 1.3e-5 away (relative) from 1 - 0.999, beyond the HAL's AdamW; here each
        // coefficient is computed in f64 and rounded once.
        for g in &groups {
            // Every tensor of a group is dense with the parameter's element count: seen with
            // its shape, so the elementwise operators need no broadcast.
            let (p, m, v) = (
                &g[0],
                &reshaped(&g[2], &g[0].shape),
                &reshaped(&g[3], &g[0].shape),
            );
            let grad = self.as_f32(&reshaped(&g[1], &p.shape))?;
            // p *= 1 - lr·wd; m = b1·m + (1-b1)·g; v = b2·v + (1-b2)·g²;
            // p -= lr/(1-b1^t) · m / (sqrt(v/(1-b2^t)) + eps).
            self.muls(&p.clone(), 1.0 - lr * wd, p)?;
            self.muls(&m.clone(), b1, m)?;
            self.inplace_add(m, &grad, 1.0 - b1)?;
            let g2 = self.temp(DType::F32, &p.shape)?;
            self.binary(OpId::Mul, &grad, &grad, &g2)?;
            self.muls(&v.clone(), b2, v)?;
            self.inplace_add(v, &g2, 1.0 - b2)?;
            let den = self.temp(DType::F32, &p.shape)?;
            self.muls(v, 1.0 / (1.0 - b2.powf(step)), &den)?;
            self.unary(OpId::Sqrt, &den.clone(), &den)?;
            self.scalar_op(OpId::AddScalar, &den.clone(), f(eps), &den)?;
            let upd = self.temp(DType::F32, &p.shape)?;
            self.binary(OpId::Div, m, &den, &upd)?;
            self.inplace_add(p, &upd, -lr / (1.0 - b1.powf(step)))?;
            if copy {
                self.cast(p, &reshaped(&g[4], &p.shape))?;
            }
        }
        Ok(())
    }

    fn clip_grad_norm(&mut self, call: &OpCall) -> Result<()> {
        let total = &call.tensors[0];
        let given: Vec<TensorView> = call.tensors[1..]
            .iter()
            .filter(|g| g.numel() > 0)
            .cloned()
            .collect();
        // f16/bf16 gradients through f32 copies (the norm accumulates in f32, and the scaled
        // value is rounded once, as the HAL says), written back at the end.
        let half = given.first().is_some_and(|g| g.dtype != DType::F32);
        let grads: Vec<TensorView> = if half {
            given
                .iter()
                .map(|g| self.as_f32(g))
                .collect::<Result<_>>()?
        } else {
            given.clone()
        };
        let grads = &grads[..];
        let max_norm = call.max_norm()?;
        if grads.is_empty() {
            return self.fill(total, f(0.0));
        }
        let k = grads.len() as u64;
        let norms: Vec<TensorView> = (0..k)
            .map(|_| self.temp(DType::F32, &[1]))
            .collect::<Result<_>>()?;
        {
            let mut d = Descs::new(self.cann);
            let (gl, p, nl) = (d.list(grads), d.scalar(f(2.0), DType::F32), d.list(&norms));
            let op = self.cann.aclnn.foreach_norm;
            // SAFETY: see `unary`.
            self.call(op, "ForeachNorm", d, |f, w, e| unsafe {
                f(gl, p, nl, w, e)
            })?;
        }
        let stacked = self.temp(DType::F32, &[k, 1])?;
        {
            let mut d = Descs::new(self.cann);
            let (nl, sd) = (d.list(&norms), d.tensor(&stacked));
            let op = self.cann.aclnn.stack;
            // SAFETY: see `unary`.
            self.call(op, "Stack", d, |f, w, e| unsafe { f(nl, 0, sd, w, e) })?;
        }
        let tot = reshaped(total, &[]);
        {
            let mut d = Descs::new(self.cann);
            let (sd, ord, dims, td) = (
                d.tensor(&stacked),
                d.scalar(f(2.0), DType::F32),
                d.ints(&[0, 1]),
                d.tensor(&tot),
            );
            let dt = acl_dtype(DType::F32);
            let op = self.cann.aclnn.linalg_vector_norm;
            // SAFETY: see `unary`.
            self.call(op, "LinalgVectorNorm", d, |f, w, e| unsafe {
                f(sd, ord, dims, false, dt, td, w, e)
            })?;
        }
        // coef = min(1, max_norm / (total + 1e-6)), then every gradient times coef.
        let t1 = self.temp(DType::F32, &[1])?;
        self.scalar_op(OpId::AddScalar, total, f(1e-6), &t1)?;
        let t2 = self.temp(DType::F32, &[1])?;
        self.unary(OpId::ClipGradNorm, &t1, &t2)?; // Reciprocal
        self.muls(&t2.clone(), max_norm, &t2)?;
        let coef = self.temp(DType::F32, &[1])?;
        self.scalar_op(OpId::MinimumScalar, &t2, f(1.0), &coef)?;
        let mut d = Descs::new(self.cann);
        let (gl, cd, ol) = (d.list(grads), d.tensor(&coef), d.list(grads));
        let op = self.cann.aclnn.foreach_mul_scalar;
        // SAFETY: see `unary` (out = x: in place, as torch_npu calls it).
        self.call(op, "ForeachMulScalar", d, |f, w, e| unsafe {
            f(gl, cd, ol, w, e)
        })?;
        if half {
            for (g32, g) in grads.iter().zip(&given) {
                self.cast(g32, g)?;
            }
        }
        Ok(())
    }
}

/// A call whose output has no elements: nothing to compute, except the weight gradients of
/// the norms' backward over no rows, which are zeros.
pub fn empty(ex: &mut Exec, call: &OpCall) -> Result<()> {
    let t = &call.tensors;
    match call.op {
        OpId::LayerNormBackward => {
            ex.fill(&t[6], f(0.0))?;
            ex.fill(&t[7], f(0.0))
        }
        OpId::RmsNormBackward => ex.fill(&t[5], f(0.0)),
        // No query row (S, B or Hq is 0): keys and values that exist get no gradient.
        OpId::AttentionBackward => {
            for g in [&t[8], &t[9]] {
                if g.numel() > 0 {
                    ex.fill(g, f(0.0))?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Runs `call` (validated; `out_shape` its output shape) as aclnn operators.
pub fn run(ex: &mut Exec, call: &OpCall, _out_shape: &[u64]) -> Result<()> {
    use unihal_hal::OpClass::*;
    match call.op.class() {
        c if c.is_elementwise() => elementwise(ex, call),
        Reduce | Softmax | SoftmaxMasked | SoftmaxBackward | CrossEntropy
        | CrossEntropyBackward | LayerNorm | LayerNormBackward | RmsNorm | RmsNormBackward => {
            rows(ex, call)
        }
        Attention => ex.attention(call),
        AttentionBackward => ex.attention_backward(call),
        Rope => ex.rope(call),
        AddLayerNorm | AddRmsNorm => ex.add_norm(call),
        _ => training(ex, call),
    }
}

/// The elementwise ops (fill, copy, cast, unary and binary math, where, random, dropout) as aclnn operators.
fn elementwise(ex: &mut Exec, call: &OpCall) -> Result<()> {
    let t = &call.tensors;
    let op = call.op;
    match call.op {
        OpId::Fill => ex.fill(&t[0], call.scalars[0]),
        OpId::Copy => ex.copy(&t[0], &t[1]),
        OpId::Cast => ex.cast(&t[0], &t[1]),
        OpId::Neg
        | OpId::Abs
        | OpId::Exp
        | OpId::Log
        | OpId::Sqrt
        | OpId::Rsqrt
        | OpId::Tanh
        | OpId::Sigmoid
        | OpId::Relu
        | OpId::Silu => ex.unary(op, &t[0], &t[1]),
        OpId::GeluTanh | OpId::GeluErf => {
            let approx = (op == OpId::GeluTanh) as i64;
            let mut d = Descs::new(ex.cann);
            let (x, y) = (d.tensor(&t[0]), d.tensor(&t[1]));
            let f_ = ex.cann.aclnn.gelu_v2;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "GeluV2", d, |f, w, e| unsafe { f(x, approx, y, w, e) })
        }
        OpId::ReluBackward => {
            let mut d = Descs::new(ex.cann);
            let (x, dy, dx) = (d.tensor(&t[0]), d.tensor(&t[1]), d.tensor(&t[2]));
            let th = d.scalar(f(0.0), t[0].dtype);
            let f_ = ex.cann.aclnn.threshold_backward;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "ThresholdBackward", d, |f, w, e| unsafe {
                f(dy, x, th, dx, w, e)
            })
        }
        OpId::GeluTanhBackward | OpId::GeluErfBackward => {
            let mut d = Descs::new(ex.cann);
            let (x, dy, dx) = (d.tensor(&t[0]), d.tensor(&t[1]), d.tensor(&t[2]));
            let mode = d.string(if op == OpId::GeluTanhBackward {
                "tanh"
            } else {
                "none"
            });
            let f_ = ex.cann.aclnn.gelu_backward_v2;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "GeluBackwardV2", d, |f, w, e| unsafe {
                f(dy, x, mode, dx, w, e)
            })
        }
        OpId::SiluBackward => {
            let mut d = Descs::new(ex.cann);
            let (x, dy, dx) = (d.tensor(&t[0]), d.tensor(&t[1]), d.tensor(&t[2]));
            let f_ = ex.cann.aclnn.silu_backward;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "SiluBackward", d, |f, w, e| unsafe {
                f(dy, x, dx, w, e)
            })
        }
        OpId::Add => ex.add(&t[0], &t[1], 1.0, &t[2], false),
        OpId::Sub => ex.add(&t[0], &t[1], 1.0, &t[2], true),
        OpId::Mul | OpId::Div | OpId::Maximum | OpId::Minimum | OpId::Pow => {
            ex.binary(op, &t[0], &t[1], &t[2])
        }
        OpId::AddScalar
        | OpId::SubScalar
        | OpId::MulScalar
        | OpId::DivScalar
        | OpId::MaximumScalar
        | OpId::MinimumScalar
        | OpId::PowScalar => ex.scalar_op(op, &t[0], call.scalars[0], &t[1]),
        OpId::Axpy => ex.inplace_add(&t[1], &t[0], sc(call, 0)),
        OpId::Where => {
            let mut d = Descs::new(ex.cann);
            let (c, a, b, o) = (
                d.tensor(&t[0]),
                d.tensor(&t[1]),
                d.tensor(&t[2]),
                d.tensor(&t[3]),
            );
            let f_ = ex.cann.aclnn.s_where;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "SWhere", d, |f, w, e| unsafe { f(c, a, b, o, w, e) })
        }
        OpId::RandomUniform => {
            let rng = call.rng.unwrap_or(RngState { seed: 0, offset: 0 });
            let (lo, hi) = (sc(call, 0), sc(call, 1));
            let mut d = Descs::new(ex.cann);
            let o = d.tensor(&t[0]);
            let f_ = ex.cann.aclnn.inplace_uniform;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "InplaceUniform", d, |f, w, e| unsafe {
                f(o, lo, hi, rng.seed, rng.offset, w, e)
            })
        }
        OpId::RandomNormal => {
            let rng = call.rng.unwrap_or(RngState { seed: 0, offset: 0 });
            let (mean, std) = (sc(call, 0) as f32, sc(call, 1) as f32);
            let mut d = Descs::new(ex.cann);
            let o = d.tensor(&t[0]);
            let f_ = ex.cann.aclnn.inplace_normal;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "InplaceNormal", d, |f, w, e| unsafe {
                f(o, mean, std, rng.seed as i64, rng.offset as i64, w, e)
            })
        }
        OpId::DropoutForward => ex.dropout(call),
        OpId::DropoutBackward => ex.dropout_backward(call),
        other => Err(HalError::unsupported(format!(
            "op {other} has no aclnn mapping"
        ))),
    }
}

/// The row ops (reductions, softmax, cross-entropy, layer and RMS norms) as aclnn operators.
fn rows(ex: &mut Exec, call: &OpCall) -> Result<()> {
    let t = &call.tensors;
    let op = call.op;
    match call.op {
        OpId::ReduceSum | OpId::ReduceMean | OpId::ReduceMax | OpId::ReduceMin => {
            let ax = axis(call.reduce_axis()?, t[0].shape.len());
            let mut d = Descs::new(ex.cann);
            let (x, dims, o) = (d.tensor(&t[0]), d.ints(&[ax]), d.tensor(&t[1]));
            let dt = acl_dtype(t[1].dtype);
            let a = &ex.cann.aclnn;
            match op {
                OpId::ReduceSum => {
                    // SAFETY: see `Exec::unary`.
                    ex.call(a.reduce_sum, "ReduceSum", d, |f, w, e| unsafe {
                        f(x, dims, true, dt, o, w, e)
                    })
                }
                OpId::ReduceMean => {
                    // SAFETY: see `Exec::unary`.
                    ex.call(a.mean, "Mean", d, |f, w, e| unsafe {
                        f(x, dims, true, dt, o, w, e)
                    })
                }
                OpId::ReduceMax => {
                    // SAFETY: see `Exec::unary`.
                    ex.call(a.amax, "Amax", d, |f, w, e| unsafe {
                        f(x, dims, true, o, w, e)
                    })
                }
                _ => {
                    // SAFETY: see `Exec::unary`.
                    ex.call(a.amin, "Amin", d, |f, w, e| unsafe {
                        f(x, dims, true, o, w, e)
                    })
                }
            }
        }
        OpId::Argmax | OpId::Argmin => {
            let ax = axis(call.reduce_axis()?, t[0].shape.len());
            let mut d = Descs::new(ex.cann);
            let (x, o) = (d.tensor(&t[0]), d.tensor(&t[1]));
            let (f_, name) = if op == OpId::Argmax {
                (ex.cann.aclnn.arg_max, "ArgMax")
            } else {
                (ex.cann.aclnn.arg_min, "ArgMin")
            };
            // SAFETY: see `Exec::unary`.
            ex.call(f_, name, d, |f, w, e| unsafe { f(x, ax, true, o, w, e) })
        }
        OpId::Softmax | OpId::LogSoftmax => {
            let dim = t[0].shape.len() as i64 - 1;
            ex.softmax(op == OpId::LogSoftmax, &t[0], dim, &t[1])
        }
        OpId::SoftmaxMasked | OpId::LogSoftmaxMasked => {
            // x + mask, then the softmax; f16 and bf16 in f32 (the HAL's accumulation type),
            // so the sum is not rounded before the softmax reads it.
            let dim = t[0].shape.len() as i64 - 1;
            let log = op == OpId::LogSoftmaxMasked;
            if matches!(t[0].dtype, DType::F16 | DType::Bf16) {
                let (x, m) = (ex.as_f32(&t[0])?, ex.as_f32(&t[1])?);
                let sum = ex.temp(DType::F32, &t[0].shape)?;
                ex.add(&x, &m, 1.0, &sum, false)?;
                let y = ex.temp(DType::F32, &t[0].shape)?;
                ex.softmax(log, &sum, dim, &y)?;
                ex.cast(&y, &t[2])
            } else {
                let sum = ex.temp(t[0].dtype, &t[0].shape)?;
                ex.add(&t[0], &t[1], 1.0, &sum, false)?;
                ex.softmax(log, &sum, dim, &t[2])
            }
        }
        OpId::SoftmaxBackward | OpId::LogSoftmaxBackward => {
            let dim = t[0].shape.len() as i64 - 1;
            let mut d = Descs::new(ex.cann);
            let (y, dy, dx) = (d.tensor(&t[0]), d.tensor(&t[1]), d.tensor(&t[2]));
            let (f_, name) = if op == OpId::SoftmaxBackward {
                (ex.cann.aclnn.softmax_backward, "SoftmaxBackward")
            } else {
                (ex.cann.aclnn.log_softmax_backward, "LogSoftmaxBackward")
            };
            // SAFETY: see `Exec::unary`.
            ex.call(f_, name, d, |f, w, e| unsafe { f(dy, y, dim, dx, w, e) })
        }
        OpId::CrossEntropy => ex.cross_entropy(call),
        OpId::CrossEntropyBackward => ex.cross_entropy_backward(call),
        OpId::LayerNorm => {
            let eps = call.norm_eps()?;
            let dlast = *t[0].shape.last().unwrap_or(&1) as i64;
            let mut d = Descs::new(ex.cann);
            let (x, ns, w, b, y) = (
                d.tensor(&t[0]),
                d.ints(&[dlast]),
                d.tensor(&t[1]),
                d.tensor(&t[2]),
                d.tensor(&t[3]),
            );
            let (m, r) = (d.tensor(&keepdim(&t[4])), d.tensor(&keepdim(&t[5])));
            let f_ = ex.cann.aclnn.layer_norm;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "LayerNorm", d, |f, ws, e| unsafe {
                f(x, ns, w, b, eps, y, m, r, ws, e)
            })
        }
        OpId::LayerNormBackward => {
            let dlast = *t[0].shape.last().unwrap_or(&1) as i64;
            let mut d = Descs::new(ex.cann);
            let (x, dy, w) = (d.tensor(&t[0]), d.tensor(&t[1]), d.tensor(&t[2]));
            let (m, r) = (d.tensor(&keepdim(&t[3])), d.tensor(&keepdim(&t[4])));
            let (dx, dw, db) = (d.tensor(&t[5]), d.tensor(&t[6]), d.tensor(&t[7]));
            let (ns, mask) = (d.ints(&[dlast]), d.bools(&[true, true, true]));
            let null: D = std::ptr::null_mut();
            let f_ = ex.cann.aclnn.layer_norm_backward;
            // SAFETY: see `Exec::unary` (bias NULL: optional).
            ex.call(f_, "LayerNormBackward", d, |f, ws, e| unsafe {
                f(dy, x, ns, m, r, w, null, mask, dx, dw, db, ws, e)
            })
        }
        OpId::RmsNorm => {
            let eps = call.norm_eps()?;
            let mut d = Descs::new(ex.cann);
            let (x, w, y, r) = (
                d.tensor(&t[0]),
                d.tensor(&t[1]),
                d.tensor(&t[2]),
                d.tensor(&keepdim(&t[3])),
            );
            let f_ = ex.cann.aclnn.rms_norm;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "RmsNorm", d, |f, ws, e| unsafe {
                f(x, w, eps, y, r, ws, e)
            })
        }
        OpId::RmsNormBackward => {
            // dgamma is f32 in aclnn: through a temporary when the weight is not.
            let dw32 = if t[5].dtype == DType::F32 {
                t[5].clone()
            } else {
                ex.temp(DType::F32, &t[5].shape)?
            };
            {
                let mut d = Descs::new(ex.cann);
                let (x, dy, w, r) = (
                    d.tensor(&t[0]),
                    d.tensor(&t[1]),
                    d.tensor(&t[2]),
                    d.tensor(&keepdim(&t[3])),
                );
                let (dx, dw) = (d.tensor(&t[4]), d.tensor(&dw32));
                let f_ = ex.cann.aclnn.rms_norm_grad;
                // SAFETY: see `Exec::unary`.
                ex.call(f_, "RmsNormGrad", d, |f, ws, e| unsafe {
                    f(dy, x, r, w, dx, dw, ws, e)
                })?;
            }
            if t[5].dtype != DType::F32 {
                ex.cast(&dw32, &t[5])?;
            }
            Ok(())
        }
        other => Err(HalError::unsupported(format!(
            "op {other} has no aclnn mapping"
        ))),
    }
}

/// Matmul, gather and scatter, the optimizers, AMP and gradient clipping as aclnn operators.
fn training(ex: &mut Exec, call: &OpCall) -> Result<()> {
    let t = &call.tensors;
    match call.op {
        OpId::Matmul => ex.matmul(call),
        OpId::IndexSelect => {
            let mut d = Descs::new(ex.cann);
            let (tb, ix, o) = (d.tensor(&t[0]), d.tensor(&t[1]), d.tensor(&t[2]));
            let f_ = ex.cann.aclnn.index_select;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "IndexSelect", d, |f, w, e| unsafe {
                f(tb, 0, ix, o, w, e)
            })
        }
        OpId::IndexAdd => {
            let (src, index, out) = (&t[0], &t[1], &t[2]);
            let mut d = Descs::new(ex.cann);
            let (o, ix, s, al, o2) = (
                d.tensor(out),
                d.tensor(index),
                d.tensor(src),
                d.scalar(f(1.0), out.dtype),
                d.tensor(out),
            );
            let f_ = ex.cann.aclnn.index_add;
            // SAFETY: see `Exec::unary` (out = self: in place, as torch_npu calls it).
            ex.call(f_, "IndexAdd", d, |f, w, e| unsafe {
                f(o, 0, ix, s, al, o2, w, e)
            })
        }
        OpId::SgdMomentum => ex.sgd(call),
        OpId::AdamW => ex.adamw(call),
        OpId::AmpUnscale => {
            let grads: Vec<TensorView> = t[2..].iter().filter(|g| g.numel() > 0).cloned().collect();
            if grads.is_empty() {
                return Ok(());
            }
            let mut d = Descs::new(ex.cann);
            let (gl, fi, inv) = (d.list(&grads), d.tensor(&t[0]), d.tensor(&t[1]));
            let f_ = ex.cann.aclnn.foreach_non_finite_check_and_unscale;
            // SAFETY: see `Exec::unary`.
            ex.call(f_, "ForeachNonFiniteCheckAndUnscale", d, |f, w, e| unsafe {
                f(gl, fi, inv, w, e)
            })
        }
        OpId::AmpUpdateScale => {
            let u = call.amp_scale_update()?;
            let (g, b, n) = (u.growth_factor, u.backoff_factor, u.growth_interval);
            let mut d = Descs::new(ex.cann);
            let (s, tr, fi) = (d.tensor(&t[0]), d.tensor(&t[1]), d.tensor(&t[2]));
            let (s2, tr2) = (d.tensor(&t[0]), d.tensor(&t[1]));
            let f_ = ex.cann.aclnn.amp_update_scale;
            // SAFETY: see `Exec::unary` (outputs = inputs: in place).
            ex.call(f_, "AmpUpdateScale", d, |f, w, e| unsafe {
                f(s, tr, fi, g, b, n, s2, tr2, w, e)
            })
        }
        OpId::ClipGradNorm => ex.clip_grad_norm(call),
        other => Err(HalError::unsupported(format!(
            "op {other} has no aclnn mapping"
        ))),
    }
}
