//! A test that needs a process of its own inside a crate's one integration-test binary.
//!
//! Each crate gathers its integration tests into one binary (`tests/all/main.rs`): one link
//! instead of one per file. A test whose process-wide state must be its own (environment
//! variables read once when a vendor library loads, a simulated runtime's global mode or fault
//! controls, a driver opened once per process) starts with
//!
//! ```ignore
//! if own_process() {
//!     return;
//! }
//! ```
//!
//! In the test runner's process the call runs the same test again in a child process of the
//! same binary (`<name> --exact`), passes its output through and fails the test if the child
//! failed; it returns `true` and the test returns. In the child it returns `false` and the test
//! runs. Tests of the same binary therefore run side by side without seeing each other's
//! settings, as they did when each file was a binary of its own.

/// Set in the child process that runs one test on its own.
const CHILD: &str = "UNIHAL_OWN_PROCESS_CHILD";

/// See the module's documentation. Call it first in a `#[test]` function (the test's name is
/// its thread's name).
///
/// # Panics
/// When the child process fails, does not start, or did not run exactly this test.
pub fn own_process() -> bool {
    if std::env::var_os(CHILD).is_some() {
        return false;
    }
    let name = std::thread::current()
        .name()
        .expect("own_process() is called on a test's thread, which is named after the test")
        .to_string();
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([&name, "--exact", "--include-ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD, "1")
        .output()
        .expect("the test's child process starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    eprint!("{stdout}");
    // A filter that matched nothing would pass with 0 tests: the child must have run this one.
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} failed in its own process ({}); its output is above",
        out.status
    );
    true
}
