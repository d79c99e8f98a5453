//! `unihal bench <op>`: collective benchmarks with nccl-tests' flags, output and JSON file, so
//! figures compare directly with nccl-tests runs on the same machine and tools written for
//! nccl-tests read ours.
//!
//! nccl-tests' own sources (NVIDIA/nccl-tests 2.19.6) are the specification:
//!
//! * **Flags** ([`NcclFlags`]): every short and long option of `common.cu`'s `getopt_long` table
//!   is accepted, with nccl-tests' defaults (`-w 1`, `-f 1` with `-i 1M` step bytes, `-a 1`
//!   average over ranks). What unihal honours runs for real: `-d all` and `-o all` loop over
//!   nccl-tests' types and reductions (and `-r -1` over every root of broadcast and reduce) as its
//!   `*RunTest` functions do; `-i`, `-m`, `-N`, `-z 0..3`, `-a 0..3`, `-c N`, `-C`, `-S`, `-u`
//!   and `-T` (the communicators' timeout) mean what they mean there. What unihal cannot honour
//!   (`-t > 1`, `-G`, `-R`, `-x`, `-D`, `-V`, `-M`, `-I`, `-K`, `-y`, `-p`, `-o mulsum`,
//!   `-d f8e4m3`) is refused with an error naming the flag, the value and why.
//! * **Counts** (`setupArgs` and each `*GetCollByteCount`): `size` is the largest buffer,
//!   `count` the count the collective is called with, per rank for all_gather, reduce_scatter
//!   and alltoall, whose per-rank count is also rounded down to 16 bytes.
//! * **Timing** (`BenchTime`): a synchronising call, then `-n` x `-m` calls; time per call is the
//!   elapsed time over `-n` x `-m`, combined over ranks by `-a`; each call works on buffers
//!   shifted through the allocation as `startColl` shifts them. algbw and busbw follow each
//!   `*GetBw`: busbw factors all_reduce 2(n-1)/n; all_gather, reduce_scatter and alltoall
//!   (n-1)/n; broadcast, reduce and sendrecv 1.
//! * **Output** (`util.cu`): the header, the "Using devices" lines of every rank (in a launched
//!   world gathered to rank 0 through the communicator), the table, and the footer whose "Out of
//!   bounds values" (the checks that found wrong values) and "Avg bus bandwidth" lines come
//!   together; unihal's own extra lines (the bytes the in-process all_reduce moves, the MPI
//!   engine's comparison with a direct `MPI_Allreduce`) follow the footer, each starting with `#`.
//! * **JSON** (`-J FILE.json`, `util.cu`'s writer, file version 3): `version`, `start_time`,
//!   `args`, `env`, `nccl_version`, `config` (with `devices`), `results[]` (`size`, `count`,
//!   `type`, `redop`, `root`, `out_of_place` and `in_place` with `time` or `cpu_time`, `alg_bw`,
//!   `bus_bw`, `nwrong`, `actual_iterations`, `experiment_name`), `out_of_bounds`,
//!   `average_bus_bandwidth`, `errors`, `end_time`; written compactly, numbers and booleans as
//!   nccl-tests writes them (`%lf`, `"true"`). Times are UTC.
//!
//! The ranks are the devices of one backend in this process (in-process communicators), or, when
//! the backend's engine connects processes already (MPI under `mpirun`, gloo under `torchrun`),
//! this process's rank of the world on its local device; then only rank 0 prints.

mod check;
mod flags;
mod format;
mod geometry;

use check::*;
pub use flags::*;
pub use format::*;
pub use geometry::*;
use serde::Serialize;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;
use unihal_hal::{
    CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError, ReduceOp, Result,
    Stream,
};

/// The nccl-tests release whose sources this module follows.
pub const NCCL_TESTS_VERSION: &str = "2.19.6";

/// The version of nccl-tests' JSON file (`util.cu`'s `JSON_FILE_VERSION`).
pub const JSON_FILE_VERSION: i64 = 3;

/// nccl-tests' data types, in its order (`common.cu`'s `test_types`), those unihal has (all but
/// the fp8 types): what `-d all` runs.
pub const NCCL_TYPES: [DType; 10] = [
    DType::I8,
    DType::U8,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::Bf16,
];

/// nccl-tests' reductions, in its order (`common.cu`'s `test_opnames`), those unihal has (all but
/// `mulsum`): what `-o all` runs.
pub const NCCL_OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

/// The collectives `unihal bench` runs, by the names it accepts first (nccl-tests' binaries are
/// these names with `_perf`).
pub const COLLECTIVES: [(&str, CollectiveOp); 7] = [
    ("all_reduce", CollectiveOp::AllReduce),
    ("all_gather", CollectiveOp::AllGather),
    ("reduce_scatter", CollectiveOp::ReduceScatter),
    ("broadcast", CollectiveOp::Broadcast),
    ("reduce", CollectiveOp::Reduce),
    ("alltoall", CollectiveOp::AllToAll),
    ("sendrecv", CollectiveOp::SendRecv),
];

/// One line of results.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    /// Bytes of the largest buffer (nccl-tests' `size`).
    pub size: u64,
    /// Elements the collective is called with: per rank for all_gather, reduce_scatter and
    /// alltoall (nccl-tests' `count`).
    pub count: u64,
    /// nccl-tests' name of the dtype.
    pub dtype: String,
    /// The reduction's name, or `none`.
    pub redop: String,
    /// The root, or -1.
    pub root: i64,
    /// Out of place.
    pub out_of_place: BenchTiming,
    /// In place (alltoall and sendrecv: out of place again).
    pub in_place: BenchTiming,
}

/// Time and bandwidth of one placement.
#[derive(Debug, Clone, Serialize)]
pub struct BenchTiming {
    /// Microseconds per call (with `-C`: to enqueue it).
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbs: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbs: f64,
    /// Wrong elements over all ranks (`None` without a check, `-c 0`).
    pub wrong: Option<u64>,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The rows, in order.
    pub rows: Vec<BenchRow>,
    /// nccl-tests' "Out of bounds values": checks (per rank's process) that found wrong values.
    pub errors: u64,
    /// Average bus bandwidth over every placement of every row, GB/s.
    pub avg_busbw_gbs: f64,
    /// False when `NCCL_TESTS_MIN_BW` is set and the average is below 0.9 of it.
    pub bandwidth_ok: bool,
}

/// A run in progress: the ranks of this process, the options and the outputs.
struct Bench<'a> {
    o: &'a BenchOptions,
    ranks: Vec<Rank>,
    /// Ranks of the whole world.
    n: usize,
    spmd: bool,
    out: &'a mut dyn Write,
    json: Option<JsonOut>,
    /// Checks of this process that found wrong values.
    errors: u64,
    bw_sum: f64,
    bw_count: u64,
    rows: Vec<BenchRow>,
}

impl Bench<'_> {
    fn p(&mut self, s: &str) {
        let _ = writeln!(self.out, "{s}");
    }

    fn json(&mut self) -> Option<&mut Json> {
        self.json.as_mut().map(|j| &mut j.json)
    }

    /// `v` reduced over every rank of the world through the communicator itself.
    fn world_reduce(&self, v: f64, op: ReduceOp) -> Result<f64> {
        world_reduce(&self.ranks[0], v, op)
    }

    /// nccl-tests' `Barrier`: nothing within one process (one thread drives every rank), an
    /// all_reduce through the world across processes.
    fn barrier(&self) -> Result<()> {
        if self.spmd {
            self.world_reduce(0.0, ReduceOp::Sum)?;
        }
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        for k in &self.ranks {
            k.stream.synchronize()?;
        }
        Ok(())
    }

    /// nccl-tests' `startColl`: one call on every rank of this process, on buffers shifted by
    /// `iter` through the allocation, then the waits `-z` asks for.
    fn start_coll(&self, t: &Test, g: &Geometry, in_place: bool, iter: usize) -> Result<()> {
        let esz = t.dtype.size() as u64;
        let total = g.send.max(g.recv) * esz;
        let steps = self.o.max_bytes.checked_div(total).unwrap_or(1).max(1);
        let shift = total * (iter as u64 % steps) + (self.o.unalign as u64) * esz;
        if g.count > 0 {
            for k in &self.ranks {
                issue(self.o.op, t, g, k, shift, in_place)?;
            }
        }
        if self.o.blocking != 0 {
            self.sync_all()?;
        }
        if self.o.blocking == 1 {
            self.barrier()?;
        }
        Ok(())
    }

    /// nccl-tests' `completeColl`.
    fn complete_coll(&self) -> Result<()> {
        if self.o.blocking != 0 && self.o.agg_iters <= 1 {
            return Ok(());
        }
        self.sync_all()
    }

    /// nccl-tests' `InitData` for every rank: rank k's buffers hold k+1.
    fn init_data(&self, d: DType) -> Result<()> {
        for k in &self.ranks {
            let r = k.comm.rank();
            let e = element(d, (r + 1) as f64);
            for b in [&k.send, &k.recv] {
                k.stream
                    .write(b, 0, &e.repeat((b.len() / d.size() as u64) as usize))?;
            }
        }
        Ok(())
    }

    /// Wrong elements of this process's ranks after one call (nccl-tests' `CheckData`).
    fn check_data(&self, t: &Test, g: &Geometry, in_place: bool) -> Result<u64> {
        let mut bad = 0;
        let esz = t.dtype.size() as u64;
        for k in &self.ranks {
            let (r, n) = (k.comm.rank(), k.comm.size());
            let at = self.o.unalign as u64 * esz
                + if in_place {
                    g.recv_inplace * r as u64 * esz
                } else {
                    0
                };
            let mut bytes = vec![0u8; (g.recv * esz) as usize];
            if g.recv > 0 {
                k.stream
                    .read(&k.recv.slice(at, g.recv * esz)?, 0, &mut bytes)?;
            }
            for i in 0..g.recv {
                let Some(want) = expected(self.o.op, t, n, r, i, g.count) else {
                    continue;
                };
                if bytes[(i * esz) as usize..((i + 1) * esz) as usize] != want[..] {
                    bad += 1;
                }
            }
        }
        Ok(bad)
    }

    /// nccl-tests' `BenchTime`: one placement of one size, timed, checked and printed.
    fn bench_time(&mut self, t: &Test, g: &Geometry, column: Placement) -> Result<BenchTiming> {
        let o = self.o;
        // alltoall and sendrecv run out of place in both columns.
        let in_place = column == Placement::InPlace
            && !matches!(o.op, CollectiveOp::AllToAll | CollectiveOp::SendRecv);
        if o.check > 0 {
            self.init_data(t.dtype)?;
        }
        self.start_coll(t, g, in_place, 0)?;
        self.complete_coll()?;
        self.barrier()?;
        let calls = (o.iters * o.agg_iters) as f64;
        let mut coll_only = 0.0;
        let t0 = Instant::now();
        for iter in 0..o.iters {
            let ti = t0.elapsed().as_secs_f64();
            for a in 0..o.agg_iters {
                self.start_coll(t, g, in_place, iter * o.agg_iters + a)?;
            }
            if o.blocking == 3 {
                self.sync_all()?;
                coll_only += t0.elapsed().as_secs_f64() - ti;
                self.barrier()?;
            }
        }
        let until_now = |t0: Instant| {
            if o.blocking == 3 {
                coll_only
            } else {
                t0.elapsed().as_secs_f64()
            }
        };
        let cputime = until_now(t0) / calls;
        self.complete_coll()?;
        let mut delta = until_now(t0) / calls;
        if self.spmd {
            delta = match o.average {
                0 => delta,
                1 => self.world_reduce(delta, ReduceOp::Sum)? / self.n as f64,
                2 => self.world_reduce(delta, ReduceOp::Min)?,
                _ => self.world_reduce(delta, ReduceOp::Max)?,
            };
        }
        let (algbw, busbw) = bandwidth(o.op, g, t.dtype.size() as u64, delta, self.n);
        self.barrier()?;
        let mut wrong = 0u64;
        for _ in 0..o.check {
            self.init_data(t.dtype)?;
            self.start_coll(t, g, in_place, 0)?;
            self.complete_coll()?;
            let local = self.check_data(t, g, in_place)?;
            if local > 0 {
                self.errors += 1;
            }
            wrong = if self.spmd {
                self.world_reduce(local as f64, ReduceOp::Sum)? as u64
            } else {
                local
            };
            if wrong > 0 {
                break;
            }
        }
        let time_us = if o.report_cputime { cputime } else { delta } * 1e6;
        let wrong = (o.check > 0).then_some(wrong);
        let mut line = format!(
            "  {:>7}  {:>6}  {:>6}",
            float_str(time_us, 7),
            float_str(algbw, 6),
            float_str(busbw, 6)
        );
        match wrong {
            Some(w) => line.push_str(&format!("  {:>6}", c_g(w as f64))),
            None => line.push_str("    N/A"),
        }
        if column == Placement::InPlace && o.report_timestamps {
            line.push_str(&format!("{:>21}", now_string()));
        }
        let _ = write!(self.out, "{line}");
        let cputime_key = o.report_cputime;
        if let Some(j) = self.json() {
            j.key(match column {
                Placement::InPlace => "in_place",
                Placement::OutOfPlace => "out_of_place",
            });
            j.start_object();
            j.key(if cputime_key { "cpu_time" } else { "time" });
            j.double(time_us);
            j.key("alg_bw");
            j.double(algbw);
            j.key("bus_bw");
            j.double(busbw);
            j.key("nwrong");
            match wrong {
                Some(w) => j.double(w as f64),
                None => j.null(),
            }
            j.finish_object();
        }
        self.bw_sum += busbw;
        self.bw_count += 1;
        Ok(BenchTiming {
            time_us,
            algbw_gbs: algbw,
            busbw_gbs: busbw,
            wrong,
        })
    }

    /// nccl-tests' `TimeTest`: warm-up over the sizes, then every size, `-N` times.
    fn time_test(&mut self, t: &Test) -> Result<()> {
        let o = self.o;
        let esz = t.dtype.size() as u64;
        let n = self.n as u64;
        let mut size = o.min_bytes.max(1);
        while size <= o.max_bytes {
            let g = Geometry::of(o.op, size, esz, n);
            for iter in 0..o.warmup {
                self.start_coll(t, &g, false, iter)?;
            }
            self.complete_coll()?;
            match size.checked_mul(2) {
                Some(s) => size = s,
                None => break,
            }
        }
        let mut cycle = 0;
        while o.run_cycles == 0 || cycle < o.run_cycles {
            cycle += 1;
            let mut size = o.min_bytes;
            loop {
                let g = Geometry::of(o.op, size, esz, n);
                let _ = write!(
                    self.out,
                    "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
                    g.size(esz),
                    g.count,
                    nccl_type_name(t.dtype),
                    t.redop_name,
                    format!("{:6}", t.root_printed)
                );
                if let Some(j) = self.json() {
                    j.start_object();
                    j.key("size");
                    j.int(g.size(esz) as i64);
                    j.key("count");
                    j.int(g.count as i64);
                    j.key_str("type", nccl_type_name(t.dtype));
                    j.key_str("redop", t.redop_name);
                    j.key_str("root", &format!("{:6}", t.root_printed));
                }
                let oop = self.bench_time(t, &g, Placement::OutOfPlace)?;
                let ip = self.bench_time(t, &g, Placement::InPlace)?;
                self.p("");
                let iters = o.iters as i64;
                if let Some(j) = self.json() {
                    j.key_int("actual_iterations", iters);
                    j.key_str("experiment_name", "");
                    j.finish_object();
                }
                self.rows.push(BenchRow {
                    size: g.size(esz),
                    count: g.count,
                    dtype: nccl_type_name(t.dtype).into(),
                    redop: t.redop_name.into(),
                    root: t.root_printed,
                    out_of_place: oop,
                    in_place: ip,
                });
                let next = if o.step_factor > 1 {
                    size.checked_mul(o.step_factor)
                } else {
                    size.checked_add(o.step_bytes)
                };
                match next {
                    Some(s) if s <= o.max_bytes && s > size => size = s,
                    _ => break,
                }
            }
        }
        Ok(())
    }
}

/// Enqueues one call of `op` on rank `k`, its buffers starting `at` bytes in.
fn issue(
    op: CollectiveOp,
    t: &Test,
    g: &Geometry,
    k: &Rank,
    at: u64,
    in_place: bool,
) -> Result<()> {
    let (r, n) = (k.comm.rank(), k.comm.size());
    let esz = t.dtype.size() as u64;
    let (send, recv) = if in_place {
        (
            k.recv
                .slice(at + g.send_inplace * r as u64 * esz, g.send * esz)?,
            k.recv
                .slice(at + g.recv_inplace * r as u64 * esz, g.recv * esz)?,
        )
    } else {
        (
            k.send.slice(at, g.send * esz)?,
            k.recv.slice(at, g.recv * esz)?,
        )
    };
    let (c, d, s) = (g.count, t.dtype, &k.stream);
    match op {
        CollectiveOp::AllReduce => k.comm.all_reduce(&send, &recv, c, d, t.redop, s),
        CollectiveOp::Broadcast => k.comm.broadcast(&send, &recv, c, d, t.root, s),
        CollectiveOp::Reduce => k.comm.reduce(&send, &recv, c, d, t.redop, t.root, s),
        CollectiveOp::AllGather => k.comm.all_gather(&send, &recv, c, d, s),
        CollectiveOp::ReduceScatter => k.comm.reduce_scatter(&send, &recv, c, d, t.redop, s),
        CollectiveOp::AllToAll => k.comm.all_to_all(&send, &recv, c, d, s),
        CollectiveOp::SendRecv => k.comm.group(
            &[
                GroupCall::Send {
                    buf: send,
                    count: c,
                    dtype: d,
                    peer: (r + 1) % n,
                },
                GroupCall::Recv {
                    buf: recv,
                    count: c,
                    dtype: d,
                    peer: (r + n - 1) % n,
                },
            ],
            s,
        ),
    }
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

/// Every rank's "Using devices" record, gathered to every rank of an SPMD world through the
/// communicator (an all_gather of fixed-size records, as nccl-tests' `MPI_Gather` of its lines).
fn gather_rank_infos(k: &Rank, me: &RankInfo) -> Result<Vec<RankInfo>> {
    let n = k.comm.size();
    let dev = k.comm.device();
    let send = dev.alloc(RECORD)?;
    let recv = dev.alloc(RECORD * n)?;
    k.stream.write(&send, 0, &me.record())?;
    k.comm
        .all_gather(&send, &recv, RECORD as u64, DType::U8, &k.stream)?;
    let mut all = vec![0u8; RECORD * n];
    k.stream.read(&recv, 0, &mut all)?;
    Ok(all
        .chunks(RECORD)
        .enumerate()
        .map(|(r, rec)| RankInfo::from_record(r, rec))
        .collect())
}

/// Runs the benchmark and prints nccl-tests' output to `out` (and, with `-J`, writes its JSON
/// document). The ranks are the first `o.ranks` devices of this process, or, when the backend's
/// engine connects processes already (MPI under `mpirun`), this process's rank of the world on
/// its local device; then the time is combined over ranks as `-a` says, wrong values are summed,
/// and only rank 0 prints and writes the JSON file.
///
/// # Errors
/// [`HalError::InvalidArgument`] for options the run cannot honour (see
/// [`BenchOptions::validate`]); errors of the backend or of the collectives (the JSON file then
/// holds what was measured, closed as nccl-tests closes it).
pub fn run(
    backend: &dyn unihal_hal::Backend,
    o: &BenchOptions,
    out: &mut dyn Write,
) -> Result<BenchReport> {
    let ccl = backend.collectives().ok_or_else(|| {
        HalError::unsupported(format!("collectives on backend {}", backend.name()))
    })?;
    let config = CommConfig { timeout: o.timeout };
    let (devices, comms, spmd) = match crate::bootstrap::connected_world(backend, &config)? {
        Some(world) => {
            if o.ranks > 1 {
                return Err(refuse(
                    "-g/--ngpus",
                    format!("{} GPUs per process", o.ranks),
                    format!(
                        "1 (or 0): under a launcher each of the world's {} processes is one rank \
                         on its local device",
                        world.size()
                    ),
                ));
            }
            o.check_ranks(world.size())?;
            (vec![world.device().clone()], vec![world], true)
        }
        None => {
            let avail = backend.probe()?;
            o.validate(avail)?;
            let n = if o.ranks == 0 { avail } else { o.ranks };
            let devices: Vec<Arc<dyn Device>> =
                (0..n).map(|i| backend.open(i)).collect::<Result<_>>()?;
            let comms = ccl.init_all(&devices, &config)?;
            (devices, comms, false)
        }
    };
    let n = comms[0].size();
    let rank0 = comms[0].rank() == 0;
    let mut sink = std::io::sink();
    let out: &mut dyn Write = if rank0 { out } else { &mut sink };
    let engine = ccl.capabilities().engine.clone();
    let json = match (&o.output_file, rank0) {
        (Some(path), true) => open_json(path, out).map(|file| {
            let mut j = Json::default();
            j.start_object();
            j.key_int("version", JSON_FILE_VERSION);
            j.key_str("start_time", &now_string());
            j.key("args");
            j.start_list();
            for a in &o.argv {
                j.str(a);
            }
            j.finish_list();
            j.key("env");
            j.start_list();
            for (k, v) in std::env::vars_os() {
                j.str(&format!("{}={}", k.to_string_lossy(), v.to_string_lossy()));
            }
            j.finish_list();
            j.key_int("nccl_version", nccl_version(&engine));
            JsonOut { json: j, file }
        }),
        _ => None,
    };
    let alloc = o.alloc_bytes().unwrap_or(8) as usize;
    let mut ranks = Vec::new();
    for (d, comm) in devices.iter().zip(comms.iter().cloned()) {
        ranks.push(Rank {
            comm,
            stream: d.create_stream()?,
            send: d.alloc(alloc)?,
            recv: d.alloc(alloc)?,
        });
    }
    let mut b = Bench {
        o,
        ranks,
        n,
        spmd,
        out,
        json,
        errors: 0,
        bw_sum: 0.0,
        bw_count: 0,
        rows: Vec::new(),
    };
    let result = b.run_all(backend, &engine, &devices);
    if let Some(mut j) = b.json.take() {
        j.json.finalize();
        if let Err(e) = j.file.write_all(j.json.s.as_bytes()) {
            let _ = writeln!(b.out, "# cannot write the JSON output: {e}");
        }
    }
    result
}

impl Bench<'_> {
    /// The header, every test and the footer.
    fn run_all(
        &mut self,
        backend: &dyn unihal_hal::Backend,
        engine: &str,
        devices: &[Arc<dyn Device>],
    ) -> Result<BenchReport> {
        let o = self.o;
        let prog = program_name(o.op);
        let (step, kind) = if o.step_factor > 1 {
            (o.step_factor, "factor")
        } else {
            (o.step_bytes, "bytes")
        };
        self.p(&format!(
            "# unihal {} bench, nccl-tests {NCCL_TESTS_VERSION} output",
            crate::VERSION
        ));
        self.p(&format!("# Collective test starting: {prog}"));
        self.p(&format!(
            "# nThread 1 nGpus {} minBytes {} maxBytes {} step: {step}({kind}) warmup iters: {} \
             iters: {} agg iters: {} validation: {} graph: 0 unalign: {}",
            devices.len(),
            o.min_bytes,
            o.max_bytes,
            o.warmup,
            o.iters,
            o.agg_iters,
            o.check,
            o.unalign
        ));
        match o.blocking {
            1 => self.p("# Blocking Enabled: wait and barrier after each inner iteration (-m) "),
            2 => self.p("# Blocking Enabled: wait after each inner iteration (-m), no barrier "),
            3 => self.p(
                "# Blocking Enabled: wait and barrier after each outer iteration (-n); time \
                 excludes barrier ",
            ),
            _ => {}
        }
        self.p(&format!("# backend {} {engine}", backend.name()));
        self.p("#");
        if let Some(j) = self.json() {
            j.key("config");
            j.start_object();
            j.key_int("nthreads", 1);
            j.key_int("ngpus", devices.len() as i64);
            j.key_int("minimum_bytes", o.min_bytes as i64);
            j.key_int("maximum_bytes", o.max_bytes as i64);
            if o.step_factor > 1 {
                j.key_int("step_factor", o.step_factor as i64);
            } else {
                j.key_int("step_bytes", o.step_bytes as i64);
            }
            j.key_int("warmup_iters", o.warmup as i64);
            j.key_int("iterations", o.iters as i64);
            j.key_int("aggregated_iterations", o.agg_iters as i64);
            j.key_int("validation", o.check as i64);
            j.key_int("graph", 0);
            j.key("blocking_collectives");
            j.bool(o.blocking != 0);
            j.key("per_iter_timing");
            j.bool(false);
            j.key_int("per_iter_skip", 0);
            j.key("parallel_init");
            j.bool(false);
        }
        // Using devices: every rank's line, gathered to rank 0 across processes.
        let host = host_name();
        let pid = std::process::id();
        let mine: Vec<RankInfo> = devices
            .iter()
            .zip(&self.ranks)
            .map(|(d, k)| RankInfo {
                rank: k.comm.rank(),
                pid,
                host: host.clone(),
                device: d.id().ordinal as usize,
                device_id: d.id().to_string(),
                name: d.info().name.clone(),
            })
            .collect();
        let infos = if self.spmd {
            gather_rank_infos(&self.ranks[0], &mine[0])?
        } else {
            mine
        };
        self.p("# Using devices");
        for i in &infos {
            self.p(&i.line());
        }
        if let Some(j) = self.json() {
            j.key("devices");
            j.start_list();
            for i in &infos {
                j.start_object();
                j.key_int("rank", i.rank as i64);
                j.key_int("group", 0);
                j.key_int("pid", i64::from(i.pid));
                j.key_str("hostname", &i.host);
                j.key_int("device", i.device as i64);
                j.key_str("device_hex", &i.device_id);
                j.key_str("device_info", &i.name);
                j.finish_object();
            }
            j.finish_list();
            j.finish_object();
        }
        let tests = self.tests(engine_caps(backend));
        // The result header (writeResultHeader).
        let time = if o.report_cputime { "cputime" } else { "time" };
        let (ts_lbl, ts_fmt, pad) = if o.report_timestamps {
            ("timestamp", "%Y-%m-%d %H:%M:%S", 19)
        } else {
            ("", "", 0)
        };
        self.p("#");
        self.p(&format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
            "", "", "", "", ""
        ));
        self.p(&format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} {:>pad$}",
            "size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong", time,
            "algbw", "busbw", "#wrong", ts_lbl
        ));
        self.p(&format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} {:>pad$}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
            "(GB/s)", "", ts_fmt
        ));
        if let Some(j) = self.json() {
            j.key("results");
            j.start_list();
        }
        for t in &tests {
            self.time_test(t)?;
        }
        // The footer (writeResultFooter).
        if let Some(j) = self.json() {
            j.finish_list();
        }
        let errors = if self.spmd {
            self.world_reduce(self.errors as f64, ReduceOp::Sum)? as u64
        } else {
            self.errors
        };
        let avg = self.bw_sum / self.bw_count as f64;
        let min_bw = std::env::var("NCCL_TESTS_MIN_BW")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok());
        let bandwidth_ok = min_bw.is_none_or(|m| avg >= m * 0.9);
        self.p(&format!(
            "# {:<20} : {errors} {}",
            "Out of bounds values",
            if errors > 0 { "FAILED" } else { "OK" }
        ));
        self.p(&format!(
            "# {:<20} : {} {}",
            "Avg bus bandwidth",
            c_g(avg),
            match (min_bw, bandwidth_ok) {
                (None, _) => "",
                (Some(_), true) => "OK",
                (Some(_), false) => "FAILED",
            }
        ));
        self.p("#");
        self.p(&format!("# Collective test concluded: {prog}"));
        if let Some(j) = self.json() {
            j.key("out_of_bounds");
            j.start_object();
            j.key_int("count", errors as i64);
            j.key("okay");
            j.bool(errors == 0);
            j.finish_object();
            j.key("average_bus_bandwidth");
            j.start_object();
            j.key("bandwidth");
            j.double(avg);
            j.key("okay");
            match min_bw {
                None => j.str("unchecked"),
                Some(_) => j.bool(bandwidth_ok),
            }
            j.finish_object();
        }
        self.extras()?;
        // finalizeFooter, then writeErrors (no engine error string: an empty line and list).
        self.p("#");
        self.p("");
        if let Some(j) = self.json() {
            j.key("errors");
            j.start_list();
            j.finish_list();
        }
        Ok(BenchReport {
            rows: std::mem::take(&mut self.rows),
            errors,
            avg_busbw_gbs: avg,
            bandwidth_ok,
        })
    }

    /// The tests nccl-tests' `*RunTest` runs, in its order: every dtype, then (for the
    /// collectives that take one) every reduction, then (broadcast and reduce with `-r -1`)
    /// every root. With `-d all` or `-o all`, what the engine does not run is skipped (said in
    /// a `#` line).
    fn tests(&mut self, caps: Option<unihal_hal::CclCaps>) -> Vec<Test> {
        let o = self.o;
        // nccl-tests prints the reduction of these (sendrecv too, though it reduces nothing).
        let named_redop = matches!(
            o.op,
            CollectiveOp::AllReduce
                | CollectiveOp::ReduceScatter
                | CollectiveOp::Reduce
                | CollectiveOp::SendRecv
        );
        let redops: Vec<ReduceOp> = if named_redop {
            o.redops.clone()
        } else {
            o.redops[..1].to_vec()
        };
        let rooted = matches!(o.op, CollectiveOp::Broadcast | CollectiveOp::Reduce);
        let roots: Vec<usize> = match (rooted, o.root) {
            (true, None) => (0..self.n).collect(),
            (true, Some(r)) => vec![r],
            (false, _) => vec![0],
        };
        let mut tests = Vec::new();
        let mut skipped = Vec::new();
        for &d in &o.dtypes {
            for &red in &redops {
                let runs = caps
                    .as_ref()
                    .is_none_or(|c| c.supports(o.op, d, o.op.reduces().then_some(red)));
                if !runs && (o.every_dtype || o.every_redop) {
                    skipped.push(if o.op.reduces() {
                        format!("{}/{}", nccl_type_name(d), red.name())
                    } else {
                        nccl_type_name(d).to_string()
                    });
                    continue;
                }
                for &root in &roots {
                    tests.push(Test {
                        dtype: d,
                        redop: red,
                        redop_name: if named_redop { red.name() } else { "none" },
                        root,
                        root_printed: if rooted { root as i64 } else { -1 },
                    });
                }
            }
        }
        if !skipped.is_empty() {
            self.p(&format!(
                "# Skipped (the engine does not run them): {}",
                skipped.join(", ")
            ));
        }
        tests
    }

    /// unihal's own lines after the footer, each starting with `#`.
    fn extras(&mut self) -> Result<()> {
        let o = self.o;
        // (Not with -C: its times are enqueue times.)
        if let (CollectiveOp::AllReduce, Some(last), false, false) =
            (o.op, self.rows.last(), self.spmd, o.report_cputime)
        {
            // What the in-process algorithm really moves, all ranks together: each rank reads its
            // chunk from every rank and writes it (S + S/n), then copies the n-1 other chunks
            // (2(n-1)S/n): (3n-1)S in all, against a plain copy (read + write) measured now.
            let s = last.size as f64;
            let nn = self.n as f64;
            let moved = s * (3.0 * nn - 1.0);
            let moved_bw = moved / (last.out_of_place.time_us * 1e-6) / 1e9;
            let copy_bw = plain_copy_gbs(last.size as usize);
            let line = format!("# Bytes moved by the algorithm at {} B: {:.0} B, {:.2} GB/s; plain memory copy (read+write): {:.2} GB/s; ratio {:.2}", last.size, moved, moved_bw, copy_bw, moved_bw / copy_bw);
            self.p(&line);
        }
        #[cfg(feature = "mpi")]
        if self.spmd && o.op == CollectiveOp::AllReduce && unihal_cpu::ccl::mpi::selected() {
            let rows = self.rows.clone();
            mpi_comparison(o, &self.ranks[0], &rows, self.out)?;
        }
        Ok(())
    }
}

/// The engine's capabilities, for `-d all` and `-o all` to skip what it does not run.
fn engine_caps(backend: &dyn unihal_hal::Backend) -> Option<unihal_hal::CclCaps> {
    backend.collectives().map(|c| c.capabilities().clone())
}

/// Medians, over `ROUNDS` interleaved rounds, of the slowest rank's time per all_reduce through
/// unihal's MPI engine and through a direct `MPI_Allreduce`, out of place on the same buffers;
/// every line starts with `#`.
#[cfg(feature = "mpi")]
fn mpi_comparison(
    o: &BenchOptions,
    k: &Rank,
    rows: &[BenchRow],
    out: &mut dyn std::io::Write,
) -> Result<()> {
    const ROUNDS: usize = 5;
    let _ = writeln!(
        out,
        "# unihal MPI engine vs direct MPI_Allreduce (out-of-place, same buffers, slowest rank, median of {ROUNDS} interleaved rounds of {} iters)",
        o.iters
    );
    let _ = writeln!(
        out,
        "# {:>10} {:>8} {:>6} {:>12} {:>12} {:>8}",
        "size", "type", "redop", "unihal(us)", "direct(us)", "ratio"
    );
    for row in rows {
        let (Some(dtype), Some(redop)) = (
            dtype_by_name(&row.dtype),
            ReduceOp::ALL.into_iter().find(|r| r.name() == row.redop),
        ) else {
            continue;
        };
        let c = row.count;
        let (mut ours, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let t0 = Instant::now();
            for _ in 0..o.iters {
                k.comm
                    .all_reduce(&k.send, &k.recv, c, dtype, redop, &k.stream)?;
            }
            k.stream.synchronize()?;
            let t = t0.elapsed().as_secs_f64() / o.iters as f64;
            ours.push(world_reduce(k, t, ReduceOp::Max)?);
            let t0 = Instant::now();
            for _ in 0..o.iters {
                unihal_cpu::ccl::mpi::direct_all_reduce(&k.send, &k.recv, c, dtype, redop)?;
            }
            let t = t0.elapsed().as_secs_f64() / o.iters as f64;
            direct.push(world_reduce(k, t, ReduceOp::Max)?);
        }
        let (a, b) = (median(ours), median(direct));
        let _ = writeln!(
            out,
            "# {:>10} {:>8} {:>6} {:>12.2} {:>12.2} {:>8.3}",
            row.size,
            row.dtype,
            row.redop,
            a * 1e6,
            b * 1e6,
            b / a
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_formats_match_printf() {
        assert_eq!(c_g(0.0), "0");
        assert_eq!(c_g(12.5), "12.5");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(c_g(0.000123456), "0.000123456");
        assert_eq!(c_g(0.0000123), "1.23e-05");
        assert_eq!(c_g(100000.0), "100000");
        assert_eq!(c_g(3.0), "3");
        assert_eq!(float_str(12.345, 7), "  12.35");
        assert_eq!(float_str(123456.7, 7), " 123457");
        assert_eq!(float_str(12345.67, 7), "12345.7");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(1234567.0, 6), " 1e+06");
        assert_eq!(c_exp(1.5e-7, 1), "1.5e-07");
    }

    #[test]
    fn geometry_follows_nccl_tests() {
        // all_gather.cu: base = (count/nranks) & ~(16/eltSize - 1).
        let g = Geometry::of(CollectiveOp::AllGather, 1024, 4, 3);
        assert_eq!((g.count, g.send, g.recv, g.size(4)), (84, 84, 252, 1008));
        let g = Geometry::of(CollectiveOp::ReduceScatter, 4096, 4, 4);
        assert_eq!((g.count, g.send, g.recv, g.size(4)), (256, 1024, 256, 4096));
        let g = Geometry::of(CollectiveOp::AllToAll, 4096, 8, 4);
        assert_eq!((g.count, g.size(8)), (128, 4096));
        let g = Geometry::of(CollectiveOp::AllReduce, 1026, 4, 4);
        assert_eq!((g.count, g.size(4)), (256, 1024));
    }

    #[test]
    fn json_writer_spells_as_nccl_tests() {
        let mut j = Json::default();
        j.start_object();
        j.key_int("version", 3);
        j.key("l");
        j.start_list();
        j.str("a/b\"c");
        j.double(1.5);
        j.double(f64::NAN);
        j.finish_list();
        j.key("b");
        j.bool(true);
        j.key("open");
        j.start_list();
        j.start_object();
        j.key("k");
        j.finalize();
        assert_eq!(
            j.s,
            r#"{"version":3,"l":["a\/b\"c",1.500000,"nan"],"b":"true","open":[{"k":null}]}"#
        );
        assert_eq!(sanitize_json("ab\u{1}cd"), "ab");
    }

    #[test]
    fn sizes_parse_as_parsesize() {
        assert_eq!(parse_size("1K"), Some(1024));
        assert_eq!(parse_size("0.5M"), Some(512 << 10));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("1X"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(nccl_version("NCCL 2.30.7"), 23007);
        assert_eq!(nccl_version("unihal-cpu in-process"), 0);
    }

    #[test]
    fn utc_time_is_formatted() {
        let s = now_string();
        assert_eq!(s.len(), 19, "{s}");
        assert_eq!(&s[4..5], "-");
        assert_eq!(&s[13..14], ":");
    }
}
