//! The key rules of Register, Acquire and Release, and what the Reservation
//! Report says.

use super::*;

/// NVMe Base 2.1, 8.1.22 and 7.5 to 7.8, as Linux nvmet does them: a host
/// registers once (again with another key: Reservation Conflict; with the
/// same key: success), replaces its key only with the right one (or
/// IEKEY), unregisters only with the right one (or IEKEY); commands from a
/// host that is not registered, or with a wrong key, conflict; Acquire
/// refuses IEKEY and an RTYPE outside 1 to 6, Release IEKEY (Invalid
/// Field); CPTPL 01b is Invalid Field; the holder may acquire its own
/// type again but no other; a registrant that does not hold the
/// reservation releases nothing, successfully; under All Registrants every
/// registrant holds it and it outlives its acquirer's registration; the
/// generation counts successful Register actions, preempts and Clear, not
/// Acquire or Release. The Reservation
/// Report (EDS) lists each host once with its 128-bit identifier, CNTLID
/// FFFFh, its key and RCSTS; REGCTL counts them all even when the buffer
/// holds fewer. Without EDS: Host Identifier Inconsistent Format (18h).
/// Two controllers of one host share its registration.
#[test]
fn register_replace_unregister_and_what_the_report_says() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let (mut a, mut a2, mut b) = (open_as(&d.t, &A), open_as(&d.t, &A), open_as(&d.t, &B));
    assert_ne!(a.cntlid, a2.cntlid, "two controllers of host A");
    const KA1: u64 = 0xa1;
    const KA2: u64 = 0xa2;
    const KA3: u64 = 0xa3;
    const KA4: u64 = 0xa4;
    const KB: u64 = 0xb1;

    let empty = report(io(&mut a));
    assert_eq!(
        empty,
        Report {
            gen: 0,
            rtype: 0,
            regctl: 0,
            ptpls: 0,
            registrants: vec![]
        }
    );
    let done = report_raw(io(&mut a), NSID, 4096, false);
    want(
        done,
        Status::HOST_ID_INCONSISTENT,
        "Reservation Report without EDS (128-bit host identifiers)",
    );

    // Nothing but Register works for a host that is not registered.
    conflict(
        reg(io(&mut a), UNREGISTER, KA1, 0),
        "unregister, not registered",
    );
    conflict(
        reg(io(&mut a), REPLACE, KA1, KA2),
        "replace, not registered",
    );
    conflict(
        acq(io(&mut a), ACQUIRE | rt(1), KA1, 0),
        "acquire, not registered",
    );
    conflict(
        rel(io(&mut a), RELEASE | rt(1), KA1),
        "release, not registered",
    );
    assert_eq!(
        report(io(&mut a)).gen,
        0,
        "failed commands change no generation"
    );

    ok(reg(io(&mut a), REGISTER, 0, KA1), "A registers");
    let rep = report(io(&mut b));
    assert_eq!((rep.gen, rep.regctl, rep.rtype), (1, 1, 0), "{rep:?}");
    assert_eq!(rep.registrants, vec![r(&A, KA1, false)]);
    // A's other controller is the same registrant.
    conflict(
        reg(io(&mut a2), REGISTER, 0, KA2),
        "A registers again, with another key, through its other controller",
    );
    assert_eq!(
        report(io(&mut a2)),
        rep,
        "the report through A's other controller"
    );

    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    let rep = report(io(&mut a));
    assert_eq!((rep.gen, rep.regctl), (2, 2), "{rep:?}");
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA1, false), r(&B, KB, false)])
    );

    // Replace: the current key or IEKEY.
    conflict(
        reg(io(&mut a), REPLACE, KA2, KA3),
        "replace with a wrong key",
    );
    ok(
        reg(io(&mut a), REPLACE, KA1, KA2),
        "replace with the current key",
    );
    ok(
        reg(io(&mut a2), REPLACE | IEKEY, 0xdead, KA3),
        "replace with IEKEY, through A's other controller",
    );
    let rep = report(io(&mut b));
    assert_eq!(rep.gen, 4, "two replacements: {rep:?}");
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA3, false), r(&B, KB, false)])
    );

    // Acquire: the current key, no IEKEY, RTYPE 1 to 6.
    conflict(
        acq(io(&mut a), ACQUIRE | rt(1), KA2, 0),
        "acquire with an old key",
    );
    for (cdw10, what) in [
        (ACQUIRE | IEKEY | rt(1), "acquire with IEKEY"),
        (ACQUIRE | rt(0), "acquire RTYPE 0"),
        (ACQUIRE | rt(7), "acquire RTYPE 7"),
    ] {
        want(acq(io(&mut a), cdw10, KA3, 0), Status::INVALID_FIELD, what);
    }
    ok(
        acq(io(&mut a2), ACQUIRE | rt(1), KA3, 0),
        "A acquires Write Exclusive through its other controller",
    );
    let rep = report(io(&mut b));
    assert_eq!(
        (rep.gen, rep.rtype),
        (4, 1),
        "Acquire keeps the generation: {rep:?}"
    );
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA3, true), r(&B, KB, false)])
    );
    ok(
        acq(io(&mut a), ACQUIRE | rt(1), KA3, 0),
        "the holder acquires the same type again",
    );
    conflict(
        acq(io(&mut a), ACQUIRE | rt(2), KA3, 0),
        "the holder acquires another type",
    );
    conflict(
        acq(io(&mut b), ACQUIRE | rt(1), KB, 0),
        "B acquires A's reservation",
    );

    // The holder replaces its key and keeps the reservation.
    ok(
        reg(io(&mut a), REPLACE, KA3, KA4),
        "the holder replaces its key",
    );
    let rep = report(io(&mut b));
    assert_eq!((rep.gen, rep.rtype), (5, 1), "{rep:?}");
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA4, true), r(&B, KB, false)])
    );

    // Release: the current key, no IEKEY; a registrant that does not hold
    // the reservation releases nothing, successfully.
    conflict(
        rel(io(&mut b), RELEASE | rt(1), KA4),
        "B releases with A's key",
    );
    want(
        rel(io(&mut a), RELEASE | IEKEY | rt(1), KA4),
        Status::INVALID_FIELD,
        "release with IEKEY",
    );
    ok(
        rel(io(&mut b), RELEASE | rt(1), KB),
        "B, not the holder, releases",
    );
    assert_eq!(report(io(&mut a)).rtype, 1, "still A's reservation");
    ok(rel(io(&mut a), RELEASE | rt(1), KA4), "A releases");
    let rep = report(io(&mut b));
    assert_eq!(
        (rep.gen, rep.rtype),
        (5, 0),
        "Release keeps the generation: {rep:?}"
    );
    assert!(rep.registrants.iter().all(|x| !x.holds), "{rep:?}");

    // All Registrants: every registrant holds it, and it stays when its
    // acquirer unregisters.
    ok(
        acq(io(&mut a), ACQUIRE | rt(5), KA4, 0),
        "A acquires type 5",
    );
    let rep = report(io(&mut b));
    assert_eq!(rep.rtype, 5);
    assert_eq!(
        rep.registrants,
        sorted(vec![r(&A, KA4, true), r(&B, KB, true)]),
        "RCSTS under Write Exclusive - All Registrants"
    );
    conflict(
        reg(io(&mut a), UNREGISTER, KA3, 0),
        "unregister with a wrong key",
    );
    ok(
        reg(io(&mut a), UNREGISTER | IEKEY, 0, 0),
        "unregister with IEKEY",
    );
    let rep = report(io(&mut b));
    assert_eq!((rep.gen, rep.rtype, rep.regctl), (6, 5, 1), "{rep:?}");
    assert_eq!(rep.registrants, vec![r(&B, KB, true)]);

    // CPTPL 01b is reserved: Invalid Field, and nothing registered.
    want(
        reg(io(&mut a), REGISTER | CPTPL_INVALID, 0, KA1),
        Status::INVALID_FIELD,
        "Register with CPTPL 01b",
    );
    assert_eq!(report(io(&mut a)).regctl, 1);

    // A buffer for one registrant: REGCTL still counts both.
    ok(reg(io(&mut a), REGISTER, 0, KA1), "A registers again");
    let done = report_raw(io(&mut a), NSID, 128, true);
    assert_status(&done, Status::SUCCESS, "a 128-byte report");
    let short = parse_report(&done.data);
    assert_eq!((short.gen, short.regctl), (7, 2), "{short:?}");
    assert_eq!(short.registrants.len(), 1);
    assert!(
        [r(&A, KA1, true), r(&B, KB, true)].contains(&short.registrants[0]),
        "{short:?}"
    );

    // Clear, by any registrant: no registrations, no reservation.
    conflict(rel(io(&mut b), CLEAR, KA1), "clear with a wrong key");
    ok(rel(io(&mut b), CLEAR | rt(5), KB), "B clears");
    let rep = report(io(&mut a));
    assert_eq!(
        rep,
        Report {
            gen: 8,
            rtype: 0,
            regctl: 0,
            ptpls: 0,
            registrants: vec![]
        }
    );

    // Registering again with the key it has succeeds.
    ok(reg(io(&mut a), REGISTER, 0, KA2), "A registers");
    ok(
        reg(io(&mut a2), REGISTER, 0, KA2),
        "A registers again, same key",
    );
    assert_eq!(report(io(&mut b)).registrants, vec![r(&A, KA2, false)]);
}
