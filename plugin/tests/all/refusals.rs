//! What the loader refuses, each with a clear, typed error and no crash: a plugin of another ABI
//! major (never called past its entry: every other entry of that build aborts the process), a
//! plugin that refuses the host, a table without required entries, a library that is no plugin, a
//! file that is no library, a plugin built for another architecture, a built-in name without the
//! user's consent, relative paths; a status the ABI does not define, named with the entry that
//! returned it; a selected backend whose plugin was refused, named with the refusal instead of "not
//! registered" or of testing a built-in backend of the same name.

use crate::support;

use std::path::Path;
use unihal_hal::{HalError, Registry};
use unihal_plugin::host;

fn expect_abi(r: unihal_hal::Result<&'static str>, needle: &str) {
    match r {
        Err(HalError::AbiMismatch { what }) => {
            assert!(what.contains(needle), "{what:?} does not say {needle:?}")
        }
        other => panic!("expected an ABI mismatch saying {needle:?}, got {other:?}"),
    }
}

#[test]
fn a_plugin_of_another_major_is_refused_before_any_other_call() {
    let lib = support::compile_c_plugin("major2", &["UH_TEST_TABLE_MAJOR=2"]);
    let r = Registry::new();
    expect_abi(host::register(&r, &lib, &[], &[]), "is a plugin of ABI 2.");
    assert!(r.names().is_empty());
}

#[test]
fn a_plugin_that_refuses_the_host_says_why() {
    let lib = support::compile_c_plugin("refuse", &["UH_TEST_REFUSE_HOST"]);
    expect_abi(
        host::register(&Registry::new(), &lib, &[], &[]),
        "speaks unihal plugin ABI 2.0 only",
    );
}

#[test]
fn a_table_without_required_entries_is_refused() {
    let lib = support::compile_c_plugin(
        "nostreams",
        &["UH_TEST_NO_STREAMS", "UH_TEST_NAME=\"nostreams\""],
    );
    expect_abi(
        host::register(&Registry::new(), &lib, &[], &[]),
        "leaves out required entries: stream_create, stream_release, copy_h2d",
    );
}

#[test]
fn a_library_that_is_no_plugin_is_refused() {
    // The C library itself: a real shared library without the entry symbol.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("the C library");
    expect_abi(
        host::register(&Registry::new(), Path::new(libc), &[], &[]),
        "is not a unihal plugin: it exports no `unihal_plugin_entry`",
    );
}

#[test]
fn a_file_that_is_no_library_is_refused_with_the_loaders_message() {
    let dir = std::env::temp_dir().join(format!("unihal-not-a-lib-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("libgarbage.so");
    std::fs::write(&f, b"this is not an ELF file").unwrap();
    match host::register(&Registry::new(), &f, &[], &[]) {
        Err(HalError::Unavailable { what, reason }) => {
            assert!(what.contains("libgarbage.so"), "{what}");
            assert!(!reason.is_empty());
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn a_plugin_built_for_another_architecture_is_refused_with_the_loaders_message() {
    // A real plugin whose ELF header says AArch64 (e_machine 183): what a path to the wrong
    // build of a vendor's plugin gives.
    let lib = support::compile_c_plugin("otherarch", &[]);
    let mut bytes = std::fs::read(&lib).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
    bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
    let f = lib.with_file_name("libunihal_aarch64_plugin.so");
    std::fs::write(&f, &bytes).unwrap();
    match host::register(&Registry::new(), &f, &[], &[]) {
        Err(HalError::Unavailable { what, reason }) => {
            assert!(what.contains("libunihal_aarch64_plugin.so"), "{what}");
            // glibc alone says "No such file or directory" for the file it just found.
            assert!(reason.contains("is built for AArch64"), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn a_built_in_name_is_refused_unless_the_user_asks_for_the_plugin() {
    let lib = support::compile_c_plugin("named_cpu", &["UH_TEST_NAME=\"cpu\""]);
    let r = Registry::new();
    match host::register(&r, &lib, &["cpu"], &[]) {
        Err(HalError::InvalidArgument { reason, .. }) => {
            let m = reason.to_string();
            assert!(
                m.contains("built into this unihal") && m.contains("UNIHAL_PLUGIN_REPLACE=cpu"),
                "{m}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(host::register(&r, &lib, &["cpu"], &["cpu"]).unwrap(), "cpu");
    assert_eq!(r.get("cpu").unwrap().probe().unwrap(), 2);
}

#[test]
fn relative_paths_are_refused_and_directories_list_their_libraries() {
    let files = host::plugin_files("relative/libx.so::");
    assert_eq!(files.len(), 1);
    assert!(files[0]
        .1
        .as_ref()
        .unwrap_err()
        .contains("never loaded from the current directory"));
    let lib = support::compile_c_plugin("indir", &[]);
    let dir = lib.parent().unwrap().display().to_string();
    let listed = host::plugin_files(&dir);
    assert!(
        listed
            .iter()
            .any(|(_, f)| f.as_deref().ok() == Some(lib.as_path())),
        "{listed:?}"
    );
}

#[test]
fn every_attempt_is_recorded() {
    let lib = support::compile_c_plugin("recorded", &["UH_TEST_NAME=\"recorded\""]);
    let _ = host::register(&Registry::new(), &lib, &[], &[]);
    let _ = host::register(
        &Registry::new(),
        Path::new("/nonexistent/libnothing.so"),
        &[],
        &[],
    );
    let a = host::attempts();
    assert!(
        a.iter()
            .any(|x| x.path.ends_with("libcplugin_recorded.so")
                && x.outcome == Ok("recorded".into())),
        "{a:?}"
    );
    assert!(
        a.iter()
            .any(|x| x.path == "/nonexistent/libnothing.so" && x.outcome.is_err()),
        "{a:?}"
    );
}

#[test]
fn an_unknown_status_names_the_entry_that_returned_it() {
    let lib = support::compile_c_plugin(
        "unknown_status",
        &[
            "UH_TEST_UNKNOWN_STATUS=77",
            "UH_TEST_NAME=\"unknownstatus\"",
        ],
    );
    let r = Registry::new();
    host::register(&r, &lib, &[], &[]).unwrap();
    let device = r.get("unknownstatus").unwrap().open(0).unwrap();
    match device.alloc(64) {
        Err(HalError::AbiMismatch { what }) => {
            assert!(
                what.contains("the plugin unknownstatus")
                    && what.contains("`mem_alloc`")
                    && what.contains("status 77")
                    && what.contains("a status of a newer ABI"),
                "{what}"
            );
        }
        other => panic!("expected an ABI mismatch naming mem_alloc, got {other:?}"),
    }
}

#[test]
fn a_refused_plugin_with_a_built_in_name_is_named_instead_of_testing_the_built_in() {
    // "twin" stands for a built-in backend: registered without a plugin load.
    let lib = support::compile_c_plugin("twin", &["UH_TEST_NAME=\"twin\""]);
    let p = host::load(&lib).unwrap();
    let r = Registry::new();
    r.register("twin", move || {
        std::sync::Arc::new(host::PluginBackend::new(p)) as std::sync::Arc<dyn unihal_hal::Backend>
    })
    .unwrap();
    assert!(host::register(&r, &lib, &["twin"], &[]).is_err());
    let why = host::selection_problem(&r, "twin", &host::attempts()).expect("a problem");
    assert!(
        why.contains("built into this unihal")
            && why.contains("would test the built-in backend")
            && why.contains("libcplugin_twin.so")
            && why.contains("UNIHAL_PLUGIN_REPLACE=twin"),
        "{why}"
    );
    // Once the plugin is loaded under the name (the user asked for it), nothing is wrong.
    let r2 = Registry::new();
    r2.register("twin", || -> std::sync::Arc<dyn unihal_hal::Backend> {
        unreachable!("never created")
    })
    .unwrap();
    assert_eq!(
        host::register(&r2, &lib, &["twin"], &["twin"]).unwrap(),
        "twin"
    );
    assert_eq!(
        host::selection_problem(&r2, "twin", &host::attempts()),
        None
    );
}

#[test]
fn a_backend_missing_because_its_plugin_was_refused_names_the_refusal() {
    let attempts = [
        host::Attempt {
            path: "/opt/x/libmychip_plugin.so".into(),
            outcome: Err("leaves out required entries: fill".into()),
            backend: None,
        },
        host::Attempt {
            path: "/opt/x/libother_plugin.so".into(),
            outcome: Err("backend name \"other\" is taken".into()),
            backend: Some("other".into()),
        },
    ];
    let r = Registry::new();
    // Refused before it gave a name: every such refusal is listed.
    let why = host::selection_problem(&r, "mychip", &attempts).expect("a problem");
    assert!(
        why.contains("\"mychip\" is not registered")
            && why.contains("/opt/x/libmychip_plugin.so: leaves out required entries: fill"),
        "{why}"
    );
    // Refused after it gave the name asked for: that refusal.
    let why = host::selection_problem(&r, "other", &attempts).expect("a problem");
    assert!(
        why.contains("the plugin that gives that name was refused")
            && why.contains("/opt/x/libother_plugin.so"),
        "{why}"
    );
    // No refusal: the registry's own answer stands.
    assert_eq!(host::selection_problem(&r, "mychip", &[]), None);
}
