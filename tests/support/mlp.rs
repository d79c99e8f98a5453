//! The MLP of `tests/all/mlp_training.rs` (and, on the Ascend backend, `tests/all/mlp_ascend.rs`),
//! shared with `benches/alloc.rs`, which replays its allocation trace: a two-layer MLP trained with
//! nothing but the op catalogue (on the CPU backend by default), on synthetic data from a fixed
//! random teacher network. Full-batch steps of forward (matmul, bias add, relu, cross-entropy),
//! backward (cross-entropy and relu gradients, transposed matmuls, column sums) and a fused AdamW
//! update.
//!
//! Two precisions: f32, and bf16 compute with f32 master weights (AdamW writes the bf16 copies),
//! dynamic loss scaling (scaled loss gradient, `amp_unscale`, `amp_update_scale`, skipped steps on
//! overflow) and global-norm gradient clipping.

use std::sync::Arc;
use unihal::alloc::{AllocatorConfig, CachingAllocator};
use unihal::{
    AdamWOptions, Backend, Buffer, CeOptions, DType, Device, OpCall, OpId, ParamGroup, RngState,
    Stream, TensorView,
};

const N: u64 = 256; // samples
const D: u64 = 16; // features
const H: u64 = 64; // student hidden units
const HT: u64 = 32; // teacher hidden units
const C: u64 = 4; // classes
/// Steps of a training run.
pub const STEPS: usize = 50;

struct Ctx {
    alloc: CachingAllocator,
    s: Arc<dyn Stream>,
    seed: u64,
}

impl Ctx {
    fn new(dev: Arc<dyn Device>) -> Ctx {
        let s = dev.create_stream().unwrap();
        let alloc = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
        alloc.record_history(true);
        Ctx { alloc, s, seed: 7 }
    }

    /// A zeroed tensor from the caching allocator, for work on the training stream.
    fn tensor(&self, d: DType, shape: &[u64]) -> TensorView {
        let n: u64 = shape.iter().product();
        let b: Buffer = self
            .alloc
            .alloc(&self.s, (n as usize * d.size()).max(1))
            .unwrap();
        let t = TensorView::contiguous(&b, d, shape);
        self.run(OpCall::fill(t.clone(), unihal::Scalar::F64(0.0)));
        t
    }

    fn normal(&mut self, d: DType, shape: &[u64], std: f64) -> TensorView {
        let t = self.tensor(d, shape);
        self.seed += 1;
        let rng = RngState {
            seed: self.seed,
            offset: 0,
        };
        self.run(OpCall::normal(t.clone(), 0.0, std, rng));
        t
    }

    fn run(&self, call: OpCall) {
        self.s
            .run_op(&call)
            .unwrap_or_else(|e| panic!("{}: {e}", call.op));
    }

    fn read_f32(&self, t: &TensorView) -> Vec<f32> {
        self.s.synchronize().unwrap();
        let mut out = vec![0u8; t.buffer.len() as usize];
        self.s.read(&t.buffer, 0, &mut out).unwrap();
        out.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn matmul(&self, a: &TensorView, b: &TensorView, c: &TensorView) {
        self.run(OpCall::matmul(a.clone(), b.clone(), c.clone(), 1.0, 0.0));
    }
}

/// The transpose of a 2-d view (a stride swap, no copy).
fn tr(t: &TensorView) -> TensorView {
    TensorView {
        shape: vec![t.shape[1], t.shape[0]],
        strides: vec![t.strides[1], t.strides[0]],
        ..t.clone()
    }
}

/// A 2-d view of a `[1, n]` column sum as the `[n]` bias it updates.
fn flat(t: &TensorView) -> TensorView {
    TensorView::contiguous(&t.buffer, t.dtype, &[t.numel()])
}

/// Trains for [`STEPS`] steps in `dt` and returns the loss of every step. Every buffer comes
/// from a caching allocator, as a framework's would: parameters, optimizer state and data once,
/// activations, gradients and scratch afresh in every step (dropped at its end, with the step's
/// work still queued). `on_step(step, allocator)` runs after each step; the allocator records
/// its history, so `take_history` there gives the step's allocation trace.
pub fn train(dt: DType, on_step: impl FnMut(usize, &CachingAllocator)) -> Vec<f32> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("2G"), Some("2")).unwrap();
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
    train_on(dev, dt, on_step)
}

/// Trains on `dev` (the CPU's when `None`) and checks the bars every backend must reach: the
/// loss falls below 5% of its first value, and after step 2 no step calls `Device::alloc`.
pub fn check(dt: DType, dev: Option<Arc<dyn Device>>) {
    let mut device_allocs = Vec::new();
    let record = |_: usize, a: &CachingAllocator| device_allocs.push(a.stats().num_device_alloc);
    let losses = match dev {
        Some(d) => train_on(d, dt, record),
        None => train(dt, record),
    };
    eprintln!("{dt}: Device::alloc calls after each step: {device_allocs:?}");
    assert!(
        device_allocs[2..].iter().all(|&n| n == device_allocs[1]),
        "{dt}: steps after the second called Device::alloc: {device_allocs:?}"
    );
    let (first, last) = (losses[0], *losses.last().unwrap());
    eprintln!(
        "{dt}: loss {first} -> {last} over {} steps: {losses:?}",
        losses.len()
    );
    assert!(first.is_finite() && first > 0.5, "{dt}: first loss {first}");
    assert!(
        last < 0.05 * first,
        "{dt}: loss fell from {first} to {last}, not below 5%: {losses:?}"
    );
}

/// [`train`] on `dev`, any backend's device (the same source on every backend).
pub fn train_on(
    dev: Arc<dyn Device>,
    dt: DType,
    mut on_step: impl FnMut(usize, &CachingAllocator),
) -> Vec<f32> {
    let mut g = Ctx::new(dev);
    let mixed = dt != DType::F32;
    // Teacher and data (f32): labels are the teacher's argmax.
    let x32 = g.normal(DType::F32, &[N, D], 1.0);
    let t1 = g.normal(DType::F32, &[D, HT], 1.0 / (D as f64).sqrt());
    let t2 = g.normal(DType::F32, &[HT, C], 1.0 / (HT as f64).sqrt());
    let th = g.tensor(DType::F32, &[N, HT]);
    let tl = g.tensor(DType::F32, &[N, C]);
    g.matmul(&x32, &t1, &th);
    g.run(OpCall::unary(OpId::Relu, th.clone(), th.clone()));
    g.matmul(&th, &t2, &tl);
    let labels = g.tensor(DType::I64, &[N, 1]);
    g.run(OpCall::reduce(OpId::Argmax, tl.clone(), labels.clone(), 1));
    let labels = flat(&labels);
    let x = if mixed {
        let x = g.tensor(dt, &[N, D]);
        g.run(OpCall::cast(x32.clone(), x.clone()));
        x
    } else {
        x32
    };
    // Student: f32 master weights; the compute copies are the masters themselves in f32 and the
    // optimizer's bf16 copies in mixed precision.
    let shapes: [&[u64]; 4] = [&[D, H], &[H], &[H, C], &[C]];
    let stds = [1.0 / (D as f64).sqrt(), 0.0, 1.0 / (H as f64).sqrt(), 0.0];
    let master: Vec<TensorView> = shapes
        .iter()
        .zip(stds)
        .map(|(s, std)| g.normal(DType::F32, s, std))
        .collect();
    let state: Vec<[TensorView; 2]> = shapes
        .iter()
        .map(|s| [g.tensor(DType::F32, s), g.tensor(DType::F32, s)])
        .collect();
    let compute: Vec<TensorView> = if mixed {
        master
            .iter()
            .map(|m| {
                let c = g.tensor(dt, &m.shape);
                g.run(OpCall::cast(m.clone(), c.clone()));
                c
            })
            .collect()
    } else {
        master.clone()
    };
    let (w1, b1, w2, b2) = (&compute[0], &compute[1], &compute[2], &compute[3]);
    // Loss scaling state (mixed precision).
    let scale = g.tensor(DType::F32, &[1]);
    let tracker = g.tensor(DType::I32, &[1]);
    g.run(OpCall::fill(scale.clone(), unihal::Scalar::F64(65536.0)));
    let one = g.tensor(DType::F32, &[1]);
    g.run(OpCall::fill(one.clone(), unihal::Scalar::F64(1.0)));
    let ce = CeOptions::default();
    let mut losses = Vec::new();
    let mut step = 0u64;
    for i in 0..STEPS {
        // This step's activations, gradients and scratch (freed when the step ends).
        let grads: Vec<TensorView> = [&[D, H][..], &[1, H], &[H, C], &[1, C]]
            .iter()
            .map(|s| g.tensor(dt, s))
            .collect();
        let pre = g.tensor(dt, &[N, H]);
        let h = g.tensor(dt, &[N, H]);
        let logits = g.tensor(dt, &[N, C]);
        let loss = g.tensor(DType::F32, &[]);
        let dloss = g.tensor(DType::F32, &[]);
        let dlogits = g.tensor(dt, &[N, C]);
        let dh = g.tensor(dt, &[N, H]);
        let dpre = g.tensor(dt, &[N, H]);
        let inv_scale = g.tensor(DType::F32, &[1]);
        let found_inf = g.tensor(DType::F32, &[1]);
        let total_norm = g.tensor(DType::F32, &[1]);
        // Forward.
        g.matmul(&x, w1, &pre);
        g.run(OpCall::binary(
            OpId::Add,
            pre.clone(),
            b1.clone(),
            pre.clone(),
        ));
        g.run(OpCall::unary(OpId::Relu, pre.clone(), h.clone()));
        g.matmul(&h, w2, &logits);
        g.run(OpCall::binary(
            OpId::Add,
            logits.clone(),
            b2.clone(),
            logits.clone(),
        ));
        g.run(OpCall::cross_entropy(
            logits.clone(),
            labels.clone(),
            loss.clone(),
            ce,
        ));
        // Backward, with the loss scaled in mixed precision.
        if mixed {
            g.run(OpCall::copy(
                scale.clone(),
                TensorView::contiguous(&dloss.buffer, DType::F32, &[1]),
            ));
        } else {
            g.run(OpCall::fill(dloss.clone(), unihal::Scalar::F64(1.0)));
        }
        g.run(OpCall::cross_entropy_backward(
            logits.clone(),
            labels.clone(),
            dloss.clone(),
            dlogits.clone(),
            ce,
        ));
        g.matmul(&tr(&h), &dlogits, &grads[2]);
        g.run(OpCall::reduce(
            OpId::ReduceSum,
            dlogits.clone(),
            grads[3].clone(),
            0,
        ));
        g.matmul(&dlogits, &tr(w2), &dh);
        g.run(OpCall::unary_backward(
            OpId::ReluBackward,
            pre.clone(),
            dh.clone(),
            dpre.clone(),
        ));
        g.matmul(&tr(&x), &dpre, &grads[0]);
        g.run(OpCall::reduce(
            OpId::ReduceSum,
            dpre.clone(),
            grads[1].clone(),
            0,
        ));
        if mixed {
            g.run(OpCall::fill(found_inf.clone(), unihal::Scalar::F64(0.0)));
            g.run(OpCall::binary(
                OpId::Div,
                one.clone(),
                scale.clone(),
                inv_scale.clone(),
            ));
            g.run(OpCall::amp_unscale(
                found_inf.clone(),
                inv_scale.clone(),
                &grads,
            ));
            g.run(OpCall::amp_update_scale(
                scale.clone(),
                tracker.clone(),
                found_inf.clone(),
                2.0,
                0.5,
                10,
            ));
        }
        g.run(OpCall::clip_grad_norm(total_norm.clone(), &grads, 5.0));
        losses.push(g.read_f32(&loss)[0]);
        if mixed && g.read_f32(&found_inf)[0] != 0.0 {
            on_step(i, &g.alloc);
            continue; // overflow: skip the step (the scale already backed off)
        }
        step += 1;
        let groups: Vec<ParamGroup> = (0..4)
            .map(|i| ParamGroup {
                param: master[i].clone(),
                grad: grads[i].clone(),
                state: state[i].to_vec(),
                copy: mixed.then(|| compute[i].clone()),
            })
            .collect();
        let o = AdamWOptions {
            lr: 0.03,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            step,
        };
        g.run(OpCall::adamw(&groups, o));
        on_step(i, &g.alloc);
    }
    losses
}

/// What [`trace_replay`] measured.
pub struct TraceReplay {
    pub steps: usize,
    pub events: usize,
    pub scale: u64,
    pub peak_requested: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// `num_device_alloc` after each step.
    pub device_allocs: Vec<u64>,
}

const GIB: u64 = 1 << 30;

impl TraceReplay {
    /// peak allocated / peak reserved.
    pub fn efficiency(&self) -> f64 {
        self.peak_allocated as f64 / self.peak_reserved as f64
    }

    /// Panics unless the peak allocation passed 1 GiB, the efficiency is at least 0.90 and no
    /// step after the second called `Device::alloc`.
    pub fn check(&self) {
        assert!(
            self.peak_allocated >= GIB,
            "peak allocation below 1 GiB: {self}"
        );
        assert!(
            self.efficiency() >= 0.90,
            "allocated/reserved below 0.90: {self}"
        );
        let d = &self.device_allocs;
        assert!(
            d[2..].iter().all(|&c| c == d[1]),
            "Device::alloc after step 2: {self}"
        );
    }
}

impl std::fmt::Display for TraceReplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = |b: u64| b as f64 / GIB as f64;
        write!(
            f,
            "{} events over {} steps, sizes x{}: peak requested {:.3} GiB, peak allocated {:.3} \
             GiB, peak reserved {:.3} GiB, allocated/reserved {:.3}; Device::alloc calls after \
             each step {:?}",
            self.events,
            self.steps,
            self.scale,
            g(self.peak_requested),
            g(self.peak_allocated),
            g(self.peak_reserved),
            self.efficiency(),
            self.device_allocs
        )
    }
}

/// Records the allocation trace of the first 10 steps of an f32 run, scales every size so the
/// peak of live requested bytes passes 1 GiB, and replays it on a fresh allocator configured by
/// `config` over a CPU device, step by step. The replay allocates without touching the memory,
/// so it is fast whatever the scale.
pub fn trace_replay(config: AllocatorConfig) -> TraceReplay {
    use std::collections::HashMap;
    use unihal::alloc::TraceEvent;
    const TRACE_STEPS: usize = 10;
    let mut steps: Vec<Vec<TraceEvent>> = Vec::new();
    train(DType::F32, |i, a| {
        if i < TRACE_STEPS {
            steps.push(a.take_history());
        }
    });
    let (mut live, mut peak, mut sizes) = (0u64, 0u64, HashMap::new());
    for e in steps.iter().flatten() {
        match *e {
            TraceEvent::Alloc { id, size, .. } => {
                sizes.insert(id, size);
                live += size;
                peak = peak.max(live);
            }
            TraceEvent::FreeRequested { id, .. } => live -= sizes[&id],
            _ => {}
        }
    }
    let scale = GIB.div_ceil(peak);
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("64G"), Some("1")).unwrap();
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
    let s = dev.create_stream().unwrap();
    let a = CachingAllocator::new(dev, config).unwrap();
    let mut held = HashMap::new();
    let mut device_allocs = Vec::new();
    for events in &steps {
        for e in events {
            match *e {
                TraceEvent::Alloc { id, size, .. } => {
                    held.insert(id, a.alloc(&s, (size * scale) as usize).unwrap());
                }
                TraceEvent::FreeRequested { id, .. } => {
                    held.remove(&id);
                }
                _ => {}
            }
        }
        device_allocs.push(a.stats().num_device_alloc);
    }
    let st = a.stats();
    TraceReplay {
        steps: steps.len(),
        // Hand-outs and frees (what the replay repeats; segment and completion entries aside).
        events: steps
            .iter()
            .flatten()
            .filter(|e| {
                matches!(
                    e,
                    TraceEvent::Alloc { .. } | TraceEvent::FreeRequested { .. }
                )
            })
            .count(),
        scale,
        peak_requested: peak * scale,
        peak_allocated: st.allocated_bytes.all.peak,
        peak_reserved: st.reserved_bytes.all.peak,
        device_allocs,
    }
}
