//! What each Ascend chip runs: the SoC version (`aclrtGetSocName`, verbatim) classified by the
//! full version table (never by name prefix: "Ascend910B" alone is a first-generation training
//! part, "Ascend910B2" an Atlas A2), and the op × dtype table of each class from the op map's
//! A.4 product and dtype columns. A device reports this table intersected with its phase-1
//! probe ([`crate::ops::probe`]).

use std::collections::BTreeMap;
use unihal_hal::{DType, OpId};

/// A product class of the op map ("products" columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Atlas training series (Ascend 910, 910A, 910 Pro/Premium): no BF16 on most ops, no
    /// `Exp`/`Log`, no RMS norm, foreach, fused optimisers, index add or AMP operators; F32
    /// matmul only through F16 (refused with `KEEP_DTYPE`).
    Training910,
    /// Atlas A2 training (910B1–B4).
    A2,
    /// Atlas A3 (910_93xx).
    A3,
    /// A SoC missing from the table: only what every training class runs.
    Unknown,
}

/// The SoC versions of the table (torch_npu's `NpuVariables.cpp` spellings).
const TABLE: &[(&str, Class)] = &[
    ("Ascend910PremiumA", Class::Training910),
    ("Ascend910ProA", Class::Training910),
    ("Ascend910A", Class::Training910),
    ("Ascend910ProB", Class::Training910),
    ("Ascend910B", Class::Training910),
    ("Ascend910B1", Class::A2),
    ("Ascend910B2", Class::A2),
    ("Ascend910B2C", Class::A2),
    ("Ascend910B3", Class::A2),
    ("Ascend910B4", Class::A2),
    ("Ascend910B4-1", Class::A2),
    ("Ascend910_9391", Class::A3),
    ("Ascend910_9392", Class::A3),
    ("Ascend910_9381", Class::A3),
    ("Ascend910_9382", Class::A3),
    ("Ascend910_9372", Class::A3),
    ("Ascend910_9362", Class::A3),
];

/// The class of SoC version `soc` (exact match of the whole name).
pub fn classify(soc: &str) -> Class {
    TABLE
        .iter()
        .find(|(name, _)| *name == soc.trim())
        .map_or(Class::Unknown, |&(_, c)| c)
}

const F: [DType; 4] = [DType::F32, DType::F16, DType::Bf16, DType::F64];
const NN: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];
const ARITH: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::F64,
    DType::I32,
    DType::I64,
];

/// The op × dtype table of `class` (before the probe).
pub fn table(class: Class) -> BTreeMap<OpId, Vec<DType>> {
    use OpId::*;
    let a2_only = |op: OpId| {
        matches!(
            op,
            Exp | Log
                | RmsNorm
                | RmsNormBackward
                | AmpUnscale
                | AmpUpdateScale
                | ClipGradNorm
                | Rope
                | RopeBackward
                | AddRmsNorm
        )
    };
    let mut m = BTreeMap::new();
    for op in OpId::ALL {
        let mut d: Vec<DType> = match op {
            Fill | Copy | Where => DType::ALL.to_vec(),
            Cast | Neg | Abs | Add | Sub | Mul | Div | Maximum | Minimum | Pow | AddScalar
            | SubScalar | MulScalar | DivScalar | MaximumScalar | MinimumScalar | PowScalar
            | Axpy => ARITH.to_vec(),
            Relu => vec![DType::F32, DType::F16, DType::Bf16, DType::I32, DType::I64],
            Exp | Log | Sqrt | Rsqrt | RandomUniform | RandomNormal | ReduceSum | ReduceMean
            | ReduceMax | ReduceMin | Argmax | Argmin | Softmax | LogSoftmax | SoftmaxMasked
            | LogSoftmaxMasked | IndexSelect => F.to_vec(),
            AmpUpdateScale => vec![DType::F32],
            // No F64 in aclnn's NN operators (A.5).
            _ => NN.to_vec(),
        };
        if class != Class::A2 && class != Class::A3 {
            if a2_only(op) {
                continue;
            }
            // BF16 is documented for few 910 operators; none the catalogue relies on.
            if !matches!(
                op,
                Fill | Copy
                    | Where
                    | Neg
                    | Abs
                    | Rsqrt
                    | RandomUniform
                    | RandomNormal
                    | ReduceMax
                    | ReduceMin
                    | Argmax
                    | Argmin
                    | Softmax
                    | LogSoftmax
                    | IndexSelect
            ) {
                d.retain(|&t| t != DType::Bf16);
            }
            match op {
                // F32 matmul goes through F16 on the 910 (refused with KEEP_DTYPE).
                Matmul => d.retain(|&t| t == DType::F16),
                // No IndexAdd or ScatterAdd on the 910, and EmbeddingDenseBackward sums rows
                // in its own order: not the HAL's index-order, bit-exact index_add.
                IndexAdd => d.clear(),
                _ => {}
            }
        }
        // aclnnFlashAttentionScore(Grad) lists the Atlas A2 training series alone.
        if matches!(op, Attention | AttentionBackward) && class != Class::A2 {
            d.clear();
        }
        if !d.is_empty() {
            m.insert(op, d);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soc_names_are_classified_whole_never_by_prefix() {
        assert_eq!(classify("Ascend910B2"), Class::A2);
        assert_eq!(classify("Ascend910B"), Class::Training910);
        assert_eq!(classify("Ascend910A"), Class::Training910);
        assert_eq!(classify("Ascend910_9391"), Class::A3);
        assert_eq!(classify("Ascend910B9"), Class::Unknown);
        assert_eq!(classify("Ascend310P3"), Class::Unknown);
    }

    #[test]
    fn the_910_table_leaves_out_what_its_docs_do() {
        let t = table(Class::Training910);
        assert!(!t.contains_key(&OpId::RmsNorm) && !t.contains_key(&OpId::Exp));
        assert_eq!(t[&OpId::Matmul], vec![DType::F16]);
        assert!(!t[&OpId::Add].contains(&DType::Bf16));
        let a2 = table(Class::A2);
        assert!(a2[&OpId::Matmul].contains(&DType::F32));
        assert!(!a2[&OpId::Tanh].contains(&DType::F64));
        assert_eq!(a2[&OpId::Attention], NN.to_vec(), "no F64 FlashAttention");
        for op in [
            OpId::Attention,
            OpId::AttentionBackward,
            OpId::Rope,
            OpId::AddRmsNorm,
        ] {
            assert!(!t.contains_key(&op), "{op} on the 910");
        }
        assert_eq!(t[&OpId::AddLayerNorm], vec![DType::F32, DType::F16]);
        assert!(!table(Class::A3).contains_key(&OpId::Attention));
    }
}
