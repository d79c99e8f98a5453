//! A plugin's device, device memory and host memory as HAL objects.

use super::event::PluginEvent;
use super::module::PluginModule;
use super::stream::PluginStream;
use super::{check_array, Plugin, MAX_ARRAY_ENTRIES};
use crate::conv;
use std::any::Any;
use std::ffi::c_void;
use std::sync::{Arc, Weak};
use unihal_hal::{
    Buffer, Capabilities, Device, DeviceAllocation, DeviceId, DeviceInfo, Event, EventFlags,
    HalError, HostAllocation, HostBuffer, Invalid, Keep, MemoryInfo, Module, ModuleSource,
    NativeHandle, Result, Stream,
};
use unihal_plugin_abi::*;

/// An opened plugin device. Releases the plugin's handle when the last HAL object of the device
/// is gone (buffers, streams, events and modules hold the device).
///
/// Thread safety: any thread (the plugin is, by the header's rule 6).
pub struct PluginDevice {
    p: &'static Plugin,
    raw: *mut UhDevice,
    info: DeviceInfo,
    caps: Capabilities,
    me: Weak<PluginDevice>,
}

// SAFETY: the raw handle is an opaque token the plugin accepts from any thread (header rule 6).
unsafe impl Send for PluginDevice {}
// SAFETY: as above.
unsafe impl Sync for PluginDevice {}

impl PluginDevice {
    /// Opens device `ordinal` of the `count` the plugin reported, checking what the plugin
    /// returns: a device handle, and properties whose counts and capabilities hold together.
    pub(super) fn open(
        p: &'static Plugin,
        ordinal: u32,
        count: usize,
    ) -> Result<Arc<PluginDevice>> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the entry's contract; `raw` outlives the call.
        p.call(
            p.api.device_open,
            "device_open",
            "device open",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(ordinal, &mut raw, e) },
        )?;
        if raw.is_null() {
            return Err(p.broke(
                "device_open",
                format!("returned UH_OK with a NULL device for ordinal {ordinal}"),
            ));
        }
        let mut props = std::mem::MaybeUninit::<UhDeviceProps>::zeroed();
        // SAFETY: as above.
        let r = p.call(
            p.api.device_props,
            "device_props",
            "device props",
            |f, e| unsafe { f(raw, props.as_mut_ptr(), e) },
        );
        // SAFETY: filled by the plugin or left all zero (a valid value: integers and pointers).
        let props = unsafe { props.assume_init() };
        if let Err(e) = r.and_then(|()| check_props(p, ordinal, count, &props)) {
            // SAFETY: our handle, released once.
            unsafe { (p.api.device_release.expect("required"))(raw) };
            return Err(e);
        }
        // SAFETY: filled by the plugin, its arrays checked, pointers valid while the device
        // lives (header); the strings are copied here.
        let (name, vendor, caps) = unsafe { conv::get_props(&props) };
        Ok(Arc::new_cyclic(|me| PluginDevice {
            p,
            raw,
            info: DeviceInfo {
                id: DeviceId {
                    backend: p.name,
                    ordinal,
                },
                name,
                vendor,
            },
            caps,
            me: me.clone(),
        }))
    }

    pub(crate) fn raw(&self) -> *mut UhDevice {
        self.raw
    }

    pub(crate) fn plugin(&self) -> &'static Plugin {
        self.p
    }

    pub(crate) fn arc(&self) -> Arc<PluginDevice> {
        self.me
            .upgrade()
            .expect("a device method runs on a live device")
    }
}

/// Checks the properties `device_props` returned for device `ordinal` of `count`: the
/// allocation alignment a power of two, the peer and op arrays in range (peers devices of this
/// plugin), and every entry a claimed capability relies on present.
fn check_props(p: &Plugin, ordinal: u32, count: usize, props: &UhDeviceProps) -> Result<()> {
    let broke = |what: String| p.broke("device_props", format!("{what} for device {ordinal}"));
    if !props.alloc_alignment.is_power_of_two() {
        return Err(broke(format!(
            "returned an allocation alignment of {} (not a power of two)",
            props.alloc_alignment
        )));
    }
    check_array(props.peers, props.n_peers.into(), count as u64, "peers").map_err(broke)?;
    check_array(
        props.ops,
        props.n_ops.into(),
        MAX_ARRAY_ENTRIES,
        "op supports",
    )
    .map_err(broke)?;
    // SAFETY: `n_peers` ordinals (checked above), valid while the device lives (header).
    let peers = unsafe { conv::slice(props.peers, props.n_peers as usize) };
    if let Some(peer) = peers.iter().find(|&&o| o as usize >= count) {
        return Err(broke(format!(
            "returned peer device {peer} of {count} devices"
        )));
    }
    let claims: [(bool, &str, &[&str]); 5] = [
        (
            props.flags & UH_CAP_EVENT_TIMING != 0,
            "event timing",
            &["event_elapsed"],
        ),
        (
            props.flags & UH_CAP_HOST_CALLBACKS != 0,
            "host callbacks",
            &["host_callback"],
        ),
        (props.n_peers > 0, "peer devices", &["copy_peer"]),
        (props.n_ops > 0, "library ops", &["run_op"]),
        (
            props.module_formats != 0,
            "module formats",
            &[
                "module_load",
                "module_release",
                "module_function",
                "function_release",
                "launch",
            ],
        ),
    ];
    for (claimed, what, entries) in claims {
        let absent = super::missing(&p.api, entries.iter().copied());
        if claimed && !absent.is_empty() {
            return Err(broke(format!(
                "claims {what}, but the plugin leaves out `{}`",
                absent.join("`, `")
            )));
        }
    }
    Ok(())
}

impl Drop for PluginDevice {
    fn drop(&mut self) {
        if let Some(f) = self.p.api.device_release {
            // SAFETY: our handle, released once, after every object that used it.
            unsafe { f(self.raw) }
        }
    }
}

/// One plugin allocation, as the HAL's backend allocation. Dropping it releases the plugin's
/// handle; the plugin frees the memory once its queued work no longer uses it.
pub struct PluginMem {
    pub(crate) p: &'static Plugin,
    pub(crate) raw: *mut UhMem,
    device: DeviceId,
    addr: u64,
    len: u64,
    /// Holds the device (and so its plugin handle) while memory of it lives.
    _dev: Arc<PluginDevice>,
}

// SAFETY: an opaque token the plugin accepts from any thread (header rule 6).
unsafe impl Send for PluginMem {}
// SAFETY: as above.
unsafe impl Sync for PluginMem {}

// SAFETY: the plugin's allocation is `len` bytes at `addr` (checked when made not to wrap past
// 2^64), owned by the handle until released in our drop; none of the values change.
unsafe impl DeviceAllocation for PluginMem {
    fn device(&self) -> DeviceId {
        self.device
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for PluginMem {
    fn drop(&mut self) {
        // SAFETY: our handle, released once (required entry).
        unsafe { (self.p.api.mem_release.expect("required"))(self.raw) }
    }
}

/// One plugin host allocation, as the HAL's host allocation.
pub struct PluginHostMem {
    pub(crate) p: &'static Plugin,
    pub(crate) raw: *mut UhHostMem,
    device: DeviceId,
    ptr: *mut u8,
    len: usize,
    _dev: Arc<PluginDevice>,
}

// SAFETY: as PluginMem.
unsafe impl Send for PluginHostMem {}
// SAFETY: as PluginMem.
unsafe impl Sync for PluginHostMem {}

// SAFETY: the plugin's host allocation is `len` zeroed bytes at `ptr` (header: host memory is
// zeroed; checked when made: not NULL, not wrapping), owned by the handle until released in
// our drop.
unsafe impl HostAllocation for PluginHostMem {
    fn device(&self) -> DeviceId {
        self.device
    }
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for PluginHostMem {
    fn drop(&mut self) {
        // SAFETY: our handle, released once (required entry).
        unsafe { (self.p.api.host_release.expect("required"))(self.raw) }
    }
}

/// The owner of imported memory, dropped when the plugin releases the import (or refuses it).
unsafe extern "C" fn drop_owner(user: *mut c_void) {
    // SAFETY: `user` is the Box<Keep> leaked in import_memory; the plugin calls this exactly once
    // per import, whatever the import returned (header), and the host never frees it itself.
    drop(unsafe { Box::from_raw(user as *mut Keep) });
}

impl Device for PluginDevice {
    fn id(&self) -> DeviceId {
        self.info.id
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        let (mut total, mut free) = (0u64, 0u64);
        // SAFETY: the entry's contract.
        self.p.call(
            self.p.api.device_memory_info,
            "device_memory_info",
            "memory info",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(self.raw, &mut total, &mut free, e) },
        )?;
        if free > total {
            return Err(self.p.broke(
                "device_memory_info",
                format!("returned {free} bytes free of {total} on {}", self.info.id),
            ));
        }
        Ok(MemoryInfo { total, free })
    }

    fn alloc(&self, len: usize) -> Result<Buffer> {
        let (mut raw, mut addr) = (std::ptr::null_mut(), 0u64);
        // SAFETY: the entry's contract.
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(self.p.api.mem_alloc, "mem_alloc", "alloc", |f, e| unsafe {
                f(self.raw, len as u64, &mut raw, &mut addr, e)
            })?;
        let align = self.caps.mandatory.alloc_alignment;
        let wrong = if raw.is_null() {
            Some("returned UH_OK with a NULL allocation".to_string())
        } else if addr.checked_add(len as u64).is_none() {
            Some(format!(
                "returned address {addr:#x} for {len} bytes: the range wraps past 2^64"
            ))
        } else if len > 0 && addr % align != 0 {
            Some(format!(
                "returned address {addr:#x}, off the device's {align}-byte alignment"
            ))
        } else {
            None
        };
        if let Some(what) = wrong {
            if !raw.is_null() {
                // SAFETY: the handle the plugin just returned, released once, never kept.
                unsafe { (self.p.api.mem_release.expect("required"))(raw) };
            }
            return Err(self.p.broke("mem_alloc", what));
        }
        Ok(Buffer::from_allocation(PluginMem {
            p: self.p,
            raw,
            device: self.info.id,
            addr,
            len: len as u64,
            _dev: self.arc(),
        }))
    }

    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        let (mut raw, mut ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.host_alloc,
                "host_alloc",
                "alloc host",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(self.raw, len as u64, &mut raw, &mut ptr, e) },
            )?;
        let wrong = if raw.is_null() {
            Some("returned UH_OK with a NULL host allocation".to_string())
        } else if ptr.is_null() && len > 0 {
            Some(format!(
                "returned UH_OK with a NULL pointer for {len} bytes"
            ))
        } else if (ptr as usize).checked_add(len).is_none() || len > isize::MAX as usize {
            Some(format!(
                "returned pointer {ptr:p} for {len} bytes: the range wraps the address space"
            ))
        } else {
            None
        };
        if let Some(what) = wrong {
            if !raw.is_null() {
                // SAFETY: the handle the plugin just returned, released once, never kept.
                unsafe { (self.p.api.host_release.expect("required"))(raw) };
            }
            return Err(self.p.broke("host_alloc", what));
        }
        Ok(HostBuffer::from_allocation(Box::new(PluginHostMem {
            p: self.p,
            raw,
            device: self.info.id,
            ptr: ptr as *mut u8,
            len,
            _dev: self.arc(),
        })))
    }

    unsafe fn import_memory(&self, addr: u64, len: u64, owner: Keep) -> Result<Buffer> {
        let Some(entry) = self.p.api.mem_import else {
            return Err(self.p.unsupported("wrapping foreign memory"));
        };
        if addr.checked_add(len).is_none() {
            // Refused before the plugin sees it: `owner` is dropped here, once.
            return Err(HalError::invalid(
                "len",
                Invalid::Value {
                    value: format!("{len} bytes at {addr:#x}"),
                    accepted: "a range that ends at or below 2^64".into(),
                },
            ));
        }
        let user = Box::into_raw(Box::new(owner)) as *mut c_void;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the entry's contract; the caller vouches for the range.
        let r = self
            .p
            .call(Some(entry), "mem_import", "import memory", |f, e| unsafe {
                f(self.raw, addr, len, Some(drop_owner), user, &mut raw, e)
            });
        // Refused or not, the plugin calls `drop_owner` exactly once (header): the owner is
        // never freed here.
        r?;
        if raw.is_null() {
            return Err(self
                .p
                .broke("mem_import", "returned UH_OK with a NULL allocation"));
        }
        Ok(Buffer::from_allocation(PluginMem {
            p: self.p,
            raw,
            device: self.info.id,
            addr,
            len,
            _dev: self.arc(),
        }))
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(PluginStream::create(self.arc())? as Arc<dyn Stream>)
    }

    fn create_event(&self, flags: EventFlags) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(PluginEvent::create(self.arc(), flags)?) as Arc<dyn Event>)
    }

    fn load_module(&self, source: &ModuleSource) -> Result<Arc<dyn Module>> {
        Ok(Arc::new(PluginModule::load(self.arc(), source)?) as Arc<dyn Module>)
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: the entry's contract.
        self.p.call(
            self.p.api.device_synchronize,
            "device_synchronize",
            "device synchronize",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(self.raw, e) },
        )
    }

    fn native_handle(&self) -> NativeHandle {
        let Some(f) = self.p.api.device_native else {
            return NativeHandle::None;
        };
        let mut n = conv::put_native(NativeHandle::None);
        // SAFETY: the entry's contract.
        unsafe { f(self.raw, &mut n) };
        conv::get_native(&n)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
