//! Training: one rank's loop ([`train_rank`]) and the data-parallel runs built from it, over the
//! devices of one process ([`train_devices`]) or one device per process ([`crate::launch`]).
//!
//! A step: for each micro-batch, forward, then backward with the loss gradient scaled by the loss
//! scale and `1 / (ranks * micro-batches)` (so summing over ranks averages); the last micro-batch's
//! backward pass starts the gradient buckets' all-reduces as they complete. Then, on the summed
//! gradients (identical on every rank, so every rank takes the same decisions without another
//! collective): AMP unscale and loss-scale update (mixed precision), global-norm clipping, and
//! AdamW on the f32 master weights, writing the compute copies in mixed precision. A step whose
//! gradients overflowed is skipped, as `torch.cuda.amp.GradScaler` does.

use crate::data::{Corpus, Rng};
use crate::exec::Exec;
use crate::model::{AttentionImpl, Layout, Model, ModelConfig};
use crate::reducer::Reducer;
use crate::Error;
use std::sync::Arc;
use std::time::Instant;
use unihal::{
    AdamWOptions, Backend, CollectiveOp, CommConfig, Communicator, DType, Device, EventFlags,
    OpCall, OpId, ParamGroup, ReduceOp, Scalar, TensorView,
};

/// Steps of the learning rate's linear warm-up (whatever the run's length, so short runs follow
/// the same schedule as long ones).
pub const WARMUP_STEPS: usize = 20;

/// Everything a run needs besides its devices.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainConfig {
    pub ctx: usize,
    pub dim: usize,
    pub heads: usize,
    pub layers: usize,
    /// Compute dtype: f32, or bf16/f16 with f32 master weights and dynamic loss scaling.
    #[serde(serialize_with = "dtype_name")]
    pub dtype: DType,
    /// Fused attention (the default) or the unfused composition, for comparison.
    pub attention: AttentionImpl,
    pub steps: usize,
    /// Sequences per micro-batch over all ranks (divisible by the number of ranks).
    pub batch: usize,
    /// Micro-batches per step (gradient accumulation).
    pub accum: usize,
    /// Peak learning rate, reached by a linear warm-up over the first [`WARMUP_STEPS`] steps.
    pub lr: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clipping threshold.
    pub clip: f64,
    /// Seed of the initial weights and the batches.
    pub seed: u64,
    /// Gradient bucket size for the all-reduces.
    pub bucket_bytes: usize,
    /// Start each bucket's all-reduce during the backward pass (else after it).
    pub overlap: bool,
    /// Held-out loss every this many steps (and at the start and the end); 0: start and end only.
    pub eval_every: usize,
    /// Held-out sequences evaluated.
    pub eval_seqs: usize,
    /// Characters generated at the end (0: none).
    pub sample_len: usize,
    /// Write each rank's allocator snapshot and history in PyTorch's layout here at the end of
    /// the run (`%d` replaced by the device ordinal), for `python -m torch.cuda._memory_viz`.
    pub memory_snapshot: Option<std::path::PathBuf>,
}

fn dtype_name<S: serde::Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&d.to_string())
}

impl Default for TrainConfig {
    /// The default size: 2 blocks of width 64 with 4 heads over 64 characters, 32 sequences per
    /// step, 200 steps.
    fn default() -> TrainConfig {
        TrainConfig {
            ctx: 64,
            dim: 64,
            heads: 4,
            layers: 2,
            dtype: DType::F32,
            attention: AttentionImpl::Fused,
            steps: 200,
            batch: 32,
            accum: 1,
            lr: 5e-3,
            weight_decay: 0.1,
            clip: 1.0,
            seed: 1234,
            bucket_bytes: 64 << 10,
            overlap: true,
            eval_every: 0,
            eval_seqs: 64,
            sample_len: 0,
            memory_snapshot: None,
        }
    }
}

impl TrainConfig {
    /// The model's sizes over `corpus`'s vocabulary.
    pub fn model(&self, corpus: &Corpus) -> ModelConfig {
        ModelConfig {
            vocab: corpus.vocab.len(),
            ctx: self.ctx,
            dim: self.dim,
            heads: self.heads,
            layers: self.layers,
        }
    }

    fn lr_at(&self, step: usize) -> f64 {
        self.lr * ((step + 1) as f64 / WARMUP_STEPS as f64).min(1.0)
    }
}

/// One step's figures, as rank 0 saw them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepStats {
    pub step: usize,
    /// Mean training loss over the global batch (all micro-batches).
    pub loss: f32,
    /// The step was skipped: its gradients overflowed (mixed precision).
    pub skipped: bool,
    /// Loss scale used by the step (1 in f32).
    pub loss_scale: f32,
    /// Wall time of the step on the host.
    pub wall_ms: f64,
    /// Tokens of the global batch per second of wall time.
    pub tokens_per_s: f64,
    /// Time between the step's first and last event on the compute stream.
    pub device_ms: f64,
    /// Time the compute stream waited for the gradient all-reduces (event timestamps).
    pub comm_wait_ms: f64,
    /// Peak bytes allocated through the caching allocator so far, and reserved from the device.
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// `Device::alloc` calls so far.
    pub device_allocs: u64,
}

impl StepStats {
    /// `comm_wait_ms / device_ms`.
    pub fn comm_share(&self) -> f64 {
        if self.device_ms > 0.0 {
            self.comm_wait_ms / self.device_ms
        } else {
            0.0
        }
    }
}

impl std::fmt::Display for StepStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MIB: f64 = (1 << 20) as f64;
        write!(
            f,
            "step {:4} | loss {:.4}{} | {:8.0} tok/s | {:7.1} ms | comm wait {:5.1}% | peak \
             allocated {:.2} MiB, reserved {:.2} MiB",
            self.step,
            self.loss,
            if self.skipped {
                " (skipped: overflow)"
            } else {
                ""
            },
            self.tokens_per_s,
            self.wall_ms,
            100.0 * self.comm_share(),
            self.peak_allocated as f64 / MIB,
            self.peak_reserved as f64 / MIB,
        )
    }
}

/// What a run reports (rank 0's view).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub config: TrainConfig,
    pub model: ModelConfig,
    pub parameters: u64,
    pub ranks: usize,
    /// The devices, as `backend:ordinal (name)`.
    pub devices: Vec<String>,
    pub buckets: usize,
    pub steps: Vec<StepStats>,
    /// `(step, held-out loss)`: before training, every `eval_every` steps and after the last.
    pub heldout: Vec<(usize, f32)>,
    pub sample: String,
    /// Rank 0's caching allocator at the end, as `torch.cuda.memory_summary()` prints it
    /// (`MemoryStats::summary`).
    pub memory_summary: String,
}

impl Report {
    /// Training losses, one per step.
    pub fn losses(&self) -> Vec<f32> {
        self.steps.iter().map(|s| s.loss).collect()
    }
}

/// Checks that `backend` can run the model in `dt` on `ranks` ranks: every op it uses, and the
/// gradient all-reduce.
///
/// # Errors
/// [`Error::Config`] listing what is missing.
pub fn check_support(
    backend: &dyn Backend,
    dev: &Arc<dyn Device>,
    dt: DType,
    ranks: usize,
) -> Result<(), Error> {
    let caps = dev.capabilities();
    let mut need: Vec<(OpId, DType)> = [
        OpId::Fill,
        OpId::Cast,
        OpId::Add,
        OpId::Matmul,
        OpId::SoftmaxMasked,
        OpId::SoftmaxBackward,
        OpId::LayerNorm,
        OpId::LayerNormBackward,
        OpId::GeluTanh,
        OpId::GeluTanhBackward,
        OpId::ReduceSum,
        OpId::IndexSelect,
        OpId::IndexAdd,
        OpId::CrossEntropy,
        OpId::CrossEntropyBackward,
        OpId::ClipGradNorm,
        OpId::AdamW,
    ]
    .iter()
    .map(|&op| (op, dt))
    .collect();
    need.extend([OpId::Fill, OpId::Axpy, OpId::MulScalar].map(|op| (op, DType::F32)));
    if dt != DType::F32 {
        need.extend([OpId::AmpUnscale, OpId::AmpUpdateScale, OpId::Div].map(|op| (op, DType::F32)));
    }
    let missing: Vec<String> = need
        .iter()
        .filter(|(op, d)| !caps.supports(*op, *d))
        .map(|(op, d)| format!("{op} in {d}"))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Config(format!(
            "{} cannot run the GPT in {dt}: it lacks {}",
            dev.id(),
            missing.join(", ")
        )));
    }
    if ranks > 1 {
        let ok = backend.collectives().is_some_and(|c| {
            let caps = c.capabilities();
            caps.supports(CollectiveOp::AllReduce, dt, Some(ReduceOp::Sum))
                && caps.supports(CollectiveOp::AllReduce, DType::F32, Some(ReduceOp::Sum))
        });
        if !ok {
            return Err(Error::Config(format!(
                "the collective engine of backend {} cannot all-reduce {dt} and f32 gradients",
                backend.name()
            )));
        }
    }
    Ok(())
}

/// One parameter's optimizer-side tensors.
struct Param {
    master: TensorView,
    state: [TensorView; 2],
    /// The compute-dtype copy AdamW writes (mixed precision).
    copy: Option<TensorView>,
    decay: bool,
}

/// Trains on `dev` as rank `comm.rank()` of `comm.size()` (one rank without `comm`) and returns
/// what rank 0 saw; `on_step` runs on rank 0 after every step. Every rank must call this with the
/// same `corpus` and `cfg`.
///
/// # Errors
/// [`Error::Config`] for an unusable configuration, and any backend, op or collective error.
pub fn train_rank(
    backend: &dyn Backend,
    dev: Arc<dyn Device>,
    comm: Option<Arc<dyn Communicator>>,
    corpus: &Corpus,
    cfg: &TrainConfig,
    on_step: &(dyn Fn(&StepStats) + Sync),
) -> Result<Report, Error> {
    let (rank, ranks) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.size()));
    if cfg.batch % ranks != 0 || cfg.batch == 0 || cfg.accum == 0 {
        return Err(Error::Config(format!(
            "a batch of {} sequences does not split over {ranks} ranks (accumulation {})",
            cfg.batch, cfg.accum
        )));
    }
    let dt = cfg.dtype;
    if ![DType::F32, DType::Bf16, DType::F16].contains(&dt) {
        return Err(Error::Config(format!(
            "compute dtype {dt}: f32, bf16 or f16"
        )));
    }
    check_support(backend, &dev, dt, ranks)?;
    let layout = Layout::new(cfg.model(corpus))?;
    let x = Exec::new(dev.clone())?;
    if let Some(path) = &cfg.memory_snapshot {
        x.alloc.snapshot_at_drop(path.clone());
    }
    let mixed = dt != DType::F32;
    // Parameters: f32 masters from the host-side initialisation, AdamW state, compute copies.
    let init = layout.init(cfg.seed);
    let mut params = Vec::with_capacity(init.len());
    for (spec, values) in layout.specs.iter().zip(&init) {
        let master = x.upload_f32(values, DType::F32, &spec.shape)?;
        let state = [
            x.full(DType::F32, &spec.shape, 0.0)?,
            x.full(DType::F32, &spec.shape, 0.0)?,
        ];
        let copy = if mixed {
            Some(x.cast_to(&master, dt)?)
        } else {
            None
        };
        params.push(Param {
            master,
            state,
            copy,
            decay: spec.decay(),
        });
    }
    let weights = params
        .iter()
        .map(|p| p.copy.clone().unwrap_or_else(|| p.master.clone()))
        .collect();
    let model = Model::new(&x, &layout, dt, weights, cfg.attention)?;
    let mut reducer = Reducer::new(
        &x,
        &layout.specs,
        dt,
        cfg.bucket_bytes,
        comm.clone(),
        cfg.overlap,
    )?;
    // Loss scaling (mixed precision) and clipping state.
    // The loss scale on the device, and on the host the value the next step will use (read back
    // with the overflow flag, in the step's one synchronisation before the optimizer).
    let mut next_scale: f32 = if mixed { 65536.0 } else { 1.0 };
    let scale = x.full(DType::F32, &[1], f64::from(next_scale))?;
    let tracker = x.full(DType::I32, &[1], 0.0)?;
    let one = x.full(DType::F32, &[1], 1.0)?;
    let timing = EventFlags {
        disable_timing: false,
    };
    let ev = || dev.create_event(timing).map_err(Error::hal("create_event"));
    let (step_start, step_end) = (ev()?, ev()?);
    let eval_batches = corpus.heldout_batches(cfg.eval_seqs, cfg.batch, cfg.ctx);
    let mut report = Report {
        config: cfg.clone(),
        model: layout.cfg,
        parameters: layout.numel(),
        ranks,
        devices: vec![format!("{} ({})", dev.id(), dev.info().name)],
        buckets: reducer.buckets(),
        steps: Vec::with_capacity(cfg.steps),
        heldout: Vec::new(),
        sample: String::new(),
        memory_summary: String::new(),
    };
    if rank == 0 {
        report
            .heldout
            .push((0, evaluate(&x, &model, &eval_batches)?));
    }
    let grads = reducer.grads.clone();
    let factor = 1.0 / (ranks * cfg.accum) as f64;
    let mut adam_step = 0u64;
    for step in 0..cfg.steps {
        let wall = Instant::now();
        x.s.record_event(&step_start)
            .map_err(Error::hal("record_event"))?;
        let loss_sum = x.full(DType::F32, &[], 0.0)?;
        for micro in 0..cfg.accum {
            let batch =
                corpus.train_batch(cfg.seed, step, micro, cfg.batch, cfg.ctx, (rank, ranks));
            let acts = model.forward(&x, &batch)?;
            x.run(OpCall::axpy(
                Scalar::F64(1.0 / cfg.accum as f64),
                acts.loss.clone(),
                loss_sum.clone(),
            ))?;
            // d(loss)/d(loss) scaled: by the loss scale, and to average over ranks and micro-batches.
            let dloss = x.tensor(DType::F32, &[])?;
            x.run(OpCall::binary_scalar(
                OpId::MulScalar,
                crate::exec::reshape(&scale, &[]),
                Scalar::F64(factor),
                dloss.clone(),
            ))?;
            let last = micro + 1 == cfg.accum;
            if last {
                reducer.begin();
            }
            let mut on_grad = |p: usize| {
                if last {
                    reducer.ready(&x, p)
                } else {
                    Ok(())
                }
            };
            model.backward(&x, &acts, &dloss, &grads, micro > 0, &mut on_grad)?;
        }
        reducer.finish(&x)?;
        if let Some(c) = comm.as_ref().filter(|c| c.size() > 1) {
            c.all_reduce(
                &loss_sum.buffer,
                &loss_sum.buffer,
                1,
                DType::F32,
                ReduceOp::Sum,
                &x.s,
            )
            .map_err(Error::hal("all_reduce"))?;
        }
        let mut skipped = false;
        let loss_scale = next_scale;
        if mixed {
            // [found_inf, the updated scale]: one read for both.
            let flags = x.full(DType::F32, &[2], 0.0)?;
            let found_inf = crate::exec::view(&flags, 0, &[1], &[1]);
            let inv_scale = x.tensor(DType::F32, &[1])?;
            x.run(OpCall::binary(
                OpId::Div,
                one.clone(),
                scale.clone(),
                inv_scale.clone(),
            ))?;
            x.run(OpCall::amp_unscale(found_inf.clone(), inv_scale, &grads))?;
            x.run(OpCall::amp_update_scale(
                scale.clone(),
                tracker.clone(),
                found_inf.clone(),
                2.0,
                0.5,
                100,
            ))?;
            x.run(OpCall::copy(
                scale.clone(),
                crate::exec::view(&flags, 1, &[1], &[1]),
            ))?;
            let f = x.read_f32(&flags)?;
            skipped = f[0] != 0.0;
            next_scale = f[1];
        }
        if !skipped {
            let total_norm = x.tensor(DType::F32, &[1])?;
            x.run(OpCall::clip_grad_norm(total_norm, &grads, cfg.clip))?;
            adam_step += 1;
            for decay in [true, false] {
                let groups: Vec<ParamGroup> = params
                    .iter()
                    .zip(&grads)
                    .filter(|(p, _)| p.decay == decay)
                    .map(|(p, g)| ParamGroup {
                        param: p.master.clone(),
                        grad: g.clone(),
                        state: p.state.to_vec(),
                        copy: p.copy.clone(),
                    })
                    .collect();
                let o = AdamWOptions {
                    lr: cfg.lr_at(step),
                    beta1: 0.9,
                    beta2: 0.95,
                    eps: 1e-8,
                    weight_decay: if decay { cfg.weight_decay } else { 0.0 },
                    step: adam_step,
                };
                x.run(OpCall::adamw(&groups, o))?;
            }
        }
        x.s.record_event(&step_end)
            .map_err(Error::hal("record_event"))?;
        let loss = x.read_f32(&loss_sum)?[0] / ranks as f32;
        reducer.synchronize()?;
        let wall_ms = wall.elapsed().as_secs_f64() * 1e3;
        let st = x.alloc.stats();
        let stats = StepStats {
            step,
            loss,
            skipped,
            loss_scale,
            wall_ms,
            tokens_per_s: (cfg.batch * cfg.accum * cfg.ctx) as f64 / (wall_ms / 1e3),
            device_ms: f64::from(
                step_start
                    .elapsed_ms(&*step_end)
                    .map_err(Error::hal("elapsed_ms"))?,
            ),
            comm_wait_ms: reducer.wait_ms()?,
            peak_allocated: st.allocated_bytes.all.peak,
            peak_reserved: st.reserved_bytes.all.peak,
            device_allocs: st.num_device_alloc,
        };
        if rank == 0 {
            on_step(&stats);
            let last = step + 1 == cfg.steps;
            if last || (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0) {
                report
                    .heldout
                    .push((step + 1, evaluate(&x, &model, &eval_batches)?));
            }
        }
        report.steps.push(stats);
    }
    if rank == 0 && cfg.sample_len > 0 {
        report.sample = sample(&x, &model, corpus, "unihal ", cfg.sample_len, cfg.seed)?;
    }
    x.s.synchronize().map_err(Error::hal("synchronize"))?;
    if rank == 0 {
        report.memory_summary = x.alloc.stats().summary(dev.id());
    }
    Ok(report)
}

/// Mean loss of the model over `batches` (forward passes only).
///
/// # Errors
/// Any op's.
pub fn evaluate(x: &Exec, model: &Model, batches: &[crate::data::Batch]) -> Result<f32, Error> {
    let mut sum = 0.0f64;
    for b in batches {
        let acts = model.forward(x, b)?;
        sum += f64::from(x.read_f32(&acts.loss)?[0]) * b.rows as f64;
    }
    let rows: usize = batches.iter().map(|b| b.rows).sum();
    Ok((sum / rows.max(1) as f64) as f32)
}

/// `len` characters generated after `prompt`, sampled at temperature 0.8 with the host generator.
///
/// # Errors
/// Any op's.
pub fn sample(
    x: &Exec,
    model: &Model,
    corpus: &Corpus,
    prompt: &str,
    len: usize,
    seed: u64,
) -> Result<String, Error> {
    let ctx = model.layout.cfg.ctx;
    let mut ids = corpus.encode(prompt);
    if ids.is_empty() {
        ids.push(0);
    }
    let mut rng = Rng::new(seed, 0xC0FFEE);
    for _ in 0..len {
        let window = &ids[ids.len().saturating_sub(ctx)..];
        let mut inputs = window.to_vec();
        inputs.resize(ctx, 0); // positions after the window do not affect it (causal)
        let batch = crate::data::Batch {
            rows: 1,
            targets: vec![0; ctx],
            inputs,
        };
        let acts = model.forward(x, &batch)?;
        let v = corpus.vocab.len();
        let logits = x.read_f32(&acts.logits)?;
        let row = &logits[(window.len() - 1) * v..window.len() * v];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> = row
            .iter()
            .map(|&l| f64::from((l - max) / 0.8).exp())
            .collect();
        let mut r = rng.uniform() * weights.iter().sum::<f64>();
        let mut next = v - 1;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                next = i;
                break;
            }
            r -= w;
        }
        ids.push(next as i64);
    }
    Ok(corpus.decode(&ids))
}

/// Data-parallel training over devices `0..devices` of `backend` in this process, one thread per
/// rank, with the backend's collectives (`init_all`). Returns rank 0's report (listing every
/// device). A rank that fails aborts the communicators, so the others fail too instead of waiting.
///
/// # Errors
/// [`Error::Config`] when the backend has fewer devices; the first rank's error otherwise.
pub fn train_devices(
    backend: &dyn Backend,
    devices: usize,
    corpus: &Corpus,
    cfg: &TrainConfig,
    on_step: &(dyn Fn(&StepStats) + Sync),
) -> Result<Report, Error> {
    let have = backend.probe().map_err(Error::hal("probe"))?;
    if devices == 0 || devices > have {
        return Err(Error::Config(format!(
            "{devices} devices asked, backend {} has {have}",
            backend.name()
        )));
    }
    let devs = (0..devices)
        .map(|i| backend.open(i))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::hal("open"))?;
    if devices == 1 {
        return train_rank(backend, devs[0].clone(), None, corpus, cfg, on_step);
    }
    let ccl = backend
        .collectives()
        .ok_or_else(|| Error::Config(format!("backend {} has no collectives", backend.name())))?;
    let comms = ccl
        .init_all(&devs, &CommConfig::default())
        .map_err(Error::hal("init_all"))?;
    let results: Vec<Result<Report, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = devs
            .iter()
            .zip(&comms)
            .map(|(d, c)| {
                let comms = &comms;
                s.spawn(move || {
                    let r = train_rank(backend, d.clone(), Some(c.clone()), corpus, cfg, on_step);
                    if r.is_err() {
                        comms.iter().for_each(|c| c.abort());
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(Error::Panic)))
            .collect()
    });
    // The error to report is the one that aborted the others, not an `Aborted` it caused.
    let mut errors: Vec<Error> = Vec::new();
    let mut reports = Vec::with_capacity(devices);
    for r in results {
        match r {
            Ok(rep) => reports.push(rep),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        let i = errors.iter().position(|e| !e.is_aborted()).unwrap_or(0);
        return Err(errors.swap_remove(i));
    }
    let mut first = reports.swap_remove(0);
    first.devices = devs
        .iter()
        .map(|d| format!("{} ({})", d.id(), d.info().name))
        .collect();
    Ok(first)
}
