//! The header and the Rust declarations agree: every `UH_*` number of unihal_plugin.h has the
//! same value in this crate (and the other way round), and every struct has the same size and
//! field offsets, as the system C compiler lays them out.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use unihal_plugin_abi::*;

/// The C compiler's view: `name=value` lines.
fn c_values(program: &str, tag: &str) -> BTreeMap<String, i128> {
    let dir = std::env::temp_dir().join(format!("unihal-abi-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (c, exe) = (dir.join("probe.c"), dir.join("probe"));
    std::fs::write(&c, program).unwrap();
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg("-o")
        .arg(&exe)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| panic!("the C compiler {cc:?} does not run: {e}"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = Command::new(&exe).output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// Every numeric `#define UH_*` of the header.
fn header_names() -> Vec<String> {
    let h = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("include/unihal_plugin.h"),
    )
    .unwrap();
    h.lines()
        .filter_map(|l| l.strip_prefix("#define UH_"))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?;
            let value = it.next()?;
            (!value.starts_with('"')).then(|| format!("UH_{name}"))
        })
        .collect()
}

#[test]
fn every_number_agrees_with_the_header() {
    let rust: BTreeMap<String, i128> = [
        ("UH_ABI_MAJOR", UH_ABI_MAJOR as i128),
        ("UH_ABI_MINOR", UH_ABI_MINOR as i128),
        ("UH_OK", UH_OK as i128),
        ("UH_ERR_UNAVAILABLE", UH_ERR_UNAVAILABLE as i128),
        ("UH_ERR_UNSUPPORTED", UH_ERR_UNSUPPORTED as i128),
        ("UH_ERR_INVALID_ARGUMENT", UH_ERR_INVALID_ARGUMENT as i128),
        ("UH_ERR_OUT_OF_MEMORY", UH_ERR_OUT_OF_MEMORY as i128),
        ("UH_ERR_TIMEOUT", UH_ERR_TIMEOUT as i128),
        ("UH_ERR_ABORTED", UH_ERR_ABORTED as i128),
        ("UH_ERR_DEVICE_LOST", UH_ERR_DEVICE_LOST as i128),
        ("UH_ERR_ABI_MISMATCH", UH_ERR_ABI_MISMATCH as i128),
        ("UH_ERR_VENDOR", UH_ERR_VENDOR as i128),
        ("UH_ERR_INTERNAL", UH_ERR_INTERNAL as i128),
        ("UH_INVALID_OTHER", UH_INVALID_OTHER as i128),
        ("UH_INVALID_OUT_OF_RANGE", UH_INVALID_OUT_OF_RANGE as i128),
        ("UH_INVALID_WRONG_DEVICE", UH_INVALID_WRONG_DEVICE as i128),
        ("UH_INVALID_FREE_ENQUEUED", UH_INVALID_FREE_ENQUEUED as i128),
        (
            "UH_INVALID_FOREIGN_HANDLE",
            UH_INVALID_FOREIGN_HANDLE as i128,
        ),
        ("UH_INVALID_OVERLAP", UH_INVALID_OVERLAP as i128),
        ("UH_INVALID_BUSY", UH_INVALID_BUSY as i128),
        ("UH_INVALID_VALUE", UH_INVALID_VALUE as i128),
        ("UH_DTYPE_F64", UH_DTYPE_F64 as i128),
        ("UH_DTYPE_F32", UH_DTYPE_F32 as i128),
        ("UH_DTYPE_F16", UH_DTYPE_F16 as i128),
        ("UH_DTYPE_BF16", UH_DTYPE_BF16 as i128),
        ("UH_DTYPE_I8", UH_DTYPE_I8 as i128),
        ("UH_DTYPE_U8", UH_DTYPE_U8 as i128),
        ("UH_DTYPE_I16", UH_DTYPE_I16 as i128),
        ("UH_DTYPE_I32", UH_DTYPE_I32 as i128),
        ("UH_DTYPE_I64", UH_DTYPE_I64 as i128),
        ("UH_DTYPE_U32", UH_DTYPE_U32 as i128),
        ("UH_DTYPE_U64", UH_DTYPE_U64 as i128),
        ("UH_DTYPE_BOOL", UH_DTYPE_BOOL as i128),
        ("UH_DTYPE_COUNT", UH_DTYPE_COUNT as i128),
        ("UH_OP_FILL", UH_OP_FILL as i128),
        ("UH_OP_COPY", UH_OP_COPY as i128),
        ("UH_OP_CAST", UH_OP_CAST as i128),
        ("UH_OP_NEG", UH_OP_NEG as i128),
        ("UH_OP_ABS", UH_OP_ABS as i128),
        ("UH_OP_EXP", UH_OP_EXP as i128),
        ("UH_OP_LOG", UH_OP_LOG as i128),
        ("UH_OP_SQRT", UH_OP_SQRT as i128),
        ("UH_OP_RSQRT", UH_OP_RSQRT as i128),
        ("UH_OP_TANH", UH_OP_TANH as i128),
        ("UH_OP_SIGMOID", UH_OP_SIGMOID as i128),
        ("UH_OP_RELU", UH_OP_RELU as i128),
        ("UH_OP_GELU_TANH", UH_OP_GELU_TANH as i128),
        ("UH_OP_GELU_ERF", UH_OP_GELU_ERF as i128),
        ("UH_OP_SILU", UH_OP_SILU as i128),
        ("UH_OP_RELU_BACKWARD", UH_OP_RELU_BACKWARD as i128),
        ("UH_OP_GELU_TANH_BACKWARD", UH_OP_GELU_TANH_BACKWARD as i128),
        ("UH_OP_GELU_ERF_BACKWARD", UH_OP_GELU_ERF_BACKWARD as i128),
        ("UH_OP_SILU_BACKWARD", UH_OP_SILU_BACKWARD as i128),
        ("UH_OP_ADD", UH_OP_ADD as i128),
        ("UH_OP_SUB", UH_OP_SUB as i128),
        ("UH_OP_MUL", UH_OP_MUL as i128),
        ("UH_OP_DIV", UH_OP_DIV as i128),
        ("UH_OP_MAXIMUM", UH_OP_MAXIMUM as i128),
        ("UH_OP_MINIMUM", UH_OP_MINIMUM as i128),
        ("UH_OP_POW", UH_OP_POW as i128),
        ("UH_OP_ADD_SCALAR", UH_OP_ADD_SCALAR as i128),
        ("UH_OP_SUB_SCALAR", UH_OP_SUB_SCALAR as i128),
        ("UH_OP_MUL_SCALAR", UH_OP_MUL_SCALAR as i128),
        ("UH_OP_DIV_SCALAR", UH_OP_DIV_SCALAR as i128),
        ("UH_OP_MAXIMUM_SCALAR", UH_OP_MAXIMUM_SCALAR as i128),
        ("UH_OP_MINIMUM_SCALAR", UH_OP_MINIMUM_SCALAR as i128),
        ("UH_OP_POW_SCALAR", UH_OP_POW_SCALAR as i128),
        ("UH_OP_AXPY", UH_OP_AXPY as i128),
        ("UH_OP_WHERE", UH_OP_WHERE as i128),
        ("UH_OP_RANDOM_UNIFORM", UH_OP_RANDOM_UNIFORM as i128),
        ("UH_OP_RANDOM_NORMAL", UH_OP_RANDOM_NORMAL as i128),
        ("UH_OP_DROPOUT_FORWARD", UH_OP_DROPOUT_FORWARD as i128),
        ("UH_OP_DROPOUT_BACKWARD", UH_OP_DROPOUT_BACKWARD as i128),
        ("UH_OP_REDUCE_SUM", UH_OP_REDUCE_SUM as i128),
        ("UH_OP_REDUCE_MEAN", UH_OP_REDUCE_MEAN as i128),
        ("UH_OP_REDUCE_MAX", UH_OP_REDUCE_MAX as i128),
        ("UH_OP_REDUCE_MIN", UH_OP_REDUCE_MIN as i128),
        ("UH_OP_ARGMAX", UH_OP_ARGMAX as i128),
        ("UH_OP_ARGMIN", UH_OP_ARGMIN as i128),
        ("UH_OP_SOFTMAX", UH_OP_SOFTMAX as i128),
        ("UH_OP_LOG_SOFTMAX", UH_OP_LOG_SOFTMAX as i128),
        ("UH_OP_SOFTMAX_MASKED", UH_OP_SOFTMAX_MASKED as i128),
        ("UH_OP_LOG_SOFTMAX_MASKED", UH_OP_LOG_SOFTMAX_MASKED as i128),
        ("UH_OP_SOFTMAX_BACKWARD", UH_OP_SOFTMAX_BACKWARD as i128),
        (
            "UH_OP_LOG_SOFTMAX_BACKWARD",
            UH_OP_LOG_SOFTMAX_BACKWARD as i128,
        ),
        ("UH_OP_CROSS_ENTROPY", UH_OP_CROSS_ENTROPY as i128),
        (
            "UH_OP_CROSS_ENTROPY_BACKWARD",
            UH_OP_CROSS_ENTROPY_BACKWARD as i128,
        ),
        ("UH_OP_LAYER_NORM", UH_OP_LAYER_NORM as i128),
        (
            "UH_OP_LAYER_NORM_BACKWARD",
            UH_OP_LAYER_NORM_BACKWARD as i128,
        ),
        ("UH_OP_RMS_NORM", UH_OP_RMS_NORM as i128),
        ("UH_OP_RMS_NORM_BACKWARD", UH_OP_RMS_NORM_BACKWARD as i128),
        ("UH_OP_MATMUL", UH_OP_MATMUL as i128),
        ("UH_OP_INDEX_SELECT", UH_OP_INDEX_SELECT as i128),
        ("UH_OP_INDEX_ADD", UH_OP_INDEX_ADD as i128),
        ("UH_OP_SGD_MOMENTUM", UH_OP_SGD_MOMENTUM as i128),
        ("UH_OP_ADAMW", UH_OP_ADAMW as i128),
        ("UH_OP_AMP_UNSCALE", UH_OP_AMP_UNSCALE as i128),
        ("UH_OP_AMP_UPDATE_SCALE", UH_OP_AMP_UPDATE_SCALE as i128),
        ("UH_OP_CLIP_GRAD_NORM", UH_OP_CLIP_GRAD_NORM as i128),
        ("UH_OP_ATTENTION", UH_OP_ATTENTION as i128),
        ("UH_OP_ATTENTION_BACKWARD", UH_OP_ATTENTION_BACKWARD as i128),
        ("UH_OP_ROPE", UH_OP_ROPE as i128),
        ("UH_OP_ROPE_BACKWARD", UH_OP_ROPE_BACKWARD as i128),
        ("UH_OP_ADD_LAYER_NORM", UH_OP_ADD_LAYER_NORM as i128),
        ("UH_OP_ADD_RMS_NORM", UH_OP_ADD_RMS_NORM as i128),
        ("UH_OP_COUNT", UH_OP_COUNT as i128),
        ("UH_COLL_ALL_REDUCE", UH_COLL_ALL_REDUCE as i128),
        ("UH_COLL_BROADCAST", UH_COLL_BROADCAST as i128),
        ("UH_COLL_REDUCE", UH_COLL_REDUCE as i128),
        ("UH_COLL_ALL_GATHER", UH_COLL_ALL_GATHER as i128),
        ("UH_COLL_REDUCE_SCATTER", UH_COLL_REDUCE_SCATTER as i128),
        ("UH_COLL_SENDRECV", UH_COLL_SENDRECV as i128),
        ("UH_COLL_ALL_TO_ALL", UH_COLL_ALL_TO_ALL as i128),
        ("UH_COLL_COUNT", UH_COLL_COUNT as i128),
        ("UH_RED_SUM", UH_RED_SUM as i128),
        ("UH_RED_PROD", UH_RED_PROD as i128),
        ("UH_RED_MIN", UH_RED_MIN as i128),
        ("UH_RED_MAX", UH_RED_MAX as i128),
        ("UH_RED_AVG", UH_RED_AVG as i128),
        ("UH_RED_COUNT", UH_RED_COUNT as i128),
        ("UH_MODULE_HOST_SYMBOLS", UH_MODULE_HOST_SYMBOLS as i128),
        ("UH_MODULE_PTX", UH_MODULE_PTX as i128),
        ("UH_MODULE_CUBIN", UH_MODULE_CUBIN as i128),
        (
            "UH_MODULE_HIP_CODE_OBJECT",
            UH_MODULE_HIP_CODE_OBJECT as i128,
        ),
        ("UH_MODULE_ASCEND_BINARY", UH_MODULE_ASCEND_BINARY as i128),
        ("UH_CAP_EVENT_TIMING", UH_CAP_EVENT_TIMING as i128),
        (
            "UH_CAP_PINNED_HOST_MEMORY",
            UH_CAP_PINNED_HOST_MEMORY as i128,
        ),
        ("UH_CAP_WIDE_FILL", UH_CAP_WIDE_FILL as i128),
        ("UH_CAP_HOST_CALLBACKS", UH_CAP_HOST_CALLBACKS as i128),
        (
            "UH_CAP_STREAM_ORDERED_ALLOC",
            UH_CAP_STREAM_ORDERED_ALLOC as i128,
        ),
        (
            "UH_CAP_FAULT_POISONS_DEVICE",
            UH_CAP_FAULT_POISONS_DEVICE as i128,
        ),
        ("UH_CAP_BITWISE_RNG", UH_CAP_BITWISE_RNG as i128),
        (
            "UH_CAP_NEGATIVE_STRIDES_COPIED",
            UH_CAP_NEGATIVE_STRIDES_COPIED as i128,
        ),
        ("UH_NATIVE_NONE", UH_NATIVE_NONE as i128),
        ("UH_NATIVE_PTR", UH_NATIVE_PTR as i128),
        ("UH_NATIVE_INT", UH_NATIVE_INT as i128),
        ("UH_LOG_ERROR", UH_LOG_ERROR as i128),
        ("UH_LOG_WARN", UH_LOG_WARN as i128),
        ("UH_LOG_INFO", UH_LOG_INFO as i128),
        ("UH_LOG_DEBUG", UH_LOG_DEBUG as i128),
        ("UH_LOG_TRACE", UH_LOG_TRACE as i128),
        ("UH_CCL_GROUPS", UH_CCL_GROUPS as i128),
        ("UH_CCL_SPLIT", UH_CCL_SPLIT as i128),
        (
            "UH_CCL_SURVIVES_DEAD_RANK",
            UH_CCL_SURVIVES_DEAD_RANK as i128,
        ),
        (
            "UH_CCL_NAMES_MISSING_RANKS",
            UH_CCL_NAMES_MISSING_RANKS as i128,
        ),
        (
            "UH_CCL_TIMEOUT_ABORTS_PEERS",
            UH_CCL_TIMEOUT_ABORTS_PEERS as i128,
        ),
        ("UH_CCL_CROSSES_PROCESSES", UH_CCL_CROSSES_PROCESSES as i128),
        ("UH_MAX_DIMS", UH_MAX_DIMS as i128),
        ("UH_SCALAR_F64", UH_SCALAR_F64 as i128),
        ("UH_SCALAR_I64", UH_SCALAR_I64 as i128),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let names = header_names();
    let mut prog =
        String::from("#include <stdio.h>\n#include \"unihal_plugin.h\"\nint main(void) {\n");
    for n in &names {
        prog += &format!("  printf(\"{n}=%lld\\n\", (long long)({n}));\n");
    }
    prog += "  return 0;\n}\n";
    let c = c_values(&prog, "numbers");
    assert_eq!(c.len(), names.len());
    let only_c: Vec<_> = c.keys().filter(|k| !rust.contains_key(*k)).collect();
    let only_rust: Vec<_> = rust.keys().filter(|k| !c.contains_key(*k)).collect();
    assert!(
        only_c.is_empty() && only_rust.is_empty(),
        "only in the header: {only_c:?}; only in Rust: {only_rust:?}"
    );
    for (k, v) in &c {
        assert_eq!(rust[k], *v, "{k}");
    }
}

#[test]
fn every_struct_has_the_headers_layout() {
    let rust: Vec<(&str, usize)> = vec![
        ("sizeof uh_error", std::mem::size_of::<UhError>()),
        ("uh_error.size", std::mem::offset_of!(UhError, size)),
        ("uh_error.code", std::mem::offset_of!(UhError, code)),
        ("uh_error.invalid", std::mem::offset_of!(UhError, invalid)),
        ("uh_error.reserved", std::mem::offset_of!(UhError, reserved)),
        ("uh_error.num", std::mem::offset_of!(UhError, num)),
        (
            "uh_error.vendor_code",
            std::mem::offset_of!(UhError, vendor_code),
        ),
        ("uh_error.arg", std::mem::offset_of!(UhError, arg)),
        ("uh_error.str", std::mem::offset_of!(UhError, str_)),
        ("uh_error.message", std::mem::offset_of!(UhError, message)),
        ("sizeof uh_native", std::mem::size_of::<UhNative>()),
        ("uh_native.kind", std::mem::offset_of!(UhNative, kind)),
        (
            "uh_native.reserved",
            std::mem::offset_of!(UhNative, reserved),
        ),
        ("uh_native.ptr", std::mem::offset_of!(UhNative, ptr)),
        ("uh_native.value", std::mem::offset_of!(UhNative, value)),
        ("sizeof uh_host_api", std::mem::size_of::<UhHostApi>()),
        ("uh_host_api.size", std::mem::offset_of!(UhHostApi, size)),
        (
            "uh_host_api.abi_major",
            std::mem::offset_of!(UhHostApi, abi_major),
        ),
        (
            "uh_host_api.abi_minor",
            std::mem::offset_of!(UhHostApi, abi_minor),
        ),
        (
            "uh_host_api.reserved",
            std::mem::offset_of!(UhHostApi, reserved),
        ),
        ("uh_host_api.log", std::mem::offset_of!(UhHostApi, log)),
        (
            "sizeof uh_library_info",
            std::mem::size_of::<UhLibraryInfo>(),
        ),
        (
            "uh_library_info.size",
            std::mem::offset_of!(UhLibraryInfo, size),
        ),
        (
            "uh_library_info.reserved",
            std::mem::offset_of!(UhLibraryInfo, reserved),
        ),
        (
            "uh_library_info.role",
            std::mem::offset_of!(UhLibraryInfo, role),
        ),
        (
            "uh_library_info.name",
            std::mem::offset_of!(UhLibraryInfo, name),
        ),
        (
            "uh_library_info.path",
            std::mem::offset_of!(UhLibraryInfo, path),
        ),
        (
            "uh_library_info.version",
            std::mem::offset_of!(UhLibraryInfo, version),
        ),
        (
            "uh_library_info.error",
            std::mem::offset_of!(UhLibraryInfo, error),
        ),
        ("sizeof uh_plugin_info", std::mem::size_of::<UhPluginInfo>()),
        (
            "uh_plugin_info.size",
            std::mem::offset_of!(UhPluginInfo, size),
        ),
        (
            "uh_plugin_info.reserved",
            std::mem::offset_of!(UhPluginInfo, reserved),
        ),
        (
            "uh_plugin_info.name",
            std::mem::offset_of!(UhPluginInfo, name),
        ),
        (
            "uh_plugin_info.version",
            std::mem::offset_of!(UhPluginInfo, version),
        ),
        (
            "uh_plugin_info.simulated",
            std::mem::offset_of!(UhPluginInfo, simulated),
        ),
        (
            "uh_plugin_info.concurrent",
            std::mem::offset_of!(UhPluginInfo, concurrent),
        ),
        (
            "uh_plugin_info.n_libraries",
            std::mem::offset_of!(UhPluginInfo, n_libraries),
        ),
        (
            "uh_plugin_info.reserved2",
            std::mem::offset_of!(UhPluginInfo, reserved2),
        ),
        (
            "uh_plugin_info.libraries",
            std::mem::offset_of!(UhPluginInfo, libraries),
        ),
        (
            "uh_plugin_info.manifest",
            std::mem::offset_of!(UhPluginInfo, manifest),
        ),
        ("sizeof uh_op_support", std::mem::size_of::<UhOpSupport>()),
        ("uh_op_support.op", std::mem::offset_of!(UhOpSupport, op)),
        (
            "uh_op_support.dtype_mask",
            std::mem::offset_of!(UhOpSupport, dtype_mask),
        ),
        (
            "sizeof uh_device_props",
            std::mem::size_of::<UhDeviceProps>(),
        ),
        (
            "uh_device_props.size",
            std::mem::offset_of!(UhDeviceProps, size),
        ),
        (
            "uh_device_props.reserved",
            std::mem::offset_of!(UhDeviceProps, reserved),
        ),
        (
            "uh_device_props.name",
            std::mem::offset_of!(UhDeviceProps, name),
        ),
        (
            "uh_device_props.vendor",
            std::mem::offset_of!(UhDeviceProps, vendor),
        ),
        (
            "uh_device_props.memory_bytes",
            std::mem::offset_of!(UhDeviceProps, memory_bytes),
        ),
        (
            "uh_device_props.alloc_alignment",
            std::mem::offset_of!(UhDeviceProps, alloc_alignment),
        ),
        (
            "uh_device_props.compute_units",
            std::mem::offset_of!(UhDeviceProps, compute_units),
        ),
        (
            "uh_device_props.warp_size",
            std::mem::offset_of!(UhDeviceProps, warp_size),
        ),
        (
            "uh_device_props.max_grid",
            std::mem::offset_of!(UhDeviceProps, max_grid),
        ),
        (
            "uh_device_props.max_block",
            std::mem::offset_of!(UhDeviceProps, max_block),
        ),
        (
            "uh_device_props.max_threads_per_block",
            std::mem::offset_of!(UhDeviceProps, max_threads_per_block),
        ),
        (
            "uh_device_props.max_shared_mem_per_block",
            std::mem::offset_of!(UhDeviceProps, max_shared_mem_per_block),
        ),
        (
            "uh_device_props.module_formats",
            std::mem::offset_of!(UhDeviceProps, module_formats),
        ),
        (
            "uh_device_props.flags",
            std::mem::offset_of!(UhDeviceProps, flags),
        ),
        (
            "uh_device_props.arch",
            std::mem::offset_of!(UhDeviceProps, arch),
        ),
        (
            "uh_device_props.timer_resolution_ns",
            std::mem::offset_of!(UhDeviceProps, timer_resolution_ns),
        ),
        (
            "uh_device_props.n_peers",
            std::mem::offset_of!(UhDeviceProps, n_peers),
        ),
        (
            "uh_device_props.n_ops",
            std::mem::offset_of!(UhDeviceProps, n_ops),
        ),
        (
            "uh_device_props.peers",
            std::mem::offset_of!(UhDeviceProps, peers),
        ),
        (
            "uh_device_props.ops",
            std::mem::offset_of!(UhDeviceProps, ops),
        ),
        (
            "sizeof uh_accumulation",
            std::mem::size_of::<UhAccumulation>(),
        ),
        (
            "uh_accumulation.dtype",
            std::mem::offset_of!(UhAccumulation, dtype),
        ),
        (
            "uh_accumulation.accumulate_in",
            std::mem::offset_of!(UhAccumulation, accumulate_in),
        ),
        (
            "uh_accumulation.emulated_mask",
            std::mem::offset_of!(UhAccumulation, emulated_mask),
        ),
        (
            "uh_accumulation.reserved",
            std::mem::offset_of!(UhAccumulation, reserved),
        ),
        ("sizeof uh_ccl_caps", std::mem::size_of::<UhCclCaps>()),
        ("uh_ccl_caps.size", std::mem::offset_of!(UhCclCaps, size)),
        ("uh_ccl_caps.flags", std::mem::offset_of!(UhCclCaps, flags)),
        (
            "uh_ccl_caps.engine",
            std::mem::offset_of!(UhCclCaps, engine),
        ),
        (
            "uh_ccl_caps.op_dtypes",
            std::mem::offset_of!(UhCclCaps, op_dtypes),
        ),
        (
            "uh_ccl_caps.reductions",
            std::mem::offset_of!(UhCclCaps, reductions),
        ),
        (
            "uh_ccl_caps.n_accumulation",
            std::mem::offset_of!(UhCclCaps, n_accumulation),
        ),
        (
            "uh_ccl_caps.reserved",
            std::mem::offset_of!(UhCclCaps, reserved),
        ),
        (
            "uh_ccl_caps.accumulation",
            std::mem::offset_of!(UhCclCaps, accumulation),
        ),
        (
            "sizeof uh_launch_config",
            std::mem::size_of::<UhLaunchConfig>(),
        ),
        (
            "uh_launch_config.size",
            std::mem::offset_of!(UhLaunchConfig, size),
        ),
        (
            "uh_launch_config.shared_mem_bytes",
            std::mem::offset_of!(UhLaunchConfig, shared_mem_bytes),
        ),
        (
            "uh_launch_config.grid",
            std::mem::offset_of!(UhLaunchConfig, grid),
        ),
        (
            "uh_launch_config.block",
            std::mem::offset_of!(UhLaunchConfig, block),
        ),
        (
            "sizeof uh_host_launch_ctx",
            std::mem::size_of::<UhHostLaunchCtx>(),
        ),
        (
            "uh_host_launch_ctx.grid",
            std::mem::offset_of!(UhHostLaunchCtx, grid),
        ),
        (
            "uh_host_launch_ctx.block",
            std::mem::offset_of!(UhHostLaunchCtx, block),
        ),
        (
            "uh_host_launch_ctx.block_idx",
            std::mem::offset_of!(UhHostLaunchCtx, block_idx),
        ),
        (
            "uh_host_launch_ctx.reserved",
            std::mem::offset_of!(UhHostLaunchCtx, reserved),
        ),
        (
            "uh_host_launch_ctx.shared",
            std::mem::offset_of!(UhHostLaunchCtx, shared),
        ),
        (
            "uh_host_launch_ctx.shared_bytes",
            std::mem::offset_of!(UhHostLaunchCtx, shared_bytes),
        ),
        ("sizeof uh_host_symbol", std::mem::size_of::<UhHostSymbol>()),
        (
            "uh_host_symbol.name",
            std::mem::offset_of!(UhHostSymbol, name),
        ),
        (
            "uh_host_symbol.func",
            std::mem::offset_of!(UhHostSymbol, func),
        ),
        (
            "uh_host_symbol.n_params",
            std::mem::offset_of!(UhHostSymbol, n_params),
        ),
        (
            "uh_host_symbol.param_sizes",
            std::mem::offset_of!(UhHostSymbol, param_sizes),
        ),
        (
            "sizeof uh_module_source",
            std::mem::size_of::<UhModuleSource>(),
        ),
        (
            "uh_module_source.size",
            std::mem::offset_of!(UhModuleSource, size),
        ),
        (
            "uh_module_source.format",
            std::mem::offset_of!(UhModuleSource, format),
        ),
        (
            "uh_module_source.bytes",
            std::mem::offset_of!(UhModuleSource, bytes),
        ),
        (
            "uh_module_source.len",
            std::mem::offset_of!(UhModuleSource, len),
        ),
        (
            "uh_module_source.n_symbols",
            std::mem::offset_of!(UhModuleSource, n_symbols),
        ),
        (
            "uh_module_source.symbols",
            std::mem::offset_of!(UhModuleSource, symbols),
        ),
        ("sizeof uh_tensor", std::mem::size_of::<UhTensor>()),
        ("uh_tensor.mem", std::mem::offset_of!(UhTensor, mem)),
        (
            "uh_tensor.mem_offset",
            std::mem::offset_of!(UhTensor, mem_offset),
        ),
        ("uh_tensor.mem_len", std::mem::offset_of!(UhTensor, mem_len)),
        ("uh_tensor.offset", std::mem::offset_of!(UhTensor, offset)),
        ("uh_tensor.dtype", std::mem::offset_of!(UhTensor, dtype)),
        ("uh_tensor.ndim", std::mem::offset_of!(UhTensor, ndim)),
        ("uh_tensor.shape", std::mem::offset_of!(UhTensor, shape)),
        ("uh_tensor.strides", std::mem::offset_of!(UhTensor, strides)),
        ("sizeof uh_scalar", std::mem::size_of::<UhScalar>()),
        ("uh_scalar.kind", std::mem::offset_of!(UhScalar, kind)),
        (
            "uh_scalar.reserved",
            std::mem::offset_of!(UhScalar, reserved),
        ),
        ("uh_scalar.value", std::mem::offset_of!(UhScalar, value)),
        ("sizeof uh_op_call", std::mem::size_of::<UhOpCall>()),
        ("uh_op_call.size", std::mem::offset_of!(UhOpCall, size)),
        ("uh_op_call.op", std::mem::offset_of!(UhOpCall, op)),
        (
            "uh_op_call.n_tensors",
            std::mem::offset_of!(UhOpCall, n_tensors),
        ),
        (
            "uh_op_call.n_scalars",
            std::mem::offset_of!(UhOpCall, n_scalars),
        ),
        (
            "uh_op_call.tensors",
            std::mem::offset_of!(UhOpCall, tensors),
        ),
        (
            "uh_op_call.scalars",
            std::mem::offset_of!(UhOpCall, scalars),
        ),
        (
            "uh_op_call.has_rng",
            std::mem::offset_of!(UhOpCall, has_rng),
        ),
        (
            "uh_op_call.reserved",
            std::mem::offset_of!(UhOpCall, reserved),
        ),
        (
            "uh_op_call.rng_seed",
            std::mem::offset_of!(UhOpCall, rng_seed),
        ),
        (
            "uh_op_call.rng_offset",
            std::mem::offset_of!(UhOpCall, rng_offset),
        ),
        ("sizeof uh_collective", std::mem::size_of::<UhCollective>()),
        (
            "uh_collective.size",
            std::mem::offset_of!(UhCollective, size),
        ),
        ("uh_collective.op", std::mem::offset_of!(UhCollective, op)),
        (
            "uh_collective.send",
            std::mem::offset_of!(UhCollective, send),
        ),
        (
            "uh_collective.send_offset",
            std::mem::offset_of!(UhCollective, send_offset),
        ),
        (
            "uh_collective.send_len",
            std::mem::offset_of!(UhCollective, send_len),
        ),
        (
            "uh_collective.recv",
            std::mem::offset_of!(UhCollective, recv),
        ),
        (
            "uh_collective.recv_offset",
            std::mem::offset_of!(UhCollective, recv_offset),
        ),
        (
            "uh_collective.recv_len",
            std::mem::offset_of!(UhCollective, recv_len),
        ),
        (
            "uh_collective.count",
            std::mem::offset_of!(UhCollective, count),
        ),
        (
            "uh_collective.dtype",
            std::mem::offset_of!(UhCollective, dtype),
        ),
        ("uh_collective.red", std::mem::offset_of!(UhCollective, red)),
        (
            "uh_collective.root",
            std::mem::offset_of!(UhCollective, root),
        ),
        (
            "uh_collective.reserved",
            std::mem::offset_of!(UhCollective, reserved),
        ),
        ("sizeof uh_p2p", std::mem::size_of::<UhP2p>()),
        ("uh_p2p.recv", std::mem::offset_of!(UhP2p, recv)),
        ("uh_p2p.dtype", std::mem::offset_of!(UhP2p, dtype)),
        ("uh_p2p.mem", std::mem::offset_of!(UhP2p, mem)),
        ("uh_p2p.offset", std::mem::offset_of!(UhP2p, offset)),
        ("uh_p2p.len", std::mem::offset_of!(UhP2p, len)),
        ("uh_p2p.count", std::mem::offset_of!(UhP2p, count)),
        ("uh_p2p.peer", std::mem::offset_of!(UhP2p, peer)),
        ("sizeof uh_plugin_api", std::mem::size_of::<UhPluginApi>()),
        (
            "uh_plugin_api.size",
            std::mem::offset_of!(UhPluginApi, size),
        ),
        (
            "uh_plugin_api.abi_major",
            std::mem::offset_of!(UhPluginApi, abi_major),
        ),
        (
            "uh_plugin_api.abi_minor",
            std::mem::offset_of!(UhPluginApi, abi_minor),
        ),
        (
            "uh_plugin_api.reserved",
            std::mem::offset_of!(UhPluginApi, reserved),
        ),
        (
            "uh_plugin_api.info",
            std::mem::offset_of!(UhPluginApi, info),
        ),
        (
            "uh_plugin_api.probe",
            std::mem::offset_of!(UhPluginApi, probe),
        ),
        (
            "uh_plugin_api.device_open",
            std::mem::offset_of!(UhPluginApi, device_open),
        ),
        (
            "uh_plugin_api.device_release",
            std::mem::offset_of!(UhPluginApi, device_release),
        ),
        (
            "uh_plugin_api.device_props",
            std::mem::offset_of!(UhPluginApi, device_props),
        ),
        (
            "uh_plugin_api.device_memory_info",
            std::mem::offset_of!(UhPluginApi, device_memory_info),
        ),
        (
            "uh_plugin_api.device_synchronize",
            std::mem::offset_of!(UhPluginApi, device_synchronize),
        ),
        (
            "uh_plugin_api.device_native",
            std::mem::offset_of!(UhPluginApi, device_native),
        ),
        (
            "uh_plugin_api.mem_alloc",
            std::mem::offset_of!(UhPluginApi, mem_alloc),
        ),
        (
            "uh_plugin_api.mem_release",
            std::mem::offset_of!(UhPluginApi, mem_release),
        ),
        (
            "uh_plugin_api.host_alloc",
            std::mem::offset_of!(UhPluginApi, host_alloc),
        ),
        (
            "uh_plugin_api.host_release",
            std::mem::offset_of!(UhPluginApi, host_release),
        ),
        (
            "uh_plugin_api.mem_import",
            std::mem::offset_of!(UhPluginApi, mem_import),
        ),
        (
            "uh_plugin_api.stream_create",
            std::mem::offset_of!(UhPluginApi, stream_create),
        ),
        (
            "uh_plugin_api.stream_release",
            std::mem::offset_of!(UhPluginApi, stream_release),
        ),
        (
            "uh_plugin_api.copy_h2d",
            std::mem::offset_of!(UhPluginApi, copy_h2d),
        ),
        (
            "uh_plugin_api.copy_d2h",
            std::mem::offset_of!(UhPluginApi, copy_d2h),
        ),
        (
            "uh_plugin_api.copy_d2d",
            std::mem::offset_of!(UhPluginApi, copy_d2d),
        ),
        (
            "uh_plugin_api.copy_peer",
            std::mem::offset_of!(UhPluginApi, copy_peer),
        ),
        (
            "uh_plugin_api.fill",
            std::mem::offset_of!(UhPluginApi, fill),
        ),
        (
            "uh_plugin_api.launch",
            std::mem::offset_of!(UhPluginApi, launch),
        ),
        (
            "uh_plugin_api.run_op",
            std::mem::offset_of!(UhPluginApi, run_op),
        ),
        (
            "uh_plugin_api.host_callback",
            std::mem::offset_of!(UhPluginApi, host_callback),
        ),
        (
            "uh_plugin_api.stream_synchronize",
            std::mem::offset_of!(UhPluginApi, stream_synchronize),
        ),
        (
            "uh_plugin_api.stream_query",
            std::mem::offset_of!(UhPluginApi, stream_query),
        ),
        (
            "uh_plugin_api.stream_async_error",
            std::mem::offset_of!(UhPluginApi, stream_async_error),
        ),
        (
            "uh_plugin_api.stream_native",
            std::mem::offset_of!(UhPluginApi, stream_native),
        ),
        (
            "uh_plugin_api.event_create",
            std::mem::offset_of!(UhPluginApi, event_create),
        ),
        (
            "uh_plugin_api.event_release",
            std::mem::offset_of!(UhPluginApi, event_release),
        ),
        (
            "uh_plugin_api.event_record",
            std::mem::offset_of!(UhPluginApi, event_record),
        ),
        (
            "uh_plugin_api.stream_wait_event",
            std::mem::offset_of!(UhPluginApi, stream_wait_event),
        ),
        (
            "uh_plugin_api.event_query",
            std::mem::offset_of!(UhPluginApi, event_query),
        ),
        (
            "uh_plugin_api.event_synchronize",
            std::mem::offset_of!(UhPluginApi, event_synchronize),
        ),
        (
            "uh_plugin_api.event_elapsed",
            std::mem::offset_of!(UhPluginApi, event_elapsed),
        ),
        (
            "uh_plugin_api.event_native",
            std::mem::offset_of!(UhPluginApi, event_native),
        ),
        (
            "uh_plugin_api.module_load",
            std::mem::offset_of!(UhPluginApi, module_load),
        ),
        (
            "uh_plugin_api.module_release",
            std::mem::offset_of!(UhPluginApi, module_release),
        ),
        (
            "uh_plugin_api.module_function",
            std::mem::offset_of!(UhPluginApi, module_function),
        ),
        (
            "uh_plugin_api.function_release",
            std::mem::offset_of!(UhPluginApi, function_release),
        ),
        (
            "uh_plugin_api.test_kernels",
            std::mem::offset_of!(UhPluginApi, test_kernels),
        ),
        (
            "uh_plugin_api.ccl_caps",
            std::mem::offset_of!(UhPluginApi, ccl_caps),
        ),
        (
            "uh_plugin_api.ccl_unique_id",
            std::mem::offset_of!(UhPluginApi, ccl_unique_id),
        ),
        (
            "uh_plugin_api.ccl_init_rank",
            std::mem::offset_of!(UhPluginApi, ccl_init_rank),
        ),
        (
            "uh_plugin_api.ccl_init_all",
            std::mem::offset_of!(UhPluginApi, ccl_init_all),
        ),
        (
            "uh_plugin_api.comm_release",
            std::mem::offset_of!(UhPluginApi, comm_release),
        ),
        (
            "uh_plugin_api.comm_rank_size",
            std::mem::offset_of!(UhPluginApi, comm_rank_size),
        ),
        (
            "uh_plugin_api.comm_collective",
            std::mem::offset_of!(UhPluginApi, comm_collective),
        ),
        (
            "uh_plugin_api.comm_group",
            std::mem::offset_of!(UhPluginApi, comm_group),
        ),
        (
            "uh_plugin_api.comm_split",
            std::mem::offset_of!(UhPluginApi, comm_split),
        ),
        (
            "uh_plugin_api.comm_abort",
            std::mem::offset_of!(UhPluginApi, comm_abort),
        ),
        (
            "uh_plugin_api.comm_async_error",
            std::mem::offset_of!(UhPluginApi, comm_async_error),
        ),
        (
            "uh_plugin_api.host_callback_node",
            std::mem::offset_of!(UhPluginApi, host_callback_node),
        ),
        ("sizeof uh_host_node", std::mem::size_of::<UhHostNode>()),
        ("uh_host_node.size", std::mem::offset_of!(UhHostNode, size)),
        (
            "uh_host_node.reserved",
            std::mem::offset_of!(UhHostNode, reserved),
        ),
        ("uh_host_node.run", std::mem::offset_of!(UhHostNode, run)),
        (
            "uh_host_node.plugin",
            std::mem::offset_of!(UhHostNode, plugin),
        ),
    ];
    let mut prog = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"unihal_plugin.h\"\nint main(void) {\n",
    );
    for (k, _) in &rust {
        let expr = match k.strip_prefix("sizeof ") {
            Some(t) => format!("sizeof({t})"),
            None => {
                let (t, f) = k.split_once('.').unwrap();
                format!("offsetof({t}, {f})")
            }
        };
        prog += &format!("  printf(\"{k}=%zu\\n\", (size_t)({expr}));\n");
    }
    prog += "  return 0;\n}\n";
    let c = c_values(&prog, "layouts");
    for (k, v) in rust {
        assert_eq!(c[k], v as i128, "{k}");
    }
}
