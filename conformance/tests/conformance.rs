//! The conformance suite on every backend of this build (`UNIHAL_BACKENDS` selects), one trial per
//! case per device.

fn main() {
    unihal_conformance::harness::libtest_main(unihal::registry());
}
