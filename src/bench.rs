//! `unihal bench <op>`: collective benchmarks with nccl-tests' flags and output, so figures compare
//! directly with nccl-tests runs on the same machine.
//!
//! Every rank is a device of one backend in this process (in-process communicators). The output
//! follows nccl-tests: size, count, type, redop, root, then time, algbw, busbw and #wrong for
//! out-of-place and in-place, and the "Out of bounds values" and "Avg bus bandwidth" footer. busbw
//! uses nccl-tests' factors: all_reduce 2(n-1)/n; all_gather, reduce_scatter and alltoall (n-1)/n;
//! broadcast, reduce and sendrecv 1.

use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;
use unihal_hal::{
    Buffer, CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError, ReduceOp,
    Result, Stream,
};

/// Options, named as nccl-tests names them.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub op: CollectiveOp,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub step_factor: u64,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    pub dtype: DType,
    pub redop: ReduceOp,
    pub root: usize,
    pub ranks: usize,
}

impl BenchOptions {
    /// Refuses what the run could not honour, as nccl-tests does: more ranks than `available`
    /// (a reader comparing with an 8-GPU figure must not get a 4-rank one), zero iterations
    /// (nothing would be measured), a step factor below 2 between different sizes, a minimum
    /// above the maximum, a root outside the ranks.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming the flag (`-g`, `-n`, `-f`, `-b`, `-r`).
    pub fn validate(&self, available: usize) -> Result<()> {
        let bad = |arg: &'static str, value: String, accepted: String| {
            Err(HalError::invalid(
                arg,
                unihal_hal::Invalid::Value { value, accepted },
            ))
        };
        if self.ranks > available {
            return bad(
                "-g",
                format!("{} ranks", self.ranks),
                format!("at most the {available} device(s) (or processes) the backend has"),
            );
        }
        if self.iters == 0 {
            return bad(
                "-n",
                "0 iterations".into(),
                "1 or more (a time needs at least one measured iteration)".into(),
            );
        }
        if self.min_bytes > self.max_bytes {
            return bad(
                "-b",
                format!("minimum {} bytes", self.min_bytes),
                format!("at most the maximum (-e) {} bytes", self.max_bytes),
            );
        }
        // Whole elements of the largest size must be one buffer's bytes (an unchecked product
        // wrapped to 0 in release builds, and the run then failed on a misleading range).
        let esz = self.dtype.size() as u64;
        let fits = self
            .max_bytes
            .div_ceil(esz)
            .checked_mul(esz)
            .is_some_and(|b| b <= isize::MAX as u64);
        if !fits {
            return bad(
                "-e",
                format!("maximum {} bytes", self.max_bytes),
                format!(
                    "at most {} bytes (one buffer)",
                    isize::MAX as u64 / esz * esz
                ),
            );
        }
        if self.step_factor < 2 && self.min_bytes < self.max_bytes {
            return bad(
                "-f",
                format!("step factor {}", self.step_factor),
                "2 or more when -b and -e differ".into(),
            );
        }
        let n = if self.ranks == 0 {
            available
        } else {
            self.ranks
        };
        if matches!(self.op, CollectiveOp::Broadcast | CollectiveOp::Reduce) && self.root >= n {
            return bad(
                "-r",
                format!("root {}", self.root),
                format!("a rank below {n}"),
            );
        }
        Ok(())
    }
}

/// One line of results.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub size: u64,
    pub count: u64,
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub out_of_place: BenchTiming,
    pub in_place: BenchTiming,
}

/// Time and bandwidth of one placement.
#[derive(Debug, Clone, Serialize)]
pub struct BenchTiming {
    pub time_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    pub wrong: u64,
}

/// nccl-tests' name of a dtype.
pub fn nccl_type_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "half",
        DType::Bf16 => "bfloat16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
        DType::I16 => "int16",
        DType::Bool => "bool",
    }
}

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

/// Parses `1K`, `64M`, `2G`, `512` (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

/// Element count per rank for a "size" as nccl-tests defines it (the largest buffer of the op).
fn counts(op: CollectiveOp, size: u64, esz: u64, n: u64) -> (u64, u64) {
    let total = size / esz;
    match op {
        // size is the gathered / scattered total; per-rank count is 1/n of it.
        CollectiveOp::AllGather | CollectiveOp::ReduceScatter | CollectiveOp::AllToAll => {
            (total / n * n, total / n)
        }
        _ => (total, total),
    }
}

struct Rank {
    comm: Arc<dyn Communicator>,
    stream: Arc<dyn Stream>,
    send: Buffer,
    recv: Buffer,
}

/// Fills `b` with the value `v` in `d`.
fn fill_with(s: &Arc<dyn Stream>, b: &Buffer, d: DType, v: f64) -> Result<()> {
    let one = element(d, v);
    s.write(b, 0, &one.repeat((b.len() / d.size() as u64) as usize))
}

/// One element of `d` holding `v`.
fn element(d: DType, v: f64) -> Vec<u8> {
    unihal_hal::Scalar::F64(v).bits(d).to_le_bytes()[..d.size()].to_vec()
}

/// Enqueues one operation on every rank (count per rank `c`).
fn issue(o: &BenchOptions, ranks: &[Rank], c: u64, in_place: bool) -> Result<()> {
    for k in ranks {
        let (r, n) = (k.comm.rank(), k.comm.size());
        let esz = o.dtype.size() as u64;
        let (send, recv) = if in_place {
            let at = match o.op {
                CollectiveOp::AllGather => r as u64 * c * esz,
                _ => 0,
            };
            let s = match o.op {
                CollectiveOp::AllGather => k.recv.slice(at, c * esz)?,
                _ => k.recv.clone(),
            };
            (s, k.recv.clone())
        } else {
            (k.send.clone(), k.recv.clone())
        };
        match o.op {
            CollectiveOp::AllReduce => k
                .comm
                .all_reduce(&send, &recv, c, o.dtype, o.redop, &k.stream)?,
            CollectiveOp::Broadcast => k
                .comm
                .broadcast(&send, &recv, c, o.dtype, o.root, &k.stream)?,
            CollectiveOp::Reduce => k
                .comm
                .reduce(&send, &recv, c, o.dtype, o.redop, o.root, &k.stream)?,
            CollectiveOp::AllGather => k.comm.all_gather(&send, &recv, c, o.dtype, &k.stream)?,
            CollectiveOp::ReduceScatter => {
                let recv = if in_place {
                    k.send.slice(r as u64 * c * esz, c * esz)?
                } else {
                    recv
                };
                let send = if in_place { k.send.clone() } else { send };
                k.comm
                    .reduce_scatter(&send, &recv, c, o.dtype, o.redop, &k.stream)?
            }
            CollectiveOp::AllToAll => k.comm.all_to_all(&k.send, &k.recv, c, o.dtype, &k.stream)?,
            CollectiveOp::SendRecv => k.comm.group(
                &[
                    GroupCall::Send {
                        buf: k.send.clone(),
                        count: c,
                        dtype: o.dtype,
                        peer: (r + 1) % n,
                    },
                    GroupCall::Recv {
                        buf: k.recv.clone(),
                        count: c,
                        dtype: o.dtype,
                        peer: (r + n - 1) % n,
                    },
                ],
                &k.stream,
            )?,
        }
    }
    Ok(())
}

/// Expected value at element `i` of rank `r`'s result when rank k's send holds k+1 everywhere.
fn expected(o: &BenchOptions, n: usize, r: usize, i: u64, c: u64) -> Option<f64> {
    let all: Vec<f64> = (1..=n).map(|k| k as f64).collect();
    let red = |v: &[f64]| match o.redop {
        ReduceOp::Sum => v.iter().sum::<f64>(),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Min => 1.0,
        ReduceOp::Max => n as f64,
        ReduceOp::Avg => v.iter().sum::<f64>() / n as f64,
    };
    Some(match o.op {
        CollectiveOp::AllReduce | CollectiveOp::ReduceScatter => red(&all),
        CollectiveOp::Reduce => {
            if r == o.root {
                red(&all)
            } else {
                return None;
            }
        }
        CollectiveOp::Broadcast => (o.root + 1) as f64,
        CollectiveOp::AllGather | CollectiveOp::AllToAll => (i / c + 1) as f64,
        CollectiveOp::SendRecv => ((r + n - 1) % n + 1) as f64,
    })
}

fn wrong(o: &BenchOptions, ranks: &[Rank], c: u64, in_place: bool) -> Result<u64> {
    let mut bad = 0;
    for k in ranks {
        let (r, n) = (k.comm.rank(), k.comm.size());
        let esz = o.dtype.size() as u64;
        let (buf, elems) = match o.op {
            CollectiveOp::ReduceScatter if in_place => {
                (k.send.slice(r as u64 * c * esz, c * esz)?, c)
            }
            CollectiveOp::AllGather | CollectiveOp::AllToAll => (k.recv.clone(), c * n as u64),
            _ => (k.recv.clone(), c),
        };
        let mut bytes = vec![0u8; (elems * esz) as usize];
        k.stream.read(&buf, 0, &mut bytes)?;
        for i in 0..elems {
            let Some(want) = expected(o, n, r, i, c) else {
                continue;
            };
            let e = element(o.dtype, want);
            if bytes[(i * esz) as usize..((i + 1) * esz) as usize] != e[..] {
                bad += 1;
            }
        }
    }
    Ok(bad)
}

fn reset(o: &BenchOptions, ranks: &[Rank]) -> Result<()> {
    for k in ranks {
        let r = k.comm.rank();
        fill_with(&k.stream, &k.send, o.dtype, (r + 1) as f64)?;
        fill_with(&k.stream, &k.recv, o.dtype, (r + 1) as f64)?;
    }
    Ok(())
}

/// Bandwidth (bytes read + written per second, in GB/s) of `copy_from_slice` of `size` bytes,
/// median of five.
pub fn plain_copy_gbs(size: usize) -> f64 {
    let src = vec![1u8; size.max(1)];
    let mut dst = vec![0u8; size.max(1)];
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            std::hint::black_box(&mut dst).copy_from_slice(std::hint::black_box(&src));
            t0.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    2.0 * size as f64 / t[2] / 1e9
}

/// `v` reduced over every rank of an SPMD world (`comm`), through the communicator itself.
fn world_reduce(k: &Rank, v: f64, op: ReduceOp) -> Result<f64> {
    let b = k.comm.device().alloc(8)?;
    k.stream.write(&b, 0, &v.to_le_bytes())?;
    k.comm.all_reduce(&b, &b, 1, DType::F64, op, &k.stream)?;
    let mut out = [0u8; 8];
    k.stream.read(&b, 0, &mut out)?;
    Ok(f64::from_le_bytes(out))
}

/// Runs the benchmark and prints nccl-tests' table to `out`. The ranks are the first `o.ranks`
/// devices of this process, or, when the backend's engine connects processes already (MPI
/// under `mpirun`), this process's rank of the world on its local device; then every rank
/// reports the slowest rank's time and the sum of wrong values, and only rank 0 prints.
///
/// # Errors
/// Errors of the backend or of the collectives.
pub fn run(
    backend: &dyn unihal_hal::Backend,
    o: &BenchOptions,
    out: &mut dyn std::io::Write,
) -> Result<Vec<BenchRow>> {
    let ccl = backend.collectives().ok_or_else(|| {
        HalError::unsupported(format!("collectives on backend {}", backend.name()))
    })?;
    let (devices, comms, spmd) =
        match crate::bootstrap::connected_world(backend, &CommConfig::default())? {
            Some(world) => {
                o.validate(world.size())?;
                if o.ranks != 0 && o.ranks != world.size() {
                    return Err(HalError::invalid(
                        "-g",
                        unihal_hal::Invalid::Value {
                            value: format!("{} ranks", o.ranks),
                            accepted: format!("the world's {} processes (or 0)", world.size()),
                        },
                    ));
                }
                (vec![world.device().clone()], vec![world], true)
            }
            None => {
                let avail = backend.probe()?;
                o.validate(avail)?;
                let n = if o.ranks == 0 { avail } else { o.ranks };
                let devices: Vec<Arc<dyn Device>> =
                    (0..n).map(|i| backend.open(i)).collect::<Result<_>>()?;
                let comms = ccl.init_all(&devices, &CommConfig::default())?;
                (devices, comms, false)
            }
        };
    let n = comms[0].size();
    let mut sink = std::io::sink();
    let out: &mut dyn std::io::Write = if comms[0].rank() == 0 { out } else { &mut sink };
    let esz = o.dtype.size() as u64;
    let max_elems = o.max_bytes.div_ceil(esz).max(1);
    let mut ranks = Vec::new();
    for (d, comm) in devices.iter().zip(comms.iter().cloned()) {
        let bytes = (max_elems * esz) as usize;
        ranks.push(Rank {
            comm,
            stream: d.create_stream()?,
            send: d.alloc(bytes)?,
            recv: d.alloc(bytes)?,
        });
    }
    let w = |out: &mut dyn std::io::Write, s: String| {
        let _ = writeln!(out, "{s}");
    };
    // The step actually used: one size when -b equals -e.
    let step = if o.min_bytes < o.max_bytes {
        format!("{}(factor)", o.step_factor)
    } else {
        "none(one size)".to_string()
    };
    w(out, format!("# nThread 1 nGpus {n} minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: 0", o.min_bytes, o.max_bytes, o.warmup, o.iters, o.check as u8));
    w(
        out,
        format!("# backend {} {}", backend.name(), ccl.capabilities().engine),
    );
    w(out, "#".into());
    w(out, "# Using devices".into());
    for (d, c) in devices.iter().zip(&comms) {
        w(
            out,
            format!(
                "#  Rank {:2} Group  0 Pid {:6} on {:>10} device {:2} [{}] {}",
                c.rank(),
                std::process::id(),
                backend.name(),
                d.id().ordinal,
                d.id(),
                d.info().name
            ),
        );
    }
    w(out, "#".into());
    w(out, format!("#{:>79}{:>36}", "out-of-place", "in-place"));
    w(
        out,
        format!(
            "#{:>11} {:>12} {:>8} {:>6} {:>6} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        ),
    );
    w(
        out,
        format!(
            "#{:>11} {:>12} {:>8} {:>6} {:>6} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        ),
    );
    let mut rows = Vec::new();
    let mut size = o.min_bytes.max(esz);
    let factor = busbw_factor(o.op, n);
    let mut oob = 0u64;
    let mut bus_sum = 0.0;
    while size <= o.max_bytes {
        let (total, c) = counts(o.op, size, esz, n as u64);
        let mut timings = Vec::new();
        for in_place in [false, true] {
            let in_place =
                in_place && !matches!(o.op, CollectiveOp::AllToAll | CollectiveOp::SendRecv);
            reset(o, &ranks)?;
            for _ in 0..o.warmup {
                issue(o, &ranks, c, in_place)?;
            }
            for k in &ranks {
                k.stream.synchronize()?;
            }
            let t0 = Instant::now();
            for _ in 0..o.iters {
                issue(o, &ranks, c, in_place)?;
            }
            for k in &ranks {
                k.stream.synchronize()?;
            }
            let mut t = t0.elapsed().as_secs_f64() / o.iters as f64;
            if spmd {
                t = world_reduce(&ranks[0], t, ReduceOp::Max)?;
            }
            let mut bad = if o.check {
                reset(o, &ranks)?;
                issue(o, &ranks, c, in_place)?;
                for k in &ranks {
                    k.stream.synchronize()?;
                }
                wrong(o, &ranks, c, in_place)?
            } else {
                0
            };
            if spmd {
                bad = world_reduce(&ranks[0], bad as f64, ReduceOp::Sum)? as u64;
            }
            oob += bad;
            let algbw = (total * esz) as f64 / t / 1e9;
            timings.push(BenchTiming {
                time_us: t * 1e6,
                algbw_gbs: algbw,
                busbw_gbs: algbw * factor,
                wrong: bad,
            });
        }
        bus_sum += timings.iter().map(|t| t.busbw_gbs).sum::<f64>() / 2.0;
        let root = if matches!(o.op, CollectiveOp::Broadcast | CollectiveOp::Reduce) {
            o.root as i64
        } else {
            -1
        };
        let redop = if o.op.reduces() {
            o.redop.name()
        } else {
            "none"
        };
        let row = BenchRow {
            size: total * esz,
            count: total,
            dtype: nccl_type_name(o.dtype).into(),
            redop: redop.into(),
            root,
            out_of_place: timings[0].clone(),
            in_place: timings[1].clone(),
        };
        w(out, format!(
            "{:>12} {:>12} {:>8} {:>6} {:>6} {:>9.2} {:>7.2} {:>7.2} {:>6} {:>9.2} {:>7.2} {:>7.2} {:>6}",
            row.size, row.count, row.dtype, row.redop, row.root,
            row.out_of_place.time_us, row.out_of_place.algbw_gbs, row.out_of_place.busbw_gbs, row.out_of_place.wrong,
            row.in_place.time_us, row.in_place.algbw_gbs, row.in_place.busbw_gbs, row.in_place.wrong
        ));
        rows.push(row);
        if size >= o.max_bytes {
            break;
        }
        size = match size.checked_mul(o.step_factor) {
            Some(s) => s,
            None => break,
        };
    }
    w(
        out,
        format!(
            "# Out of bounds values : {oob} {}",
            if oob == 0 { "OK" } else { "FAILED" }
        ),
    );
    if let (CollectiveOp::AllReduce, Some(last), false) = (o.op, rows.last(), spmd) {
        // What the in-process algorithm really moves, all ranks together: each rank reads its
        // chunk from every rank and writes it (S + S/n), then copies the n-1 other chunks
        // (2(n-1)S/n): (3n-1)S in all, against a plain copy (read + write) measured now.
        let s = last.size as f64;
        let nn = n as f64;
        let moved = s * (3.0 * nn - 1.0);
        let moved_bw = moved / (last.out_of_place.time_us * 1e-6) / 1e9;
        let copy_bw = plain_copy_gbs(last.size as usize);
        w(out, format!("# Bytes moved by the algorithm at {} B: {:.0} B, {:.2} GB/s; plain memory copy (read+write): {:.2} GB/s; ratio {:.2}", last.size, moved, moved_bw, copy_bw, moved_bw / copy_bw));
    }
    #[cfg(feature = "mpi")]
    if spmd && o.op == CollectiveOp::AllReduce && unihal_cpu::ccl::mpi::selected() {
        mpi_comparison(o, &ranks[0], &rows, out)?;
    }
    w(
        out,
        format!(
            "# Avg bus bandwidth    : {:.6} ",
            if rows.is_empty() {
                0.0
            } else {
                bus_sum / rows.len() as f64
            }
        ),
    );
    w(out, "#".into());
    Ok(rows)
}

/// Medians, over `ROUNDS` interleaved rounds, of the slowest rank's time per all_reduce through
/// unihal's MPI engine and through a direct `MPI_Allreduce`, out of place on the same buffers.
#[cfg(feature = "mpi")]
fn mpi_comparison(
    o: &BenchOptions,
    k: &Rank,
    rows: &[BenchRow],
    out: &mut dyn std::io::Write,
) -> Result<()> {
    const ROUNDS: usize = 5;
    let esz = o.dtype.size() as u64;
    let _ = writeln!(
        out,
        "# unihal MPI engine vs direct MPI_Allreduce (out-of-place, same buffers, slowest rank, median of {ROUNDS} interleaved rounds of {} iters)",
        o.iters
    );
    let _ = writeln!(
        out,
        "#{:>11} {:>12} {:>12} {:>8}",
        "size", "unihal(us)", "direct(us)", "ratio"
    );
    for row in rows {
        let c = row.count;
        let (mut ours, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let t0 = Instant::now();
            for _ in 0..o.iters {
                k.comm
                    .all_reduce(&k.send, &k.recv, c, o.dtype, o.redop, &k.stream)?;
            }
            k.stream.synchronize()?;
            let t = t0.elapsed().as_secs_f64() / o.iters as f64;
            ours.push(world_reduce(k, t, ReduceOp::Max)?);
            let t0 = Instant::now();
            for _ in 0..o.iters {
                unihal_cpu::ccl::mpi::direct_all_reduce(&k.send, &k.recv, c, o.dtype, o.redop)?;
            }
            let t = t0.elapsed().as_secs_f64() / o.iters as f64;
            direct.push(world_reduce(k, t, ReduceOp::Max)?);
        }
        let (a, b) = (median(ours), median(direct));
        let _ = writeln!(
            out,
            "{:>12} {:>12.2} {:>12.2} {:>8.3}",
            c * esz,
            a * 1e6,
            b * 1e6,
            b / a
        );
    }
    Ok(())
}
