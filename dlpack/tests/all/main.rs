//! The DLPack exchange's integration tests, one binary (one link): round trips, size overflow and
//! numpy as the real consumer and producer.

mod numpy;
mod overflow;
mod roundtrip;
