//! Trains the two-layer MLP of `support/mlp.rs` for 50 steps through the caching allocator; the
//! loss must fall below 5% of its first value, and after step 2 no step may call
//! `Device::alloc` (every buffer of a step comes from the allocator's cache). Its allocation
//! trace, scaled to a 1 GiB peak, must keep at least 90% of the reserved memory allocated.

use crate::mlp;

use unihal::DType;

fn check(dt: DType) {
    mlp::check(dt, None);
}

#[test]
fn mlp_trains_in_f32() {
    if crate::own_process() {
        return;
    }
    check(DType::F32);
}

#[test]
fn mlp_trains_in_bf16_with_f32_master_weights() {
    if crate::own_process() {
        return;
    }
    check(DType::Bf16);
}

#[test]
fn the_scaled_allocation_trace_keeps_reserved_memory_allocated() {
    if crate::own_process() {
        return;
    }
    let r = mlp::trace_replay(unihal::alloc::AllocatorConfig::default());
    eprintln!("mlp trace: {r}");
    r.check();
}
