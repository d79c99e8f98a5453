//! The workload the fault sweeps share.

use std::sync::Arc;
use std::time::Duration;
use unihal_hal::ccl::{CommConfig, Communicator, ReduceOp};
use unihal_hal::op::{OpCall, OpId, TensorView};
use unihal_hal::{Backend, DType, Device, EventFlags, FillValue, HalError, Result, Stream};

/// Rows, inner and output sizes of the step's layer.
const M: u64 = 8;
const K: u64 = 16;
const N: u64 = 4;

/// One data-parallel training step of a linear layer with a relu on devices 0 and 1 of
/// `backend` (the workload of the fault sweeps): per device, on its own thread, `X` and `W`
/// written to the device, `H = relu(X W)`, `G = Xᵀ H`, `G` all-reduced over both devices,
/// `W -= G / 2`, an event recorded on the compute stream that a second stream waits for before
/// it reads `W` back. Small integers, so every backend gives the same bytes. A device without
/// the ops (no kernel compiler) does the same data movement with fills and copies; a backend
/// without collectives skips the all-reduce. A rank whose step fails aborts the communicator.
///
/// # Errors
/// Whatever the backend returns: a rank's own failure before the timeouts and aborts it caused
/// on the others.
pub fn training_step(backend: &Arc<dyn Backend>) -> Result<Vec<u8>> {
    let devices = [backend.open(0)?, backend.open(1)?];
    let comms = match backend.collectives() {
        Some(c) => Some(c.init_all(
            &devices,
            &CommConfig {
                timeout: Some(Duration::from_secs(3)),
            },
        )?),
        None => None,
    };
    let results: Vec<Result<Vec<u8>>> = std::thread::scope(|sc| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, dev)| {
                let comm = comms.as_ref().map(|c| c[rank].clone());
                sc.spawn(move || {
                    let r = step_on(rank, dev, comm.clone());
                    // As a framework does on a failed step: abort the communicator, so that the
                    // other ranks end at once instead of at the timeout.
                    if let (Err(_), Some(c)) = (&r, &comm) {
                        c.abort();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(HalError::Internal("a rank panicked".into())))
            })
            .collect()
    });
    // The root cause first: a rank's own failure, not another rank's timeout or abort it
    // caused. A failure on a communicator's own thread (its watchdog's query) is that
    // communicator's asynchronous error, so those count too, as a framework would read them.
    if results.iter().any(Result::is_err) {
        let async_errors: Vec<HalError> = comms
            .iter()
            .flatten()
            .filter_map(|c| c.async_error())
            .collect();
        let errors = results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .chain(&async_errors);
        if let Some(e) = HalError::root_cause(errors) {
            return Err(e.clone());
        }
    }
    let mut out = Vec::new();
    for r in results {
        out.extend(r?);
    }
    Ok(out)
}

fn f32_bytes(v: impl Iterator<Item = f32>) -> Vec<u8> {
    v.flat_map(f32::to_le_bytes).collect()
}

fn step_on(
    rank: usize,
    dev: &Arc<dyn Device>,
    comm: Option<Arc<dyn Communicator>>,
) -> Result<Vec<u8>> {
    let s: Arc<dyn Stream> = dev.create_stream()?;
    let s2: Arc<dyn Stream> = dev.create_stream()?;
    let sz = |n: u64| (n * 4) as usize;
    let x_host = f32_bytes((0..M * K).map(|i| ((i * 7 + rank as u64 * 3) % 5) as f32 - 2.0));
    let w_host = f32_bytes((0..K * N).map(|i| ((i * 3 + 1) % 5) as f32 - 2.0));
    let x = dev.alloc(sz(M * K))?;
    let w = dev.alloc(sz(K * N))?;
    let h = dev.alloc(sz(M * N))?;
    let g = dev.alloc(sz(K * N))?;
    s.write(&x, 0, &x_host)?;
    s.write(&w, 0, &w_host)?;
    s.fill(&h, 0, h.len(), FillValue::U32(0))?;
    let caps = dev.capabilities();
    let has = |op: OpId| {
        caps.optional
            .ops
            .get(&op)
            .is_some_and(|d| d.contains(&DType::F32))
    };
    let tx = TensorView::contiguous(&x, DType::F32, &[M, K]);
    let tw = TensorView::contiguous(&w, DType::F32, &[K, N]);
    let th = TensorView::contiguous(&h, DType::F32, &[M, N]);
    let tg = TensorView::contiguous(&g, DType::F32, &[K, N]);
    let ops = [OpId::Matmul, OpId::Relu, OpId::Mul, OpId::Sub]
        .into_iter()
        .all(has);
    if ops {
        s.run_op(&OpCall::matmul(
            tx.clone(),
            tw.clone(),
            th.clone(),
            1.0,
            0.0,
        ))?;
        s.run_op(&OpCall::unary(OpId::Relu, th.clone(), th.clone()))?;
        let xt = TensorView {
            shape: vec![K, M],
            strides: vec![tx.strides[1], tx.strides[0]],
            ..tx.clone()
        };
        s.run_op(&OpCall::matmul(xt, th, tg.clone(), 1.0, 0.0))?;
    } else {
        s.fill(&g, 0, g.len(), FillValue::U32(0x3f80_0000))?;
        s.copy_d2d(&x, 0, &h, 0, h.len())?;
    }
    if let Some(c) = &comm {
        c.all_reduce(&g, &g, K * N, DType::F32, ReduceOp::Sum, &s)?;
    }
    if ops {
        let half = dev.alloc(sz(K * N))?;
        s.fill(&half, 0, half.len(), FillValue::U32(0x3f00_0000))?;
        let thalf = TensorView::contiguous(&half, DType::F32, &[K, N]);
        s.run_op(&OpCall::binary(OpId::Mul, tg.clone(), thalf, tg.clone()))?;
        s.run_op(&OpCall::binary(OpId::Sub, tw.clone(), tg, tw))?;
    } else {
        s.copy_d2d(&g, 0, &w, 0, w.len())?;
    }
    let done = dev.create_event(EventFlags::default())?;
    s.record_event(&done)?;
    s2.wait_event(&done)?;
    let mut out = vec![0u8; sz(K * N + M * N)];
    let (wo, ho) = out.split_at_mut(sz(K * N));
    s2.read(&w, 0, wo)?;
    s2.read(&h, 0, ho)?;
    s2.synchronize()?;
    s.synchronize()?;
    Ok(out)
}
