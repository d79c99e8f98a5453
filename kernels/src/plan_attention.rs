//! Plans for the transformer-block ops (`unihal_hal::op::transformer`): fused attention forward
//! (one launch), backward (three launches sharing a per-row scratch of `(lse, D)` pairs) and the
//! rotary embeddings (a row kernel). The kernels are `device/uh_attention.h`; the argument layout
//! is documented there.

use crate::args::UhArgs;
use crate::plan::{launch_shape, Launch, Plan};
use crate::plan_nn::{addr, lead_strides, rows_args, rows_shape, Cx};
use unihal_hal::op::nn::acc_dtype;
use unihal_hal::{LaunchConfig, MandatoryCaps, Result, TensorView};

/// Query rows per work item and keys per block: `UH_ATT_QT`/`UH_ATT_KB` of the header, for host
/// devices and for GPUs.
const HOST_TILE: (u64, u64) = (64, 64);
const GPU_TILE: (u64, u64) = (1, 4);

fn tile(caps: &MandatoryCaps) -> (u64, u64) {
    if caps.warp_size <= 1 {
        HOST_TILE
    } else {
        GPU_TILE
    }
}

/// Launch shape of `items` independent work items: on host devices up to four blocks per compute
/// unit that take items round-robin, on GPUs a thread per item.
fn items_shape(items: u64, caps: &MandatoryCaps) -> LaunchConfig {
    if caps.warp_size <= 1 {
        let blocks = items.clamp(1, caps.compute_units.max(1) as u64 * 4);
        LaunchConfig::linear(blocks as u32, 1)
    } else {
        launch_shape(items, caps)
    }
}

/// The (batch, head, row) strides of a 4-d `(B, H, S, D)` view, or of a 3-d `(B, H, S)` one.
fn bhs(t: &TensorView) -> [i64; 3] {
    [t.strides[0], t.strides[1], t.strides[2]]
}

/// The arguments every attention kernel shares: geometry, options, and the q/k/v/bias slots.
fn common(cx: &Cx) -> Result<UhArgs> {
    let (call, t) = (cx.call, cx.t);
    let (q, k) = (&t[0], &t[1]);
    let (o, has_bias) = call.attention_options()?;
    let mut a = UhArgs::default();
    let (b, hq, s, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hkv, sk) = (k.shape[1], k.shape[2]);
    a.size[..5].copy_from_slice(&[b as i64, hq as i64, s as i64, sk as i64, hkv as i64]);
    a.len = d as i64;
    a.n = (b * hq * s) as i64;
    a.s[0] = o.scale;
    a.s[1] = o.dropout_p;
    a.i[0] = has_bias as i64;
    a.i[1] = o.causal as i64;
    if let Some(rng) = o.rng {
        a.u = [rng.seed, rng.offset];
    }
    for (k, v) in t.iter().enumerate().take(3) {
        a.ptr[k] = addr(v);
        a.stride[k][..3].copy_from_slice(&bhs(v));
    }
    if has_bias {
        let full = [b, hq, s, sk];
        let bs = t[3].broadcast_strides(&full).expect("validated");
        a.ptr[3] = addr(&t[3]);
        a.stride[3][..4].copy_from_slice(&bs);
    }
    Ok(a)
}

/// The plan of Attention: `[q, k, v, bias, out, lse]`.
pub(crate) fn plan_attention(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let t = cx.t;
    let mut a = common(cx)?;
    for k in [4, 5] {
        a.ptr[k] = addr(&t[k]);
        a.stride[k][..3].copy_from_slice(&bhs(&t[k]));
    }
    let (qt, _) = tile(cx.caps);
    let (b, hq, s) = (t[0].shape[0], t[0].shape[1], t[0].shape[2]);
    let items = b * hq * s.div_ceil(qt);
    if items > 0 {
        let k = format!("uh_attention_{}", cx.d);
        plan.launches
            .push(cx.one(k, items_shape(items, cx.caps), a)?);
    }
    Ok(())
}

/// The plan of AttentionBackward: `[q, k, v, bias, out, dout, lse, dq, dk, dv]`.
pub(crate) fn plan_attention_backward(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (t, caps, d) = (cx.t, cx.caps, cx.d);
    let (b, hq, s) = (t[0].shape[0], t[0].shape[1], t[0].shape[2]);
    let (hkv, sk) = (t[1].shape[1], t[1].shape[2]);
    let rows = b * hq * s;
    let (qt, kb) = tile(caps);
    let acc = acc_dtype(t[0].dtype).size() as u64;
    let base = common(cx)?;
    if rows > 0 {
        plan.scratch_bytes = (2 * rows * acc).next_multiple_of(256);
        // Step 1: [out, dout, lse, stats].
        let mut a = base;
        for (slot, k) in [(0, 4), (1, 5), (2, 6)] {
            a.ptr[slot] = addr(&t[k]);
            a.stride[slot] = [0; 8];
            a.stride[slot][..3].copy_from_slice(&bhs(&t[k]));
        }
        a.ptr[3] = 0;
        a.stride[3] = [0; 8];
        let mut delta = cx.one(
            format!("uh_attention_backward_delta_{d}"),
            launch_shape(rows, caps),
            a,
        )?;
        delta.scratch_ptrs = vec![3];
        plan.launches.push(delta);
    }
    // Steps 2 and 3: [q, k, v, bias, dout, stats, dq | dk, dv].
    let mut a = base;
    a.ptr[4] = addr(&t[5]);
    a.stride[4][..3].copy_from_slice(&bhs(&t[5]));
    let with = |mut a: UhArgs, outs: &[usize]| {
        for (slot, &k) in (6..).zip(outs) {
            a.ptr[slot] = addr(&t[k]);
            a.stride[slot][..3].copy_from_slice(&bhs(&t[k]));
        }
        a
    };
    let dq_items = b * hq * s.div_ceil(qt);
    if dq_items > 0 {
        let mut l: Launch = cx.one(
            format!("uh_attention_backward_dq_{d}"),
            items_shape(dq_items, caps),
            with(a, &[7]),
        )?;
        l.scratch_ptrs = vec![5];
        plan.launches.push(l);
    }
    let dkv_items = b * hkv * sk.div_ceil(kb);
    if dkv_items > 0 {
        a.ptr[5] = 0;
        let mut l = cx.one(
            format!("uh_attention_backward_dkv_{d}"),
            items_shape(dkv_items, caps),
            with(a, &[8, 9]),
        )?;
        // With no query rows the kernel reads no statistics (and there is no scratch).
        if rows > 0 {
            l.scratch_ptrs = vec![5];
        }
        plan.launches.push(l);
    }
    Ok(())
}

/// The plan of Rope and RopeBackward: `[x, cos, sin, y]` as rows of the last dim.
pub(crate) fn plan_rope(cx: &Cx, plan: &mut Plan) -> Result<()> {
    let (call, caps, t, d) = (cx.call, cx.caps, cx.t, cx.d);
    let x = &t[0];
    let nd = x.shape.len();
    let rows = &x.shape[..nd - 1];
    let len = x.shape[nd - 1];
    let strides = vec![
        x.strides[..nd - 1].to_vec(),
        lead_strides(&t[1], 1, rows),
        lead_strides(&t[2], 1, rows),
        t[3].strides[..nd - 1].to_vec(),
    ];
    let mut a = rows_args(rows, &strides, len)?;
    for (k, v) in t.iter().enumerate() {
        a.ptr[k] = addr(v);
    }
    a.i[0] = call.rope_interleaved()? as i64;
    if a.n > 0 && len > 0 {
        let k = format!("uh_{}_{d}", call.op.name());
        plan.launches
            .push(cx.one(k, rows_shape(a.n as u64, len, caps), a)?);
    }
    Ok(())
}
