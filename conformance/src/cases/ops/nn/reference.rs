//! Independent f64 references of the training ops.
