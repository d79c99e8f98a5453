//! Dead-rank trials (`unihal_conformance::dead_rank`) on every in-process collective engine this
//! machine can run: the CPU backend's, NCCL (CUDA) and RCCL (HIP) through the simulated NCCL
//! API, and HCCL through the simulated CANN stack. 50 trials each, a 300 ms communicator timeout,
//! a 1.5 s margin. (The MPI engine's ranks are processes; Open MPI 4 ends the whole job when one
//! dies: README, "Under MPI".)

use crate::simulated;

use std::sync::Arc;
use unihal::Backend;
use unihal_conformance::dead_rank::{dead_rank_trials, DeadRankOptions};

/// Every engine's trials at once, each on its own thread: a trial waits on its communicator's
/// timeout, not on the CPU (a serial run used 1 s of CPU in 71 s), so running them together
/// costs their timing nothing (the slowest error came 303 ms after the wait, against a bound of
/// 1.8 s) and the test a quarter of the time.
#[test]
fn dead_ranks_on_every_in_process_engine() {
    if crate::own_process() {
        return;
    }
    type Make = fn() -> Arc<dyn Backend>;
    let engines: [(&str, Make); 4] = [
        ("cpu (in-process engine)", simulated::cpu),
        ("cuda (simulated NCCL)", simulated::cuda),
        ("hip (simulated RCCL)", simulated::hip),
        ("ascend (simulated HCCL)", simulated::ascend),
    ];
    // Each engine's backend made and its two devices opened one engine at a time, before the
    // timed trials run side by side: a first open loads the runtime and probes the device (CPU
    // time), which must not delay another engine's ranks past its 300 ms timeout (a rank whose
    // first round came late made the dying rank's own round time out, once, on a fresh machine).
    type Opened = (&'static str, Arc<dyn Backend>, Vec<Arc<dyn unihal::Device>>);
    let opened: Vec<Opened> = engines
        .iter()
        .map(|&(name, make)| {
            let backend = make();
            let devices = (0..2)
                .map(|i| {
                    backend
                        .open(i)
                        .unwrap_or_else(|e| panic!("{name}: device {i}: {e}"))
                })
                .collect();
            (name, backend, devices)
        })
        .collect();
    let failures: Vec<String> = std::thread::scope(|sc| {
        let running: Vec<_> = opened
            .iter()
            .map(|(name, backend, _devices)| {
                (
                    *name,
                    sc.spawn(move || dead_rank_trials(backend, &DeadRankOptions::default())),
                )
            })
            .collect();
        running
            .into_iter()
            .filter_map(|(name, t)| match t.join() {
                Ok(Ok(r)) if r.trials == 50 => {
                    eprintln!("dead ranks on {name}: {r}");
                    None
                }
                Ok(Ok(r)) => Some(format!("{name}: {} trials, not 50", r.trials)),
                Ok(Err(e)) => Some(format!("{name}: {e}")),
                Err(_) => Some(format!("{name}: the trials panicked")),
            })
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The planted defect: an engine that ignores the communicator's timeout (it waits an hour), as
/// a backend that forgot to pass it on would. The trials must report the hang, not wait for it.
struct IgnoresTimeout(Arc<dyn Backend>);

impl Backend for IgnoresTimeout {
    fn name(&self) -> &'static str {
        "ignores-timeout"
    }
    fn info(&self) -> unihal::BackendInfo {
        self.0.info()
    }
    fn probe(&self) -> unihal::Result<usize> {
        self.0.probe()
    }
    fn open(&self, ordinal: usize) -> unihal::Result<Arc<dyn unihal::Device>> {
        self.0.open(ordinal)
    }
    fn collectives(&self) -> Option<&dyn unihal::Collectives> {
        Some(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl unihal::Collectives for IgnoresTimeout {
    fn capabilities(&self) -> &unihal::CclCaps {
        self.0.collectives().unwrap().capabilities()
    }
    fn unique_id(&self) -> unihal::Result<unihal::UniqueId> {
        self.0.collectives().unwrap().unique_id()
    }
    fn init_rank(
        &self,
        id: &unihal::UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<dyn unihal::Device>,
        _config: &unihal::CommConfig,
    ) -> unihal::Result<Arc<dyn unihal::Communicator>> {
        let hour = unihal::CommConfig {
            timeout: Some(std::time::Duration::from_secs(3600)),
        };
        self.0
            .collectives()
            .unwrap()
            .init_rank(id, nranks, rank, device, &hour)
    }
    fn init_all(
        &self,
        devices: &[Arc<dyn unihal::Device>],
        _config: &unihal::CommConfig,
    ) -> unihal::Result<Vec<Arc<dyn unihal::Communicator>>> {
        let hour = unihal::CommConfig {
            timeout: Some(std::time::Duration::from_secs(3600)),
        };
        self.0.collectives().unwrap().init_all(devices, &hour)
    }
}

#[test]
fn the_trials_catch_an_engine_that_ignores_its_timeout() {
    if crate::own_process() {
        return;
    }
    let planted: Arc<dyn Backend> = Arc::new(IgnoresTimeout(simulated::cpu()));
    let opts = DeadRankOptions {
        trials: 1,
        margin: std::time::Duration::from_millis(200),
        ..DeadRankOptions::default()
    };
    let e = dead_rank_trials(&planted, &opts).expect_err("a hang passed the trials");
    assert!(e.to_string().contains("a hang"), "{e}");
}
