//! Fixtures for unit tests of the controller and of commands: a registry
//! with a memory namespace, Connects, an enabled controller.

use crate::config::{self, Limits, QuickArgs};
use crate::controller::{connect, Association, Refusal, Reply, TransportCaps};
use crate::subsystem::Registry;
use rdmablk_common::fabrics::{ConnectCmd, ConnectData, PropertyCmd};
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::{admin, feature, property, Sgl, Sqe, Status};
use std::sync::Arc;

pub const HOST: &str = "nqn.2026-11.io.rdmablk:unit-host";
pub const CAPS: TransportCaps = TransportCaps {
    mdts: 8,
    max_queue_entries: 128,
    in_capsule_data: 8192,
    sgls: sgls::SUPPORTED | sgls::TRANSPORT | sgls::OFFSET,
};

/// A registry with one 16 MiB memory namespace any host may use.
pub fn registry(limits: Limits) -> Arc<Registry> {
    let mut cfg = config::from_quick_args(&QuickArgs {
        memory: Some("16MiB".into()),
        ..QuickArgs::default()
    })
    .expect("quick form");
    cfg.limits = limits;
    Arc::new(Registry::open(&cfg).expect("registry"))
}

pub fn connect_sqe(qid: u16, cattr: u8, kato: u32) -> Sqe {
    ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr,
        kato,
    }
    .to_sqe(
        1,
        &Sgl::InCapsule {
            offset: 0,
            len: 1024,
        },
    )
}

pub fn connect_data(subnqn: &str, host: &str, cntlid: u16) -> Vec<u8> {
    ConnectData {
        hostid: [7; 16],
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: host.into(),
    }
    .encode()
}

pub fn admin_connect(reg: &Arc<Registry>, subnqn: &str, kato: u32) -> Result<Association, Refusal> {
    connect(
        reg,
        &connect_sqe(0, 0, kato),
        &connect_data(subnqn, HOST, 0xffff),
        CAPS,
        None,
    )
}

pub fn io_connect(reg: &Arc<Registry>, a: &Association, qid: u16) -> Result<Association, Refusal> {
    connect(
        reg,
        &connect_sqe(qid, 0, 0),
        &connect_data(&a.ctrl.subsys.nqn, HOST, a.ctrl.cntlid),
        CAPS,
        None,
    )
}

pub fn set_cc(a: &Association, cc: u32) -> Reply {
    let sqe = PropertyCmd {
        wide: false,
        offset: property::CC,
        value: cc as u64,
    }
    .to_sqe(2, true);
    a.ctrl.fabrics(&sqe, 0)
}

pub const CC_ENABLE: u32 = property::CC_EN | 6 << 16 | 4 << 20;

/// An enabled controller of the I/O subsystem with `n` I/O queues granted.
pub fn enabled(reg: &Arc<Registry>, n: u16) -> Association {
    let a = admin_connect(reg, config::DEFAULT_NQN, 5000).expect("admin Connect");
    assert_ok(set_cc(&a, CC_ENABLE), "CC.EN = 1");
    let mut sqe = Sqe::new(admin::SET_FEATURES, 3);
    sqe.set_cdw(10, feature::NUM_QUEUES as u32);
    sqe.set_cdw(11, (n as u32 - 1) * 0x1_0001);
    assert_ok(a.ctrl.admin(&sqe, &[]), "Number of Queues");
    a
}

pub fn status(r: &Reply) -> Status {
    match r {
        Reply::Done { status, .. } => *status,
        Reply::Held => panic!("a held reply"),
    }
}

pub fn assert_ok(r: Reply, what: &str) -> Reply {
    assert_eq!(status(&r), Status::SUCCESS, "{what}");
    r
}
