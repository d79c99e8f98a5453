//! The vendor C APIs, one file per library: [`acl`] (the runtime), [`nnopbase`] (aclnn's
//! descriptors), [`aclnn`] (the operators, resolved across the operator libraries). HCCL's
//! table is [`crate::hccl::ffi`].

pub mod acl;
pub mod aclnn;
pub mod nnopbase;
