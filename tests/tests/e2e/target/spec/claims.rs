//! What Identify Controller claims against what the controller answers,
//! both ways (NVMe Base 2.1, 5.1.13.2.1, Figure 312): every log page
//! announced (LPA, OAES, CMIC, ONCS) is served and none other; every
//! command the Commands Supported and Effects log (5.1.12.1.6) marks
//! supported runs, every other opcode is Invalid Opcode (1h); the optional
//! commands OACS and ONCS leave out are refused; FUSES, CTRATT and SGLS
//! claim what the target does. The logs NVMe 2.0 makes mandatory (Supported
//! Log Pages, Feature Identifiers Supported and Effects) against every log
//! page and feature, and the version's other claims: VS, CAP.CRMS and CRTO,
//! Identify CNS 05h to 08h.

use super::*;
use rdmablk_common::bytes::get_u32;

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
            lid::SUPPORTED,
            "Supported Log Pages (LPA bit 5)",
            lpa & 1 << 5 != 0,
        ),
        (
            lid::FEATURES,
            "Feature Identifiers Supported and Effects (LPA bit 5)",
            lpa & 1 << 5 != 0,
        ),
        (
            lid::MI_EFFECTS,
            "NVMe-MI Commands Supported and Effects (LPA bit 5)",
            lpa & 1 << 5 != 0,
        ),
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

/// Sends each of `opcodes` bare on `q` (naming `nsid`): refused with
/// Invalid Opcode exactly when `supported` says it is not.
fn probe_opcodes(
    q: &mut Queue,
    set: &str,
    nsid: u32,
    opcodes: impl Iterator<Item = u8>,
    supported: impl Fn(u8) -> bool,
) {
    for opc in opcodes {
        let done = q
            .exec(bare(opc, nsid), None, 0)
            .or_panic(format_args!("{set} opcode {opc:#04x}"));
        let refused = sct_sc(done.cqe.status()) == sct_sc(Status::INVALID_OPCODE);
        assert_eq!(
            refused,
            !supported(opc),
            "{set} opcode {opc:#04x}: marked supported {}, answered {:?}",
            supported(opc),
            done.cqe.status()
        );
    }
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
    let admin_opcodes = (0..=0xffu8).filter(|&o| o != admin::ASYNC_EVENT && o != FABRICS_OPCODE);
    probe_opcodes(&mut c.admin(), "admin", 0, admin_opcodes, |o| {
        supported(0, o)
    });
    let io_opcodes = (0..=0xffu8).filter(|&o| o != FABRICS_OPCODE);
    probe_opcodes(&mut c.io[0], "I/O", NSID, io_opcodes, |o| {
        supported(1024, o)
    });
    // With LPA bit 5, each supported command has a scope (CSP, bits 31:20).
    if id[LPA] & 1 << 5 != 0 {
        for (base, opc) in (0..=0xffu8)
            .map(|o| (0, o))
            .chain((0..=0xffu8).map(|o| (1024, o)))
            .filter(|&(base, o)| supported(base, o))
        {
            let scope = get_u32(&effects, base + 4 * opc as usize) >> 20;
            assert_ne!(
                scope, 0,
                "opcode {opc:#04x} (at {base}) has no command scope"
            );
        }
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

/// The Supported Log Pages log (NVMe Base 2.0, 5.16.1.1) lists exactly
/// the log pages Get Log Page serves, of all 256; the Feature Identifiers
/// Supported and Effects log (5.16.1.18) exactly the features Get Features
/// answers, each with its scope, of all 256.
#[test]
fn the_supported_logs_and_features_logs_list_what_is_served() {
    let _machine = crate::shared();
    let t = Target::start(&["--memory", "64MiB"]);
    let c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let logs = c
        .admin()
        .get_log(lid::SUPPORTED, 1024, 0)
        .or_panic("Supported Log Pages");
    for l in 0..=0xffu8 {
        let listed = get_u32(&logs, 4 * l as usize) & 1 != 0;
        let done = c
            .admin()
            .exec(Queue::get_log_sqe(l, 512, 0), None, 512)
            .or_panic(format_args!("Get Log Page {l:#04x}"));
        let served = done.cqe.status() == Status::SUCCESS;
        assert_eq!(
            listed,
            served,
            "log page {l:#04x}: listed {listed}, answered {:?}",
            done.cqe.status()
        );
    }

    let features = c
        .admin()
        .get_log(lid::FEATURES, 1024, 0)
        .or_panic("Feature Identifiers Supported and Effects");
    let mut listed_count = 0;
    for fid in 0..=0xffu8 {
        let effects = get_u32(&features, 4 * fid as usize);
        let listed = effects & 1 != 0;
        // Namespace-scoped features (FSP bit 0) name a namespace.
        let nsid = if effects & 1 << 20 != 0 { NSID } else { 0 };
        let mut sqe = Sqe::new(admin::GET_FEATURES, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, fid as u32);
        // The features with data: Host Identifier (extended, 16 bytes)
        // and Host Behavior Support.
        let len = match fid {
            feature::HOST_ID => 16,
            feature::HOST_BEHAVIOR => HBS_LEN as u32,
            _ => 0,
        };
        let done = c
            .admin()
            .exec(sqe, None, len)
            .or_panic(format_args!("Get Features {fid:#04x}"));
        if listed {
            listed_count += 1;
            assert_eq!(
                done.cqe.status(),
                Status::SUCCESS,
                "feature {fid:#04x} listed but not answered"
            );
            assert_ne!(effects >> 20, 0, "feature {fid:#04x} has no scope");
        } else {
            assert_status(
                &done,
                Status::INVALID_FIELD,
                &format!("feature {fid:#04x}, not listed"),
            );
        }
    }
    // Number of Queues, Keep Alive Timer, Async Event Configuration at least.
    assert!(listed_count >= 3, "{listed_count} features listed");
    // No NVMe-MI command is supported over Fabrics.
    let mi = c
        .admin()
        .get_log(lid::MI_EFFECTS, 4096, 0)
        .or_panic("NVMe-MI Commands Supported and Effects");
    assert_zero(&mi, "NVMe-MI Commands Supported and Effects");
}

/// What NVMe 2.0 asks of the controller's registers and Identify (NVMe
/// Base 2.0): VS 2.0 (3.1.4.2); CAP.CRMS.CRWMS set (3.1.4.1) and CRTO.CRWMT
/// at least CAP.TO (3.1.4.21); the NVM command set's Identify Controller
/// data (CNS 06h: Write Zeroes Size Limit), its per-set active namespace
/// list (07h) and namespace data (05h), the command set independent
/// namespace data (08h: ready, shared, ANA group); another command set is
/// an Invalid Field (5.17.1).
#[test]
fn an_nvme_2_0_controller_answers_what_the_version_asks() {
    let _machine = crate::shared();
    let t = Target::start(&["--memory", "64MiB"]);
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &quiet_opts());
    let mut a = c.admin();
    let vs = a.prop_get(property::VS, false).or_panic("Property Get VS");
    assert_eq!(vs, 0x0002_0000, "VS {vs:#x}");
    let id = a.identify(cns::CONTROLLER, 0).or_panic("Identify");
    assert_eq!(get_u32(&id, 80), 0x0002_0000, "Identify VER");
    let cap = a.prop_get(property::CAP, true).or_panic("Property Get CAP");
    assert_ne!(cap & 1 << 59, 0, "CAP.CRMS.CRWMS clear: {cap:#x}");
    let crto = a
        .prop_get(property::CRTO, false)
        .or_panic("Property Get CRTO");
    assert!(
        crto & 0xffff >= (cap >> 24) & 0xff,
        "CRTO.CRWMT {} below CAP.TO {}",
        crto & 0xffff,
        (cap >> 24) & 0xff
    );

    let csi = |cns: u8, nsid: u32, csi: u8| {
        let mut sqe = Queue::identify_sqe(cns, nsid);
        sqe.set_cdw(11, (csi as u32) << 24);
        sqe
    };
    let nvm = a
        .exec(csi(cns::CS_CONTROLLER, 0, 0), None, 4096)
        .or_panic("Identify CNS 06h")
        .check("Identify CNS 06h")
        .or_panic("Identify CNS 06h");
    let limits = NvmControllerId::parse(&nvm.data);
    // 4 KiB << WZSL: at most 65,536 blocks of 512 bytes, the most one
    // Write Zeroes can name.
    assert!(
        limits.wzsl > 0 && 4096u64 << limits.wzsl <= 65_536 * 512,
        "WZSL {}",
        limits.wzsl
    );

    let list = a.identify(cns::ACTIVE_NS_LIST, 0).or_panic("CNS 02h");
    let per_set = a
        .exec(csi(cns::CS_ACTIVE_NS_LIST, 0, 0), None, 4096)
        .or_panic("CNS 07h");
    assert_status(&per_set, Status::SUCCESS, "CNS 07h, NVM");
    assert_same(&per_set.data, &list, "the NVM set's active namespaces");

    let ns = a
        .exec(csi(cns::CS_NAMESPACE, NSID, 0), None, 4096)
        .or_panic("CNS 05h");
    assert_status(&ns, Status::SUCCESS, "CNS 05h of namespace 1");
    assert_zero(&ns.data, "no storage tags or protection information");

    let indep =
        IndependentNamespaceId::parse(&a.identify(cns::INDEPENDENT_NS, NSID).or_panic("CNS 08h"));
    let plain = NamespaceId::parse(&a.identify(cns::NAMESPACE, NSID).or_panic("CNS 00h"));
    assert_eq!(indep.nstat & 1, 1, "namespace 1 not ready: {indep:?}");
    assert_eq!(
        (indep.nmic, indep.rescap, indep.anagrpid, indep.nsattr),
        (plain.nmic, plain.rescap, plain.anagrpid, plain.nsattr),
        "CNS 08h against CNS 00h"
    );
    // An inactive nsid reads zeroes; FFFFFFFFh is no namespace.
    assert_zero(
        &a.identify(cns::INDEPENDENT_NS, 7)
            .or_panic("CNS 08h of nsid 7"),
        "nsid 7",
    );
    let all = a
        .exec(
            Queue::identify_sqe(cns::INDEPENDENT_NS, u32::MAX),
            None,
            4096,
        )
        .or_panic("CNS 08h of FFFFFFFFh");
    assert_status(&all, Status::INVALID_NAMESPACE, "CNS 08h of nsid FFFFFFFFh");

    // Key Value (CSI 01h) is not a command set of this controller.
    for cns in [
        cns::CS_NAMESPACE,
        cns::CS_CONTROLLER,
        cns::CS_ACTIVE_NS_LIST,
    ] {
        let done = a
            .exec(csi(cns, NSID, 1), None, 4096)
            .or_panic(format_args!("CNS {cns:#04x}, CSI 1"));
        assert_status(
            &done,
            Status::INVALID_FIELD,
            &format!("CNS {cns:#04x} of CSI 1"),
        );
    }
    drop(a);
    let zeroes = (4096usize << limits.wzsl) / 512;
    let done = c.io[0]
        .exec(
            Queue::rw_sqe(nvm::WRITE_ZEROES, NSID, 0, zeroes as u32),
            None,
            0,
        )
        .or_panic("Write Zeroes of WZSL");
    assert_status(&done, Status::SUCCESS, "a Write Zeroes of the size limit");
}
