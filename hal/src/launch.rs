//! Launch configurations and kernel arguments.

use crate::buffer::Buffer;
use crate::caps::MandatoryCaps;
use crate::error::{HalError, Invalid, Result};
use std::ffi::c_void;

/// A grid or block shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    /// `(x, 1, 1)`.
    pub const fn x(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }
    /// `x * y * z`, widened.
    pub const fn volume(self) -> u64 {
        self.x as u64 * self.y as u64 * self.z as u64
    }
    /// As an array.
    pub const fn to_array(self) -> [u32; 3] {
        [self.x, self.y, self.z]
    }
}

/// How to launch a kernel: grid of blocks, block of threads, dynamic shared memory per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch.
    pub const fn linear(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid: Dim3::x(blocks),
            block: Dim3::x(threads),
            shared_mem_bytes: 0,
        }
    }

    /// Checks the shape against a device's limits. Zero-sized dimensions are invalid, as on CUDA.
    ///
    /// # Errors
    /// [`Invalid::Value`] naming the first dimension out of range.
    pub fn validate(&self, caps: &MandatoryCaps) -> Result<()> {
        let bad = |arg: &'static str, value: String, accepted: String| {
            Err(HalError::invalid(arg, Invalid::Value { value, accepted }))
        };
        for (i, (&g, &max)) in self.grid.to_array().iter().zip(&caps.max_grid).enumerate() {
            if g == 0 || g > max {
                return bad("grid", format!("grid[{i}] = {g}"), format!("1..={max}"));
            }
        }
        for (i, (&b, &max)) in self
            .block
            .to_array()
            .iter()
            .zip(&caps.max_block)
            .enumerate()
        {
            if b == 0 || b > max {
                return bad("block", format!("block[{i}] = {b}"), format!("1..={max}"));
            }
        }
        let threads = self.block.volume();
        if threads > caps.max_threads_per_block as u64 {
            return bad(
                "block",
                format!("{threads} threads per block"),
                format!("1..={}", caps.max_threads_per_block),
            );
        }
        if self.shared_mem_bytes > caps.max_shared_mem_per_block {
            return bad(
                "shared_mem_bytes",
                self.shared_mem_bytes.to_string(),
                format!("0..={}", caps.max_shared_mem_per_block),
            );
        }
        Ok(())
    }
}

/// One argument value, stored 16-byte aligned. `MaybeUninit` because a struct's padding bytes are
/// copied too.
#[derive(Clone)]
struct Arg {
    words: Box<[std::mem::MaybeUninit<u128>]>,
    size: usize,
}

/// Kernel arguments, packed by value in the order of the kernel's parameters.
///
/// Values are copied in when pushed, and backends copy the whole set at launch, so the arguments may
/// be dropped or reused right after `Stream::launch` returns. Buffers pushed with
/// [`KernelArgs::push_buffer`] are also kept alive by the queued launch.
#[derive(Clone, Default)]
pub struct KernelArgs {
    args: Vec<Arg>,
    buffers: Vec<Buffer>,
}

impl KernelArgs {
    /// No arguments.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a plain value (an integer, float, pointer-sized handle or `#[repr(C)]` struct).
    pub fn push<T: Copy + 'static>(&mut self, value: T) -> &mut Self {
        const {
            assert!(
                std::mem::align_of::<T>() <= 16,
                "kernel arguments are at most 16-aligned"
            )
        };
        let size = std::mem::size_of::<T>();
        let mut words =
            vec![std::mem::MaybeUninit::new(0u128); size.div_ceil(16).max(1)].into_boxed_slice();
        // SAFETY: words holds at least size bytes, is 16-aligned (enough for any T with align <= 16),
        // and T: Copy has no drop glue; we copy its bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &value as *const T as *const u8,
                words.as_mut_ptr() as *mut u8,
                size,
            )
        };
        self.args.push(Arg { words, size });
        self
    }

    /// Appends an argument given as its bytes (`bytes.len()` is its size): how an argument crosses
    /// a boundary that knows only sizes, such as the plugin ABI's `kernelParams`.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> &mut Self {
        let mut words = vec![std::mem::MaybeUninit::new(0u128); bytes.len().div_ceil(16).max(1)]
            .into_boxed_slice();
        // SAFETY: words holds at least bytes.len() bytes; u8 needs no alignment.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                words.as_mut_ptr() as *mut u8,
                bytes.len(),
            )
        };
        self.args.push(Arg {
            words,
            size: bytes.len(),
        });
        self
    }

    /// Appends the device address of a buffer view and keeps the buffer alive for queued launches.
    pub fn push_buffer(&mut self, buffer: &Buffer) -> &mut Self {
        self.buffers.push(buffer.clone());
        self.push(buffer.device_addr())
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// Size in bytes of each argument.
    pub fn sizes(&self) -> Vec<usize> {
        self.args.iter().map(|a| a.size).collect()
    }

    /// Buffers the arguments reference.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// `kernelParams`-style pointers, one per argument, valid while `self` is neither moved nor
    /// mutated. The pointees are only read by kernels.
    pub fn param_ptrs(&self) -> Vec<*mut c_void> {
        self.args
            .iter()
            .map(|a| a.words.as_ptr() as *mut c_void)
            .collect()
    }

    /// Checks the argument sizes against a kernel's parameter sizes.
    ///
    /// # Errors
    /// [`Invalid::Value`] describing the first mismatch.
    pub fn check_against(&self, expected: &[usize]) -> Result<()> {
        let got = self.sizes();
        if got != expected {
            return Err(HalError::invalid(
                "args",
                Invalid::Value {
                    value: format!("argument sizes {got:?}"),
                    accepted: format!("the kernel's parameter sizes {expected:?}"),
                },
            ));
        }
        Ok(())
    }
}
