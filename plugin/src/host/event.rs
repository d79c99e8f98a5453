//! A plugin's event as a HAL [`Event`].

use super::device::PluginDevice;
use super::Plugin;
use crate::conv;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use unihal_hal::{DeviceId, Event, EventFlags, HalError, Invalid, NativeHandle, Result};
use unihal_plugin_abi::*;

/// A plugin event; releases the plugin's handle when dropped (the plugin's queued records and
/// waits keep their own).
///
/// Thread safety: any thread.
pub struct PluginEvent {
    p: &'static Plugin,
    raw: *mut UhEvent,
    id: DeviceId,
    flags: EventFlags,
    recorded: AtomicBool,
    _dev: Arc<PluginDevice>,
}

// SAFETY: the raw handle is an opaque token the plugin accepts from any thread (header rule 6).
unsafe impl Send for PluginEvent {}
// SAFETY: as above.
unsafe impl Sync for PluginEvent {}

impl PluginEvent {
    pub(super) fn create(dev: Arc<PluginDevice>, flags: EventFlags) -> Result<PluginEvent> {
        let p = dev.plugin();
        let mut raw = std::ptr::null_mut();
        // SAFETY: the entry's contract.
        p.call(
            p.api.event_create,
            "event_create",
            "event create",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(dev.raw(), flags.disable_timing as u32, &mut raw, e) },
        )?;
        if raw.is_null() {
            return Err(p.broke("event_create", "returned UH_OK with a NULL event"));
        }
        Ok(PluginEvent {
            p,
            raw,
            id: unihal_hal::Device::id(&*dev),
            flags,
            recorded: AtomicBool::new(false),
            _dev: dev,
        })
    }

    /// The plugin event behind a HAL event of plugin `p`.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] for another backend's event.
    pub(crate) fn of<'a>(
        e: &'a dyn Event,
        arg: &'static str,
        p: &'static Plugin,
    ) -> Result<&'a PluginEvent> {
        e.as_any()
            .downcast_ref::<PluginEvent>()
            .filter(|pe| std::ptr::eq(pe.p, p))
            .ok_or_else(|| {
                HalError::invalid(
                    arg,
                    Invalid::ForeignHandle {
                        expected: format!("an event of plugin {}", p.name),
                        found: format!("an event of {}", e.device_id()),
                    },
                )
            })
    }

    pub(crate) fn raw(&self) -> *mut UhEvent {
        self.raw
    }

    pub(crate) fn mark_recorded(&self) {
        self.recorded.store(true, Ordering::Release);
    }
}

impl Drop for PluginEvent {
    fn drop(&mut self) {
        // SAFETY: our handle, released once (required entry).
        unsafe { (self.p.api.event_release.expect("required"))(self.raw) }
    }
}

impl Event for PluginEvent {
    fn device_id(&self) -> DeviceId {
        self.id
    }

    fn query(&self) -> Result<bool> {
        let mut done = 0u32;
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.event_query,
                "event_query",
                "event query",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(self.raw, &mut done, e) },
            )?;
        Ok(done != 0)
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: the entry's contract.
        self.p.call(
            self.p.api.event_synchronize,
            "event_synchronize",
            "event synchronize",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(self.raw, e) },
        )
    }

    fn elapsed_ms(&self, end: &dyn Event) -> Result<f32> {
        let end = PluginEvent::of(end, "end", self.p)?;
        // The HAL's checks, in the order every backend makes them.
        for (e, arg) in [(self, "start"), (end, "end")] {
            let why = if e.flags.disable_timing {
                "event created with timing disabled"
            } else if !e.recorded.load(Ordering::Acquire) {
                "event never recorded"
            } else if !e.query()? {
                "event not completed yet (query or synchronize first)"
            } else {
                continue;
            };
            return Err(HalError::invalid(arg, Invalid::Other(why.into())));
        }
        let mut ms = 0f32;
        // SAFETY: the entry's contract.
        self.p.call(
            self.p.api.event_elapsed,
            "event_elapsed",
            "event elapsed time",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(self.raw, end.raw, &mut ms, e) },
        )?;
        if !ms.is_finite() {
            return Err(self
                .p
                .broke("event_elapsed", format!("returned {ms} milliseconds")));
        }
        Ok(ms)
    }

    fn native_handle(&self) -> NativeHandle {
        let Some(f) = self.p.api.event_native else {
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
