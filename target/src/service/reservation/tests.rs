//! The reservation state machine alone: keys, types, preemption, notices
//! (NVMe Base 2.1, 8.1.22, and Linux nvmet's pr.c for what the
//! specification leaves open).

use super::*;
use rdmablk_common::nvme::resv::ResvType::*;

const A: HostId = [0xa; 16];
const B: HostId = [0xb; 16];
const C: HostId = [0xc; 16];

fn cmd(action: u8, rtype: u8, crkey: u64, key2: u64) -> ResvCmd {
    ResvCmd {
        action,
        iekey: false,
        rtype,
        cptpl: 0,
        crkey,
        key2,
    }
}

fn register(st: &mut State, h: &HostId, key: u64) {
    st.register(h, &cmd(rrega::REGISTER, 0, 0, key))
        .expect("register");
}

#[test]
fn register_replace_unregister() {
    let mut st = State::default();
    register(&mut st, &A, 1);
    assert_eq!(st.generation, 1);
    // The same key again: success; another: conflict.
    register(&mut st, &A, 1);
    assert_eq!(
        st.register(&A, &cmd(rrega::REGISTER, 0, 0, 2)),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(
        st.register(&A, &cmd(rrega::REPLACE, 0, 9, 2)),
        Err(Status::RESERVATION_CONFLICT),
        "wrong current key"
    );
    st.register(&A, &cmd(rrega::REPLACE, 0, 1, 2))
        .expect("replace");
    let mut ignore = cmd(rrega::REPLACE, 0, 77, 3);
    ignore.iekey = true;
    st.register(&A, &ignore)
        .expect("IEKEY ignores the current key");
    assert_eq!(st.key_of(&A), Some(3));
    assert_eq!(
        st.register(&B, &cmd(rrega::UNREGISTER, 0, 0, 0)),
        Err(Status::RESERVATION_CONFLICT),
        "not registered"
    );
    st.register(&A, &cmd(rrega::UNREGISTER, 0, 3, 0))
        .expect("unregister");
    assert!(st.registrants.is_empty());
    assert_eq!(
        st.register(&A, &cmd(7, 0, 0, 0)),
        Err(Status::INVALID_FIELD)
    );
    let mut ptpl = cmd(rrega::REGISTER, 0, 0, 5);
    ptpl.cptpl = 1;
    assert_eq!(
        st.register(&A, &ptpl),
        Err(Status::INVALID_FIELD),
        "CPTPL 01b"
    );
    ptpl.cptpl = 3;
    st.register(&A, &ptpl).expect("register with PTPL");
    assert!(st.ptpl);
}

/// Figure "Command Behavior in the Presence of a Reservation", row by row.
#[test]
fn access_rules() {
    for t in ResvType::ALL {
        let mut st = State::default();
        register(&mut st, &A, 1);
        register(&mut st, &B, 2);
        st.acquire(&A, &cmd(racqa::ACQUIRE, t as u8, 1, 0))
            .expect("acquire");
        let all = t.all_registrants();
        let regs = t.admits_registrants();
        let ea = t.excludes_readers();
        for group in [AccessGroup::Read, AccessGroup::Write] {
            let read = group == AccessGroup::Read;
            assert!(st.admits(&A, group), "{t:?}: the holder");
            assert_eq!(
                st.admits(&B, group),
                all || regs || read && !ea,
                "{t:?}: a registrant, {group:?}"
            );
            assert_eq!(
                st.admits(&C, group),
                read && !ea,
                "{t:?}: a stranger, {group:?}"
            );
        }
        assert_eq!(st.report().registrants[1].holds, all, "{t:?}");
    }
}

#[test]
fn acquire_and_release() {
    let mut st = State::default();
    register(&mut st, &A, 1);
    register(&mut st, &B, 2);
    assert_eq!(
        st.acquire(&A, &cmd(racqa::ACQUIRE, 1, 9, 0)),
        Err(Status::RESERVATION_CONFLICT),
        "wrong key"
    );
    assert_eq!(
        st.acquire(&A, &cmd(racqa::ACQUIRE, 7, 1, 0)),
        Err(Status::INVALID_FIELD),
        "no such type"
    );
    st.acquire(&A, &cmd(racqa::ACQUIRE, 3, 1, 0))
        .expect("acquire");
    st.acquire(&A, &cmd(racqa::ACQUIRE, 3, 1, 0))
        .expect("again, same type");
    assert_eq!(
        st.acquire(&B, &cmd(racqa::ACQUIRE, 3, 2, 0)),
        Err(Status::RESERVATION_CONFLICT),
        "held by another"
    );
    assert_eq!(
        st.release(&A, &cmd(rrela::RELEASE, 1, 1, 0)),
        Err(Status::INVALID_FIELD),
        "another type"
    );
    let out = st
        .release(&A, &cmd(rrela::RELEASE, 3, 1, 0))
        .expect("release");
    assert_eq!(out.notices, [(B, notice::RESERVATION_RELEASED)]);
    assert_eq!(st.holder, None);
    assert_eq!(
        st.release(&B, &cmd(rrela::RELEASE, 3, 2, 0)),
        Ok(Outcome::default())
    );
    let out = st.release(&B, &cmd(rrela::CLEAR, 0, 2, 0)).expect("clear");
    assert_eq!(out.notices, [(A, notice::RESERVATION_PREEMPTED)]);
    assert!(st.registrants.is_empty());
}

#[test]
fn preempt_and_abort() {
    let mut st = State::default();
    register(&mut st, &A, 1);
    register(&mut st, &B, 2);
    register(&mut st, &C, 1);
    st.acquire(&A, &cmd(racqa::ACQUIRE, 1, 1, 0))
        .expect("acquire");
    let gen = st.generation;
    let out = st
        .acquire(&B, &cmd(racqa::PREEMPT_AND_ABORT, 2, 2, 1))
        .expect("preempt");
    assert_eq!(st.holder, Some((ExclusiveAccess, B)));
    assert_eq!(st.registrants, [(B, 2)], "both hosts with key 1 are gone");
    assert_eq!(out.aborted, [A, C]);
    assert_eq!(
        out.notices,
        [
            (A, notice::REGISTRATION_PREEMPTED),
            (C, notice::REGISTRATION_PREEMPTED)
        ]
    );
    assert_eq!(st.generation, gen + 1);
    // A plain preempt aborts nothing.
    register(&mut st, &A, 5);
    let out = st
        .acquire(&B, &cmd(racqa::PREEMPT, 2, 2, 5))
        .expect("preempt");
    assert!(out.aborted.is_empty());
    register(&mut st, &C, 3);
    assert_eq!(
        st.acquire(&C, &cmd(racqa::PREEMPT, 2, 3, 0)),
        Err(Status::INVALID_FIELD),
        "a zero key outside the All Registrants types"
    );
}

#[test]
fn all_registrants_holders() {
    let mut st = State::default();
    register(&mut st, &A, 1);
    register(&mut st, &B, 2);
    st.acquire(&A, &cmd(racqa::ACQUIRE, 6, 1, 0))
        .expect("acquire");
    // The holder leaving keeps the reservation with the others.
    st.register(&A, &cmd(rrega::UNREGISTER, 0, 1, 0))
        .expect("unregister");
    assert!(st.holds(&B));
    assert_eq!(st.report().rtype, 6);
    st.register(&B, &cmd(rrega::UNREGISTER, 0, 2, 0))
        .expect("unregister");
    assert_eq!(st.holder, None, "gone with the last registrant");
}

#[test]
fn aborts_are_told_to_commands_that_started_before() {
    let r = Reservations::new(State::default());
    let seen = r.aborts();
    r.apply(|st| {
        register(st, &A, 1);
        register(st, &B, 2);
        st.acquire(&A, &cmd(racqa::ACQUIRE, 1, 1, 0))
    })
    .expect("setup");
    assert!(!r.admits(&B, AccessGroup::Write) && r.admits(&B, AccessGroup::Read));
    r.apply(|st| st.acquire(&B, &cmd(racqa::PREEMPT_AND_ABORT, 1, 2, 1)))
        .expect("preempt");
    assert!(r.aborted_since(&A, seen));
    assert!(!r.aborted_since(&B, seen));
    assert!(!r.aborted_since(&A, r.aborts()), "a command after it");
}
