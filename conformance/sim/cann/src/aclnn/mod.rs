//! The aclnn operators: both phases of every operator the op map lists for the unihal catalogue
//! (A.4) and that its compositions need (A.5), on the descriptors of [`crate::nnopbase`].
//!
//! **Phase 1** (`aclnnXxxGetWorkspaceSize`) is host work: it reads the descriptors, checks the
//! operator and every dtype against the chip's table ([`crate::soc`]), plans the computation
//! (shapes, broadcasting, strides: an invalid call fails here with `ACLNN_ERR_PARAM_INVALID`)
//! and returns the workspace size and an executor. **Phase 2** (`aclnnXxx`) checks the executor
//! (made by this operator's phase 1, not run before unless repeatable, its descriptors still
//! alive), the workspace (at least the size phase 1 asked for, device memory of the stream's
//! device) and enqueues the computation on the stream. The workspace is really used: the
//! kernels' scratch and the compositions' intermediates live in it, so a workspace that is too
//! small is refused and one freed before the operator ran is refused by the runtime's free.
//!
//! Computation runs through unihal's portable kernel library compiled for the host (the same
//! kernels as the CPU backend), reading the descriptors as written: strides and offsets are the
//! views' own, broadcasting follows numpy's rules. Where aclnn's semantics have no kernel in the
//! library (NLL loss, element scatter-add, the random-number operators with the NPU's own
//! generator, the dropout bit mask), the simulator computes on the host in [`host`].

pub mod clip;
pub mod elementwise;
pub mod host;
pub mod loss;
pub mod nn;
pub mod optim;
pub mod random;
pub mod reduce;
pub mod transformer;

use crate::conv::*;
use crate::nnopbase::{self, Dep, Kind, Tensor};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use unihal_hal::{Buffer, DType, DeviceAllocation, DeviceId, MandatoryCaps, OpCall, TensorView};
use unihal_kernels::plan::Plan;
use unihal_sim::{Kernels, SimError, Work};

/// What an operator's phase 1 produces: the computation, built again at phase 2 with the real
/// workspace address.
pub type Program = Arc<dyn Fn(&mut Build) -> Result<(), Err> + Send + Sync>;

/// An `aclOpExecutor`: made by phase 1, consumed by phase 2.
pub struct Executor {
    op: &'static str,
    deps: Vec<Dep>,
    touches: Vec<(u64, u64)>,
    workspace: u64,
    program: Program,
    /// Set by `aclSetAclOpExecutorRepeatable`: phase 2 keeps it for another run.
    repeatable: AtomicBool,
}

/// The live executors, by handle (the address of the `Executor` in its `Arc`). The registry
/// owns them: a handle is only ever looked up here, never dereferenced, so a spent, destroyed
/// or foreign handle (or two threads running one executor) is an error, never a use after free.
fn executors() -> &'static Mutex<HashMap<usize, Arc<Executor>>> {
    static E: OnceLock<Mutex<HashMap<usize, Arc<Executor>>>> = OnceLock::new();
    E.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The live executor behind a handle.
fn executor_of(h: *mut Executor) -> Option<Arc<Executor>> {
    executors().lock().get(&(h as usize)).cloned()
}

/// The device memory a descriptor names, as a HAL buffer for planning (never dereferenced by
/// the HAL: the kernel library reads the addresses when the work runs).
struct Raw {
    addr: u64,
    len: u64,
}

// SAFETY: plain numbers: the range is only described, never accessed through this value.
unsafe impl DeviceAllocation for Raw {
    fn device(&self) -> DeviceId {
        DeviceId {
            backend: "cann-sim",
            ordinal: 0,
        }
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Placeholder workspace address of phase 1's dry run (aligned, never dereferenced).
const DRY_WORKSPACE: u64 = 0x7e57_0000_0000;

enum Step {
    Plan(Plan),
    Host(Box<dyn FnOnce() -> Result<(), String> + Send>),
}

/// Building an operator's computation: views of its descriptors, intermediates in the
/// workspace, and the steps that run in order on the stream.
pub struct Build {
    ws: u64,
    used: u64,
    steps: Vec<Step>,
}

pub(crate) fn caps() -> &'static MandatoryCaps {
    static C: OnceLock<MandatoryCaps> = OnceLock::new();
    C.get_or_init(|| MandatoryCaps {
        memory_bytes: 1 << 40,
        alloc_alignment: 512,
        compute_units: 1,
        warp_size: 1,
        max_grid: [i32::MAX as u32, 65535, 65535],
        max_block: [1024, 1024, 64],
        max_threads_per_block: 1024,
        max_shared_mem_per_block: 48 * 1024,
        module_formats: Vec::new(),
    })
}

fn kernels() -> &'static Kernels {
    static K: OnceLock<Kernels> = OnceLock::new();
    K.get_or_init(unihal_sim::gpu::host_kernels)
}

/// A phase-1 failure of the plan (an invalid call).
pub fn invalid(e: impl std::fmt::Display) -> Err {
    Err::new(ACLNN_ERR_PARAM_INVALID, e.to_string())
}

impl Build {
    /// The view of a descriptor as unihal's tensor view.
    ///
    /// # Errors
    /// `ACLNN_ERR_PARAM_INVALID` for a dtype the simulator does not compute in.
    pub fn view(&self, t: &Tensor) -> Result<TensorView, Err> {
        let dt = t.dt()?;
        let len = t.storage_numel() as u64 * dt.size() as u64;
        Ok(TensorView {
            buffer: Buffer::from_allocation(Raw { addr: t.data, len }),
            offset: t.offset as u64 * dt.size() as u64,
            dtype: dt,
            shape: t.view.iter().map(|&d| d as u64).collect(),
            strides: t.strides.clone(),
        })
    }

    /// `bytes` of the workspace (256-byte aligned), as an address.
    pub fn scratch(&mut self, bytes: u64) -> u64 {
        let at = self.used.next_multiple_of(256);
        self.used = at + bytes.max(1);
        self.ws + at
    }

    /// A contiguous intermediate tensor in the workspace.
    pub fn temp(&mut self, dtype: DType, shape: &[u64]) -> TensorView {
        let n: u64 = shape.iter().product();
        let addr = self.scratch(n * dtype.size() as u64);
        TensorView::contiguous(
            &Buffer::from_allocation(Raw {
                addr,
                len: n.max(1) * dtype.size() as u64,
            }),
            dtype,
            shape,
        )
    }

    /// Runs `call` through the kernel library (its scratch in the workspace).
    ///
    /// # Errors
    /// `ACLNN_ERR_PARAM_INVALID` when the library refuses the call.
    pub fn call(&mut self, call: OpCall) -> Result<(), Err> {
        let mut plan = unihal_kernels::plan::plan(&call, caps()).map_err(invalid)?;
        if plan.scratch_bytes > 0 {
            let base = self.scratch(plan.scratch_bytes);
            plan.bind_scratch(base);
        }
        for l in &plan.launches {
            if kernels().get(&l.kernel).is_none() {
                return Err(invalid(format!("no kernel {}", l.kernel)));
            }
        }
        self.steps.push(Step::Plan(plan));
        Ok(())
    }

    /// Drops the last step (a call planned only to validate it in phase 1).
    pub fn pop(&mut self) {
        self.steps.pop();
    }

    /// A step computed on the host (for aclnn semantics the kernel library has no kernel for).
    pub fn host(&mut self, f: impl FnOnce() -> Result<(), String> + Send + 'static) {
        self.steps.push(Step::Host(Box::new(f)));
    }
}

pub(crate) fn run_plan(plan: &mut Plan) -> Result<(), SimError> {
    for l in &mut plan.launches {
        let f = kernels()
            .get(&l.kernel)
            .ok_or_else(|| SimError::Unsupported(format!("kernel {}", l.kernel)))?;
        let grid = [l.config.grid.x, l.config.grid.y, l.config.grid.z];
        let block = [l.config.block.x, l.config.block.y, l.config.block.z];
        let mut args = l.args;
        let params = [&mut args as *mut _ as *mut c_void];
        // SAFETY: a library kernel (host-kernel ABI) with its one `uh_args` parameter, alive for
        // the call; the addresses in it were checked against live device allocations when the
        // work was enqueued (its touches), and a free is refused while the work is queued.
        unsafe {
            unihal_sim::module::run_blocks(
                f,
                &l.kernel,
                grid,
                block,
                l.config.shared_mem_bytes,
                &params,
            )
        }?;
    }
    Ok(())
}

/// What phase 1 reads, with the descriptors' identities (checked again at phase 2).
pub struct Args {
    pub op: &'static str,
    soc: &'static crate::soc::Soc,
    deps: Vec<Dep>,
    touches: Vec<(u64, u64)>,
}

impl Args {
    fn record(&mut self, dep: Dep, t: &Tensor) -> Result<(), Err> {
        self.deps.push(dep);
        let dt = t.dt()?;
        if t.data % dt.size() as u64 != 0 {
            return Err(invalid(format!(
                "tensor data {:#x} is not aligned to its {dt} elements (a byte offset that is not a whole element)",
                t.data
            )));
        }
        if t.numel() > 0 {
            let (a, len) = t.span();
            if a == 0 {
                return Err(Err::new(
                    ACLNN_ERR_PARAM_NULLPTR,
                    "a non-empty tensor with NULL data",
                ));
            }
            self.touches.push((a, len));
        }
        Ok(())
    }

    /// A live tensor descriptor, copied.
    ///
    pub fn tensor(&mut self, p: *const Tensor, what: &str) -> Result<Tensor, Err> {
        let (t, dep) = nnopbase::get(p, Kind::Tensor, what)?;
        self.record(dep, &t)?;
        Ok(t)
    }

    /// An optional tensor (NULL: None).
    ///
    pub fn opt_tensor(&mut self, p: *const Tensor, what: &str) -> Result<Option<Tensor>, Err> {
        if p.is_null() {
            return Ok(None);
        }
        self.tensor(p, what).map(Some)
    }

    /// A live scalar descriptor's value.
    ///
    pub fn scalar(
        &mut self,
        p: *const nnopbase::Scalar,
        what: &str,
    ) -> Result<unihal_hal::Scalar, Err> {
        let (s, dep) = nnopbase::get(p, Kind::Scalar, what)?;
        self.deps.push(dep);
        Ok(s.value)
    }

    /// A live int array's values.
    ///
    pub fn ints(&mut self, p: *const nnopbase::IntArray, what: &str) -> Result<Vec<i64>, Err> {
        let (a, dep) = nnopbase::get(p, Kind::IntArray, what)?;
        self.deps.push(dep);
        Ok(a.0)
    }

    /// A live bool array's values.
    ///
    pub fn bools(&mut self, p: *const nnopbase::BoolArray, what: &str) -> Result<Vec<bool>, Err> {
        let (a, dep) = nnopbase::get(p, Kind::BoolArray, what)?;
        self.deps.push(dep);
        Ok(a.0)
    }

    /// A live tensor list's tensors.
    ///
    pub fn list(&mut self, p: *const nnopbase::TensorList, what: &str) -> Result<Vec<Tensor>, Err> {
        let (l, dep) = nnopbase::get(p, Kind::TensorList, what)?;
        self.deps.push(dep);
        l.0.iter().map(|&t| self.tensor(t, what)).collect()
    }

    /// The simulated chip.
    pub fn soc(&self) -> &'static crate::soc::Soc {
        self.soc
    }

    /// True on the Atlas training series (first generation).
    pub fn soc_is_910(&self) -> bool {
        self.soc.product == crate::soc::Product::Training910
    }

    /// `t`'s dtype, checked against this operator's column for the chip.
    ///
    /// # Errors
    /// `ACLNN_ERR_PARAM_INVALID` naming the operator, dtype and SoC.
    pub fn dtype(&self, t: &Tensor) -> Result<DType, Err> {
        let dt = t.dt()?;
        if !self.soc.supports(self.op, dt) {
            return Err(invalid(format!(
                "aclnn{} does not support {dt} on {}",
                self.op, self.soc.name
            )));
        }
        Ok(dt)
    }

    /// Checks that two tensors share a dtype.
    ///
    /// # Errors
    /// `ACLNN_ERR_PARAM_INVALID`.
    pub fn same_dtype(&self, a: &Tensor, b: &Tensor, what: &str) -> Result<(), Err> {
        if a.dtype != b.dtype {
            return Err(invalid(format!(
                "aclnn{}: {what} dtypes differ ({} and {})",
                self.op, a.dtype, b.dtype
            )));
        }
        Ok(())
    }
}

/// Phase 1 of operator `op`: `parse` reads the arguments and returns the program; the dry run
/// validates it and sizes the workspace.
///
/// # Safety
/// `ws` and `ex` are NULL (an error) or valid for writes.
pub unsafe fn phase1(
    op: &'static str,
    ws: *mut u64,
    ex: *mut *mut Executor,
    parse: impl FnOnce(&mut Args) -> Result<Program, Err>,
) -> i32 {
    let name = format!("aclnn{op}GetWorkspaceSize");
    crate::entry(&name, ACLNN_ERR_INNER, || {
        let sim = crate::runtime::sim().map_err(|e| Err::new(ACLNN_ERR_RUNTIME_ERROR, e.msg))?;
        if ws.is_null() || ex.is_null() {
            return Err(Err::new(
                ACLNN_ERR_PARAM_NULLPTR,
                "NULL workspaceSize or executor",
            ));
        }
        if !sim.soc.has(op) {
            return Err(invalid(format!(
                "aclnn{op} is not available on {} (not in its documented product list)",
                sim.soc.name
            )));
        }
        let mut args = Args {
            op,
            soc: sim.soc,
            deps: Vec::new(),
            touches: Vec::new(),
        };
        let program = parse(&mut args)?;
        let mut dry = Build {
            ws: DRY_WORKSPACE,
            used: 0,
            steps: Vec::new(),
        };
        program(&mut dry)?;
        let size = if dry.used == 0 {
            0
        } else {
            dry.used.next_multiple_of(512)
        };
        let executor = Arc::new(Executor {
            op,
            deps: args.deps,
            touches: args.touches,
            workspace: size,
            program,
            repeatable: AtomicBool::new(false),
        });
        let e = Arc::as_ptr(&executor) as *mut Executor;
        executors().lock().insert(e as usize, executor);
        // SAFETY: both checked non-null above; the caller's out-pointers.
        unsafe {
            ws.write(size);
            ex.write(e);
        }
        Ok(())
    })
}

/// Phase 2 of operator `op`: checks the executor and workspace, enqueues the computation.
pub fn phase2(
    op: &'static str,
    workspace: *mut c_void,
    size: u64,
    executor: *mut Executor,
    stream: *mut c_void,
) -> i32 {
    let name = format!("aclnn{op}");
    crate::entry(&name, ACLNN_ERR_INNER, || {
        let sim = crate::runtime::sim().map_err(|e| Err::new(ACLNN_ERR_RUNTIME_ERROR, e.msg))?;
        if executor.is_null() {
            return Err(Err::new(ACLNN_ERR_PARAM_NULLPTR, "NULL executor"));
        }
        let spent = || {
            let msg = format!(
                "executor {executor:p} was already run (an executor runs once unless made repeatable) or never made by a phase 1"
            );
            unihal_sim::fault::violation(msg.clone());
            invalid(msg)
        };
        let e = executor_of(executor).ok_or_else(spent)?;
        if e.op != op {
            return Err(invalid(format!(
                "the executor was made by aclnn{}GetWorkspaceSize, not aclnn{op}GetWorkspaceSize",
                e.op
            )));
        }
        if !nnopbase::alive(&e.deps) {
            let msg =
                "a descriptor the executor was made from was destroyed before phase 2".to_string();
            unihal_sim::fault::violation(msg.clone());
            return Err(invalid(msg));
        }
        if size < e.workspace {
            return Err(invalid(format!(
                "workspace of {size} bytes, phase 1 asked for {}",
                e.workspace
            )));
        }
        let (dev, id) = sim
            .core_stream(stream)
            .map_err(|err| Err::new(err.code, err.msg))?;
        let ws = workspace as u64;
        if e.workspace > 0 {
            if workspace.is_null() {
                return Err(invalid("NULL workspace with a non-zero workspace size"));
            }
            if !dev.owns(ws) {
                return Err(invalid(format!(
                    "workspace {workspace:p} is not device memory of the stream's device"
                )));
            }
        }
        let mut build = Build {
            ws,
            used: 0,
            steps: Vec::new(),
        };
        (e.program)(&mut build)?;
        let mut touches = e.touches.clone();
        if e.workspace > 0 {
            touches.push((ws, e.workspace));
        }
        let steps = std::mem::take(&mut build.steps);
        // Spent from here on (unless repeatable): claimed under the registry's lock, so of two
        // threads running one executor, one runs it and the other is refused.
        if !e.repeatable.load(Ordering::Acquire)
            && executors().lock().remove(&(executor as usize)).is_none()
        {
            return Err(spent());
        }
        let work = Work {
            touches,
            run: Box::new(move |_| {
                for step in steps {
                    match step {
                        Step::Plan(mut p) => run_plan(&mut p)?,
                        Step::Host(f) => f().map_err(SimError::LaunchFailed)?,
                    }
                }
                Ok(())
            }),
        };
        dev.enqueue(id, work)
            .map_err(|err| Err::new(ACLNN_ERR_RUNTIME_ERROR, err.to_string()))
    })
}

/// `aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor)`: phase 2 may then run it
/// many times; the caller destroys it.
#[no_mangle]
pub extern "C" fn aclSetAclOpExecutorRepeatable(executor: *mut Executor) -> i32 {
    crate::entry("aclSetAclOpExecutorRepeatable", ACLNN_ERR_INNER, || {
        let e = executor_of(executor).ok_or_else(|| invalid("not a live executor"))?;
        e.repeatable.store(true, Ordering::Release);
        Ok(())
    })
}

/// `aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor)`: frees an executor (a repeatable
/// one, or one abandoned after phase 1, as opbase's current source allows).
#[no_mangle]
pub extern "C" fn aclDestroyAclOpExecutor(executor: *mut Executor) -> i32 {
    crate::entry("aclDestroyAclOpExecutor", ACLNN_ERR_INNER, || {
        if executors().lock().remove(&(executor as usize)).is_none() {
            let msg = format!("executor {executor:p} is not live (already run or destroyed)");
            unihal_sim::fault::violation(msg.clone());
            return Err(invalid(msg));
        }
        Ok(())
    })
}

/// Exports both phases of an operator: `aclnn_op!(aclnnAdd, aclnnAddGetWorkspaceSize, "Add",
/// (self_: *const Tensor, ...) |a| { ... })`, the body returning the [`Program`].
#[macro_export]
macro_rules! aclnn_op {
    ($run:ident, $ws:ident, $op:literal, ($($arg:ident : $ty:ty),* $(,)?) |$a:ident| $body:block) => {
        #[no_mangle]
        pub unsafe extern "C" fn $ws(
            $($arg: $ty,)*
            workspace_size: *mut u64,
            executor: *mut *mut $crate::aclnn::Executor,
        ) -> i32 {
            let parse = |$a: &mut $crate::aclnn::Args| -> Result<$crate::aclnn::Program, $crate::conv::Err> { $body };
            // SAFETY: the out-pointers are the caller's (checked non-null in phase1).
            unsafe { $crate::aclnn::phase1($op, workspace_size, executor, parse) }
        }

        #[no_mangle]
        pub extern "C" fn $run(
            workspace: *mut std::ffi::c_void,
            workspace_size: u64,
            executor: *mut $crate::aclnn::Executor,
            stream: *mut std::ffi::c_void,
        ) -> i32 {
            $crate::aclnn::phase2($op, workspace, workspace_size, executor, stream)
        }
    };
}

/// Moves dim `d` of a view to the end (a softmax or reduction along any axis runs along the
/// last one of the permuted views).
pub fn dim_last(mut v: TensorView, d: usize) -> TensorView {
    let s = v.shape.remove(d);
    let st = v.strides.remove(d);
    v.shape.push(s);
    v.strides.push(st);
    v
}

/// Moves dim `d` of a view to the front.
pub fn dim_first(mut v: TensorView, d: usize) -> TensorView {
    let s = v.shape.remove(d);
    let st = v.strides.remove(d);
    v.shape.insert(0, s);
    v.strides.insert(0, st);
    v
}

/// A dim argument (negative counts from the end) of a `rank`-dim tensor.
///
/// # Errors
/// `ACLNN_ERR_PARAM_INVALID` when out of range.
pub fn axis(dim: i64, rank: usize) -> Result<usize, Err> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if !(0..r).contains(&d) {
        return Err(invalid(format!("dim {dim} of a {rank}-dim tensor")));
    }
    Ok(d as usize)
}
