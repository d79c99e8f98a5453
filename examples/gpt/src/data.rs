//! The training data: a character-level corpus built from the repository's own documentation (no
//! download), split into training and held-out text, and the batches drawn from it.
//!
//! Batches are drawn on the host from a seeded generator that every rank runs identically: each
//! step's *global* batch is the same whatever the number of ranks, and rank `r` of `w` takes rows
//! `[r * b / w, (r + 1) * b / w)`. So a run on 1, 2 or 4 devices trains on the same sequences, which
//! is what makes data-parallel runs comparable with a single-device run.

/// The documentation the corpus is made of, embedded at build time.
const SOURCES: [&str; 4] = [
    include_str!("../../../README.md"),
    include_str!("../../../docs/ARCHITECTURE.md"),
    include_str!("../../../docs/RELIABILITY.md"),
    include_str!("../../../docs/BENCHMARKS.md"),
];

/// The corpus is cut into chunks of this many characters; every [`HELDOUT_EVERY`]th chunk is
/// held out, so the held-out text samples every document rather than the end of the last one.
const CHUNK: usize = 1024;
const HELDOUT_EVERY: usize = 10;

/// SplitMix64: the host-side generator of batches, initial weights and samples. Deterministic
/// across platforms and backends.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` and a `stream` (an independent sequence per purpose).
    pub fn new(seed: u64, stream: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.uniform() * n as f64) as usize % n
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// A character-level corpus: its vocabulary and the token ids of its two parts.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// Every distinct character, sorted; a token id is an index into it.
    pub vocab: Vec<char>,
    /// Training text.
    pub train: Vec<i64>,
    /// Held-out text (every tenth chunk of the corpus).
    pub heldout: Vec<i64>,
}

/// One rank's share of a batch: `rows` sequences of `ctx` tokens and their next-token targets,
/// row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub rows: usize,
    pub inputs: Vec<i64>,
    pub targets: Vec<i64>,
}

impl Corpus {
    /// The corpus of the repository's documentation.
    pub fn documentation() -> Corpus {
        Corpus::from_text(&SOURCES.join("\n"))
    }

    /// A corpus of `text` (at least a few hundred characters for useful batches).
    pub fn from_text(text: &str) -> Corpus {
        let chars: Vec<char> = text.chars().collect();
        let mut vocab = chars.clone();
        vocab.sort_unstable();
        vocab.dedup();
        let ids: Vec<i64> = chars
            .iter()
            .map(|c| {
                vocab
                    .binary_search(c)
                    .expect("every character is in the vocabulary") as i64
            })
            .collect();
        let (mut train, mut heldout) = (Vec::new(), Vec::new());
        for (i, chunk) in ids.chunks(CHUNK).enumerate() {
            let part = if i % HELDOUT_EVERY == HELDOUT_EVERY - 1 {
                &mut heldout
            } else {
                &mut train
            };
            part.extend_from_slice(chunk);
        }
        Corpus {
            vocab,
            train,
            heldout,
        }
    }

    /// Token ids of `text` (characters outside the vocabulary are dropped).
    pub fn encode(&self, text: &str) -> Vec<i64> {
        text.chars()
            .filter_map(|c| self.vocab.binary_search(&c).ok().map(|i| i as i64))
            .collect()
    }

    /// The text of token ids.
    pub fn decode(&self, ids: &[i64]) -> String {
        ids.iter().map(|&i| self.vocab[i as usize]).collect()
    }

    /// Rank `rank` of `ranks`' share of the global training batch of `step` (micro-batch `micro`):
    /// `global_rows` sequences at offsets drawn from `seed`, the same on every rank.
    pub fn train_batch(
        &self,
        seed: u64,
        step: usize,
        micro: usize,
        global_rows: usize,
        ctx: usize,
        (rank, ranks): (usize, usize),
    ) -> Batch {
        let mut rng = Rng::new(seed, 1 + ((step as u64) << 16 | micro as u64));
        let span = self.train.len() - ctx - 1;
        let offsets: Vec<usize> = (0..global_rows).map(|_| rng.below(span)).collect();
        let per = global_rows / ranks;
        sequences(&self.train, &offsets[rank * per..(rank + 1) * per], ctx)
    }

    /// The held-out sequences the evaluation uses: `count` sequences at evenly spaced offsets.
    pub fn heldout_batches(&self, count: usize, rows: usize, ctx: usize) -> Vec<Batch> {
        let span = self.heldout.len().saturating_sub(ctx + 1).max(1);
        let offsets: Vec<usize> = (0..count).map(|i| i * span / count.max(1)).collect();
        offsets
            .chunks(rows.max(1))
            .map(|o| sequences(&self.heldout, o, ctx))
            .collect()
    }
}

fn sequences(ids: &[i64], offsets: &[usize], ctx: usize) -> Batch {
    let mut b = Batch {
        rows: offsets.len(),
        inputs: Vec::with_capacity(offsets.len() * ctx),
        targets: Vec::with_capacity(offsets.len() * ctx),
    };
    for &o in offsets {
        b.inputs.extend_from_slice(&ids[o..o + ctx]);
        b.targets.extend_from_slice(&ids[o + 1..o + ctx + 1]);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_share_the_global_batch() {
        let c = Corpus::documentation();
        assert!(
            c.vocab.len() > 60 && c.vocab.len() < 200,
            "{}",
            c.vocab.len()
        );
        assert!(c.heldout.len() > 5000);
        let whole = c.train_batch(7, 3, 0, 8, 16, (0, 1));
        let mut joined = Batch {
            rows: 0,
            inputs: vec![],
            targets: vec![],
        };
        for r in 0..4 {
            let b = c.train_batch(7, 3, 0, 8, 16, (r, 4));
            joined.rows += b.rows;
            joined.inputs.extend(b.inputs);
            joined.targets.extend(b.targets);
        }
        assert_eq!(joined, whole);
        assert_eq!(whole.inputs[1..16], whole.targets[..15]);
        assert_ne!(whole, c.train_batch(7, 4, 0, 8, 16, (0, 1)));
    }

    #[test]
    fn text_round_trips() {
        let c = Corpus::documentation();
        let s = "unihal runs on every backend.";
        assert_eq!(c.decode(&c.encode(s)), s);
    }
}
