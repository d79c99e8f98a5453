//! The conformance suite on every backend of this build (`UNIHAL_BACKENDS` selects), one trial per
//! case on each backend's first device; the other devices take part as peer ranks of the
//! collective cases. Every case on every device is the README's main job
//! (`unihal conformance --backend cpu`), which CI runs on every device under the validation layer:
//! this target is the suite as libtest trials, not a second run of the per-device sweep.

fn main() {
    unihal_conformance::harness::libtest_main_on_first(unihal::registry(), 1);
}
