//! NVMe completion status: status code type and status code, and how they
//! go into a completion's status field with the DNR bit and the Command
//! Retry Delay (NVMe Base 2.0, 4.6.1 "Status Field Definition").

/// A completion status: Status Code Type and Status Code. Two statuses are
/// the same when both are; whether a host may retry (DNR) follows from the
/// status itself ([`Status::is_retryable`]) and is set when encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code Type: 0 generic, 1 command specific, 2 media, 3 path, 7 vendor.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
}

const fn generic(sc: u8) -> Status {
    Status { sct: 0, sc }
}

const fn specific(sc: u8) -> Status {
    Status { sct: 1, sc }
}

const fn path(sc: u8) -> Status {
    Status { sct: SCT_PATH, sc }
}

/// Status Code Type of path related statuses (ANA and pathing errors).
const SCT_PATH: u8 = 3;

/// The DNR bit of a status field.
const DNR: u16 = 1 << 15;
/// Where the Command Retry Delay (CRD) sits in a status field.
const CRD_SHIFT: u16 = 12;

impl Status {
    pub const SUCCESS: Status = Status { sct: 0, sc: 0 };
    pub const INVALID_OPCODE: Status = generic(0x01);
    pub const INVALID_FIELD: Status = generic(0x02);
    pub const DATA_TRANSFER_ERROR: Status = generic(0x04);
    pub const INTERNAL_ERROR: Status = generic(0x06);
    pub const ABORTED_BY_REQUEST: Status = generic(0x07);
    pub const ABORTED_SQ_DELETION: Status = generic(0x08);
    /// Command Aborted due to Failed Fused Command (the other command of
    /// its fused operation failed).
    pub const ABORTED_FAILED_FUSED: Status = generic(0x09);
    /// Command Aborted due to Missing Fused Command.
    pub const ABORTED_MISSING_FUSED: Status = generic(0x0a);
    pub const INVALID_NAMESPACE: Status = generic(0x0b);
    pub const COMMAND_SEQUENCE_ERROR: Status = generic(0x0c);
    pub const SGL_DATA_LENGTH_INVALID: Status = generic(0x0f);
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = generic(0x11);
    pub const SGL_OFFSET_INVALID: Status = generic(0x16);
    /// Host Identifier Inconsistent Format: a Reservation Report without
    /// the extended data structure from a host with 128-bit identifiers.
    pub const HOST_ID_INCONSISTENT: Status = generic(0x18);
    /// Command Aborted due to Preempt and Abort.
    pub const ABORTED_PREEMPT: Status = generic(0x1b);
    pub const NAMESPACE_WRITE_PROTECTED: Status = generic(0x20);
    pub const COMMAND_INTERRUPTED: Status = generic(0x21);
    pub const TRANSIENT_TRANSPORT_ERROR: Status = generic(0x22);
    pub const LBA_OUT_OF_RANGE: Status = generic(0x80);
    pub const NAMESPACE_NOT_READY: Status = generic(0x82);
    pub const RESERVATION_CONFLICT: Status = generic(0x83);
    /// Compare Failure (Media and Data Integrity Errors, NVM Command Set
    /// 2.1, Figure 31).
    pub const COMPARE_FAILURE: Status = Status { sct: 2, sc: 0x85 };
    pub const INVALID_QUEUE_ID: Status = specific(0x01);
    pub const INVALID_QUEUE_SIZE: Status = specific(0x02);
    pub const ASYNC_EVENT_LIMIT: Status = specific(0x05);
    pub const INVALID_LOG_PAGE: Status = specific(0x09);
    pub const FEATURE_NOT_SAVEABLE: Status = specific(0x0d);
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = specific(0x80);
    pub const CONTROLLER_BUSY: Status = specific(0x81);
    pub const CONNECT_INVALID_PARAMETERS: Status = specific(0x82);
    pub const CONNECT_INVALID_HOST: Status = specific(0x84);
    pub const INVALID_QUEUE_TYPE: Status = specific(0x85);
    pub const AUTH_REQUIRED: Status = specific(0x91);
    /// The namespace's ANA group is in Persistent Loss on this path (NVMe
    /// Base 2.1, Figure 105).
    pub const ANA_PERSISTENT_LOSS: Status = path(0x01);
    /// The namespace's ANA group is Inaccessible on this path.
    pub const ANA_INACCESSIBLE: Status = path(0x02);
    /// The namespace's ANA group is changing state on this path.
    pub const ANA_TRANSITION: Status = path(0x03);

    /// Decodes a CQE status field (bit 0 is the phase tag and is ignored;
    /// DNR and CRD are read with [`dnr_of`] and [`crd_of`]).
    pub fn from_field(f: u16) -> Self {
        Status {
            sc: (f >> 1) as u8,
            sct: ((f >> 9) & 7) as u8,
        }
    }

    /// Encodes as a CQE status field with phase 0: DNR set unless the
    /// status may be retried, and `crd` (0 to 3) as the Command Retry Delay
    /// of a retryable status.
    pub fn to_field(self, crd: u8) -> u16 {
        let mut f = ((self.sc as u16) << 1) | ((self.sct as u16 & 7) << 9);
        if self.is_retryable() {
            f |= ((crd & 3) as u16) << CRD_SHIFT;
        } else if !self.is_success() {
            f |= DNR;
        }
        f
    }

    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// Whether the same command may succeed if the host submits it again
    /// (DNR clear): a transport hiccup, a namespace or controller that is
    /// busy for now, an interrupted command, and the path related statuses.
    pub fn is_retryable(self) -> bool {
        self == Status::TRANSIENT_TRANSPORT_ERROR
            || self == Status::NAMESPACE_NOT_READY
            || self == Status::COMMAND_INTERRUPTED
            || self == Status::CONTROLLER_BUSY
            || self.sct == SCT_PATH
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
            (0, 0x21) => "Command Interrupted",
            (0, 0x22) => "Transient Transport Error",
            (0, 0x80) => "LBA Out of Range",
            (0, 0x82) => "Namespace Not Ready",
            (1, 0x01) => "Invalid Queue Identifier",
            (1, 0x02) => "Invalid Queue Size",
            (1, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (1, 0x09) => "Invalid Log Page",
            (1, 0x0d) => "Feature Identifier Not Saveable",
            (1, 0x80) => "Connect Incompatible Format",
            (1, 0x81) => "Controller Busy",
            (1, 0x82) => "Connect Invalid Parameters",
            (1, 0x84) => "Connect Invalid Host",
            (1, 0x85) => "Invalid Queue Type",
            (1, 0x91) => "Authentication Required",
            (3, 0x01) => "Asymmetric Access Persistent Loss",
            (3, 0x02) => "Asymmetric Access Inaccessible",
            (3, 0x03) => "Asymmetric Access Transition",
            _ => "Unknown Status",
        }
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (sct {:#x}, sc {:#04x})",
            self.name(),
            self.sct,
            self.sc
        )
    }
}

/// Whether a status field has Do Not Retry set.
pub fn dnr_of(field: u16) -> bool {
    field & DNR != 0
}

/// The Command Retry Delay of a status field: 0, or which CRDT (1 to 3)
/// the host waits before retrying.
pub fn crd_of(field: u16) -> u8 {
    ((field >> CRD_SHIFT) & 3) as u8
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
        // NVMe Base 2.0, 4.6.1: P bit 0, SC bits 8:1, SCT 11:9, CRD 13:12, DNR 15.
        // Connect Invalid Host: SCT 1, SC 0x84, DNR set, no CRD even if asked.
        let f = Status::CONNECT_INVALID_HOST.to_field(2);
        assert_eq!(f, 0x8000 | (1 << 9) | (0x84 << 1));
        assert_eq!(Status::from_field(f | 1), Status::CONNECT_INVALID_HOST);
        assert!(dnr_of(f));
        assert!(Status::from_field(0x0001).is_success());
        assert_eq!(Status::SUCCESS.to_field(1), 0);
    }

    #[test]
    fn retryable_statuses_clear_dnr_and_carry_crd() {
        for s in [
            Status::TRANSIENT_TRANSPORT_ERROR,
            Status::NAMESPACE_NOT_READY,
            Status::CONTROLLER_BUSY,
            Status::ANA_PERSISTENT_LOSS,
            Status::ANA_INACCESSIBLE,
            Status::ANA_TRANSITION,
        ] {
            let f = s.to_field(0);
            assert!(!dnr_of(f), "{s} must leave DNR clear");
            assert_eq!(crd_of(f), 0);
            assert_eq!(crd_of(s.to_field(3)), 3);
            assert_eq!(Status::from_field(s.to_field(1)), s);
        }
        for s in [
            Status::INVALID_FIELD,
            Status::LBA_OUT_OF_RANGE,
            Status::INTERNAL_ERROR,
        ] {
            assert!(dnr_of(s.to_field(0)), "{s} sets DNR");
        }
    }
}
