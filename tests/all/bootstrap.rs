//! End to end: three ranks bootstrap a world communicator through the TCP store (rank 0 serves the
//! unique id, the others fetch it) and run an all_reduce on it.

use std::sync::Arc;
use std::time::Duration;
use unihal::bootstrap::{init_world, LaunchInfo};
use unihal::{Backend, CommConfig, DType, ReduceOp};

#[test]
fn ranks_bootstrap_through_the_store_and_all_reduce() {
    let backend: Arc<dyn Backend> = Arc::new(unihal_cpu::CpuBackend::with_config(
        unihal_cpu::CpuConfig::from_values(Some("3"), Some("1G"), Some("1")).unwrap(),
    ));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            let backend = backend.clone();
            std::thread::spawn(move || -> unihal::Result<Vec<u8>> {
                let info = LaunchInfo::new(rank, 3, Some(("127.0.0.1".into(), port)));
                let device = backend.open(rank)?;
                let config = CommConfig {
                    timeout: Some(Duration::from_secs(20)),
                };
                let (comm, _store) = init_world(&*backend, &device, &info, &config)?;
                assert_eq!((comm.rank(), comm.size()), (rank, 3));
                let s = device.create_stream()?;
                let b = device.alloc(16)?;
                s.write(&b, 0, &[(rank + 1) as u8; 16])?;
                comm.all_reduce(&b, &b, 16, DType::U8, ReduceOp::Sum, &s)?;
                let mut out = vec![0u8; 16];
                s.read(&b, 0, &mut out)?;
                // Keep the store alive until the others have read the id (they already have:
                // all_reduce needed every rank).
                Ok(out)
            })
        })
        .collect();
    for r in ranks {
        assert_eq!(r.join().unwrap().unwrap(), vec![6u8; 16]);
    }
}
