//! The aclnn operators the backend calls: the one place their symbols are declared. Every
//! operator has two entry points (the op map's A.1): phase 1,
//! `aclnnXxxGetWorkspaceSize(<arguments>, uint64_t *workspaceSize, aclOpExecutor **executor)`,
//! and phase 2, `aclnnXxx(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
//! aclrtStream stream)`. The arguments of each are written from the op map's A.4 rows (ops-math
//! `OM` and ops-nn `ON` headers and docs, cited per row there); Huawei's torch-npu wheel carries
//! no aclnn header, so these are not ABI-checked by bindgen.
//!
//! Each operator is resolved from the first operator library that has both entry points
//! (`libopapi_*.so` of the split layout, then `libopapi.so`); a missing one is `None`, and the
//! capabilities leave out what needs it.

use super::nnopbase::Desc;
use std::ffi::{c_char, c_void};
use unihal_dynlib::Library;

/// `aclOpExecutor*`: opaque.
pub type Executor = *mut c_void;
/// Phase 2 of every operator.
pub type Run = unsafe extern "C" fn(*mut c_void, u64, Executor, *mut c_void) -> i32;

/// One operator: its name (without the `aclnn` prefix) and both phases.
#[derive(Clone, Copy)]
pub struct Op<F> {
    pub name: &'static str,
    pub ws: F,
    pub run: Run,
}

fn resolve<F: Copy>(libs: &[Library], name: &'static str) -> Option<Op<F>> {
    let ws_name = format!("aclnn{name}GetWorkspaceSize");
    let run_name = format!("aclnn{name}");
    libs.iter().find_map(|l| {
        // SAFETY: `F` is the phase-1 signature declared for `name` below and `Run` the common
        // phase-2 signature (op map A.1).
        unsafe {
            Some(Op {
                name,
                ws: l.optional::<F>(&ws_name)?,
                run: l.optional::<Run>(&run_name)?,
            })
        }
    })
}

macro_rules! operators {
    ($( $(#[$doc:meta])* $field:ident = $name:literal ( $($ty:ty),* ); )*) => {
        /// The operators, each `None` when no operator library has it.
        #[allow(clippy::type_complexity)]
        pub struct AclnnApi {
            $( $(#[$doc])* pub $field: Option<Op<unsafe extern "C" fn($($ty,)* *mut u64, *mut Executor) -> i32>>, )*
        }

        impl AclnnApi {
            /// Every operator name the backend may call.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// Resolves every operator from `libs`, in order.
            pub fn resolve(libs: &[Library]) -> AclnnApi {
                AclnnApi { $( $field: resolve(libs, $name), )* }
            }

            /// How many operators resolved.
            pub fn resolved(&self) -> usize {
                [$( self.$field.is_some() ),*].iter().filter(|&&b| b).count()
            }

            /// The names that did not resolve.
            pub fn missing(&self) -> Vec<&'static str> {
                let mut v = Vec::new();
                $( if self.$field.is_none() { v.push($name); } )*
                v
            }
        }
    };
}

type T = Desc;

operators! {
    /// `(selfRef, const aclScalar *value)`.
    inplace_fill_scalar = "InplaceFillScalar"(T, T);
    /// `(selfRef, const aclTensor *src)`: strided copy with broadcasting and conversion.
    inplace_copy = "InplaceCopy"(T, T);
    /// `(self, aclDataType dtype, out)`.
    cast = "Cast"(T, i32, T);
    neg = "Neg"(T, T);
    abs = "Abs"(T, T);
    exp = "Exp"(T, T);
    log = "Log"(T, T);
    sqrt = "Sqrt"(T, T);
    rsqrt = "Rsqrt"(T, T);
    tanh = "Tanh"(T, T);
    sigmoid = "Sigmoid"(T, T);
    relu = "Relu"(T, T);
    silu = "Silu"(T, T);
    reciprocal = "Reciprocal"(T, T);
    /// `(x, int64_t approximate (0 erf, 1 tanh), y)`.
    gelu_v2 = "GeluV2"(T, i64, T);
    /// `(gradOutput, self, const aclScalar *threshold, out)`.
    threshold_backward = "ThresholdBackward"(T, T, T, T);
    /// `(gradOutput, self, char *approximate ("none"/"tanh"), gradInput)`.
    gelu_backward_v2 = "GeluBackwardV2"(T, T, *const c_char, T);
    /// `(gradOutput, self, gradInput)`.
    silu_backward = "SiluBackward"(T, T, T);
    /// `(self, other, const aclScalar *alpha, out)`: out = self + alpha * other.
    add = "Add"(T, T, T, T);
    sub = "Sub"(T, T, T, T);
    /// `(selfRef, other, alpha)`: selfRef += alpha * other (axpy).
    inplace_add = "InplaceAdd"(T, T, T);
    /// `(self, const aclScalar *other, const aclScalar *alpha, out)`.
    adds = "Adds"(T, T, T, T);
    subs = "Subs"(T, T, T, T);
    mul = "Mul"(T, T, T);
    div = "Div"(T, T, T);
    maximum = "Maximum"(T, T, T);
    minimum = "Minimum"(T, T, T);
    /// `(self, const aclScalar *other, out)`.
    muls = "Muls"(T, T, T);
    divs = "Divs"(T, T, T);
    /// `(self, const aclScalar *clipValueMin, out)`.
    clamp_min = "ClampMin"(T, T, T);
    clamp_max = "ClampMax"(T, T, T);
    pow_tensor_tensor = "PowTensorTensor"(T, T, T);
    /// `(self, const aclScalar *exponent, out)`.
    pow_tensor_scalar = "PowTensorScalar"(T, T, T);
    /// `(condition, self, other, out)`.
    s_where = "SWhere"(T, T, T, T);
    /// `(selfRef, double from, double to, uint64_t seed, uint64_t offset)`.
    inplace_uniform = "InplaceUniform"(T, f64, f64, u64, u64);
    /// `(selfRef, float mean, float std, int64_t seed, int64_t offset)`.
    inplace_normal = "InplaceNormal"(T, f32, f32, i64, i64);
    /// `(const aclIntArray *shape, double prob, int64_t seed, int64_t offset, aclDataType
    /// probDataType, out)`: a UINT8 bit mask of `ceil(numel/128)*16` bytes.
    dropout_gen_mask_v2 = "DropoutGenMaskV2"(T, f64, i64, i64, i32, T);
    /// `(self, mask, double prob, out)`: out = self * bit / (1 - prob).
    dropout_do_mask = "DropoutDoMask"(T, T, f64, T);
    /// `(self, const aclIntArray *dims, bool keepDims, aclDataType dtype, out)`.
    reduce_sum = "ReduceSum"(T, T, bool, i32, T);
    mean = "Mean"(T, T, bool, i32, T);
    /// `(self, const aclIntArray *dim, bool keepDim, out)`.
    amax = "Amax"(T, T, bool, T);
    amin = "Amin"(T, T, bool, T);
    /// `(self, int64_t dim, bool keepdim, out)`.
    arg_max = "ArgMax"(T, i64, bool, T);
    arg_min = "ArgMin"(T, i64, bool, T);
    /// `(self, int64_t dim, out)`.
    softmax = "Softmax"(T, i64, T);
    log_softmax = "LogSoftmax"(T, i64, T);
    /// `(gradOutput, output, int64_t dim, out)`.
    softmax_backward = "SoftmaxBackward"(T, T, i64, T);
    log_softmax_backward = "LogSoftmaxBackward"(T, T, i64, T);
    /// `(self (log-probs), target, weight, int64_t reduction, int64_t ignoreIndex, out,
    /// totalWeightOut)`.
    nll_loss = "NLLLoss"(T, T, T, i64, i64, T, T);
    /// `(gradOutput, self, target, weight, int64_t reduction, int64_t ignoreIndex, totalWeight,
    /// out)`.
    nll_loss_backward = "NLLLossBackward"(T, T, T, T, i64, i64, T, T);
    /// `(input, target, weightOptional, char *reduction, int64_t ignoreIndex, double
    /// labelSmoothing, double lseSquareScaleForZloss, bool returnZloss, lossOut, logProbOut,
    /// zlossOut, lseForZlossOut)`.
    cross_entropy_loss = "CrossEntropyLoss"(T, T, T, *const c_char, i64, f64, f64, bool, T, T, T, T);
    /// `(gradLoss, logProb, target, weightOptional, gradZlossOptional, lseForZlossOptional,
    /// char *reduction, int64_t ignoreIndex, double labelSmoothing, double
    /// lseSquareScaleForZloss, out)`.
    cross_entropy_loss_grad = "CrossEntropyLossGrad"(T, T, T, T, T, T, *const c_char, i64, f64, f64, T);
    /// `(input, const aclIntArray *normalizedShape, weightOptional, biasOptional, double eps,
    /// out, meanOutOptional, rstdOutOptional)`.
    layer_norm = "LayerNorm"(T, T, T, T, f64, T, T, T);
    /// `(gradOut, input, normalizedShape, mean, rstd, weightOptional, biasOptional, const
    /// aclBoolArray *outputMask, gradInputOut, gradWeightOut, gradBiasOut)`.
    layer_norm_backward = "LayerNormBackward"(T, T, T, T, T, T, T, T, T, T, T);
    /// `(x, gamma, double epsilon, yOut, rstdOut)`.
    rms_norm = "RmsNorm"(T, T, f64, T, T);
    /// `(dy, x, rstd, gamma, dxOut, dgammaOut)`.
    rms_norm_grad = "RmsNormGrad"(T, T, T, T, T, T);
    /// `(x1, x2, gamma, beta, biasOptional, double epsilon, bool additionalOutput, yOut, meanOut,
    /// rstdOut, xOut)` (ops-nn `norm/add_layer_norm/docs/aclnnAddLayerNorm.md`).
    add_layer_norm = "AddLayerNorm"(T, T, T, T, T, f64, bool, T, T, T, T);
    /// `(x1, x2, gamma, double epsilon, yOut, rstdOut, xOut)` (ops-nn
    /// `norm/add_rms_norm/docs/aclnnAddRmsNorm.md`).
    add_rms_norm = "AddRmsNorm"(T, T, T, f64, T, T, T);
    /// `(query, key, value, realShiftOptional, dropMaskOptional, paddingMaskOptional,
    /// attenMaskOptional, const aclIntArray *prefixOptional, double scaleValue, double keepProb,
    /// int64_t preTokens, int64_t nextTokens, int64_t headNum, char *inputLayout, int64_t
    /// innerPrecise, int64_t sparseMode, softmaxMaxOut, softmaxSumOut, softmaxOutOut,
    /// attentionOutOut)` (ops-transformer
    /// `attention/flash_attention_score/docs/aclnnFlashAttentionScore.md`).
    flash_attention_score = "FlashAttentionScore"(T, T, T, T, T, T, T, T, f64, f64, i64, i64, i64, *const c_char, i64, i64, T, T, T, T);
    /// `(query, keyIn, value, dy, pseShiftOptional, dropMaskOptional, paddingMaskOptional,
    /// attenMaskOptional, softmaxMaxOptional, softmaxSumOptional, softmaxInOptional,
    /// attentionInOptional, const aclIntArray *prefixOptional, double scaleValue, double
    /// keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char *inputLayout,
    /// int64_t innerPrecise, int64_t sparseMode, dqOut, dkOut, dvOut, dpseOut)`
    /// (`attention/flash_attention_score_grad/docs/aclnnFlashAttentionScoreGrad.md`).
    flash_attention_score_grad = "FlashAttentionScoreGrad"(T, T, T, T, T, T, T, T, T, T, T, T, T, f64, f64, i64, i64, i64, *const c_char, i64, i64, T, T, T, T);
    /// `(x, cos, sin, int64_t mode (0 half, 1 interleave), out)` (ops-transformer
    /// `posembedding/rotary_position_embedding/docs/aclnnRotaryPositionEmbedding.md`).
    rotary_position_embedding = "RotaryPositionEmbedding"(T, T, T, i64, T);
    /// `(dy, cos, sin, xOptional, int64_t mode, dxOut, dcosOut, dsinOut)`
    /// (`posembedding/rotary_position_embedding_grad/docs/aclnnRotaryPositionEmbeddingGrad.md`).
    rotary_position_embedding_grad = "RotaryPositionEmbeddingGrad"(T, T, T, T, i64, T, T, T);
    /// `(self, mat2, out, int8_t cubeMathType)`: 3-D.
    batch_mat_mul = "BatchMatMul"(T, T, T, i8);
    /// `(self, int64_t dim, index, out)`.
    index_select = "IndexSelect"(T, i64, T, T);
    /// `(self, int64_t dim, index, source, const aclScalar *alpha, out)`.
    index_add = "IndexAdd"(T, i64, T, T, T, T);
    /// `(self, int64_t dim, index, src, out)`.
    scatter_add = "ScatterAdd"(T, i64, T, T, T);
    /// `(paramsRef, gradsRef, momentumBufferListOptionalRef, gradScaleOptional, float
    /// weightDecay, float momentum, float lr, float dampening, bool nesterov, bool maximize,
    /// bool isFirstStep)`: tensor lists.
    fused_sgd = "FusedSgd"(T, T, T, T, f32, f32, f32, f32, bool, bool, bool);
    /// `(varRef, mRef, vRef, maxGradNormOptionalRef, grad, step, float lr, float beta1, float
    /// beta2, float weightDecay, float eps, bool amsgrad, bool maximize)`.
    apply_adam_w_v2 = "ApplyAdamWV2"(T, T, T, T, T, T, f32, f32, f32, f32, f32, bool, bool);
    /// `(const aclTensorList *scaledGrads, foundInf, invScale)`.
    foreach_non_finite_check_and_unscale = "ForeachNonFiniteCheckAndUnscale"(T, T, T);
    /// `(currentScale, growthTracker, foundInf, double growthFactor, double backoffFactor,
    /// int64_t growthInterval, updatedScale, updatedGrowthTracker)`.
    amp_update_scale = "AmpUpdateScale"(T, T, T, f64, f64, i64, T, T);
    /// `(const aclTensorList *x, const aclScalar *p, const aclTensorList *out)`.
    foreach_norm = "ForeachNorm"(T, T, T);
    /// `(const aclTensorList *tensors, int64_t dim, out)`.
    stack = "Stack"(T, i64, T);
    /// `(self, const aclScalar *ord, const aclIntArray *dims, bool keepDims, aclDataType
    /// dtype, out)`.
    linalg_vector_norm = "LinalgVectorNorm"(T, T, T, bool, i32, T);
    /// `(const aclTensorList *x, const aclTensor *scalar, const aclTensorList *out)`.
    foreach_mul_scalar = "ForeachMulScalar"(T, T, T);
}
