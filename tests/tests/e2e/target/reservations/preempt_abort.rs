//! Preempt and Abort of a write whose data has not arrived yet.

use super::*;

/// Preempt and Abort (NVMe Base 2.1, 8.1.22, Preempting a Reservation or
/// Registration, and 7.5): A holds Write Exclusive -
/// Registrants Only and has a write outstanding whose data it holds back
/// (the target sent its R2T; no H2CData yet). B preempts and aborts A's
/// registration: the Acquire completes (A's write never reached the
/// backend), then A sends the data and its write completes with Command
/// Aborted due to Preempt and Abort (1Bh) without landing: both hosts read
/// the old data. A, no longer registered, then meets the reservation: its
/// next write conflicts, its reads succeed.
#[test]
fn preempt_and_abort_fails_a_write_whose_data_was_held_back() {
    let _machine = crate::shared();
    let d = start(&[MEMORY_NS]);
    let (mut a, mut b) = (open_as(&d.t, &A), open_as(&d.t, &B));
    const KA: u64 = 0xaaaa;
    const KB: u64 = 0xbbbb;
    const SLBA: u64 = 64;
    let mut rng = Rng::new(0x1b);
    let old = rng.bytes(4096);
    let new = rng.bytes(4096);
    io(&mut a)
        .write(NSID, SLBA, &old, BS, false)
        .or_panic("the first write");
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(acq(io(&mut a), ACQUIRE | rt(3), KA, 0), "A acquires type 3");

    let held = io(&mut a)
        .submit_holding_data(Queue::rw_sqe(nvm::WRITE, NSID, SLBA, 8), &new)
        .or_panic("A's write");
    io(&mut a)
        .wait_held_r2t(held)
        .or_panic("the R2T of A's write");

    ok(
        acq(io(&mut b), PREEMPT_AND_ABORT | rt(3), KB, KA),
        "B preempts and aborts A while A's write waits for its data",
    );
    let rep = report(io(&mut b));
    assert_eq!(rep.rtype, 3, "{rep:?}");
    assert_eq!(rep.registrants, vec![r(&B, KB, true)]);

    io(&mut a)
        .release_data(held)
        .or_panic("sending the held data");
    let done = io(&mut a).wait(held).or_panic("A's write");
    assert_status(
        &done,
        Status::ABORTED_PREEMPT,
        "A's write, preempted and aborted before its data arrived",
    );
    let back = io(&mut b).read(NSID, SLBA, 8, BS).or_panic("B reads");
    assert_same(&back, &old, "the blocks of the aborted write, read by B");
    let back = io(&mut a).read(NSID, SLBA, 8, BS).or_panic("A reads");
    assert_same(&back, &old, "the blocks of the aborted write, read by A");

    // A is not a registrant any more: under type 3 it may read, not write.
    let done = io(&mut a)
        .exec(Queue::rw_sqe(nvm::WRITE, NSID, SLBA, 8), Some(&new), 0)
        .or_panic("A writes again");
    want(
        done,
        Status::RESERVATION_CONFLICT,
        "a new write from the preempted host",
    );
    let back = io(&mut b).read(NSID, SLBA, 8, BS).or_panic("B reads");
    assert_same(&back, &old, "after the conflicting write");
}
