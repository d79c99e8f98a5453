//! nccl-tests' command line (`common.cu`'s `getopt_long` table): the flags, their defaults,
//! the names of types, reductions and collectives, and what the run can honour.

use super::*;
use std::path::PathBuf;
use std::time::Duration;
use unihal_hal::Invalid;

/// The refusal of `value` for `arg`, saying what is accepted and why.
pub(crate) fn refuse(
    arg: &'static str,
    value: impl Into<String>,
    accepted: impl Into<String>,
) -> HalError {
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
    pub(crate) fn alloc_bytes(&self) -> Option<u64> {
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
