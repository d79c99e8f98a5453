//! Free lists by size: segregated bins with a bitmap, so a best-fit search, an insertion and a
//! removal take a few word operations instead of a balanced tree's pointer chasing (the cache hit
//! is on every tensor allocation of a training step).
//!
//! Sizes are multiples of [`MIN_BLOCK`]. Up to [`EXACT_UNITS`] units (2 MiB) each size has a bin
//! of its own; above, a bin covers a sixteenth of a power of two. Bins are ordered by size (every
//! size in a bin is below every size in the next), so the best fit is the smallest entry not
//! below the request in the request's bin, else the smallest entry of the next non-empty bin.
//! Ties go to the lowest slot index, as a tree ordered by (size, slot) would give.

use crate::size::MIN_BLOCK;

/// Sizes up to this many [`MIN_BLOCK`] units have exact bins.
const EXACT_UNITS: u64 = 4096;
/// Bins above the exact ones: 16 per power of two, up to 2^64 bytes.
const BINS: usize = EXACT_UNITS as usize + 1 + 16 * 56;
const WORDS: usize = BINS.div_ceil(64);
const SUMMARY: usize = WORDS.div_ceil(64);

fn class(size: u64) -> usize {
    let units = size / MIN_BLOCK;
    if units <= EXACT_UNITS {
        return units as usize;
    }
    let p = 63 - u64::from(units.leading_zeros()); // >= 12
    EXACT_UNITS as usize + 1 + ((p - 12) * 16 + ((units >> (p - 4)) & 15)) as usize
}

/// Free blocks (size, slot) in size bins.
pub(crate) struct SizeBins<I: Copy + Ord> {
    bins: Vec<Vec<(u64, I)>>,
    /// Bit `c`: bin `c` has entries.
    nonempty: [u64; WORDS],
    /// Bit `w`: word `w` of `nonempty` is not zero (so a search skips empty words at once).
    summary: [u64; SUMMARY],
}

impl<I: Copy + Ord> SizeBins<I> {
    pub fn new() -> Self {
        SizeBins {
            bins: (0..BINS).map(|_| Vec::new()).collect(),
            nonempty: [0; WORDS],
            summary: [0; SUMMARY],
        }
    }

    pub fn insert(&mut self, size: u64, i: I) {
        let c = class(size);
        self.bins[c].push((size, i));
        self.nonempty[c / 64] |= 1 << (c % 64);
        self.summary[c / 4096] |= 1 << ((c / 64) % 64);
    }

    /// Removes an entry that is present.
    pub fn remove(&mut self, size: u64, i: I) {
        let c = class(size);
        let bin = &mut self.bins[c];
        if let Some(p) = bin.iter().position(|&e| e == (size, i)) {
            bin.swap_remove(p);
        }
        if bin.is_empty() {
            self.nonempty[c / 64] &= !(1 << (c % 64));
            if self.nonempty[c / 64] == 0 {
                self.summary[c / 4096] &= !(1 << ((c / 64) % 64));
            }
        }
    }

    /// The first non-empty bin from `c` on.
    fn next_nonempty(&self, c: usize) -> Option<usize> {
        let w = c / 64;
        let word = self.nonempty.get(w)? & (!0u64 << (c % 64));
        if word != 0 {
            return Some(w * 64 + word.trailing_zeros() as usize);
        }
        // The next non-zero word after `w`, from the summary.
        let next = w + 1;
        let (mut s, bit) = (next / 64, next % 64);
        let mut sword = self.summary.get(s)? & (!0u64 << bit);
        loop {
            if sword != 0 {
                let w = s * 64 + sword.trailing_zeros() as usize;
                return Some(w * 64 + self.nonempty[w].trailing_zeros() as usize);
            }
            s += 1;
            sword = *self.summary.get(s)?;
        }
    }

    /// The smallest entry of at least `size` bytes (lowest slot among equals).
    pub fn best_fit(&self, size: u64) -> Option<(u64, I)> {
        let c = class(size);
        let mut at = self.next_nonempty(c)?;
        if at == c {
            if let Some(e) = self.bins[c].iter().filter(|e| e.0 >= size).min() {
                return Some(*e);
            }
            at = self.next_nonempty(c + 1)?;
        }
        self.bins[at].iter().min().copied()
    }

    /// The largest entry's size.
    pub fn largest(&self) -> Option<u64> {
        let w = self.nonempty.iter().rposition(|&w| w != 0)?;
        let c = w * 64 + 63 - self.nonempty[w].leading_zeros() as usize;
        self.bins[c].iter().map(|e| e.0).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn classes_are_ordered_by_size() {
        for seq in [
            (1..20_000u64).collect::<Vec<_>>(),
            (0..55).map(|p| 1u64 << p).collect(),
            (0..55).map(|p| (1u64 << p) * 3 / 2 + 1).collect(),
        ] {
            let classes: Vec<usize> = seq.iter().map(|&u| class(u * MIN_BLOCK)).collect();
            assert!(classes.windows(2).all(|w| w[0] <= w[1]), "{seq:?}");
            assert!(classes.iter().all(|&c| c < BINS));
        }
        assert_eq!(class(512), 1);
        assert_eq!(class(2 << 20), 4096);
        assert_eq!(class((2 << 20) + 512), 4097);
    }

    /// The same answers as a tree ordered by (size, slot), on a random workload.
    #[test]
    fn best_fit_matches_a_tree() {
        let mut bins = SizeBins::new();
        let mut tree = BTreeSet::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..20_000u32 {
            let size = MIN_BLOCK * (1 + next() % (1 << (next() % 20)));
            match next() % 3 {
                0 | 1 => {
                    bins.insert(size, step);
                    tree.insert((size, step));
                }
                _ => {
                    if let Some(&(s, i)) = tree.iter().nth((next() % 8) as usize) {
                        bins.remove(s, i);
                        tree.remove(&(s, i));
                    }
                }
            }
            let want = tree.range((size, 0)..).next().copied();
            assert_eq!(bins.best_fit(size), want, "step {step}, size {size}");
            assert_eq!(bins.largest(), tree.last().map(|e| e.0));
        }
    }
}
