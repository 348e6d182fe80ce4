//! NVMe completion status: status code type, status code and the DNR bit.

/// A completion status (SCT, SC, DNR), without the phase bit.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code Type: 0 generic, 1 command specific, 2 media, 7 vendor.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: bool,
}

const fn generic(sc: u8) -> Status {
    Status {
        sct: 0,
        sc,
        dnr: true,
    }
}

const fn specific(sc: u8) -> Status {
    Status {
        sct: 1,
        sc,
        dnr: true,
    }
}

impl Status {
    pub const SUCCESS: Status = Status {
        sct: 0,
        sc: 0,
        dnr: false,
    };
    pub const INVALID_OPCODE: Status = generic(0x01);
    pub const INVALID_FIELD: Status = generic(0x02);
    pub const DATA_TRANSFER_ERROR: Status = generic(0x04);
    pub const INTERNAL_ERROR: Status = generic(0x06);
    pub const ABORTED_BY_REQUEST: Status = generic(0x07);
    pub const ABORTED_SQ_DELETION: Status = generic(0x08);
    pub const INVALID_NAMESPACE: Status = generic(0x0b);
    pub const COMMAND_SEQUENCE_ERROR: Status = generic(0x0c);
    pub const SGL_DATA_LENGTH_INVALID: Status = generic(0x0f);
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = generic(0x11);
    pub const SGL_OFFSET_INVALID: Status = generic(0x16);
    pub const NAMESPACE_WRITE_PROTECTED: Status = generic(0x20);
    pub const TRANSIENT_TRANSPORT_ERROR: Status = generic(0x22);
    pub const LBA_OUT_OF_RANGE: Status = generic(0x80);
    pub const INVALID_QUEUE_ID: Status = specific(0x01);
    pub const INVALID_QUEUE_SIZE: Status = specific(0x02);
    pub const ASYNC_EVENT_LIMIT: Status = specific(0x05);
    pub const INVALID_LOG_PAGE: Status = specific(0x09);
    pub const FEATURE_NOT_SAVEABLE: Status = specific(0x0d);
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = specific(0x80);
    pub const CONTROLLER_BUSY: Status = specific(0x81);
    pub const CONNECT_INVALID_PARAMETERS: Status = specific(0x82);
    pub const CONNECT_INVALID_HOST: Status = specific(0x84);

    /// Decodes a CQE status field (bit 0 is the phase tag and is ignored).
    pub fn from_field(f: u16) -> Self {
        Status {
            sc: (f >> 1) as u8,
            sct: ((f >> 9) & 7) as u8,
            dnr: f & 0x8000 != 0,
        }
    }

    /// Encodes as a CQE status field with phase 0.
    pub fn to_field(self) -> u16 {
        ((self.sc as u16) << 1) | ((self.sct as u16 & 7) << 9) | if self.dnr { 0x8000 } else { 0 }
    }

    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// A short human name for logs.
    pub fn name(self) -> &'static str {
        let key = (self.sct, self.sc);
        match key {
            (0, 0x00) => "Success",
            (0, 0x01) => "Invalid Command Opcode",
            (0, 0x02) => "Invalid Field in Command",
            (0, 0x04) => "Data Transfer Error",
            (0, 0x06) => "Internal Error",
            (0, 0x07) => "Command Abort Requested",
            (0, 0x08) => "Command Aborted due to SQ Deletion",
            (0, 0x0b) => "Invalid Namespace or Format",
            (0, 0x0c) => "Command Sequence Error",
            (0, 0x0f) => "Data SGL Length Invalid",
            (0, 0x11) => "SGL Descriptor Type Invalid",
            (0, 0x16) => "SGL Offset Invalid",
            (0, 0x20) => "Namespace is Write Protected",
            (0, 0x22) => "Transient Transport Error",
            (0, 0x80) => "LBA Out of Range",
            (1, 0x01) => "Invalid Queue Identifier",
            (1, 0x02) => "Invalid Queue Size",
            (1, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (1, 0x09) => "Invalid Log Page",
            (1, 0x0d) => "Feature Identifier Not Saveable",
            (1, 0x80) => "Connect Incompatible Format",
            (1, 0x81) => "Controller Busy",
            (1, 0x82) => "Connect Invalid Parameters",
            (1, 0x84) => "Connect Invalid Host",
            _ => "Unknown Status",
        }
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (sct {:#x}, sc {:#04x}{})",
            self.name(),
            self.sct,
            self.sc,
            if self.dnr { ", dnr" } else { "" }
        )
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_field_layout_matches_spec() {
        // Connect Invalid Host: SCT 1, SC 0x84, DNR set.
        let f = Status::CONNECT_INVALID_HOST.to_field();
        assert_eq!(f, 0x8000 | (1 << 9) | (0x84 << 1));
        assert_eq!(Status::from_field(f | 1), Status::CONNECT_INVALID_HOST);
        assert!(Status::from_field(0x0001).is_success());
    }
}
