//! What a collective library lacks is the shared engine's to make up, whatever the library: the
//! simulated NCCL described as lacking an abort, a split and an out-of-place broadcast (a
//! `CollectiveLib` that delegates every raw call to NCCL's and says so) runs the engine's
//! stand-ins and reaper, its emulated split and the root's copy — the paths HCCL takes — on the
//! CUDA platform.

use crate::support;

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;
use support::{controls, simulated_driver};
use unihal_ccl::library::{P2p, RawComm, Round};
use unihal_ccl::nccl::ffi::Nccl;
use unihal_ccl::{CollectiveLib, Engine, LibComm, NCCL};
use unihal_cuda::{CudaBackend, CudaPlatform};
use unihal_hal::{
    Backend, CclCaps, Collectives, CommConfig, Communicator, DType, Device, HalError, ReduceOp,
    Result, Stream,
};

/// NCCL, described as a library without abort, split or out-of-place broadcast.
struct Lacking(Nccl);

impl CollectiveLib for Lacking {
    fn label(&self) -> &'static str {
        "NCCL-lacking"
    }
    fn path(&self) -> &str {
        self.0.path()
    }
    fn version(&self) -> Option<String> {
        CollectiveLib::version(&self.0)
    }
    fn caps(&self) -> CclCaps {
        self.0.caps()
    }
    fn id_kind(&self) -> (&'static str, usize) {
        self.0.id_kind()
    }
    fn blocking_calls(&self) -> (&'static str, &'static str) {
        self.0.blocking_calls()
    }
    fn unique_id(&self) -> Result<Vec<u8>> {
        self.0.unique_id()
    }
    fn init_rank(&self, id: &[u8], nranks: usize, rank: usize) -> Result<RawComm> {
        self.0.init_rank(id, nranks, rank)
    }
    fn init_all(&self, _: &[i32]) -> Option<Result<Vec<RawComm>>> {
        // One rank per thread, as for HCCL.
        None
    }
    fn can_abort(&self) -> bool {
        false
    }
    fn has_split(&self) -> bool {
        false
    }
    fn broadcast_in_place_only(&self) -> bool {
        true
    }
    fn native_avg(&self) -> bool {
        self.0.native_avg()
    }
    unsafe fn release(&self, comm: RawComm, _abort: bool) {
        // SAFETY: the caller's contract, passed on (never an abort: this library has none).
        unsafe { self.0.release(comm, false) }
    }
    unsafe fn async_error(&self, comm: RawComm) -> Result<Option<HalError>> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.async_error(comm) }
    }
    unsafe fn collective(
        &self,
        comm: RawComm,
        round: &Round,
        send: u64,
        recv: u64,
        stream: *mut c_void,
    ) -> Result<()> {
        // An in-place-only broadcast reads and writes the receive buffer.
        let send = match round.call {
            unihal_ccl::library::Call::Broadcast { .. } => recv,
            _ => send,
        };
        // SAFETY: the caller's contract, passed on (the receive range holds the broadcast).
        unsafe { self.0.collective(comm, round, send, recv, stream) }
    }
    unsafe fn p2p(&self, comm: RawComm, calls: &[(P2p, u64)], stream: *mut c_void) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.p2p(comm, calls, stream) }
    }
    unsafe fn split(&self, _: RawComm, _: Option<u32>, _: i32) -> Result<RawComm> {
        Err(HalError::unsupported("no split here".to_string()))
    }
    unsafe fn rank_size(&self, comm: RawComm) -> Result<(usize, usize)> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.rank_size(comm) }
    }
}

fn setup() -> (Arc<CudaBackend>, Engine<Lacking>) {
    let lib = simulated_driver();
    std::env::set_var("UNIHAL_CUDA_LIB", &lib);
    std::env::set_var("UNIHAL_NCCL_LIB", &lib);
    let engine = Engine::with_library(
        "NCCL-lacking",
        || Nccl::load(&NCCL).map(Lacking),
        Arc::new(CudaPlatform::default()),
    );
    (Arc::new(CudaBackend::new()), engine)
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs `f(rank's communicator)` on one thread per rank; the results by rank.
fn on_ranks<T: Send>(
    comms: &[Arc<dyn Communicator>],
    f: impl Fn(&Arc<dyn Communicator>) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = comms.iter().map(|c| sc.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_library_without_split_abort_or_out_of_place_broadcast_gets_the_engines() {
    if crate::own_process() {
        return;
    }
    let (backend, engine) = setup();
    let devs: Vec<Arc<dyn Device>> = (0..2).map(|i| backend.open(i).unwrap()).collect();
    let comms = engine.init_all(&devs, &CommConfig::default()).unwrap();

    // Broadcast out of place from rank 1: the root's send buffer is copied into its receive
    // buffer first, and stays as it was.
    let got = on_ranks(&comms, |c| {
        let d = c.device();
        let s: Arc<dyn Stream> = d.create_stream().unwrap();
        let (send, recv) = (d.alloc(16).unwrap(), d.alloc(16).unwrap());
        let r = c.rank() as u32;
        s.write(&send, 0, &bytes(&[r + 10, r + 20, r + 30, r + 40]))
            .unwrap();
        s.write(&recv, 0, &bytes(&[0; 4])).unwrap();
        c.broadcast(&send, &recv, 4, DType::U32, 1, &s).unwrap();
        let (mut a, mut b) = (vec![0u8; 16], vec![0u8; 16]);
        s.read(&recv, 0, &mut a).unwrap();
        s.read(&send, 0, &mut b).unwrap();
        (u32s(&a), u32s(&b))
    });
    for (r, (recv, send)) in got.iter().enumerate() {
        assert_eq!(recv, &[11, 21, 31, 41], "rank {r}'s receive buffer");
        let r = r as u32;
        assert_eq!(
            send,
            &[r + 10, r + 20, r + 30, r + 40],
            "rank {r}'s send buffer"
        );
    }

    // The emulated split: one color, keys reversed, so the new ranks are swapped; the child
    // all-reduces.
    let children = on_ranks(&comms, |c| {
        let key = -(c.rank() as i32);
        c.split(Some(7), key, &CommConfig::default())
            .unwrap()
            .expect("a color: a child")
    });
    for (old, child) in children.iter().enumerate() {
        assert_eq!((child.rank(), child.size()), (1 - old, 2));
    }
    let sums = on_ranks(&children, |c| {
        let d = c.device();
        let s: Arc<dyn Stream> = d.create_stream().unwrap();
        let b = d.alloc(4).unwrap();
        s.write(&b, 0, &bytes(&[c.rank() as u32 + 1])).unwrap();
        c.all_reduce(&b, &b, 1, DType::U32, ReduceOp::Sum, &s)
            .unwrap();
        let mut out = vec![0u8; 4];
        s.read(&b, 0, &mut out).unwrap();
        u32s(&out)[0]
    });
    assert_eq!(sums, vec![3, 3]);

    // The children's reapers destroy them on threads of their own: wait for both destroys, so
    // that none is counted below as the parents'.
    controls::count_calls(true);
    drop(children);
    let t0 = std::time::Instant::now();
    while controls::calls("ncclCommDestroy") < 2 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        controls::calls("ncclCommDestroy"),
        2,
        "the split's children destroyed"
    );
    // No abort: rank 0 posts an all-reduce rank 1 never joins, then aborts. Its stream fails,
    // rank 1 stops with `Aborted`, and a stand-in from rank 1 (a second `ncclAllReduce`)
    // completes the posted round, so the reapers destroy both communicators at once, long before
    // they would give up on the round (the timeout plus 30 s) and leak them.
    controls::count_calls(true);
    let d0 = comms[0].device();
    let s0: Arc<dyn Stream> = d0.create_stream().unwrap();
    let b0 = d0.alloc(4).unwrap();
    comms[0]
        .all_reduce(&b0, &b0, 1, DType::U32, ReduceOp::Sum, &s0)
        .unwrap();
    comms[0].abort();
    assert!(matches!(s0.synchronize(), Err(HalError::Aborted { .. })));
    assert!(matches!(
        comms[1].async_error(),
        Some(HalError::Aborted { what }) if what.contains("rank 0 aborted")
    ));
    let handle = |c: &Arc<dyn Communicator>| {
        c.as_any()
            .downcast_ref::<LibComm<Lacking>>()
            .expect("the engine's communicator")
            .native()
    };
    let t0 = std::time::Instant::now();
    while controls::calls("ncclCommDestroy") < 2 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (reduces, destroys) = (
        controls::calls("ncclAllReduce"),
        controls::calls("ncclCommDestroy"),
    );
    controls::count_calls(false);
    assert_eq!(reduces, 2, "rank 0's all-reduce and rank 1's stand-in");
    assert_eq!(
        destroys, 2,
        "both communicators destroyed once the round completed"
    );
    assert!(comms.iter().all(|c| handle(c) == 0));
    assert_eq!(controls::violations().0, 0, "{}", controls::violations().1);
}
