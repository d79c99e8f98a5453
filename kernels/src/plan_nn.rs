//! Plans for the training ops (`unihal_hal::op::nn`): row kernels (reductions, softmax,
//! cross-entropy, norms, gather), column kernels (norm weight gradients, scatter-add), the tiled
//! GEMM and the multi-tensor kernels. Calls arrive validated; each plan is one or more launches,
//! with scratch memory where an op reduces across rows (cross-entropy mean/sum, gradient norms).

use crate::args::{UhArgs, MT_GROUPS};
use crate::plan::{iterate, launch_shape, Launch, Plan};
use unihal_hal::op::nn::axis_of;
use unihal_hal::{
    DType, HalError, LaunchConfig, MandatoryCaps, OpCall, OpClass, OpId, OptimizerStep, Result,
    TensorView,
};

/// Threads of a GPU block for row kernels: a power of two, at most 256 (`UH_ROW_THREADS`).
fn row_threads(caps: &MandatoryCaps) -> u32 {
    let max = caps.max_threads_per_block.clamp(1, 256);
    1 << (31 - max.leading_zeros())
}

/// Launch shape of a row kernel over `rows` rows of `len` elements: a block per row (grid-stride)
/// on GPUs; on host devices chunks of rows sized for the pool.
pub(crate) fn rows_shape(rows: u64, len: u64, caps: &MandatoryCaps) -> LaunchConfig {
    if caps.warp_size <= 1 {
        let work = rows.saturating_mul(len.max(1));
        let blocks = work
            .div_ceil(1 << 15)
            .clamp(1, caps.compute_units.max(1) as u64 * 4)
            .min(rows.max(1));
        LaunchConfig::linear(blocks as u32, 1)
    } else {
        let blocks = rows
            .clamp(1, caps.compute_units.max(1) as u64 * 32)
            .min(caps.max_grid[0] as u64);
        LaunchConfig::linear(blocks as u32, row_threads(caps))
    }
}

/// One block of `row_threads` (a single-block reduction kernel).
fn one_block(caps: &MandatoryCaps) -> LaunchConfig {
    LaunchConfig::linear(
        1,
        if caps.warp_size <= 1 {
            1
        } else {
            row_threads(caps)
        },
    )
}

/// Launch shape of a column kernel over `cols` columns (chunks of 64 on host devices).
fn cols_shape(cols: u64, caps: &MandatoryCaps) -> LaunchConfig {
    if caps.warp_size <= 1 {
        let blocks = cols
            .div_ceil(64)
            .clamp(1, caps.compute_units.max(1) as u64 * 4);
        LaunchConfig::linear(blocks as u32, 1)
    } else {
        launch_shape(cols, caps)
    }
}

pub(crate) fn addr(t: &TensorView) -> u64 {
    t.buffer.device_addr() + t.offset
}

/// The kernel name that stands for `op` in `d` in the capabilities (the library has it exactly
/// when it runs the op in that dtype).
pub fn support_kernel(op: OpId, d: DType) -> String {
    let n = d.name();
    match op.class() {
        OpClass::CrossEntropy | OpClass::CrossEntropyBackward => {
            format!("uh_{}_{n}_i64", op.name())
        }
        OpClass::IndexSelect | OpClass::IndexAdd => format!("uh_{}_{n}_i64", op.name()),
        OpClass::Optimizer => format!("uh_{}_{n}_none", op.name()),
        OpClass::AmpUpdateScale if d == DType::F32 => "uh_amp_update_scale".into(),
        OpClass::ClipGradNorm => format!("uh_clip_scale_{n}"),
        OpClass::AttentionBackward => format!("uh_attention_backward_dq_{n}"),
        _ => format!("uh_{}_{n}", op.name()),
    }
}

fn need(kernel: String) -> Result<String> {
    if crate::has_kernel(&kernel) {
        Ok(kernel)
    } else {
        Err(HalError::unsupported(format!("no kernel {kernel}")))
    }
}

/// Row iteration over `rows` (the shape of the rows) with per-operand row strides.
pub(crate) fn rows_args(rows: &[u64], strides: &[Vec<i64>], len: u64) -> Result<UhArgs> {
    let mut a = UhArgs::default();
    iterate(&mut a, rows, strides)?;
    a.len = len as i64;
    Ok(a)
}

/// Leading strides of `t` (all dims but the last `keep`), broadcast to `target` (numpy rules).
/// `t` must have been validated to broadcast.
pub fn lead_strides(t: &TensorView, keep: usize, target: &[u64]) -> Vec<i64> {
    let nd = t.shape.len() - keep;
    let lead = TensorView {
        shape: t.shape[..nd].to_vec(),
        strides: t.strides[..nd].to_vec(),
        ..t.clone()
    };
    lead.broadcast_strides(target).expect("validated")
}

/// Plans a validated non-elementwise call.
pub(crate) fn plan(call: &OpCall, caps: &MandatoryCaps, _out: &[u64]) -> Result<Plan> {
    let cx = Cx {
        call,
        caps,
        t: &call.tensors,
        d: call.tensors[0].dtype.name(),
    };
    let mut plan = Plan::default();
    match call.op.class() {
        OpClass::Reduce => plan_reduce(&cx, &mut plan)?,
        OpClass::Softmax | OpClass::SoftmaxMasked | OpClass::SoftmaxBackward => {
            plan_softmax(&cx, &mut plan)?
        }
        OpClass::CrossEntropy | OpClass::CrossEntropyBackward => {
            plan_cross_entropy(&cx, &mut plan)?
        }
        OpClass::LayerNorm
        | OpClass::RmsNorm
        | OpClass::LayerNormBackward
        | OpClass::RmsNormBackward
        | OpClass::AddLayerNorm
        | OpClass::AddRmsNorm => plan_layer_norm(&cx, &mut plan)?,
        OpClass::Attention => crate::plan_attention::plan_attention(&cx, &mut plan)?,
        OpClass::AttentionBackward => {
            crate::plan_attention::plan_attention_backward(&cx, &mut plan)?
        }
        OpClass::Rope => crate::plan_attention::plan_rope(&cx, &mut plan)?,
        OpClass::Matmul => plan_matmul(&cx, &mut plan)?,
        OpClass::IndexSelect | OpClass::IndexAdd => plan_index_select(&cx, &mut plan)?,
        OpClass::Optimizer | OpClass::AmpUnscale => plan_optimizer(&cx, &mut plan)?,
        OpClass::AmpUpdateScale => plan_amp_update_scale(&cx, &mut plan)?,
        OpClass::ClipGradNorm => plan_clip_grad_norm(&cx, &mut plan)?,
        c => unreachable!("class {c:?} is elementwise"),
    }
    Ok(plan)
}

/// What each class's plan reads of a validated call.
pub(crate) struct Cx<'a> {
    pub(crate) call: &'a OpCall,
    pub(crate) caps: &'a MandatoryCaps,
    pub(crate) t: &'a [TensorView],
    /// The first tensor's dtype name (kernel names carry it).
    pub(crate) d: &'static str,
}

impl Cx<'_> {
    /// One launch of library kernel `kernel`.
    pub(crate) fn one(&self, kernel: String, config: LaunchConfig, args: UhArgs) -> Result<Launch> {
        Ok(Launch::new(need(kernel)?, config, args, self.call))
    }
}

/// The plan of Reduce.
fn plan_reduce(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t, d) = (cx.call, cx.caps, cx.t, cx.d);
    let ax = axis_of(call.reduce_axis()?, t[0].shape.len())?;
    let drop = |v: &[i64]| [&v[..ax], &v[ax + 1..]].concat();
    let rows: Vec<u64> = [&t[0].shape[..ax], &t[0].shape[ax + 1..]].concat();
    let len = t[0].shape[ax];
    let mut a = rows_args(&rows, &[drop(&t[0].strides), drop(&t[1].strides)], len)?;
    a.axis[0] = t[0].strides[ax];
    a.ptr[0] = addr(&t[0]);
    a.ptr[1] = addr(&t[1]);
    if a.n > 0 {
        let k = format!("uh_{}_{d}", call.op.name());
        plan.launches
            .push(cx.one(k, rows_shape(a.n as u64, len, caps), a)?);
    }
    Ok(())
}

/// The plan of Softmax, SoftmaxMasked, SoftmaxBackward.
fn plan_softmax(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t, d) = (cx.call, cx.caps, cx.t, cx.d);
    let x = &t[0];
    let nd = x.shape.len();
    let rows = &x.shape[..nd - 1];
    let len = x.shape[nd - 1];
    let full: Vec<Vec<i64>> = t
        .iter()
        .map(|v| v.broadcast_strides(&x.shape).expect("validated"))
        .collect();
    let lead: Vec<Vec<i64>> = full.iter().map(|s| s[..nd - 1].to_vec()).collect();
    let mut a = rows_args(rows, &lead, len)?;
    for (k, v) in t.iter().enumerate() {
        a.ptr[k] = addr(v);
        a.axis[k] = full[k][nd - 1];
    }
    if a.n > 0 && len > 0 {
        let k = format!("uh_{}_{d}", call.op.name());
        plan.launches
            .push(cx.one(k, rows_shape(a.n as u64, len, caps), a)?);
    }
    Ok(())
}

/// The plan of CrossEntropy, CrossEntropyBackward.
fn plan_cross_entropy(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t, d) = (cx.call, cx.caps, cx.t, cx.d);
    let (n, c) = (t[0].shape[0], t[0].shape[1]);
    let idx = t[1].dtype.name();
    let ce = call.ce_options()?;
    let red = ce.reduction as i64;
    let fwd = call.op == OpId::CrossEntropy;
    let loss = &t[2];
    let loss_stride = if red == 2 { loss.strides[0] } else { 0 };
    let mut strides = vec![
        vec![t[0].strides[0]],
        vec![t[1].strides[0]],
        vec![loss_stride],
    ];
    if !fwd {
        strides.push(vec![t[3].strides[0]]);
    }
    let mut a = rows_args(&[n], &strides, c)?;
    for (k, v) in t.iter().enumerate() {
        a.ptr[k] = addr(v);
    }
    a.axis[1] = t[1].strides[0];
    a.i = [red, ce.ignore_index, c as i64, n as i64];
    a.s[0] = ce.label_smoothing;
    let rows_cfg = rows_shape(n, c, caps);
    if fwd {
        let reduce = red != 2;
        let mut rows = cx.one(format!("uh_cross_entropy_{d}_{idx}"), rows_cfg, a)?;
        if reduce {
            // Scratch: per-row losses then per-row weights, f32.
            let half = (n * 4).next_multiple_of(256);
            plan.scratch_bytes = 2 * half;
            rows.args.ptr[3] = 0;
            rows.args.ptr[4] = half;
            rows.scratch_ptrs = vec![3, 4];
        }
        let mut fin = rows.clone();
        if n > 0 {
            plan.launches.push(rows);
        }
        if reduce {
            fin.kernel = need("uh_cross_entropy_reduce".into())?;
            fin.config = one_block(caps);
            plan.launches.push(fin);
        }
    } else {
        if n == 0 {
            return Ok(());
        }
        let mut rows = cx.one(format!("uh_cross_entropy_backward_{d}_{idx}"), rows_cfg, a)?;
        if red == 0 {
            plan.scratch_bytes = 256;
            rows.args.ptr[4] = 0;
            rows.scratch_ptrs = vec![4];
            let mut count = rows.clone();
            count.kernel = need(format!("uh_cross_entropy_count_{idx}"))?;
            count.config = one_block(caps);
            plan.launches.push(count);
        }
        plan.launches.push(rows);
    }
    Ok(())
}

/// The plan of LayerNorm, RmsNorm, AddLayerNorm, AddRmsNorm, LayerNormBackward, RmsNormBackward.
fn plan_layer_norm(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t, d) = (cx.call, cx.caps, cx.t, cx.d);
    let x = &t[0];
    let nd = x.shape.len();
    let rows = &x.shape[..nd - 1];
    let len = x.shape[nd - 1];
    // Row strides: tensors like x use their leading strides, [D] vectors 0, statistics
    // (shaped like the rows) their own.
    let vecs: &[usize] = match call.op.class() {
        OpClass::LayerNorm => &[1, 2],
        OpClass::RmsNorm => &[1],
        OpClass::AddLayerNorm => &[2, 3],
        OpClass::AddRmsNorm => &[2],
        OpClass::LayerNormBackward => &[2, 6, 7],
        _ => &[2, 5],
    };
    let strides: Vec<Vec<i64>> = t
        .iter()
        .enumerate()
        .map(|(k, v)| {
            if vecs.contains(&k) {
                vec![0; nd - 1]
            } else {
                v.strides[..nd - 1].to_vec()
            }
        })
        .collect();
    let mut a = rows_args(rows, &strides, len)?;
    for (k, v) in t.iter().enumerate() {
        a.ptr[k] = addr(v);
    }
    let forward = matches!(
        call.op.class(),
        OpClass::LayerNorm | OpClass::RmsNorm | OpClass::AddLayerNorm | OpClass::AddRmsNorm
    );
    if forward {
        a.s[0] = call.norm_eps()?;
    }
    let name = call.op.name();
    let nrows = a.n as u64;
    match call.op.class() {
        _ if forward => {
            if nrows > 0 && len > 0 {
                plan.launches.push(cx.one(
                    format!("uh_{name}_{d}"),
                    rows_shape(nrows, len, caps),
                    a,
                )?);
            }
        }
        _ => {
            let base = name.trim_end_matches("_backward");
            if nrows > 0 && len > 0 {
                let k = format!("uh_{base}_backward_{d}");
                plan.launches
                    .push(cx.one(k, rows_shape(nrows, len, caps), a)?);
            }
            if len > 0 {
                let k = format!("uh_{base}_backward_weight_{d}");
                plan.launches.push(cx.one(k, cols_shape(len, caps), a)?);
            }
        }
    }
    Ok(())
}

/// The plan of Matmul.
fn plan_matmul(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t, d) = (cx.call, cx.caps, cx.t, cx.d);
    let (ta, tb, tc) = (&t[0], &t[1], &t[2]);
    let (na, nb, nc) = (ta.shape.len(), tb.shape.len(), tc.shape.len());
    let (m, k, n) = (tc.shape[nc - 2], ta.shape[na - 1], tc.shape[nc - 1]);
    let batch = &tc.shape[..nc - 2];
    let strides = vec![
        lead_strides(ta, 2, batch),
        lead_strides(tb, 2, batch),
        tc.strides[..nc - 2].to_vec(),
    ];
    let mut a = rows_args(batch, &strides, k)?;
    a.ptr = [addr(ta), addr(tb), addr(tc), 0, 0, 0, 0, 0];
    a.i[0] = m as i64;
    a.i[1] = n as i64;
    a.axis[..6].copy_from_slice(&[
        ta.strides[na - 2],
        ta.strides[na - 1],
        tb.strides[nb - 2],
        tb.strides[nb - 1],
        tc.strides[nc - 2],
        tc.strides[nc - 1],
    ]);
    (a.s[0], a.s[1]) = call.matmul_scales()?;
    if a.n > 0 && m > 0 && n > 0 {
        let tile = 64u64;
        let (gx, gy) = (n.div_ceil(tile), m.div_ceil(tile));
        let gz = (a.n as u64).min(caps.max_grid[2] as u64).min(65535);
        if gx > caps.max_grid[0] as u64 || gy > caps.max_grid[1] as u64 {
            return Err(HalError::unsupported(format!(
                "matmul of {m}x{n} outputs: more tiles than the device's grid"
            )));
        }
        let threads = if caps.warp_size <= 1 { 1 } else { 256 };
        let config = LaunchConfig {
            grid: unihal_hal::Dim3::new(gx as u32, gy as u32, gz as u32),
            block: unihal_hal::Dim3::new(threads, 1, 1),
            shared_mem_bytes: 0,
        };
        plan.launches
            .push(cx.one(format!("uh_matmul_{d}"), config, a)?);
    }
    Ok(())
}

/// The plan of IndexSelect, IndexAdd.
fn plan_index_select(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t, d) = (cx.call, cx.caps, cx.t, cx.d);
    let select = call.op == OpId::IndexSelect;
    let table = if select { &t[0] } else { &t[2] };
    let n = t[1].shape[0];
    let len: u64 = table.shape[1..].iter().product();
    let idx = t[1].dtype.name();
    let mut a = rows_args(
        &[n],
        &[vec![0], vec![t[1].strides[0]], vec![len as i64]],
        len,
    )?;
    a.ptr = [addr(&t[0]), addr(&t[1]), addr(&t[2]), 0, 0, 0, 0, 0];
    a.axis[1] = t[1].strides[0];
    a.i[0] = table.shape[0] as i64;
    a.i[1] = n as i64;
    if n > 0 && len > 0 {
        let k = format!("uh_{}_{d}_{idx}", call.op.name());
        let config = if select {
            rows_shape(n, len, caps)
        } else {
            cols_shape(len, caps)
        };
        plan.launches.push(cx.one(k, config, a)?);
    }
    Ok(())
}

/// The plan of Optimizer, AmpUnscale.
fn plan_optimizer(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t) = (cx.call, cx.caps, cx.t);
    let mut base = UhArgs::default();
    base.ptr[0] = addr(&t[0]);
    let (width, first, kernel) = if call.op.class() == OpClass::AmpUnscale {
        base.ptr[1] = addr(&t[1]);
        (1, 2, format!("uh_amp_unscale_{}", t[2].dtype.name()))
    } else {
        let (step, copy) = call.optimizer_step()?;
        let width = match step {
            OptimizerStep::AdamW(o) => {
                let n = o.step as f64;
                base.s[..5].copy_from_slice(&[o.lr, o.beta1, o.beta2, o.eps, o.weight_decay]);
                base.s[5] = o.lr / (1.0 - o.beta1.powf(n));
                base.s[6] = (1.0 - o.beta2.powf(n)).sqrt();
                4
            }
            OptimizerStep::Sgd(o) => {
                base.s[..4].copy_from_slice(&[o.lr, o.momentum, o.dampening, o.weight_decay]);
                base.i[0] = o.nesterov as i64;
                base.i[1] = o.first_step as i64;
                3
            }
        } + copy as usize;
        let c = if copy {
            t[width - 1].dtype.name()
        } else {
            "none"
        };
        (
            width,
            0,
            format!("uh_{}_{}_{c}", call.op.name(), t[1].dtype.name()),
        )
    };
    for chunk in t[first..].chunks(width * MT_GROUPS) {
        let mut a = base;
        let mut total = 0u64;
        for (g, group) in chunk.chunks(width).enumerate() {
            for (k, v) in group.iter().enumerate() {
                a.mt_ptr[g][k] = addr(v);
            }
            a.mt_len[g] = group[0].numel() as i64;
            total += group[0].numel();
        }
        a.mt_count = (chunk.len() / width) as i64;
        if total > 0 {
            plan.launches
                .push(cx.one(kernel.clone(), launch_shape(total, caps), a)?);
        }
    }
    Ok(())
}

/// The plan of AmpUpdateScale.
fn plan_amp_update_scale(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, t) = (cx.call, cx.t);
    let mut a = UhArgs::default();
    a.ptr[..3].copy_from_slice(&[addr(&t[0]), addr(&t[1]), addr(&t[2])]);
    let u = call.amp_scale_update()?;
    (a.s[0], a.s[1], a.i[0]) = (u.growth_factor, u.backoff_factor, u.growth_interval);
    plan.launches
        .push(cx.one("uh_amp_update_scale".into(), LaunchConfig::linear(1, 1), a)?);
    Ok(())
}

/// The plan of ClipGradNorm.
fn plan_clip_grad_norm(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t) = (cx.call, cx.caps, cx.t);
    let grads = &t[1..];
    let g = t[1].dtype.name();
    plan.scratch_bytes = (grads.len() as u64 * 4).next_multiple_of(256);
    let mut base = UhArgs::default();
    base.ptr[0] = addr(&t[0]);
    base.s[0] = call.max_norm()?;
    let mut scale = Vec::new();
    for (c, chunk) in grads.chunks(MT_GROUPS).enumerate() {
        let mut a = base;
        let mut total = 0u64;
        for (k, v) in chunk.iter().enumerate() {
            a.mt_ptr[k][0] = addr(v);
            a.mt_len[k] = v.numel() as i64;
            total += v.numel();
        }
        a.mt_count = chunk.len() as i64;
        a.i[0] = (c * MT_GROUPS) as i64;
        let cfg = LaunchConfig::linear(chunk.len() as u32, one_block(caps).block.x);
        let mut sq = cx.one(format!("uh_clip_sumsq_{g}"), cfg, a)?;
        sq.scratch_ptrs = vec![1];
        plan.launches.push(sq);
        if total > 0 {
            scale.push(cx.one(format!("uh_clip_scale_{g}"), launch_shape(total, caps), a)?);
        }
    }
    let mut a = base;
    a.i[0] = grads.len() as i64;
    let mut fin = cx.one("uh_clip_total".into(), one_block(caps), a)?;
    fin.scratch_ptrs = vec![1];
    plan.launches.push(fin);
    plan.launches.extend(scale);
    Ok(())
}
