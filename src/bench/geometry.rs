//! Counts and bandwidths of one size, as nccl-tests' `*GetCollByteCount` and `*GetBw` define them.

use unihal_hal::CollectiveOp;

/// nccl-tests' bus bandwidth factor.
pub fn busbw_factor(op: CollectiveOp, n: usize) -> f64 {
    let n = n as f64;
    match op {
        CollectiveOp::AllReduce => 2.0 * (n - 1.0) / n,
        CollectiveOp::AllGather | CollectiveOp::ReduceScatter | CollectiveOp::AllToAll => {
            (n - 1.0) / n
        }
        CollectiveOp::Broadcast | CollectiveOp::Reduce | CollectiveOp::SendRecv => 1.0,
    }
}

/// The median of `v` (the upper middle for an even length), the statistic every benchmark here
/// reports. Panics on an empty `v`.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Counts of one size, in elements, as nccl-tests' `*GetCollByteCount` defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// The count the collective is called with (per rank for all_gather, reduce_scatter and
    /// alltoall; nccl-tests' `count` column).
    pub count: u64,
    /// Elements each rank sends.
    pub send: u64,
    /// Elements each rank receives.
    pub recv: u64,
    /// In place, a rank's send data starts this many elements times its rank into the
    /// receive buffer.
    pub send_inplace: u64,
    /// In place, a rank's received data starts this many elements times its rank into the
    /// receive buffer.
    pub recv_inplace: u64,
}

impl Geometry {
    /// The counts of collective `op` for a size of `size` bytes of `esz`-byte elements over `n`
    /// ranks (`all_gather.cu`'s `AllGatherGetCollByteCount` and its siblings: the per-rank
    /// count of all_gather, reduce_scatter and alltoall is `size / esz / n` rounded down to a
    /// multiple of 16 bytes).
    pub fn of(op: CollectiveOp, size: u64, esz: u64, n: u64) -> Geometry {
        let count = size / esz;
        let base = (count / n) & !(16 / esz - 1);
        match op {
            CollectiveOp::AllGather => Geometry {
                count: base,
                send: base,
                recv: base * n,
                send_inplace: base,
                recv_inplace: 0,
            },
            CollectiveOp::ReduceScatter => Geometry {
                count: base,
                send: base * n,
                recv: base,
                send_inplace: 0,
                recv_inplace: base,
            },
            CollectiveOp::AllToAll => Geometry {
                count: base,
                send: base * n,
                recv: base * n,
                send_inplace: 0,
                recv_inplace: 0,
            },
            _ => Geometry {
                count,
                send: count,
                recv: count,
                send_inplace: 0,
                recv_inplace: 0,
            },
        }
    }

    /// nccl-tests' `size` column: the larger of the send and receive bytes.
    pub fn size(&self, esz: u64) -> u64 {
        self.send.max(self.recv) * esz
    }
}

/// (algbw, busbw) in GB/s of one call of `g` taking `sec` seconds (nccl-tests' `*GetBw`).
pub(crate) fn bandwidth(
    op: CollectiveOp,
    g: &Geometry,
    esz: u64,
    sec: f64,
    n: usize,
) -> (f64, f64) {
    let bytes = match op {
        CollectiveOp::AllGather | CollectiveOp::ReduceScatter | CollectiveOp::AllToAll => {
            g.count * esz * n as u64
        }
        _ => g.count * esz,
    };
    let alg = bytes as f64 / 1e9 / sec;
    (alg, alg * busbw_factor(op, n))
}
