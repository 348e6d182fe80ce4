//! `rdmablk discover`, targets of other makes (completions in data PDUs,
//! SPDK-style completions, retryable statuses), and connects that are refused.

use super::*;

// ---------------------------------------------------------------- discover

/// The NVM subsystem entries of `rdmablk discover`'s output, as key/value
/// maps; the record count must match all entries printed, and the current
/// discovery subsystem's entry (always listed) is checked and left out.
fn discover(
    port: u16,
    host: &str,
    extra: &[&str],
) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut c = Command::new(rdmablk_tests::bin_path("rdmablk"));
    c.arg("discover")
        .args(tcp_target_args(port, None))
        .args(["-q", host])
        .args(extra);
    let r = run("rdmablk discover", &mut c, TOOL_TIMEOUT);
    r.assert_success(&format!("discovery as {host}"));
    let records: usize = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Discovery Log Number of Records "))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `Discovery Log Number of Records N`\n{}", r.report()));
    let entries: Vec<_> = r
        .stdout
        .split("=====Discovery Log Entry")
        .skip(1)
        .map(|block| {
            block
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .collect()
        })
        .collect();
    assert_eq!(
        entries.len(),
        records,
        "entries vs the record count\n{}",
        r.report()
    );
    let (current, subsystems): (Vec<_>, Vec<_>) =
        entries
            .into_iter()
            .partition(|e: &std::collections::BTreeMap<String, String>| {
                e.get("subtype").map(String::as_str) == Some("current discovery subsystem")
            });
    assert_eq!(
        current.len(),
        1,
        "one listener, one current discovery entry\n{}",
        r.report()
    );
    assert_eq!(
        current[0].get("eflags").map(String::as_str),
        Some("explicit discovery connections, duplicate discovery information"),
        "{}",
        r.report()
    );
    subsystems
}

#[test]
fn discover_lists_subsystems() {
    let _machine = crate::alone();
    let t = Target::start_config(&two_subsystems_config());
    let port = t.port().to_string();
    let nqns = |host: &str| {
        let mut nqns: Vec<String> = discover(t.port(), host, &[])
            .into_iter()
            .map(|e| {
                let what = format!("entry {e:?} as seen by {host}");
                assert_eq!(e.get("trtype").map(String::as_str), Some("tcp"), "{what}");
                assert_eq!(e.get("adrfam").map(String::as_str), Some("ipv4"), "{what}");
                assert_eq!(
                    e.get("subtype").map(String::as_str),
                    Some("nvme subsystem"),
                    "{what}"
                );
                assert_eq!(e.get("trsvcid"), Some(&port), "{what}");
                assert_eq!(
                    e.get("traddr").map(String::as_str),
                    Some("127.0.0.1"),
                    "{what}"
                );
                e.get("subnqn").cloned().unwrap_or_default()
            })
            .collect();
        nqns.sort();
        nqns
    };
    assert_eq!(
        nqns(HOST_A),
        vec![OPEN_NQN.to_string(), PRIVATE_NQN.to_string()],
        "subsystems listed for the allowed host"
    );
    assert_eq!(
        nqns(HOST_B),
        vec![OPEN_NQN.to_string()],
        "subsystems listed for a host only the open subsystem admits"
    );
}

/// `--disable-sqflow`: the host asks every queue to run without SQ flow
/// control (NVMe over Fabrics 1.1, Figure 20), and rdmablk-target then ends
/// reads and Identify with a C2HData PDU flagged SUCCESS and no response
/// capsule (NVMe/TCP 1.0, 3.6.2.9), as SPDK does unasked. Discovery, the
/// admin bring-up and bench --verify take those completions, with and
/// without digests. The listener is a wildcard: the discovery entry names
/// the address this host reached (as nvmet's disc_traddr).
#[test]
fn host_takes_completions_in_data_pdus() {
    let _machine = crate::alone();
    let port = rdmablk_tests::free_port();
    let listen = format!("tcp://0.0.0.0:{port}");
    let t = Target::start(&["--listen", &listen, "--memory", "64MiB"]);
    let entries = discover(t.port(), HOST_A, &["--disable-sqflow"]);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        entries[0].get("subnqn").map(String::as_str),
        Some(DEFAULT_NQN)
    );
    assert_eq!(
        entries[0].get("traddr").map(String::as_str),
        Some("127.0.0.1"),
        "a wildcard listener is reported at the address reached"
    );
    verify_small_and_large(t.port(), &["--disable-sqflow"]);
}

/// Without `-n`, the host reads the discovery log and uses the one NVMe
/// subsystem it lists for this host, at the address its entry names, and
/// disables SQ flow control because the entry allows it (TREQ bit 2, NVMe
/// over Fabrics 1.1 Figure 40; the Connect responses' SQHD FFFFh confirm
/// it). Where the log lists two subsystems, the host names both and asks
/// for `-n` instead of guessing.
#[test]
fn host_uses_the_subsystem_the_discovery_log_lists() {
    let _machine = crate::alone();
    let t = Target::start_config(&two_subsystems_config());
    let bench_without_nqn = |extra: &[&str]| {
        let mut c = Command::new(rdmablk_tests::bin_path("rdmablk"));
        c.arg("bench")
            .args(tcp_target_args(t.port(), None))
            .args(["--verify", "--rw", "randrw", "--bs", "4k", "--qd", "16"])
            .args(["--runtime", "1s", "--json"])
            .args(extra)
            .env("RUST_LOG", "rdmablk=debug");
        run("rdmablk bench without -n", &mut c, TOOL_TIMEOUT)
    };
    // This host may use only the open subsystem: that one is connected.
    let r = bench_without_nqn(&[]);
    check_bench(&r, 4096.0, &["read", "write"], "bench without -n");
    assert!(
        r.stderr.contains(&format!("subnqn={OPEN_NQN}")),
        "the discovered subsystem is not named in the log\n{}",
        r.report()
    );
    let disabled = r.stderr.matches("sq_flow_control=false").count();
    assert!(
        disabled >= 2,
        "SQ flow control not disabled on the admin and I/O queues ({disabled} queues)\n{}",
        r.report()
    );
    // HOST_A may use both: the host asks which.
    let r = bench_without_nqn(&["-q", HOST_A]);
    assert!(!r.status.success(), "{}", r.report());
    for want in ["choose one with -n", OPEN_NQN, PRIVATE_NQN] {
        assert!(r.stderr.contains(want), "no {want:?}\n{}", r.report());
    }
}

/// bench --verify with 4 KiB I/Os, then 256 KiB ones with digests, each
/// with `extra` options.
fn verify_small_and_large(port: u16, extra: &[&str]) {
    for (bs, bytes, digests) in [("4k", 4096.0, false), ("256k", 262144.0, true)] {
        let mut args = vec![
            "--verify",
            "--rw",
            "randrw",
            "--qd",
            "16",
            "--bs",
            bs,
            "--runtime",
            "1s",
            "--json",
        ];
        args.extend_from_slice(extra);
        if digests {
            args.extend(["-g", "-G"]);
        }
        let r = bench(port, DEFAULT_NQN, &args);
        let what = format!("{bs}, digests {digests}");
        check_bench(&r, bytes, &["read", "write"], &what);
    }
}

/// Against a target that answers as SPDK's nvmf_tgt does with its default
/// options: a read or an Identify that completes with nothing to say ends
/// with its last C2HData PDU flagged SUCCESS and no response capsule,
/// although the host never asked to disable SQ flow control (NVMe/TCP 1.0,
/// 3.6.2.9; SPDK lib/nvmf/tcp.c). Discovery, connect with an NBD export
/// (qemu-io through it) and bench --verify, with and without digests.
#[test]
fn works_with_spdk_style_completions() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let proxy = rdmablk_tests::proxy::Proxy::spdk_style(t.port());
    let entries = discover(proxy.port(), HOST_A, &[]);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        entries[0].get("subnqn").map(String::as_str),
        Some(DEFAULT_NQN)
    );
    let folded = proxy.changed();
    assert!(
        folded > 0,
        "the discovery's Identify and log pages came without capsules"
    );
    verify_small_and_large(proxy.port(), &[]);
    assert!(
        proxy.changed() > folded + 100,
        "reads completed in their data"
    );
    let e = NbdExport::start(proxy.port(), DEFAULT_NQN, &[]);
    qemu_io_ok(
        e.uri(),
        &[
            "write -P 0x5a 1048576 3145728",
            "read -P 0x5a 1048576 3145728",
            "write -z 0 1048576",
            "read -P 0 0 1048576",
        ],
        "an NBD export over an SPDK-style target",
    );
}

/// A target that answers some I/O with Command Interrupted, DNR clear and
/// CRD 1 (NVMe Base 2.1, 4.2.3.1 and Figure 101: a status the host retries
/// after CRDT1, which the host enabled with ACRE): bench --verify completes
/// without an error, every such command retried after the delay.
#[test]
fn retryable_statuses_are_retried() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let proxy = rdmablk_tests::proxy::Proxy::interrupting(t.port(), 50);
    verify_through(&proxy, &[], "2s", "every 50th response interrupted");
}

/// `bench --verify` (random reads and writes, 4 KiB, QD 8) for `runtime`
/// through `proxy`, with `extra` arguments: no error, and the proxy changed
/// responses.
fn verify_through(proxy: &rdmablk_tests::proxy::Proxy, extra: &[&str], runtime: &str, what: &str) {
    let common = [
        "--verify",
        "--rw",
        "randrw",
        "--qd",
        "8",
        "--bs",
        "4k",
        "--runtime",
        runtime,
        "--json",
    ];
    let args: Vec<&str> = extra.iter().copied().chain(common).collect();
    let r = bench(proxy.port(), DEFAULT_NQN, &args);
    check_bench(&r, 4096.0, &["read", "write"], what);
    assert!(proxy.changed() > 0, "the proxy interrupted responses");
}

/// A command waiting for its retry delay (Command Interrupted, CRD 1) on
/// a queue whose connection then closes (the target went away) is sent
/// again on the other path: bench --verify over two paths, one through a
/// proxy that closes the connection right after each interrupted response
/// (every 200th: the path comes and goes some 30 times in 3 s), ends on
/// time without an error. Two ways commands were lost with a dead queue:
/// the waiting command stayed with it; and when the failed send ended
/// after the receive saw the close, the queue's commands were never
/// completed, so the queue was replaced with them in it.
#[test]
fn a_command_waiting_to_retry_on_a_dying_queue_goes_to_another_path() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let proxy = rdmablk_tests::proxy::Proxy::interrupting_then_closing(t.port(), 200);
    let direct = format!("tcp://127.0.0.1:{}", t.port());
    verify_through(
        &proxy,
        &["--path", &direct],
        "3s",
        "a path closing after interrupted responses",
    );
}

// ---------------------------------------------------------------- refused connects

/// `rdmablk connect` to something that refuses: exits non-zero within
/// seconds, says `cause` on stderr, never prints `ready:` nor creates the socket.
fn assert_refused(port: u16, nqn: &str, extra: &[&str], cause: &str, what: &str) {
    let dir = TempDir::new("refused");
    let sock = dir.join("nbd.sock");
    let listen = format!("unix:{}", sock.display());
    let mut c = rdmablk_tests::rdmablk_command("connect", port, nqn);
    c.args(["--nbd", &listen]).args(extra);
    let started = Instant::now();
    let mut p = Proc::spawn("rdmablk connect", &mut c);
    let status = p.wait_timeout(EXIT_WITHIN).unwrap_or_else(|| {
        p.kill();
        panic!(
            "{what}: rdmablk connect still running after {EXIT_WITHIN:?}\n{}",
            p.report()
        )
    });
    let took = started.elapsed();
    assert!(
        !status.success(),
        "{what}: exit status {status}\n{}",
        p.report()
    );
    assert!(
        p.stderr().contains(cause),
        "{what}: stderr does not say {cause:?}\n{}",
        p.report()
    );
    assert!(
        !p.stdout().contains("ready:"),
        "{what}: printed ready:\n{}",
        p.report()
    );
    assert!(
        !sock.exists(),
        "{what}: {} was created although no association was made",
        sock.display()
    );
    eprintln!("{what}: refused in {took:.2?}");
}

#[test]
fn refused_connects_exit_nonzero() {
    let _machine = crate::alone();
    assert_refused(
        free_port(),
        DEFAULT_NQN,
        &[],
        "no NVMe-oF target listens",
        "nothing listening",
    );

    let t = Target::start(&["--memory", "16MiB"]);
    let unknown = "nqn.2026-11.io.rdmablk:no-such-subsystem";
    assert_refused(t.port(), unknown, &[], "has no subsystem", "unknown NQN");

    let c = Target::start_config(&two_subsystems_config());
    assert_refused(
        c.port(),
        PRIVATE_NQN,
        &["-q", HOST_B],
        "not allowed",
        "host not on the allow-list",
    );
    // The same subsystem admits the listed host: the refusal was about the host.
    let mut e = NbdExport::start(c.port(), PRIVATE_NQN, &["-q", HOST_A]);
    assert!(e.socket().exists(), "socket of the admitted host's export");
    e.proc().signal(libc::SIGTERM);
    let status = e.proc().wait(EXIT_WITHIN);
    assert!(
        status.success(),
        "the admitted host's export after SIGTERM: {status}"
    );
}
