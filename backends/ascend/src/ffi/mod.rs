//! The vendor C APIs, one file per library: [`acl`] (the runtime), [`nnopbase`] (aclnn's
//! descriptors), [`aclnn`] (the operators, resolved across the operator libraries), [`hccl`]
//! (the collectives).

pub mod acl;
pub mod aclnn;
pub mod hccl;
pub mod nnopbase;
