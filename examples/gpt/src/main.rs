//! `gpt`: trains the small GPT on any backend, data-parallel over its devices or over processes.
//!
//! ```sh
//! cargo run --release -p unihal-gpt -- --backend cpu --devices 2 --dtype bf16 --steps 200
//! torchrun-style: RANK=.. WORLD_SIZE=.. LOCAL_RANK=.. MASTER_ADDR=.. MASTER_PORT=.. gpt --backend cuda
//! mpirun -n 2 target/release/gpt --backend cpu   # built with --features mpi
//! ```

use clap::Parser;
use gpt::model::AttentionImpl;
use gpt::{Corpus, StepStats, TrainConfig};
use std::process::ExitCode;
use unihal::bench::median;
use unihal::DType;

/// Train a small character-level GPT on the repository's documentation with unihal.
#[derive(Parser, Debug)]
#[command(version = unihal::BUILD_INFO)]
struct Args {
    /// Backend to run on (`unihal devices` lists them).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Devices of the backend to train on data-parallel in this process (ignored when a launcher
    /// started several processes: then each process drives device LOCAL_RANK).
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// Compute dtype: f32, bf16 or f16 (the latter two with f32 master weights and loss scaling).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Attention: fused (the `attention` op) or unfused (matmul, masked softmax, matmul).
    #[arg(long, default_value = "fused")]
    attention: String,
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Sequences per micro-batch over all ranks.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Micro-batches per step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    accum: usize,
    #[arg(long, default_value_t = 64)]
    ctx: usize,
    #[arg(long, default_value_t = 64)]
    dim: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 5e-3)]
    lr: f64,
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Gradient bucket size in KiB.
    #[arg(long, default_value_t = 64)]
    bucket_kib: usize,
    /// All-reduce the gradients after the backward pass instead of overlapping them with it.
    #[arg(long)]
    no_overlap: bool,
    /// Held-out loss every N steps (0: at the start and the end only).
    #[arg(long, default_value_t = 50)]
    eval_every: usize,
    /// Characters to generate at the end.
    #[arg(long, default_value_t = 300)]
    sample: usize,
    /// Print only the summary, not every step.
    #[arg(long)]
    quiet: bool,
    /// Write the report (configuration, every step's figures, held-out losses, sample) as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Write each rank's allocator snapshot and history at the end, pickled in PyTorch's layout
    /// (`%d` in the name becomes the device ordinal): `python -m torch.cuda._memory_viz stats
    /// FILE` reads it. `UNIHAL_MEMORY_SNAPSHOT=FILE` does the same for any run.
    #[arg(long)]
    memory_snapshot: Option<std::path::PathBuf>,
    /// Print rank 0's allocator statistics at the end as `torch.cuda.memory_summary()` prints
    /// them.
    #[arg(long)]
    memory_summary: bool,
}

fn main() -> ExitCode {
    unihal::init_logging_or_exit("gpt");
    let args = Args::parse();
    let code = match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpt: {e}");
            ExitCode::FAILURE
        }
    };
    // UNIHAL_TRACE: the run's timeline, written once its work is done.
    match unihal::layer::trace::finish() {
        Ok(Some(path)) if !args.quiet => println!("  timeline written to {}", path.display()),
        Ok(_) => {}
        Err(e) => {
            eprintln!("gpt: {e}");
            return ExitCode::FAILURE;
        }
    }
    code
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let dtype: DType = match a.dtype.as_str() {
        "f32" => DType::F32,
        "bf16" => DType::Bf16,
        "f16" => DType::F16,
        other => return Err(format!("--dtype {other}: f32, bf16 or f16").into()),
    };
    let attention = match a.attention.as_str() {
        "fused" => AttentionImpl::Fused,
        "unfused" => AttentionImpl::Unfused,
        other => return Err(format!("--attention {other}: fused or unfused").into()),
    };
    let cfg = TrainConfig {
        attention,
        ctx: a.ctx,
        dim: a.dim,
        heads: a.heads,
        layers: a.layers,
        dtype,
        steps: a.steps,
        batch: a.batch,
        accum: a.accum,
        lr: a.lr,
        seed: a.seed,
        bucket_bytes: a.bucket_kib << 10,
        overlap: !a.no_overlap,
        eval_every: a.eval_every,
        sample_len: a.sample,
        memory_snapshot: a.memory_snapshot.clone(),
        ..TrainConfig::default()
    };
    let backend = unihal::registry().get(&a.backend)?;
    let corpus = Corpus::documentation();
    let quiet = a.quiet;
    let print = move |s: &StepStats| {
        if !quiet {
            println!("{s}");
        }
    };
    let launch = gpt::launch::multi_process()?;
    let report = match &launch {
        Some(info) => gpt::launch::train_process(&*backend, info, &corpus, &cfg, &print)?,
        None => gpt::train_devices(&*backend, a.devices, &corpus, &cfg, &print)?,
    };
    let rank0 = launch.as_ref().is_none_or(|i| i.rank == 0);
    if rank0 {
        summarise(&report);
    }
    // Under UNIHAL_VALIDATE: say so, and fail a run the layer found unordered work in.
    if let Some((v, mode)) = backend
        .as_any()
        .downcast_ref::<unihal::layer::LayerBackend>()
        .and_then(|v| Some((v, v.mode()?)))
    {
        let found = v.findings();
        println!(
            "  ran under the validation layer ({} mode): {} finding(s)",
            match mode {
                unihal::layer::Mode::Report => "report",
                unihal::layer::Mode::Error => "error",
            },
            found.len()
        );
        if let Some(f) = found.first() {
            return Err(format!(
                "the validation layer made {} finding(s), the first: {f}",
                found.len()
            )
            .into());
        }
    }
    if let (Some(path), true) = (&a.json, rank0) {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    if a.memory_summary && rank0 {
        print!("{}", report.memory_summary);
    }
    Ok(())
}

fn summarise(r: &gpt::Report) {
    let m = &r.model;
    println!(
        "\nGPT: {} parameters ({} blocks, width {}, {} heads, context {}, vocabulary {}), {} in {}",
        r.parameters, m.layers, m.dim, m.heads, m.ctx, m.vocab, r.config.dtype, r.ranks
    );
    println!("  rank(s) on {}", r.devices.join(", "));
    println!(
        "  {} gradient bucket(s) of up to {} KiB, overlap {}",
        r.buckets,
        r.config.bucket_bytes >> 10,
        if r.config.overlap { "on" } else { "off" }
    );
    // Steady state: the steps after the first tenth (the first ones warm caches and allocators).
    let tail = &r.steps[r.steps.len() / 10..];
    if !tail.is_empty() {
        let tps: Vec<f64> = tail.iter().map(|s| s.tokens_per_s).collect();
        let share: Vec<f64> = tail.iter().map(StepStats::comm_share).collect();
        println!(
            "  median over steps {}..{}: {:.0} tokens/s, compute stream waiting for communication \
             {:.1}% of the step",
            tail[0].step,
            r.steps.len(),
            median(tps),
            100.0 * median(share)
        );
    }
    if let Some(s) = r.steps.last() {
        println!(
            "  allocator: peak allocated {:.2} MiB, peak reserved {:.2} MiB, {} Device::alloc calls",
            s.peak_allocated as f64 / (1 << 20) as f64,
            s.peak_reserved as f64 / (1 << 20) as f64,
            s.device_allocs
        );
    }
    let h: Vec<String> = r
        .heldout
        .iter()
        .map(|(s, l)| format!("step {s}: {l:.4}"))
        .collect();
    println!("  held-out loss: {}", h.join(", "));
    if !r.sample.is_empty() {
        println!("\nsample:\n{}", r.sample);
    }
}
