//! Chip profiles: the two simulated SoCs and, per aclnn operator, the dtypes it accepts on each
//! (the op map's tables, `aclnn-op-map.md` A.4/A.5, read from the operators' "产品支持情况" and
//! dtype sections). An operator called on a chip whose documentation does not list it, or with
//! a dtype the chip's column lacks, fails in phase 1 with `ACLNN_ERR_PARAM_INVALID`, as the
//! real operators reject dtypes.

use unihal_hal::DType;

/// The product family a SoC belongs to (what the op docs' product lists name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    /// Atlas training series, first generation (Ascend 910, 910A): "910" in the op map.
    Training910,
    /// Atlas A2 training series (Ascend 910B1 .. 910B4): "A2" in the op map.
    A2,
}

/// A simulated chip.
#[derive(Debug)]
pub struct Soc {
    /// Returned verbatim by `aclrtGetSocName`.
    pub name: &'static str,
    pub product: Product,
    cores: i64,
}

/// The SoCs the simulator can be (`UNIHAL_SIM_SOC`); the first is the default.
pub static SOCS: [Soc; 2] = [
    Soc {
        name: "Ascend910B2",
        product: Product::A2,
        cores: 24,
    },
    Soc {
        name: "Ascend910A",
        product: Product::Training910,
        cores: 32,
    },
];

impl Soc {
    /// The chip `UNIHAL_SIM_SOC` names (`Ascend910B2` when unset).
    ///
    /// # Errors
    /// A message naming the accepted values.
    pub fn from_env() -> Result<&'static Soc, String> {
        match std::env::var("UNIHAL_SIM_SOC") {
            Err(_) => Ok(&SOCS[0]),
            Ok(v) => SOCS.iter().find(|s| s.name == v.trim()).ok_or_else(|| {
                let names: Vec<&str> = SOCS.iter().map(|s| s.name).collect();
                format!("UNIHAL_SIM_SOC={v}: one of {names:?}")
            }),
        }
    }

    /// AI cores (`aclrtGetDeviceInfo` AICORE_CORE_NUM).
    pub fn ai_cores(&self) -> i64 {
        self.cores
    }

    /// Whether operator `op` (without the `aclnn` prefix) accepts `dtype` on this chip.
    pub fn supports(&self, op: &str, dtype: DType) -> bool {
        let Some(row) = TABLE.iter().find(|r| r.ops.contains(&op)) else {
            return false;
        };
        let on_chip = match self.product {
            Product::A2 => true,
            Product::Training910 => row.on_910,
        };
        on_chip
            && row.dtypes.contains(&dtype)
            && !(self.product == Product::Training910 && dtype == DType::Bf16 && row.no_bf16_on_910)
    }

    /// Whether this chip has operator `op` at all.
    pub fn has(&self, op: &str) -> bool {
        TABLE
            .iter()
            .find(|r| r.ops.contains(&op))
            .is_some_and(|r| self.product == Product::A2 || r.on_910)
    }
}

/// One row of the table: operators sharing a dtype list and product list.
struct Row {
    ops: &'static [&'static str],
    dtypes: &'static [DType],
    /// Documented for the Atlas training series (910).
    on_910: bool,
    /// The doc excludes BF16 on the 910 ("¬910 BF16").
    no_bf16_on_910: bool,
}

use DType::*;

const FLOATS: &[DType] = &[F32, F16, Bf16];
const FLOATS64: &[DType] = &[F32, F16, Bf16, F64];
const ALL: &[DType] = &[F32, F16, Bf16, F64, I8, I16, I32, I64, U8, U32, U64, Bool];
const CATALOGUE: &[DType] = &[F32, F16, Bf16, F64, I32, I64];
const BINARY: &[DType] = &[F32, F16, F64, I32, I64, I16, I8, U8, Bool, Bf16];

const fn row(
    ops: &'static [&'static str],
    dtypes: &'static [DType],
    on_910: bool,
    no_bf16_on_910: bool,
) -> Row {
    Row {
        ops,
        dtypes,
        on_910,
        no_bf16_on_910,
    }
}

/// The op map's A.4 and A.5 tables. The dtype is the operator's key dtype (its first tensor's,
/// or its output's for casts and fills).
static TABLE: &[Row] = &[
    // Memory / conversion.
    row(
        &[
            "InplaceFillScalar",
            "InplaceZero",
            "InplaceOne",
            "InplaceFillTensor",
            "InplaceCopy",
        ],
        ALL,
        true,
        false,
    ),
    row(&["Cast"], ALL, true, true),
    // Unary.
    row(
        &["Neg", "InplaceNeg"],
        &[I8, I32, I64, F16, Bf16, F32, F64],
        true,
        false,
    ),
    row(
        &["Abs"],
        &[F32, F16, F64, Bf16, I8, I16, I32, I64, U8, Bool],
        true,
        false,
    ),
    row(
        &["Exp", "InplaceExp", "Log", "InplaceLog"],
        FLOATS64,
        false,
        false,
    ),
    row(&["Sqrt", "InplaceSqrt"], FLOATS64, true, true),
    row(
        &["Rsqrt", "InplaceRsqrt", "Reciprocal"],
        FLOATS64,
        true,
        false,
    ),
    row(
        &["Tanh", "InplaceTanh", "Sigmoid", "InplaceSigmoid"],
        FLOATS,
        true,
        false,
    ),
    row(
        &["Relu", "InplaceRelu"],
        &[F32, F16, Bf16, I8, I32, I64],
        true,
        true,
    ),
    row(&["GeluV2", "Silu"], FLOATS, true, true),
    // Activation backward.
    row(
        &["ThresholdBackward"],
        &[F32, F16, Bf16, I8, I32, U8],
        true,
        false,
    ),
    row(&["GeluBackwardV2"], FLOATS, true, false),
    row(&["SiluBackward"], FLOATS, true, true),
    // Binary.
    row(
        &[
            "Add",
            "Adds",
            "InplaceAdd",
            "InplaceAdds",
            "Sub",
            "Subs",
            "InplaceSub",
            "Mul",
            "Muls",
            "InplaceMul",
            "InplaceMuls",
            "Div",
            "Divs",
            "InplaceDiv",
            "InplaceDivs",
            "Maximum",
            "Minimum",
            "PowTensorTensor",
            "PowTensorScalar",
            "PowScalarTensor",
        ],
        BINARY,
        true,
        true,
    ),
    row(&["ClampMin", "ClampMax", "Clamp"], BINARY, true, false),
    row(&["SWhere"], ALL, true, false),
    // RNG and dropout.
    row(
        &["InplaceUniform"],
        &[F32, F16, Bf16, F64, I32, I64],
        true,
        false,
    ),
    row(&["InplaceNormal"], FLOATS64, true, false),
    row(&["DropoutGenMaskV2"], FLOATS, true, false),
    row(
        &["DropoutDoMask", "DropoutBackward", "Dropout"],
        FLOATS,
        true,
        false,
    ),
    // Reductions.
    row(&["ReduceSum"], CATALOGUE, true, true),
    row(&["Mean"], CATALOGUE, true, false),
    row(
        &["Amax", "Amin"],
        &[F32, F16, F64, Bf16, I8, I16, I32, I64, U8, Bool],
        true,
        false,
    ),
    row(
        &["MaxDim", "MinDim"],
        &[F32, F16, Bf16, I64, Bool],
        true,
        false,
    ),
    row(
        &["ArgMax", "ArgMin"],
        &[F32, F16, Bf16, F64, I8, I16, I32, I64, U8],
        true,
        false,
    ),
    // Softmax and cross-entropy.
    row(&["Softmax", "LogSoftmax"], FLOATS64, true, false),
    row(
        &["SoftmaxBackward", "LogSoftmaxBackward"],
        FLOATS,
        true,
        false,
    ),
    row(&["NLLLoss", "NLLLossBackward"], FLOATS, true, false),
    row(
        &["CrossEntropyLoss", "CrossEntropyLossGrad"],
        FLOATS,
        false,
        false,
    ),
    // Normalisation.
    row(&["LayerNorm"], FLOATS, true, true),
    row(&["LayerNormBackward"], FLOATS, true, false),
    row(&["RmsNorm", "RmsNormGrad"], FLOATS, false, false),
    // Residual add + norm (ops-nn `norm/add_*_norm/docs`: A2/A3 and inference, not the
    // Atlas training series).
    row(&["AddLayerNorm", "AddRmsNorm"], FLOATS, false, false),
    // ops-transformer: FlashAttention (A2 training only, FLOAT16/BFLOAT16/FLOAT32) and the rotary
    // embedding (A2/A3), none on the Atlas training series.
    row(
        &["FlashAttentionScore", "FlashAttentionScoreGrad"],
        FLOATS,
        false,
        false,
    ),
    row(
        &["RotaryPositionEmbedding", "RotaryPositionEmbeddingGrad"],
        FLOATS,
        false,
        false,
    ),
    // Matrix products.
    row(&["BatchMatMul", "Matmul", "Mm"], FLOATS, true, false),
    // Gather / scatter.
    row(&["Embedding", "IndexSelect"], ALL, true, false),
    row(&["EmbeddingDenseBackward"], FLOATS, true, false),
    row(
        &["IndexAdd", "ScatterAdd"],
        &[F32, F16, Bf16, I32, I64],
        false,
        false,
    ),
    // Optimisers and AMP.
    row(
        &[
            "FusedSgd",
            "ApplyAdamWV2",
            "ForeachNonFiniteCheckAndUnscale",
            "AmpUpdateScale",
        ],
        FLOATS,
        false,
        false,
    ),
    // The compositions of A.5 (global-norm clip).
    row(&["ForeachNorm", "ForeachMulScalar"], FLOATS, false, false),
    row(&["Stack"], ALL, true, false),
    row(&["LinalgVectorNorm"], FLOATS, true, false),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_chips_differ_as_documented() {
        let (a2, g1) = (&SOCS[0], &SOCS[1]);
        assert!(a2.supports("Add", Bf16) && !g1.supports("Add", Bf16));
        assert!(a2.supports("Add", F32) && g1.supports("Add", F32));
        assert!(a2.has("RmsNorm") && !g1.has("RmsNorm"));
        assert!(a2.has("ApplyAdamWV2") && !g1.has("ApplyAdamWV2"));
        assert!(!a2.supports("Tanh", F64), "no F64 on the NN activations");
        assert!(!a2.supports("NoSuchOp", F32));
        assert!(g1.supports("Rsqrt", Bf16), "Rsqrt lists BF16 on the 910");
        for op in [
            "FlashAttentionScore",
            "FlashAttentionScoreGrad",
            "AddRmsNorm",
            "AddLayerNorm",
        ] {
            assert!(a2.has(op) && !g1.has(op), "{op}");
        }
        assert!(a2.supports("RotaryPositionEmbedding", Bf16));
        assert!(!a2.supports("FlashAttentionScore", F64));
    }
}
