//! Kernels in the simulator. A module is PTX text (as NVRTC produces it): the simulator reads each
//! `.entry` name and its parameter sizes, and runs the host function registered under that name
//! (unihal's portable library provides one for every kernel, with CUDA's `kernelParams` calling
//! convention). Binary images (cubin, fatbin) are rejected as invalid images, and an entry without
//! a registered host function is reported unsupported at launch: nothing is faked.

use crate::error::{SimError, SimResult};
use std::collections::HashMap;
use unihal_hal::HostKernelFn;

/// Runs every block of a launch of host kernel `name` in order on the calling thread, each with
/// a fresh zeroed shared-memory area of `shared_bytes`; the first block that returns non-zero is
/// [`SimError::LaunchFailed`].
///
/// # Safety
/// `f` follows the host-kernel ABI; `params` holds one pointer per parameter, each to a value of
/// that parameter's size, alive for the call. The kernel's own memory accesses are the
/// launcher's contract, as on a GPU.
pub unsafe fn run_blocks(
    f: HostKernelFn,
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    params: &[*mut std::ffi::c_void],
) -> SimResult<()> {
    let mut shared = vec![0u8; shared_bytes as usize];
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                shared.fill(0);
                let ctx = unihal_hal::HostLaunchCtx {
                    grid,
                    block,
                    block_idx: [x, y, z],
                    shared: shared.as_mut_ptr(),
                    shared_bytes: shared_bytes as u64,
                };
                // SAFETY: the caller's contract on `f` and `params`; ctx and shared outlive the
                // call.
                let status = unsafe { f(&ctx, params.as_ptr()) };
                if status != 0 {
                    return Err(SimError::LaunchFailed(format!(
                        "kernel {name} block ({x}, {y}, {z}) returned {status}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// One `.entry` of a PTX module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Size in bytes of each parameter, in order.
    pub param_sizes: Vec<usize>,
}

/// The entries of a PTX module.
///
/// # Errors
/// [`SimError::InvalidImage`] for ELF (cubin) or fatbin images, for text that is not PTX
/// and for an entry whose parameters cannot be read.
pub fn parse_ptx(image: &[u8]) -> SimResult<Vec<Entry>> {
    if image.starts_with(b"\x7fELF") || image.starts_with(&0xBA55_ED50u32.to_le_bytes()) {
        return Err(SimError::InvalidImage(
            "a binary image (cubin or fatbin): the simulator runs PTX only".into(),
        ));
    }
    let text = std::str::from_utf8(image.strip_suffix(&[0]).unwrap_or(image))
        .map_err(|_| SimError::InvalidImage("not PTX text".into()))?;
    if !text.contains(".version") || !text.contains(".target") {
        return Err(SimError::InvalidImage(
            "not PTX text (no .version/.target)".into(),
        ));
    }
    let entries = unihal_kernels::rtc::ptx_signatures(text).map_err(SimError::InvalidImage)?;
    Ok(entries
        .into_iter()
        .map(|e| Entry {
            name: e.name,
            param_sizes: e.param_sizes,
        })
        .collect())
}

/// Host functions by kernel name: what the simulator can run.
#[derive(Default, Clone)]
pub struct Kernels {
    map: HashMap<String, HostKernelFn>,
}

impl Kernels {
    /// An empty registry.
    pub fn new() -> Kernels {
        Kernels::default()
    }

    /// Registers the host function that runs the entry `name`.
    pub fn insert(&mut self, name: impl Into<String>, f: HostKernelFn) {
        self.map.insert(name.into(), f);
    }

    /// The host function of `name`.
    pub fn get(&self, name: &str) -> Option<HostKernelFn> {
        self.map.get(name).copied()
    }
}

/// Launch limits of the simulated device (those of a current NVIDIA GPU).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_threads_per_block: u32,
    pub max_block: [u32; 3],
    pub max_grid: [u32; 3],
    pub max_shared_bytes: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_threads_per_block: 1024,
            max_block: [1024, 1024, 64],
            max_grid: [i32::MAX as u32, 65535, 65535],
            max_shared_bytes: 48 * 1024,
        }
    }
}

impl Limits {
    /// Checks a launch shape.
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] naming the limit a launch exceeds (or a zero dimension).
    pub fn check(&self, grid: [u32; 3], block: [u32; 3], shared: u32) -> SimResult<()> {
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        let bad = |what: String| Err(SimError::InvalidValue(what));
        if grid.contains(&0) || block.contains(&0) {
            return bad(format!(
                "grid {grid:?} or block {block:?} has a zero dimension"
            ));
        }
        if threads > self.max_threads_per_block as u64 {
            return bad(format!(
                "{threads} threads per block > {}",
                self.max_threads_per_block
            ));
        }
        for d in 0..3 {
            if block[d] > self.max_block[d] || grid[d] > self.max_grid[d] {
                return bad(format!(
                    "grid {grid:?} / block {block:?} beyond {:?} / {:?}",
                    self.max_grid, self.max_block
                ));
            }
        }
        if shared > self.max_shared_bytes {
            return bad(format!(
                "{shared} bytes of shared memory > {}",
                self.max_shared_bytes
            ));
        }
        Ok(())
    }
}
