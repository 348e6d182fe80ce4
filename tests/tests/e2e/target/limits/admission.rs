//! Admission: connects beyond the limits get Controller Busy.

use super::*;

// ---- admission ---------------------------------------------------------------

/// An admin Connect as `host` on a fresh connection; the response.
fn admin_connect(t: &Target, host: &str) -> (Queue, Cqe) {
    let mut q =
        Queue::connect(t.addr(), Digests::default()).or_panic(format_args!("ICReq as {host}"));
    let cqe = q
        .fabrics_connect(0, 31, 0, SUBNQN, host, HOSTID, 0xffff)
        .or_panic(format_args!("admin Connect as {host}"));
    (q, cqe)
}

/// The Connect status for a target out of room: Controller Busy, a Connect
/// command-specific status (SCT 1h, SC 81h; NVMe Base 2.1, Figure 105
/// (Controller Busy)), with DNR clear so that the host retries later rather
/// than giving up.
fn assert_busy(cqe: &Cqe, what: &str) {
    assert_eq!(
        cqe.status(),
        Status::CONTROLLER_BUSY,
        "{what}: got {}, want Controller Busy",
        cqe.status()
    );
    assert!(
        !dnr_of(cqe.status),
        "{what}: Controller Busy with DNR set (status field {:#06x}): the host would not retry",
        cqe.status
    );
}

/// Retries an admin Connect as `host` (a new connection each time) until it
/// succeeds, for up to 5 s.
fn admin_connect_eventually(t: &Target, host: &str, what: &str) -> Queue {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (q, cqe) = admin_connect(t, host);
        if cqe.status().is_success() {
            return q;
        }
        assert!(
            cqe.status() == Status::CONTROLLER_BUSY && Instant::now() < deadline,
            "{what}: admin Connect as {host} still refused: {}",
            cqe.status()
        );
        drop(q);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `limits.connections` and `limits.associations_per_host`: a Connect
/// beyond either is answered Controller Busy with DNR clear (NVMe Base 2.1,
/// Figure 105 (Controller Busy)), and succeeds once room is made.
#[test]
fn connect_beyond_limits_gets_controller_busy() {
    let setup = Setup::new();
    let host = |n: u32| format!("nqn.2026-11.io.rdmablk:host-{n}");
    let dir = TempDir::new("limits-busy");

    // connections = 3.
    let t = setup.target(&config(2, "connections = 3"), &dir.join("stats-a.json"));
    let opts_io = |io_queues| Opts {
        io_queues,
        ..Opts::default()
    };
    let first = Controller::open(t.addr(), SUBNQN, &host(1), &opts_io(1))
        .or_panic("first host: controller with 1 I/O queue (2 queues)");
    let second = Controller::open(t.addr(), SUBNQN, &host(2), &opts_io(0))
        .or_panic("second host: admin queue (the 3rd queue)");
    let (refused, cqe) = admin_connect(&t, &host(3));
    assert_busy(&cqe, "admin Connect of a 3rd host with 3 queues connected");
    drop(refused);
    // An I/O queue beyond the limit is refused the same way, and its queue
    // id stays free for a later Connect.
    second
        .admin()
        .set_features(feature::NUM_QUEUES, 0)
        .or_panic("second host: Set Features (Number of Queues)");
    let mut io_q = Queue::connect(t.addr(), Digests::default()).or_panic("second host: ICReq");
    let cqe = io_q
        .fabrics_connect(1, 127, 0, SUBNQN, &host(2), HOSTID, second.cntlid)
        .or_panic("second host: I/O queue Connect");
    assert_busy(&cqe, "I/O queue Connect with 3 queues connected");
    drop(io_q);

    drop(first);
    let mut third = admin_connect_eventually(&t, &host(3), "after the first host left");
    // Two queues are free: the third host's admin queue took one; the
    // second host's I/O queue takes the other.
    let mut io_q = Queue::connect(t.addr(), Digests::default()).or_panic("second host: ICReq");
    let cqe = io_q
        .fabrics_connect(1, 127, 0, SUBNQN, &host(2), HOSTID, second.cntlid)
        .or_panic("second host: I/O queue Connect");
    assert!(
        cqe.status().is_success(),
        "second host's I/O queue Connect once room was made: {}",
        cqe.status()
    );
    io_q.read(NSID, 0, 8, 512)
        .or_panic("read on the second host's I/O queue");
    third
        .prop_get(rdmablk_common::nvme::property::CAP, true)
        .or_panic("Property Get on the third host's admin queue");
    drop((t, second, third, io_q));

    // associations_per_host = 2.
    let t = setup.target(
        &config(2, "associations_per_host = 2"),
        &dir.join("stats-b.json"),
    );
    let a = Controller::open(t.addr(), SUBNQN, &host(1), &opts_io(1))
        .or_panic("host 1: first association");
    let b = Controller::open(t.addr(), SUBNQN, &host(1), &opts_io(1))
        .or_panic("host 1: second association");
    let (refused, cqe) = admin_connect(&t, &host(1));
    assert_busy(
        &cqe,
        "a 3rd association of one host (associations_per_host 2)",
    );
    drop(refused);
    // Another host is not counted against host 1.
    let other = Controller::open(t.addr(), SUBNQN, &host(2), &opts_io(1))
        .or_panic("host 2 while host 1 is at its limit");
    drop(a);
    let mut again = admin_connect_eventually(&t, &host(1), "after host 1 ended an association");
    again
        .prop_get(rdmablk_common::nvme::property::CAP, true)
        .or_panic("Property Get on host 1's new admin queue");
    drop((b, other));
}
