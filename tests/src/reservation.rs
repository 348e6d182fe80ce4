//! Reservations (NVMe Base 2.1, 8.1.22, with the commands of 7.5 to 7.8)
//! as a host sends and reads them, encoded and parsed here from the
//! specification, not with the target's code: distinct hosts (each its own
//! host NQN and 128-bit host identifier), the four reservation commands,
//! the Reservation Status data structure, and the Reservation Notification
//! log page (80h) with its asynchronous event.

use crate::check::{assert_status, assert_zero, OrPanic};
use crate::client::{quiet, Completion, Controller, Opts, Queue};
use crate::names::{HOST_A, HOST_B};
use crate::Target;
use rdmablk_common::bytes::{get_u16, get_u32, get_u64};
use rdmablk_common::nvme::log::lid;
use rdmablk_common::nvme::{dnr_of, nvm, Sqe, Status};

/// The namespace the reservation commands here address.
pub const NSID: u32 = 1;

/// A host: its NQN and its Host Identifier (Connect data HOSTID).
pub struct Host {
    pub name: &'static str,
    pub nqn: &'static str,
    pub id: [u8; 16],
}

/// Host A, with [`HOST_A`]'s NQN.
pub const A: Host = Host {
    name: "A",
    nqn: HOST_A,
    id: 0x6c3e2f0a_2b1d_4c5e_9f8a_1a2b3c4d5e6f_u128.to_be_bytes(),
};
/// Host B, with [`HOST_B`]'s NQN.
pub const B: Host = Host {
    name: "B",
    nqn: HOST_B,
    id: 0x0f9e8d7c_6b5a_4c3d_8e2f_1a0b9c8d7e6f_u128.to_be_bytes(),
};
/// Host C, a third host.
pub const C: Host = Host {
    name: "C",
    nqn: "nqn.2014-08.org.nvmexpress:uuid:3b7d9e1f-5a2c-4e6b-8d0f-2c4e6a8b0d1f",
    id: 0x3b7d9e1f_5a2c_4e6b_8d0f_2c4e6a8b0d1f_u128.to_be_bytes(),
};

/// A controller of `nqn` for `h` at `t`, one I/O queue, no Keep Alive.
pub fn open_nqn(t: &Target, nqn: &str, h: &Host) -> Controller {
    let opts = Opts {
        hostid: h.id,
        ..quiet()
    };
    Controller::open(t.addr(), nqn, h.nqn, &opts)
        .or_panic(format_args!("opening {nqn} as host {}", h.name))
}

// ---- commands ----------------------------------------------------------------

/// Reservation Register Action (CDW10 bits 2:0), Ignore Existing Key (bit
/// 3) and Change Persist Through Power Loss State (bits 31:30): NVMe Base
/// 2.1, 7.6. Register Action: Register Reservation Key.
pub const REGISTER: u32 = 0;
/// Register Action: Unregister Reservation Key.
pub const UNREGISTER: u32 = 1;
/// Register Action: Replace Reservation Key.
pub const REPLACE: u32 = 2;
/// Ignore Existing Key.
pub const IEKEY: u32 = 1 << 3;
/// CPTPL 01b (reserved).
pub const CPTPL_INVALID: u32 = 0b01 << 30;
/// CPTPL 10b: clear PTPL.
pub const CPTPL_CLEAR: u32 = 0b10 << 30;
/// CPTPL 11b: set PTPL.
pub const CPTPL_SET: u32 = 0b11 << 30;
/// Reservation Acquire Action (7.5) and Reservation Release Action (7.7).
/// Acquire Action: Acquire.
pub const ACQUIRE: u32 = 0;
/// Acquire Action: Preempt.
pub const PREEMPT: u32 = 1;
/// Acquire Action: Preempt and Abort.
pub const PREEMPT_AND_ABORT: u32 = 2;
/// Release Action: Release.
pub const RELEASE: u32 = 0;
/// Release Action: Clear.
pub const CLEAR: u32 = 1;

/// RTYPE in CDW10 bits 15:8 of Acquire and Release.
pub fn rt(rtype: u8) -> u32 {
    (rtype as u32) << 8
}

/// Completion dword 0 of the Asynchronous Event Request (NVMe Base 2.1,
/// 5.1.2) for a notice: type I/O Command Specific Status (6h), information
/// Reservation Log Page Available (00h), log page 80h.
pub const RESV_NOTICE_AER: u32 = 0x0080_0006;

/// Reservation Notification Log Page types (NVMe Base 2.1, 5.1.12, the
/// Reservation Notification log page): Registration Preempted.
pub const REGISTRATION_PREEMPTED: u8 = 1;
/// Log page type Reservation Released.
pub const RESERVATION_RELEASED: u8 = 2;
/// Log page type Reservation Preempted.
pub const RESERVATION_PREEMPTED: u8 = 3;

/// A reservation command on namespace `nsid` with `cdw10` and `keys` (each
/// 8 bytes little endian) as its data; the caller checks the status.
pub fn resv(q: &mut Queue, opcode: u8, nsid: u32, cdw10: u32, keys: &[u64]) -> Completion {
    let mut sqe = Sqe::new(opcode, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, cdw10);
    let data: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
    q.exec(sqe, Some(&data), 0)
        .or_panic(format_args!("reservation command {opcode:#04x}"))
}

/// Reservation Register: data CRKEY, NRKEY.
pub fn reg(q: &mut Queue, cdw10: u32, crkey: u64, nrkey: u64) -> Completion {
    resv(q, nvm::RESV_REGISTER, NSID, cdw10, &[crkey, nrkey])
}

/// Reservation Acquire: data CRKEY, PRKEY.
pub fn acq(q: &mut Queue, cdw10: u32, crkey: u64, prkey: u64) -> Completion {
    resv(q, nvm::RESV_ACQUIRE, NSID, cdw10, &[crkey, prkey])
}

/// Reservation Release: data CRKEY.
pub fn rel(q: &mut Queue, cdw10: u32, crkey: u64) -> Completion {
    resv(q, nvm::RESV_RELEASE, NSID, cdw10, &[crkey])
}

/// Reservation Report of `len` bytes (NUMD = len/4 - 1), with the
/// Extended Data Structure when `eds`; the caller checks the status.
pub fn report_raw(q: &mut Queue, nsid: u32, len: u32, eds: bool) -> Completion {
    let mut sqe = Sqe::new(nvm::RESV_REPORT, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, len / 4 - 1);
    sqe.set_cdw(11, eds as u32);
    q.exec(sqe, None, len).or_panic("Reservation Report")
}

/// The Reservation Status Extended Data Structure of namespace `nsid`.
pub fn report_ns(q: &mut Queue, nsid: u32) -> Report {
    let done = report_raw(q, nsid, 4096, true);
    assert_status(&done, Status::SUCCESS, "Reservation Report (EDS)");
    parse_report(&done.data)
}

/// The Reservation Status Extended Data Structure of namespace [`NSID`].
pub fn report(q: &mut Queue) -> Report {
    report_ns(q, NSID)
}

/// Asserts the status of `c`; a Reservation Conflict must have DNR set
/// (NVMe Base 2.1, 8.1.22).
#[track_caller]
pub fn want(c: Completion, status: Status, what: &str) {
    assert_status(&c, status, what);
    if status == Status::RESERVATION_CONFLICT {
        assert!(
            dnr_of(c.cqe.status),
            "{what}: Reservation Conflict without DNR (status field {:#06x})",
            c.cqe.status
        );
    }
}

/// Asserts `c` succeeded.
#[track_caller]
pub fn ok(c: Completion, what: &str) {
    want(c, Status::SUCCESS, what);
}

/// Asserts `c` is a Reservation Conflict, with DNR set.
#[track_caller]
pub fn conflict(c: Completion, what: &str) {
    want(c, Status::RESERVATION_CONFLICT, what);
}

// ---- data structures -----------------------------------------------------------

/// A Reservation Status Extended Data Structure (NVMe Base 2.1, 7.8,
/// Reservation Report): header of 64 bytes (GEN at 0, RTYPE 4, REGCTL 5-6, PTPLS 9), then
/// a Registered Controller Extended Data Structure of 64 bytes each (CNTLID
/// 0-1, RCSTS 2, RKEY 8-15, HOSTID 16-31).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub gen: u32,
    pub rtype: u8,
    /// Number of registrants (REGCTL), listed or not.
    pub regctl: u16,
    pub ptpls: u8,
    /// Those the buffer holds, sorted by host identifier (the order is not
    /// specified).
    pub registrants: Vec<Registrant>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Registrant {
    pub hostid: [u8; 16],
    pub rkey: u64,
    /// RCSTS bit 0: holds the reservation.
    pub holds: bool,
    pub cntlid: u16,
}

/// A registrant as the target must report it: the host (CNTLID FFFFh, as
/// its controllers share the registration).
pub fn r(h: &Host, rkey: u64, holds: bool) -> Registrant {
    Registrant {
        hostid: h.id,
        rkey,
        holds,
        cntlid: 0xffff,
    }
}

/// `v`, sorted as [`Report::registrants`] are.
pub fn sorted(mut v: Vec<Registrant>) -> Vec<Registrant> {
    v.sort();
    v
}

/// Parses a report; reserved bytes, the rest of RCSTS, and whatever the
/// buffer holds past the last registrant must be zero.
pub fn parse_report(b: &[u8]) -> Report {
    assert!(b.len() >= 64, "a report of {} bytes", b.len());
    assert_zero(&b[7..9], "Reservation Status bytes 7-8 (reserved)");
    assert_zero(&b[10..64], "Reservation Status bytes 10-63 (reserved)");
    assert_eq!(b[9] & !1, 0, "PTPLS bits 7:1 (reserved)");
    let regctl = get_u16(b, 5);
    let listed = (regctl as usize).min((b.len() - 64) / 64);
    let mut registrants = Vec::new();
    for i in 0..listed {
        let e = &b[64 + i * 64..][..64];
        assert_eq!(e[2] & !1, 0, "registrant {i}: RCSTS bits 7:1 (reserved)");
        assert_zero(&e[3..8], &format!("registrant {i}: bytes 3-7 (reserved)"));
        assert_zero(
            &e[32..64],
            &format!("registrant {i}: bytes 32-63 (reserved)"),
        );
        registrants.push(Registrant {
            hostid: e[16..32].try_into().expect("16 bytes"),
            rkey: get_u64(e, 8),
            holds: e[2] & 1 != 0,
            cntlid: get_u16(e, 0),
        });
    }
    assert_zero(
        &b[64 + listed * 64..],
        "the report past its last registrant",
    );
    registrants.sort();
    Report {
        gen: get_u32(b, 0),
        rtype: b[4],
        regctl,
        ptpls: b[9],
        registrants,
    }
}

/// A Reservation Notification log page (NVMe Base 2.1, 5.1.12): Log
/// Page Count (0-7), type (8), Number of Available Log Pages (9), NSID
/// (12-15), the rest reserved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Notice {
    pub count: u64,
    pub kind: u8,
    pub available: u8,
    pub nsid: u32,
}

/// Reads log page 80h (RAE clear): the oldest notice of the controller.
pub fn notice(c: &Controller) -> Notice {
    let page = c
        .admin()
        .get_log(lid::RESERVATION, 64, 0)
        .or_panic("Get Log Page 80h");
    assert_eq!(page.len(), 64);
    assert_zero(&page[10..12], "log 80h bytes 10-11 (reserved)");
    assert_zero(&page[16..64], "log 80h bytes 16-63 (reserved)");
    Notice {
        count: get_u64(&page, 0),
        kind: page[8],
        available: page[9],
        nsid: get_u32(&page, 12),
    }
}

/// Waits for AER `aer` of `c` and asserts it completed saying Reservation
/// Log Page Available (log 80h).
#[track_caller]
pub fn aer_says_log_80h(c: &Controller, aer: u16, what: &str) {
    let done = c
        .admin()
        .wait(aer)
        .or_panic(format_args!("the AER ({what})"));
    assert_status(&done, Status::SUCCESS, what);
    assert_eq!(
        done.cqe.dw0, RESV_NOTICE_AER,
        "{what}: AER dword 0 {:#010x}, want Reservation Log Page Available {RESV_NOTICE_AER:#010x}",
        done.cqe.dw0
    );
}
