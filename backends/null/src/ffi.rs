//! The vendor library's symbol table: one declaration per symbol, with the C signature from the
//! vendor's documentation (never copied from its header), resolved once by the loader.
//!
//! The null runtime opens no library, so the table is empty. A port declares its entry points
//! here, e.g. (CUDA's driver API spelling)
//!
//! ```text
//! pub struct Api {
//!     pub init: unsafe extern "C" fn(flags: c_uint) -> c_int,                    // cuInit
//!     pub mem_alloc: unsafe extern "C" fn(ptr: *mut u64, len: usize) -> c_int,  // cuMemAlloc
//!     ...
//! }
//! ```
//!
//! resolves each with `unihal_dynlib::Library::get` (required) or `optional` (newer versions
//! only), and checks the declarations against the vendor header with bindgen in a test behind a
//! cargo feature (see `backends/dcu-hip/tests/abi.rs`).
