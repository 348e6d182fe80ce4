//! Reservations (NVMe Base 2.1, 8.1.22, with the commands of 7.5 to 7.8:
//! Reservation Acquire, Register, Release and Report) against a running
//! daemon: what each reservation type lets the holder, the other registrants
//! and everyone else do (Figure "Command Behavior in the Presence of a
//! Reservation"), the key rules of Register, Acquire and Release, the
//! Reservation Status data structure, the Reservation Notification log page
//! (80h) and its asynchronous event, Preempt and Abort of a write whose data
//! has not arrived yet, and Persist Through Power Loss across a `kill -9`.
//!
//! The hosts are distinct: each its own host NQN and 128-bit host identifier
//! (what a registration belongs to: every controller of a host shares it).
//! The command fields and data structures are encoded and parsed here from
//! the specification, not with the target's code; every daemon keeps its
//! PTPL state files in a temporary directory.

use super::reload::{quiet, submit_aer};
use rdmablk_common::nvme::identify::cns;
use rdmablk_common::nvme::log::lid;
use rdmablk_common::nvme::{dnr_of, feature, nvm, Sqe, Status};
use rdmablk_tests::check::{assert_same, assert_status, assert_zero, OrPanic};
use rdmablk_tests::client::{Completion, Controller, Opts, Queue};
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A, HOST_B, OPEN_NQN};
use rdmablk_tests::{Rng, Target, TempDir};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NSID: u32 = 1;
const BS: u32 = 512;

// ---- hosts -------------------------------------------------------------------

/// A host: its NQN and its Host Identifier (Connect data HOSTID).
pub(crate) struct Host {
    pub(crate) name: &'static str,
    pub(crate) nqn: &'static str,
    pub(crate) id: [u8; 16],
}

pub(crate) const A: Host = Host {
    name: "A",
    nqn: HOST_A,
    id: 0x6c3e2f0a_2b1d_4c5e_9f8a_1a2b3c4d5e6f_u128.to_be_bytes(),
};
pub(crate) const B: Host = Host {
    name: "B",
    nqn: HOST_B,
    id: 0x0f9e8d7c_6b5a_4c3d_8e2f_1a0b9c8d7e6f_u128.to_be_bytes(),
};
const C: Host = Host {
    name: "C",
    nqn: "nqn.2014-08.org.nvmexpress:uuid:3b7d9e1f-5a2c-4e6b-8d0f-2c4e6a8b0d1f",
    id: 0x3b7d9e1f_5a2c_4e6b_8d0f_2c4e6a8b0d1f_u128.to_be_bytes(),
};

/// A controller of [`DEFAULT_NQN`] for `h` at `t`, one I/O queue, no Keep Alive.
fn open_as(t: &Target, h: &Host) -> Controller {
    open_nqn(t, DEFAULT_NQN, h)
}

pub(crate) fn open_nqn(t: &Target, nqn: &str, h: &Host) -> Controller {
    let opts = Opts {
        hostid: h.id,
        ..quiet()
    };
    Controller::open(t.addr(), nqn, h.nqn, &opts)
        .or_panic(format_args!("opening {nqn} as host {}", h.name))
}

fn io(c: &mut Controller) -> &mut Queue {
    &mut c.io[0]
}

// ---- daemons -----------------------------------------------------------------

/// A configuration: PTPL state files in `state`, one subsystem
/// ([`DEFAULT_NQN`], any host) with `namespaces` (the keys of each).
fn config(state: &Path, namespaces: &[&str]) -> String {
    let mut s = format!(
        "[reservations]\nstate_directory = \"{}\"\n\n\
         [[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
         [[subsystem]]\nnqn = \"{DEFAULT_NQN}\"\nallow_any_host = true\n",
        state.display()
    );
    for ns in namespaces {
        let _ = write!(s, "\n  [[subsystem.namespace]]\n{ns}\n");
    }
    s
}

const MEMORY_NS: &str = "  backend = \"memory\"\n  size = \"16MiB\"";

/// A daemon with [`config`] and its state directory (kept until the daemon is gone).
struct Daemon {
    t: Target,
    _state: TempDir,
}

fn start(namespaces: &[&str]) -> Daemon {
    let state = TempDir::new("resv-state");
    let t = Target::start_config(&config(state.path(), namespaces));
    Daemon { t, _state: state }
}

// ---- commands ----------------------------------------------------------------

/// Reservation Register Action (CDW10 bits 2:0), Ignore Existing Key (bit
/// 3) and Change Persist Through Power Loss State (bits 31:30): NVMe Base
/// 2.1, 7.6.
pub(crate) const REGISTER: u32 = 0;
const UNREGISTER: u32 = 1;
const REPLACE: u32 = 2;
const IEKEY: u32 = 1 << 3;
const CPTPL_INVALID: u32 = 0b01 << 30;
const CPTPL_CLEAR: u32 = 0b10 << 30;
pub(crate) const CPTPL_SET: u32 = 0b11 << 30;
/// Reservation Acquire Action (7.5) and Reservation Release Action (7.7).
pub(crate) const ACQUIRE: u32 = 0;
pub(crate) const PREEMPT: u32 = 1;
const PREEMPT_AND_ABORT: u32 = 2;
const RELEASE: u32 = 0;
const CLEAR: u32 = 1;

/// RTYPE in CDW10 bits 15:8 of Acquire and Release.
pub(crate) fn rt(rtype: u8) -> u32 {
    (rtype as u32) << 8
}

/// Completion dword 0 of the Asynchronous Event Request (NVMe Base 2.1,
/// 5.1.2) for a notice: type I/O Command Specific Status (6h), information
/// Reservation Log Page Available (00h), log page 80h.
pub(crate) const RESV_NOTICE_AER: u32 = 0x0080_0006;

/// Reservation Notification Log Page types (NVMe Base 2.1, 5.1.12, the
/// Reservation Notification log page).
pub(crate) const REGISTRATION_PREEMPTED: u8 = 1;
const RESERVATION_RELEASED: u8 = 2;
const RESERVATION_PREEMPTED: u8 = 3;

/// A reservation command on namespace `nsid` with `cdw10` and `keys` (each
/// 8 bytes little endian) as its data; the caller checks the status.
fn resv(q: &mut Queue, opcode: u8, nsid: u32, cdw10: u32, keys: &[u64]) -> Completion {
    let mut sqe = Sqe::new(opcode, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, cdw10);
    let data: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
    q.exec(sqe, Some(&data), 0)
        .or_panic(format_args!("reservation command {opcode:#04x}"))
}

/// Reservation Register: data CRKEY, NRKEY.
pub(crate) fn reg(q: &mut Queue, cdw10: u32, crkey: u64, nrkey: u64) -> Completion {
    resv(q, nvm::RESV_REGISTER, NSID, cdw10, &[crkey, nrkey])
}

/// Reservation Acquire: data CRKEY, PRKEY.
pub(crate) fn acq(q: &mut Queue, cdw10: u32, crkey: u64, prkey: u64) -> Completion {
    resv(q, nvm::RESV_ACQUIRE, NSID, cdw10, &[crkey, prkey])
}

/// Reservation Release: data CRKEY.
fn rel(q: &mut Queue, cdw10: u32, crkey: u64) -> Completion {
    resv(q, nvm::RESV_RELEASE, NSID, cdw10, &[crkey])
}

/// Reservation Report of `len` bytes (NUMD = len/4 - 1), with the
/// Extended Data Structure when `eds`; the caller checks the status.
fn report_raw(q: &mut Queue, nsid: u32, len: u32, eds: bool) -> Completion {
    let mut sqe = Sqe::new(nvm::RESV_REPORT, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, len / 4 - 1);
    sqe.set_cdw(11, eds as u32);
    q.exec(sqe, None, len).or_panic("Reservation Report")
}

/// The Reservation Status Extended Data Structure of namespace `nsid`.
pub(crate) fn report_ns(q: &mut Queue, nsid: u32) -> Report {
    let done = report_raw(q, nsid, 4096, true);
    assert_status(&done, Status::SUCCESS, "Reservation Report (EDS)");
    parse_report(&done.data)
}

fn report(q: &mut Queue) -> Report {
    report_ns(q, NSID)
}

/// Asserts the status of `c`; a Reservation Conflict must have DNR set
/// (NVMe Base 2.1, 8.1.22).
#[track_caller]
fn want(c: Completion, status: Status, what: &str) {
    assert_status(&c, status, what);
    if status == Status::RESERVATION_CONFLICT {
        assert!(
            dnr_of(c.cqe.status),
            "{what}: Reservation Conflict without DNR (status field {:#06x})",
            c.cqe.status
        );
    }
}

#[track_caller]
pub(crate) fn ok(c: Completion, what: &str) {
    want(c, Status::SUCCESS, what);
}

#[track_caller]
pub(crate) fn conflict(c: Completion, what: &str) {
    want(c, Status::RESERVATION_CONFLICT, what);
}

// ---- data structures -----------------------------------------------------------

/// A Reservation Status Extended Data Structure (NVMe Base 2.1, 7.8,
/// Reservation Report): header of 64 bytes (GEN at 0, RTYPE 4, REGCTL 5-6, PTPLS 9), then
/// a Registered Controller Extended Data Structure of 64 bytes each (CNTLID
/// 0-1, RCSTS 2, RKEY 8-15, HOSTID 16-31).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) gen: u32,
    pub(crate) rtype: u8,
    /// Number of registrants (REGCTL), listed or not.
    pub(crate) regctl: u16,
    pub(crate) ptpls: u8,
    /// Those the buffer holds, sorted by host identifier (the order is not
    /// specified).
    pub(crate) registrants: Vec<Registrant>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Registrant {
    pub(crate) hostid: [u8; 16],
    pub(crate) rkey: u64,
    /// RCSTS bit 0: holds the reservation.
    pub(crate) holds: bool,
    pub(crate) cntlid: u16,
}

/// A registrant as the target must report it: the host (CNTLID FFFFh, as
/// its controllers share the registration).
fn r(h: &Host, rkey: u64, holds: bool) -> Registrant {
    Registrant {
        hostid: h.id,
        rkey,
        holds,
        cntlid: 0xffff,
    }
}

fn sorted(mut v: Vec<Registrant>) -> Vec<Registrant> {
    v.sort();
    v
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Parses a report; reserved bytes, the rest of RCSTS, and whatever the
/// buffer holds past the last registrant must be zero.
fn parse_report(b: &[u8]) -> Report {
    assert!(b.len() >= 64, "a report of {} bytes", b.len());
    assert_zero(&b[7..9], "Reservation Status bytes 7-8 (reserved)");
    assert_zero(&b[10..64], "Reservation Status bytes 10-63 (reserved)");
    assert_eq!(b[9] & !1, 0, "PTPLS bits 7:1 (reserved)");
    let regctl = le16(b, 5);
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
            rkey: le64(e, 8),
            holds: e[2] & 1 != 0,
            cntlid: le16(e, 0),
        });
    }
    assert_zero(
        &b[64 + listed * 64..],
        "the report past its last registrant",
    );
    registrants.sort();
    Report {
        gen: le32(b, 0),
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
pub(crate) struct Notice {
    pub(crate) count: u64,
    pub(crate) kind: u8,
    pub(crate) available: u8,
    pub(crate) nsid: u32,
}

/// Reads log page 80h (RAE clear): the oldest notice of the controller.
pub(crate) fn notice(c: &Controller) -> Notice {
    let page = c
        .admin()
        .get_log(lid::RESERVATION, 64, 0)
        .or_panic("Get Log Page 80h");
    assert_eq!(page.len(), 64);
    assert_zero(&page[10..12], "log 80h bytes 10-11 (reserved)");
    assert_zero(&page[16..64], "log 80h bytes 16-63 (reserved)");
    Notice {
        count: le64(&page, 0),
        kind: page[8],
        available: page[9],
        nsid: le32(&page, 12),
    }
}

fn n(count: u64, kind: u8, available: u8) -> Notice {
    Notice {
        count,
        kind,
        available,
        nsid: NSID,
    }
}

/// Gives the target time to send anything pending to `c`, and makes the
/// admin queue read it (a Keep Alive round trip).
fn settle(c: &Controller) {
    std::thread::sleep(Duration::from_millis(300));
    c.admin().keep_alive().or_panic("Keep Alive");
}

#[track_caller]
pub(crate) fn aer_says_log_80h(c: &Controller, aer: u16, what: &str) {
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

// ---- a: the access table ---------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Holder,
    Registrant,
    NonRegistrant,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Holder => "holder",
            Role::Registrant => "registrant",
            Role::NonRegistrant => "non-registrant",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Io {
    Read,
    Compare,
    Write,
    Flush,
    WriteZeroes,
    Deallocate,
}

const IOS: [Io; 6] = [
    Io::Read,
    Io::Compare,
    Io::Write,
    Io::Flush,
    Io::WriteZeroes,
    Io::Deallocate,
];

impl Io {
    fn name(self) -> &'static str {
        match self {
            Io::Read => "Read",
            Io::Compare => "Compare",
            Io::Write => "Write",
            Io::Flush => "Flush",
            Io::WriteZeroes => "WrZeroes",
            Io::Deallocate => "DSM-Dealloc",
        }
    }

    /// NVMe Base 2.1, 8.1.22: the write command group (Write, Write
    /// Zeroes, Dataset Management, Flush, ...) and the read command group
    /// (Read, Compare, ...).
    fn writes(self) -> bool {
        !matches!(self, Io::Read | Io::Compare)
    }

    /// Sends the command: one block each, on blocks none of the others
    /// touch (the Compare's block is never written, so it matches zeroes).
    fn run(self, q: &mut Queue) -> Completion {
        let block = vec![0u8; BS as usize];
        let done = match self {
            Io::Read => q.exec(Queue::rw_sqe(nvm::READ, NSID, 0, 1), None, BS),
            Io::Compare => q.exec(Queue::rw_sqe(nvm::COMPARE, NSID, 1000, 1), Some(&block), 0),
            Io::Write => q.exec(
                Queue::rw_sqe(nvm::WRITE, NSID, 100, 1),
                Some(&[0x5a; BS as usize]),
                0,
            ),
            Io::Flush => {
                let mut sqe = Sqe::new(nvm::FLUSH, 0);
                sqe.set_nsid(NSID);
                q.exec(sqe, None, 0)
            }
            Io::WriteZeroes => q.exec(Queue::rw_sqe(nvm::WRITE_ZEROES, NSID, 200, 1), None, 0),
            Io::Deallocate => {
                // One range (NR 0's based in CDW10), attribute Deallocate
                // (CDW11 bit 2); the range: context attributes, NLB, SLBA.
                let mut sqe = Sqe::new(nvm::DSM, 0);
                sqe.set_nsid(NSID);
                sqe.set_cdw(10, 0);
                sqe.set_cdw(11, 1 << 2);
                let mut range = [0u8; 16];
                range[4..8].copy_from_slice(&1u32.to_le_bytes());
                range[8..16].copy_from_slice(&300u64.to_le_bytes());
                q.exec(sqe, Some(&range), 0)
            }
        };
        done.or_panic(format_args!("{}", self.name()))
    }
}

/// NVMe Base 2.1, Figure "Command Behavior in the Presence of a
/// Reservation", per reservation type 1 to 6: whether a registrant that
/// is not the holder may [read, write], and whether a non-registrant may
/// [read, write]. The holder may do both under every type; under the All
/// Registrants types (5, 6) every registrant is a holder.
#[rustfmt::skip]
const BEHAVIOR: [(&str, [bool; 2], [bool; 2]); 6] = [
    //                                      registrant      non-registrant
    //                                      read   write    read   write
    ("Write Exclusive",                     [true,  false], [true,  false]),
    ("Exclusive Access",                    [false, false], [false, false]),
    ("Write Exclusive - Registrants Only",  [true,  true],  [true,  false]),
    ("Exclusive Access - Registrants Only", [true,  true],  [false, false]),
    ("Write Exclusive - All Registrants",   [true,  true],  [true,  false]),
    ("Exclusive Access - All Registrants",  [true,  true],  [false, false]),
];

fn allowed(rtype: u8, role: Role, io: Io) -> bool {
    let (_, registrant, other) = BEHAVIOR[rtype as usize - 1];
    let column = io.writes() as usize;
    match role {
        Role::Holder => true,
        Role::Registrant => registrant[column],
        Role::NonRegistrant => other[column],
    }
}

/// A result for the table: "ok", "83h", or another status; "!" marks a
/// wrong one.
fn cell(got: Status, dnr: bool, right: bool) -> String {
    let text = if got.is_success() {
        "ok".to_string()
    } else if got == Status::RESERVATION_CONFLICT {
        if dnr {
            "83h".to_string()
        } else {
            "83h/noDNR".to_string()
        }
    } else {
        format!("{:x}/{:02x}h", got.sct, got.sc)
    };
    if right {
        text
    } else {
        format!("{text}!")
    }
}

/// For every reservation type, host role and command of the read and
/// write groups: success or Reservation Conflict (83h, DNR set) exactly as
/// NVMe Base 2.1, 8.1.22 and its Figure "Command Behavior in the Presence
/// of a Reservation" say. Three hosts on one memory namespace: the holder
/// (A), another registrant (B) and a host that is not registered (C). The
/// expected table is [`BEHAVIOR`]; a mismatch prints the whole table.
#[test]
fn each_reservation_type_admits_what_the_specification_says() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let mut holder = open_as(&d.t, &A);
    let mut registrant = open_as(&d.t, &B);
    let mut other = open_as(&d.t, &C);
    const KEY_H: u64 = 0x1111_0000_0000_00a1;
    const KEY_R: u64 = 0x2222_0000_0000_00b2;
    let mut table = String::new();
    let _ = write!(table, "{:<42}{:<16}", "type", "role");
    for cmd in IOS {
        let _ = write!(table, "{:<13}", cmd.name());
    }
    table.push('\n');
    let mut wrong = Vec::new();
    for rtype in 1..=6u8 {
        let name = BEHAVIOR[rtype as usize - 1].0;
        ok(reg(io(&mut holder), REGISTER, 0, KEY_H), "A registers");
        ok(reg(io(&mut registrant), REGISTER, 0, KEY_R), "B registers");
        ok(
            acq(io(&mut holder), ACQUIRE | rt(rtype), KEY_H, 0),
            &format!("A acquires type {rtype}"),
        );
        assert_eq!(report(io(&mut other)).rtype, rtype, "RTYPE after acquiring");
        for (role, c) in [
            (Role::Holder, &mut holder),
            (Role::Registrant, &mut registrant),
            (Role::NonRegistrant, &mut other),
        ] {
            let _ = write!(
                table,
                "{:<42}{:<16}",
                format!("{rtype} {name}"),
                role.name()
            );
            for cmd in IOS {
                let done = cmd.run(io(c));
                let got = done.status();
                let dnr = dnr_of(done.cqe.status);
                let expect = if allowed(rtype, role, cmd) {
                    Status::SUCCESS
                } else {
                    Status::RESERVATION_CONFLICT
                };
                let right = got == expect && (got != Status::RESERVATION_CONFLICT || dnr);
                if !right {
                    wrong.push(format!(
                        "type {rtype} ({name}), {}, {}: got {got}{}, want {expect}",
                        role.name(),
                        cmd.name(),
                        if dnr { " (DNR)" } else { "" },
                    ));
                }
                let _ = write!(table, "{:<13}", cell(got, dnr, right));
            }
            table.push('\n');
        }
        // The holder clears: every registration and the reservation go.
        ok(
            rel(io(&mut holder), CLEAR | rt(rtype), KEY_H),
            "A clears the registrations",
        );
        let after = report(io(&mut other));
        assert_eq!(
            (after.rtype, after.regctl),
            (0, 0),
            "after Clear: {after:?}"
        );
    }
    assert!(
        wrong.is_empty(),
        "{} of {} results differ from NVMe Base 2.1 Figure \"Command Behavior in the \
         Presence of a Reservation\" (\"!\" in the table: ok = success, 83h = Reservation \
         Conflict with DNR):\n{table}\n{}",
        wrong.len(),
        6 * 3 * IOS.len(),
        wrong.join("\n")
    );
}

/// The Identify Controller field ONCS (bytes 521:520), bit 0 Compare, bit
/// 5 Reservations (NVMe Base 2.1, 5.1.13.2.1); Identify Namespace NMIC
/// (byte 30) and RESCAP (byte 31: PTPL, the six types, IEKEY as in 1.3 and
/// later: FFh; NVM Command Set 2.1, the Identify Namespace data
/// structure). A namespace with `reservations = false` reports RESCAP 0
/// and takes none of the four reservation opcodes (Invalid Command
/// Opcode), while its neighbour with reservations does; a subsystem whose
/// only namespace has none clears ONCS bit 5.
#[test]
fn identify_reports_reservations_and_a_namespace_without_them_refuses_the_commands() {
    let _machine = crate::shared();
    let state = TempDir::new("resv-state");
    const WITHOUT: &str = "  backend = \"memory\"\n  size = \"16MiB\"\n  reservations = false";
    let toml = format!(
        "{}\n[[subsystem]]\nnqn = \"{OPEN_NQN}\"\nallow_any_host = true\n\n  \
         [[subsystem.namespace]]\n{WITHOUT}\n",
        config(state.path(), &[MEMORY_NS, WITHOUT])
    );
    let t = Target::start_config(&toml);
    let mut a = open_as(&t, &A);
    let id = a
        .admin()
        .identify(cns::CONTROLLER, 0)
        .or_panic("Identify Controller");
    let oncs = le16(&id, 520);
    assert_eq!(oncs & 1 << 5, 1 << 5, "ONCS {oncs:#06x}: Reservations");
    assert_eq!(oncs & 1, 1, "ONCS {oncs:#06x}: Compare");
    let ns = |c: &Controller, nsid: u32| {
        c.admin()
            .identify(cns::NAMESPACE, nsid)
            .or_panic(format_args!("Identify Namespace {nsid}"))
    };
    let ns1 = ns(&a, 1);
    assert_eq!(ns1[31], 0xff, "RESCAP of namespace 1");
    assert_eq!(ns1[30] & 1, 1, "NMIC of namespace 1: may be shared");
    assert_eq!(
        ns(&a, 2)[31],
        0,
        "RESCAP of namespace 2 (reservations = false)"
    );

    // Namespace 2 takes none of the commands; namespace 1 does.
    let refused = |q: &mut Queue, nsid: u32, what: &str| {
        let cases: [(u8, u32, &[u64]); 3] = [
            (nvm::RESV_REGISTER, REGISTER, &[0, 7]),
            (nvm::RESV_ACQUIRE, ACQUIRE | rt(1), &[7, 0]),
            (nvm::RESV_RELEASE, RELEASE | rt(1), &[7]),
        ];
        for (opcode, cdw10, keys) in cases {
            want(
                resv(q, opcode, nsid, cdw10, keys),
                Status::INVALID_OPCODE,
                &format!("{what}: opcode {opcode:#04x}"),
            );
        }
        want(
            report_raw(q, nsid, 4096, true),
            Status::INVALID_OPCODE,
            &format!("{what}: Reservation Report"),
        );
    };
    refused(io(&mut a), 2, "namespace 2 (reservations = false)");
    ok(reg(io(&mut a), REGISTER, 0, 7), "Register on namespace 1");
    assert_eq!(report(io(&mut a)).registrants, vec![r(&A, 7, false)]);

    let mut o = open_nqn(&t, OPEN_NQN, &A);
    let id = o
        .admin()
        .identify(cns::CONTROLLER, 0)
        .or_panic("Identify Controller");
    let oncs = le16(&id, 520);
    assert_eq!(
        oncs & 1 << 5,
        0,
        "ONCS {oncs:#06x} of a subsystem without reservations"
    );
    assert_eq!(ns(&o, 1)[31], 0, "RESCAP (reservations = false)");
    refused(
        io(&mut o),
        1,
        "the namespace of a subsystem without reservations",
    );
}

// ---- b: keys and the report --------------------------------------------------------

/// NVMe Base 2.1, 8.1.22 and 7.5 to 7.8, as Linux nvmet does them: a host
/// registers once (again with another key: Reservation Conflict; with the
/// same key: success), replaces its key only with the right one (or
/// IEKEY), unregisters only with the right one (or IEKEY); commands from a
/// host that is not registered, or with a wrong key, conflict; Acquire
/// refuses IEKEY and an RTYPE outside 1 to 6, Release IEKEY (Invalid
/// Field); CPTPL 01b is Invalid Field; the holder may acquire its own
/// type again but no other; a registrant that does not hold the
/// reservation releases nothing, successfully; under All Registrants every
/// registrant holds it and it outlives its acquirer's registration; the
/// generation counts successful Register actions, preempts and Clear, not
/// Acquire or Release. The Reservation
/// Report (EDS) lists each host once with its 128-bit identifier, CNTLID
/// FFFFh, its key and RCSTS; REGCTL counts them all even when the buffer
/// holds fewer. Without EDS: Host Identifier Inconsistent Format (18h).
/// Two controllers of one host share its registration.
#[test]
fn register_replace_unregister_and_what_the_report_says() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let (mut a, mut a2, mut b) = (open_as(&d.t, &A), open_as(&d.t, &A), open_as(&d.t, &B));
    assert_ne!(a.cntlid, a2.cntlid, "two controllers of host A");
    const KA1: u64 = 0xa1;
    const KA2: u64 = 0xa2;
    const KA3: u64 = 0xa3;
    const KA4: u64 = 0xa4;
    const KB: u64 = 0xb1;

    let empty = report(io(&mut a));
    assert_eq!(
        empty,
        Report {
            gen: 0,
            rtype: 0,
            regctl: 0,
            ptpls: 0,
            registrants: vec![]
        }
    );
    let done = report_raw(io(&mut a), NSID, 4096, false);
    want(
        done,
        Status::HOST_ID_INCONSISTENT,
        "Reservation Report without EDS (128-bit host identifiers)",
    );

    // Nothing but Register works for a host that is not registered.
    conflict(
        reg(io(&mut a), UNREGISTER, KA1, 0),
        "unregister, not registered",
    );
    conflict(
        reg(io(&mut a), REPLACE, KA1, KA2),
        "replace, not registered",
    );
    conflict(
        acq(io(&mut a), ACQUIRE | rt(1), KA1, 0),
        "acquire, not registered",
    );
    conflict(
        rel(io(&mut a), RELEASE | rt(1), KA1),
        "release, not registered",
    );
    assert_eq!(
        report(io(&mut a)).gen,
        0,
        "failed commands change no generation"
    );

    ok(reg(io(&mut a), REGISTER, 0, KA1), "A registers");
    let rep = report(io(&mut b));
    assert_eq!((rep.gen, rep.regctl, rep.rtype), (1, 1, 0), "{rep:?}");
    assert_eq!(rep.registrants, vec![r(&A, KA1, false)]);
    // A's other controller is the same registrant.
    conflict(
        reg(io(&mut a2), REGISTER, 0, KA2),
        "A registers again, with another key, through its other controller",
    );
    assert_eq!(
        report(io(&mut a2)),
        rep,
        "the report through A's other controller"
    );

    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    let rep = report(io(&mut a));
    assert_eq!((rep.gen, rep.regctl), (2, 2), "{rep:?}");
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA1, false), r(&B, KB, false)])
    );

    // Replace: the current key or IEKEY.
    conflict(
        reg(io(&mut a), REPLACE, KA2, KA3),
        "replace with a wrong key",
    );
    ok(
        reg(io(&mut a), REPLACE, KA1, KA2),
        "replace with the current key",
    );
    ok(
        reg(io(&mut a2), REPLACE | IEKEY, 0xdead, KA3),
        "replace with IEKEY, through A's other controller",
    );
    let rep = report(io(&mut b));
    assert_eq!(rep.gen, 4, "two replacements: {rep:?}");
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA3, false), r(&B, KB, false)])
    );

    // Acquire: the current key, no IEKEY, RTYPE 1 to 6.
    conflict(
        acq(io(&mut a), ACQUIRE | rt(1), KA2, 0),
        "acquire with an old key",
    );
    for (cdw10, what) in [
        (ACQUIRE | IEKEY | rt(1), "acquire with IEKEY"),
        (ACQUIRE | rt(0), "acquire RTYPE 0"),
        (ACQUIRE | rt(7), "acquire RTYPE 7"),
    ] {
        want(acq(io(&mut a), cdw10, KA3, 0), Status::INVALID_FIELD, what);
    }
    ok(
        acq(io(&mut a2), ACQUIRE | rt(1), KA3, 0),
        "A acquires Write Exclusive through its other controller",
    );
    let rep = report(io(&mut b));
    assert_eq!(
        (rep.gen, rep.rtype),
        (4, 1),
        "Acquire keeps the generation: {rep:?}"
    );
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA3, true), r(&B, KB, false)])
    );
    ok(
        acq(io(&mut a), ACQUIRE | rt(1), KA3, 0),
        "the holder acquires the same type again",
    );
    conflict(
        acq(io(&mut a), ACQUIRE | rt(2), KA3, 0),
        "the holder acquires another type",
    );
    conflict(
        acq(io(&mut b), ACQUIRE | rt(1), KB, 0),
        "B acquires A's reservation",
    );

    // The holder replaces its key and keeps the reservation.
    ok(
        reg(io(&mut a), REPLACE, KA3, KA4),
        "the holder replaces its key",
    );
    let rep = report(io(&mut b));
    assert_eq!((rep.gen, rep.rtype), (5, 1), "{rep:?}");
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA4, true), r(&B, KB, false)])
    );

    // Release: the current key, no IEKEY; a registrant that does not hold
    // the reservation releases nothing, successfully.
    conflict(
        rel(io(&mut b), RELEASE | rt(1), KA4),
        "B releases with A's key",
    );
    want(
        rel(io(&mut a), RELEASE | IEKEY | rt(1), KA4),
        Status::INVALID_FIELD,
        "release with IEKEY",
    );
    ok(
        rel(io(&mut b), RELEASE | rt(1), KB),
        "B, not the holder, releases",
    );
    assert_eq!(report(io(&mut a)).rtype, 1, "still A's reservation");
    ok(rel(io(&mut a), RELEASE | rt(1), KA4), "A releases");
    let rep = report(io(&mut b));
    assert_eq!(
        (rep.gen, rep.rtype),
        (5, 0),
        "Release keeps the generation: {rep:?}"
    );
    assert!(rep.registrants.iter().all(|x| !x.holds), "{rep:?}");

    // All Registrants: every registrant holds it, and it stays when its
    // acquirer unregisters.
    ok(
        acq(io(&mut a), ACQUIRE | rt(5), KA4, 0),
        "A acquires type 5",
    );
    let rep = report(io(&mut b));
    assert_eq!(rep.rtype, 5);
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA4, true), r(&B, KB, true)]),
        "RCSTS under Write Exclusive - All Registrants"
    );
    conflict(
        reg(io(&mut a), UNREGISTER, KA3, 0),
        "unregister with a wrong key",
    );
    ok(
        reg(io(&mut a), UNREGISTER | IEKEY, 0, 0),
        "unregister with IEKEY",
    );
    let rep = report(io(&mut b));
    assert_eq!((rep.gen, rep.rtype, rep.regctl), (6, 5, 1), "{rep:?}");
    assert_eq!(rep.registrants, vec![r(&B, KB, true)]);

    // CPTPL 01b is reserved: Invalid Field, and nothing registered.
    want(
        reg(io(&mut a), REGISTER | CPTPL_INVALID, 0, KA1),
        Status::INVALID_FIELD,
        "Register with CPTPL 01b",
    );
    assert_eq!(report(io(&mut a)).regctl, 1);

    // A buffer for one registrant: REGCTL still counts both.
    ok(reg(io(&mut a), REGISTER, 0, KA1), "A registers again");
    let done = report_raw(io(&mut a), NSID, 128, true);
    assert_status(&done, Status::SUCCESS, "a 128-byte report");
    let short = parse_report(&done.data);
    assert_eq!((short.gen, short.regctl), (7, 2), "{short:?}");
    assert_eq!(short.registrants.len(), 1);
    assert!(
        [r(&A, KA1, true), r(&B, KB, true)].contains(&short.registrants[0]),
        "{short:?}"
    );

    // Clear, by any registrant: no registrations, no reservation.
    conflict(rel(io(&mut b), CLEAR, KA1), "clear with a wrong key");
    ok(rel(io(&mut b), CLEAR | rt(5), KB), "B clears");
    let rep = report(io(&mut a));
    assert_eq!(
        rep,
        Report {
            gen: 8,
            rtype: 0,
            regctl: 0,
            ptpls: 0,
            registrants: vec![]
        }
    );

    // Registering again with the key it has succeeds.
    ok(reg(io(&mut a), REGISTER, 0, KA2), "A registers");
    ok(
        reg(io(&mut a2), REGISTER, 0, KA2),
        "A registers again, same key",
    );
    assert_eq!(report(io(&mut b)).registrants, vec![r(&A, KA2, false)]);
}

// ---- c: notices -----------------------------------------------------------------

/// The Reservation Notification log page and its event (NVMe Base 2.1,
/// 8.1.22, Reservation Notifications; 5.1.12 and 5.1.2), as nvmet sends
/// them:
/// - A holds Write Exclusive, B preempts it: A's controller gets
///   Registration Preempted, with the AER completing dword 0 00800006h;
///   B (the preemptor) and C (no registration) get nothing.
/// - Further notices wait in the log while the event is masked (until the
///   host reads log 80h with RAE clear): two more preempts complete no AER;
///   each read takes the oldest, with the running Log Page Count and the
///   Number of Available Log Pages after it; an empty log reads zeroes.
/// - A releases a Registrants Only reservation: Reservation Released to the
///   other registrants (B and C), not to A.
/// - B clears: Reservation Preempted to the other registrants (A and C),
///   not to B.
#[test]
fn notices_go_to_the_hosts_concerned_in_log_80h() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let (mut a, mut b, mut c) = (open_as(&d.t, &A), open_as(&d.t, &B), open_as(&d.t, &C));
    const KA: u64 = 0xaaaa;
    const KB: u64 = 0xbbbb;
    const KC: u64 = 0xcccc;
    for (x, who) in [(&a, "A"), (&b, "B"), (&c, "C")] {
        assert_eq!(
            notice(x),
            Notice::default(),
            "{who}: an empty log reads zeroes"
        );
    }

    let aer = submit_aer(&a);
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(acq(io(&mut a), ACQUIRE | rt(1), KA, 0), "A acquires");
    settle(&a);
    assert!(
        !a.admin().has_completed(aer),
        "an AER completed without a notice"
    );
    ok(acq(io(&mut b), PREEMPT | rt(1), KB, KA), "B preempts A");
    aer_says_log_80h(&a, aer, "Registration Preempted");
    let rep = report(io(&mut c));
    assert_eq!((rep.gen, rep.rtype), (3, 1), "{rep:?}");
    assert_eq!(rep.registrants, vec![r(&B, KB, true)]);
    assert_eq!(notice(&b), Notice::default(), "the preemptor's log");
    assert_eq!(
        notice(&c),
        Notice::default(),
        "the log of a host with no registration"
    );

    // Two more Registration Preempted while the event is masked (the log
    // not read yet): preempts by B without a reservation held.
    let aer = submit_aer(&a);
    ok(rel(io(&mut b), RELEASE | rt(1), KB), "B releases");
    for _ in 0..2 {
        ok(reg(io(&mut a), REGISTER, 0, KA), "A registers again");
        ok(
            acq(io(&mut b), PREEMPT | rt(1), KB, KA),
            "B preempts A's registration",
        );
    }
    settle(&a);
    assert!(
        !a.admin().has_completed(aer),
        "an AER completed while the Reservation Log Page Available event was masked"
    );
    assert_eq!(
        notice(&a),
        n(1, REGISTRATION_PREEMPTED, 2),
        "A's first notice"
    );
    assert_eq!(
        notice(&a),
        n(2, REGISTRATION_PREEMPTED, 1),
        "A's second notice"
    );
    assert_eq!(
        notice(&a),
        n(3, REGISTRATION_PREEMPTED, 0),
        "A's third notice"
    );
    assert_eq!(notice(&a), Notice::default(), "A's log, read to its end");
    // Whether notices still in the log when it was read (unmasked) signal
    // again is not specified; if the AER did complete, it says log 80h.
    settle(&a);
    let aer = if a.admin().has_completed(aer) {
        aer_says_log_80h(&a, aer, "after the log was read");
        submit_aer(&a)
    } else {
        aer
    };

    // Reservation Released: to the other registrants of a Registrants Only
    // reservation its holder releases.
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers again");
    ok(reg(io(&mut c), REGISTER, 0, KC), "C registers");
    ok(acq(io(&mut a), ACQUIRE | rt(3), KA, 0), "A acquires type 3");
    let aer_b = submit_aer(&b);
    ok(rel(io(&mut a), RELEASE | rt(3), KA), "A releases");
    aer_says_log_80h(&b, aer_b, "Reservation Released");
    assert_eq!(notice(&b), n(1, RESERVATION_RELEASED, 0), "B's log");
    assert_eq!(notice(&c), n(1, RESERVATION_RELEASED, 0), "C's log");
    settle(&a);
    assert!(!a.admin().has_completed(aer), "the releaser was signalled");
    assert_eq!(notice(&a), Notice::default(), "the releaser's log");

    // Reservation Preempted: to the other registrants when one clears.
    ok(
        acq(io(&mut a), ACQUIRE | rt(1), KA, 0),
        "A acquires Write Exclusive",
    );
    ok(rel(io(&mut b), CLEAR | rt(1), KB), "B clears");
    aer_says_log_80h(&a, aer, "Reservation Preempted");
    assert_eq!(notice(&a), n(4, RESERVATION_PREEMPTED, 0), "A's log");
    assert_eq!(notice(&c), n(2, RESERVATION_PREEMPTED, 0), "C's log");
    assert_eq!(
        notice(&b),
        Notice::default(),
        "the log of the host that cleared"
    );
}

/// Set Features Reservation Notification Mask (82h; NVMe Base 2.1, Set
/// Features, the Reservation Notification Mask feature): with Registration Preempted masked (CDW11 bit 1, set for
/// every namespace with NSID FFFFFFFFh), a preempt neither logs nor signals
/// it; Get Features reads the mask back; unmasked, the next preempt does.
#[test]
fn a_masked_notice_is_neither_logged_nor_signalled() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let (mut a, mut b) = (open_as(&d.t, &A), open_as(&d.t, &B));
    const KA: u64 = 0xaaaa;
    const KB: u64 = 0xbbbb;
    const REGPRE: u32 = 1 << 1;
    let done = a
        .admin()
        .set_features_ns(feature::RESV_MASK, 0xffff_ffff, REGPRE)
        .or_panic("Set Features 82h");
    assert_status(&done, Status::SUCCESS, "Set Features 82h, NSID FFFFFFFFh");
    let mask = |c: &Controller| {
        let done = c
            .admin()
            .get_features_ns(feature::RESV_MASK, NSID)
            .or_panic("Get Features 82h");
        assert_status(&done, Status::SUCCESS, "Get Features 82h");
        done.cqe.dw0 & 0b1110
    };
    assert_eq!(mask(&a), REGPRE, "the mask read back");
    assert_eq!(mask(&b), 0, "another controller's mask");

    let aer = submit_aer(&a);
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(
        acq(io(&mut b), PREEMPT | rt(1), KB, KA),
        "B preempts A's registration",
    );
    assert_eq!(report(io(&mut b)).registrants, vec![r(&B, KB, false)]);
    settle(&a);
    assert!(
        !a.admin().has_completed(aer),
        "a masked Registration Preempted completed an AER"
    );
    assert_eq!(notice(&a), Notice::default(), "a masked notice was logged");

    let done = a
        .admin()
        .set_features_ns(feature::RESV_MASK, NSID, 0)
        .or_panic("Set Features 82h");
    assert_status(&done, Status::SUCCESS, "Set Features 82h, NSID 1");
    assert_eq!(mask(&a), 0, "the mask cleared");
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers again");
    ok(
        acq(io(&mut b), PREEMPT | rt(1), KB, KA),
        "B preempts A again",
    );
    aer_says_log_80h(&a, aer, "Registration Preempted, unmasked");
    let got = notice(&a);
    assert_eq!(
        (got.kind, got.available, got.nsid),
        (REGISTRATION_PREEMPTED, 0, NSID),
        "{got:?}"
    );
    assert_ne!(got.count, 0, "{got:?}");
}

// ---- d: preempt and abort -----------------------------------------------------

/// Preempt and Abort (NVMe Base 2.1, 8.1.22, Preempting a Reservation or
/// Registration, and 7.5): A holds Write Exclusive -
/// Registrants Only and has a write outstanding whose data it holds back
/// (the target sent its R2T; no H2CData yet). B preempts and aborts A's
/// registration: the Acquire completes (A's write never reached the
/// backend), then A sends the data and its write completes with Command
/// Aborted due to Preempt and Abort (1Bh) without landing: both hosts read
/// the old data. A, no longer registered, then meets the reservation: its
/// next write conflicts, its reads succeed.
#[test]
fn preempt_and_abort_fails_a_write_whose_data_was_held_back() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let (mut a, mut b) = (open_as(&d.t, &A), open_as(&d.t, &B));
    const KA: u64 = 0xaaaa;
    const KB: u64 = 0xbbbb;
    const SLBA: u64 = 64;
    let mut rng = Rng::new(0x1b);
    let old = rng.bytes(4096);
    let new = rng.bytes(4096);
    io(&mut a)
        .write(NSID, SLBA, &old, BS, false)
        .or_panic("the first write");
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(acq(io(&mut a), ACQUIRE | rt(3), KA, 0), "A acquires type 3");

    let held = io(&mut a)
        .submit_holding_data(Queue::rw_sqe(nvm::WRITE, NSID, SLBA, 8), &new)
        .or_panic("A's write");
    io(&mut a)
        .wait_held_r2t(held)
        .or_panic("the R2T of A's write");

    ok(
        acq(io(&mut b), PREEMPT_AND_ABORT | rt(3), KB, KA),
        "B preempts and aborts A while A's write waits for its data",
    );
    let rep = report(io(&mut b));
    assert_eq!(rep.rtype, 3, "{rep:?}");
    assert_eq!(rep.registrants, vec![r(&B, KB, true)]);

    io(&mut a)
        .release_data(held)
        .or_panic("sending the held data");
    let done = io(&mut a).wait(held).or_panic("A's write");
    assert_status(
        &done,
        Status::ABORTED_PREEMPT,
        "A's write, preempted and aborted before its data arrived",
    );
    let back = io(&mut b).read(NSID, SLBA, 8, BS).or_panic("B reads");
    assert_same(&back, &old, "the blocks of the aborted write, read by B");
    let back = io(&mut a).read(NSID, SLBA, 8, BS).or_panic("A reads");
    assert_same(&back, &old, "the blocks of the aborted write, read by A");

    // A is not a registrant any more: under type 3 it may read, not write.
    let done = io(&mut a)
        .exec(Queue::rw_sqe(nvm::WRITE, NSID, SLBA, 8), Some(&new), 0)
        .or_panic("A writes again");
    want(
        done,
        Status::RESERVATION_CONFLICT,
        "a new write from the preempted host",
    );
    let back = io(&mut b).read(NSID, SLBA, 8, BS).or_panic("B reads");
    assert_same(&back, &old, "after the conflicting write");
}

// ---- e: persist through power loss --------------------------------------------

/// A file namespace's backing file of `bytes` in `dir`.
fn backing_file(dir: &TempDir, name: &str, bytes: u64) -> PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).or_panic("creating a backing file");
    f.set_len(bytes).or_panic("sizing a backing file");
    path
}

fn file_ns(path: &Path) -> String {
    format!("  backend = \"file\"\n  path = \"{}\"", path.display())
}

/// The PTPL state file of namespace `nsid` of [`DEFAULT_NQN`] in `state`.
fn state_file(state: &Path, nsid: u32) -> PathBuf {
    state.join(format!("{DEFAULT_NQN}.ns{nsid}.ptpl"))
}

fn refused_file(state: &Path, nsid: u32) -> PathBuf {
    state.join(format!("{DEFAULT_NQN}.ns{nsid}.ptpl.refused"))
}

/// Get Features Reservation Persistence (83h) of namespace 1: PTPL.
fn ptpl(c: &Controller) -> u32 {
    let done = c
        .admin()
        .get_features_ns(feature::RESV_PERSIST, NSID)
        .or_panic("Get Features 83h");
    assert_status(&done, Status::SUCCESS, "Get Features 83h");
    done.cqe.dw0 & 1
}

fn set_ptpl(c: &Controller, on: bool) {
    let done = c
        .admin()
        .set_features_ns(feature::RESV_PERSIST, NSID, on as u32)
        .or_panic("Set Features 83h");
    assert_status(&done, Status::SUCCESS, "Set Features 83h");
}

/// SIGKILL (no chance to save anything), then the same configuration again.
fn kill_and_restart(t: &mut Target, toml: &str) -> Target {
    t.kill();
    assert!(!t.is_running(), "the daemon survived SIGKILL");
    Target::start_config(toml)
}

/// Persist Through Power Loss (NVMe Base 2.1, 8.1.22, and the Reservation
/// Persistence feature 83h): with PTPL set by
/// Register (CPTPL 11b), the registrants, the holder, the type and the
/// generation survive `kill -9` and a restart, with PTPLS set and access
/// checked as before; cleared with Set Features 83h, a restart forgets
/// them; set with Set Features 83h, the next registrations survive; cleared
/// with CPTPL 10b, forgotten again.
#[test]
fn ptpl_keeps_registrations_and_the_reservation_across_kill_9() {
    let _machine = crate::shared();
    let state = TempDir::new("resv-ptpl");
    let files = TempDir::new("resv-ptpl-ns");
    let toml = config(
        state.path(),
        &[&file_ns(&backing_file(&files, "ns1.img", 16 << 20))],
    );
    const KA: u64 = 0x0a0a_0a0a_0a0a_0a0a;
    const KB: u64 = 0x0b0b_0b0b_0b0b_0b0b;
    let mut t = Target::start_config(&toml);
    let (mut a, mut b) = (open_as(&t, &A), open_as(&t, &B));
    assert_eq!(ptpl(&a), 0, "PTPL of a new namespace");
    ok(
        reg(io(&mut a), REGISTER | CPTPL_SET, 0, KA),
        "A registers, CPTPL 11b",
    );
    assert_eq!(ptpl(&a), 1, "PTPL after CPTPL 11b");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(
        acq(io(&mut a), ACQUIRE | rt(4), KA, 0),
        "A acquires Exclusive Access - Registrants Only",
    );
    let before = report(io(&mut b));
    assert_eq!(
        (before.gen, before.rtype, before.regctl, before.ptpls),
        (2, 4, 2, 1),
        "{before:?}"
    );
    assert_eq!(
        before.registrants,
        sorted(vec![r(&A, KA, true), r(&B, KB, false)])
    );
    assert!(
        state_file(state.path(), 1).exists(),
        "no state file {} (state directory: {:?})",
        state_file(state.path(), 1).display(),
        std::fs::read_dir(state.path()).map(|d| d.count())
    );

    drop((a, b));
    let mut t = kill_and_restart(&mut t, &toml);
    let (mut a, mut b, mut c) = (open_as(&t, &A), open_as(&t, &B), open_as(&t, &C));
    assert_eq!(
        report(io(&mut c)),
        before,
        "the report after kill -9 and a restart"
    );
    assert_eq!(ptpl(&a), 1, "PTPL after the restart");
    let done = io(&mut c)
        .exec(Queue::rw_sqe(nvm::READ, NSID, 0, 1), None, BS)
        .or_panic("C reads");
    want(
        done,
        Status::RESERVATION_CONFLICT,
        "a non-registrant's read under type 4",
    );
    io(&mut b)
        .write(NSID, 0, &[7; BS as usize], BS, false)
        .or_panic("a registrant writes under type 4");
    io(&mut a).read(NSID, 0, 1, BS).or_panic("the holder reads");

    // Cleared with Set Features: forgotten at the next start.
    set_ptpl(&a, false);
    assert_eq!(ptpl(&a), 0, "PTPL after Set Features 83h = 0");
    assert_eq!(report(io(&mut a)).ptpls, 0);
    drop((a, b, c));
    let mut t = kill_and_restart(&mut t, &toml);
    let (mut a, mut b) = (open_as(&t, &A), open_as(&t, &B));
    let rep = report(io(&mut a));
    assert_eq!(
        (rep.rtype, rep.regctl, rep.ptpls),
        (0, 0, 0),
        "after a restart without PTPL: {rep:?}"
    );
    assert_eq!(ptpl(&a), 0);

    // Set with Set Features, then registrations: kept.
    set_ptpl(&a, true);
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(acq(io(&mut b), ACQUIRE | rt(5), KB, 0), "B acquires type 5");
    let before = report(io(&mut a));
    assert_eq!(
        (before.rtype, before.regctl, before.ptpls),
        (5, 2, 1),
        "{before:?}"
    );
    drop((a, b));
    let mut t = kill_and_restart(&mut t, &toml);
    let (mut a, mut b) = (open_as(&t, &A), open_as(&t, &B));
    assert_eq!(report(io(&mut b)), before, "PTPL set by Set Features 83h");

    // Cleared by Register with CPTPL 10b (a replace by the same key).
    ok(
        reg(io(&mut a), REPLACE | CPTPL_CLEAR, KA, KA),
        "replace, CPTPL 10b",
    );
    assert_eq!(ptpl(&a), 0, "PTPL after CPTPL 10b");
    drop((a, b));
    let t = kill_and_restart(&mut t, &toml);
    let mut a = open_as(&t, &A);
    let rep = report(io(&mut a));
    assert_eq!((rep.rtype, rep.regctl), (0, 0), "after CPTPL 10b: {rep:?}");
}

/// The ERROR lines of a daemon's log that name `file_name`.
fn error_lines(t: &Target, file_name: &str) -> Vec<String> {
    t.log()
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains(file_name))
        .map(str::to_string)
        .collect()
}

/// A PTPL state file the daemon cannot trust is refused (renamed
/// `*.refused`, an ERROR line saying why) and the namespace starts with no
/// registrations, while the daemon starts and another namespace keeps its
/// own: garbage; the valid file of another namespace copied over; the
/// namespace's own file after the namespace grew.
#[test]
fn corrupt_and_foreign_ptpl_files_are_refused() {
    let _machine = crate::shared();
    let state = TempDir::new("resv-ptpl-bad");
    let files = TempDir::new("resv-ptpl-bad-ns");
    let img1 = backing_file(&files, "ns1.img", 16 << 20);
    let img2 = backing_file(&files, "ns2.img", 8 << 20);
    let toml = config(state.path(), &[&file_ns(&img1), &file_ns(&img2)]);
    let (f1, f2) = (state_file(state.path(), 1), state_file(state.path(), 2));
    let refused = refused_file(state.path(), 1);
    let name1 = format!("{DEFAULT_NQN}.ns1.ptpl");
    const KA: u64 = 0x1a;
    const KA2: u64 = 0x2a;

    // Register on both namespaces with PTPL, then kill.
    let mut t = Target::start_config(&toml);
    let mut a = open_as(&t, &A);
    ok(
        reg(io(&mut a), REGISTER | CPTPL_SET, 0, KA),
        "A registers on namespace 1",
    );
    ok(
        resv(
            io(&mut a),
            nvm::RESV_REGISTER,
            2,
            REGISTER | CPTPL_SET,
            &[0, KA2],
        ),
        "A registers on namespace 2",
    );
    assert!(f1.exists() && f2.exists(), "state files {f1:?}, {f2:?}");
    drop(a);
    t.kill();

    // Checks a daemon started over a bad file of namespace 1.
    let check = |t: &Target, case: &str| {
        let mut a = open_as(t, &A);
        let rep = report(io(&mut a));
        assert_eq!(
            (rep.regctl, rep.rtype),
            (0, 0),
            "{case}: namespace 1 starts with no registrations: {rep:?}"
        );
        let rep2 = report_ns(io(&mut a), 2);
        assert_eq!(
            rep2.registrants,
            vec![r(&A, KA2, false)],
            "{case}: namespace 2 keeps its registration"
        );
        assert!(
            refused.exists(),
            "{case}: no {refused:?}; the state directory holds {:?}",
            std::fs::read_dir(state.path())
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
        assert!(!f1.exists(), "{case}: {f1:?} still there");
        let lines = error_lines(t, &name1);
        assert!(
            !lines.is_empty(),
            "{case}: no ERROR line naming {name1}\n{}",
            t.log_tail()
        );
        eprintln!("{case}: {}", lines.join("\n"));
        lines
    };

    // Garbage.
    std::fs::write(&f1, b"not a reservation state file\n\x00\xff\xfe garbage")
        .or_panic("writing garbage");
    let mut t = Target::start_config(&toml);
    check(&t, "a corrupt file");
    t.kill();

    // The valid state file of namespace 2, copied over namespace 1's.
    std::fs::remove_file(&refused).or_panic("removing the refused file");
    std::fs::copy(&f2, &f1).or_panic("copying namespace 2's state file");
    let mut t = Target::start_config(&toml);
    check(&t, "namespace 2's file as namespace 1's");

    // Namespace 1's own file, after namespace 1 grew.
    std::fs::remove_file(&refused).or_panic("removing the refused file");
    let mut a = open_as(&t, &A);
    ok(
        reg(io(&mut a), REGISTER | CPTPL_SET, 0, KA),
        "A registers on namespace 1 again",
    );
    assert!(f1.exists(), "no state file {f1:?}");
    drop(a);
    t.kill();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img1)
        .and_then(|f| f.set_len(32 << 20))
        .or_panic("growing namespace 1's file");
    let t = Target::start_config(&toml);
    let lines = check(&t, "namespace 1 resized");
    assert!(
        lines.iter().any(|l| l.to_lowercase().contains("size")),
        "the refusal of a resized namespace's file does not name the size: {lines:?}"
    );
}
