//! Collectives through HCCL (in progress: the engine is not built yet, so the backend reports
//! no collectives).

use unihal_hal::LibraryInfo;

/// The HCCL engine.
#[derive(Default)]
pub struct Engine;

impl Engine {
    /// The report line of HCCL.
    pub fn info(&self) -> LibraryInfo {
        LibraryInfo::missing(
            "collectives",
            "HCCL",
            "the HCCL engine is not built yet".into(),
        )
    }

    /// The engine as the backend's collectives, when HCCL opened.
    pub fn available(&self) -> Option<&dyn unihal_hal::Collectives> {
        None
    }
}
