//! The hand-written backward pass against central finite differences of the forward pass, for
//! every parameter of a tiny model on the CPU backend (f32): a wrong gradient anywhere (attention's
//! strided heads, the masked softmax, layer norm, GELU, the embeddings' scatter-add) fails here,
//! and with gradient accumulation a second backward pass must add exactly as much again.

use gpt::data::{Corpus, Rng};
use gpt::exec::Exec;
use gpt::model::{AttentionImpl, Layout, Model, ModelConfig};
use unihal::DType;

fn cpu() -> std::sync::Arc<dyn unihal::Device> {
    unihal::registry().get("cpu").unwrap().open(0).unwrap()
}

#[test]
fn backward_matches_finite_differences_fused() {
    backward_matches_finite_differences(AttentionImpl::Fused);
}

#[test]
fn backward_matches_finite_differences_unfused() {
    backward_matches_finite_differences(AttentionImpl::Unfused);
}

fn backward_matches_finite_differences(attention: AttentionImpl) {
    let corpus = Corpus::documentation();
    let cfg = ModelConfig {
        vocab: corpus.vocab.len(),
        ctx: 8,
        dim: 16,
        heads: 2,
        layers: 2,
    };
    let layout = Layout::new(cfg).unwrap();
    // Larger weights than the real initialisation, so every path carries a visible gradient.
    let mut init = layout.init(5);
    for v in init.iter_mut().flatten() {
        *v *= 3.0;
    }
    let mut rng = Rng::new(3, 3);
    for (spec, v) in layout.specs.iter().zip(init.iter_mut()) {
        if !spec.decay() {
            v.iter_mut().for_each(|x| *x += 0.3 * rng.normal() as f32);
        }
    }
    let x = Exec::new(cpu()).unwrap();
    let batch = corpus.train_batch(9, 0, 0, 3, cfg.ctx, (0, 1));
    let upload = |vals: &[Vec<f32>]| {
        vals.iter()
            .zip(&layout.specs)
            .map(|(v, s)| x.upload_f32(v, DType::F32, &s.shape).unwrap())
            .collect::<Vec<_>>()
    };
    let loss_at = |vals: &[Vec<f32>]| -> f64 {
        let model = Model::new(&x, &layout, DType::F32, upload(vals), attention).unwrap();
        let acts = model.forward(&x, &batch).unwrap();
        f64::from(x.read_f32(&acts.loss).unwrap()[0])
    };
    // Analytic gradients, and a second backward pass accumulated on top.
    let model = Model::new(&x, &layout, DType::F32, upload(&init), attention).unwrap();
    let acts = model.forward(&x, &batch).unwrap();
    let dloss = x.full(DType::F32, &[], 1.0).unwrap();
    let grads: Vec<_> = layout
        .specs
        .iter()
        .map(|s| x.full(DType::F32, &s.shape, 7.0).unwrap())
        .collect();
    let mut order = Vec::new();
    model
        .backward(&x, &acts, &dloss, &grads, false, &mut |p| {
            order.push(p);
            Ok(())
        })
        .unwrap();
    assert_eq!(order, (0..layout.specs.len()).collect::<Vec<_>>());
    let analytic: Vec<Vec<f32>> = grads.iter().map(|g| x.read_f32(g).unwrap()).collect();
    model
        .backward(&x, &acts, &dloss, &grads, true, &mut |_| Ok(()))
        .unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (p, spec) in layout.specs.iter().enumerate() {
        let twice = x.read_f32(&grads[p]).unwrap();
        for (a, b) in analytic[p].iter().zip(&twice) {
            assert!(
                (2.0 * a - b).abs() <= 1e-5 * a.abs().max(1e-3),
                "{}: accumulated {b}, single {a}",
                spec.name
            );
        }
        // A few coordinates per parameter, the largest gradient among them.
        let n = spec.numel() as usize;
        let mut coords: Vec<usize> = (0..4).map(|_| rng.below(n)).collect();
        let top = (0..n)
            .max_by(|&i, &j| analytic[p][i].abs().total_cmp(&analytic[p][j].abs()))
            .unwrap();
        coords.push(top);
        for i in coords {
            let eps = 4e-3f32;
            let mut plus = init.clone();
            plus[p][i] += eps;
            let mut minus = init.clone();
            minus[p][i] -= eps;
            let numeric = (loss_at(&plus) - loss_at(&minus)) / (2.0 * f64::from(eps));
            let a = f64::from(analytic[p][i]);
            checked += 1;
            if (a - numeric).abs() > 0.05 * a.abs().max(numeric.abs()) + 5e-4 {
                failures.push(format!(
                    "{}[{i}]: backward {a:.6}, finite difference {numeric:.6}",
                    spec.name
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} gradients wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
