//! Model checking with loom of the pool of recycled host callback nodes (`src/host/recycle.rs`,
//! which `src/host/node.rs` uses for ABI 1.2 `host_callback_node`), over the production code: the
//! pool is built on `unihal_hal::sync`, which is loom's under `--cfg loom`, and the loom build of
//! the crate compiles only it, reached through `unihal_plugin::loom_api`.
//!
//! An enqueuer takes nodes (or makes one when the pool has none), plugin threads give them back,
//! and the stream closes the pool, in every interleaving: each node made must be freed exactly
//! once (none leaked, none freed twice), nobody touches a node after it was freed, and a node
//! taken from the pool is one no other thread still writes. A node's payload (in the host: the
//! closure and the uses) and its link are loom cells, and freeing writes both, so an access that
//! the pool's own orderings do not place before another thread's write is a race loom reports.
//! The counters are `Relaxed` loom atomics: they add no synchronisation.
//!
//! Checked against the defects they are for (each made by hand in `recycle.rs`, each failing a
//! model): the give-back's exchange, the take's or the close's weakened to `Relaxed` (loom:
//! "Causality violation"), a take that swaps `returned` (reopening a closed pool for a moment), a
//! give-back that pushes onto a closed pool, and a close that empties the free list before, and
//! outside the lock of, taking `returned` (a concurrent take leaves its chain in the closed pool).
//!
//! Run by `scripts/loom.sh` (with feature `planted-defects`, for the planted two-step close):
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p unihal-plugin
//! --features planted-defects --test loom`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use loom::sync::Arc;
use loom::thread;
use unihal_plugin::loom_api::{Link, Pool, Recycle};

/// A model with at most `preemption_bound` preemptions per execution (`None`: exhaustive). The
/// bounds below keep each model within seconds on a 2-core machine (measured; noted per model).
fn builder(preemption_bound: Option<usize>) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = preemption_bound;
    b
}

/// A node of the model. Its memory is the arena's for the whole execution (so that a defect
/// cannot make the test itself free memory twice); "freeing" it counts, and writes its cells.
struct TestNode {
    id: usize,
    link: Link<TestNode>,
    /// What a holder writes (the host's closure and uses).
    payload: UnsafeCell<usize>,
    /// Handed out by [`Arena::make`] (the taker's "allocation").
    made: AtomicBool,
    /// Times the pool freed it.
    freed: AtomicUsize,
}

// SAFETY: the cells are accessed only through loom's `UnsafeCell` API, whose every access loom
// checks for races (an access not ordered with another thread's write fails the model); the rest
// is atomics.
unsafe impl Send for TestNode {}
// SAFETY: as for Send.
unsafe impl Sync for TestNode {}

// SAFETY: `link` is the node's own field, accessed by the pool alone (this test never touches it
// but to record the free's write); the nodes live in the arena for the whole execution, so every
// pointer the pool holds stays valid, and `free` ends a node's life only in the model's eyes.
unsafe impl Recycle for TestNode {
    fn link(&self) -> &Link<TestNode> {
        assert_eq!(
            self.freed.load(Relaxed),
            0,
            "node {} touched by the pool after it was freed",
            self.id
        );
        &self.link
    }

    unsafe fn free(node: *mut TestNode) {
        // SAFETY: an arena node (alive for the execution); only shared references are made.
        let n = unsafe { &*node };
        assert_eq!(
            n.freed.fetch_add(1, Relaxed),
            0,
            "node {} freed twice",
            n.id
        );
        // Freeing writes the whole node: loom reports any access not ordered before it.
        n.payload.with_mut(|_| ());
        n.link.with_mut(|_| ());
    }
}

/// The model's nodes.
struct Arena {
    nodes: Vec<TestNode>,
}

impl Arena {
    fn new(n: usize) -> Arc<Arena> {
        Arc::new(Arena {
            nodes: (0..n)
                .map(|id| TestNode {
                    id,
                    link: Link::new(std::ptr::null_mut()),
                    payload: UnsafeCell::new(0),
                    made: AtomicBool::new(false),
                    freed: AtomicUsize::new(0),
                })
                .collect(),
        })
    }

    /// "Allocates" node `id` (a taker that found the pool empty makes one).
    fn make(&self, id: usize) -> *mut TestNode {
        let n = &self.nodes[id];
        assert!(!n.made.swap(true, Relaxed), "node {id} made twice");
        n as *const TestNode as *mut TestNode
    }

    /// Takes a node from `pool`, or makes node `fresh`.
    fn take_or_make(&self, pool: &Pool<TestNode>, fresh: usize) -> *mut TestNode {
        pool.take().unwrap_or_else(|| self.make(fresh))
    }

    /// Every node made was freed exactly once; none other was.
    fn check_each_freed_once(&self) {
        for n in &self.nodes {
            let (made, freed) = (n.made.load(Relaxed), n.freed.load(Relaxed));
            assert!(!made || freed > 0, "node {} leaked (never freed)", n.id);
            assert_eq!(
                freed,
                usize::from(made),
                "node {} freed {freed} times",
                n.id
            );
        }
    }
}

/// What a holder of `n` does: its payload is its own (no other thread may still be writing or
/// have freed it).
fn hold(n: *mut TestNode, value: usize) {
    // SAFETY: an arena node (alive for the execution).
    let n = unsafe { &*n };
    assert_eq!(
        n.freed.load(Relaxed),
        0,
        "node {} used after it was freed",
        n.id
    );
    // SAFETY: loom checks this write against every other access of the payload.
    n.payload.with_mut(|p| unsafe { *p = value });
}

/// Gives `n` back to `pool` (the plugin's thread after running the node).
fn give_back(pool: &Arc<Pool<TestNode>>, n: *mut TestNode) {
    // SAFETY: `pool` is alive (this `Arc`) for the whole call; `n` is an arena node this thread
    // alone holds, in no pool, not touched by the caller after.
    unsafe { Pool::give_back(Arc::as_ptr(pool), n) };
}

/// The pool in the state of a stream that had three callbacks queued at once and then two ran:
/// nodes 0 and 1 returned (`returned` is the chain 1, 0; the enqueuers' list is empty), node 2
/// still queued (held by the caller, for a plugin thread).
fn seeded(arena: &Arena) -> (Arc<Pool<TestNode>>, *mut TestNode) {
    let pool = Arc::new(Pool::new());
    let nodes = [arena.make(0), arena.make(1), arena.make(2)];
    for n in nodes {
        hold(n, 1);
    }
    give_back(&pool, nodes[0]);
    give_back(&pool, nodes[1]);
    (pool, nodes[2])
}

/// A plugin thread gives the queued node back while an enqueuer takes two nodes (the first take
/// moves `returned` whole into the enqueuers' list, maybe with the node just given back; the
/// second pops that list, or makes a fresh node once the pool is closed) and gives them back
/// itself, and the stream closes the pool: each node is freed exactly once, a node taken is
/// written by no one else (the write before the give-back is ordered before the taker's), none is
/// used after its free, and a closed pool hands out nothing (a close that emptied the enqueuers'
/// list before taking `returned`, outside the lock, leaves a concurrent take's chain there).
/// Exhaustive (~3.5 s).
fn recycle_while_closing() {
    let arena = Arena::new(5);
    let (pool, queued) = seeded(&arena);
    let queued = queued as usize; // raw pointers are not `Send`
    let plugin = {
        let pool = pool.clone();
        thread::spawn(move || {
            let n = queued as *mut TestNode;
            hold(n, 2);
            give_back(&pool, n);
        })
    };
    let enqueuer = {
        let (pool, arena) = (pool.clone(), arena.clone());
        thread::spawn(move || {
            let x = arena.take_or_make(&pool, 3);
            hold(x, 3);
            let y = arena.take_or_make(&pool, 4);
            assert_ne!(x, y, "one node taken twice");
            hold(y, 3);
            give_back(&pool, x);
            give_back(&pool, y);
        })
    };
    pool.close();
    plugin.join().unwrap();
    enqueuer.join().unwrap();
    assert!(pool.take().is_none(), "a closed pool handed out a node");
    arena.check_each_freed_once();
}

#[test]
fn recycle_races_with_close() {
    builder(None).check(recycle_while_closing);
}

/// Two plugin threads give their nodes back at once (the pushes contend) while the stream closes
/// the pool; then a late enqueue finds none. Exhaustive (~0.1 s).
fn two_give_backs_and_close(plant: bool) {
    let arena = Arena::new(2);
    let pool = Arc::new(Pool::new());
    #[cfg(feature = "planted-defects")]
    if plant {
        pool.plant_two_step_close();
    }
    #[cfg(not(feature = "planted-defects"))]
    let _ = plant;
    let plugins: Vec<_> = (0..2)
        .map(|id| {
            let n = arena.make(id);
            hold(n, 1);
            let (pool, n) = (pool.clone(), n as usize);
            thread::spawn(move || {
                let n = n as *mut TestNode;
                hold(n, 2);
                give_back(&pool, n);
            })
        })
        .collect();
    pool.close();
    for p in plugins {
        p.join().unwrap();
    }
    assert!(pool.take().is_none(), "a closed pool handed out a node");
    arena.check_each_freed_once();
}

#[test]
fn give_backs_race_with_close() {
    builder(None).check(|| two_give_backs_and_close(false));
}

/// The planted defect (`Pool::plant_two_step_close`): the close reads `returned` and then stores
/// `CLOSED` in two steps, so a node given back in between is in neither the chain it frees nor
/// freed by its giver. The model must fail, on that leak.
#[cfg(feature = "planted-defects")]
#[test]
fn planted_two_step_close_is_caught() {
    let r = std::panic::catch_unwind(|| {
        builder(None).check(|| two_give_backs_and_close(true));
    });
    let e = r.expect_err("the model passed with the planted two-step close");
    let msg = unihal_hal::panic_message(&*e).unwrap_or_default();
    assert!(
        msg.contains("leaked (never freed)"),
        "the model failed, but not on the planted close: {msg}"
    );
    eprintln!("planted two-step close caught: {msg}");
}
