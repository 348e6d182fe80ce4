//! The data each admin and Fabrics command calls for, from its fields alone:
//! what its SGL must describe before the controller executes it.

use super::features::HOST_ID_LEN;
use rdmablk_common::fabrics::{fctype, CONNECT_DATA_LEN};
use rdmablk_common::nvme::identify::IDENTIFY_LEN;
use rdmablk_common::nvme::log::LogRequest;
use rdmablk_common::nvme::HOST_BEHAVIOR_LEN;
use rdmablk_common::nvme::{admin, feature, Sqe};

/// The data a command's fields call for: what its SGL must describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferLen {
    /// Exactly this many bytes (nvmet_check_transfer_len).
    Exact(usize),
    /// This many bytes; the SGL may describe more (nvmet_check_data_len_lte).
    AtLeast(usize),
}

/// The data length an admin command's fields call for; `None` for opcodes
/// that are answered Invalid Opcode anyway.
pub fn admin_transfer_len(sqe: &Sqe) -> Option<TransferLen> {
    let fid = sqe.cdw(10) as u8;
    Some(match sqe.opcode() {
        admin::IDENTIFY => TransferLen::Exact(IDENTIFY_LEN),
        admin::GET_LOG_PAGE => TransferLen::Exact(LogRequest::from_sqe(sqe).len),
        admin::SET_FEATURES if fid == feature::HOST_BEHAVIOR => {
            TransferLen::AtLeast(HOST_BEHAVIOR_LEN)
        }
        admin::SET_FEATURES => TransferLen::AtLeast(0),
        admin::GET_FEATURES if fid == feature::HOST_BEHAVIOR => {
            TransferLen::Exact(HOST_BEHAVIOR_LEN)
        }
        admin::GET_FEATURES if fid == feature::HOST_ID => TransferLen::Exact(HOST_ID_LEN),
        admin::GET_FEATURES => TransferLen::Exact(0),
        admin::KEEP_ALIVE | admin::ASYNC_EVENT | admin::ABORT => TransferLen::Exact(0),
        _ => return None,
    })
}

/// The data length a Fabrics command calls for; `None` for command types
/// that are answered Invalid Opcode anyway.
pub fn fabrics_transfer_len(sqe: &Sqe) -> Option<TransferLen> {
    match sqe.fctype() {
        fctype::CONNECT => Some(TransferLen::Exact(CONNECT_DATA_LEN)),
        // TL and AL: the message's length, either way.
        fctype::AUTH_SEND | fctype::AUTH_RECV => Some(TransferLen::Exact(sqe.cdw(11) as usize)),
        fctype::PROPERTY_GET | fctype::PROPERTY_SET | fctype::DISCONNECT => {
            Some(TransferLen::Exact(0))
        }
        _ => None,
    }
}
