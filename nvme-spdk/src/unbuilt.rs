//! The device when weir was built without SPDK: it cannot be opened, so a
//! value of it cannot exist.

use crate::{OpenError, SpdkOptions, SpdkStats};
use weir_core::buf::BufPool;
use weir_core::device::{DevCommand, DevCompletion, DevError, Geometry};

/// Uninhabited: `open` always fails.
#[derive(Debug)]
pub(crate) enum Device {}

impl Device {
    pub(crate) fn open(_opts: SpdkOptions) -> Result<Device, OpenError> {
        match option_env!("WEIR_SPDK_MISSING") {
            Some(why) => Err(OpenError::NotFound(why)),
            None => Err(OpenError::NotBuilt),
        }
    }

    pub(crate) fn identity(&self) -> &str {
        match *self {}
    }

    pub(crate) fn pool(&self) -> BufPool {
        match *self {}
    }

    pub(crate) fn stats(&self) -> SpdkStats {
        match *self {}
    }

    pub(crate) fn geometry(&self) -> Geometry {
        match *self {}
    }

    pub(crate) fn submit(
        &self,
        _queue: u16,
        _cmd: DevCommand,
    ) -> std::future::Ready<Result<DevCompletion, DevError>> {
        match *self {}
    }
}
