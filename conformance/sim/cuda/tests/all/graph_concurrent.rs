//! Capture and replay in concurrent mode (kernel and host nodes of a replay on kernel threads).

use crate::cases;

#[test]
fn concurrent_capture_and_replay() {
    if crate::own_process() {
        return;
    }
    let _g = cases::serial();
    cases::capture_and_replay("concurrent");
}

#[test]
fn concurrent_fork_and_join() {
    if crate::own_process() {
        return;
    }
    let _g = cases::serial();
    cases::fork_and_join("concurrent");
}

#[test]
fn concurrent_memory_nodes() {
    if crate::own_process() {
        return;
    }
    let _g = cases::serial();
    cases::memory_nodes("concurrent");
}
