//! An idle CPU backend uses no CPU: stream workers and compute pools sleep when they have no work.
#![cfg(not(loom))] // the loom build compiles only the protocols loom checks

#[cfg(target_os = "linux")]
#[test]
fn idle_streams_and_pools_do_not_spin() {
    // It measures the whole process's CPU time: the other tests of the binary must not count.
    if crate::own_process() {
        return;
    }
    use unihal_cpu::{CpuBackend, CpuConfig};
    use unihal_hal::Backend;

    /// CPU time (user + system) of this process, in clock ticks.
    fn cpu_ticks() -> u64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    let backend =
        CpuBackend::with_config(CpuConfig::from_values(Some("2"), Some("1G"), Some("2")).unwrap());
    let mut streams = Vec::new();
    for d in 0..2 {
        let dev = backend.open(d).unwrap();
        for _ in 0..8 {
            let s = dev.create_stream().unwrap();
            let b = dev.alloc(1 << 16).unwrap();
            s.fill(&b, 0, 1 << 16, unihal_hal::FillValue::U8(1))
                .unwrap();
            s.synchronize().unwrap();
            streams.push(s);
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(100)); // past every spin phase
    let before = cpu_ticks();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let used = cpu_ticks() - before;
    // 16 spinning workers would burn ~800 ticks (at 100 Hz, 16 threads x 0.5 s) on 2 cores; idle
    // workers burn none. Allow a few ticks of noise.
    assert!(used <= 5, "idle process used {used} clock ticks in 0.5 s");
    drop(streams);
}
