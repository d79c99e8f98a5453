//! Optimisers and mixed precision (op map A.4 "Optimiser and AMP"): `aclnnFusedSgd`,
//! `aclnnApplyAdamWV2` (its step read from the device when the stream runs it),
//! `aclnnForeachNonFiniteCheckAndUnscale` and `aclnnAmpUpdateScale`, through the kernel
//! library's multi-tensor kernels (f32 parameters and state, as unihal's optimisers keep them;
//! other dtypes, `maximize`, `amsgrad` and a gradient scale are not simulated and refused).

use super::host::read;
use super::{invalid, run_plan, Args, Build};
use crate::aclnn_op;
use crate::conv::Err;
use crate::nnopbase::{Tensor, TensorList};
use std::sync::Arc;
use unihal_hal::op::nn::{AdamWOptions, ParamGroup, SgdOptions};
use unihal_hal::{DType, OpCall};

fn f32_only(a: &Args, ts: &[&Tensor]) -> Result<(), Err> {
    for t in ts {
        if a.dtype(t)? != DType::F32 {
            return Err(invalid("only FLOAT32 parameters and state are simulated"));
        }
    }
    Ok(())
}

// Declared from: ON `optim/fused_sgd/op_api/aclnn_fused_sgd.h`; OP `FusedSgdKernelOpApi.cpp`
aclnn_op!(aclnnFusedSgd, aclnnFusedSgdGetWorkspaceSize, "FusedSgd",
(params: *const TensorList, grads: *const TensorList, momentum_buffers: *const TensorList,
 grad_scale: *const Tensor, weight_decay: f32, momentum: f32, lr: f32, dampening: f32, nesterov: bool,
 maximize: bool, is_first_step: bool) |a| {
    let p = a.list(params, "paramsRef")?;
    let g = a.list(grads, "gradsRef")?;
    let m = if momentum_buffers.is_null() { None } else { Some(a.list(momentum_buffers, "momentumBufferListOptionalRef")?) };
    if !grad_scale.is_null() || maximize {
        return Err(invalid("gradScale and maximize are not simulated"));
    }
    if p.len() != g.len() || m.as_ref().is_some_and(|m| m.len() != p.len()) {
        return Err(invalid("the lists have different lengths"));
    }
    let all: Vec<&Tensor> = p.iter().chain(&g).chain(m.iter().flatten()).collect();
    f32_only(a, &all)?;
    let o = SgdOptions {
        lr: lr as f64,
        momentum: momentum as f64,
        dampening: dampening as f64,
        weight_decay: weight_decay as f64,
        nesterov,
        first_step: is_first_step,
    };
    Ok(Arc::new(move |b: &mut Build| {
        let mut groups = Vec::new();
        for (k, (pt, gt)) in p.iter().zip(&g).enumerate() {
            let pv = b.view(pt)?;
            let state = match &m {
                Some(m) => b.view(&m[k])?,
                None => b.temp(DType::F32, &pv.shape),
            };
            groups.push(ParamGroup { param: pv, grad: b.view(gt)?, state: vec![state], copy: None });
        }
        b.call(OpCall::sgd_momentum(&groups, o))
    }))
});

// Declared from: cross-check of product lists and signatures
aclnn_op!(aclnnApplyAdamWV2, aclnnApplyAdamWV2GetWorkspaceSize, "ApplyAdamWV2",
(var: *const Tensor, m: *const Tensor, v: *const Tensor, max_grad_norm: *const Tensor, grad: *const Tensor,
 step: *const Tensor, lr: f32, beta1: f32, beta2: f32, weight_decay: f32, eps: f32, amsgrad: bool,
 maximize: bool) |a| {
    let (p, mt, vt) = (a.tensor(var, "varRef")?, a.tensor(m, "mRef")?, a.tensor(v, "vRef")?);
    let g = a.tensor(grad, "grad")?;
    let st = a.tensor(step, "step")?;
    if !max_grad_norm.is_null() || amsgrad || maximize {
        return Err(invalid("amsgrad, maximize and maxGradNorm are not simulated"));
    }
    f32_only(a, &[&p, &mt, &vt, &g])?;
    let sdt = st.dt()?;
    if st.numel() != 1 || !matches!(sdt, DType::I64 | DType::F32) {
        return Err(invalid("step must be one INT64 or FLOAT32 element"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let group = ParamGroup {
            param: b.view(&p)?,
            grad: b.view(&g)?,
            state: vec![b.view(&mt)?, b.view(&vt)?],
            copy: None,
        };
        // Planned once here (checks the call), and again with the step the stream reads.
        let opts = move |step: u64| AdamWOptions {
            lr: lr as f64,
            beta1: beta1 as f64,
            beta2: beta2 as f64,
            eps: eps as f64,
            weight_decay: weight_decay as f64,
            step,
        };
        b.call(OpCall::adamw(std::slice::from_ref(&group), opts(1)))?;
        b.pop();
        let step_addr = st.data + st.offset as u64 * sdt.size() as u64;
        b.host(move || {
            // SAFETY: the step element of a live descriptor (checked at enqueue).
            let s = unsafe { read(step_addr, sdt) };
            let call = OpCall::adamw(std::slice::from_ref(&group), opts(s.max(1.0) as u64));
            let mut plan = unihal_kernels::plan::plan(&call, super::caps()).map_err(|e| e.to_string())?;
            run_plan(&mut plan).map_err(|e| e.to_string())
        });
        Ok(())
    }))
});

// Declared from: ON `foreach/foreach_non_finite_check_and_unscale/docs/…md`; OP `AmpForeachNonFiniteCheckAndUnscaleKernelNpuOpApi.cpp`; TN `NpuVariables.cpp`
aclnn_op!(aclnnForeachNonFiniteCheckAndUnscale, aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize,
"ForeachNonFiniteCheckAndUnscale",
(scaled_grads: *const TensorList, found_inf: *const Tensor, inv_scale: *const Tensor) |a| {
    let g = a.list(scaled_grads, "scaledGrads")?;
    let (fi, is) = (a.tensor(found_inf, "foundInf")?, a.tensor(inv_scale, "invScale")?);
    if g.len() > 256 {
        return Err(invalid("more than 256 tensors in one list"));
    }
    for t in &g {
        a.dtype(t)?;
    }
    if fi.dt()? != DType::F32 || is.dt()? != DType::F32 || fi.numel() != 1 || is.numel() != 1 {
        return Err(invalid("foundInf and invScale must be one FLOAT32 element each"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let grads = g.iter().map(|t| b.view(t)).collect::<Result<Vec<_>, _>>()?;
        b.call(OpCall::amp_unscale(b.view(&fi)?, b.view(&is)?, &grads))
    }))
});

// Declared from: OM `math/amp_update_scale/docs/aclnnAmpUpdateScale.md`
aclnn_op!(aclnnAmpUpdateScale, aclnnAmpUpdateScaleGetWorkspaceSize, "AmpUpdateScale",
(current_scale: *const Tensor, growth_tracker: *const Tensor, found_inf: *const Tensor, growth_factor: f64,
 backoff_factor: f64, growth_interval: i64, updated_scale: *const Tensor, updated_growth_tracker: *const Tensor) |a| {
    let (s, t, fi) = (a.tensor(current_scale, "currentScale")?, a.tensor(growth_tracker, "growthTracker")?, a.tensor(found_inf, "foundInf")?);
    let (us, ut) = (a.tensor(updated_scale, "updatedScale")?, a.tensor(updated_growth_tracker, "updatedGrowthTracker")?);
    a.dtype(&s)?;
    if t.dt()? != DType::I32 {
        return Err(invalid("growthTracker must be INT32"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (sv, tv, fv, usv, utv) = (b.view(&s)?, b.view(&t)?, b.view(&fi)?, b.view(&us)?, b.view(&ut)?);
        // The library updates in place: copy into the outputs first unless they alias.
        if usv.buffer.device_addr() + usv.offset != sv.buffer.device_addr() + sv.offset {
            b.call(OpCall::copy(sv, usv.clone()))?;
        }
        if utv.buffer.device_addr() + utv.offset != tv.buffer.device_addr() + tv.offset {
            b.call(OpCall::copy(tv, utv.clone()))?;
        }
        b.call(OpCall::amp_update_scale(usv, utv, fv, growth_factor, backoff_factor, growth_interval))
    }))
});
