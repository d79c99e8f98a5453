//! Reuse under load: threads allocate on several streams, write a pattern of their own into each
//! block through queued work, drop blocks while that work is queued (so the same stream reuses
//! them at once), hand blocks to a second stream behind an event, and check every live block's
//! bytes. A block handed out while another user's queued work could still touch it would show
//! up as a wrong pattern.

use std::sync::Arc;
use unihal_alloc::{AllocatorConfig, CachingAllocator};
use unihal_hal::{Backend, Buffer, EventFlags, FillValue, Stream};

use crate::support;
use support::Rng;

fn check(s: &Arc<dyn Stream>, b: &Buffer, byte: u8) {
    let mut out = vec![0u8; b.len() as usize];
    s.read(b, 0, &mut out).unwrap();
    assert!(
        out.iter().all(|&x| x == byte),
        "a live block of {} bytes lost its pattern {byte:#x}",
        b.len()
    );
}

#[test]
fn blocks_keep_their_bytes_under_reuse_from_many_threads_and_streams() {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("256M"), Some("1")).unwrap();
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
    let a = Arc::new(CachingAllocator::new(dev.clone(), AllocatorConfig::default()).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (a, dev) = (a.clone(), dev.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9 ^ ((t + 1) * 0x1000_0001));
                let s = [dev.create_stream().unwrap(), dev.create_stream().unwrap()];
                let mut live: Vec<(Buffer, u8, usize)> = Vec::new();
                for i in 0..600u32 {
                    let k = (rng.next() % 2) as usize;
                    let len = 1 + (rng.next() % (3 << 20)) as usize;
                    let b = a.alloc(&s[k], len).unwrap();
                    let byte = ((t as u8) << 6) | ((i % 61) as u8 + 1);
                    s[k].fill(&b, 0, b.len(), FillValue::U8(byte)).unwrap();
                    match rng.next() % 4 {
                        // Dropped with its fill queued: reusable at once on s[k] only.
                        0 => drop(b),
                        // Handed to the other stream behind an event, then kept.
                        1 => {
                            let e = dev.create_event(EventFlags::default()).unwrap();
                            s[k].record_event(&e).unwrap();
                            s[1 - k].wait_event(&e).unwrap();
                            live.push((b, byte, 1 - k));
                        }
                        _ => live.push((b, byte, k)),
                    }
                    if live.len() > 12 || rng.next() % 16 == 0 {
                        let j = (rng.next() as usize) % live.len().max(1);
                        if let Some((b, byte, k)) = (j < live.len()).then(|| live.swap_remove(j)) {
                            check(&s[k], &b, byte);
                        }
                    }
                }
                for (b, byte, k) in live {
                    check(&s[k], &b, byte);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = a.stats();
    assert_eq!(st.allocated_bytes.all.current, 0);
    assert_eq!(st.allocation.all.allocated, 2400);
}
