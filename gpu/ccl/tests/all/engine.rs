//! The engine's two instances, NCCL and RCCL, against unihal's simulated NCCL (one library that
//! exports the API under both all-to-all spellings): each resolves its own spelling, reports
//! itself under its own name, makes ids, and checks arguments before touching a device. Runs
//! with devices (collectives, abort, timeouts) are the CUDA backend's tests and conformance runs.

use crate::support;

use std::sync::{Arc, Once};
use support::{simulated_library, NoDevices};
use unihal_ccl::nccl::conv;
use unihal_ccl::nccl::ffi::Nccl;
use unihal_ccl::{Flavor, NcclEngine as Engine, NCCL, RCCL};
use unihal_hal::{Backend, CollectiveOp, Collectives, CommConfig, HalError, Invalid, UniqueId};

/// Both override variables name the simulated library (set once, before any engine opens it).
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let lib = simulated_library();
        std::env::set_var("UNIHAL_NCCL_LIB", &lib);
        std::env::set_var("UNIHAL_RCCL_LIB", &lib);
    });
}

fn engine(flavor: Flavor) -> Engine {
    setup();
    Engine::new(flavor, Arc::new(NoDevices))
}

#[test]
fn each_instance_resolves_its_own_all_to_all_spelling() {
    if crate::own_process() {
        return;
    }
    setup();
    let nccl = Nccl::load(&NCCL).unwrap();
    let rccl = Nccl::load(&RCCL).unwrap();
    assert_eq!(nccl.all_to_all_name, Some("ncclAlltoAll"));
    assert_eq!(rccl.all_to_all_name, Some("ncclAllToAll"));
    assert_eq!((nccl.label, rccl.label), ("NCCL", "RCCL"));
    assert!(nccl.comm_split.is_some() && rccl.comm_split.is_some());
    assert_eq!(
        nccl.version(),
        23007,
        "the simulator answers as NCCL 2.30.7"
    );
}

#[test]
fn capabilities_and_errors_carry_the_instance_name() {
    if crate::own_process() {
        return;
    }
    for (flavor, label) in [(NCCL, "NCCL"), (RCCL, "RCCL")] {
        let e = engine(flavor);
        let caps = e.capabilities();
        assert!(
            caps.engine.starts_with(&format!("{label} 2.30.7 (")),
            "{}",
            caps.engine
        );
        for op in CollectiveOp::ALL {
            assert_eq!(caps.ops[&op].len(), 10, "{label} {op:?}");
        }
        assert!(caps.groups && caps.split && caps.timeout_aborts_peers);
        let lib = e.lib().unwrap();
        match conv::vendor(lib, "ncclAllReduce", 5) {
            HalError::Vendor {
                library,
                name,
                code,
                ..
            } => {
                assert_eq!(
                    (library.as_str(), name.as_str(), code),
                    (label, "ncclInvalidUsage", 5)
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn unique_ids_are_128_distinct_bytes() {
    if crate::own_process() {
        return;
    }
    for flavor in [NCCL, RCCL] {
        let e = engine(flavor);
        let (a, b) = (e.unique_id().unwrap(), e.unique_id().unwrap());
        assert_eq!(a.0.len(), 128);
        assert_ne!(a, b);
    }
}

#[test]
fn bad_arguments_are_refused_before_any_device_is_touched() {
    if crate::own_process() {
        return;
    }
    let e = engine(RCCL);
    let cpu = unihal_cpu::CpuBackend::new();
    let dev = cpu.open(0).unwrap();
    let cfg = CommConfig::default();
    match e.init_rank(&UniqueId(vec![1; 5]), 2, 0, &dev, &cfg) {
        Err(HalError::InvalidArgument {
            arg: "id",
            reason: Invalid::Value { accepted, .. },
        }) => {
            assert!(accepted.contains("RCCL unique id"), "{accepted}")
        }
        other => panic!("a 5-byte id: {:?}", other.map(|_| ())),
    }
    let id = e.unique_id().unwrap();
    assert!(matches!(
        e.init_rank(&id, 2, 2, &dev, &cfg).map(|_| ()),
        Err(HalError::InvalidArgument { arg: "rank", .. })
    ));
    // Another backend's device: the platform names it.
    match e.init_rank(&id, 1, 0, &dev, &cfg).map(|_| ()) {
        Err(HalError::InvalidArgument {
            arg: "device",
            reason: Invalid::ForeignHandle { found, .. },
        }) => assert!(found.contains("cpu:0"), "{found}"),
        other => panic!("a CPU device: {other:?}"),
    }
    assert!(matches!(
        e.init_all(std::slice::from_ref(&dev), &cfg).map(|_| ()),
        Err(HalError::InvalidArgument { arg: "device", .. })
    ));
}
