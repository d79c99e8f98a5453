//! Typed accessors of a call's scalars, per op class: the inverse of the constructors of
//! [`super::nn`] (`OpCall::cross_entropy(.., CeOptions)` is read back by
//! [`OpCall::ce_options`]), so that a consumer (a planner, a vendor op map, a kernel) names what
//! it reads instead of its position in [`OpCall::scalars`].
//!
//! Each accessor checks the class and the scalar count it decodes and returns
//! [`HalError::Internal`] otherwise: after [`OpCall::validate`] that never happens, and a consumer
//! handed an unvalidated call gets an error, never a panic.

use super::nn::{AdamWOptions, CeOptions, CeReduction, SgdOptions};
use super::transformer::AttentionOptions;
use super::{OpCall, OpClass, OpId, Scalar};
use crate::error::{HalError, Result};

/// The scalars of `AmpUpdateScale` ([`OpCall::amp_update_scale`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AmpScaleUpdate {
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: i64,
}

/// The step of a multi-tensor optimizer call ([`OpCall::sgd_momentum`], [`OpCall::adamw`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerStep {
    Sgd(SgdOptions),
    AdamW(AdamWOptions),
}

impl OpCall {
    /// The scalars of a call of one of `classes`, `n` of them.
    fn scalars_of(&self, classes: &[OpClass], n: usize) -> Result<&[Scalar]> {
        if !classes.contains(&self.op.class()) || self.scalars.len() != n {
            return Err(HalError::Internal(format!(
                "{} with {} scalars read as {classes:?} with {n}",
                self.op,
                self.scalars.len()
            )));
        }
        Ok(&self.scalars)
    }

    /// The axis of a reduction (`ReduceSum` ... `Argmin`), as given (negative counts from the
    /// end).
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class.
    pub fn reduce_axis(&self) -> Result<i64> {
        Ok(self.scalars_of(&[OpClass::Reduce], 1)?[0].as_i64())
    }

    /// The options of `CrossEntropy` and `CrossEntropyBackward`.
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class or an unknown reduction.
    pub fn ce_options(&self) -> Result<CeOptions> {
        let classes = [OpClass::CrossEntropy, OpClass::CrossEntropyBackward];
        let s = self.scalars_of(&classes, 3)?;
        let reduction = match s[0].as_i64() {
            0 => CeReduction::Mean,
            1 => CeReduction::Sum,
            2 => CeReduction::None,
            r => return Err(HalError::Internal(format!("cross-entropy reduction {r}"))),
        };
        Ok(CeOptions {
            reduction,
            ignore_index: s[1].as_i64(),
            label_smoothing: s[2].as_f64(),
        })
    }

    /// The `eps` of `LayerNorm`, `RmsNorm`, `AddLayerNorm` and `AddRmsNorm` (the forward passes).
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class.
    pub fn norm_eps(&self) -> Result<f64> {
        let classes = [
            OpClass::LayerNorm,
            OpClass::RmsNorm,
            OpClass::AddLayerNorm,
            OpClass::AddRmsNorm,
        ];
        Ok(self.scalars_of(&classes, 1)?[0].as_f64())
    }

    /// The options of `Attention` and `AttentionBackward`, and whether the call has a bias.
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class.
    pub fn attention_options(&self) -> Result<(AttentionOptions, bool)> {
        let classes = [OpClass::Attention, OpClass::AttentionBackward];
        let s = self.scalars_of(&classes, 4)?;
        let o = AttentionOptions {
            scale: s[0].as_f64(),
            causal: s[1].as_i64() != 0,
            dropout_p: s[2].as_f64(),
            rng: self.rng,
        };
        Ok((o, s[3].as_i64() != 0))
    }

    /// Whether a `Rope`/`RopeBackward` call rotates interleaved pairs (else the two halves).
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class.
    pub fn rope_interleaved(&self) -> Result<bool> {
        Ok(self.scalars_of(&[OpClass::Rope], 1)?[0].as_i64() != 0)
    }

    /// `(alpha, beta)` of `Matmul`.
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class.
    pub fn matmul_scales(&self) -> Result<(f64, f64)> {
        let s = self.scalars_of(&[OpClass::Matmul], 2)?;
        Ok((s[0].as_f64(), s[1].as_f64()))
    }

    /// The step of `SgdMomentum` or `AdamW`, and whether each group ends with a half-precision
    /// copy of its parameter.
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class.
    pub fn optimizer_step(&self) -> Result<(OptimizerStep, bool)> {
        let s = self.scalars_of(&[OpClass::Optimizer], 7)?;
        let f = |k: usize| s[k].as_f64();
        let flag = |k: usize| s[k].as_i64() != 0;
        let step = if self.op == OpId::AdamW {
            OptimizerStep::AdamW(AdamWOptions {
                lr: f(0),
                beta1: f(1),
                beta2: f(2),
                eps: f(3),
                weight_decay: f(4),
                step: s[5].as_i64().max(0) as u64,
            })
        } else {
            OptimizerStep::Sgd(SgdOptions {
                lr: f(0),
                momentum: f(1),
                dampening: f(2),
                weight_decay: f(3),
                nesterov: flag(4),
                first_step: flag(5),
            })
        };
        Ok((step, flag(6)))
    }

    /// The scalars of `AmpUpdateScale`.
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class.
    pub fn amp_scale_update(&self) -> Result<AmpScaleUpdate> {
        let s = self.scalars_of(&[OpClass::AmpUpdateScale], 3)?;
        Ok(AmpScaleUpdate {
            growth_factor: s[0].as_f64(),
            backoff_factor: s[1].as_f64(),
            growth_interval: s[2].as_i64(),
        })
    }

    /// The `max_norm` of `ClipGradNorm`.
    ///
    /// # Errors
    /// [`HalError::Internal`] for another class.
    pub fn max_norm(&self) -> Result<f64> {
        Ok(self.scalars_of(&[OpClass::ClipGradNorm], 1)?[0].as_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::nn::ParamGroup;
    use crate::{DType, TensorView};

    /// A view of a zero-length allocation: constructors and accessors never touch memory.
    fn view() -> TensorView {
        TensorView::contiguous(&crate::op::no_memory(), DType::F32, &[4])
    }

    #[test]
    fn every_accessor_reads_back_what_its_constructor_wrote() {
        let (x, y) = (view(), view());
        assert_eq!(
            OpCall::reduce(OpId::Argmax, x.clone(), y.clone(), -1).reduce_axis(),
            Ok(-1)
        );
        let ce = CeOptions {
            reduction: CeReduction::None,
            ignore_index: 3,
            label_smoothing: 0.25,
        };
        let c = OpCall::cross_entropy_backward(x.clone(), x.clone(), x.clone(), y.clone(), ce);
        assert_eq!(c.ce_options(), Ok(ce));
        let c = OpCall::rms_norm(x.clone(), x.clone(), y.clone(), y.clone(), 1e-5);
        assert_eq!(c.norm_eps(), Ok(1e-5));
        let c = OpCall::matmul(x.clone(), x.clone(), y.clone(), 2.0, 0.5);
        assert_eq!(c.matmul_scales(), Ok((2.0, 0.5)));
        let group = ParamGroup {
            param: x.clone(),
            grad: x.clone(),
            state: vec![x.clone(), x.clone()],
            copy: Some(y.clone()),
        };
        let adam = AdamWOptions {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step: 7,
        };
        let c = OpCall::adamw(std::slice::from_ref(&group), adam);
        assert_eq!(c.optimizer_step(), Ok((OptimizerStep::AdamW(adam), true)));
        let sgd = SgdOptions {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: true,
            first_step: false,
        };
        let plain = ParamGroup {
            copy: None,
            ..group
        };
        let c = OpCall::sgd_momentum(&[plain], sgd);
        assert_eq!(c.optimizer_step(), Ok((OptimizerStep::Sgd(sgd), false)));
        let c = OpCall::amp_update_scale(x.clone(), x.clone(), x.clone(), 2.0, 0.5, 2000);
        let want = AmpScaleUpdate {
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        };
        assert_eq!(c.amp_scale_update(), Ok(want));
        assert_eq!(
            OpCall::clip_grad_norm(x.clone(), &[y], 1.5).max_norm(),
            Ok(1.5)
        );
    }

    #[test]
    fn an_accessor_of_another_class_is_an_error_not_a_panic() {
        let c = OpCall::matmul(view(), view(), view(), 1.0, 0.0);
        assert!(matches!(c.ce_options(), Err(HalError::Internal(_))));
        let mut short = OpCall::clip_grad_norm(view(), &[view()], 1.0);
        short.scalars.clear();
        assert!(matches!(short.max_norm(), Err(HalError::Internal(_))));
    }
}
