//! The model: a GPT-2-style decoder written against the op catalogue only.
//!
//! Token and position embeddings (`index_select`; `index_add` for their gradients), `layers`
//! pre-norm blocks of causal self-attention (the batched matmul over `[batch, head]` with the heads
//! and the key transpose as strides of the fused QKV activation, a masked softmax with an additive
//! causal mask) and a GELU MLP, a final layer norm and an untied output projection, cross-entropy.
//! The backward pass is written out by hand, op by op; it calls `on_grad(param)` as soon as a
//! parameter's gradient is final, which is what lets data parallelism start a bucket's all-reduce
//! while the earlier layers are still being differentiated.
//!
//! Parameters are kept as f32 master weights; in mixed precision (`bf16`/`f16`) the forward and
//! backward passes use rounded copies that the optimizer writes (see [`crate::train`]).

use crate::data::{Batch, Rng};
use crate::exec::{reshape, tr, view, Exec};
use crate::Error;
use unihal::{CeOptions, DType, OpCall, OpId, TensorView};

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

/// The activations one block keeps for its backward pass.
struct BlockActs {
    x_in: TensorView,
    y1: TensorView,
    stats1: [TensorView; 2],
    qkv: TensorView,
    att: TensorView,
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
    /// The causal mask `[ctx, ctx]`: 0 on and below the diagonal, -inf above.
    mask: TensorView,
}

const LN_EPS: f64 = 1e-5;

fn ce() -> CeOptions {
    CeOptions::default()
}

impl<'a> Model<'a> {
    /// The model with `weights` (compute dtype `dt`), building its causal mask on `x`.
    ///
    /// # Errors
    /// The backend's.
    pub fn new(
        x: &Exec,
        layout: &'a Layout,
        dt: DType,
        weights: Vec<TensorView>,
    ) -> Result<Model<'a>, Error> {
        let t = layout.cfg.ctx;
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
            mask,
        })
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
            let qkv = x.tensor(dt, &[n, 3 * d])?;
            x.matmul(&y1, self.w(blk.qkv_w), &qkv, 1.0, 0.0)?;
            x.add(&qkv, self.w(blk.qkv_b), &qkv)?;
            let sc = x.tensor(dt, &[b, h, t, t])?;
            x.matmul(
                &qkv_heads(&qkv, 0, b, h, t, hd),
                &tr(&qkv_heads(&qkv, 1, b, h, t, hd)),
                &sc,
                scale,
                0.0,
            )?;
            let att = x.tensor(dt, &[b, h, t, t])?;
            x.run(OpCall::softmax_masked(
                OpId::SoftmaxMasked,
                sc,
                self.mask.clone(),
                att.clone(),
            ))?;
            let ao = x.tensor(dt, &[n, d])?;
            x.matmul(
                &att,
                &qkv_heads(&qkv, 2, b, h, t, hd),
                &heads(&ao, b, h, t, hd),
                1.0,
                0.0,
            )?;
            let x_mid = x.tensor(dt, &[n, d])?;
            x.matmul(&ao, self.w(blk.proj_w), &x_mid, 1.0, 0.0)?;
            x.add(&x_mid, self.w(blk.proj_b), &x_mid)?;
            x.add(&x_mid, &xs, &x_mid)?;
            // MLP.
            let (y2, stats2) = self.layer_norm(x, &x_mid, blk.ln2_w, blk.ln2_b)?;
            let hpre = x.tensor(dt, &[n, 4 * d])?;
            x.matmul(&y2, self.w(blk.fc_w), &hpre, 1.0, 0.0)?;
            x.add(&hpre, self.w(blk.fc_b), &hpre)?;
            let g = x.tensor(dt, &[n, 4 * d])?;
            x.run(OpCall::unary(OpId::GeluTanh, hpre.clone(), g.clone()))?;
            let x_out = x.tensor(dt, &[n, d])?;
            x.matmul(&g, self.w(blk.out_w), &x_out, 1.0, 0.0)?;
            x.add(&x_out, self.w(blk.out_b), &x_out)?;
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
        let logits = x.tensor(dt, &[n, c.vocab as u64])?;
        x.matmul(&yf, self.w(lay.head_w), &logits, 1.0, 0.0)?;
        x.add(&logits, self.w(lay.head_b), &logits)?;
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
        let dt = self.dt;
        let g = Grads {
            x,
            grads,
            accumulate,
        };
        let beta = if accumulate { 1.0 } else { 0.0 };
        // Loss and output projection.
        let dlogits = x.tensor(dt, &acts.logits.shape)?;
        x.run(OpCall::cross_entropy_backward(
            acts.logits.clone(),
            acts.targets.clone(),
            dloss.clone(),
            dlogits.clone(),
            ce(),
        ))?;
        x.matmul(&tr(&acts.yf), &dlogits, &grads[lay.head_w], 1.0, beta)?;
        on_grad(lay.head_w)?;
        g.bias(&dlogits, lay.head_b)?;
        on_grad(lay.head_b)?;
        let dyf = x.tensor(dt, &[n, d])?;
        x.matmul(&dlogits, &tr(self.w(lay.head_w)), &dyf, 1.0, 0.0)?;
        drop(dlogits);
        let dx = self.layer_norm_backward(
            x,
            &g,
            (&acts.x_last, &dyf, &acts.statsf),
            (lay.lnf_w, lay.lnf_b),
        )?;
        on_grad(lay.lnf_w)?;
        on_grad(lay.lnf_b)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for (blk, a) in lay.blocks.iter().zip(&acts.blocks).rev() {
            // MLP: dx is the gradient of the block's output, so of x_mid and of the MLP's output.
            x.matmul(&tr(&a.g), &dx, &grads[blk.out_w], 1.0, beta)?;
            on_grad(blk.out_w)?;
            g.bias(&dx, blk.out_b)?;
            on_grad(blk.out_b)?;
            let dg = x.tensor(dt, &[n, 4 * d])?;
            x.matmul(&dx, &tr(self.w(blk.out_w)), &dg, 1.0, 0.0)?;
            let dhpre = x.tensor(dt, &[n, 4 * d])?;
            x.run(OpCall::unary_backward(
                OpId::GeluTanhBackward,
                a.hpre.clone(),
                dg,
                dhpre.clone(),
            ))?;
            x.matmul(&tr(&a.y2), &dhpre, &grads[blk.fc_w], 1.0, beta)?;
            on_grad(blk.fc_w)?;
            g.bias(&dhpre, blk.fc_b)?;
            on_grad(blk.fc_b)?;
            let dy2 = x.tensor(dt, &[n, d])?;
            x.matmul(&dhpre, &tr(self.w(blk.fc_w)), &dy2, 1.0, 0.0)?;
            drop(dhpre);
            let dln2 = self.layer_norm_backward(
                x,
                &g,
                (&a.x_mid, &dy2, &a.stats2),
                (blk.ln2_w, blk.ln2_b),
            )?;
            on_grad(blk.ln2_w)?;
            on_grad(blk.ln2_b)?;
            x.add(&dx, &dln2, &dx)?; // now the gradient of x_mid
            drop(dln2);
            // Attention output projection.
            x.matmul(&tr(&a.ao), &dx, &grads[blk.proj_w], 1.0, beta)?;
            on_grad(blk.proj_w)?;
            g.bias(&dx, blk.proj_b)?;
            on_grad(blk.proj_b)?;
            let dao = x.tensor(dt, &[n, d])?;
            x.matmul(&dx, &tr(self.w(blk.proj_w)), &dao, 1.0, 0.0)?;
            // Attention: through att @ v, the masked softmax and q @ k^T.
            let dao_h = heads(&dao, b, h, t, hd);
            let q = qkv_heads(&a.qkv, 0, b, h, t, hd);
            let k = qkv_heads(&a.qkv, 1, b, h, t, hd);
            let v = qkv_heads(&a.qkv, 2, b, h, t, hd);
            let datt = x.tensor(dt, &[b, h, t, t])?;
            x.matmul(&dao_h, &tr(&v), &datt, 1.0, 0.0)?;
            let dqkv = x.tensor(dt, &[n, 3 * d])?;
            x.matmul(
                &tr(&a.att),
                &dao_h,
                &qkv_heads(&dqkv, 2, b, h, t, hd),
                1.0,
                0.0,
            )?;
            drop(dao);
            let dsc = x.tensor(dt, &[b, h, t, t])?;
            x.run(OpCall::softmax_backward(
                OpId::SoftmaxBackward,
                a.att.clone(),
                datt,
                dsc.clone(),
            ))?;
            x.matmul(&dsc, &k, &qkv_heads(&dqkv, 0, b, h, t, hd), scale, 0.0)?;
            x.matmul(&tr(&dsc), &q, &qkv_heads(&dqkv, 1, b, h, t, hd), scale, 0.0)?;
            drop(dsc);
            x.matmul(&tr(&a.y1), &dqkv, &grads[blk.qkv_w], 1.0, beta)?;
            on_grad(blk.qkv_w)?;
            g.bias(&dqkv, blk.qkv_b)?;
            on_grad(blk.qkv_b)?;
            let dy1 = x.tensor(dt, &[n, d])?;
            x.matmul(&dqkv, &tr(self.w(blk.qkv_w)), &dy1, 1.0, 0.0)?;
            drop(dqkv);
            let dln1 = self.layer_norm_backward(
                x,
                &g,
                (&a.x_in, &dy1, &a.stats1),
                (blk.ln1_w, blk.ln1_b),
            )?;
            on_grad(blk.ln1_w)?;
            on_grad(blk.ln1_b)?;
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
    /// gradient and writes (or adds to) the parameters'.
    fn layer_norm_backward(
        &self,
        x: &Exec,
        g: &Grads,
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

/// The `[b, h, t, hd]` heads of a dense `[b * t, h * hd]` activation (a view).
fn heads(a: &TensorView, b: u64, h: u64, t: u64, hd: u64) -> TensorView {
    let d = (h * hd) as i64;
    view(a, 0, &[b, h, t, hd], &[t as i64 * d, hd as i64, d, 1])
}

/// Part `part` (0 = q, 1 = k, 2 = v) of a dense `[b * t, 3 * h * hd]` QKV activation as
/// `[b, h, t, hd]` heads (a view).
fn qkv_heads(qkv: &TensorView, part: u64, b: u64, h: u64, t: u64, hd: u64) -> TensorView {
    let d = h * hd;
    let row = 3 * d as i64;
    view(
        qkv,
        part * d,
        &[b, h, t, hd],
        &[t as i64 * row, hd as i64, row, 1],
    )
}
