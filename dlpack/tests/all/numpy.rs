//! Runs `numpy_dlpack.py` (numpy as the DLPack consumer and producer) against the `numpy_fixture`
//! example, a shared library that `cargo test` builds with the examples. Python comes from
//! `UNIHAL_PYTHON` (default `python3`). Without numpy the test says so and passes, unless
//! `UNIHAL_TEST_NUMPY=1` (set by `.ci/run`, which installs numpy): then a missing numpy fails it.

use std::path::PathBuf;
use std::process::Command;

fn fixture_library() -> PathBuf {
    // target/<profile>/deps/numpy-<hash> -> target/<profile>/examples/libnumpy_fixture.so
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join("examples").join(format!(
        "{}numpy_fixture{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ))
}

#[test]
fn numpy_exchanges_tensors_with_unihal_through_dlpack() {
    let python = std::env::var("UNIHAL_PYTHON").unwrap_or_else(|_| "python3".into());
    let required = std::env::var("UNIHAL_TEST_NUMPY").as_deref() == Ok("1");
    let probe = Command::new(&python)
        .args(["-c", "import numpy; print(numpy.__version__)"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        other => {
            let why = match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                Err(e) => e.to_string(),
            };
            assert!(
                !required,
                "UNIHAL_TEST_NUMPY=1 but {python} cannot import numpy: {why}"
            );
            eprintln!("SKIPPED: {python} cannot import numpy ({why}); set UNIHAL_TEST_NUMPY=1 to require it");
            return;
        }
    }
    let lib = fixture_library();
    assert!(
        lib.exists(),
        "{} was not built: run the whole test suite (`cargo test -p unihal-dlpack`), which builds the examples",
        lib.display()
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/numpy_dlpack.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&lib)
        .output()
        .expect("run python");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "numpy DLPack test failed:\n{text}");
    assert!(
        text.contains("Ran 9 tests") && text.contains("OK"),
        "{text}"
    );
}
