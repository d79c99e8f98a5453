//! The model: a GPT-2-style decoder written against the op catalogue only.
//!
//! Token and position embeddings (`index_select`; `index_add` for their gradients), `layers`
//! pre-norm blocks of causal self-attention and a GELU MLP, a final layer norm and an untied
//! output projection, cross-entropy. Attention reads q, k and v as strided head views of the fused
//! QKV activation; it runs fused by default (the `attention` op: online softmax, the row
//! log-sum-exp saved for the backward pass, no `[batch, head, S, S]` tensor), or unfused for
//! comparison ([`AttentionImpl::Unfused`]: a batched matmul with the key transpose as strides, a
//! masked softmax with an additive causal mask, a second matmul).
//! The backward pass is written out by hand, op by op; it calls `on_grad(param)` as soon as a
//! parameter's gradient is final, which is what lets data parallelism start a bucket's all-reduce
//! while the earlier layers are still being differentiated.
//!
//! Parameters are kept as f32 master weights; in mixed precision (`bf16`/`f16`) the forward and
//! backward passes use rounded copies that the optimizer writes (see [`crate::train`]).

use crate::data::{Batch, Rng};
use crate::exec::{reshape, tr, view, Exec};
use crate::Error;
use unihal::{AttentionOptions, CeOptions, DType, OpCall, OpId, TensorView};

/// How the blocks compute attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionImpl {
    /// The fused `attention` op (FlashAttention-2 style: activation memory linear in the context).
    #[default]
    Fused,
    /// Matmul, masked softmax, matmul: keeps the `[batch, heads, ctx, ctx]` probabilities.
    Unfused,
}

/// The model's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ModelConfig {
    /// Vocabulary size (the corpus's).
    pub vocab: usize,
    /// Context length: tokens per sequence.
    pub ctx: usize,
    /// Embedding width.
    pub dim: usize,
    /// Attention heads (divides `dim`).
    pub heads: usize,
    /// Decoder blocks.
    pub layers: usize,
}

/// What a parameter is, for initialisation and weight decay.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Init {
    /// Normal with this standard deviation; decayed.
    Normal(f64),
    /// Constant (biases 0, layer-norm gains 1); not decayed.
    Const(f32),
}

/// Shape and initialisation of one parameter.
#[derive(Debug, Clone)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<u64>,
    init: Init,
}

impl ParamSpec {
    /// Elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Whether AdamW decays it (matrices and embeddings; not biases and norm gains).
    pub fn decay(&self) -> bool {
        matches!(self.init, Init::Normal(_))
    }
}

/// Indices into the parameter list of one block's parameters.
#[derive(Debug, Clone, Copy)]
struct Block {
    ln1_w: usize,
    ln1_b: usize,
    qkv_w: usize,
    qkv_b: usize,
    proj_w: usize,
    proj_b: usize,
    ln2_w: usize,
    ln2_b: usize,
    fc_w: usize,
    fc_b: usize,
    out_w: usize,
    out_b: usize,
}

/// The model's parameter list and where each parameter sits in it. The list is in the order the
/// backward pass finishes the gradients (output layer first, embeddings last), so consecutive
/// parameters make gradient buckets that become ready one after the other.
#[derive(Debug, Clone)]
pub struct Layout {
    pub cfg: ModelConfig,
    pub specs: Vec<ParamSpec>,
    head_w: usize,
    head_b: usize,
    lnf_w: usize,
    lnf_b: usize,
    blocks: Vec<Block>,
    tok: usize,
    pos: usize,
}

impl Layout {
    /// The parameters of a model of `cfg`.
    ///
    /// # Errors
    /// [`Error::Config`] when a size is zero or `heads` does not divide `dim`.
    pub fn new(cfg: ModelConfig) -> Result<Layout, Error> {
        if [cfg.vocab, cfg.ctx, cfg.dim, cfg.heads, cfg.layers].contains(&0) {
            return Err(Error::Config(format!(
                "every model size must be positive: {cfg:?}"
            )));
        }
        if cfg.dim % cfg.heads != 0 {
            return Err(Error::Config(format!(
                "{} heads do not divide the width {}",
                cfg.heads, cfg.dim
            )));
        }
        let (v, t, d) = (cfg.vocab as u64, cfg.ctx as u64, cfg.dim as u64);
        let std = 0.02;
        // GPT-2: residual projections scaled by 1/sqrt(2 * layers).
        let res_std = std / (2.0 * cfg.layers as f64).sqrt();
        let mut specs = Vec::new();
        let mut add = |name: String, shape: &[u64], init: Init| {
            specs.push(ParamSpec {
                name,
                shape: shape.to_vec(),
                init,
            });
            specs.len() - 1
        };
        let head_w = add("head.w".into(), &[d, v], Init::Normal(std));
        let head_b = add("head.b".into(), &[v], Init::Const(0.0));
        let lnf_w = add("ln_f.w".into(), &[d], Init::Const(1.0));
        let lnf_b = add("ln_f.b".into(), &[d], Init::Const(0.0));
        let mut blocks = Vec::new();
        for l in (0..cfg.layers).rev() {
            let out_w = add(
                format!("h{l}.mlp.out.w"),
                &[4 * d, d],
                Init::Normal(res_std),
            );
            let out_b = add(format!("h{l}.mlp.out.b"), &[d], Init::Const(0.0));
            let fc_w = add(format!("h{l}.mlp.fc.w"), &[d, 4 * d], Init::Normal(std));
            let fc_b = add(format!("h{l}.mlp.fc.b"), &[4 * d], Init::Const(0.0));
            let ln2_w = add(format!("h{l}.ln2.w"), &[d], Init::Const(1.0));
            let ln2_b = add(format!("h{l}.ln2.b"), &[d], Init::Const(0.0));
            let proj_w = add(format!("h{l}.attn.proj.w"), &[d, d], Init::Normal(res_std));
            let proj_b = add(format!("h{l}.attn.proj.b"), &[d], Init::Const(0.0));
            let qkv_w = add(format!("h{l}.attn.qkv.w"), &[d, 3 * d], Init::Normal(std));
            let qkv_b = add(format!("h{l}.attn.qkv.b"), &[3 * d], Init::Const(0.0));
            let ln1_w = add(format!("h{l}.ln1.w"), &[d], Init::Const(1.0));
            let ln1_b = add(format!("h{l}.ln1.b"), &[d], Init::Const(0.0));
            blocks.push(Block {
                ln1_w,
                ln1_b,
                qkv_w,
                qkv_b,
                proj_w,
                proj_b,
                ln2_w,
                ln2_b,
                fc_w,
                fc_b,
                out_w,
                out_b,
            });
        }
        blocks.reverse();
        let tok = add("wte".into(), &[v, d], Init::Normal(std));
        let pos = add("wpe".into(), &[t, d], Init::Normal(std));
        Ok(Layout {
            cfg,
            specs,
            head_w,
            head_b,
            lnf_w,
            lnf_b,
            blocks,
            tok,
            pos,
        })
    }

    /// The initial value of every parameter, from `seed` (host-side, so every backend starts from
    /// the same bits).
    pub fn init(&self, seed: u64) -> Vec<Vec<f32>> {
        self.specs
            .iter()
            .enumerate()
            .map(|(i, p)| match p.init {
                Init::Const(c) => vec![c; p.numel() as usize],
                Init::Normal(std) => {
                    let mut rng = Rng::new(seed, 1 << 40 | i as u64);
                    (0..p.numel())
                        .map(|_| (rng.normal() * std) as f32)
                        .collect()
                }
            })
            .collect()
    }

    /// Total parameter count.
    pub fn numel(&self) -> u64 {
        self.specs.iter().map(ParamSpec::numel).sum()
    }
}

/// What attention keeps for its backward pass.
enum Saved {
    /// Fused: the row log-sum-exp `[batch, heads, ctx]` (f32).
    Lse(TensorView),
    /// Unfused: the probabilities `[batch, heads, ctx, ctx]`.
    Probs(TensorView),
}

/// The activations one block keeps for its backward pass.
struct BlockActs {
    x_in: TensorView,
    y1: TensorView,
    stats1: [TensorView; 2],
    qkv: TensorView,
    att: Saved,
    ao: TensorView,
    x_mid: TensorView,
    y2: TensorView,
    stats2: [TensorView; 2],
    hpre: TensorView,
    g: TensorView,
}

/// What a forward pass keeps: every block's activations, the final ones, and the loss.
pub struct Acts {
    rows: u64,
    idx: TensorView,
    targets: TensorView,
    pos: TensorView,
    blocks: Vec<BlockActs>,
    x_last: TensorView,
    yf: TensorView,
    statsf: [TensorView; 2],
    /// Logits `[rows * ctx, vocab]` in the compute dtype.
    pub logits: TensorView,
    /// Mean cross-entropy of the batch, `[]` f32.
    pub loss: TensorView,
}

/// The model on one device: its compute-dtype weights and constants.
pub struct Model<'a> {
    pub layout: &'a Layout,
    pub dt: DType,
    /// The weights the passes read (compute dtype), in layout order.
    pub weights: Vec<TensorView>,
    /// The causal mask `[ctx, ctx]` of unfused attention: 0 on and below the diagonal, -inf above.
    mask: Option<TensorView>,
}

const LN_EPS: f64 = 1e-5;

fn ce() -> CeOptions {
    CeOptions::default()
}

impl<'a> Model<'a> {
    /// The model with `weights` (compute dtype `dt`) computing attention as `attention` says
    /// (unfused: building its causal mask on `x`).
    ///
    /// # Errors
    /// The backend's.
    pub fn new(
        x: &Exec,
        layout: &'a Layout,
        dt: DType,
        weights: Vec<TensorView>,
        attention: AttentionImpl,
    ) -> Result<Model<'a>, Error> {
        let t = layout.cfg.ctx;
        if attention == AttentionImpl::Fused {
            return Ok(Model {
                layout,
                dt,
                weights,
                mask: None,
            });
        }
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = x.upload_f32(&mask, dt, &[t as u64, t as u64])?;
        Ok(Model {
            layout,
            dt,
            weights,
            mask: Some(mask),
        })
    }

    /// The options of the fused attention op: causal, scaled by `1 / sqrt(head_dim)`.
    fn attention_options(&self) -> AttentionOptions {
        let c = self.layout.cfg;
        AttentionOptions {
            causal: true,
            ..AttentionOptions::new((c.dim / c.heads) as u64)
        }
    }

    fn w(&self, i: usize) -> &TensorView {
        &self.weights[i]
    }

    /// Forward pass over `batch`: the logits and the mean loss, and what the backward pass needs.
    ///
    /// # Errors
    /// Any op's.
    pub fn forward(&self, x: &Exec, batch: &Batch) -> Result<Acts, Error> {
        let c = self.layout.cfg;
        let (t, d, h) = (c.ctx as u64, c.dim as u64, c.heads as u64);
        let (b, hd) = (batch.rows as u64, d / h);
        let n = b * t;
        let dims = [b, h, t, hd];
        let dt = self.dt;
        let idx = x.upload_i64(&batch.inputs, &[n])?;
        let targets = x.upload_i64(&batch.targets, &[n])?;
        let positions: Vec<i64> = (0..n as i64).map(|i| i % t as i64).collect();
        let pos = x.upload_i64(&positions, &[n])?;
        let lay = self.layout;
        // Embeddings.
        let mut xs = x.tensor(dt, &[n, d])?;
        x.run(OpCall::index_select(
            self.w(lay.tok).clone(),
            idx.clone(),
            xs.clone(),
        ))?;
        let pe = x.tensor(dt, &[n, d])?;
        x.run(OpCall::index_select(
            self.w(lay.pos).clone(),
            pos.clone(),
            pe.clone(),
        ))?;
        x.add(&xs, &pe, &xs)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut blocks = Vec::with_capacity(lay.blocks.len());
        for blk in &lay.blocks {
            // Attention.
            let (y1, stats1) = self.layer_norm(x, &xs, blk.ln1_w, blk.ln1_b)?;
            let qkv = self.linear(x, &y1, blk.qkv_w, blk.qkv_b)?;
            let ao = x.tensor(dt, &[n, d])?;
            let att = if let Some(mask) = &self.mask {
                let sc = x.tensor(dt, &[b, h, t, t])?;
                x.matmul(
                    &heads(&qkv, 0, 3, dims),
                    &tr(&heads(&qkv, 1, 3, dims)),
                    &sc,
                    scale,
                    0.0,
                )?;
                let att = x.tensor(dt, &[b, h, t, t])?;
                x.run(OpCall::softmax_masked(
                    OpId::SoftmaxMasked,
                    sc,
                    mask.clone(),
                    att.clone(),
                ))?;
                x.matmul(
                    &att,
                    &heads(&qkv, 2, 3, dims),
                    &heads(&ao, 0, 1, dims),
                    1.0,
                    0.0,
                )?;
                Saved::Probs(att)
            } else {
                let lse = x.tensor(DType::F32, &[b, h, t])?;
                x.run(OpCall::attention(
                    heads(&qkv, 0, 3, dims),
                    heads(&qkv, 1, 3, dims),
                    heads(&qkv, 2, 3, dims),
                    None,
                    heads(&ao, 0, 1, dims),
                    lse.clone(),
                    self.attention_options(),
                ))?;
                Saved::Lse(lse)
            };
            let x_mid = self.linear(x, &ao, blk.proj_w, blk.proj_b)?;
            x.add(&x_mid, &xs, &x_mid)?;
            // MLP.
            let (y2, stats2) = self.layer_norm(x, &x_mid, blk.ln2_w, blk.ln2_b)?;
            let hpre = self.linear(x, &y2, blk.fc_w, blk.fc_b)?;
            let g = x.tensor(dt, &[n, 4 * d])?;
            x.run(OpCall::unary(OpId::GeluTanh, hpre.clone(), g.clone()))?;
            let x_out = self.linear(x, &g, blk.out_w, blk.out_b)?;
            x.add(&x_out, &x_mid, &x_out)?;
            blocks.push(BlockActs {
                x_in: std::mem::replace(&mut xs, x_out),
                y1,
                stats1,
                qkv,
                att,
                ao,
                x_mid,
                y2,
                stats2,
                hpre,
                g,
            });
        }
        let (yf, statsf) = self.layer_norm(x, &xs, lay.lnf_w, lay.lnf_b)?;
        let logits = self.linear(x, &yf, lay.head_w, lay.head_b)?;
        let loss = x.tensor(DType::F32, &[])?;
        x.run(OpCall::cross_entropy(
            logits.clone(),
            targets.clone(),
            loss.clone(),
            ce(),
        ))?;
        Ok(Acts {
            rows: n,
            idx,
            targets,
            pos,
            blocks,
            x_last: xs,
            yf,
            statsf,
            logits,
            loss,
        })
    }

    fn layer_norm(
        &self,
        x: &Exec,
        input: &TensorView,
        w: usize,
        b: usize,
    ) -> Result<(TensorView, [TensorView; 2]), Error> {
        let y = x.tensor(self.dt, &input.shape)?;
        let rows = input.shape[0];
        let stats = [
            x.tensor(DType::F32, &[rows])?,
            x.tensor(DType::F32, &[rows])?,
        ];
        x.run(OpCall::layer_norm(
            input.clone(),
            self.w(w).clone(),
            self.w(b).clone(),
            y.clone(),
            stats[0].clone(),
            stats[1].clone(),
            LN_EPS,
        ))?;
        Ok((y, stats))
    }

    /// `input @ W + b` for parameters `(w, b)`: a new `[rows, W's columns]` tensor.
    fn linear(
        &self,
        x: &Exec,
        input: &TensorView,
        w: usize,
        b: usize,
    ) -> Result<TensorView, Error> {
        let out = x.tensor(self.dt, &[input.shape[0], self.w(w).shape[1]])?;
        x.matmul(input, self.w(w), &out, 1.0, 0.0)?;
        x.add(&out, self.w(b), &out)?;
        Ok(out)
    }

    /// Backward of [`Model::linear`] of `input` with output gradient `dy`: writes (or adds to) the
    /// gradients of `(w, b)`, reporting each, and returns the input's gradient.
    fn linear_backward(
        &self,
        x: &Exec,
        g: &Grads,
        on_grad: &mut dyn FnMut(usize) -> Result<(), Error>,
        (input, dy): (&TensorView, &TensorView),
        (w, b): (usize, usize),
    ) -> Result<TensorView, Error> {
        g.weight(input, dy, w)?;
        on_grad(w)?;
        g.bias(dy, b)?;
        on_grad(b)?;
        let dinput = x.tensor(self.dt, &input.shape)?;
        x.matmul(dy, &tr(self.w(w)), &dinput, 1.0, 0.0)?;
        Ok(dinput)
    }

    /// Backward pass of `acts` with `dloss` (`[]` f32) as the loss's gradient. Gradients go to
    /// `grads` (layout order, compute dtype): written when `accumulate` is false, added to
    /// otherwise (gradient accumulation over micro-batches). `on_grad(i)` runs once parameter
    /// `i`'s gradient is complete, in layout order.
    ///
    /// # Errors
    /// Any op's, and `on_grad`'s.
    pub fn backward(
        &self,
        x: &Exec,
        acts: &Acts,
        dloss: &TensorView,
        grads: &[TensorView],
        accumulate: bool,
        on_grad: &mut dyn FnMut(usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let c = self.layout.cfg;
        let lay = self.layout;
        let (t, d, h) = (c.ctx as u64, c.dim as u64, c.heads as u64);
        let (n, hd) = (acts.rows, d / h);
        let b = n / t;
        let dims = [b, h, t, hd];
        let dt = self.dt;
        let g = Grads {
            x,
            grads,
            accumulate,
        };
        // Loss and output projection.
        let dlogits = x.tensor(dt, &acts.logits.shape)?;
        x.run(OpCall::cross_entropy_backward(
            acts.logits.clone(),
            acts.targets.clone(),
            dloss.clone(),
            dlogits.clone(),
            ce(),
        ))?;
        let dyf = self.linear_backward(
            x,
            &g,
            on_grad,
            (&acts.yf, &dlogits),
            (lay.head_w, lay.head_b),
        )?;
        drop(dlogits);
        let dx = self.layer_norm_backward(
            x,
            &g,
            on_grad,
            (&acts.x_last, &dyf, &acts.statsf),
            (lay.lnf_w, lay.lnf_b),
        )?;
        let scale = 1.0 / (hd as f64).sqrt();
        for (blk, a) in lay.blocks.iter().zip(&acts.blocks).rev() {
            // MLP: dx is the gradient of the block's output, so of x_mid and of the MLP's output.
            let dg = self.linear_backward(x, &g, on_grad, (&a.g, &dx), (blk.out_w, blk.out_b))?;
            let dhpre = x.tensor(dt, &[n, 4 * d])?;
            x.run(OpCall::unary_backward(
                OpId::GeluTanhBackward,
                a.hpre.clone(),
                dg,
                dhpre.clone(),
            ))?;
            let dy2 =
                self.linear_backward(x, &g, on_grad, (&a.y2, &dhpre), (blk.fc_w, blk.fc_b))?;
            drop(dhpre);
            let dln2 = self.layer_norm_backward(
                x,
                &g,
                on_grad,
                (&a.x_mid, &dy2, &a.stats2),
                (blk.ln2_w, blk.ln2_b),
            )?;
            x.add(&dx, &dln2, &dx)?; // now the gradient of x_mid
            drop(dln2);
            // Attention output projection.
            let dao =
                self.linear_backward(x, &g, on_grad, (&a.ao, &dx), (blk.proj_w, blk.proj_b))?;
            // Attention: through att @ v, the masked softmax and q @ k^T.
            let dao_h = heads(&dao, 0, 1, dims);
            let q = heads(&a.qkv, 0, 3, dims);
            let k = heads(&a.qkv, 1, 3, dims);
            let v = heads(&a.qkv, 2, 3, dims);
            let dqkv = x.tensor(dt, &[n, 3 * d])?;
            match &a.att {
                Saved::Lse(lse) => x.run(OpCall::attention_backward(
                    q,
                    k,
                    v,
                    None,
                    heads(&a.ao, 0, 1, dims),
                    dao_h,
                    lse.clone(),
                    heads(&dqkv, 0, 3, dims),
                    heads(&dqkv, 1, 3, dims),
                    heads(&dqkv, 2, 3, dims),
                    self.attention_options(),
                ))?,
                Saved::Probs(att) => {
                    let datt = x.tensor(dt, &[b, h, t, t])?;
                    x.matmul(&dao_h, &tr(&v), &datt, 1.0, 0.0)?;
                    x.matmul(&tr(att), &dao_h, &heads(&dqkv, 2, 3, dims), 1.0, 0.0)?;
                    let dsc = x.tensor(dt, &[b, h, t, t])?;
                    x.run(OpCall::softmax_backward(
                        OpId::SoftmaxBackward,
                        att.clone(),
                        datt,
                        dsc.clone(),
                    ))?;
                    x.matmul(&dsc, &k, &heads(&dqkv, 0, 3, dims), scale, 0.0)?;
                    x.matmul(&tr(&dsc), &q, &heads(&dqkv, 1, 3, dims), scale, 0.0)?;
                }
            }
            drop(dao);
            let dy1 =
                self.linear_backward(x, &g, on_grad, (&a.y1, &dqkv), (blk.qkv_w, blk.qkv_b))?;
            drop(dqkv);
            let dln1 = self.layer_norm_backward(
                x,
                &g,
                on_grad,
                (&a.x_in, &dy1, &a.stats1),
                (blk.ln1_w, blk.ln1_b),
            )?;
            x.add(&dx, &dln1, &dx)?; // the gradient of the block's input
            drop(dln1);
        }
        // Embeddings: rows scattered back into their tables.
        for (p, index) in [(lay.tok, &acts.idx), (lay.pos, &acts.pos)] {
            if !accumulate {
                x.run(OpCall::fill(grads[p].clone(), unihal::Scalar::F64(0.0)))?;
            }
            x.run(OpCall::index_add(
                dx.clone(),
                index.clone(),
                grads[p].clone(),
            ))?;
            on_grad(p)?;
        }
        Ok(())
    }

    /// Layer-norm backward of `(input, dy, stats)` with parameters `(w, b)`: returns the input's
    /// gradient and writes (or adds to) the parameters', reporting each.
    fn layer_norm_backward(
        &self,
        x: &Exec,
        g: &Grads,
        on_grad: &mut dyn FnMut(usize) -> Result<(), Error>,
        (input, dy, stats): (&TensorView, &TensorView, &[TensorView; 2]),
        (w, b): (usize, usize),
    ) -> Result<TensorView, Error> {
        let dx = x.tensor(self.dt, &input.shape)?;
        g.write(&[w, b], |out| {
            x.run(OpCall::layer_norm_backward(
                input.clone(),
                dy.clone(),
                self.w(w).clone(),
                stats[0].clone(),
                stats[1].clone(),
                dx.clone(),
                out[0].clone(),
                out[1].clone(),
            ))
        })?;
        on_grad(w)?;
        on_grad(b)?;
        Ok(dx)
    }
}

/// Where gradients go: written into, or added to, their tensors.
struct Grads<'g> {
    x: &'g Exec,
    grads: &'g [TensorView],
    accumulate: bool,
}

impl Grads<'_> {
    /// Runs `f` with the tensors to write parameters `ps`' gradients to: the gradients themselves,
    /// or, when accumulating, scratch tensors that are then added to them.
    fn write(
        &self,
        ps: &[usize],
        f: impl FnOnce(&[TensorView]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if !self.accumulate {
            let outs: Vec<TensorView> = ps.iter().map(|&p| self.grads[p].clone()).collect();
            return f(&outs);
        }
        let outs = ps
            .iter()
            .map(|&p| self.x.tensor(self.grads[p].dtype, &self.grads[p].shape))
            .collect::<Result<Vec<_>, _>>()?;
        f(&outs)?;
        for (&p, o) in ps.iter().zip(&outs) {
            self.x.add(&self.grads[p], o, &self.grads[p])?;
        }
        Ok(())
    }

    /// A weight's gradient: `input^T @ dy` (the matmul adds to it when accumulating).
    fn weight(&self, input: &TensorView, dy: &TensorView, p: usize) -> Result<(), Error> {
        let beta = if self.accumulate { 1.0 } else { 0.0 };
        self.x.matmul(&tr(input), dy, &self.grads[p], 1.0, beta)
    }

    /// A bias's gradient: the column sums of `dy` `[rows, k]`.
    fn bias(&self, dy: &TensorView, p: usize) -> Result<(), Error> {
        self.write(&[p], |out| {
            let k = out[0].numel();
            self.x.run(OpCall::reduce(
                OpId::ReduceSum,
                dy.clone(),
                reshape(&out[0], &[1, k]),
                0,
            ))
        })
    }
}

/// Part `part` of `parts` of a dense `[b * t, parts * h * hd]` activation (the attention output
/// with 1 part; q, k and v of the fused QKV activation with 3) as `[b, h, t, hd]` heads: a view.
fn heads(a: &TensorView, part: u64, parts: u64, [b, h, t, hd]: [u64; 4]) -> TensorView {
    let d = h * hd;
    let row = (parts * d) as i64;
    view(
        a,
        part * d,
        &[b, h, t, hd],
        &[t as i64 * row, hd as i64, row, 1],
    )
}
