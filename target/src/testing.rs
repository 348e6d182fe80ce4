//! Fixtures for unit tests of the controller, of commands and of queues: a
//! registry with a memory namespace, Connects, an enabled controller, and
//! what a queue needs of its poller without a ring.

use crate::base::admission::Permit;
use crate::base::budget::PollerBudget;
use crate::base::completions::Completions;
use crate::config::{self, Limits, ListenerConfig, QuickArgs};
use crate::engine::poller::Io;
use crate::nvme::controller::{connect, Association, Refusal, Reply};
use crate::nvme::fabric::TransportCaps;
use crate::nvme::port::Arrival;
use crate::nvme::subsystem::Registry;
use crate::service::ana::AnaStates;
use io_uring::squeue;
use rdmablk_common::fabrics::{ConnectCmd, ConnectData, PropertyCmd};
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::{admin, feature, property, Sgl, Sqe, Status};
use rdmablk_common::ring::{Submissions, Wakeup};
use std::sync::Arc;

pub const HOST: &str = "nqn.2026-11.io.rdmablk:unit-host";
pub const CAPS: TransportCaps = TransportCaps {
    mdts: 8,
    max_queue_entries: 128,
    in_capsule_data: 8192,
    sgls: sgls::SUPPORTED | sgls::TRANSPORT | sgls::OFFSET,
    transport: "tcp",
};

/// A registry with one 16 MiB memory namespace any host may use.
pub fn registry(limits: Limits) -> Arc<Registry> {
    let mut cfg = config::from_quick_args(&QuickArgs {
        memory: Some("16MiB".into()),
        ..QuickArgs::default()
    })
    .expect("quick form");
    cfg.limits = limits;
    Arc::new(Registry::open(&cfg, Vec::new()).expect("registry"))
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

/// Arriving through a TCP listener whose ANA groups are all optimized.
pub fn arrival() -> Arrival {
    let l = ListenerConfig::new(config::Transport::Tcp, "127.0.0.1:4420".parse().unwrap());
    Arrival {
        ana: Arc::new(AnaStates::new(&l)),
        local: None,
        tls: None,
    }
}

pub fn admin_connect(reg: &Arc<Registry>, subnqn: &str, kato: u32) -> Result<Association, Refusal> {
    admin_connect_through(reg, subnqn, kato, &arrival())
}

/// An admin Connect that arrived through `arrival`.
pub fn admin_connect_through(
    reg: &Arc<Registry>,
    subnqn: &str,
    kato: u32,
    arrival: &Arrival,
) -> Result<Association, Refusal> {
    connect(
        reg,
        &connect_sqe(0, 0, kato),
        &connect_data(subnqn, HOST, 0xffff),
        CAPS,
        arrival,
    )
}

pub fn io_connect(reg: &Arc<Registry>, a: &Association, qid: u16) -> Result<Association, Refusal> {
    connect(
        reg,
        &connect_sqe(qid, 0, 0),
        &connect_data(&a.ctrl.subsys.nqn, HOST, a.ctrl.cntlid),
        CAPS,
        &arrival(),
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
    enabled_through(reg, n, &arrival())
}

/// An enabled controller, arrived through `arrival`, with `n` I/O queues.
pub fn enabled_through(reg: &Arc<Registry>, n: u16, arrival: &Arrival) -> Association {
    let a = admin_connect_through(reg, config::DEFAULT_NQN, 5000, arrival).expect("admin Connect");
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
        Reply::After(_) => panic!("a reply after work off the poller"),
        Reply::Persist(_) => panic!("a reply after a state file write"),
    }
}

pub fn assert_ok(r: Reply, what: &str) -> Reply {
    assert_eq!(status(&r), Status::SUCCESS, "{what}");
    r
}

/// What a queue needs of its poller, for tests without a ring: an arena,
/// budgets, and the operations it would submit.
pub struct Rig {
    pub registry: Arc<Registry>,
    pub arena: Arena,
    pub budget: PollerBudget,
    /// I/O commands answered through [`Rig::io`].
    pub answered: u64,
    /// Socket sends made through [`Rig::io`].
    pub sends: u64,
    pub submitted: Vec<squeue::Entry>,
    /// Off-ring completions (none: rigs have no RBD namespace).
    pub completions: Arc<Completions>,
    /// When a held command may go next.
    pub wake_at: Option<std::time::Instant>,
}

impl Rig {
    /// A rig with a 16 MiB memory namespace and `limits`.
    pub fn new(limits: Limits) -> Rig {
        Rig::with_registry(registry(limits))
    }

    /// A rig serving `registry`.
    pub fn with_registry(registry: Arc<Registry>) -> Rig {
        let discovery = registry.admission.limits.discovery_buffer as usize;
        Rig {
            registry,
            arena: Arena::new(16 << 20, false).expect("arena"),
            budget: PollerBudget::new(discovery),
            answered: 0,
            sends: 0,
            submitted: Vec::new(),
            completions: Completions::new(Wakeup::new().expect("eventfd")),
            wake_at: None,
        }
    }

    pub fn io(&mut self) -> Io<'_> {
        Io {
            arena: &mut self.arena,
            budget: &mut self.budget,
            sq: Submissions::new(&mut self.submitted),
            registry: &self.registry,
            stopping: false,
            answered: &mut self.answered,
            sends: &mut self.sends,
            poller: 0,
            completions: &self.completions,
            wake_at: &mut self.wake_at,
            qos_release_due: true,
        }
    }

    /// A place among connections waiting for their Connect.
    pub fn pending(&self) -> Permit {
        self.registry
            .admission
            .pending_connection(&"unit")
            .expect("a pending place")
    }

    /// An arena buffer holding `data` (in-capsule data as a receive left it).
    pub fn buffer(&mut self, data: &[u8]) -> ArenaBuf {
        let b = self.arena.alloc(data.len().max(1)).expect("arena space");
        self.arena.write(&b, 0, data);
        b
    }
}
