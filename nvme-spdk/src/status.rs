//! NVMe completion status, as the completion queue entry carries it, and what
//! each status means to weir.

use weir_core::device::DevError;
use weir_core::ids::Lba;

/// The status of an NVMe completion: its type (SCT) and code (SC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmeStatus {
    /// Status Code Type: 0 generic, 1 command specific, 2 media and data
    /// integrity, 3 path related, 7 vendor specific.
    pub sct: u8,
    /// Status Code, within its type.
    pub sc: u8,
    /// Do Not Retry: the same command would fail again.
    pub dnr: bool,
}

/// Generic status codes weir tells apart (NVMe base specification, figure
/// "Generic Command Status Values").
mod sc {
    pub(super) const SUCCESS: u8 = 0x00;
    pub(super) const INVALID_FIELD: u8 = 0x02;
    pub(super) const DATA_TRANSFER_ERROR: u8 = 0x04;
    pub(super) const ABORTED_POWER_LOSS: u8 = 0x05;
    pub(super) const INTERNAL_DEVICE_ERROR: u8 = 0x06;
    pub(super) const ABORTED_BY_REQUEST: u8 = 0x07;
    pub(super) const ABORTED_SQ_DELETION: u8 = 0x08;
    pub(super) const INVALID_NAMESPACE_OR_FORMAT: u8 = 0x0b;
    pub(super) const LBA_OUT_OF_RANGE: u8 = 0x80;
    pub(super) const CAPACITY_EXCEEDED: u8 = 0x81;
    pub(super) const NAMESPACE_NOT_READY: u8 = 0x82;
}

impl NvmeStatus {
    /// Decode the status half of a completion's dword 3 (`status_raw` in
    /// SPDK's `spdk_nvme_cpl`): bit 0 phase, bits 1-8 SC, 9-11 SCT, 12-13
    /// CRD, 14 More, 15 DNR.
    pub fn from_raw(raw: u16) -> NvmeStatus {
        NvmeStatus {
            sc: ((raw >> 1) & 0xff) as u8,
            sct: ((raw >> 9) & 0x7) as u8,
            dnr: raw & 0x8000 != 0,
        }
    }

    /// The command succeeded.
    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == sc::SUCCESS
    }

    /// What a failed command at `lba` means to weir:
    /// - out of range (generic LBA out of range, capacity exceeded):
    ///   `OutOfRange`, a caller's mistake the range check should have caught;
    /// - the queue or the device went away (aborted by SQ deletion or power
    ///   loss, a path error, namespace not ready, invalid namespace): `Gone`;
    /// - aborted by request (the driver's command timeout aborts this way):
    ///   `Timeout`;
    /// - invalid field, which SPDK also reports for memory it cannot map:
    ///   `Gone`, as the command would fail again;
    /// - anything else, media errors first among them: `Media` at `lba`, so
    ///   the node repairs the block from a replica.
    pub fn to_dev_error(self, lba: Lba) -> DevError {
        match (self.sct, self.sc) {
            (0, sc::LBA_OUT_OF_RANGE | sc::CAPACITY_EXCEEDED) => DevError::OutOfRange,
            (0, sc::ABORTED_SQ_DELETION | sc::ABORTED_POWER_LOSS) => DevError::Gone,
            (0, sc::NAMESPACE_NOT_READY | sc::INVALID_NAMESPACE_OR_FORMAT) => DevError::Gone,
            (0, sc::ABORTED_BY_REQUEST) => DevError::Timeout,
            // SPDK's own verdict on a command it could not map or send: it
            // would fail again, and it is not the media's fault.
            (0, sc::INVALID_FIELD) => DevError::Gone,
            (3, _) => DevError::Gone,
            _ => DevError::Media(lba),
        }
    }

    /// A short name for logs.
    pub fn describe(self) -> &'static str {
        match (self.sct, self.sc) {
            (0, sc::SUCCESS) => "success",
            (0, sc::INVALID_FIELD) => "invalid field",
            (0, sc::DATA_TRANSFER_ERROR) => "data transfer error",
            (0, sc::ABORTED_POWER_LOSS) => "aborted: power loss",
            (0, sc::INTERNAL_DEVICE_ERROR) => "internal device error",
            (0, sc::ABORTED_BY_REQUEST) => "aborted by request",
            (0, sc::ABORTED_SQ_DELETION) => "aborted: queue deleted",
            (0, sc::INVALID_NAMESPACE_OR_FORMAT) => "invalid namespace or format",
            (0, sc::LBA_OUT_OF_RANGE) => "LBA out of range",
            (0, sc::CAPACITY_EXCEEDED) => "capacity exceeded",
            (0, sc::NAMESPACE_NOT_READY) => "namespace not ready",
            (0, _) => "generic error",
            (1, _) => "command-specific error",
            (2, 0x80) => "write fault",
            (2, 0x81) => "unrecovered read error",
            (2, _) => "media or data integrity error",
            (3, _) => "path error",
            _ => "vendor-specific error",
        }
    }
}

impl std::fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NVMe status {:#x}/{:#04x} ({}{})",
            self.sct,
            self.sc,
            self.describe(),
            if self.dnr { ", do not retry" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(sct: u16, sc: u16, dnr: bool) -> u16 {
        (sc << 1) | (sct << 9) | (u16::from(dnr) << 15) | 1
    }

    #[test]
    fn the_status_word_decodes_as_the_specification_lays_it_out() {
        let s = NvmeStatus::from_raw(raw(2, 0x81, true));
        assert_eq!((s.sct, s.sc, s.dnr), (2, 0x81, true));
        assert!(!s.is_success());
        // The phase bit alone is success.
        assert!(NvmeStatus::from_raw(1).is_success());
        assert!(NvmeStatus::from_raw(0).is_success());
        assert_eq!(
            s.to_string(),
            "NVMe status 0x2/0x81 (unrecovered read error, do not retry)"
        );
    }

    #[test]
    fn each_status_maps_to_the_error_weir_acts_on() {
        let lba = Lba(42);
        let map = |sct, sc| NvmeStatus::from_raw(raw(sct, sc, false)).to_dev_error(lba);
        assert_eq!(map(2, 0x81), DevError::Media(lba), "unrecovered read");
        assert_eq!(map(2, 0x80), DevError::Media(lba), "write fault");
        assert_eq!(map(0, 0x04), DevError::Media(lba), "data transfer");
        assert_eq!(map(0, 0x06), DevError::Media(lba), "internal error");
        assert_eq!(map(0, 0x80), DevError::OutOfRange);
        assert_eq!(map(0, 0x81), DevError::OutOfRange);
        assert_eq!(map(0, 0x08), DevError::Gone, "queue deleted");
        assert_eq!(map(0, 0x05), DevError::Gone, "power loss");
        assert_eq!(map(0, 0x82), DevError::Gone, "namespace not ready");
        assert_eq!(map(3, 0x00), DevError::Gone, "path");
        assert_eq!(map(0, 0x07), DevError::Timeout, "aborted after a timeout");
        assert_eq!(
            map(0, 0x02),
            DevError::Gone,
            "invalid field: memory SPDK cannot map"
        );
        assert_eq!(map(1, 0x80), DevError::Media(lba), "command specific");
        assert_eq!(map(7, 0x01), DevError::Media(lba), "vendor");
    }
}
