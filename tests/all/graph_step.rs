//! A data-parallel training step captured once and replayed, bit for bit equal to running it
//! eagerly: a two-layer MLP on 2 ranks, forward (matmul, bias, relu, cross-entropy), backward,
//! an in-place all-reduce of every gradient, and SGD whose learning rate lives in device memory
//! (`p -= g * lr`, so the host changes it between replays without capturing again).
//!
//! The backend is the CPU's, or the one `UNIHAL_GRAPH_BACKEND` names (CI runs the CUDA and HIP
//! backends on their simulated runtimes this way): a backend that names graphs unsupported in its
//! capabilities fails the test, since it was asked for explicitly.

use std::sync::Arc;
use std::time::Duration;
use unihal::{
    Backend, Buffer, CaptureMode, CeOptions, CommConfig, Communicator, DType, Device, OpCall, OpId,
    ReduceOp, RngState, Scalar, Stream, TensorView,
};

const N: u64 = 64; // samples per rank
const D: u64 = 16;
const H: u64 = 32;
const C: u64 = 4;
const STEPS: usize = 6;

/// One rank's model, data and every buffer of a step (allocated once: a graph replays fixed
/// addresses).
struct Rank {
    s: Arc<dyn Stream>,
    comm: Arc<dyn Communicator>,
    x: TensorView,
    labels: TensorView,
    params: [TensorView; 4],
    grads: [TensorView; 4],
    lr: TensorView,
    tmp: [TensorView; 4],
    pre: TensorView,
    h: TensorView,
    logits: TensorView,
    loss: TensorView,
    dloss: TensorView,
    dlogits: TensorView,
    dh: TensorView,
    dpre: TensorView,
}

fn tensor(dev: &Arc<dyn Device>, d: DType, shape: &[u64]) -> TensorView {
    let n: u64 = shape.iter().product();
    let b: Buffer = dev.alloc((n as usize * d.size()).max(1)).expect("alloc");
    TensorView::contiguous(&b, d, shape)
}

fn tr(t: &TensorView) -> TensorView {
    TensorView {
        shape: vec![t.shape[1], t.shape[0]],
        strides: vec![t.strides[1], t.strides[0]],
        ..t.clone()
    }
}

fn flat(t: &TensorView) -> TensorView {
    TensorView::contiguous(&t.buffer, t.dtype, &[t.numel()])
}

impl Rank {
    fn new(comm: Arc<dyn Communicator>) -> Rank {
        let dev = comm.device().clone();
        let s = dev.create_stream().expect("stream");
        let f = |shape: &[u64]| tensor(&dev, DType::F32, shape);
        let rank = comm.rank() as u64;
        let normal = |t: &TensorView, seed: u64, std: f64| {
            let rng = RngState { seed, offset: 0 };
            s.run_op(&OpCall::normal(t.clone(), 0.0, std, rng))
                .expect("normal");
        };
        // Data differs per rank; the teacher and the initial weights are the same on every rank.
        let x = f(&[N, D]);
        normal(&x, 100 + rank, 1.0);
        let teacher = f(&[D, C]);
        normal(&teacher, 7, 1.0);
        let tl = f(&[N, C]);
        s.run_op(&OpCall::matmul(x.clone(), teacher, tl.clone(), 1.0, 0.0))
            .expect("teacher");
        let labels = tensor(&dev, DType::I64, &[N, 1]);
        s.run_op(&OpCall::reduce(OpId::Argmax, tl, labels.clone(), 1))
            .expect("labels");
        let params = [f(&[D, H]), f(&[H]), f(&[H, C]), f(&[C])];
        for (i, (p, std)) in params.iter().zip([0.25, 0.1, 0.18, 0.1]).enumerate() {
            normal(p, 1 + i as u64, std);
        }
        let grads = [f(&[D, H]), f(&[1, H]), f(&[H, C]), f(&[1, C])];
        let tmp = [f(&[D, H]), f(&[H]), f(&[H, C]), f(&[C])];
        s.synchronize().expect("set-up");
        Rank {
            x,
            labels: flat(&labels),
            params,
            grads,
            lr: f(&[1]),
            tmp,
            pre: f(&[N, H]),
            h: f(&[N, H]),
            logits: f(&[N, C]),
            loss: f(&[]),
            dloss: f(&[]),
            dlogits: f(&[N, C]),
            dh: f(&[N, H]),
            dpre: f(&[N, H]),
            s,
            comm,
        }
    }

    fn run(&self, call: OpCall) -> unihal::Result<()> {
        self.s.run_op(&call)
    }

    /// Enqueues one training step (eagerly, or into a capture).
    fn step(&self) -> unihal::Result<()> {
        let [w1, b1, w2, b2] = &self.params;
        let ce = CeOptions::default();
        let mm = |a: &TensorView, b: &TensorView, c: &TensorView| {
            self.run(OpCall::matmul(a.clone(), b.clone(), c.clone(), 1.0, 0.0))
        };
        let add = |a: &TensorView, b: &TensorView| {
            self.run(OpCall::binary(OpId::Add, a.clone(), b.clone(), a.clone()))
        };
        mm(&self.x, w1, &self.pre)?;
        add(&self.pre, b1)?;
        self.run(OpCall::unary(OpId::Relu, self.pre.clone(), self.h.clone()))?;
        mm(&self.h, w2, &self.logits)?;
        add(&self.logits, b2)?;
        self.run(OpCall::cross_entropy(
            self.logits.clone(),
            self.labels.clone(),
            self.loss.clone(),
            ce,
        ))?;
        self.run(OpCall::fill(self.dloss.clone(), Scalar::F64(1.0)))?;
        self.run(OpCall::cross_entropy_backward(
            self.logits.clone(),
            self.labels.clone(),
            self.dloss.clone(),
            self.dlogits.clone(),
            ce,
        ))?;
        mm(&tr(&self.h), &self.dlogits, &self.grads[2])?;
        self.run(OpCall::reduce(
            OpId::ReduceSum,
            self.dlogits.clone(),
            self.grads[3].clone(),
            0,
        ))?;
        mm(&self.dlogits, &tr(w2), &self.dh)?;
        self.run(OpCall::unary_backward(
            OpId::ReluBackward,
            self.pre.clone(),
            self.dh.clone(),
            self.dpre.clone(),
        ))?;
        mm(&tr(&self.x), &self.dpre, &self.grads[0])?;
        self.run(OpCall::reduce(
            OpId::ReduceSum,
            self.dpre.clone(),
            self.grads[1].clone(),
            0,
        ))?;
        for g in &self.grads {
            let b = &g.buffer;
            self.comm
                .all_reduce(b, b, g.numel(), DType::F32, ReduceOp::Sum, &self.s)?;
        }
        // SGD with the learning rate read from device memory: p -= g * lr.
        for ((p, g), t) in self.params.iter().zip(&self.grads).zip(&self.tmp) {
            self.run(OpCall::binary(
                OpId::Mul,
                TensorView::contiguous(&g.buffer, DType::F32, &p.shape),
                self.lr.clone(),
                t.clone(),
            ))?;
            self.run(OpCall::binary(OpId::Sub, p.clone(), t.clone(), p.clone()))?;
        }
        Ok(())
    }

    /// Sets the learning rate of step `k` (outside any capture).
    fn set_lr(&self, k: usize) {
        let lr = 0.2f32 / (1.0 + k as f32) / self.comm.size() as f32;
        self.s
            .write(&self.lr.buffer, 0, &lr.to_le_bytes())
            .expect("lr");
    }

    /// The loss and every parameter's bytes after the stream's work.
    fn snapshot(&self) -> (Vec<u8>, Vec<Vec<u8>>) {
        let read = |b: &Buffer| {
            let mut out = vec![0u8; b.len() as usize];
            self.s.read(b, 0, &mut out).expect("read");
            out
        };
        (
            read(&self.loss.buffer),
            self.params.iter().map(|p| read(&p.buffer)).collect(),
        )
    }
}

fn backend() -> Arc<dyn Backend> {
    let name = std::env::var("UNIHAL_GRAPH_BACKEND").unwrap_or_else(|_| "cpu".into());
    unihal::registry()
        .get(&name)
        .unwrap_or_else(|e| panic!("backend {name}: {e}"))
}

#[test]
fn a_captured_data_parallel_step_replays_bit_identical_to_eager() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let devices: Vec<Arc<dyn Device>> = (0..2)
        .map(|i| {
            b.open(i)
                .unwrap_or_else(|e| panic!("{} device {i}: {e}", b.name()))
        })
        .collect();
    let g = &devices[0].capabilities().optional.graphs;
    assert!(
        g.available() && g.ops && g.collectives,
        "{} cannot capture ops and collectives: {:?}",
        b.name(),
        g
    );
    let ccl = b.collectives().expect("collectives");
    let config = CommConfig {
        timeout: Some(Duration::from_secs(60)),
    };
    let comms = ccl.init_all(&devices, &config).expect("communicators");
    let comms2 = ccl.init_all(&devices, &config).expect("communicators");
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(comms2)
            .map(|(c1, c2)| {
                sc.spawn(move || {
                    let eager = Rank::new(c1);
                    let mut want = Vec::new();
                    for k in 0..STEPS {
                        eager.set_lr(k);
                        eager.step().expect("eager step");
                        want.push(eager.snapshot());
                    }
                    let captured = Rank::new(c2);
                    captured
                        .s
                        .begin_capture(CaptureMode::ThreadLocal)
                        .expect("begin");
                    captured.step().expect("captured step");
                    let graph = captured.s.end_capture().expect("end");
                    let mut got = Vec::new();
                    for k in 0..STEPS {
                        captured.set_lr(k);
                        captured.s.launch_graph(&graph).expect("launch");
                        got.push(captured.snapshot());
                    }
                    (captured.comm.rank(), graph.node_count(), want, got)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    for (rank, nodes, want, got) in results {
        let loss = |s: &(Vec<u8>, Vec<Vec<u8>>)| f32::from_le_bytes(s.0[..4].try_into().unwrap());
        eprintln!(
            "{} rank {rank}: graph of {nodes} nodes; losses eager {:?}, replayed {:?}",
            b.name(),
            want.iter().map(loss).collect::<Vec<_>>(),
            got.iter().map(loss).collect::<Vec<_>>()
        );
        assert!(
            loss(&want[STEPS - 1]) < loss(&want[0]),
            "the loss did not fall"
        );
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            assert!(
                w == g,
                "rank {rank}, step {k}: the replayed step differs from the eager one"
            );
        }
    }
}
