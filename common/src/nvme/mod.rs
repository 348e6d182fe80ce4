//! NVMe submission/completion queue entries, opcodes, status codes, SGL
//! descriptors, Identify structures, log pages and features (NVMe Base 2.0).

pub mod ana;
pub mod identify;
mod io_cmd;
pub mod log;
pub mod resv;
mod sgl;
mod sqe;
mod status;

pub use io_cmd::{DsmCmd, DsmRange, ReadWriteCmd, DSM_RANGE_LEN};
pub use sgl::{Sgl, SglError};
pub use sqe::{Cqe, Sqe, CQE_LEN, PSDT_SGL, SQE_LEN};
pub use status::{crd_of, dnr_of, Status};

/// Admin command opcodes.
pub mod admin {
    pub const DELETE_SQ: u8 = 0x00;
    pub const CREATE_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_CQ: u8 = 0x04;
    pub const CREATE_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set I/O opcodes.
pub mod nvm {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
    pub const RESV_REGISTER: u8 = 0x0d;
    pub const RESV_REPORT: u8 = 0x0e;
    pub const RESV_ACQUIRE: u8 = 0x11;
    pub const RESV_RELEASE: u8 = 0x15;
}

/// Fused Operation values (CDW0 bits 9:8, NVMe Base 2.1, Figure 91).
pub mod fuse {
    /// First command of a fused operation (Compare of Compare and Write).
    pub const FIRST: u8 = 0b01;
    /// Second command of a fused operation (its Write).
    pub const SECOND: u8 = 0b10;
}

/// The opcode shared by all Fabrics commands; the command type is in byte 4.
pub const FABRICS_OPCODE: u8 = 0x7f;

/// Which way a command moves data, from the low two bits of its opcode
/// (or of the Fabrics command type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDirection {
    None,
    /// Host to controller (writes, Connect).
    ToController,
    /// Controller to host (reads, Identify).
    ToHost,
    Bidirectional,
}

impl DataDirection {
    /// Direction encoded in bits 1:0 of an opcode or Fabrics command type.
    pub fn from_code(code: u8) -> Self {
        match code & 3 {
            0 => DataDirection::None,
            1 => DataDirection::ToController,
            2 => DataDirection::ToHost,
            _ => DataDirection::Bidirectional,
        }
    }
}

/// Feature identifiers for Get/Set Features.
pub mod feature {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MGMT: u8 = 0x02;
    pub const TEMP_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WC: u8 = 0x06;
    pub const NUM_QUEUES: u8 = 0x07;
    pub const IRQ_COALESCE: u8 = 0x08;
    pub const WRITE_ATOMIC: u8 = 0x0a;
    pub const ASYNC_EVENT: u8 = 0x0b;
    pub const KEEP_ALIVE: u8 = 0x0f;
    pub const HOST_BEHAVIOR: u8 = 0x16;
    pub const HOST_ID: u8 = 0x81;
    /// Reservation Notification Mask (namespace specific).
    pub const RESV_MASK: u8 = 0x82;
    /// Reservation Persistence: PTPL (namespace specific).
    pub const RESV_PERSIST: u8 = 0x83;
}

/// Size of the Host Behavior Support feature's data (Set and Get Features).
pub const HOST_BEHAVIOR_LEN: usize = 512;

/// Controller property offsets (Property Get/Set over Fabrics).
pub mod property {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1c;
    /// NVM Subsystem Reset (4 bytes).
    pub const NSSR: u32 = 0x20;
    /// Controller Ready Timeouts (4 bytes, NVMe 2.0).
    pub const CRTO: u32 = 0x68;

    pub const CC_EN: u32 = 1;
    pub const CC_SHN_SHIFT: u32 = 14;
    pub const CC_SHN_MASK: u32 = 3 << CC_SHN_SHIFT;
    pub const CSTS_RDY: u32 = 1;
    pub const CSTS_CFS: u32 = 1 << 1;
    pub const CSTS_SHST_SHIFT: u32 = 2;
    pub const CSTS_SHST_COMPLETE: u32 = 2 << CSTS_SHST_SHIFT;
}
