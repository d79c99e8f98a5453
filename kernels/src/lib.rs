//! # unihal-kernels: kernels shared by every backend
//!
//! This crate is the home of unihal's portable kernel library (the op catalogue, written once and
//! compiled for the CPU, CUDA and HIP). It starts with [`testing`], the small set of kernels the
//! conformance suite launches to check raw launches, argument passing, grid shapes and stream
//! ordering on every backend.

pub mod testing;
