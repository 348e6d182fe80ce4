//! DH-HMAC-CHAP on rdmablk-target (NVMe Base 2.1, 8.3.4.5) with the test
//! host's implementation (`rdmablk_tests::dhchap`): every queue of a host
//! with a secret authenticates (Connect sets ATR), with each hash and with
//! and without a DH group, one-way and both ways; a wrong secret, a missing
//! one and a wrong controller secret are refused; commands before
//! authentication get Authentication Required; a configuration holding
//! secrets must not be readable by others.

use rdmablk_common::auth::host::AuthError;
use rdmablk_common::auth::message::explanation;
use rdmablk_common::auth::{Hash, Secret};
use rdmablk_common::nvme::identify::cns;
use rdmablk_common::nvme::Status;
use rdmablk_tests::check::{assert_status, OrPanic};
use rdmablk_tests::client::{Controller, Opts, Queue};
use rdmablk_tests::cmdline::tcp_target_args;
use rdmablk_tests::dhchap::{authenticate, secrets, Secrets};
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A, HOST_B};
use rdmablk_tests::{bin_path, free_port, Rng, Target, TempDir};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

fn secret(seed: u8, len: usize, transform: Option<Hash>) -> String {
    let key: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8 * 7)).collect();
    Secret::new(&key, transform).to_dhhc1()
}

/// A configuration where HOST_A authenticates (`host_extra` goes into its
/// table) and HOST_B is listed without a secret; written 0600.
fn write_config(dir: &TempDir, port: u16, host_extra: &str) -> PathBuf {
    let text = format!(
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n\n\
         [[subsystem]]\nnqn = \"{DEFAULT_NQN}\"\nhosts = [\"{HOST_B}\"]\n\
         [[subsystem.host]]\nnqn = \"{HOST_A}\"\n{host_extra}\n\
         [[subsystem.namespace]]\nbackend = \"memory\"\nsize = \"16MiB\"\n"
    );
    let path = dir.join("target.toml");
    std::fs::write(&path, text).or_panic("writing the config");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).or_panic("chmod");
    path
}

fn start(dir: &TempDir, host_extra: &str) -> Target {
    start_with(dir, host_extra, "")
}

/// [`start`] with `top` (e.g. a `[limits]` table) at the top of the file.
fn start_with(dir: &TempDir, host_extra: &str, top: &str) -> Target {
    let path = write_config(dir, free_port(), host_extra);
    let text = std::fs::read_to_string(&path).or_panic("reading the config");
    std::fs::write(&path, format!("{top}\n{text}")).or_panic("writing the config");
    Target::start(&["--config", path.to_str().expect("utf-8")])
}

fn opts(s: Secrets) -> Opts {
    Opts {
        dhchap: Some(s),
        ..Opts::default()
    }
}

/// I/O through a controller whose queues authenticated.
fn io_works(c: &mut Controller) {
    let data = Rng::new(9).bytes(4096);
    c.io[0].write(1, 8, &data, 512, false).or_panic("write");
    assert!(
        c.io[0].read(1, 8, 8, 512).or_panic("read") == data,
        "read back"
    );
}

#[test]
fn every_hash_and_dh_group_authenticates_every_queue() {
    let _machine = crate::shared();
    let dir = TempDir::new("auth");
    let host = secret(1, 32, Some(Hash::Sha256));
    let t = start(&dir, &format!("dhchap_secret = \"{host}\""));
    for (hash, group) in [(1u8, 0u8), (2, 1), (3, 2), (1, 5)] {
        let mut s = secrets(&host, None);
        s.hashes = vec![hash];
        s.dh_groups = vec![group];
        let o = Opts {
            io_queues: 2,
            ..opts(s)
        };
        let mut c = Controller::open(t.addr(), DEFAULT_NQN, HOST_A, &o)
            .or_panic(format_args!("hash {hash}, DH group {group}"));
        io_works(&mut c);
        let log = t.log();
        assert!(!log.contains("authentication failed"), "{}", t.log_tail());
    }
}

#[test]
fn bidirectional_and_key_transforms() {
    let _machine = crate::shared();
    let dir = TempDir::new("auth");
    for (hl, transform) in [
        (32, None),
        (48, Some(Hash::Sha384)),
        (64, Some(Hash::Sha512)),
    ] {
        let host = secret(3, hl, transform);
        let ctrl = secret(4, hl, transform);
        let t = start(
            &dir,
            &format!("dhchap_secret = \"{host}\"\ndhchap_ctrl_secret = \"{ctrl}\""),
        );
        let mut c = Controller::open(
            t.addr(),
            DEFAULT_NQN,
            HOST_A,
            &opts(secrets(&host, Some(&ctrl))),
        )
        .or_panic(format_args!("bidirectional, {hl}-byte keys"));
        io_works(&mut c);
        // A host that expects another controller secret refuses the controller.
        let wrong = secret(5, hl, transform);
        let e = Controller::open(
            t.addr(),
            DEFAULT_NQN,
            HOST_A,
            &opts(secrets(&host, Some(&wrong))),
        );
        assert!(
            e.as_ref()
                .is_err_and(|e| e.to_string().contains("ControllerFailed")),
            "a wrong controller secret was accepted: {:?}",
            e.map(|_| ())
        );
    }
}

#[test]
fn wrong_or_missing_secrets_are_refused() {
    let _machine = crate::shared();
    let dir = TempDir::new("auth");
    let host = secret(6, 32, Some(Hash::Sha256));
    let t = start(&dir, &format!("dhchap_secret = \"{host}\""));
    let wrong = secret(7, 32, Some(Hash::Sha256));
    let e = Controller::open(t.addr(), DEFAULT_NQN, HOST_A, &opts(secrets(&wrong, None)))
        .map(|_| ())
        .expect_err("a wrong host secret was accepted");
    assert!(
        e.to_string()
            .contains(&format!("Refused({})", explanation::FAILED)),
        "{e}"
    );
    assert!(
        t.log().contains("authentication failed"),
        "{}",
        t.log_tail()
    );

    // No secret: the Connect asks for authentication (ATR, Connect response
    // dword 0 bit 17), and commands other than Fabrics ones get
    // Authentication Required with DNR (NVMe Base 2.1, 8.3.4.5; nvmet).
    let mut q = Queue::connect(t.addr(), Default::default()).or_panic("connect");
    let c = q
        .fabrics_connect_full(0, 31, 0, 0, DEFAULT_NQN, HOST_A, [1; 16], 0xffff)
        .or_panic("admin Connect");
    assert_status(&c, Status::SUCCESS, "admin Connect");
    assert_ne!(
        c.cqe.dw0 & 1 << 17,
        0,
        "ATR is set for a host with a secret"
    );
    let st = q
        .exec(Queue::identify_sqe(cns::CONTROLLER, 0), None, 4096)
        .or_panic("Identify");
    assert_status(&st, Status::AUTH_REQUIRED, "Identify before authentication");
    assert!(rdmablk_common::nvme::dnr_of(st.cqe.status), "DNR set");
    // A Negotiate with nothing in common: Failure1, hash not usable.
    let mut none = secrets(&host, None);
    none.hashes = vec![9];
    let e = authenticate(&mut q, 1, &none, HOST_A, DEFAULT_NQN)
        .or_panic("AUTH_Send and AUTH_Receive")
        .expect_err("no common hash");
    assert!(
        matches!(e, AuthError::Refused(x) if x == explanation::HASH_UNUSABLE),
        "{e:?}"
    );

    // A host listed without a secret connects as before, without ATR.
    let c = Controller::open(t.addr(), DEFAULT_NQN, HOST_B, &Opts::default()).or_panic("HOST_B");
    drop(c);
    let mut q = Queue::connect(t.addr(), Default::default()).or_panic("connect");
    let c = q
        .fabrics_connect_full(0, 31, 0, 0, DEFAULT_NQN, HOST_B, [2; 16], 0xffff)
        .or_panic("admin Connect");
    assert_eq!(c.cqe.dw0 & 1 << 17, 0, "no ATR for a host without a secret");
}

#[test]
fn secrets_must_not_be_readable_by_others() {
    let _machine = crate::shared();
    let dir = TempDir::new("auth");
    let host = secret(8, 32, None);
    let path = write_config(&dir, free_port(), &format!("dhchap_secret = \"{host}\""));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).or_panic("chmod");
    let check = |path: &PathBuf| {
        std::process::Command::new(bin_path("rdmablk-target"))
            .args(["--check", "--config"])
            .arg(path)
            .output()
            .or_panic("rdmablk-target --check")
    };
    let out = check(&path);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "--check accepted a world-readable secret"
    );
    assert!(
        err.contains("chmod 600") && !err.contains(&host[10..30]),
        "{err}"
    );
    // A secret file is held to the same rule, and named.
    let file = dir.join("host.key");
    std::fs::write(&file, &host).or_panic("key file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).or_panic("chmod");
    let path = write_config(
        &dir,
        free_port(),
        &format!("dhchap_secret_file = \"{}\"", file.display()),
    );
    let out = check(&path);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("dhchap_secret_file"),
        "{err}"
    );
}

/// `rdmablk` authenticates with --dhchap-secret (and the target with
/// --dhchap-ctrl-secret): bench --verify runs; without a secret, or with a
/// wrong controller secret, it stops with a clear message.
#[test]
fn rdmablk_authenticates_and_says_why_not() {
    let _machine = crate::shared();
    let dir = TempDir::new("auth");
    let host = secret(11, 48, Some(Hash::Sha384));
    let ctrl = secret(12, 48, Some(Hash::Sha384));
    let t = start(
        &dir,
        &format!("dhchap_secret = \"{host}\"\ndhchap_ctrl_secret = \"{ctrl}\""),
    );
    let bench = |extra: &[&str]| {
        std::process::Command::new(bin_path("rdmablk"))
            .arg("bench")
            .args(tcp_target_args(t.port(), Some(DEFAULT_NQN)))
            .args(["-q", HOST_A, "--rw", "randrw", "--bs", "4k"])
            .args(["--qd", "8", "--runtime", "1s", "--verify"])
            .args(extra)
            .output()
            .or_panic("rdmablk bench")
    };
    let ok = bench(&["--dhchap-secret", &host, "--dhchap-ctrl-secret", &ctrl]);
    assert!(
        ok.status.success(),
        "bench with secrets: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let none = bench(&[]);
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(
        !none.status.success() && err.contains("--dhchap-secret"),
        "{err}"
    );
    let wrong = secret(13, 48, Some(Hash::Sha384));
    let bad = bench(&["--dhchap-secret", &host, "--dhchap-ctrl-secret", &wrong]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("failed to prove its identity"),
        "{err}"
    );
    assert!(
        !err.contains(&host[10..30]),
        "a secret in the output: {err}"
    );
}

/// An authentication transaction has a deadline (limits.handshake_timeout):
/// a host that negotiates and then says nothing loses its controller.
#[test]
fn a_stalled_transaction_ends_at_its_deadline() {
    let _machine = crate::shared();
    use rdmablk_common::auth::message::{self, Message};
    let dir = TempDir::new("auth");
    let host = secret(14, 32, None);
    let t = start_with(
        &dir,
        &format!("dhchap_secret = \"{host}\""),
        "[limits]\nhandshake_timeout = \"1s\"\n",
    );
    let mut q = Queue::connect(t.addr(), Default::default()).or_panic("connect");
    q.fabrics_connect_full(0, 31, 0, 0, DEFAULT_NQN, HOST_A, [3; 16], 0xffff)
        .or_panic("admin Connect");
    let negotiate = Message::Negotiate {
        tid: 0,
        sc_c: 0,
        hashes: vec![1],
        dh_groups: vec![0],
    }
    .encode();
    let c = q
        .exec(message::command(true, negotiate.len()), Some(&negotiate), 0)
        .or_panic("AUTH_Send");
    assert_status(&c, Status::SUCCESS, "AUTH_Send Negotiate");
    assert!(
        q.is_closed_by_peer(std::time::Duration::from_secs(5)),
        "a transaction stalled after Negotiate outlived limits.handshake_timeout"
    );
    assert!(
        t.log()
            .contains("authentication not finished within limits.handshake_timeout"),
        "{}",
        t.log_tail()
    );
}

/// CPU time of the daemon's thread named `name`, in clock ticks.
fn thread_ticks(pid: u32, name: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).or_panic("listing threads");
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let stat = std::fs::read_to_string(t.path().join("stat")).or_panic("thread stat");
            // Fields after the command's closing parenthesis: utime and stime
            // are the 12th and 13th.
            let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
            let f: Vec<u64> = rest
                .split(' ')
                .skip(11)
                .take(2)
                .map(|x| x.parse().expect("a tick count"))
                .collect();
            return f[0] + f[1];
        }
    }
    0
}

/// Diffie-Hellman runs off the pollers (ffdhe8192: tens of milliseconds per
/// exponentiation): while hosts authenticate with it, the one poller keeps
/// serving another host's I/O, and the work shows up on the offload thread,
/// not on the poller.
#[test]
fn diffie_hellman_does_not_stall_the_poller() {
    let _machine = crate::shared();
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let dir = TempDir::new("auth");
    let host = secret(15, 32, Some(Hash::Sha256));
    let t = start_with(
        &dir,
        &format!("dhchap_secret = \"{host}\"\ndhchap_dhgroup = [\"ffdhe8192\"]"),
        "[pollers]\ncount = 1\n",
    );
    let poller_before = thread_ticks(t.pid(), "poller-0");
    let storm_over = Arc::new(AtomicBool::new(false));
    // HOST_B has no secret: it reads while the others authenticate.
    let reader = {
        let addr = t.addr();
        let over = storm_over.clone();
        std::thread::spawn(move || {
            let mut c = Controller::open(addr, DEFAULT_NQN, HOST_B, &Opts::default())
                .or_panic("the other host's controller");
            let (mut reads, mut slowest) = (0u64, Duration::ZERO);
            while !over.load(Ordering::Acquire) {
                let t0 = Instant::now();
                c.io[0]
                    .read(1, 0, 8, 512)
                    .or_panic("read during the authentications");
                slowest = slowest.max(t0.elapsed());
                reads += 1;
            }
            (reads, slowest)
        })
    };
    let hosts: Vec<_> = (0..4)
        .map(|_| {
            let (addr, host) = (t.addr(), host.clone());
            std::thread::spawn(move || {
                let mut s = secrets(&host, None);
                s.dh_groups = vec![5];
                let o = Opts {
                    io_queues: 2,
                    ..opts(s)
                };
                let mut c = Controller::open(addr, DEFAULT_NQN, HOST_A, &o)
                    .or_panic("authenticating with ffdhe8192");
                io_works(&mut c);
            })
        })
        .collect();
    for h in hosts {
        h.join().expect("an authenticating host");
    }
    storm_over.store(true, Ordering::Release);
    let (reads, slowest) = reader.join().expect("the other host");
    let poller = thread_ticks(t.pid(), "poller-0") - poller_before;
    let offload = thread_ticks(t.pid(), "offload");
    println!(
        "12 ffdhe8192 transactions: offload thread {offload} ticks, poller {poller} ticks; \
         the other host read {reads} times, slowest {slowest:?}"
    );
    assert!(reads > 0, "the other host's reads did not complete");
    // Twelve transactions, two exponentiations each (the key pair, the
    // shared secret), priced here by one of them in this process: at least
    // a quarter of that work shows on the offload thread (none before it
    // existed; the machine is shared, so the bound is loose).
    let t0 = Instant::now();
    let _ =
        rdmablk_common::auth::ffdhe::KeyPair::generate(rdmablk_common::auth::DhGroup::Ffdhe8192);
    let one = t0.elapsed();
    let expected = 24.0 * one.as_secs_f64() * 100.0;
    assert!(
        offload as f64 >= expected / 4.0,
        "the offload thread did {offload} ticks of the Diffie-Hellman work, about {expected:.0} expected"
    );
    assert!(
        !t.log().contains("authentication failed"),
        "{}",
        t.log_tail()
    );
}

/// A failed re-authentication ends the controller (NVMe Base 2.1,
/// 8.3.4.5.1; nvmet): the moment the AUTH_Failure1 is returned, every queue
/// of the controller closes (within 20 ms here, on a shared machine; it
/// takes microseconds), and a command sent after that gets no answer.
#[test]
fn a_failed_reauthentication_closes_the_controllers_queues_at_once() {
    let _machine = crate::alone();
    let dir = TempDir::new("auth");
    let host = secret(6, 32, Some(Hash::Sha256));
    let t = start_with(
        &dir,
        &format!("dhchap_secret = \"{host}\""),
        "[pollers]\ncount = 2\n",
    );
    let opts = Opts {
        io_queues: 2,
        kato_ms: 0,
        auto_keep_alive: false,
        ..opts(secrets(&host, None))
    };
    let mut c = Controller::open(t.addr(), DEFAULT_NQN, HOST_A, &opts).or_panic("connect");
    io_works(&mut c);
    let wrong = secrets(&secret(7, 32, Some(Hash::Sha256)), None);
    let refused = authenticate(&mut c.admin(), 2, &wrong, HOST_A, DEFAULT_NQN)
        .or_panic("re-authentication")
        .expect_err("a wrong secret re-authenticated");
    let ended = std::time::Instant::now();
    assert!(matches!(refused, AuthError::Refused(_)), "{refused:?}");
    let mut slowest = std::time::Duration::ZERO;
    for q in c.io.iter_mut() {
        assert!(
            q.is_closed_by_peer(std::time::Duration::from_secs(1)),
            "an I/O queue stayed open after the failed re-authentication\n{}",
            t.log_tail()
        );
        slowest = slowest.max(ended.elapsed());
    }
    assert!(
        c.admin()
            .is_closed_by_peer(std::time::Duration::from_secs(1)),
        "the admin queue stayed open\n{}",
        t.log_tail()
    );
    eprintln!("re-authentication failed: the I/O queues closed within {slowest:?}");
    assert!(
        slowest < std::time::Duration::from_millis(20),
        "queues closed {slowest:?} after the failure\n{}",
        t.log_tail()
    );
    assert!(
        c.admin().keep_alive().is_err(),
        "a command on the ended controller's admin queue was answered"
    );
}
