//! From an [`OpCall`] to a kernel launch, identically for every backend that runs the portable
//! library: validation (the HAL's rules), kernel choice by op and dtype, numpy broadcasting, dim
//! collapsing, and the launch shape for the device.

use crate::args::{UhArgs, MAX_DIMS, MAX_OPERANDS};
use unihal_hal::{
    Buffer, DType, HalError, Invalid, LaunchConfig, MandatoryCaps, OpCall, OpClass, OpId, Result,
};

/// A planned kernel launch.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Entry name in the library (`uh_add_f32`).
    pub kernel: String,
    pub config: LaunchConfig,
    pub args: UhArgs,
    /// Buffers the launch touches (to keep alive and to check against the device).
    pub buffers: Vec<Buffer>,
    /// Indices of `args.ptr` that hold byte offsets into the plan's scratch memory until
    /// [`Plan::bind_scratch`] turns them into addresses.
    pub scratch_ptrs: Vec<usize>,
}

impl Launch {
    pub(crate) fn new(kernel: String, config: LaunchConfig, args: UhArgs, call: &OpCall) -> Launch {
        Launch {
            kernel,
            config,
            args,
            buffers: call.tensors.iter().map(|t| t.buffer.clone()).collect(),
            scratch_ptrs: Vec::new(),
        }
    }
}

/// The launches that run one op, in order, on one stream.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub launches: Vec<Launch>,
    /// Bytes of device scratch memory the launches use (0: none). The backend provides it for the
    /// duration of the launches (stream-ordered allocation on GPUs, a host allocation on the CPU)
    /// and calls [`Plan::bind_scratch`] before launching.
    pub scratch_bytes: u64,
}

impl Plan {
    /// Turns the scratch offsets of every launch into addresses within scratch memory at `base`.
    pub fn bind_scratch(&mut self, base: u64) {
        for l in &mut self.launches {
            for &k in &l.scratch_ptrs {
                l.args.ptr[k] += base;
            }
            l.scratch_ptrs.clear();
        }
    }
}

/// Name of a dtype in kernel names, for the typed (not width-generic) kernels.
fn typed(op: OpId, d: DType) -> Result<&'static str> {
    match d {
        DType::F32 | DType::F64 | DType::F16 | DType::Bf16 | DType::I32 | DType::I64 => {
            Ok(d.name())
        }
        _ => Err(HalError::unsupported(format!("op {op} in {d}"))),
    }
}

fn width(d: DType) -> &'static str {
    match d.size() {
        1 => "b1",
        2 => "b2",
        4 => "b4",
        _ => "b8",
    }
}

/// The library kernel that runs `call` (before checking that the library has it).
pub fn kernel_name(call: &OpCall) -> Result<String> {
    let op = call.op;
    let t = &call.tensors;
    let key = call
        .key_dtype()
        .ok_or_else(|| HalError::invalid("call", Invalid::Other("no output".into())))?;
    Ok(match op.class() {
        OpClass::Fill | OpClass::Copy => format!("uh_{}_{}", op.name(), width(key)),
        OpClass::Where => format!("uh_where_{}", width(key)),
        OpClass::Cast => format!("uh_cast_{}_{}", typed(op, t[0].dtype)?, typed(op, key)?),
        _ => format!("uh_{}_{}", op.name(), typed(op, key)?),
    })
}

/// Plans `call` for a device with `caps`; `None` when there is nothing to do (no elements).
///
/// # Errors
/// As `OpCall::validate`, plus [`HalError::Unsupported`] when the library has no kernel for the
/// op and dtype.
pub fn plan(call: &OpCall, caps: &MandatoryCaps) -> Result<Plan> {
    let out_shape = call.validate()?;
    if !call.op.class().is_elementwise() {
        return crate::plan_nn::plan(call, caps, &out_shape);
    }
    let kernel = kernel_name(call)?;
    if !crate::has_kernel(&kernel) {
        return Err(HalError::unsupported(format!(
            "op {} in {:?} (no kernel {kernel})",
            call.op,
            call.key_dtype()
        )));
    }
    let n: u64 = out_shape.iter().product();
    if n == 0 {
        return Ok(Plan::default());
    }
    let mut args = UhArgs::default();
    // Strides of each operand over the output shape.
    debug_assert!(call.tensors.len() <= MAX_OPERANDS);
    let strides: Vec<Vec<i64>> = call
        .tensors
        .iter()
        .map(|t| t.broadcast_strides(&out_shape).expect("validated"))
        .collect();
    iterate(&mut args, &out_shape, &strides)?;
    for (k, t) in call.tensors.iter().enumerate() {
        args.ptr[k] = t.buffer.device_addr() + t.offset;
    }
    // Scalars.
    let key = call.key_dtype().expect("validated");
    match call.op.class() {
        OpClass::Fill => args.u[0] = call.scalars[0].bits(key),
        _ => {
            for (k, s) in call.scalars.iter().enumerate() {
                args.s[k] = s.as_f64();
                args.i[k] = s.as_i64();
            }
        }
    }
    if let Some(rng) = call.rng {
        args.u = [rng.seed, rng.offset];
    }
    Ok(Plan {
        launches: vec![Launch::new(kernel, launch_shape(n, caps), args, call)],
        scratch_bytes: 0,
    })
}

/// Sets `args` to iterate over `shape` (elements, or rows of a row kernel) with one stride list
/// per operand: size-1 dims dropped, neighbours that are contiguous for every operand merged.
///
/// # Errors
/// [`Invalid::Value`] when more than `MAX_DIMS` dims remain.
pub(crate) fn iterate(args: &mut UhArgs, shape: &[u64], strides: &[Vec<i64>]) -> Result<()> {
    let mut dims: Vec<(u64, Vec<i64>)> = Vec::new();
    for (d, &size) in shape.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let col: Vec<i64> = strides.iter().map(|s| s[d]).collect();
        if let Some((psize, pcol)) = dims.last_mut() {
            if pcol
                .iter()
                .zip(&col)
                .all(|(&ps, &cs)| ps == cs * size as i64)
            {
                *psize *= size;
                *pcol = col;
                continue;
            }
        }
        dims.push((size, col));
    }
    if dims.len() > MAX_DIMS {
        return Err(HalError::invalid(
            "tensors",
            Invalid::Value {
                value: format!("{} dims that do not collapse", dims.len()),
                accepted: format!("at most {MAX_DIMS}"),
            },
        ));
    }
    args.ndim = dims.len() as i64;
    args.n = shape.iter().product::<u64>() as i64;
    for (d, (size, col)) in dims.iter().enumerate() {
        args.size[d] = *size as i64;
        for (k, &s) in col.iter().enumerate() {
            args.stride[k][d] = s;
        }
    }
    args.contiguous =
        (dims.len() <= 1 && dims.iter().all(|(_, col)| col.iter().all(|&s| s == 1))) as i64;
    Ok(())
}

/// Grid and block for `n` elements: one chunk per pool thread (a few per thread for balance) on
/// host devices, a grid-stride launch of 256-thread blocks on GPUs.
pub fn launch_shape(n: u64, caps: &MandatoryCaps) -> LaunchConfig {
    if caps.warp_size <= 1 {
        let per_block = 1u64 << 15;
        let blocks = n
            .div_ceil(per_block)
            .clamp(1, caps.compute_units.max(1) as u64 * 4);
        LaunchConfig::linear(blocks as u32, 1)
    } else {
        let threads = 256u64.min(caps.max_threads_per_block as u64);
        let blocks = n
            .div_ceil(threads)
            .clamp(1, caps.compute_units.max(1) as u64 * 32)
            .min(caps.max_grid[0] as u64);
        LaunchConfig::linear(blocks as u32, threads as u32)
    }
}
