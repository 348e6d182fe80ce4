//! Asymmetric Namespace Access against a running daemon with two listeners
//! (NVMe Base 2.1, 8.1.3): each listener reports its own states, in Identify
//! and in the ANA log page; I/O through a listener where its namespace's
//! group is not usable gets the path status with DNR clear while the other
//! listener serves it; `rdmablk-target ana set` changes one listener's
//! state, with the ANA Change notice; `status` shows the states; a reload
//! applies the file again.

use rdmablk_common::nvme::ana::{AnaLog, AnaState};
use rdmablk_common::nvme::identify::{cns, NamespaceId};
use rdmablk_common::nvme::log::lid;
use rdmablk_common::nvme::{dnr_of, feature, nvm, Status};
use rdmablk_tests::check::{assert_status, OrPanic};
use rdmablk_tests::client::{quiet, Controller, Queue};
use rdmablk_tests::control::ControlledTarget;
use rdmablk_tests::events::{submit_aer, AEC_ANA_CHANGE};
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A};
use rdmablk_tests::Rng;
use std::net::SocketAddr;

/// Asymmetric Namespace Access Change: Notice, information 03h, log 0Ch
/// (NVMe Base 2.1, Figure 151).
const ANA_CHANGED: u32 = 0x000c_0302;

/// Two listeners (the test's port and `second`) reporting `first_groups`
/// and `second_groups`; namespace 1 in ANA group 1, namespace 2 in group 2.
fn config(second: u16, first_groups: &str, second_groups: &str) -> String {
    format!(
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\
         ana_groups = {{ {first_groups} }}\n\
         [[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{second}\"\n\
         ana_groups = {{ {second_groups} }}\n\
         [[subsystem]]\nnqn = \"{DEFAULT_NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nbackend = \"memory\"\nsize = \"8MiB\"\n\
         [[subsystem.namespace]]\nbackend = \"memory\"\nsize = \"8MiB\"\nana_group = 2\n"
    )
}

/// The ANA log page the controller reads, (group, state, namespaces) each.
fn ana_groups(c: &Controller) -> Vec<(u32, AnaState, Vec<u32>)> {
    let page = c.admin().get_log(lid::ANA, 4096, 0).or_panic("ANA log");
    let log = AnaLog::parse(&page).expect("an ANA log page");
    log.groups
        .into_iter()
        .map(|g| (g.grpid, g.state, g.nsids))
        .collect()
}

fn read(q: &mut Queue, nsid: u32) -> Status {
    let done = q
        .exec(Queue::rw_sqe(nvm::READ, nsid, 0, 8), None, 4096)
        .or_panic("read");
    let status = done.cqe.status();
    if !status.is_success() {
        assert!(
            !dnr_of(done.cqe.status),
            "{status}: a path status leaves DNR clear (NVMe Base 2.1, 8.1.3)"
        );
    }
    status
}

#[test]
fn listeners_report_their_own_ana_states() {
    let _machine = crate::shared();
    let second = rdmablk_tests::free_port();
    let file = |a: &str, b: &str| config(second, a, b);
    let d = ControlledTarget::start(&file(
        "1 = \"optimized\", 2 = \"non-optimized\"",
        "1 = \"inaccessible\", 2 = \"optimized\"",
    ));
    let at: SocketAddr = format!("127.0.0.1:{second}").parse().expect("address");
    let mut a = Controller::open(d.t.addr(), DEFAULT_NQN, HOST_A, &quiet()).or_panic("first");
    let mut b = Controller::open(at, DEFAULT_NQN, HOST_A, &quiet()).or_panic("second");
    assert_eq!(a.id.cmic & 1 << 3, 1 << 3, "CMIC: ANA reporting");
    assert_eq!(a.id.oaes & AEC_ANA_CHANGE, AEC_ANA_CHANGE);
    let ns2 = NamespaceId::parse(&a.admin().identify(cns::NAMESPACE, 2).or_panic("identify"));
    assert_eq!(ns2.anagrpid, 2);
    use AnaState::*;
    assert_eq!(
        ana_groups(&a),
        vec![(1, Optimized, vec![1]), (2, NonOptimized, vec![2])]
    );
    assert_eq!(
        ana_groups(&b),
        vec![(1, Inaccessible, vec![1]), (2, Optimized, vec![2])]
    );

    // The same namespace, two paths: one serves, the other sends the host
    // elsewhere (SCT 3h, SC 02h, DNR clear).
    let data = Rng::new(25).bytes(4096);
    a.io[0]
        .write(1, 0, &data, 512, false)
        .or_panic("write on the first");
    assert_eq!(read(&mut b.io[0], 1), Status::ANA_INACCESSIBLE);
    assert_eq!(read(&mut b.io[0], 2), Status::SUCCESS);
    assert!(a.io[0].read(1, 0, 8, 512).or_panic("read") == data);

    // `ana set` on the first listener only: its controllers are told.
    a.admin()
        .set_features(feature::ASYNC_EVENT, AEC_ANA_CHANGE)
        .or_panic("Async Event Configuration");
    let aer = submit_aer(&a);
    let first = format!("127.0.0.1:{}", d.t.port());
    let (ok, out, err) = d.run(&["ana", "set", "1", "persistent-loss", "--listener", &first]);
    assert!(ok, "ana set: {err}");
    assert!(out.contains("ANA group 1 on tcp://"), "{out}");
    let done = a.admin().wait(aer).or_panic("the AER");
    assert_status(&done, Status::SUCCESS, "AER");
    assert_eq!(done.cqe.dw0, ANA_CHANGED, "ANA Change notice");
    assert_eq!(ana_groups(&a)[0].1, PersistentLoss);
    assert_eq!(read(&mut a.io[0], 1), Status::ANA_PERSISTENT_LOSS);
    assert_eq!(
        ana_groups(&b)[0].1,
        Inaccessible,
        "the other listener kept its state"
    );
    let (ok, status, _) = d.run(&["status"]);
    assert!(ok);
    assert!(
        status.contains(&format!(
            "ANA groups on tcp://{first}: 1 persistent-loss, 2 non-optimized"
        )),
        "{status}"
    );

    // Errors name the problem; nothing changes.
    for (args, says) in [
        (vec!["ana", "set", "0", "optimized"], "out of range"),
        (
            vec!["ana", "set", "1", "optimized", "--listener", "127.0.0.1:1"],
            "no listener",
        ),
    ] {
        let (ok, _, err) = d.run(&args);
        assert!(!ok && err.contains(says), "{args:?}: {err}");
    }
    let (ok, _, err) = d.run(&["ana", "set", "1", "fast"]);
    assert!(!ok && err.contains("not an ANA state"), "{err}");

    // `change` on every listener, then a reload: the file's states again,
    // the groups' namespaces moved (namespace 2 to group 1).
    let (ok, _, err) = d.run(&["ana", "set", "2", "change"]);
    assert!(ok, "{err}");
    assert_eq!(read(&mut b.io[0], 2), Status::ANA_TRANSITION);
    let moved = file("1 = \"optimized\"", "1 = \"non-optimized\"").replace("ana_group = 2\n", "");
    let report = d.reload(&moved);
    assert!(
        report.contains("namespace 2 moved to ANA group 1"),
        "{report}"
    );
    assert!(
        report.contains("ANA group 1 optimized on tcp://"),
        "{report}"
    );
    assert_eq!(ana_groups(&a), vec![(1, Optimized, vec![1, 2])]);
    assert_eq!(ana_groups(&b), vec![(1, NonOptimized, vec![1, 2])]);
    assert_eq!(read(&mut b.io[0], 1), Status::SUCCESS);
    assert_eq!(read(&mut a.io[0], 2), Status::SUCCESS);
}
