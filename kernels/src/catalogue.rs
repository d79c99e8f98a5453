//! The kernel catalogue: every entry point of the portable library, its stable name and the C++
//! template that implements it. One list serves the build script (which writes `uh_kernels.def`
//! for the CPU build), the embedded GPU source, and the reported capabilities.
//!
//! This file is also `include!`d by `build.rs`, so it uses only `std`.

/// One kernel entry point.
pub struct KernelEntry {
    /// Stable entry name, e.g. `uh_add_f32`, `uh_cast_f16_i64`, `uh_fill_b4`.
    pub name: String,
    /// The C++ kernel template instance, e.g. `uh_binary_k<uh_f32_t, uh_op_add>`.
    pub expr: String,
}

/// Float dtypes and their C++ traits.
pub const FLOATS: [(&str, &str); 4] = [
    ("f32", "uh_f32_t"),
    ("f64", "uh_f64_t"),
    ("f16", "uh_f16_t"),
    ("bf16", "uh_bf16_t"),
];
/// Integer dtypes with arithmetic kernels.
pub const INTS: [(&str, &str); 2] = [("i32", "uh_i32_t"), ("i64", "uh_i64_t")];
/// Element widths of the bit-moving kernels (fill, copy, where).
pub const WIDTHS: [(&str, &str, usize); 4] = [
    ("b1", "uh_u8", 1),
    ("b2", "uh_u16", 2),
    ("b4", "uh_u32", 4),
    ("b8", "uh_u64", 8),
];
/// Unary ops for floats and integers.
pub const UNARY_ALL: [&str; 3] = ["neg", "abs", "relu"];
/// Unary ops for floats only.
pub const UNARY_FLOAT: [&str; 9] = [
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "gelu_tanh",
    "gelu_erf",
    "silu",
];
/// Ops with a backward kernel (`<op>_backward`).
pub const BACKWARD: [&str; 4] = ["relu", "gelu_tanh", "gelu_erf", "silu"];
/// Binary ops for floats and integers (also as `<op>_scalar`).
pub const BINARY_ALL: [&str; 5] = ["add", "sub", "mul", "maximum", "minimum"];
/// Binary ops for floats only (also as `<op>_scalar`).
pub const BINARY_FLOAT: [&str; 2] = ["div", "pow"];

/// Every kernel of the library.
pub fn kernel_entries() -> Vec<KernelEntry> {
    let mut v = Vec::new();
    let mut add = |name: String, expr: String| v.push(KernelEntry { name, expr });
    let all: Vec<(&str, &str)> = FLOATS.iter().chain(INTS.iter()).copied().collect();
    for (w, t, _) in WIDTHS {
        add(format!("uh_fill_{w}"), format!("uh_fill_k<{t}>"));
        add(format!("uh_copy_{w}"), format!("uh_copy_k<{t}>"));
        add(format!("uh_where_{w}"), format!("uh_where_k<{t}>"));
    }
    for (s, st) in &all {
        for (d, dt) in &all {
            add(format!("uh_cast_{s}_{d}"), format!("uh_cast_k<{st}, {dt}>"));
        }
    }
    for op in UNARY_ALL {
        for (d, t) in &all {
            add(
                format!("uh_{op}_{d}"),
                format!("uh_unary_k<{t}, uh_op_{op}>"),
            );
        }
    }
    for (d, t) in FLOATS {
        for op in UNARY_FLOAT {
            add(
                format!("uh_{op}_{d}"),
                format!("uh_unary_k<{t}, uh_op_{op}>"),
            );
        }
        for op in BACKWARD {
            add(
                format!("uh_{op}_backward_{d}"),
                format!("uh_unary_backward_k<{t}, uh_op_{op}_backward>"),
            );
        }
        for op in BINARY_FLOAT {
            add(
                format!("uh_{op}_{d}"),
                format!("uh_binary_k<{t}, uh_op_{op}>"),
            );
            add(
                format!("uh_{op}_scalar_{d}"),
                format!("uh_binary_scalar_k<{t}, uh_op_{op}>"),
            );
        }
        add(format!("uh_axpy_{d}"), format!("uh_axpy_k<{t}>"));
        add(
            format!("uh_random_uniform_{d}"),
            format!("uh_uniform_k<{t}>"),
        );
        add(format!("uh_random_normal_{d}"), format!("uh_normal_k<{t}>"));
        add(
            format!("uh_dropout_forward_{d}"),
            format!("uh_dropout_k<{t}>"),
        );
        add(
            format!("uh_dropout_backward_{d}"),
            format!("uh_dropout_backward_k<{t}>"),
        );
    }
    for op in BINARY_ALL {
        for (d, t) in &all {
            add(
                format!("uh_{op}_{d}"),
                format!("uh_binary_k<{t}, uh_op_{op}>"),
            );
            add(
                format!("uh_{op}_scalar_{d}"),
                format!("uh_binary_scalar_k<{t}, uh_op_{op}>"),
            );
        }
    }
    nn_entries(&mut add);
    v
}

/// Float dtypes of the cross-entropy, optimizer and AMP kernels (f64 excluded).
pub const HALVES: [(&str, &str); 3] = [
    ("f32", "uh_f32_t"),
    ("f16", "uh_f16_t"),
    ("bf16", "uh_bf16_t"),
];
/// Index dtypes of cross-entropy targets and row gather/scatter.
pub const INDEX: [(&str, &str); 2] = [("i32", "uh_i32"), ("i64", "uh_i64")];
/// Reductions and their kernel templates.
pub const REDUCTIONS: [(&str, &str); 6] = [
    ("reduce_sum", "uh_reduce_k<{t}, 0>"),
    ("reduce_mean", "uh_reduce_k<{t}, 1>"),
    ("reduce_max", "uh_reduce_k<{t}, 2>"),
    ("reduce_min", "uh_reduce_k<{t}, 3>"),
    ("argmax", "uh_arg_k<{t}, 1>"),
    ("argmin", "uh_arg_k<{t}, 0>"),
];

/// The kernels of the training ops (rows, matmul, gather/scatter, multi-tensor).
fn nn_entries(add: &mut impl FnMut(String, String)) {
    for (d, t) in FLOATS {
        for (op, tmpl) in REDUCTIONS {
            add(format!("uh_{op}_{d}"), tmpl.replace("{t}", t));
        }
        for (log, name) in [(0, "softmax"), (1, "log_softmax")] {
            add(
                format!("uh_{name}_{d}"),
                format!("uh_softmax_k<{t}, {log}, 0>"),
            );
            add(
                format!("uh_{name}_masked_{d}"),
                format!("uh_softmax_k<{t}, {log}, 1>"),
            );
            add(
                format!("uh_{name}_backward_{d}"),
                format!("uh_softmax_backward_k<{t}, {log}>"),
            );
        }
        for (rms, name) in [(0, "layer_norm"), (1, "rms_norm")] {
            add(format!("uh_{name}_{d}"), format!("uh_norm_k<{t}, {rms}>"));
            add(
                format!("uh_{name}_backward_{d}"),
                format!("uh_norm_backward_k<{t}, {rms}>"),
            );
            add(
                format!("uh_{name}_backward_weight_{d}"),
                format!("uh_norm_backward_weight_k<{t}, {rms}>"),
            );
        }
        for (rms, name) in [(0, "add_layer_norm"), (1, "add_rms_norm")] {
            add(
                format!("uh_{name}_{d}"),
                format!("uh_add_norm_k<{t}, {rms}>"),
            );
        }
        add(format!("uh_attention_{d}"), format!("uh_attention_k<{t}>"));
        for step in ["delta", "dq", "dkv"] {
            add(
                format!("uh_attention_backward_{step}_{d}"),
                format!("uh_attention_{step}_k<{t}>"),
            );
        }
        add(format!("uh_rope_{d}"), format!("uh_rope_k<{t}, 0>"));
        add(
            format!("uh_rope_backward_{d}"),
            format!("uh_rope_k<{t}, 1>"),
        );
        add(format!("uh_matmul_{d}"), format!("uh_gemm_k<{t}>"));
        for (i, it) in INDEX {
            add(
                format!("uh_index_select_{d}_{i}"),
                format!("uh_index_select_k<{t}, {it}>"),
            );
            add(
                format!("uh_index_add_{d}_{i}"),
                format!("uh_index_add_k<{t}, {it}>"),
            );
        }
    }
    for (i, it) in INDEX {
        add(
            format!("uh_cross_entropy_count_{i}"),
            format!("uh_ce_count_k<{it}>"),
        );
    }
    add("uh_cross_entropy_reduce".into(), "uh_ce_reduce_k".into());
    add("uh_amp_update_scale".into(), "uh_amp_update_scale_k".into());
    add("uh_clip_total".into(), "uh_clip_total_k".into());
    for (d, t) in HALVES {
        for (i, it) in INDEX {
            add(
                format!("uh_cross_entropy_{d}_{i}"),
                format!("uh_ce_k<{t}, {it}>"),
            );
            add(
                format!("uh_cross_entropy_backward_{d}_{i}"),
                format!("uh_ce_backward_k<{t}, {it}>"),
            );
        }
        for (c, ct) in [
            ("none", "uh_no_copy"),
            ("f16", "uh_with_copy<uh_f16_t>"),
            ("bf16", "uh_with_copy<uh_bf16_t>"),
        ] {
            add(
                format!("uh_sgd_momentum_{d}_{c}"),
                format!("uh_sgd_k<{t}, {ct}>"),
            );
            add(
                format!("uh_adamw_{d}_{c}"),
                format!("uh_adamw_k<{t}, {ct}>"),
            );
        }
        add(
            format!("uh_amp_unscale_{d}"),
            format!("uh_amp_unscale_k<{t}>"),
        );
        add(
            format!("uh_clip_sumsq_{d}"),
            format!("uh_clip_sumsq_k<{t}>"),
        );
        add(
            format!("uh_clip_scale_{d}"),
            format!("uh_clip_scale_k<{t}>"),
        );
    }
}

/// The `uh_kernels.def` X-macro list: one `UH_K(name, template)` per kernel.
pub fn def_file() -> String {
    kernel_entries()
        .iter()
        .map(|e| format!("UH_K({}, {})\n", e.name, e.expr))
        .collect()
}
