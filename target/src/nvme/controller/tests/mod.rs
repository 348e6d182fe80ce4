//! The controller's rules, exercised without a transport: Connect, enable,
//! reset, Disconnect, features, log pages and the admission limits, each
//! naming the section it checks.

use super::*;
use crate::config::{self, Limits};
use crate::testing::*;
use rdmablk_common::fabrics::{fctype, PropertyCmd};
use rdmablk_common::nvme::log::{lid, LogRequest};
use rdmablk_common::nvme::HOST_BEHAVIOR_LEN;
use rdmablk_common::nvme::{admin, dnr_of, feature, property, Sqe, FABRICS_OPCODE};

mod ana;

/// NVMe Base 2.1, 3.7.2: CC.EN 1 -> 0 deletes the I/O queues; their ids
/// connect again once the controller is enabled, and the old queue's end
/// does not free the new one's id.
#[test]
fn reset_deletes_io_queues_and_frees_their_ids() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 2);
    let old = io_connect(&reg, &a, 1).expect("I/O queue 1");
    assert!(!old.is_deleted());
    assert_eq!(
        io_connect(&reg, &a, 1).err().map(|r| r.status),
        Some(Status::COMMAND_SEQUENCE_ERROR),
        "a connected qid cannot connect twice"
    );
    assert_ok(set_cc(&a, 0), "CC.EN = 0");
    assert!(old.is_deleted(), "the reset deleted I/O queue 1");
    assert!(
        a.ctrl.enable_overdue(Duration::ZERO),
        "waiting for CC.EN again"
    );
    assert_eq!(
        io_connect(&reg, &a, 1).err().map(|r| r.status),
        Some(Status::COMMAND_SEQUENCE_ERROR),
        "no I/O queue connects while the controller is disabled"
    );
    assert_ok(set_cc(&a, CC_ENABLE), "CC.EN = 1 again");
    let new = io_connect(&reg, &a, 1).expect("qid 1 after the reset");
    a.ctrl.release(&old);
    assert_eq!(
        io_connect(&reg, &a, 1).err().map(|r| r.status),
        Some(Status::COMMAND_SEQUENCE_ERROR),
        "the deleted queue's end leaves the new qid 1 connected"
    );
    drop(new);
}

/// NVMe Base 2.1, 3.6: CC.SHN = 01b completes at once (CSTS.SHST = 10b) and
/// leaves the controller not ready.
#[test]
fn shutdown_reports_complete() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 1);
    assert_ok(
        set_cc(&a, CC_ENABLE | 1 << property::CC_SHN_SHIFT),
        "CC.SHN",
    );
    let get = PropertyCmd {
        wide: false,
        offset: property::CSTS,
        value: 0,
    }
    .to_sqe(4, false);
    let Reply::Done { dw0, .. } = a.ctrl.fabrics(&get, 0) else {
        panic!("Property Get held")
    };
    assert_eq!(
        dw0 & (3 << property::CSTS_SHST_SHIFT),
        property::CSTS_SHST_COMPLETE
    );
    assert_eq!(dw0 & property::CSTS_RDY, 0);
}

/// NVMe Base 2.1, 6.4: Disconnect on the admin queue is an Invalid Queue
/// Type; on an I/O queue it succeeds. Figure 541 note 3: Property Get on an
/// I/O queue is an Invalid Field.
#[test]
fn disconnect_and_fabrics_commands_by_queue() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 1);
    let mut disconnect = Sqe::new(FABRICS_OPCODE, 5);
    disconnect.0[4] = fctype::DISCONNECT;
    assert_eq!(
        status(&a.ctrl.fabrics(&disconnect, 0)),
        Status::INVALID_QUEUE_TYPE
    );
    assert_eq!(status(&a.ctrl.fabrics(&disconnect, 1)), Status::SUCCESS);
    let get = PropertyCmd {
        wide: false,
        offset: property::CSTS,
        value: 0,
    }
    .to_sqe(6, false);
    assert_eq!(status(&a.ctrl.fabrics(&get, 1)), Status::INVALID_FIELD);
}

/// NVMe Base 2.1, Number of Queues feature: only before I/O queues exist,
/// afterwards a Command Sequence Error.
#[test]
fn number_of_queues_only_before_io_queues() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 2);
    let q = io_connect(&reg, &a, 1).expect("I/O queue 1");
    let mut sqe = Sqe::new(admin::SET_FEATURES, 7);
    sqe.set_cdw(10, feature::NUM_QUEUES as u32);
    sqe.set_cdw(11, 0x0003_0003);
    assert_eq!(
        status(&a.ctrl.admin(&sqe, &[])),
        Status::COMMAND_SEQUENCE_ERROR
    );
    a.ctrl.release(&q);
    assert_eq!(status(&a.ctrl.admin(&sqe, &[])), Status::SUCCESS);
}

/// NVMe Base 2.1, 4.2.3 (CRD) and Host Behavior Support (FID 16h): once the
/// host sets ACRE, retryable statuses name CRDT1 (Namespace Not Ready,
/// CRDT2); never before, never for a status with DNR.
#[test]
fn acre_turns_on_the_command_retry_delay() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 1);
    assert_eq!(a.ctrl.crd(Status::TRANSIENT_TRANSPORT_ERROR), 0);
    let mut set = Sqe::new(admin::SET_FEATURES, 8);
    set.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    let mut data = vec![0u8; HOST_BEHAVIOR_LEN];
    data[0] = 2;
    assert_eq!(
        status(&a.ctrl.admin(&set, &data)),
        Status::INVALID_FIELD,
        "ACRE 2"
    );
    data[0] = 1;
    assert_ok(a.ctrl.admin(&set, &data), "ACRE 1");
    assert_eq!(a.ctrl.crd(Status::TRANSIENT_TRANSPORT_ERROR), 1);
    assert_eq!(a.ctrl.crd(Status::NAMESPACE_NOT_READY), 2);
    assert_eq!(a.ctrl.crd(Status::LBA_OUT_OF_RANGE), 0);
    let mut get = Sqe::new(admin::GET_FEATURES, 9);
    get.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    let Reply::Done { data, .. } = assert_ok(a.ctrl.admin(&get, &[]), "Get HBS") else {
        unreachable!()
    };
    assert_eq!((data.len(), data[0]), (HOST_BEHAVIOR_LEN, 1));
    // A reset clears the feature with the rest of the controller's state.
    assert_ok(set_cc(&a, 0), "CC.EN = 0");
    assert_eq!(a.ctrl.crd(Status::TRANSIENT_TRANSPORT_ERROR), 0);
}

/// NVMe Base 2.1, 5.1.12 Figure 199: an offset past the log, or not dword
/// aligned, is an Invalid Field; at the end exactly, zeroes.
#[test]
fn log_page_offsets() {
    let reg = registry(Limits::default());
    let a = enabled(&reg, 1);
    let get = |offset: u64, len: usize| {
        let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 10);
        LogRequest {
            lid: lid::SMART,
            lsp: 0,
            rae: false,
            len,
            offset,
        }
        .to_sqe(&mut sqe);
        a.ctrl.admin(&sqe, &[])
    };
    assert_eq!(status(&get(516, 4)), Status::INVALID_FIELD, "past the end");
    assert_eq!(
        status(&get(2, 4)),
        Status::INVALID_FIELD,
        "not dword aligned"
    );
    let Reply::Done { data, .. } = assert_ok(get(512, 4), "at the end") else {
        unreachable!()
    };
    assert!(
        data.is_empty(),
        "nothing of the log; the transport pads zeroes"
    );
    let Reply::Done { data, .. } = assert_ok(get(0, 8192), "past the end in length") else {
        unreachable!()
    };
    assert_eq!(data.len(), 512, "the log, then the transport's zeroes");
}

/// A discovery controller whose host asked for KATO 0 gets
/// `limits.discovery_keep_alive` (as nvmet's 120 s); an I/O controller keeps 0.
#[test]
fn discovery_keep_alive_default() {
    let reg = registry(Limits::default());
    let d = admin_connect(&reg, rdmablk_common::fabrics::DISCOVERY_NQN, 0).expect("discovery");
    let mut get = Sqe::new(admin::GET_FEATURES, 11);
    get.set_cdw(10, feature::KEEP_ALIVE as u32);
    assert_ok(set_cc(&d, property::CC_EN), "enable");
    let Reply::Done { dw0, .. } = d.ctrl.admin(&get, &[]) else {
        panic!("held")
    };
    assert_eq!(dw0, 120_000);
    let io = admin_connect(&reg, config::DEFAULT_NQN, 0).expect("I/O controller");
    assert_ok(set_cc(&io, CC_ENABLE), "enable");
    let Reply::Done { dw0, .. } = io.ctrl.admin(&get, &[]) else {
        panic!("held")
    };
    assert_eq!(dw0, 0);
}

/// NVMe Base 2.1, Figure 105: past `limits.connections` or
/// `limits.associations_per_host`, Connect answers Controller Busy, which
/// hosts retry (DNR clear); the places come back when queues go.
#[test]
fn limits_answer_controller_busy() {
    let reg = registry(Limits {
        connections: 2,
        associations_per_host: 1,
        ..Limits::default()
    });
    let other_host = |reg: &Arc<Registry>| {
        connect(
            reg,
            &connect_sqe(0, 0, 5000),
            &connect_data(config::DEFAULT_NQN, "nqn.2026-11.io.rdmablk:other", 0xffff),
            CAPS,
            &arrival(),
        )
    };
    let a = enabled(&reg, 1);
    let again = admin_connect(&reg, config::DEFAULT_NQN, 5000)
        .err()
        .expect("refused");
    assert_eq!(again.status, Status::CONTROLLER_BUSY, "{}", again.reason);
    assert!(
        again.reason.contains("associations_per_host"),
        "{}",
        again.reason
    );
    assert!(
        !dnr_of(again.status.to_field(0)),
        "Controller Busy leaves DNR clear"
    );
    let q = io_connect(&reg, &a, 1).expect("I/O queue: the second place");
    let full = other_host(&reg).err().expect("refused");
    assert_eq!(full.status, Status::CONTROLLER_BUSY, "{}", full.reason);
    assert!(
        full.reason.contains("limits.connections"),
        "{}",
        full.reason
    );
    drop(q);
    assert!(other_host(&reg).is_ok(), "the I/O queue's place came back");
}
