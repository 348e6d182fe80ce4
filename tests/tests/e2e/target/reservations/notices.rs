//! The Reservation Notification log page (80h), its event, and its mask.

use super::*;

/// A notice about namespace [`NSID`].
fn n(count: u64, kind: u8, available: u8) -> Notice {
    Notice {
        count,
        kind,
        available,
        nsid: NSID,
    }
}

/// The Reservation Notification log page and its event (NVMe Base 2.1,
/// 8.1.22, Reservation Notifications; 5.1.12 and 5.1.2), as nvmet sends
/// them:
/// - A holds Write Exclusive, B preempts it: A's controller gets
///   Registration Preempted, with the AER completing dword 0 00800006h;
///   B (the preemptor) and C (no registration) get nothing.
/// - Further notices wait in the log while the event is masked (until the
///   host reads log 80h with RAE clear): two more preempts complete no AER;
///   each read takes the oldest, with the running Log Page Count and the
///   Number of Available Log Pages after it; an empty log reads zeroes.
/// - A releases a Registrants Only reservation: Reservation Released to the
///   other registrants (B and C), not to A.
/// - B clears: Reservation Preempted to the other registrants (A and C),
///   not to B.
#[test]
fn notices_go_to_the_hosts_concerned_in_log_80h() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let (mut a, mut b, mut c) = (open_as(&d.t, &A), open_as(&d.t, &B), open_as(&d.t, &C));
    const KA: u64 = 0xaaaa;
    const KB: u64 = 0xbbbb;
    const KC: u64 = 0xcccc;
    for (x, who) in [(&a, "A"), (&b, "B"), (&c, "C")] {
        assert_eq!(
            notice(x),
            Notice::default(),
            "{who}: an empty log reads zeroes"
        );
    }

    let aer = submit_aer(&a);
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(acq(io(&mut a), ACQUIRE | rt(1), KA, 0), "A acquires");
    flush_events(&a);
    assert!(
        !a.admin().has_completed(aer),
        "an AER completed without a notice"
    );
    ok(acq(io(&mut b), PREEMPT | rt(1), KB, KA), "B preempts A");
    aer_says_log_80h(&a, aer, "Registration Preempted");
    let rep = report(io(&mut c));
    assert_eq!((rep.gen, rep.rtype), (3, 1), "{rep:?}");
    assert_eq!(rep.registrants, vec![r(&B, KB, true)]);
    assert_eq!(notice(&b), Notice::default(), "the preemptor's log");
    assert_eq!(
        notice(&c),
        Notice::default(),
        "the log of a host with no registration"
    );

    // Two more Registration Preempted while the event is masked (the log
    // not read yet): preempts by B without a reservation held.
    let aer = submit_aer(&a);
    ok(rel(io(&mut b), RELEASE | rt(1), KB), "B releases");
    for _ in 0..2 {
        ok(reg(io(&mut a), REGISTER, 0, KA), "A registers again");
        ok(
            acq(io(&mut b), PREEMPT | rt(1), KB, KA),
            "B preempts A's registration",
        );
    }
    flush_events(&a);
    assert!(
        !a.admin().has_completed(aer),
        "an AER completed while the Reservation Log Page Available event was masked"
    );
    assert_eq!(
        notice(&a),
        n(1, REGISTRATION_PREEMPTED, 2),
        "A's first notice"
    );
    assert_eq!(
        notice(&a),
        n(2, REGISTRATION_PREEMPTED, 1),
        "A's second notice"
    );
    assert_eq!(
        notice(&a),
        n(3, REGISTRATION_PREEMPTED, 0),
        "A's third notice"
    );
    assert_eq!(notice(&a), Notice::default(), "A's log, read to its end");
    // Whether notices still in the log when it was read (unmasked) signal
    // again is not specified; if the AER did complete, it says log 80h.
    flush_events(&a);
    let aer = if a.admin().has_completed(aer) {
        aer_says_log_80h(&a, aer, "after the log was read");
        submit_aer(&a)
    } else {
        aer
    };

    // Reservation Released: to the other registrants of a Registrants Only
    // reservation its holder releases.
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers again");
    ok(reg(io(&mut c), REGISTER, 0, KC), "C registers");
    ok(acq(io(&mut a), ACQUIRE | rt(3), KA, 0), "A acquires type 3");
    let aer_b = submit_aer(&b);
    ok(rel(io(&mut a), RELEASE | rt(3), KA), "A releases");
    aer_says_log_80h(&b, aer_b, "Reservation Released");
    assert_eq!(notice(&b), n(1, RESERVATION_RELEASED, 0), "B's log");
    assert_eq!(notice(&c), n(1, RESERVATION_RELEASED, 0), "C's log");
    flush_events(&a);
    assert!(!a.admin().has_completed(aer), "the releaser was signalled");
    assert_eq!(notice(&a), Notice::default(), "the releaser's log");

    // Reservation Preempted: to the other registrants when one clears.
    ok(
        acq(io(&mut a), ACQUIRE | rt(1), KA, 0),
        "A acquires Write Exclusive",
    );
    ok(rel(io(&mut b), CLEAR | rt(1), KB), "B clears");
    aer_says_log_80h(&a, aer, "Reservation Preempted");
    assert_eq!(notice(&a), n(4, RESERVATION_PREEMPTED, 0), "A's log");
    assert_eq!(notice(&c), n(2, RESERVATION_PREEMPTED, 0), "C's log");
    assert_eq!(
        notice(&b),
        Notice::default(),
        "the log of the host that cleared"
    );
}

/// Set Features Reservation Notification Mask (82h; NVMe Base 2.1, Set
/// Features, the Reservation Notification Mask feature): with Registration Preempted masked (CDW11 bit 1, set for
/// every namespace with NSID FFFFFFFFh), a preempt neither logs nor signals
/// it; Get Features reads the mask back; unmasked, the next preempt does.
#[test]
fn a_masked_notice_is_neither_logged_nor_signalled() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let (mut a, mut b) = (open_as(&d.t, &A), open_as(&d.t, &B));
    const KA: u64 = 0xaaaa;
    const KB: u64 = 0xbbbb;
    const REGPRE: u32 = 1 << 1;
    let done = a
        .admin()
        .set_features_ns(feature::RESV_MASK, 0xffff_ffff, REGPRE)
        .or_panic("Set Features 82h");
    assert_status(&done, Status::SUCCESS, "Set Features 82h, NSID FFFFFFFFh");
    let mask =
        |c: &Controller| namespace_feature(c, feature::RESV_MASK, "Get Features 82h") & 0b1110;
    assert_eq!(mask(&a), REGPRE, "the mask read back");
    assert_eq!(mask(&b), 0, "another controller's mask");

    let aer = submit_aer(&a);
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(
        acq(io(&mut b), PREEMPT | rt(1), KB, KA),
        "B preempts A's registration",
    );
    assert_eq!(report(io(&mut b)).registrants, vec![r(&B, KB, false)]);
    flush_events(&a);
    assert!(
        !a.admin().has_completed(aer),
        "a masked Registration Preempted completed an AER"
    );
    assert_eq!(notice(&a), Notice::default(), "a masked notice was logged");

    let done = a
        .admin()
        .set_features_ns(feature::RESV_MASK, NSID, 0)
        .or_panic("Set Features 82h");
    assert_status(&done, Status::SUCCESS, "Set Features 82h, NSID 1");
    assert_eq!(mask(&a), 0, "the mask cleared");
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers again");
    ok(
        acq(io(&mut b), PREEMPT | rt(1), KB, KA),
        "B preempts A again",
    );
    aer_says_log_80h(&a, aer, "Registration Preempted, unmasked");
    let got = notice(&a);
    assert_eq!(
        (got.kind, got.available, got.nsid),
        (REGISTRATION_PREEMPTED, 0, NSID),
        "{got:?}"
    );
    assert_ne!(got.count, 0, "{got:?}");
}
