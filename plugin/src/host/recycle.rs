//! A pool of recycled nodes shared between the threads that take them and the threads that give
//! them back: the list mechanics of the host callback nodes (`node.rs`), generic over the node so
//! that loom checks this very code (`tests/loom.rs`, through the hidden `loom_api`).
//!
//! Two lists. `returned` is a lock-free stack that any thread pushes a node onto
//! ([`Pool::give_back`]: one compare-exchange); a push cannot suffer ABA, because the only pops
//! take the whole stack in one step. `free` is the takers' list behind a short lock
//! ([`Pool::take`]), refilled by taking `returned` whole when it runs dry. [`Pool::close`] swaps
//! `returned` for a sentinel, `CLOSED`, in one step and frees both lists: a node pushed before
//! the swap is in the chain the close frees, a node given back after it sees the sentinel and is
//! freed by its giver. So each node is freed exactly once, whatever the interleaving.
//!
//! Ownership: a node is in one place at a time: held by one thread (which made it, or took it),
//! or in the pool. The pool frees the nodes it holds ([`Recycle::free`]) when closed or dropped;
//! it never makes one (a taker that gets none makes its own, and gives it back like any other).
//!
//! Thread safety: [`Pool::take`], [`Pool::give_back`] and [`Pool::close`] may run on any threads
//! at the same time (in the host an enqueue never races with the close, which runs when the
//! stream goes; the model checks that race too). Built on `unihal_hal::sync`, so under
//! `--cfg loom` the same code runs on loom's primitives, and a node's link is a loom cell whose
//! every access loom checks for races.

use std::ptr::null_mut;
use unihal_hal::sync::{AtomicPtr, Mutex, Ordering, UnsafeCell};

/// A node's link: the next node in its pool's lists. The pool's alone: only the pool reads or
/// writes it, and only while it holds the node (the node is in a list or being pushed).
pub type Link<T> = UnsafeCell<*mut T>;

/// A node a [`Pool`] can hold: it carries its [`Link`], and the pool knows how to free it.
///
/// `Send`: a node given back on one thread is taken on another.
///
/// # Safety
/// [`Recycle::link`] returns the same cell for the node's whole life, and nothing but the pool
/// accesses that cell. A node handed to a pool (by [`Pool::give_back`]) stays valid until the
/// pool frees it with [`Recycle::free`], which ends its life.
pub unsafe trait Recycle: Send + Sized {
    /// The node's link.
    fn link(&self) -> &Link<Self>;

    /// Frees `node` (the pool is done with it: it is neither in a list nor touched again).
    ///
    /// # Safety
    /// `node` is a node the pool held, no longer reachable from it, freed only here.
    unsafe fn free(node: *mut Self);
}

/// `returned` of a closed pool: the address of a private static, which no node can have.
fn closed<T>() -> *mut T {
    static CLOSED: u8 = 0;
    std::ptr::addr_of!(CLOSED) as *mut T
}

/// The takers' list: a chain of nodes linked through their [`Link`]s.
struct FreeList<T>(*mut T);

// SAFETY: the chain's nodes are reached only behind the pool's lock (this list), and nodes are
// `Send` (`Recycle`'s bound).
unsafe impl<T: Recycle> Send for FreeList<T> {}

/// A pool of recycled nodes (see the module docs). `Send + Sync`: every operation may run on any
/// thread.
pub struct Pool<T: Recycle> {
    free: Mutex<FreeList<T>>,
    returned: AtomicPtr<T>,
    /// The planted defect of the loom model (see [`Pool::plant_two_step_close`]).
    #[cfg(all(loom, feature = "planted-defects"))]
    planted_two_step_close: std::sync::atomic::AtomicBool,
}

impl<T: Recycle> Default for Pool<T> {
    fn default() -> Pool<T> {
        Pool::new()
    }
}

impl<T: Recycle> Pool<T> {
    /// An empty, open pool.
    pub fn new() -> Pool<T> {
        Pool {
            free: Mutex::new(FreeList(null_mut())),
            returned: AtomicPtr::new(null_mut()),
            #[cfg(all(loom, feature = "planted-defects"))]
            planted_two_step_close: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A node of the pool, now the caller's alone (to hand to whoever gives it back), or `None`
    /// when the pool has none (or is closed): the caller then makes one.
    pub fn take(&self) -> Option<*mut T> {
        let mut free = self.free.lock();
        if free.0.is_null() {
            free.0 = self.take_returned();
        }
        let n = free.0;
        if n.is_null() {
            return None;
        }
        // SAFETY: a node in `free` is the pool's alone (behind the lock) and alive (`Recycle`'s
        // contract); its link was written before it was pushed, which the exchange that took
        // `returned` (`Acquire`) ordered before this read.
        free.0 = unsafe { &*n }.link().with(|p| unsafe { *p });
        Some(n)
    }

    /// `returned` whole (null when empty or closed), for `free` (whose lock the caller holds).
    fn take_returned(&self) -> *mut T {
        // A compare-exchange, not a swap: a closed pool stays closed (a swap would reopen it for
        // a moment, and a node pushed then would be lost). No ABA: only this (under the lock) and
        // `close` pop, and once closed `returned` never changes again, so the head read here is
        // still the same chain when the exchange succeeds.
        let mut head = self.returned.load(Ordering::Relaxed);
        loop {
            if head.is_null() || head == closed() {
                return null_mut();
            }
            match self.returned.compare_exchange_weak(
                head,
                null_mut(),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return head,
                Err(h) => head = h,
            }
        }
    }

    /// Puts `n` back into the pool at `pool`, or frees it ([`Recycle::free`]) when the pool is
    /// closed. Lock-free: one compare-exchange when uncontended.
    ///
    /// A raw pool pointer, not `&self`: the pool may be freed as soon as the node is in it (in the
    /// host a node's `Arc` keeps its pool, and the close may free the node at once), so it is
    /// not borrowed past that point; it is not touched after.
    ///
    /// # Safety
    /// `pool` points to a live pool, kept alive until this call puts `n` into it or frees it
    /// (e.g. by `n` itself). `n` is alive, the caller's alone, in no pool and freeable by
    /// [`Recycle::free`]; the caller does not touch it after.
    pub unsafe fn give_back(pool: *const Pool<T>, n: *mut T) {
        // SAFETY: `pool` is alive here (the caller's promise); a raw pointer to the field, so no
        // borrow of the pool outlives a step below.
        let returned: *const AtomicPtr<T> = unsafe { std::ptr::addr_of!((*pool).returned) };
        // SAFETY: the pool lives until `n` is in it or freed (the caller's promise).
        let mut head = unsafe { &*returned }.load(Ordering::Relaxed);
        loop {
            if head == closed() {
                // Closed for good: nobody can reach `n` through the pool. The pool is not read
                // after (freeing `n` may free it).
                // SAFETY: `n` is ours alone and freeable (the caller's promise).
                unsafe { T::free(n) };
                return;
            }
            // SAFETY: ours alone until the exchange below publishes it (`Release`, with this
            // write).
            unsafe { &*n }.link().with_mut(|p| unsafe { *p = head });
            // SAFETY: `n` is still ours, so the pool is still alive.
            let exchanged = unsafe { &*returned }.compare_exchange_weak(
                head,
                n,
                Ordering::Release,
                Ordering::Relaxed,
            );
            match exchanged {
                // `n`, and maybe the pool, may be gone from here on: neither is touched again.
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Closes the pool: frees every node it holds, and makes every node given back from now on
    /// free itself. Idempotent; [`Pool::take`] then finds none.
    pub fn close(&self) {
        // Under the takers' lock, so that a concurrent take cannot move `returned` into `free`
        // after `free` was emptied; the frees run after it (they may do anything).
        let (free, returned) = {
            let mut free = self.free.lock();
            let returned = self.close_returned();
            (std::mem::replace(&mut free.0, null_mut()), returned)
        };
        for head in [free, returned] {
            let mut n = head;
            while !n.is_null() && n != closed() {
                // SAFETY: a chain taken whole (the lock's list, or `returned` by the swap), its
                // nodes the pool's alone and alive, their links written before they were pushed
                // (the swap's `Acquire` orders those writes before this read).
                let next = unsafe { &*n }.link().with(|p| unsafe { *p });
                // SAFETY: unreachable from the pool now (taken whole), freed only here.
                unsafe { T::free(n) };
                n = next;
            }
        }
    }

    /// Swaps `returned` for `CLOSED` in one step (a push lands before, in the chain returned, or
    /// after, on `CLOSED`); the chain.
    fn close_returned(&self) -> *mut T {
        #[cfg(all(loom, feature = "planted-defects"))]
        if self
            .planted_two_step_close
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            // The planted defect: a node pushed between the load and the store is lost.
            let chain = self.returned.load(Ordering::Acquire);
            self.returned.store(closed(), Ordering::Relaxed);
            return chain;
        }
        self.returned.swap(closed(), Ordering::Acquire)
    }

    /// Plants the defect the loom model must catch: [`Pool::close`] reads `returned` and then
    /// stores `CLOSED` in two steps instead of one swap, so a node given back in between is lost
    /// (never freed). Set before the pool is shared.
    #[cfg(all(loom, feature = "planted-defects"))]
    pub fn plant_two_step_close(&self) {
        self.planted_two_step_close
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl<T: Recycle> Drop for Pool<T> {
    /// Frees the nodes still held (a pool dropped without [`Pool::close`] leaks none).
    fn drop(&mut self) {
        self.close();
    }
}
