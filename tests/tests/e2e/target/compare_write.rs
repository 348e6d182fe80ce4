//! Compare (NVM Command Set 2.1, 3.2, the Compare command) and the fused
//! Compare and Write (NVMe Base 2.1, 3.4.2 "Fused Operations"; NVM Command
//! Set 2.1, 3.2, Compare and Write): statuses of a match and a mismatch, of a first or second
//! command without its partner and of partners that disagree; and, with
//! hosts racing on two pollers, atomicity: 8 hosts each increment one
//! shared counter block 1,000 times with compare-and-write, and no
//! increment is lost.

use super::caw_race::{counter_block, per_host, race};
use rdmablk_common::bytes::get_u16;
use rdmablk_common::nvme::identify::cns;
use rdmablk_common::nvme::{fuse, nvm, Status};
use rdmablk_tests::check::{assert_same, assert_status, open, OrPanic};
use rdmablk_tests::client::{Opts, Queue};
use rdmablk_tests::names::{HOST_A, OPEN_NQN};
use rdmablk_tests::{open_subsystem_config, Rng, Target, TempDir};
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

const NSID: u32 = 1;

/// Eight hosts on a daemon with two pollers race [`per_host`]
/// compare-and-write increments each of one counter block on a file
/// namespace: the fused operation is atomic (NVMe Base 2.1, 3.4.2: no
/// other command to those blocks between the Compare and the Write),
/// across queues and pollers: every value from 1 to 8,000 is written by
/// exactly one host, and the block (also in the file, after the daemon
/// stopped) holds 8,000.
#[test]
fn racing_compare_and_write_increments_lose_nothing() {
    let _machine = crate::alone();
    let dir = TempDir::new("caw-race");
    let path = dir.join("ns.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(64 << 20))
        .or_panic("creating the backing file");
    let mut t = Target::start_config(&open_subsystem_config(
        "[pollers]\ncount = 2",
        OPEN_NQN,
        &format!("backend = \"file\"\npath = \"{}\"", path.display()),
    ));
    const SLBA: u64 = 4096;
    let tally = race(
        t.addr(),
        OPEN_NQN,
        NSID,
        SLBA,
        per_host(),
        Duration::from_secs(10),
    );
    let status = t.stop();
    assert!(status.success(), "exit status {status}\n{}", t.log_tail());
    let bs = tally.block_size;
    let mut block = vec![0u8; bs as usize];
    let mut f = std::fs::File::open(&path).or_panic("opening the backing file");
    f.seek(SeekFrom::Start(SLBA * bs as u64))
        .and_then(|_| f.read_exact(&mut block))
        .or_panic("reading the counter from the file");
    assert_same(
        &block,
        &counter_block(tally.increments, bs),
        "the counter block in the backing file",
    );
}

/// Asserts the 8 blocks at `slba` hold `want`.
fn expect_data(q: &mut Queue, slba: u64, want: &[u8], what: &str) {
    let got = q.read(NSID, slba, 8, 512).or_panic("read");
    assert_same(&got, want, what);
}

/// The statuses (NVMe Base 2.1, Figure 102 and 3.4.2; NVM Command Set 2.1,
/// 3.2 and its Media and Data Integrity Errors) on a memory namespace:
/// - Identify Controller: ONCS bit 0 (Compare), FUSES bit 0 (Compare and Write).
/// - Compare alone: success when the data match, Compare Failure (SCT 2h,
///   SC 85h) when one byte differs.
/// - Fused, mismatch: the Compare gets Compare Failure, the Write Command
///   Aborted due to Failed Fused Command (09h), and nothing is written;
///   match: both succeed and the Write lands.
/// - A first command followed by a command that is not its second: the
///   first gets Command Aborted due to Missing Fused Command (0Ah), the
///   other runs; a second command alone: 0Ah, nothing written.
/// - Partners whose SLBA or NLB differ: the first Invalid Field, the
///   second 09h, nothing written.
/// - FUSE on a Read: Invalid Field.
#[test]
fn compare_and_fused_compare_and_write_statuses() {
    let _machine = crate::shared();
    let t = Target::start_config(&open_subsystem_config(
        "",
        OPEN_NQN,
        "backend = \"memory\"\nsize = \"16MiB\"",
    ));
    let mut c = open(&t, OPEN_NQN, HOST_A, &Opts::default());
    const BS: u32 = 512;
    assert_eq!(c.id.oncs & 1, 1, "ONCS {:#06x}: Compare", c.id.oncs);
    let id = c
        .admin()
        .identify(cns::CONTROLLER, 0)
        .or_panic("Identify Controller");
    let fuses = get_u16(&id, 522);
    assert_eq!(fuses & 1, 1, "FUSES {fuses:#06x}: Compare and Write");

    let q = &mut c.io[0];
    let mut rng = Rng::new(0xc0);
    let (old, new, other) = (rng.bytes(4096), rng.bytes(4096), rng.bytes(4096));
    let mut wrong = old.clone();
    wrong[4095] ^= 1;
    const SLBA: u64 = 16;
    q.write(NSID, SLBA, &old, BS, false).or_panic("write");
    q.write(NSID, SLBA + 8, &old, BS, false).or_panic("write");
    let compare = |slba, nlb| Queue::rw_sqe(nvm::COMPARE, NSID, slba, nlb);
    let write = |slba, nlb| Queue::rw_sqe(nvm::WRITE, NSID, slba, nlb);

    // Compare alone.
    let done = q.exec(compare(SLBA, 8), Some(&old), 0).or_panic("Compare");
    assert_status(&done, Status::SUCCESS, "Compare of the same data");
    let done = q
        .exec(compare(SLBA, 8), Some(&wrong), 0)
        .or_panic("Compare");
    assert_status(&done, Status::COMPARE_FAILURE, "Compare, last byte differs");

    // Fused, mismatch then match.
    let (cmp, wr) = q
        .compare_and_write(NSID, SLBA, &wrong, &new, BS)
        .or_panic("compare and write");
    assert_status(&cmp, Status::COMPARE_FAILURE, "the Compare of a mismatch");
    assert_status(&wr, Status::ABORTED_FAILED_FUSED, "the Write of a mismatch");
    expect_data(q, SLBA, &old, "after a failed compare and write");
    let (cmp, wr) = q
        .compare_and_write(NSID, SLBA, &old, &new, BS)
        .or_panic("compare and write");
    assert_status(&cmp, Status::SUCCESS, "the Compare of a match");
    assert_status(&wr, Status::SUCCESS, "the Write of a match");
    expect_data(q, SLBA, &new, "after a compare and write");

    // A first command, then a plain Read.
    let first = q
        .submit_fused(compare(SLBA, 8), fuse::FIRST, Some(&new), 0)
        .or_panic("a fused first");
    let read = q
        .submit(Queue::rw_sqe(nvm::READ, NSID, SLBA, 8), None, 8 * BS)
        .or_panic("a Read");
    let done = q.wait(first).or_panic("the fused first");
    assert_status(
        &done,
        Status::ABORTED_MISSING_FUSED,
        "a fused first followed by a Read",
    );
    let done = q.wait(read).or_panic("the Read");
    assert_status(&done, Status::SUCCESS, "the Read after a lone fused first");
    assert_same(&done.data, &new, "the Read after a lone fused first");

    // A second command alone.
    let done = q
        .submit_fused(write(SLBA, 8), fuse::SECOND, Some(&other), 0)
        .and_then(|cid| q.wait(cid))
        .or_panic("a lone fused second");
    assert_status(&done, Status::ABORTED_MISSING_FUSED, "a lone fused second");
    expect_data(q, SLBA, &new, "after a lone fused second");

    // Partners that disagree on SLBA, then on NLB.
    for (second, data, what) in [
        (write(SLBA + 8, 8), &other[..], "another SLBA"),
        (write(SLBA, 4), &other[..2048], "another NLB"),
    ] {
        let first = q
            .submit_fused(compare(SLBA, 8), fuse::FIRST, Some(&new), 0)
            .or_panic("a fused first");
        let second = q
            .submit_fused(second, fuse::SECOND, Some(data), 0)
            .or_panic("a fused second");
        let done = q.wait(first).or_panic("the fused first");
        assert_status(
            &done,
            Status::INVALID_FIELD,
            &format!("a fused first whose second has {what}"),
        );
        let done = q.wait(second).or_panic("the fused second");
        assert_status(
            &done,
            Status::ABORTED_FAILED_FUSED,
            &format!("a fused second with {what}"),
        );
        expect_data(q, SLBA, &new, &format!("after partners with {what}"));
        expect_data(q, SLBA + 8, &old, &format!("after partners with {what}"));
    }

    // FUSE on a Read (followed by a plain Read, so that a target waiting
    // for a partner still answers).
    let fused_read = q
        .submit_fused(
            Queue::rw_sqe(nvm::READ, NSID, SLBA, 8),
            fuse::FIRST,
            None,
            8 * BS,
        )
        .or_panic("a Read with FUSE 01b");
    let read = q
        .submit(Queue::rw_sqe(nvm::READ, NSID, SLBA, 8), None, 8 * BS)
        .or_panic("a Read");
    let done = q.wait(fused_read).or_panic("the Read with FUSE 01b");
    assert_status(&done, Status::INVALID_FIELD, "a Read with FUSE 01b");
    let done = q.wait(read).or_panic("the Read");
    assert_status(&done, Status::SUCCESS, "the Read after it");
}
