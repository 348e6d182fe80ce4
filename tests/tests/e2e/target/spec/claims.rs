//! What Identify Controller claims against what the controller answers,
//! both ways (NVMe Base 2.1, 5.1.13.2.1, Figure 312): every log page
//! announced (LPA, OAES, CMIC, ONCS) is served and none other; every
//! command the Commands Supported and Effects log (5.1.12.1.6) marks
//! supported runs, every other opcode is Invalid Opcode (1h); the optional
//! commands OACS and ONCS leave out are refused; FUSES, CTRATT and SGLS
//! claim what the target does.

use super::*;

/// Byte offsets in the Identify Controller data structure (Figure 312).
const CMIC: usize = 76;
const OAES: usize = 92;
const CTRATT: usize = 96;
const OACS: usize = 256;
const LPA: usize = 261;
const ONCS: usize = 520;
const FUSES: usize = 522;
const SGLS: usize = 536;

/// Log pages (Figure 202) and what announces each (`None`: mandatory).
fn log_pages(id: &[u8]) -> Vec<(u8, &'static str, bool)> {
    let lpa = id[LPA];
    let oaes = get_u32(id, OAES);
    vec![
        (lid::ERROR, "Error Information (mandatory)", true),
        (lid::SMART, "SMART / Health Information (mandatory)", true),
        (lid::FW_SLOT, "Firmware Slot Information (mandatory)", true),
        (
            lid::CHANGED_NS,
            "Changed Namespace List (OAES bit 8)",
            oaes & 1 << 8 != 0,
        ),
        (
            lid::CMD_EFFECTS,
            "Commands Supported and Effects (LPA bit 1)",
            lpa & 1 << 1 != 0,
        ),
        (
            0x07,
            "Telemetry Host-Initiated (LPA bit 3)",
            lpa & 1 << 3 != 0,
        ),
        (
            0x08,
            "Telemetry Controller-Initiated (LPA bit 3)",
            lpa & 1 << 3 != 0,
        ),
        (0x0d, "Persistent Event Log (LPA bit 4)", lpa & 1 << 4 != 0),
        (
            lid::ANA,
            "Asymmetric Namespace Access (CMIC bit 3)",
            id[CMIC] & 1 << 3 != 0,
        ),
        (
            lid::RESERVATION,
            "Reservation Notification (ONCS bit 5)",
            get_u16(id, ONCS) & 1 << 5 != 0,
        ),
    ]
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// A command with opcode `opc`, no data and nothing else but `nsid`: what
/// it would touch (Write Zeroes: block 0 of a fresh namespace) harms
/// nothing, the others want data they do not get.
fn bare(opc: u8, nsid: u32) -> Sqe {
    let mut sqe = Sqe::new(opc, 0);
    sqe.set_nsid(nsid);
    sqe
}

#[test]
fn identify_claims_what_the_controller_answers_and_nothing_more() {
    let _machine = crate::shared();
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let id = c.admin().identify(cns::CONTROLLER, 0).or_panic("Identify");

    // Log pages: announced ones are served, the others Invalid Log Page.
    for (lid, name, announced) in log_pages(&id) {
        let done = c
            .admin()
            .exec(Queue::get_log_sqe(lid, 512, 0), None, 512)
            .or_panic(format_args!("Get Log Page {lid:#04x}"));
        let want = if announced {
            Status::SUCCESS
        } else {
            Status::INVALID_LOG_PAGE
        };
        assert_status(&done, want, &format!("log page {lid:#04x}, {name}"));
    }
    // SMART per namespace only where LPA bit 0 says so (5.1.12.1.3).
    let mut smart = Queue::get_log_sqe(lid::SMART, 512, 0);
    smart.set_nsid(NSID);
    let done = c.admin().exec(smart, None, 512).or_panic("SMART of NSID 1");
    let want = if id[LPA] & 1 != 0 {
        Status::SUCCESS
    } else {
        Status::INVALID_FIELD
    };
    assert_status(&done, want, "SMART / Health Information of one namespace");

    // The effects log, opcode by opcode, both ways. Asynchronous Event
    // Request stays outstanding when it works: it is checked by marking.
    let effects = c
        .admin()
        .get_log(lid::CMD_EFFECTS, 4096, 0)
        .or_panic("Commands Supported and Effects");
    let supported = |base: usize, opc: u8| get_u32(&effects, base + 4 * opc as usize) & 1 != 0;
    for opc in [
        admin::GET_LOG_PAGE,
        admin::IDENTIFY,
        admin::ABORT,
        admin::SET_FEATURES,
        admin::GET_FEATURES,
        admin::ASYNC_EVENT,
        admin::KEEP_ALIVE,
        FABRICS_OPCODE,
    ] {
        assert!(
            supported(0, opc),
            "admin opcode {opc:#04x} not marked supported"
        );
    }
    for opc in (0..=0xffu8).filter(|&o| o != admin::ASYNC_EVENT && o != FABRICS_OPCODE) {
        let done = c
            .admin()
            .exec(bare(opc, 0), None, 0)
            .or_panic(format_args!("admin opcode {opc:#04x}"));
        let refused = sct_sc(done.cqe.status()) == sct_sc(Status::INVALID_OPCODE);
        assert_eq!(
            refused,
            !supported(0, opc),
            "admin opcode {opc:#04x}: marked supported {}, answered {:?}",
            supported(0, opc),
            done.cqe.status()
        );
    }
    for opc in (0..=0xffu8).filter(|&o| o != FABRICS_OPCODE) {
        let done = c.io[0]
            .exec(bare(opc, NSID), None, 0)
            .or_panic(format_args!("I/O opcode {opc:#04x}"));
        let refused = sct_sc(done.cqe.status()) == sct_sc(Status::INVALID_OPCODE);
        assert_eq!(
            refused,
            !supported(1024, opc),
            "I/O opcode {opc:#04x}: marked supported {}, answered {:?}",
            supported(1024, opc),
            done.cqe.status()
        );
    }

    // OACS: none of the optional admin commands (security, format,
    // firmware, namespace management, self-test, directives, ...): each
    // bit claimed needs its opcode marked supported.
    let oacs = get_u16(&id, OACS);
    for (bit, opc) in [
        (0, 0x81u8),
        (1, 0x80),
        (2, 0x10),
        (3, 0x0d),
        (4, 0x14),
        (5, 0x19),
    ] {
        assert_eq!(
            oacs & 1 << bit != 0,
            supported(0, opc),
            "OACS bit {bit} against admin opcode {opc:#04x}"
        );
    }
    // ONCS bits against their I/O commands.
    let oncs = get_u16(&id, ONCS);
    for (bit, opc) in [
        (0, nvm::COMPARE),
        (1, 0x04u8),
        (2, nvm::DSM),
        (3, nvm::WRITE_ZEROES),
        (5, nvm::RESV_REGISTER),
        (7, 0x0c),
        (8, 0x19),
    ] {
        assert_eq!(
            oncs & 1 << bit != 0,
            supported(1024, opc),
            "ONCS bit {bit} against I/O opcode {opc:#04x}"
        );
    }
    // FUSES bit 0: Compare and Write, with Compare supported.
    assert_eq!(get_u16(&id, FUSES) & 1 != 0, supported(1024, nvm::COMPARE));
    // CTRATT: 128-bit host identifiers (Connect carries them, Reservation
    // Report's extended structure returns them), nothing else claimed.
    assert_eq!(get_u32(&id, CTRATT), 1, "CTRATT");
    // SGLS: SGLs supported (bits 1:0 = 01b), no keyed SGLs over TCP.
    let sgls = get_u32(&id, SGLS);
    assert_eq!(sgls & 3, 1, "SGLS {sgls:#x}");
    assert_eq!(
        sgls & 1 << 2,
        0,
        "keyed SGL data blocks over TCP: {sgls:#x}"
    );
}
