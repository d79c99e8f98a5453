//! The default model learns: with a fixed seed, the held-out loss after 200 steps at the default
//! size is at most 60% of its value at step 0, on the CPU backend (f32, one device).

use gpt::{Corpus, TrainConfig};

#[test]
fn heldout_loss_falls_below_60_percent_in_200_steps() {
    let backend = unihal::registry().get("cpu").unwrap();
    let cfg = TrainConfig::default();
    assert_eq!(cfg.steps, 200);
    let r = gpt::train_devices(&*backend, 1, &Corpus::documentation(), &cfg, &|_| {}).unwrap();
    let (first, last) = (r.heldout[0], *r.heldout.last().unwrap());
    eprintln!("held-out loss: {:?}", r.heldout);
    assert_eq!((first.0, last.0), (0, 200));
    assert!(
        last.1 <= 0.6 * first.1,
        "held-out loss {} -> {} after 200 steps: above 60%",
        first.1,
        last.1
    );
}
