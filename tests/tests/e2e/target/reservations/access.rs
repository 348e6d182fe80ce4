//! What each reservation type lets the holder, the other registrants and
//! everyone else do, and what Identify says of reservations.

use super::*;

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
    let oncs = get_u16(&id, 520);
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
    let oncs = get_u16(&id, 520);
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
