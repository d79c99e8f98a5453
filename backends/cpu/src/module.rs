//! CPU modules (host symbol tables), functions, and the execution of a launch over the grid.

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;
use unihal_hal::{
    DeviceId, Function, HalError, HostKernel, HostLaunchCtx, HostSymbolTable, Invalid, KernelArgs,
    LaunchConfig, Module, ModuleFormat, Result,
};

/// A loaded host symbol table.
pub struct CpuModule {
    pub(crate) device: DeviceId,
    pub(crate) table: Arc<HostSymbolTable>,
}

impl CpuModule {
    pub(crate) fn new(device: DeviceId, table: &Arc<HostSymbolTable>) -> CpuModule {
        crate::fault::track(crate::fault::Counter::Modules, 1);
        CpuModule {
            device,
            table: table.clone(),
        }
    }
}

impl Drop for CpuModule {
    fn drop(&mut self) {
        crate::fault::track(crate::fault::Counter::Modules, -1);
    }
}

impl Module for CpuModule {
    fn device_id(&self) -> DeviceId {
        self.device
    }

    fn format(&self) -> ModuleFormat {
        ModuleFormat::HostSymbols
    }

    fn function(&self, name: &str) -> Result<Arc<dyn Function>> {
        let kernel = *self.table.get(name).ok_or_else(|| {
            HalError::invalid(
                "name",
                Invalid::Value {
                    value: format!("kernel {name:?}"),
                    accepted: format!(
                        "a kernel of the module: {}",
                        self.table.names().collect::<Vec<_>>().join(", ")
                    ),
                },
            )
        })?;
        Ok(Arc::new(CpuFunction {
            device: self.device,
            name: name.to_string(),
            kernel,
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A host kernel of a loaded module.
pub struct CpuFunction {
    pub(crate) device: DeviceId,
    pub(crate) name: String,
    pub(crate) kernel: HostKernel,
}

impl Function for CpuFunction {
    fn device_id(&self) -> DeviceId {
        self.device
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn param_sizes(&self) -> Option<&[usize]> {
        Some(self.kernel.param_sizes)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Parameter pointers shared by the pool threads running one launch.
struct Params(Vec<*mut c_void>);
// SAFETY: the pointers point into the launch's own KernelArgs, which outlives the launch and is only
// read; kernels receive them as `const`-in-practice parameter values.
unsafe impl Sync for Params {}

impl Params {
    /// A method, so closures capture the whole (Sync) `Params`, not its field.
    fn as_ptr(&self) -> *const *mut c_void {
        self.0.as_ptr()
    }
}

/// Runs every block of a launch, on `pool` when there is one, else on the calling worker thread.
/// Returns the first kernel failure as a vendor error of the CPU runtime.
pub(crate) fn run_launch(
    pool: Option<&crate::compute::ComputePool>,
    function: &CpuFunction,
    config: &LaunchConfig,
    args: &KernelArgs,
) -> Result<()> {
    let params = Params(args.param_ptrs());
    let grid = config.grid.to_array();
    let blocks = config.grid.volume();
    let shared_bytes = config.shared_mem_bytes as usize;
    let run_block = |shared: &mut Vec<u8>, i: u64| -> std::result::Result<(), (i32, [u32; 3])> {
        let gx = grid[0] as u64;
        let gy = grid[1] as u64;
        let block_idx = [
            (i % gx) as u32,
            ((i / gx) % gy) as u32,
            (i / (gx * gy)) as u32,
        ];
        shared.clear();
        shared.resize(shared_bytes, 0);
        let ctx = HostLaunchCtx {
            grid,
            block: config.block.to_array(),
            block_idx,
            shared: shared.as_mut_ptr(),
            shared_bytes: shared_bytes as u64,
        };
        // SAFETY: the caller of Stream::launch (an unsafe fn) promised that the arguments match the
        // kernel's parameters and that every address they hold stays valid; ctx and params live
        // across the call.
        let status = unsafe { (function.kernel.func)(&ctx, params.as_ptr()) };
        if status == 0 {
            Ok(())
        } else {
            Err((status, block_idx))
        }
    };
    let result = match pool {
        Some(pool) if blocks > 1 => {
            // Each participant's block-shared memory, reused across its blocks; the first
            // failure is kept and the blocks not yet started are skipped.
            std::thread_local! {
                static SHARED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
            }
            let failed = std::sync::Mutex::new(None);
            let stop = std::sync::atomic::AtomicBool::new(false);
            pool.for_each(blocks, &|i| {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let r = SHARED.with(|shared| run_block(&mut shared.borrow_mut(), i));
                if let Err(e) = r {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            });
            match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
        _ => {
            let mut shared = Vec::new();
            (0..blocks).try_for_each(|i| run_block(&mut shared, i))
        }
    };
    result.map_err(|(status, b)| HalError::Vendor {
        library: "unihal-cpu".into(),
        call: format!("kernel {}", function.name),
        code: status as i64,
        name: "KERNEL_FAULT".into(),
        message: format!(
            "block ({}, {}, {}) returned status {status}",
            b[0], b[1], b[2]
        ),
    })
}
