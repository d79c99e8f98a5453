//! What the allocator's integration tests share.

/// A xorshift generator: the same sequence for the same seed on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (`0` for `n == 0`).
    #[allow(dead_code)] // used by model.rs, not stress.rs
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
