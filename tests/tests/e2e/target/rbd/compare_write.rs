//! Compare and Write on an image: a mismatch changes nothing, and hosts
//! racing on two pollers lose no increment, with 4 KiB (the write gate)
//! and with one 512-byte block (librbd's compare-and-write, atomic at the
//! OSD).

use super::*;
use crate::target::caw_race::{counter_block, per_host, race, HOSTS};

/// A target exporting `image` as namespace 1 of [`NQN`] with two pollers
/// (a table of its own after the subsystem's keys).
fn two_poller_target(image: &str) -> Target {
    target(image, "[pollers]\ncount = 2", "20s")
}

/// A fused Compare and Write that mismatches gets Compare Failure and
/// Failed Fused Command and leaves the image as it was; one that matches
/// writes. Then the race of `caw_race::race` ([`HOSTS`] hosts ×
/// [`per_host`] increments of one block), with the counter then read from
/// the cluster by `rbd export`. Every operation on the counter goes to one
/// object, so the single OSD serializes them: this runs as long as the
/// cluster takes for some 8,000 compare-and-writes plus the failed ones and
/// the reads between them.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn compare_and_write_on_an_image_is_atomic() {
    let _machine = crate::alone();
    let img = Image::create("caw", 64 * MIB);
    let t = two_poller_target(&img.name);
    wait_active(&t);
    const SLBA: u64 = 2048;
    {
        let mut c = controller(&t, HOST_A);
        let q = io(&mut c);
        let mut rng = Rng::new(0xcaf);
        let (old, new) = (rng.bytes(4096), rng.bytes(4096));
        let mut wrong = old.clone();
        wrong[100] ^= 0x80;
        q.write(1, SLBA, &old, 512, false).or_panic("write");
        let (cmp, wr) = q
            .compare_and_write(1, SLBA, &wrong, &new, 512)
            .or_panic("compare and write");
        assert_status(&cmp, Status::COMPARE_FAILURE, "the Compare of a mismatch");
        assert_status(&wr, Status::ABORTED_FAILED_FUSED, "the Write of a mismatch");
        let back = q.read(1, SLBA, 8, 512).or_panic("read");
        assert_same(&back, &old, "after a failed compare and write");
        let (cmp, wr) = q
            .compare_and_write(1, SLBA, &old, &new, 512)
            .or_panic("compare and write");
        assert_status(&cmp, Status::SUCCESS, "the Compare of a match");
        assert_status(&wr, Status::SUCCESS, "the Write of a match");
        let back = q.read(1, SLBA, 8, 512).or_panic("read");
        assert_same(&back, &new, "after a compare and write");
    }

    let per_host = per_host();
    let tally = race(t.addr(), NQN, 1, SLBA, per_host, Duration::from_secs(30));
    assert_eq!(tally.increments, HOSTS as u64 * per_host);
    let bs = tally.block_size;
    let dir = TempDir::new("rbd-caw-export");
    let out = dir.join("image");
    rbd(&["export", &img.spec(), out.to_str().expect("path")]).assert_success("rbd export");
    let exported = std::fs::read(&out).or_panic("reading the export");
    let at = (SLBA * bs as u64) as usize;
    assert_same(
        &exported[at..at + bs as usize],
        &counter_block(tally.increments, bs),
        "the counter block in the cluster",
    );
    stop(t);
}
