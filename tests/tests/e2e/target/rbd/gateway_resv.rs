//! Reservations shared by a gateway group (NVMe Base 2.1, 8.1.22): a host
//! registers and holds Write Exclusive through one gateway; the group's
//! ANA group moves to another gateway (its preferred owner returning),
//! where another host's write gets Reservation Conflict; that host's
//! Preempt through the new owner reaches the first host as a Registration
//! Preempted notice on its controller of the first gateway; and with PTPL
//! the state survives restarting every gateway.

use super::gateway_group::{config, wait_owner, LEASE_SECS};
use super::*;
use rdmablk_tests::client::Completion;
use rdmablk_tests::control::ControlledTarget;
use rdmablk_tests::events::submit_aer;
use rdmablk_tests::reservation::{
    acq, aer_says_log_80h, conflict, notice, ok, open_nqn, reg, report_ns, rt, Host, A, ACQUIRE, B,
    CPTPL_SET, PREEMPT, REGISTER, REGISTRATION_PREEMPTED,
};

const KA: u64 = 0xa1a1;
const KB: u64 = 0xb2b2;
/// Write Exclusive.
const WE: u8 = 1;

/// A write of 8 blocks to namespace 1 through `c`; the caller checks it.
fn write(c: &mut Controller) -> Completion {
    io(c)
        .exec(
            Queue::rw_sqe(nvm::WRITE, 1, 0, 8),
            Some(&Rng::new(29).bytes(4096)),
            0,
        )
        .or_panic("a write")
}

fn open(d: &ControlledTarget, h: &Host) -> Controller {
    open_nqn(&d.t, NQN, h)
}

#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn reservations_are_shared_by_the_gateways_of_a_group() {
    let _machine = crate::alone();
    let (one, two) = (
        Image::create("gwr1", 16 * MIB),
        Image::create("gwr2", 16 * MIB),
    );
    let group = format!("resv-{}", std::process::id());
    let gateway = |gw| {
        let d = ControlledTarget::start(&config(&group, gw, (&one, &two), 3, ""));
        wait_active(&d.t);
        d
    };
    let settle = Duration::from_secs(6 * LEASE_SECS);

    // gw-b alone takes ANA group 1 (its preferred gateway, gw-a, is not
    // there); host A registers and holds Write Exclusive through it.
    let first = gateway('b');
    wait_owner(&[&first.t], Some(0), 1, settle);
    let mut a = open(&first, &A);
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers through gw-b");
    ok(
        acq(io(&mut a), ACQUIRE | rt(WE), KA, 0),
        "A acquires Write Exclusive through gw-b",
    );
    ok(write(&mut a), "A writes through gw-b");

    // gw-a starts and gets group 1 back; A's controller on gw-b stays.
    let second = gateway('a');
    wait_owner(&[&second.t, &first.t], Some(0), 1, settle);
    let mut b = open(&second, &B);
    conflict(write(&mut b), "B's write through gw-a");
    let r = report_ns(io(&mut b), 1);
    assert_eq!(
        (
            r.rtype,
            r.regctl,
            r.registrants[0].hostid,
            r.registrants[0].holds
        ),
        (WE, 1, A.id, true),
        "gw-a reports what A did through gw-b: {r:?}"
    );

    // B registers (PTPL on) and preempts A through gw-a: A hears it on
    // its controller of gw-b.
    let aer = submit_aer(&a);
    ok(
        reg(io(&mut b), REGISTER | CPTPL_SET, 0, KB),
        "B registers through gw-a, PTPL on",
    );
    ok(
        acq(io(&mut b), PREEMPT | rt(WE), KB, KA),
        "B preempts A through gw-a",
    );
    aer_says_log_80h(&a, aer, "A's controller on gw-b");
    let n = notice(&a);
    assert_eq!(
        (n.kind, n.nsid),
        (REGISTRATION_PREEMPTED, 1),
        "A's notice on gw-b: {n:?}"
    );
    ok(write(&mut b), "B, now the holder, writes through gw-a");

    // Every gateway stops and starts again: PTPL kept the state.
    drop((a, b));
    stop(first.t);
    stop(second.t);
    let (x, y) = (gateway('a'), gateway('b'));
    wait_owner(&[&x.t, &y.t], Some(0), 1, settle);
    let mut b = open(&x, &B);
    let r = report_ns(io(&mut b), 1);
    assert_eq!(
        (r.rtype, r.ptpls, r.regctl),
        (WE, 1, 1),
        "after every gateway restarted: {r:?}"
    );
    assert_eq!(
        (
            r.registrants[0].hostid,
            r.registrants[0].rkey,
            r.registrants[0].holds
        ),
        (B.id, KB, true),
        "{r:?}"
    );
    let mut a = open(&x, &A);
    conflict(write(&mut a), "A's write after the restart");
    ok(write(&mut b), "B's write after the restart");
}
