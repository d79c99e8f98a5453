//! The kernel library's integration tests, one binary (one link): the vectorisation check and the
//! real-compiler gates (ignored in the test command; CI runs them with --ignored).

mod rtc_gates;
mod vectorized;
