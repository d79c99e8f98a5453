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

use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{
    Buffer, CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError, Invalid,
    ReduceOp, Result, Stream,
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

/// The refusal of `value` for `arg`, saying what is accepted and why.
fn refuse(arg: &'static str, value: impl Into<String>, accepted: impl Into<String>) -> HalError {
    HalError::invalid(
        arg,
        Invalid::Value {
            value: value.into(),
            accepted: accepted.into(),
        },
    )
}

/// The collective named `name` (`all_reduce`, `allreduce`, `all_reduce_perf`, ...).
///
/// # Errors
/// [`HalError::InvalidArgument`] listing the collectives `unihal bench` runs (and saying so
/// when the name is an nccl-tests benchmark unihal has no counterpart of).
pub fn parse_collective(name: &str) -> Result<CollectiveOp> {
    let n = name.strip_suffix("_perf").unwrap_or(name);
    let op = match n {
        "all_reduce" | "allreduce" => Some(CollectiveOp::AllReduce),
        "all_gather" | "allgather" => Some(CollectiveOp::AllGather),
        "reduce_scatter" | "reducescatter" => Some(CollectiveOp::ReduceScatter),
        "broadcast" => Some(CollectiveOp::Broadcast),
        "reduce" => Some(CollectiveOp::Reduce),
        "alltoall" | "all_to_all" => Some(CollectiveOp::AllToAll),
        "sendrecv" => Some(CollectiveOp::SendRecv),
        _ => None,
    };
    op.ok_or_else(|| {
        let valid = COLLECTIVES.map(|c| c.0).join(", ");
        let extra = if matches!(n, "gather" | "scatter" | "alltoallv" | "hypercube") {
            format!(" (nccl-tests' {n}_perf has no unihal bench counterpart)")
        } else {
            String::new()
        };
        refuse(
            "op",
            format!("collective {name:?}"),
            format!("one of {valid}{extra}"),
        )
    })
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

/// The dtype named `name`, by nccl-tests' name (`float`) or unihal's (`f32`).
pub fn dtype_by_name(name: &str) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|d| nccl_type_name(*d) == name || d.name() == name)
}

/// `-d`'s value: one type, or every type of [`NCCL_TYPES`] for `all`.
///
/// # Errors
/// [`HalError::InvalidArgument`] naming `-d` for nccl-tests' fp8 types (unihal has none) and
/// unknown names (listing the valid ones).
pub fn parse_datatypes(name: &str) -> Result<Vec<DType>> {
    if name == "all" {
        return Ok(NCCL_TYPES.to_vec());
    }
    if let Some(d) = dtype_by_name(name) {
        return Ok(vec![d]);
    }
    let valid: Vec<&str> = NCCL_TYPES
        .iter()
        .map(|d| nccl_type_name(*d))
        .chain(["int16", "bool", "all"])
        .collect();
    let why = if matches!(name, "f8e4m3" | "f8e5m2") {
        "; unihal has no fp8 dtype"
    } else {
        ""
    };
    Err(refuse(
        "-d/--datatype",
        format!("datatype {name:?}"),
        format!("one of {}{why}", valid.join(", ")),
    ))
}

/// `-o`'s value: one reduction, or every reduction of [`NCCL_OPS`] for `all`.
///
/// # Errors
/// [`HalError::InvalidArgument`] naming `-o` for `mulsum` (nccl-tests' `ncclRedOpCreatePreMulSum`
/// reduction, which unihal's collectives do not have) and unknown names (listing the valid ones).
pub fn parse_redops(name: &str) -> Result<Vec<ReduceOp>> {
    if name == "all" {
        return Ok(NCCL_OPS.to_vec());
    }
    if let Some(r) = ReduceOp::ALL.into_iter().find(|r| r.name() == name) {
        return Ok(vec![r]);
    }
    let why = if name == "mulsum" {
        "; mulsum (NCCL's premultiplied sum, ncclRedOpCreatePreMulSum) is not a unihal reduction"
    } else {
        ""
    };
    Err(refuse(
        "-o/--op",
        format!("reduction {name:?}"),
        format!("one of sum, prod, max, min, avg, all{why}"),
    ))
}

/// Parses a size as nccl-tests' `parsesize` does: a number (decimals allowed) with an optional
/// `K`, `M` or `G` suffix (powers of 1024, either case). `None` for anything else.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let num = num.trim();
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mul);
    }
    let f: f64 = num.parse().ok()?;
    if !f.is_finite() || f < 0.0 || num.starts_with(['+', '-']) {
        return None;
    }
    // Saturates above u64::MAX; the size checks then refuse it.
    Some((f * mul as f64) as u64)
}

/// nccl-tests' command-line flags (`common.cu`'s `longopts` and `getopt_long` string), with its
/// defaults, as given on the command line; [`NcclFlags::options`] checks them.
#[derive(Debug, Clone, clap::Args)]
pub struct NcclFlags {
    /// Threads per process (only 1: unihal bench drives every rank of a process from one thread).
    #[arg(
        short = 't',
        long = "nthreads",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub nthreads: i64,
    /// Ranks (devices) of this process; 0 = every device (under a launcher: one per process).
    #[arg(
        short = 'g',
        long = "ngpus",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub ngpus: i64,
    /// Minimum size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M")]
    pub minbytes: String,
    /// Maximum size in bytes (K/M/G suffixes).
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    pub maxbytes: String,
    /// Size increment when the step factor is 1 or less (K/M/G suffixes).
    #[arg(short = 'i', long = "stepbytes", default_value = "1M")]
    pub stepbytes: String,
    /// Size step factor (more than 1: multiply; else add -i).
    #[arg(
        short = 'f',
        long = "stepfactor",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub stepfactor: i64,
    /// Timed iterations per size.
    #[arg(
        short = 'n',
        long = "iters",
        default_value_t = 20,
        allow_negative_numbers = true
    )]
    pub iters: i64,
    /// Calls per timed iteration (aggregated iterations).
    #[arg(
        short = 'm',
        long = "agg_iters",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub agg_iters: i64,
    /// Warm-up iterations (every size from -b to -e by factors of 2, before the timed runs).
    #[arg(
        short = 'w',
        long = "warmup_iters",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub warmup_iters: i64,
    /// Times to run the whole size sweep (0 = until interrupted).
    #[arg(
        short = 'N',
        long = "run_cycles",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub run_cycles: i64,
    /// Parallel initialisation by several threads (only 0).
    #[arg(
        short = 'p',
        long = "parallel_init",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub parallel_init: i64,
    /// Check iterations (0 = no check; #wrong prints N/A).
    #[arg(
        short = 'c',
        long = "check",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub check: i64,
    /// Reduction: sum, prod, max, min, avg or all.
    #[arg(short = 'o', long = "op", value_name = "OP", default_value = "sum")]
    pub redop: String,
    /// Data type (nccl-tests' names: int8, uint8, int32, uint32, int64, uint64, half, float,
    /// double, bfloat16; or unihal's: f32, ...; or all).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub datatype: String,
    /// Root rank of broadcast and reduce (-1 = every rank in turn).
    #[arg(
        short = 'r',
        long = "root",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub root: i64,
    /// 0 = no wait; 1 = wait and barrier after each call; 2 = wait after each call; 3 = wait
    /// and barrier after each timed iteration, barrier not timed.
    #[arg(
        short = 'z',
        long = "blocking",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub blocking: i64,
    /// Collectives on the NULL stream (only 0).
    #[arg(
        short = 'y',
        long = "stream_null",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub stream_null: i64,
    /// Seconds a collective may wait for its peers before the run fails (0 = the default).
    #[arg(
        short = 'T',
        long = "timeout",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub timeout: i64,
    /// CUDA graph launches (only 0).
    #[arg(
        short = 'G',
        long = "cudagraph",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub cudagraph: i64,
    /// Report the host time to enqueue the calls (cputime) instead of their completion time.
    #[arg(
        short = 'C',
        long = "report_cputime",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub report_cputime: i64,
    /// Append a timestamp to each row.
    #[arg(
        short = 'S',
        long = "report_timestamps",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub report_timestamps: i64,
    /// Also write nccl-tests' JSON document to this file (its name must end in .json).
    #[arg(short = 'J', long = "output_file")]
    pub output_file: Option<PathBuf>,
    /// Time reported over ranks: 0 = rank 0's, 1 = average, 2 = minimum, 3 = maximum.
    #[arg(
        short = 'a',
        long = "average",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub average: i64,
    /// Buffer registration (only 0).
    #[arg(
        short = 'R',
        long = "local_register",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub local_register: i64,
    /// NCCL CTA policy (not supported).
    #[arg(short = 'x', long = "cta_policy", allow_negative_numbers = true)]
    pub cta_policy: Option<i64>,
    /// NCCL device implementation (only 0).
    #[arg(
        short = 'D',
        long = "device_implementation",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub device_implementation: i64,
    /// CTAs of the device implementation (not supported).
    #[arg(short = 'V', long = "device_cta_count", allow_negative_numbers = true)]
    pub device_cta_count: Option<i64>,
    /// GPU memory usage report (only 0).
    #[arg(
        short = 'M',
        long = "memory",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub memory: i64,
    /// Misalign the buffers by this many elements.
    #[arg(
        short = 'u',
        long = "unalign",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub unalign: i64,
    /// Per-iteration event timing (only 0).
    #[arg(
        short = 'I',
        long = "per_iter_timing",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub per_iter_timing: i64,
    /// Leading iterations the per-iteration summary skips (only 0: needs -I).
    #[arg(
        short = 'K',
        long = "per_iter_skip",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub per_iter_skip: i64,
}

impl NcclFlags {
    /// The options of a run of collective `op` (a name [`parse_collective`] knows) with these
    /// flags; `argv` is what the JSON file records as the command line.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming the flag, its value and why, for what unihal bench
    /// cannot honour (`-t` above 1, `-G`, `-R`, `-x`, `-D`, `-V`, `-M`, `-I`, `-K`, `-y`, `-p`,
    /// `-J` without `.json`), values outside nccl-tests' range, unknown names and sizes; then
    /// the checks of [`BenchOptions::check_sizes`].
    pub fn options(&self, op: &str, argv: Vec<String>) -> Result<BenchOptions> {
        let op = parse_collective(op)?;
        let unsupported = |arg: &'static str, v: i64, what: &str| {
            refuse(
                arg,
                format!("{v}"),
                format!("0: {what} is not supported by unihal bench"),
            )
        };
        let at_least = |arg: &'static str, v: i64, min: i64, what: &str| -> Result<usize> {
            if v < min {
                return Err(refuse(arg, format!("{v} {what}"), format!("{min} or more")));
            }
            Ok(v as usize)
        };
        let one_of = |arg: &'static str,
                      v: i64,
                      range: std::ops::RangeInclusive<i64>,
                      meaning: &str|
         -> Result<u8> {
            if !range.contains(&v) {
                return Err(refuse(arg, format!("{v}"), meaning.to_string()));
            }
            Ok(v as u8)
        };
        if self.nthreads != 1 {
            return Err(refuse(
                "-t/--nthreads",
                format!("{} threads", self.nthreads),
                "1: unihal bench drives every rank of a process from one thread (nccl-tests' -t \
                 runs a thread per group of -g GPUs; use -g, or one process per rank under a \
                 launcher)",
            ));
        }
        if self.cudagraph != 0 {
            return Err(unsupported(
                "-G/--cudagraph",
                self.cudagraph,
                "launching the calls as CUDA graphs",
            ));
        }
        if self.local_register != 0 {
            return Err(unsupported(
                "-R/--local_register",
                self.local_register,
                "registering the buffers with the communicator (ncclCommRegister, symmetric windows)",
            ));
        }
        if let Some(x) = self.cta_policy {
            return Err(refuse(
                "-x/--cta_policy",
                format!("{x}"),
                "no value: NCCL's CTA policy is not supported by unihal bench",
            ));
        }
        if self.device_implementation != 0 {
            return Err(unsupported(
                "-D/--device_implementation",
                self.device_implementation,
                "an NCCL device-API implementation",
            ));
        }
        if let Some(v) = self.device_cta_count {
            return Err(refuse(
                "-V/--device_cta_count",
                format!("{v}"),
                "no value: the CTA count of an NCCL device-API implementation (-D) is not \
                 supported by unihal bench",
            ));
        }
        if self.memory != 0 {
            return Err(unsupported(
                "-M/--memory",
                self.memory,
                "the GPU memory usage report",
            ));
        }
        if self.per_iter_timing != 0 {
            return Err(unsupported(
                "-I/--per_iter_timing",
                self.per_iter_timing,
                "per-iteration event timing",
            ));
        }
        if self.per_iter_skip != 0 {
            return Err(unsupported(
                "-K/--per_iter_skip",
                self.per_iter_skip,
                "skipping iterations of the per-iteration summary (it needs -I 1)",
            ));
        }
        if self.stream_null != 0 {
            return Err(unsupported(
                "-y/--stream_null",
                self.stream_null,
                "running on the NULL stream (unihal streams are always created streams)",
            ));
        }
        if self.parallel_init != 0 {
            return Err(unsupported(
                "-p/--parallel_init",
                self.parallel_init,
                "initialising the communicators from several threads (it needs -t above 1)",
            ));
        }
        if let Some(p) = &self.output_file {
            let json = p
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("json"));
            if !json {
                return Err(refuse(
                    "-J/--output_file",
                    format!("{}", p.display()),
                    "a file name ending in .json: nccl-tests infers the output type from the \
                     suffix and writes JSON only",
                ));
            }
        }
        let size = |arg: &'static str, s: &str| {
            parse_size(s).ok_or_else(|| {
                refuse(
                    arg,
                    format!("size {s:?}"),
                    "a number of bytes with an optional K, M or G suffix",
                )
            })
        };
        let root = match self.root {
            -1 => None,
            r if r >= 0 => Some(r as usize),
            r => {
                return Err(refuse(
                    "-r/--root",
                    format!("root {r}"),
                    "a rank, or -1 for every rank in turn",
                ))
            }
        };
        let o = BenchOptions {
            op,
            min_bytes: size("-b/--minbytes", &self.minbytes)?,
            max_bytes: size("-e/--maxbytes", &self.maxbytes)?,
            step_bytes: size("-i/--stepbytes", &self.stepbytes)?,
            step_factor: self.stepfactor.max(0) as u64,
            iters: at_least("-n/--iters", self.iters, 1, "iterations")?,
            agg_iters: at_least("-m/--agg_iters", self.agg_iters, 1, "aggregated iterations")?,
            warmup: at_least(
                "-w/--warmup_iters",
                self.warmup_iters,
                0,
                "warm-up iterations",
            )?,
            run_cycles: at_least("-N/--run_cycles", self.run_cycles, 0, "cycles")?,
            check: at_least("-c/--check", self.check, 0, "check iterations")?,
            dtypes: parse_datatypes(&self.datatype)?,
            every_dtype: self.datatype == "all",
            redops: parse_redops(&self.redop)?,
            every_redop: self.redop == "all",
            root,
            ranks: at_least("-g/--ngpus", self.ngpus, 0, "GPUs")?,
            blocking: one_of(
                "-z/--blocking",
                self.blocking,
                0..=3,
                "0 (no wait), 1 (wait and barrier after each call), 2 (wait after each call) \
                 or 3 (wait and barrier after each timed iteration)",
            )?,
            average: one_of(
                "-a/--average",
                self.average,
                0..=3,
                "0 (rank 0's time), 1 (average), 2 (minimum) or 3 (maximum over ranks)",
            )?,
            report_cputime: self.report_cputime != 0,
            report_timestamps: self.report_timestamps != 0,
            timeout: match at_least("-T/--timeout", self.timeout, 0, "seconds")? {
                0 => None,
                s => Some(Duration::from_secs(s as u64)),
            },
            unalign: at_least("-u/--unalign", self.unalign, 0, "elements")?,
            output_file: self.output_file.clone(),
            argv,
        };
        o.check_sizes()?;
        Ok(o)
    }
}

/// Options of a run, named as nccl-tests names them.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The collective.
    pub op: CollectiveOp,
    /// `-b`: the first size.
    pub min_bytes: u64,
    /// `-e`: the last size.
    pub max_bytes: u64,
    /// `-i`: the size increment when `step_factor` is 1 or less.
    pub step_bytes: u64,
    /// `-f`: the size factor (more than 1: sizes multiply; else `step_bytes` adds).
    pub step_factor: u64,
    /// `-n`: timed iterations.
    pub iters: usize,
    /// `-m`: calls per timed iteration.
    pub agg_iters: usize,
    /// `-w`: warm-up iterations per size.
    pub warmup: usize,
    /// `-N`: sweeps over the sizes (0: until interrupted).
    pub run_cycles: usize,
    /// `-c`: check iterations (0: no check).
    pub check: usize,
    /// `-d`: the dtypes, in order.
    pub dtypes: Vec<DType>,
    /// `-d all`: dtypes the engine does not run for this collective are skipped.
    pub every_dtype: bool,
    /// `-o`: the reductions, in order (only the first for collectives that do not reduce).
    pub redops: Vec<ReduceOp>,
    /// `-o all`: reductions the engine does not run are skipped.
    pub every_redop: bool,
    /// `-r`: the root of broadcast and reduce (`None`: every rank in turn).
    pub root: Option<usize>,
    /// `-g`: ranks of this process (0: every device; under a launcher 0 or 1).
    pub ranks: usize,
    /// `-z`: 0 to 3, as nccl-tests.
    pub blocking: u8,
    /// `-a`: 0 rank 0's time, 1 average, 2 minimum, 3 maximum over ranks.
    pub average: u8,
    /// `-C`: report the time to enqueue instead of the time to complete.
    pub report_cputime: bool,
    /// `-S`: a timestamp at the end of each row.
    pub report_timestamps: bool,
    /// `-T`: the communicators' timeout (`None`: the default).
    pub timeout: Option<Duration>,
    /// `-u`: buffers misaligned by this many elements.
    pub unalign: usize,
    /// `-J`: nccl-tests' JSON document goes to this file.
    pub output_file: Option<PathBuf>,
    /// The command line the JSON document records.
    pub argv: Vec<String>,
}

impl BenchOptions {
    /// nccl-tests' defaults for collective `op` (`-b 32M -e 32M -i 1M -f 1 -n 20 -w 1 -c 1 -d
    /// float -o sum -r 0 -a 1`), over every device.
    pub fn new(op: CollectiveOp) -> BenchOptions {
        BenchOptions {
            op,
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_bytes: 1 << 20,
            step_factor: 1,
            iters: 20,
            agg_iters: 1,
            warmup: 1,
            run_cycles: 1,
            check: 1,
            dtypes: vec![DType::F32],
            every_dtype: false,
            redops: vec![ReduceOp::Sum],
            every_redop: false,
            root: Some(0),
            ranks: 0,
            blocking: 0,
            average: 1,
            report_cputime: false,
            report_timestamps: false,
            timeout: None,
            unalign: 0,
            output_file: None,
            argv: Vec::new(),
        }
    }

    /// Refuses sizes the run could not honour: a minimum above the maximum, a largest buffer
    /// that cannot be allocated, a size sweep that would never end (no step).
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming the flag (`-b`, `-e`, `-i`, `-f`).
    pub fn check_sizes(&self) -> Result<()> {
        if self.min_bytes > self.max_bytes {
            return Err(refuse(
                "-b/--minbytes",
                format!("minimum {} bytes", self.min_bytes),
                format!("at most the maximum (-e) {} bytes", self.max_bytes),
            ));
        }
        // The buffers hold the largest size of the widest dtype, misaligned by -u elements (an
        // unchecked sum wrapped to 0 in release builds, and the run then failed on a misleading
        // range check).
        let limit = isize::MAX as u64;
        if self.alloc_bytes().is_none_or(|b| b > limit) {
            return Err(refuse(
                "-e/--maxbytes",
                format!("maximum {} bytes", self.max_bytes),
                format!("at most {limit} bytes (one buffer)"),
            ));
        }
        if self.min_bytes < self.max_bytes {
            if self.step_factor <= 1 && self.step_bytes == 0 {
                return Err(refuse(
                    "-i/--stepbytes",
                    "a step of 0 bytes".to_string(),
                    "1 or more when -b and -e differ and -f is 1 or less",
                ));
            }
            if self.step_factor > 1 && self.min_bytes == 0 {
                return Err(refuse(
                    "-b/--minbytes",
                    "0 bytes with a step factor".to_string(),
                    "1 or more when -f is above 1 (0 times the factor never grows)",
                ));
            }
        }
        Ok(())
    }

    /// Bytes of each rank's send and receive allocation: the largest size rounded up to 8,
    /// plus 8 bytes per misaligned element (nccl-tests' `AllocateBuffs`).
    fn alloc_bytes(&self) -> Option<u64> {
        self.max_bytes
            .checked_next_multiple_of(8)?
            .checked_add((self.unalign as u64).checked_mul(8)?)
            .map(|b| b.max(8))
    }

    /// Refuses what a run on `available` devices of one process could not honour: more ranks
    /// than `available` (a reader comparing with an 8-GPU figure must not get a 4-rank one), then
    /// [`BenchOptions::check_ranks`] for the ranks it would run.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming the flag (`-g`, `-r`, and those of
    /// [`BenchOptions::check_sizes`]).
    pub fn validate(&self, available: usize) -> Result<()> {
        if self.ranks > available {
            return Err(refuse(
                "-g/--ngpus",
                format!("{} ranks", self.ranks),
                format!("at most the {available} device(s) the backend has"),
            ));
        }
        self.check_ranks(if self.ranks == 0 {
            available
        } else {
            self.ranks
        })
    }

    /// Refuses a root outside `n` ranks, then [`BenchOptions::check_sizes`].
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming the flag.
    pub fn check_ranks(&self, n: usize) -> Result<()> {
        if let (CollectiveOp::Broadcast | CollectiveOp::Reduce, Some(r)) = (self.op, self.root) {
            if r >= n {
                return Err(refuse(
                    "-r/--root",
                    format!("root {r}"),
                    format!("a rank below {n}, or -1 for every rank in turn"),
                ));
            }
        }
        self.check_sizes()
    }
}

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
fn bandwidth(op: CollectiveOp, g: &Geometry, esz: u64, sec: f64, n: usize) -> (f64, f64) {
    let bytes = match op {
        CollectiveOp::AllGather | CollectiveOp::ReduceScatter | CollectiveOp::AllToAll => {
            g.count * esz * n as u64
        }
        _ => g.count * esz,
    };
    let alg = bytes as f64 / 1e9 / sec;
    (alg, alg * busbw_factor(op, n))
}

struct Rank {
    comm: Arc<dyn Communicator>,
    stream: Arc<dyn Stream>,
    send: Buffer,
    recv: Buffer,
}

/// One element of `d` holding `v`.
fn element(d: DType, v: f64) -> Vec<u8> {
    unihal_hal::Scalar::F64(v).bits(d).to_le_bytes()[..d.size()].to_vec()
}

/// One element of integer dtype `d` holding `v` wrapped to its width (two's complement).
fn int_element(d: DType, v: i128) -> Vec<u8> {
    (v as u128).to_le_bytes()[..d.size()].to_vec()
}

/// `v` wrapped to integer dtype `d`'s width, as that dtype reads it.
fn wrap_int(d: DType, v: i128) -> i128 {
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
struct Test {
    dtype: DType,
    redop: ReduceOp,
    /// The printed reduction (`none` for collectives nccl-tests runs without one).
    redop_name: &'static str,
    root: usize,
    /// The printed root (-1 for collectives without one).
    root_printed: i64,
}

/// The element rank `r` holds at index `i` of its result, or `None` where nothing is defined,
/// when rank k's data is k+1 everywhere and the per-rank count is `c`.
fn expected(op: CollectiveOp, t: &Test, n: usize, r: usize, i: u64, c: u64) -> Option<Vec<u8>> {
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
enum Placement {
    OutOfPlace,
    InPlace,
}

/// A rank's record in the "Using devices" list.
#[derive(Debug, Clone)]
struct RankInfo {
    rank: usize,
    pid: u32,
    host: String,
    device: usize,
    device_id: String,
    name: String,
}

impl RankInfo {
    /// nccl-tests' line (`util.cu`'s `writeDeviceReport`), with the device's id in place of
    /// the PCI bus id.
    fn line(&self) -> String {
        format!(
            "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device {:2} [{}] {}",
            self.rank, 0, self.pid, self.host, self.device, self.device_id, self.name
        )
    }

    /// The fixed-size record of this rank that an all_gather carries to rank 0.
    fn record(&self) -> [u8; RECORD] {
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
    fn from_record(rank: usize, rec: &[u8]) -> RankInfo {
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

/// Bytes of one rank's "Using devices" record (nccl-tests' `MAX_LINE`).
const RECORD: usize = 2048;

/// The host name as nccl-tests' `getHostName` gives it: up to the first dot.
fn host_name() -> String {
    let host = &unihal_hal::ccl::process_tag().host;
    host.split('.').next().unwrap_or(host).to_string()
}

/// The time now as nccl-tests formats it (`%Y-%m-%d %H:%M:%S`), in UTC.
fn now_string() -> String {
    unihal_hal::clock::UtcDateTime::from_unix(unihal_hal::clock::unix_now_s()).format(' ')
}

/// C's `%.{prec}e`: the exponent with a sign and at least two digits.
fn c_exp(v: f64, prec: usize) -> String {
    if !v.is_finite() {
        return c_nonfinite(v);
    }
    let s = format!("{v:.prec$e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// C's spelling of an infinite or NaN double.
fn c_nonfinite(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// C's `%g` (six significant digits, trailing zeros removed).
pub fn c_g(v: f64) -> String {
    if !v.is_finite() {
        return c_nonfinite(v);
    }
    if v == 0.0 {
        return "0".into();
    }
    let strip = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let e = format!("{v:.5e}");
    let x: i32 = e
        .split_once('e')
        .and_then(|(_, x)| x.parse().ok())
        .unwrap_or(0);
    if (-4..6).contains(&x) {
        strip(format!("{v:.*}", (5 - x) as usize))
    } else {
        let s = c_exp(v, 5);
        let (m, rest) = s.split_once('e').unwrap_or((&s, ""));
        format!("{}e{rest}", strip(m.to_string()))
    }
}

/// nccl-tests' `getFloatStr`: `value` in `width` characters, with 2, 1 or 0 decimals, else in
/// exponent form.
pub fn float_str(value: f64, width: usize) -> String {
    for prec in [2usize, 1, 0] {
        let s = format!("{value:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = format!("{:>width$}", c_exp(value, if width >= 7 { 1 } else { 0 }));
    s.chars().take(width).collect()
}

/// nccl-tests' `sanitizeJson`: `"`, `\`, `/`, tab and newline escaped; the text stops at the
/// first other control or non-ASCII character, or at 2047 characters.
fn sanitize_json(s: &str) -> String {
    const LIM: usize = 2048;
    let mut out = String::new();
    for ch in s.chars() {
        if out.len() + 1 >= LIM {
            break;
        }
        match ch {
            '"' | '\\' | '/' | '\t' | '\n' => {
                if out.len() + 2 > LIM {
                    break;
                }
                out.push('\\');
                out.push(match ch {
                    '\n' => 'n',
                    '\t' => 't',
                    c => c,
                });
            }
            c if (c as u32) >= 0x7F || (c as u32) <= 0x1F => break,
            c => out.push(c),
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonState {
    Key,
    ObjectEmpty,
    ObjectSome,
    ListEmpty,
    ListSome,
}

/// nccl-tests' JSON writer (`util.cu`): the same calls, states and spelling, into a string.
#[derive(Debug, Default)]
struct Json {
    s: String,
    states: Vec<JsonState>,
}

impl Json {
    fn key(&mut self, name: &str) {
        match self.states.last_mut() {
            Some(st @ JsonState::ObjectEmpty) => *st = JsonState::ObjectSome,
            Some(JsonState::ObjectSome) => self.s.push(','),
            _ => debug_assert!(false, "a JSON key outside an object"),
        }
        self.s.push('"');
        self.s.push_str(&sanitize_json(name));
        self.s.push_str("\":");
        self.states.push(JsonState::Key);
    }

    fn value(&mut self) {
        match self.states.last_mut() {
            Some(st @ JsonState::ListEmpty) => *st = JsonState::ListSome,
            Some(JsonState::ListSome) => self.s.push(','),
            Some(JsonState::Key) => {
                self.states.pop();
            }
            None => {}
            _ => debug_assert!(false, "a JSON value without a key"),
        }
    }

    fn start_object(&mut self) {
        self.value();
        self.s.push('{');
        self.states.push(JsonState::ObjectEmpty);
    }

    fn finish_object(&mut self) {
        self.states.pop();
        self.s.push('}');
    }

    fn start_list(&mut self) {
        self.value();
        self.s.push('[');
        self.states.push(JsonState::ListEmpty);
    }

    fn finish_list(&mut self) {
        self.states.pop();
        self.s.push(']');
    }

    fn null(&mut self) {
        self.value();
        self.s.push_str("null");
    }

    fn str(&mut self, v: &str) {
        self.value();
        self.s.push('"');
        self.s.push_str(&sanitize_json(v));
        self.s.push('"');
    }

    /// nccl-tests writes booleans as the strings `"true"` and `"false"`.
    fn bool(&mut self, v: bool) {
        self.str(if v { "true" } else { "false" });
    }

    fn int(&mut self, v: i64) {
        self.value();
        self.s.push_str(&v.to_string());
    }

    /// `%lf` (six decimals); NaN (and, to stay JSON, an infinity) as a string.
    fn double(&mut self, v: f64) {
        if v.is_finite() {
            self.value();
            self.s.push_str(&format!("{v:.6}"));
        } else {
            self.str(&c_nonfinite(v));
        }
    }

    fn key_int(&mut self, k: &str, v: i64) {
        self.key(k);
        self.int(v);
    }

    fn key_str(&mut self, k: &str, v: &str) {
        self.key(k);
        self.str(v);
    }

    /// `jsonOutputFinalize`: `end_time` when at the top level, then every open object and list
    /// closed (a key left open gets null).
    fn finalize(&mut self) {
        if self.states.len() == 1
            && matches!(
                self.states[0],
                JsonState::ObjectEmpty | JsonState::ObjectSome
            )
        {
            self.key_str("end_time", &now_string());
        }
        while let Some(st) = self.states.last() {
            match st {
                JsonState::Key => self.null(),
                JsonState::ObjectEmpty | JsonState::ObjectSome => self.finish_object(),
                JsonState::ListEmpty | JsonState::ListSome => self.finish_list(),
            }
        }
    }
}

/// The JSON document being written and the file it goes to.
struct JsonOut {
    json: Json,
    file: std::fs::File,
}

/// Opens `path` as nccl-tests' `jsonOutputInit` does: a new file, else `path.0`, `path.1`, ...
/// when it exists; prints where the JSON goes (or why it does not) to `out`.
fn open_json(path: &std::path::Path, out: &mut dyn Write) -> Option<std::fs::File> {
    let mut tries = 0;
    let mut p = path.to_path_buf();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => {
                let _ = writeln!(out, "# Writing JSON output to {}", p.display());
                return Some(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                p = PathBuf::from(format!("{}.{tries}", path.display()));
                tries += 1;
            }
            Err(_) => {
                let _ = writeln!(
                    out,
                    "# skipping json output; {} not accessible",
                    p.display()
                );
                return None;
            }
        }
    }
}

/// The NCCL version code (`ncclGetVersion`'s, 2.30.7 → 23007) of an engine named `NCCL x.y.z`;
/// 0 for other engines.
fn nccl_version(engine: &str) -> i64 {
    let Some(v) = engine.strip_prefix("NCCL ") else {
        return 0;
    };
    let mut p = v
        .split(|c: char| !c.is_ascii_digit())
        .map(|x| x.parse::<i64>().unwrap_or(0));
    let (a, b, c) = (
        p.next().unwrap_or(0),
        p.next().unwrap_or(0),
        p.next().unwrap_or(0),
    );
    if a > 2 || (a == 2 && b >= 9) {
        a * 10_000 + b * 100 + c
    } else {
        a * 1000 + b * 100 + c
    }
}

/// nccl-tests' binary name of collective `op`.
fn program_name(op: CollectiveOp) -> String {
    let name = COLLECTIVES
        .iter()
        .find(|c| c.1 == op)
        .map_or("unknown", |c| c.0);
    format!("{name}_perf")
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
