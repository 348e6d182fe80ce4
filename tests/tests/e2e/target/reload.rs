//! Live reconfiguration: `rdmablk-target reload` and `status` over the
//! control socket, against a daemon with hosts connected: namespaces come,
//! grow and go with asynchronous events (NVMe Base 2.1, 5.2.2), a refused
//! configuration changes nothing, a host dropped from the allow-list loses
//! its association, and discovery controllers hear of new subsystems.

use rdmablk_common::fabrics::discovery::{parse_log_header, DISCOVERY_LOG_HEADER_LEN};
use rdmablk_common::fabrics::DISCOVERY_NQN;
use rdmablk_common::nvme::identify::{cns, NamespaceId};
use rdmablk_common::nvme::log::lid;
use rdmablk_common::nvme::{feature, nvm, property, Status};
use rdmablk_tests::check::{assert_status, open, wait_until, OrPanic};
use rdmablk_tests::client::{quiet, Controller, Opts, Queue};
use rdmablk_tests::control::ControlledTarget;
use rdmablk_tests::events::{
    active_namespaces, changed_namespaces, flush_events, submit_aer, AEC_ANA_CHANGE, AEC_DISCOVERY,
    AEC_NS_ATTR, DISCOVERY_CHANGED, NS_ATTR_CHANGED,
};
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A, HOST_B, OPEN_NQN};
use rdmablk_tests::Rng;
use std::time::{Duration, Instant};

/// A configuration of one subsystem (any host) with `namespaces` (TOML
/// tables) and `extra` after.
fn config(namespaces: &str, extra: &str) -> String {
    format!(
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
         [[subsystem]]\nnqn = \"{DEFAULT_NQN}\"\nallow_any_host = true\n{namespaces}\n{extra}"
    )
}

fn memory_ns(nsid: u32, size: &str) -> String {
    format!(
        "  [[subsystem.namespace]]\n  nsid = {nsid}\n  backend = \"memory\"\n  size = \"{size}\"\n"
    )
}

#[test]
fn namespaces_come_grow_and_go_with_asynchronous_events() {
    let _machine = crate::shared();
    let one = memory_ns(1, "64MiB");
    let d = ControlledTarget::start(&config(&one, ""));
    let mut c = open(&d.t, DEFAULT_NQN, HOST_A, &quiet());
    assert_eq!(
        c.id.oaes,
        AEC_NS_ATTR | AEC_ANA_CHANGE,
        "OAES lists what is implemented"
    );
    c.admin()
        .set_features(feature::ASYNC_EVENT, AEC_NS_ATTR)
        .or_panic("Async Event Configuration");
    let aer = submit_aer(&c);

    // Namespace 2 appears: an event, the Changed Namespace List, I/O.
    let two = memory_ns(2, "32MiB");
    let report = d.reload(&config(&format!("{one}{two}"), ""));
    assert!(report.contains("namespace 2 added"), "{report}");
    let done = c.admin().wait(aer).or_panic("the AER");
    assert_status(&done, Status::SUCCESS, "AER");
    assert_eq!(done.cqe.dw0, NS_ATTR_CHANGED, "Namespace Attribute Changed");
    assert_eq!(changed_namespaces(&c), vec![2]);
    assert_eq!(active_namespaces(&c), vec![1, 2]);
    let data = Rng::new(2).bytes(4096);
    let q = &mut c.io[0];
    q.write(2, 100, &data, 512, false)
        .or_panic("write to namespace 2");
    assert!(q.read(2, 100, 8, 512).or_panic("read from namespace 2") == data);

    // Namespace 1 grows: another event (the list was read with RAE clear).
    let aer = submit_aer(&c);
    d.reload(&config(&format!("{}{two}", memory_ns(1, "128MiB")), ""));
    let done = c.admin().wait(aer).or_panic("the AER");
    assert_eq!(done.cqe.dw0, NS_ATTR_CHANGED);
    let id = NamespaceId::parse(&c.admin().identify(cns::NAMESPACE, 1).or_panic("identify"));
    assert_eq!(id.nsze, (128 << 20) / 512, "NSZE after growing");

    // Namespace 2 goes while the last event is unacknowledged: no event
    // (masked until the log page is read), but the list says so.
    let aer = submit_aer(&c);
    d.reload(&config(&memory_ns(1, "128MiB"), ""));
    flush_events(&c);
    assert!(
        !c.admin().has_completed(aer),
        "the AER completed while Namespace Attribute Changed was masked"
    );
    assert_eq!(changed_namespaces(&c), vec![1, 2]);
    let st = c.io[0]
        .exec(Queue::rw_sqe(nvm::READ, 2, 0, 8), None, 4096)
        .or_panic("read from the removed namespace");
    assert_status(&st, Status::INVALID_NAMESPACE, "I/O to a removed namespace");
    assert_eq!(active_namespaces(&c), vec![1]);

    // A controller reset aborts the held AER and posts no completion for it
    // (NVMe Base 2.1, 5.2): round trips after it bring none. Enabled again,
    // the controller reports an event to a new AER.
    c.admin().prop_set(property::CC, 0).or_panic("CC.EN = 0");
    for _ in 0..3 {
        c.admin()
            .prop_get(property::CSTS, false)
            .or_panic("CSTS after the reset");
    }
    assert!(
        !c.admin().has_completed(aer),
        "an AER held across a controller reset was completed"
    );
    c.admin()
        .prop_set(property::CC, property::CC_EN | 6 << 16 | 4 << 20)
        .or_panic("CC.EN = 1");
    let csts = c.admin().prop_get(property::CSTS, false).or_panic("CSTS") as u32;
    assert_ne!(csts & property::CSTS_RDY, 0, "CSTS.RDY once enabled again");
    let aer = submit_aer(&c);
    d.reload(&config(&format!("{}{two}", memory_ns(1, "128MiB")), ""));
    let done = c.admin().wait(aer).or_panic("an AER after the reset");
    assert_eq!(done.cqe.dw0, NS_ATTR_CHANGED, "the event after the reset");
}

#[test]
fn a_refused_reload_names_the_key_and_changes_nothing() {
    let _machine = crate::shared();
    let one = memory_ns(1, "64MiB");
    let d = ControlledTarget::start(&config(&one, ""));
    let mut c = open(&d.t, DEFAULT_NQN, HOST_A, &quiet());
    let data = Rng::new(3).bytes(4096);
    c.io[0].write(1, 0, &data, 512, false).or_panic("write");
    for (toml, key) in [
        (config(&one, "[pollers]\ncount = 7\n"), "pollers.count"),
        (
            config(&format!("{one}  block_size = 4096\n"), ""),
            "subsystem[0].namespace[0].block_size",
        ),
        (config(&memory_ns(1, "32MiB"), ""), "subsystem[0].namespace[0].size"),
        (config(&one, "[[subsystem]]\nnqn = \"not an nqn\"\n"), "subsystem[1].nqn"),
        (
            config(
                &format!("{one}  [[subsystem.namespace]]\n  nsid = 2\n  backend = \"file\"\n  path = \"/nonexistent/rdmablk\"\n"),
                "",
            ),
            "subsystem[0].namespace[1]",
        ),
    ] {
        d.write(&toml);
        let (ok, _, err) = d.run(&["reload"]);
        assert!(!ok, "reload of a configuration with a bad {key} succeeded");
        assert!(err.contains(key), "the refusal does not name {key}: {err}");
    }
    // I/O goes on, on the running configuration.
    assert!(c.io[0].read(1, 0, 8, 512).or_panic("read after refusals") == data);
    assert_eq!(active_namespaces(&c), vec![1]);
    let (ok, status, _) = d.run(&["status"]);
    assert!(ok, "status failed");
    assert!(
        status.contains(&format!("subsystem {DEFAULT_NQN} (any host)"))
            && status.contains("namespace 1: 64MiB on memory, read-write")
            && status.contains(&format!(
                "host {HOST_A}: 1 controller(s) over tcp, 2 queue(s)"
            )),
        "status:\n{status}"
    );
}

#[test]
fn a_host_removed_from_the_allow_list_loses_its_association() {
    let _machine = crate::shared();
    let subsystem = |hosts: &str| {
        format!(
            "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
             [[subsystem]]\nnqn = \"{OPEN_NQN}\"\nhosts = [{hosts}]\n{}",
            memory_ns(1, "16MiB")
        )
    };
    let both = subsystem(&format!("\"{HOST_A}\", \"{HOST_B}\""));
    let d = ControlledTarget::start(&both);
    let mut a = open(&d.t, OPEN_NQN, HOST_A, &quiet());
    let mut b = open(&d.t, OPEN_NQN, HOST_B, &quiet());
    let report = d.reload(&subsystem(&format!("\"{HOST_A}\"")));
    assert!(report.contains("allowed hosts changed"), "{report}");
    assert!(
        b.io[0].is_closed_by_peer(Duration::from_secs(5)),
        "the removed host's queue stayed open"
    );
    a.io[0]
        .read(1, 0, 8, 512)
        .or_panic("the host still allowed keeps working");
    let refused = Controller::open(d.t.addr(), OPEN_NQN, HOST_B, &quiet());
    assert!(refused.is_err(), "the removed host connected again");
}

/// A controller that ends (here: its host removed by a reload) has its
/// queues closed at once, as nvmet does, not at the poller's next tick
/// (100 ms): for four controllers of the host, every admin and I/O queue
/// is closed within 20 ms of the reload's answer (the slowest printed),
/// and a command sent then gets no answer.
#[test]
fn an_ended_controller_closes_its_queues_at_once() {
    let _machine = crate::alone();
    let subsystem = |hosts: &str| {
        format!(
            "[pollers]\ncount = 2\n\n\
             [[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
             [[subsystem]]\nnqn = \"{OPEN_NQN}\"\nhosts = [{hosts}]\n{}",
            memory_ns(1, "16MiB")
        )
    };
    let d = ControlledTarget::start(&subsystem(&format!("\"{HOST_A}\", \"{HOST_B}\"")));
    let mut gone: Vec<Controller> = (0..4)
        .map(|_| open(&d.t, OPEN_NQN, HOST_B, &quiet()))
        .collect();
    d.reload(&subsystem(&format!("\"{HOST_A}\"")));
    let answered = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut closed = |q: &mut Queue| {
        assert!(
            q.is_closed_by_peer(Duration::from_secs(1)),
            "a queue of the removed host stayed open\n{}",
            d.t.log_tail()
        );
        slowest = slowest.max(answered.elapsed());
    };
    for c in &mut gone {
        closed(&mut c.admin());
        c.io.iter_mut().for_each(&mut closed);
    }
    eprintln!("reload: the removed host's 8 queues closed within {slowest:?} of the answer");
    assert!(
        slowest < Duration::from_millis(20),
        "queues closed {slowest:?} after the controllers ended\n{}",
        d.t.log_tail()
    );
    assert!(
        gone[0].admin().keep_alive().is_err(),
        "a command on an ended controller's queue was answered"
    );
}

#[test]
fn discovery_controllers_hear_of_new_subsystems_and_listeners() {
    let _machine = crate::shared();
    let one = memory_ns(1, "16MiB");
    let d = ControlledTarget::start(&config(&one, ""));
    let opts = Opts {
        io_queues: 0,
        kato_ms: 30_000,
        auto_keep_alive: false,
        ..Opts::default()
    };
    let disc = Controller::open(d.t.addr(), DISCOVERY_NQN, HOST_A, &opts).or_panic("discovery");
    assert_eq!(
        disc.id.oaes, AEC_DISCOVERY,
        "OAES of a discovery controller"
    );
    disc.admin()
        .set_features(feature::ASYNC_EVENT, AEC_DISCOVERY)
        .or_panic("Async Event Configuration");
    let header = |c: &Controller| {
        parse_log_header(
            &c.admin()
                .get_log(lid::DISCOVERY, DISCOVERY_LOG_HEADER_LEN as u32, 0)
                .or_panic("discovery log header"),
        )
    };
    let (gen1, n1) = header(&disc);
    let aer = submit_aer(&disc);
    let extra = format!(
        "[[subsystem]]\nnqn = \"{OPEN_NQN}\"\nallow_any_host = true\n{}",
        memory_ns(1, "16MiB")
    );
    let report = d.reload(&config(&one, &extra));
    assert!(
        report.contains(&format!("{OPEN_NQN}: subsystem added")),
        "{report}"
    );
    let done = disc.admin().wait(aer).or_panic("the discovery AER");
    assert_eq!(done.cqe.dw0, DISCOVERY_CHANGED, "Discovery Log Page Change");
    let (gen2, n2) = header(&disc);
    assert!(gen2 > gen1, "GENCTR {gen1} -> {gen2}");
    assert_eq!(n2, n1 + 1, "one more entry");
    // The whole log, read in pieces, as a host does: consistent.
    let entries = Controller::discover(d.t.addr(), HOST_B).or_panic("discover");
    assert!(entries.iter().any(|e| e.subnqn == OPEN_NQN), "{entries:?}");
    // A listener added and removed.
    let port = rdmablk_tests::free_port();
    let second = format!("[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n");
    let report = d.reload(&config(&one, &format!("{extra}\n{second}")));
    assert!(
        report.contains(&format!("listening on tcp://127.0.0.1:{port}")),
        "{report}"
    );
    let addr = format!("127.0.0.1:{port}").parse().expect("address");
    open_at(addr);
    d.reload(&config(&one, &extra));
    wait_until(
        Duration::from_secs(10),
        "the removed listener to refuse connections",
        || std::net::TcpStream::connect(addr).is_err(),
    );
}

fn open_at(addr: std::net::SocketAddr) {
    let c = Controller::open(addr, DEFAULT_NQN, HOST_A, &quiet()).or_panic("the new listener");
    drop(c);
}

/// SIGHUP reloads as `reload` does, without an answer: the daemon logs the
/// result and keeps serving.
#[test]
fn sighup_reloads_too() {
    let _machine = crate::shared();
    let one = memory_ns(1, "16MiB");
    let d = ControlledTarget::start(&config(&one, ""));
    let c = open(&d.t, DEFAULT_NQN, HOST_A, &quiet());
    d.write(&config(&format!("{one}{}", memory_ns(3, "16MiB")), ""));
    rdmablk_tests::send_signal(d.t.pid(), libc::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while active_namespaces(&c) != vec![1, 3] {
        assert!(
            std::time::Instant::now() < deadline,
            "namespace 3 not there 5 s after SIGHUP\n{}",
            d.t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    d.write(&config(&one, "[pollers]\ncount = 9\n"));
    rdmablk_tests::send_signal(d.t.pid(), libc::SIGHUP);
    wait_until(
        Duration::from_secs(10),
        "the refusal of the reload in the log",
        || {
            let log = d.t.log();
            log.contains("SIGHUP: reload refused") && log.contains("pollers.count")
        },
    );
    assert_eq!(
        active_namespaces(&c),
        vec![1, 3],
        "a refused reload changed the namespaces"
    );
}
