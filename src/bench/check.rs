//! The values every rank's buffers must hold after a collective (nccl-tests' checks), and the
//! record each rank contributes to the "Using devices" lines.

use super::*;
use unihal_hal::Buffer;

pub(crate) struct Rank {
    pub(crate) comm: Arc<dyn Communicator>,
    pub(crate) stream: Arc<dyn Stream>,
    pub(crate) send: Buffer,
    pub(crate) recv: Buffer,
}

/// One element of `d` holding `v`.
pub(crate) fn element(d: DType, v: f64) -> Vec<u8> {
    unihal_hal::Scalar::F64(v).bits(d).to_le_bytes()[..d.size()].to_vec()
}

/// One element of integer dtype `d` holding `v` wrapped to its width (two's complement).
pub(crate) fn int_element(d: DType, v: i128) -> Vec<u8> {
    (v as u128).to_le_bytes()[..d.size()].to_vec()
}

/// `v` wrapped to integer dtype `d`'s width, as that dtype reads it.
pub(crate) fn wrap_int(d: DType, v: i128) -> i128 {
    let bits = 8 * d.size() as u32;
    let m = v & ((1i128 << bits) - 1);
    let signed = matches!(d, DType::I8 | DType::I16 | DType::I32 | DType::I64);
    if signed && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// One test: a dtype, a reduction and a root (nccl-tests' `TimeTest` arguments).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Test {
    pub(crate) dtype: DType,
    pub(crate) redop: ReduceOp,
    /// The printed reduction (`none` for collectives nccl-tests runs without one).
    pub(crate) redop_name: &'static str,
    pub(crate) root: usize,
    /// The printed root (-1 for collectives without one).
    pub(crate) root_printed: i64,
}

/// The element rank `r` holds at index `i` of its result, or `None` where nothing is defined,
/// when rank k's data is k+1 everywhere and the per-rank count is `c`.
pub(crate) fn expected(
    op: CollectiveOp,
    t: &Test,
    n: usize,
    r: usize,
    i: u64,
    c: u64,
) -> Option<Vec<u8>> {
    let d = t.dtype;
    let reduced = || {
        if d.is_integer() {
            let sum: i128 = (1..=n as i128).sum();
            let v = match t.redop {
                ReduceOp::Sum => sum,
                ReduceOp::Prod => (1..=n as i128).fold(1i128, |a, k| wrap_int(d, a * k)),
                ReduceOp::Min => 1,
                ReduceOp::Max => n as i128,
                // The wrapping sum, then truncated toward zero (the HAL's definition of avg).
                ReduceOp::Avg => wrap_int(d, sum) / n as i128,
            };
            int_element(d, v)
        } else {
            let all: Vec<f64> = (1..=n).map(|k| k as f64).collect();
            let v = match t.redop {
                ReduceOp::Sum => all.iter().sum::<f64>(),
                ReduceOp::Prod => all.iter().product(),
                ReduceOp::Min => 1.0,
                ReduceOp::Max => n as f64,
                ReduceOp::Avg => all.iter().sum::<f64>() / n as f64,
            };
            element(d, v)
        }
    };
    let value = |v: usize| element(d, v as f64);
    Some(match op {
        CollectiveOp::AllReduce | CollectiveOp::ReduceScatter => reduced(),
        CollectiveOp::Reduce if r == t.root => reduced(),
        CollectiveOp::Reduce => return None,
        CollectiveOp::Broadcast => value(t.root + 1),
        CollectiveOp::AllGather | CollectiveOp::AllToAll => value((i / c) as usize + 1),
        CollectiveOp::SendRecv => value((r + n - 1) % n + 1),
    })
}

/// A column of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    OutOfPlace,
    InPlace,
}

/// A rank's record in the "Using devices" list.
#[derive(Debug, Clone)]
pub(crate) struct RankInfo {
    pub(crate) rank: usize,
    pub(crate) pid: u32,
    pub(crate) host: String,
    pub(crate) device: usize,
    pub(crate) device_id: String,
    pub(crate) name: String,
}

impl RankInfo {
    /// nccl-tests' line (`util.cu`'s `writeDeviceReport`), with the device's id in place of
    /// the PCI bus id.
    pub(crate) fn line(&self) -> String {
        format!(
            "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device {:2} [{}] {}",
            self.rank, 0, self.pid, self.host, self.device, self.device_id, self.name
        )
    }

    /// The fixed-size record of this rank that an all_gather carries to rank 0.
    pub(crate) fn record(&self) -> [u8; RECORD] {
        let text = format!(
            "{}\t{}\t{}\t{}\t{}",
            self.pid, self.host, self.device, self.device_id, self.name
        );
        let mut rec = [0u8; RECORD];
        let b = text.as_bytes();
        let len = b.len().min(RECORD - 1);
        rec[..len].copy_from_slice(&b[..len]);
        rec
    }

    /// The record of rank `rank` as [`RankInfo::record`] wrote it.
    pub(crate) fn from_record(rank: usize, rec: &[u8]) -> RankInfo {
        let end = rec.iter().position(|&b| b == 0).unwrap_or(rec.len());
        let text = String::from_utf8_lossy(&rec[..end]);
        let mut f = text.splitn(5, '\t');
        let mut next = || f.next().unwrap_or("").to_string();
        RankInfo {
            rank,
            pid: next().parse().unwrap_or(0),
            host: next(),
            device: next().parse().unwrap_or(0),
            device_id: next(),
            name: next(),
        }
    }
}
