//! The NBD export with many clients, and with clients that misbehave: every
//! client gets its own bytes back however many share the export, a full
//! export says so (NBD_REP_ERR_POLICY) to a real client, and a handshake
//! that trickles is cut at its deadline while others are greeted.
//!
//! Each test runs alone (`crate::alone`): it runs a target, an export and
//! many clients.

use rdmablk_tests::limits::raise_open_files_limit;
use rdmablk_tests::names::DEFAULT_NQN;
use rdmablk_tests::nbd::{client_flags, read_greeting, NbdClient, Refused, REP_ERR_POLICY};
use rdmablk_tests::{run, NbdExport, Rng, Target};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Bytes each client owns in the many-client tests.
const REGION: usize = 64 << 10;

/// Connects to the export on `socket`, writes its own region with its own
/// bytes, reads it back.
fn own_region(socket: &Path, i: usize) -> Result<NbdClient, String> {
    let mut c = NbdClient::connect(socket).map_err(|r| format!("client {i}: {r:?}"))?;
    let data = Rng::new(i as u64 + 1).bytes(REGION);
    let at = (i * REGION) as u64;
    c.write(at, &data)
        .map_err(|err| format!("client {i}: write: {err}"))?;
    let back = c
        .read(at, REGION as u32)
        .map_err(|err| format!("client {i}: read: {err}"))?;
    if back != data {
        return Err(format!("client {i}: read back other bytes than it wrote"));
    }
    Ok(c)
}

/// 200 clients connected at the same time over two engines, each writing
/// and verifying its own region; then they all read again, with all of
/// them still connected.
#[test]
fn two_hundred_clients_at_once() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &["-i", "2"]);
    let n = 200;
    let all_in = Arc::new(Barrier::new(n));
    let sock = e.socket().to_path_buf();
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (sock, all_in) = (sock.clone(), all_in.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let first = own_region(&sock, i);
                all_in.wait();
                let mut c = first?;
                let data = Rng::new(i as u64 + 1).bytes(REGION);
                let back = c
                    .read((i * REGION) as u64, REGION as u32)
                    .map_err(|err| format!("client {i}: second read: {err}"))?;
                (back == data)
                    .then_some(())
                    .ok_or_else(|| format!("client {i}: second read differs"))
            })
        })
        .collect();
    let failures: Vec<String> = threads
        .into_iter()
        .filter_map(|h| h.join().expect("client thread").err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {n} clients failed, first: {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        e.report()
    );
}

/// Four clients keep verified I/O going while, five times, 40 clients
/// join, write and verify their regions and leave: none of the four sees
/// an error.
#[test]
fn clients_come_and_go_while_others_work() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &["-i", "2"]);
    let sock: PathBuf = e.socket().to_path_buf();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let steady: Vec<_> = (0..4)
        .map(|k| {
            let (sock, stop, done) = (sock.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || -> Result<(), String> {
                // Regions 900.. are theirs.
                let i = 900 + k;
                let mut c = own_region(&sock, i)?;
                let mut rng = Rng::new(k as u64);
                while !stop.load(Ordering::Acquire) {
                    let data = rng.bytes(REGION);
                    let at = (i * REGION) as u64;
                    c.write(at, &data)
                        .map_err(|err| format!("steady {k}: {err}"))?;
                    let back = c
                        .read(at, REGION as u32)
                        .map_err(|err| format!("steady {k}: {err}"))?;
                    if back != data {
                        return Err(format!("steady {k}: read back other bytes"));
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    for round in 0..5 {
        let visitors: Vec<_> = (0..40)
            .map(|i| {
                let sock = sock.clone();
                std::thread::spawn(move || own_region(&sock, round * 40 + i).map(drop))
            })
            .collect();
        for v in visitors {
            if let Err(err) = v.join().expect("visitor") {
                panic!("round {round}: {err}\n{}", e.report());
            }
        }
    }
    stop.store(true, Ordering::Release);
    for s in steady {
        if let Err(err) = s.join().expect("steady client") {
            panic!("{err}\n{}", e.report());
        }
    }
    assert!(
        done.load(Ordering::Relaxed) > 0,
        "the steady clients did I/O"
    );
}

/// Two clients post 64 reads of 2 MiB each and never read their socket:
/// each holds at most its share of the engine's arena, and a third client
/// on the same engine keeps completing verified I/O (its rate printed).
#[test]
fn clients_that_do_not_read_cannot_stall_others() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "256MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let hogs: Vec<NbdClient> = (0..2)
        .map(|_| {
            let mut c = NbdClient::connect(e.socket()).expect("a client that will not read");
            for k in 0..64u64 {
                c.post_read(k * (2 << 20), 2 << 20).expect("posting a read");
            }
            c
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let mut c = own_region(e.socket(), 3).unwrap_or_else(|err| panic!("{err}\n{}", e.report()));
    let data = Rng::new(3).bytes(REGION);
    let (start, mut pairs) = (Instant::now(), 0u32);
    while start.elapsed() < Duration::from_secs(5) {
        let at = (3 * REGION) as u64;
        c.write(at, &data)
            .unwrap_or_else(|err| panic!("{err}\n{}", e.report()));
        let back = c.read(at, REGION as u32).expect("read");
        assert!(back == data, "read back other bytes");
        pairs += 1;
    }
    let rate = pairs as f64 / start.elapsed().as_secs_f64();
    println!("{pairs} verified 64 KiB write+read pairs in 5 s ({rate:.0}/s) beside two clients that do not read");
    assert!(pairs >= 20, "only {pairs} pairs in 5 s\n{}", e.report());
    drop(hogs);
}

/// Requests past the end get the errors NBD's proto.md names (ENOSPC for
/// a write, EINVAL for a read), also where offset + length overflows 64
/// bits; the client goes on being served.
#[test]
fn requests_past_the_end() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let mut c = own_region(e.socket(), 0).unwrap_or_else(|err| panic!("{err}"));
    let end = 64u64 << 20;
    let refused = |r: std::io::Result<()>, errno: i32, what: &str| match r {
        Err(err) => assert!(
            err.to_string() == format!("NBD error {errno}"),
            "{what}: {err}"
        ),
        Ok(()) => panic!("{what}: served"),
    };
    refused(
        c.read(end - 512, 1024).map(drop),
        libc::EINVAL,
        "read across the end",
    );
    refused(
        c.read(u64::MAX - 511, 4096).map(drop),
        libc::EINVAL,
        "read whose end overflows",
    );
    refused(
        c.write(end - 512, &[7; 1024]),
        libc::ENOSPC,
        "write across the end",
    );
    refused(
        c.write(u64::MAX - 511, &[7; 4096]),
        libc::ENOSPC,
        "write whose end overflows",
    );
    let data = Rng::new(9).bytes(4096);
    c.write(end - 4096, &data).expect("the last block");
    assert!(
        c.read(end - 4096, 4096).expect("read") == data,
        "{}",
        e.report()
    );
}

/// A read-only namespace: writes, trims and write-zeroes are refused with
/// EPERM, also past the end (NBD proto.md: EPERM before range checks of
/// writing requests on a read-only export), and reads are served.
#[test]
fn read_only_exports_refuse_writes() {
    let _machine = crate::alone();
    let t = Target::start_config(
        r#"
[[listener]]
transport = "tcp"
address = "127.0.0.1:{port}"

[[subsystem]]
nqn = "nqn.2026-11.io.rdmablk:default"
allow_any_host = true

  [[subsystem.namespace]]
  backend = "memory"
  size = "16MiB"
  read_only = true
"#,
    );
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let mut c = NbdClient::connect(e.socket()).unwrap_or_else(|r| panic!("{r:?}"));
    let eperm = format!("NBD error {}", libc::EPERM);
    let end = 16u64 << 20;
    for (what, r) in [
        ("write", c.write(0, &[1; 4096])),
        ("write past the end", c.write(end, &[1; 4096])),
        ("trim", c.trim(0, 4096)),
        ("write zeroes", c.write_zeroes(4096, 4096)),
    ] {
        match r {
            Err(err) => assert_eq!(err.to_string(), eperm, "{what}"),
            Ok(()) => panic!("{what} on a read-only export was served"),
        }
    }
    assert!(c.read(0, 4096).expect("a read").iter().all(|&b| b == 0));
}

/// `--nbd-max-clients 4`: a fifth client is told the export is full
/// (NBD_REP_ERR_POLICY, NBD proto.md "NBD_OPT_GO") and nbdinfo shows the
/// message; once one of the four leaves, a new client is served.
#[test]
fn a_full_export_says_so() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &["--nbd-max-clients", "4"]);
    let mut four: Vec<NbdClient> = (0..4)
        .map(|i| own_region(e.socket(), i).unwrap_or_else(|err| panic!("{err}\n{}", e.report())))
        .collect();
    match NbdClient::connect(e.socket()) {
        Err(Refused::Reply(kind, msg)) => {
            assert_eq!(kind, REP_ERR_POLICY, "{msg}");
            assert!(msg.contains("as many clients"), "{msg}");
        }
        Err(err) => panic!("a fifth client: {err:?}"),
        Ok(_) => panic!("a fifth client was served by an export of four"),
    }
    let r = run(
        "nbdinfo",
        Command::new("nbdinfo").arg(e.uri()),
        Duration::from_secs(30),
    );
    // libnbd reports the refusal of NBD_OPT_GO without the server's text.
    assert!(
        !r.status.success() && r.stderr.contains("opt_go"),
        "nbdinfo on a full export\n{}",
        r.report()
    );
    assert!(
        e.report().contains("NBD export is full"),
        "the export logs the refusal\n{}",
        e.report()
    );
    drop(four.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match own_region(e.socket(), 5) {
            Ok(_) => break,
            Err(err) if Instant::now() > deadline => panic!("after one left: {err}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A client that sends its handshake a byte every two seconds is cut at
/// the handshake deadline (10 s from its connect), and meanwhile other
/// clients are greeted and served.
#[test]
fn a_trickling_handshake_is_cut_at_its_deadline() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let mut slow = UnixStream::connect(e.socket()).expect("connect");
    let start = Instant::now();
    read_greeting(&mut slow).expect("greeting");
    slow.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let flags = client_flags();
    let mut sent = 0;
    let mut last = Instant::now() - Duration::from_secs(2);
    let mut others_served = false;
    let closed_after = loop {
        if last.elapsed() >= Duration::from_secs(2) {
            // One byte of the client flags, then one byte of an option.
            let b = flags.get(sent).copied().unwrap_or(0x49);
            if slow.write_all(&[b]).is_err() {
                break start.elapsed();
            }
            sent += 1;
            last = Instant::now();
        }
        if !others_served {
            own_region(e.socket(), 1).unwrap_or_else(|err| panic!("while one trickles: {err}"));
            others_served = true;
        }
        let mut buf = [0u8; 64];
        match slow.read(&mut buf) {
            Ok(0) => break start.elapsed(),
            Ok(_) => panic!("the server answered a handshake that is not done"),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break start.elapsed(),
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the trickling client is still connected after 20 s\n{}",
            e.report()
        );
    };
    assert!(others_served);
    assert!(
        closed_after >= Duration::from_secs(9) && closed_after < Duration::from_secs(14),
        "closed {closed_after:?} after connecting, want about 10 s\n{}",
        e.report()
    );
}

/// 1,000 clients that connect and say nothing, each connecting again as
/// soon as the export closes it (at its 10 s handshake deadline), for 14 s,
/// neither fill the export nor
/// keep others out: a new client
/// (nbdinfo, then nbdcopy reading the whole export back) is greeted and
/// served every time meanwhile, each within 5 s (the slowest printed),
/// the bytes it reads those written before.
#[test]
fn silent_handshakes_cannot_lock_clients_out() {
    const SILENT: usize = 1000;
    let _machine = crate::alone();
    raise_open_files_limit(SILENT as u64 + 512);
    let t = Target::start(&["--memory", "8MiB"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    let data = Rng::new(30).bytes(8 << 20);
    let dir = rdmablk_tests::TempDir::new("nbd-silent");
    let (src, back) = (dir.join("src.img"), dir.join("back.img"));
    std::fs::write(&src, &data).expect("the image to write");
    run(
        "nbdcopy",
        Command::new("nbdcopy").arg(&src).arg(e.uri()),
        Duration::from_secs(60),
    )
    .assert_success("nbdcopy into the export");

    let stop = Arc::new(AtomicBool::new(false));
    let churned = Arc::new(AtomicU64::new(0));
    let silent = {
        let (socket, stop, churned) = (e.socket().to_path_buf(), stop.clone(), churned.clone());
        std::thread::spawn(move || {
            // Each connects, reads its greeting and says nothing; closed by
            // the export, it connects again at once.
            let connect = || {
                let s = UnixStream::connect(&socket).ok()?;
                s.set_nonblocking(true).ok()?;
                churned.fetch_add(1, Ordering::Relaxed);
                Some(s)
            };
            let mut held: Vec<Option<UnixStream>> = (0..SILENT).map(|_| connect()).collect();
            let mut buf = [0u8; 256];
            while !stop.load(Ordering::Acquire) {
                for h in held.iter_mut() {
                    let closed = match h {
                        Some(s) => match s.read(&mut buf) {
                            Ok(0) => true,
                            Ok(_) => false,
                            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                        },
                        None => true,
                    };
                    if closed {
                        *h = connect();
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut rounds = 0;
    while start.elapsed() < Duration::from_secs(14) {
        let t0 = Instant::now();
        let info = run(
            "nbdinfo",
            Command::new("nbdinfo").arg(e.uri()),
            Duration::from_secs(10),
        );
        assert!(
            info.status.success(),
            "nbdinfo among silent clients\n{}\n{}",
            info.report(),
            e.report()
        );
        let _ = std::fs::remove_file(&back);
        let copy = run(
            "nbdcopy",
            Command::new("nbdcopy").arg(e.uri()).arg(&back),
            Duration::from_secs(10),
        );
        assert!(
            copy.status.success(),
            "nbdcopy among silent clients\n{}\n{}",
            copy.report(),
            e.report()
        );
        let took = t0.elapsed();
        assert!(
            std::fs::read(&back).expect("the copy") == data,
            "nbdcopy read other bytes than written"
        );
        slowest = slowest.max(took);
        rounds += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Release);
    silent.join().expect("the silent clients");
    eprintln!(
        "NBD export: {rounds} rounds of nbdinfo + nbdcopy among {SILENT} silent clients ({} connects in 14 s), slowest {slowest:?}",
        churned.load(Ordering::Relaxed)
    );
    assert!(
        slowest < Duration::from_secs(5),
        "slowest round {slowest:?}\n{}",
        e.report()
    );
    assert!(
        churned.load(Ordering::Relaxed) > SILENT as u64,
        "the silent clients reconnected"
    );
}
