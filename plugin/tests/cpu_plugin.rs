//! The whole conformance suite, collectives included, on the CPU backend loaded as a plugin
//! (`libunihal_cpu_plugin.so`) through the C ABI, in a host built without the linked-in CPU
//! backend: this test binary depends on unihal-plugin and the suite only, so no call can reach
//! a CPU backend except through the plugin's table. Each case runs on device 0, the other
//! devices taking part as peer ranks: the linked CPU suite (conformance/tests/conformance.rs)
//! runs every case on every device, and what this target proves is the route.

mod support;

fn main() {
    // A static, not a leaked box: reachable to the end, so LeakSanitizer does not report it.
    static REGISTRY: std::sync::OnceLock<unihal_hal::Registry> = std::sync::OnceLock::new();
    let registry = REGISTRY.get_or_init(unihal_hal::Registry::new);
    let lib = support::built("libunihal_cpu_plugin.so");
    let name = unihal_plugin::host::register(registry, &lib, &[], &[])
        .unwrap_or_else(|e| panic!("the CPU plugin {} must load: {e}", lib.display()));
    assert_eq!(name, "cpu");
    assert_eq!(registry.names(), vec!["cpu".to_string()]);
    unihal_conformance::harness::libtest_main_on_first(registry, 1);
}
