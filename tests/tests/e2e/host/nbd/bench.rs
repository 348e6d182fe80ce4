//! `rdmablk bench --verify` against memory and file namespaces.

use super::*;

// ---------------------------------------------------------------- bench

#[test]
fn bench_verify_memory_and_file() {
    let _machine = crate::alone();
    let verify = ["--verify", "--rw", "randrw", "--qd", "32", "--json"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        verify.iter().chain(extra).copied().collect()
    };
    let mem = Target::start(&["--memory", "256MiB"]);
    let r = bench(
        mem.port(),
        DEFAULT_NQN,
        &with(&["--bs", "4k", "--runtime", "2s"]),
    );
    check_bench(&r, 4096.0, &["read", "write"], "memory, 4 KiB");
    // Above the target's 1 MiB MDTS: each I/O is split.
    let r = bench(
        mem.port(),
        DEFAULT_NQN,
        &with(&["--bs", "2m", "--runtime", "2s"]),
    );
    check_bench(&r, 2.0 * MIB as f64, &["read", "write"], "memory, 2 MiB");
    // Spinning on the ring instead of sleeping in it.
    let r = bench(
        mem.port(),
        DEFAULT_NQN,
        &with(&["--bs", "4k", "--runtime", "1s", "--busy-poll"]),
    );
    check_bench(&r, 4096.0, &["read", "write"], "memory, 4 KiB, --busy-poll");
    // Header and data digests, with reads large enough to be received in
    // place and small ones through the receive buffer.
    for bs in ["4k", "256k"] {
        let r = bench(
            mem.port(),
            DEFAULT_NQN,
            &with(&["-g", "-G", "--bs", bs, "--runtime", "1s"]),
        );
        let bytes = rdmablk_common::units::parse_size(bs).expect("size") as f64;
        check_bench(
            &r,
            bytes,
            &["read", "write"],
            &format!("memory, {bs}, digests"),
        );
    }
    let second_queues = || mem.log().matches("qid=2 ").count();
    let before = second_queues();
    let r = bench(
        mem.port(),
        DEFAULT_NQN,
        &with(&["--bs", "4k", "--runtime", "2s", "--queues", "2"]),
    );
    check_bench(&r, 4096.0, &["read", "write"], "memory, 4 KiB, 2 queues");
    assert_eq!(
        second_queues(),
        before + 1,
        "the daemon log should show the bench connect I/O queue 2\n{}",
        mem.log_tail()
    );

    let dir = TempDir::new("bench");
    let img = dir.sparse_file("ns.img", 256 * MIB as u64);
    let file = Target::start(&["--file", path_str(&img)]);
    let r = bench(
        file.port(),
        DEFAULT_NQN,
        &with(&["--bs", "4k", "--runtime", "2s"]),
    );
    check_bench(&r, 4096.0, &["read", "write"], "file, 4 KiB");
}

/// `--verify` fails when someone else overwrites what the run wrote: a
/// second bench (its own run id) writes the same small namespace meanwhile.
#[test]
fn bench_verify_detects_foreign_writes() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "16MiB"]);
    let bench = |rw: &str| {
        let mut c = rdmablk_command("bench", t.port(), DEFAULT_NQN);
        c.args([
            "--verify",
            "--rw",
            rw,
            "--bs",
            "4k",
            "--qd",
            "32",
            "--runtime",
            "2s",
            "--json",
        ]);
        c
    };
    let mut checker = Proc::spawn("rdmablk bench (verifying)", &mut bench("randrw"));
    let mut writer = Proc::spawn("rdmablk bench (foreign writer)", &mut bench("randwrite"));
    let checker_status = checker.wait(TOOL_TIMEOUT);
    let writer_status = writer.wait(TOOL_TIMEOUT);
    assert!(
        writer_status.success(),
        "the writer only writes, so it has nothing to verify: {writer_status}\n{}",
        writer.report()
    );
    assert!(
        !checker_status.success(),
        "bench --verify passed although another run overwrote its blocks\n{}\n{}",
        checker.report(),
        writer.report()
    );
    let v: Value = serde_json::from_str(checker.stdout().trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON result from the failed run ({e})\n{}",
            checker.report()
        )
    });
    assert!(
        v["verify_errors"].as_u64().is_some_and(|n| n > 0),
        "verify_errors in {v}\n{}",
        checker.report()
    );
    assert!(
        checker.stderr().contains("verify: LBA"),
        "the failed run should name a mismatching LBA\n{}",
        checker.report()
    );
}
