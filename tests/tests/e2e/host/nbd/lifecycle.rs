//! The export's life: clients fed through a pipe, a killed client,
//! SIGTERM and SIGINT, a restarted target, and giving up after ctrl-loss-tmo.

use super::*;

// ---------------------------------------------------------------- clients fed through a pipe

/// A thread that streams random bytes into a client's stdin (`nbdcopy -- -
/// URI` copies them to the export as they come). It writes while fewer than
/// `budget` bytes went in, then holds the pipe open, so the client waits for
/// more instead of finishing; once `kill_at` bytes went in it SIGKILLs the
/// victim, if it has one, right in the stream.
struct Feeder {
    written: Arc<AtomicU64>,
    budget: Arc<AtomicU64>,
    kill_at: Arc<AtomicU64>,
    killed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    /// `victim` must be a child not yet reaped (the caller does not reap it
    /// while `kill_at` can be reached).
    fn start(mut sink: std::process::ChildStdin, budget: u64, victim: Option<u32>) -> Feeder {
        let written = Arc::new(AtomicU64::new(0));
        let budget = Arc::new(AtomicU64::new(budget));
        let kill_at = Arc::new(AtomicU64::new(u64::MAX));
        let killed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (w, b, k, kd, s) = (
            written.clone(),
            budget.clone(),
            kill_at.clone(),
            killed.clone(),
            stop.clone(),
        );
        let handle = std::thread::spawn(move || {
            let mut rng = Rng::new(0x6665_6564);
            let mut chunk = vec![0u8; 256 << 10];
            while !s.load(Ordering::Relaxed) {
                let done = w.load(Ordering::Relaxed);
                if done >= k.load(Ordering::Relaxed) {
                    if let Some(pid) = victim {
                        rdmablk_tests::send_signal(pid, libc::SIGKILL);
                        kd.store(true, Ordering::Relaxed);
                    }
                    return;
                }
                if done >= b.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                rng.fill(&mut chunk);
                if sink.write_all(&chunk).is_err() {
                    return; // the client is gone
                }
                w.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        });
        Feeder {
            written,
            budget,
            kill_at,
            killed,
            stop,
            handle: Some(handle),
        }
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Waits until `bytes` went in; panics (with the client's output) if the
    /// client exits or stalls first.
    fn wait_written(&self, bytes: u64, client: &mut Proc) {
        let ok = poll_until(Duration::from_secs(20), || {
            self.written() >= bytes || !client.is_running()
        });
        let running = client.is_running();
        assert!(
            ok && running,
            "{} took {} of {bytes} bytes and is {}\n{}",
            client.name(),
            self.written(),
            if running { "stalled" } else { "gone" },
            client.report()
        );
    }

    /// Waits for the thread to end (it ends once `kill_at` is reached, the
    /// client is gone, or `stop`); true if it did within `timeout`.
    fn join(&mut self, timeout: Duration) -> bool {
        let Some(h) = self.handle.take() else {
            return true;
        };
        if !poll_until(timeout, || h.is_finished()) {
            self.handle = Some(h);
            return false;
        }
        h.join().expect("the feeder thread panicked");
        true
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A feeder blocked on a full pipe ends when its client dies, which
        // the caller's Proc ensures when it drops; do not wait here.
    }
}

fn settled_fd_count(pid: u32, want: usize, timeout: Duration) -> Result<(), usize> {
    let mut last = 0;
    if poll_until(timeout, || {
        last = fd_count(pid);
        last == want
    }) {
        Ok(())
    } else {
        Err(last)
    }
}

// ---------------------------------------------------------------- a killed client

#[test]
fn killed_client_leaves_others_serving() {
    use std::os::unix::process::ExitStatusExt;
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "256MiB"]);
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-i", "2"]);
    let uri = e.uri().to_string();
    // Once its queues' threads have made what they keep (they may still be
    // at it when `ready:` is printed, on a loaded machine).
    let baseline_fds = rdmablk_tests::check::settled_fd_count(e.pid());

    // The last 64 MiB hold a pattern that a second client reads while the
    // copy streams into the first 128 MiB.
    qemu_io_ok(
        &uri,
        &["write -P 0x5a 201326592 67108864"],
        "writing the reader's region",
    );
    let (mut copier, stdin) = Proc::spawn_with_stdin(
        "nbdcopy (to be killed)",
        &mut cmd("nbdcopy", &["--", "-", &uri]),
    );
    let mut feed = Feeder::start(stdin, 96 << 20, Some(copier.pid()));
    feed.wait_written(8 << 20, &mut copier);
    qemu_io_ok(
        &uri,
        &[
            "read -P 0x5a 201326592 67108864",
            "read -P 0x5a 201326592 67108864",
        ],
        "reading while nbdcopy writes",
    );
    assert!(
        copier.is_running(),
        "nbdcopy ended before it was killed\n{}",
        copier.report()
    );
    // Let it stream again and kill it 8 MiB further on, mid-stream.
    let kill_at = feed.written() + (8 << 20);
    feed.kill_at.store(kill_at, Ordering::Relaxed);
    feed.budget.store(128 << 20, Ordering::Relaxed);
    if !feed.join(Duration::from_secs(20)) {
        copier.kill();
        panic!(
            "nbdcopy did not take 8 MiB more within 20 s ({} of {kill_at} bytes)\n{}\n{}",
            feed.written(),
            copier.report(),
            e.report()
        );
    }
    assert!(
        feed.killed.load(Ordering::Relaxed),
        "nbdcopy went away before it was killed ({} bytes in)\n{}",
        feed.written(),
        copier.report()
    );
    let status = copier.wait(EXIT_WITHIN);
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "nbdcopy's end: {status}"
    );

    assert!(
        e.is_running(),
        "rdmablk connect died with its client\n{}",
        e.report()
    );
    qemu_io_ok(
        &uri,
        &[
            "write -P 0x77 1048576 4194304",
            "read -P 0x77 1048576 4194304",
            "write -P 0x78 3001 70000",
            "read -P 0x78 3001 70000",
            "read -P 0x5a 201326592 67108864",
            "flush",
        ],
        "a fresh client after the kill",
    );
    let dir = TempDir::new("killed");
    let data = Rng::new(0x6b69_6c6c).bytes(16 * MIB);
    let src = dir.join("src.bin");
    write_file(&src, &data);
    nbdcopy(&[path_str(&src), &uri], "a fresh nbdcopy in after the kill");
    let out = dir.join("out.bin");
    nbdcopy(&[&uri, path_str(&out)], "nbdcopy out after the kill");
    let got = read_file(&out);
    assert_same(&got[..16 * MIB], &data, "the fresh nbdcopy's data");
    if let Some(i) = got[192 * MIB..].iter().position(|&b| b != 0x5a) {
        panic!("the reader's region changed at byte {}", 192 * MIB + i);
    }

    // Every client is gone: the export holds no more descriptors than
    // before the first one came.
    if let Err(n) = settled_fd_count(e.pid(), baseline_fds, Duration::from_secs(5)) {
        panic!(
            "rdmablk connect holds {n} file descriptors after all clients left, \
             {baseline_fds} before any came\n{}",
            e.report()
        );
    }
    assert!(e.is_running(), "rdmablk connect exited\n{}", e.report());
    let r = bench(
        t.port(),
        DEFAULT_NQN,
        &[
            "--verify",
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--qd",
            "32",
            "--runtime",
            "1s",
            "--json",
        ],
    );
    check_bench(
        &r,
        4096.0,
        &["read", "write"],
        "bench on the daemon after the kill",
    );

    e.proc().signal(libc::SIGTERM);
    let status = e.proc().wait(EXIT_WITHIN);
    assert!(
        status.success(),
        "rdmablk connect after SIGTERM: {status}\n{}",
        e.report()
    );
}

// ---------------------------------------------------------------- SIGTERM / SIGINT

/// Sends `sig` to the export and checks the contract: exit 0 within 5 s,
/// socket removed, one `ready:` line in all, and the daemon saw `host` shut
/// its controller down.
fn assert_clean_exit(t: &Target, e: &mut NbdExport, sig: i32, host: &str, what: &str) {
    let started = Instant::now();
    e.proc().signal(sig);
    let status = e.proc().wait_timeout(EXIT_WITHIN).unwrap_or_else(|| {
        e.proc().kill();
        panic!(
            "{what}: rdmablk connect still running {EXIT_WITHIN:?} after the signal; \
             killed it\n{}",
            e.report()
        )
    });
    let took = started.elapsed();
    assert!(
        status.success(),
        "{what}: exit status {status}\n{}",
        e.report()
    );
    assert!(
        !e.socket().exists(),
        "{what}: {} still exists after the exit",
        e.socket().display()
    );
    let out = e.proc().stdout();
    assert_eq!(
        out,
        format!("ready: {}\n", e.uri()),
        "{what}: stdout should be exactly one ready: line"
    );
    let seen = poll_until(Duration::from_secs(2), || {
        t.log()
            .lines()
            .any(|l| l.contains("host shut the controller down") && l.contains(host))
    });
    assert!(
        seen,
        "{what}: the daemon log shows no `host shut the controller down` for {host}\n{}\n{}",
        t.log_tail(),
        e.report()
    );
    eprintln!("{what}: exited in {took:.2?}");
}

#[test]
fn connect_sigterm_exits_cleanly() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB"]);

    // SIGTERM with an idle client attached: an interactive qemu-io that has
    // done one read and waits for its next command.
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-q", HOST_A]);
    let (mut client, mut stdin) = Proc::spawn_with_stdin(
        "qemu-io (interactive)",
        &mut cmd("qemu-io", &["-f", "raw", e.uri()]),
    );
    stdin
        .write_all(b"read -P 0 0 4096\n")
        .expect("writing to qemu-io");
    let answered = poll_until(Duration::from_secs(10), || {
        client.stdout().contains("read 4096/4096 bytes at offset 0") || !client.is_running()
    });
    assert!(
        answered && client.is_running(),
        "qemu-io did not answer its first command\n{}",
        client.report()
    );
    assert_clean_exit(
        &t,
        &mut e,
        libc::SIGTERM,
        HOST_A,
        "SIGTERM with an idle client",
    );
    drop(stdin);
    client.kill();

    // SIGINT, no client.
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-q", HOST_B]);
    assert_clean_exit(&t, &mut e, libc::SIGINT, HOST_B, "SIGINT");
}

/// Opens an NBD connection by hand (fixed newstyle, `NBD_OPT_EXPORT_NAME`
/// ""), sends a 64 KiB `NBD_CMD_WRITE` with only the first 4 KiB of its
/// payload, and leaves it there: a client stalled in mid-request, which no
/// stock client produces on purpose.
fn stall_mid_write(socket: &Path) -> std::os::unix::net::UnixStream {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).expect("reading the NBD greeting");
    assert_eq!(&hello[..16], b"NBDMAGICIHAVEOPT", "NBD greeting");
    let no_zeroes = u16::from_be_bytes([hello[16], hello[17]]) & 2 != 0;
    let client_flags: u32 = 1 | if no_zeroes { 2 } else { 0 };
    let mut out = client_flags.to_be_bytes().to_vec();
    out.extend_from_slice(b"IHAVEOPT");
    out.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    out.extend_from_slice(&0u32.to_be_bytes()); // the empty name
    s.write_all(&out).expect("sending NBD_OPT_EXPORT_NAME");
    let mut info = vec![0u8; 10 + if no_zeroes { 0 } else { 124 }];
    s.read_exact(&mut info)
        .expect("reading the export's size and flags");
    let mut req = 0x2560_9513u32.to_be_bytes().to_vec(); // request magic
    req.extend_from_slice(&0u16.to_be_bytes()); // flags
    req.extend_from_slice(&1u16.to_be_bytes()); // NBD_CMD_WRITE
    req.extend_from_slice(&7u64.to_be_bytes()); // cookie
    req.extend_from_slice(&0u64.to_be_bytes()); // offset
    req.extend_from_slice(&(64u32 << 10).to_be_bytes()); // length
    req.extend_from_slice(&[0xee; 4096]);
    s.write_all(&req).expect("sending part of a write");
    s
}

/// SIGTERM while clients are in the middle of writes: the export must
/// still end within 5 s. First a client stalled mid-payload (deterministic),
/// then rounds of `nbdcopy` streaming from a pipe that keeps coming.
#[test]
fn connect_sigterm_while_client_writes() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "256MiB"]);

    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-q", HOST_A]);
    let stalled = stall_mid_write(e.socket());
    // A full round trip of another client on the same (single) engine after
    // the partial write went out: the engine has taken the stalled request.
    qemu_io_ok(
        e.uri(),
        &["read -P 0 1048576 4096"],
        "a read beside the stalled write",
    );
    assert_clean_exit(
        &t,
        &mut e,
        libc::SIGTERM,
        HOST_A,
        "SIGTERM with a client stalled in the middle of a write's payload",
    );
    drop(stalled);

    for round in 1..=3 {
        let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-q", HOST_B]);
        let (mut client, stdin) = Proc::spawn_with_stdin(
            "nbdcopy (streaming)",
            &mut cmd("nbdcopy", &["--", "-", e.uri()]),
        );
        let feed = Feeder::start(stdin, 192 << 20, None);
        feed.wait_written(16 << 20, &mut client);
        assert_clean_exit(
            &t,
            &mut e,
            libc::SIGTERM,
            HOST_B,
            &format!("SIGTERM while nbdcopy writes (round {round} of 3)"),
        );
        drop(feed);
        client.kill();
    }
}

/// The target dies (SIGKILL) under an attached export: a write issued
/// during the outage waits, completes once a new daemon serves the same file
/// on the same port, and everything written before and during the outage
/// reads back. The export process never restarts.
#[test]
fn reconnects_after_target_restart() {
    let _machine = crate::alone();
    let dir = TempDir::new("reconnect");
    let file = dir.sparse_file("ns.img", 64 * MIB as u64);
    let port = free_port();
    let mut t = Target::start_on(port, &["--file", path_str(&file)]);
    let mut e = NbdExport::start(port, DEFAULT_NQN, &["-l", "60", "-k", "2"]);
    qemu_io_ok(e.uri(), &["write -P 0x5a 0 1048576"], "before the outage");

    t.kill();
    let uri = e.uri().to_string();
    let (mut writer, mut stdin) = Proc::spawn_with_stdin(
        "qemu-io (during the outage)",
        &mut cmd("qemu-io", &["-f", "raw", &uri]),
    );
    stdin
        .write_all(b"write -P 0x6b 1048576 1048576\n")
        .expect("writing to qemu-io");
    // The write must wait, not fail, while nothing listens.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !writer.stdout().contains("wrote") && !writer.stdout().contains("failed"),
        "the write finished while the target was down\n{}",
        writer.report()
    );
    let _t2 = Target::start_on(port, &["--file", path_str(&file)]);
    let done = poll_until(Duration::from_secs(30), || {
        writer
            .stdout()
            .contains("wrote 1048576/1048576 bytes at offset 1048576")
    });
    assert!(
        done,
        "the write issued during the outage did not complete after the target came back\n{}\n{}",
        writer.report(),
        e.proc().report()
    );
    drop(stdin);
    writer.kill();
    qemu_io_ok(
        e.uri(),
        &["read -P 0x5a 0 1048576", "read -P 0x6b 1048576 1048576"],
        "after the reconnect",
    );
    assert!(
        e.proc().is_running(),
        "rdmablk connect exited\n{}",
        e.proc().report()
    );
}

/// With the target gone for good, I/O fails once --ctrl-loss-tmo runs out
/// and `rdmablk connect` exits non-zero, removing its socket.
#[test]
fn gives_up_after_ctrl_loss_tmo() {
    let _machine = crate::alone();
    let mut t = Target::start(&["--memory", "64MiB"]);
    let mut e = NbdExport::start(t.port(), DEFAULT_NQN, &["-l", "2", "-k", "2"]);
    qemu_io_ok(e.uri(), &["write -P 0x11 0 4096"], "before the outage");
    t.kill();
    let started = Instant::now();
    let r = qemu_io(e.uri(), &["write -P 0x22 4096 4096"]);
    let out = format!("{}{}", r.stdout, r.stderr);
    assert!(
        out.contains("Input/output error") || !r.status.success(),
        "a write after the association was lost for good did not fail\n{}",
        r.report()
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the write took {:?} to fail with ctrl-loss-tmo 2 s",
        started.elapsed()
    );
    let status = e.proc().wait(Duration::from_secs(15));
    assert!(
        !status.success(),
        "rdmablk connect exited 0 after giving up\n{}",
        e.proc().report()
    );
    assert!(
        e.proc().stderr().contains("ctrl-loss-tmo"),
        "the exit message does not name ctrl-loss-tmo\n{}",
        e.proc().report()
    );
    assert!(!e.socket().exists(), "the NBD socket was left behind");
}
