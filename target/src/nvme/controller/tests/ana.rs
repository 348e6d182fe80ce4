//! ANA as controllers report it: Identify, the ANA log page, the ANA
//! Change notice and the path statuses of I/O commands.

use crate::config::{self, AnaState, ListenerConfig, Transport};
use crate::nvme::command::plan;
use crate::nvme::controller::aen::{ANA_CHANGE, ANA_CHANGE_DW0};
use crate::nvme::controller::{Association, Reply};
use crate::nvme::port::Arrival;
use crate::nvme::subsystem::Registry;
use crate::service::ana::{AnaStates, ANACAP, ANATT_SECS};
use crate::testing::*;
use rdmablk_common::fabrics::DISCOVERY_NQN;
use rdmablk_common::nvme::ana::{self, AnaLog};
use rdmablk_common::nvme::identify::{cns, ControllerId, NamespaceId};
use rdmablk_common::nvme::log::{lid, LogRequest};
use rdmablk_common::nvme::{admin, dnr_of, feature, nvm, property, Sgl, Sqe, Status};
use std::sync::Arc;

/// Namespace 1 in ANA group 1, namespace 3 in group 2.
fn two_groups() -> Arc<Registry> {
    let cfg = config::parse(&format!(
        r#"
        [[listener]]
        transport = "tcp"
        address = "127.0.0.1:4420"
        [[subsystem]]
        nqn = "{}"
        allow_any_host = true
        [[subsystem.namespace]]
        backend = "memory"
        size = "1MiB"
        [[subsystem.namespace]]
        nsid = 3
        backend = "null"
        size = "1MiB"
        ana_group = 2
        "#,
        config::DEFAULT_NQN
    ))
    .expect("configuration");
    Arc::new(Registry::open(&cfg, Vec::new()).expect("registry"))
}

/// Arriving through a listener that reports `groups`.
fn through(groups: &[(u32, AnaState)]) -> Arrival {
    let mut l = ListenerConfig::new(Transport::Tcp, "127.0.0.1:4420".parse().unwrap());
    l.ana_groups = groups.iter().copied().collect();
    Arrival {
        ana: Arc::new(AnaStates::new(&l)),
        local: None,
        tls: None,
    }
}

fn data(r: Reply) -> Vec<u8> {
    match assert_ok(r, "command") {
        Reply::Done { data, .. } => data,
        _ => unreachable!(),
    }
}

fn identify(a: &Association, cns: u8, nsid: u32) -> Reply {
    let mut sqe = Sqe::new(admin::IDENTIFY, 1);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, cns as u32);
    a.ctrl.admin(&sqe, &[])
}

fn ana_log(a: &Association, lsp: u8, rae: bool, len: usize, offset: u64) -> Reply {
    let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 2);
    sqe.set_nsid(0xffff_ffff);
    LogRequest {
        lid: lid::ANA,
        lsp,
        rae,
        len,
        offset,
    }
    .to_sqe(&mut sqe);
    a.ctrl.admin(&sqe, &[])
}

/// NVMe Base 2.1, Figure 312 (CMIC bit 3, ANATT, ANACAP, ANAGRPMAX,
/// NANAGRPID, MNAN) and the NVM Command Set's ANAGRPID; the Linux host
/// (nvme_mpath_init_identify) needs MNAN in 1..=NN and the log's
/// largest size within MDTS, or it turns ANA off. Discovery controllers
/// report none of it.
#[test]
fn identify_reports_ana() {
    let reg = two_groups();
    let a = enabled(&reg, 1);
    let id = ControllerId::parse(&data(identify(&a, cns::CONTROLLER, 0)));
    assert_eq!(id.cmic & 1 << 3, 1 << 3, "ANA reporting");
    assert_eq!(id.anatt, ANATT_SECS);
    assert_ne!(id.anatt, 0);
    assert_eq!(id.anacap, ANACAP);
    assert_eq!(id.anacap & 0x1f, 0x1f, "all five states");
    assert_eq!(id.anacap & 1 << 6, 0, "a reload may move a namespace");
    assert_eq!(id.oaes & ANA_CHANGE, ANA_CHANGE);
    assert!(
        id.mnan > 0 && id.mnan <= id.nn,
        "MNAN {} NN {}",
        id.mnan,
        id.nn
    );
    assert!(id.anagrpmax >= id.nanagrpid && id.nanagrpid > 0);
    let largest =
        ana::HEADER_LEN + id.nanagrpid as usize * ana::DESCRIPTOR_LEN + id.mnan as usize * 4;
    assert!(
        largest as u32 <= id.max_transfer().unwrap(),
        "{largest} bytes"
    );
    let ns = |nsid| NamespaceId::parse(&data(identify(&a, cns::NAMESPACE, nsid)));
    assert_eq!((ns(1).anagrpid, ns(3).anagrpid), (1, 2));

    let d = admin_connect(&reg, DISCOVERY_NQN, 0).expect("discovery");
    assert_ok(set_cc(&d, property::CC_EN), "enable");
    let id = ControllerId::parse(&data(identify(&d, cns::CONTROLLER, 0)));
    assert_eq!(id.cmic, 0);
    assert_eq!(
        (id.anatt, id.anacap, id.anagrpmax, id.nanagrpid),
        (0, 0, 0, 0)
    );
    assert_eq!(id.oaes & ANA_CHANGE, 0);
    assert_eq!(
        status(&ana_log(&d, 0, false, 4096, 0)),
        Status::INVALID_LOG_PAGE
    );
}

/// NVMe Base 2.1, 5.1.12.1.13: the change count, a descriptor per group
/// with namespaces, their lists unless RGO (LSP bit 0), and an offset
/// (LPO) into the page.
#[test]
fn ana_log_page() {
    let reg = two_groups();
    let path = through(&[(2, AnaState::NonOptimized)]);
    let a = enabled_through(&reg, 1, &path);
    let full = data(ana_log(&a, 0, false, 8192, 0));
    let log = AnaLog::parse(&full).expect("a log");
    assert_eq!(log.chgcnt, 0);
    let groups: Vec<_> = log
        .groups
        .iter()
        .map(|g| (g.grpid, g.state, g.nsids.clone()))
        .collect();
    assert_eq!(
        groups,
        vec![
            (1, AnaState::Optimized, vec![1]),
            (2, AnaState::NonOptimized, vec![3]),
        ]
    );
    assert_eq!(full.len(), 16 + 2 * 32 + 2 * 4);

    let rgo = data(ana_log(&a, ana::LSP_RGO, false, 8192, 0));
    assert_eq!(rgo.len(), 16 + 2 * 32, "no namespace lists");
    let log = AnaLog::parse(&rgo).expect("a log");
    assert!(log.groups.iter().all(|g| g.nsids.is_empty()));
    assert_eq!(log.groups[1].state, AnaState::NonOptimized);

    let tail = data(ana_log(&a, 0, false, 40, 16));
    assert_eq!(tail, full[16..56], "from offset 16");

    path.ana.set(2, AnaState::Inaccessible);
    let log = AnaLog::parse(&data(ana_log(&a, 0, false, 8192, 0))).expect("a log");
    assert_eq!(log.chgcnt, 1);
    assert_eq!(
        (log.groups[1].chgcnt, log.groups[1].state),
        (1, AnaState::Inaccessible)
    );
    assert_eq!(log.groups[0].chgcnt, 0);
}

/// NVMe Base 2.1, 5.2.2 and Figure 151: Asymmetric Namespace Access
/// Change (Notice, information 03h, log 0Ch), when enabled (Asynchronous
/// Event Configuration bit 11), for a controller of that listener whose
/// subsystem has a namespace in the group; then masked until the host
/// reads the ANA log with RAE clear.
#[test]
fn ana_change_notice_and_its_mask() {
    let reg = two_groups();
    let path = through(&[]);
    let a = enabled_through(&reg, 1, &path);
    let other = enabled_through(&reg, 1, &through(&[]));
    let change = |g: u32, s: AnaState| {
        assert!(path.ana.set(g, s));
        reg.ana_changed(&path.ana, &[g]);
    };
    change(2, AnaState::NonOptimized);
    assert_eq!(a.ctrl.take_event(), None, "not enabled by the host");

    let mut set = Sqe::new(admin::SET_FEATURES, 4);
    set.set_cdw(10, feature::ASYNC_EVENT as u32);
    set.set_cdw(11, ANA_CHANGE);
    for c in [&a, &other] {
        assert_ok(c.ctrl.admin(&set, &[]), "Asynchronous Event Configuration");
    }
    change(7, AnaState::Inaccessible);
    assert_eq!(a.ctrl.take_event(), None, "no namespace in group 7");
    change(2, AnaState::Optimized);
    assert_eq!(a.ctrl.take_event(), Some(ANA_CHANGE_DW0));
    assert_eq!(ANA_CHANGE_DW0, 0x000c_0302);
    assert_eq!(
        other.ctrl.take_event(),
        None,
        "another listener's controller"
    );

    change(2, AnaState::NonOptimized);
    assert_eq!(a.ctrl.take_event(), None, "masked until the log is read");
    assert_ok(ana_log(&a, 0, true, 4096, 0), "read, RAE set");
    change(2, AnaState::Optimized);
    assert_eq!(a.ctrl.take_event(), None, "RAE kept it masked");
    assert_ok(ana_log(&a, ana::LSP_RGO, false, 4096, 0), "read, RAE clear");
    change(2, AnaState::NonOptimized);
    assert_eq!(a.ctrl.take_event(), Some(ANA_CHANGE_DW0), "unmasked");
}

/// NVMe Base 2.1, 8.1.3.3 to 8.1.3.5 and Figure 105: I/O on a namespace
/// whose group is inaccessible, in persistent loss or changing on this
/// path gets SCT 3h SC 02h, 01h or 03h with DNR clear (the host retries
/// on another path); admin commands still work there, so that the host
/// can read the ANA log.
#[test]
fn io_on_an_unusable_group_gets_a_path_status() {
    let reg = two_groups();
    let path = through(&[]);
    let a = enabled_through(&reg, 1, &path);
    let q = io_connect(&reg, &a, 1).expect("I/O queue");
    let io = |opcode: u8, nsid: u32| {
        let mut sqe = Sqe::new(opcode, 9);
        sqe.set_nsid(nsid);
        sqe.set_cdw(12, 7); // 8 blocks
        let len = if opcode == nvm::READ { 4096 } else { 0 };
        sqe.set_sgl(&Sgl::Transport { len });
        plan(Some(&q), &sqe, len, 0).map(|c| c.len)
    };
    assert_eq!(io(nvm::READ, 3), Ok(4096));
    for (state, expected) in [
        (AnaState::Inaccessible, Status::ANA_INACCESSIBLE),
        (AnaState::PersistentLoss, Status::ANA_PERSISTENT_LOSS),
        (AnaState::Change, Status::ANA_TRANSITION),
    ] {
        path.ana.set(2, state);
        for opcode in [nvm::READ, nvm::FLUSH] {
            assert_eq!(io(opcode, 3), Err(expected), "{state}, opcode {opcode}");
        }
        assert_eq!(expected.sct, 3);
        assert!(!dnr_of(expected.to_field(0)), "{expected} leaves DNR clear");
        assert_eq!(io(nvm::READ, 1), Ok(4096), "group 1 stays usable");
        assert_ok(identify(&a, cns::NAMESPACE, 3), "Identify");
        assert_ok(ana_log(&a, 0, false, 4096, 0), "the ANA log");
    }
    path.ana.set(2, AnaState::NonOptimized);
    assert_eq!(io(nvm::READ, 3), Ok(4096), "non-optimized takes I/O");
}
