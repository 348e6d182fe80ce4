//! Planning: the capsule rules and the decoding of I/O commands.

use super::*;
use crate::config::Limits;
use crate::testing::*;
use rdmablk_common::nvme::{admin, feature, nvm, Sgl};

/// The status `plan` answers a command with at once, or its data length.
fn planned(assoc: Option<&Association>, mut sqe: Sqe, sgl_len: u32) -> Result<usize, Status> {
    sqe.set_sgl(&Sgl::Transport { len: sgl_len });
    plan(assoc, &sqe, sgl_len, 0).map(|c| c.len)
}

/// NVMe Base 2.1, Figure 91 (CDW0) and nvmet_req_init: fabrics commands
/// use SGLs (PSDT 01b) and nothing is fused.
#[test]
fn psdt_and_fuse_are_checked_first() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 1);
    let mut sqe = Sqe::new(admin::KEEP_ALIVE, 1);
    sqe.set_sgl(&Sgl::Transport { len: 0 });
    assert!(plan(Some(&a), &sqe, 0, 0).is_ok());
    for flags in [0x00, 0x80, 0xc0, 0x41, 0x42] {
        sqe.set_flags(flags);
        assert_eq!(
            plan(Some(&a), &sqe, 0, 0).err(),
            Some(Status::INVALID_FIELD),
            "flags {flags:#04x}"
        );
    }
}

/// NVMe Base 2.1, 4.3.2 and Figure 102 (0Fh): the SGL describes exactly
/// what the command transfers; Set Features (like Dataset Management)
/// may describe more, as nvmet allows. Unknown opcodes are Invalid
/// Opcode before any length rule.
#[test]
fn admin_transfer_lengths() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 1);
    let mut identify = Sqe::new(admin::IDENTIFY, 2);
    identify.set_cdw(10, 1);
    assert_eq!(planned(Some(&a), identify, 4096), Ok(4096));
    for len in [0, 2048, 8192] {
        assert_eq!(
            planned(Some(&a), identify, len),
            Err(Status::SGL_DATA_LENGTH_INVALID),
            "Identify with {len} bytes"
        );
    }
    let mut set = Sqe::new(admin::SET_FEATURES, 3);
    set.set_cdw(10, feature::NUM_QUEUES as u32);
    assert_eq!(planned(Some(&a), set, 4096), Ok(4096), "longer SGL allowed");
    set.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    assert_eq!(
        planned(Some(&a), set, 256),
        Err(Status::SGL_DATA_LENGTH_INVALID),
        "Host Behavior Support needs 512 bytes"
    );
    let mut get = Sqe::new(admin::GET_FEATURES, 4);
    get.set_cdw(10, feature::HOST_ID as u32);
    assert_eq!(planned(Some(&a), get, 16), Ok(16));
    get.set_cdw(10, feature::KEEP_ALIVE as u32);
    assert_eq!(
        planned(Some(&a), get, 16),
        Err(Status::SGL_DATA_LENGTH_INVALID)
    );
    assert_eq!(
        planned(Some(&a), Sqe::new(0x7e, 5), 4096),
        Err(Status::INVALID_OPCODE)
    );
    assert_eq!(
        planned(None, identify, 4096),
        Err(Status::COMMAND_SEQUENCE_ERROR),
        "before Connect"
    );
}

/// I/O command decoding: the opcode first (Keep Alive on an I/O queue is
/// an Invalid Opcode whatever its NSID), then the namespace, the range
/// and the SGL.
#[test]
fn io_command_rules() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 1);
    let q = io_connect(&reg, &a, 1).expect("I/O queue");
    let io = |opcode: u8, nsid: u32, slba: u64, nlb: u32| {
        let mut sqe = Sqe::new(opcode, 6);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, slba as u32);
        sqe.set_cdw(11, (slba >> 32) as u32);
        sqe.set_cdw(12, nlb - 1);
        sqe
    };
    let blocks = 16 << 20 >> 9;
    assert_eq!(planned(Some(&q), io(nvm::READ, 1, 0, 8), 4096), Ok(4096));
    assert_eq!(
        planned(Some(&q), io(nvm::READ, 1, 0, 8), 2048),
        Err(Status::SGL_DATA_LENGTH_INVALID)
    );
    assert_eq!(
        planned(Some(&q), io(nvm::WRITE, 1, blocks - 4, 8), 4096),
        Err(Status::LBA_OUT_OF_RANGE)
    );
    assert_eq!(
        planned(Some(&q), io(nvm::READ, 99, 0, 8), 4096),
        Err(Status::INVALID_NAMESPACE)
    );
    for nsid in [0, 1, 99] {
        assert_eq!(
            planned(Some(&q), io(admin::KEEP_ALIVE, nsid, 0, 1), 0),
            Err(Status::INVALID_OPCODE),
            "Keep Alive on an I/O queue, nsid {nsid}"
        );
    }
    assert_eq!(
        planned(Some(&q), io(nvm::FLUSH, 1, 0, 1), 512),
        Err(Status::SGL_DATA_LENGTH_INVALID),
        "Flush carries no data"
    );
    let mut dsm = io(nvm::DSM, 1, 0, 1);
    dsm.set_cdw(10, 0); // one range
    dsm.set_cdw(11, 1 << 2);
    assert_eq!(planned(Some(&q), dsm, 4096), Ok(16), "a page for one range");
}
