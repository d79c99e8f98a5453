//! The exporter's side of the boundary, called directly as a host would: a panic in the backend
//! comes back as `UH_ERR_INTERNAL` with its message (never unwinding into C), a host of another
//! major is refused by the entry, and NULL handles are refused as invalid arguments.

use std::ptr::null_mut;
use std::sync::Arc;
use unihal_hal::{Backend, BackendInfo, Device, Result};
use unihal_plugin::abi::*;
use unihal_plugin::conv;

/// A backend whose probe panics and whose open fails.
struct Panicky;

impl Backend for Panicky {
    fn name(&self) -> &'static str {
        "panicky"
    }
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "panicky".into(),
            version: "0".into(),
            libraries: Vec::new(),
            simulated: false,
            concurrent: true,
        }
    }
    fn probe(&self) -> Result<usize> {
        panic!("probe exploded")
    }
    fn open(&self, _: usize) -> Result<Arc<dyn Device>> {
        Err(unihal_hal::HalError::unsupported("devices"))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn host(major: u32) -> UhHostApi {
    UhHostApi {
        size: std::mem::size_of::<UhHostApi>() as u32,
        abi_major: major,
        abi_minor: 0,
        reserved: 0,
        log: None,
    }
}

#[test]
fn the_boundary_catches_panics_refuses_other_majors_and_null_handles() {
    // Another major: refused before the backend is made.
    let mut err = UhError::new();
    // SAFETY: a valid host API and error record.
    let t = unsafe {
        unihal_plugin::export::entry(&host(UH_ABI_MAJOR + 1), &mut err, || -> Arc<dyn Backend> {
            unreachable!("made for a refused host")
        })
    };
    assert!(t.is_null());
    assert_eq!(err.code, UH_ERR_ABI_MISMATCH);
    assert!(
        conv::get_str(&err.message).contains("this plugin 1."),
        "{}",
        conv::get_str(&err.message)
    );

    let mut err = UhError::new();
    // SAFETY: as above.
    let t = unsafe {
        unihal_plugin::export::entry(&host(UH_ABI_MAJOR), &mut err, || Arc::new(Panicky))
    };
    assert!(!t.is_null());
    // SAFETY: a non-null table from the entry, valid forever.
    let api = unsafe { &*t };
    assert!(
        api.ccl_caps.is_none(),
        "no collective engine, no ccl_caps entry"
    );

    let mut n = 0u32;
    let mut err = UhError::new();
    // SAFETY: the entry's contract.
    let s = unsafe { (api.probe.unwrap())(&mut n, &mut err) };
    assert_eq!(s, UH_ERR_INTERNAL);
    let m = conv::get_str(&err.message);
    assert!(m.contains("the plugin panicked: probe exploded"), "{m}");

    let mut dev = null_mut();
    let mut err = UhError::new();
    // SAFETY: as above.
    let s = unsafe { (api.device_open.unwrap())(0, &mut dev, &mut err) };
    assert_eq!((s, dev.is_null()), (UH_ERR_UNSUPPORTED, true));

    let mut err = UhError::new();
    let mut m = null_mut();
    let mut addr = 0;
    // SAFETY: a NULL device handle is what is being tested; the entry must refuse it.
    let s = unsafe { (api.mem_alloc.unwrap())(null_mut(), 16, &mut m, &mut addr, &mut err) };
    assert_eq!(
        (s, err.invalid),
        (UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER)
    );
    assert_eq!(conv::get_str(&err.arg), "dev");
}
