//! Failures: a stopped OSD, a blocklisted client, a dead cluster, an image
//! configured with a cache, a stop or a failed start while an image opens.

use super::*;

/// Sends SIGCONT to the OSD when dropped, so that a failing test does not
/// leave the cluster stopped.
struct StoppedOsd(u32);

impl StoppedOsd {
    fn stop() -> StoppedOsd {
        let pidfile = ceph_conf().with_file_name("osd.0.pid");
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .or_panic("reading the OSD's pid file")
            .trim()
            .parse()
            .expect("a pid");
        send_signal(pid, libc::SIGSTOP);
        StoppedOsd(pid)
    }
}

impl Drop for StoppedOsd {
    fn drop(&mut self) {
        send_signal(self.0, libc::SIGCONT);
    }
}

/// With the OSD stopped, I/O completes within the namespace's timeout with a
/// status the host retries, DNR clear (NVMe Base 2.1, 4.2.3.1, Generic
/// Command Status Values): Namespace Not Ready (82h) before the host enabled
/// ACRE, Command Interrupted (21h, which the specification allows only
/// with ACRE) with a Command Retry Delay after; the target logs it. After
/// the OSD continues, I/O works again.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_stopped_osd_gives_a_retryable_error_within_the_timeout() {
    let _machine = crate::alone();
    let img = Image::create("stall", 64 * MIB);
    let timeout = Duration::from_secs(3);
    let t = target(&img.name, "", "3s");
    wait_active(&t);
    let mut c = controller(&t, HOST_A);
    let data = Rng::new(5).bytes(64 << 10);
    io(&mut c)
        .write(1, 0, &data, 512, false)
        .or_panic("write before");
    io(&mut c)
        .set_timeout(Duration::from_secs(30))
        .or_panic("queue timeout");

    let osd = StoppedOsd::stop();
    let answered = |c: &mut Controller, sqe: Sqe, out: Option<&[u8]>, what: &str| {
        let start = Instant::now();
        let done = io(c)
            .exec(sqe, out, if out.is_some() { 0 } else { 64 << 10 })
            .or_panic(what);
        let took = start.elapsed();
        // Ceph's timers run on a coarse clock: they may fire a few
        // milliseconds before the timeout by ours.
        let early = Duration::from_millis(100);
        assert!(
            took + early >= timeout && took < timeout + Duration::from_secs(5),
            "{what} answered after {took:?}, the timeout being {timeout:?}"
        );
        assert!(!dnr_of(done.cqe.status), "{what}: DNR clear (retryable)");
        done
    };
    let w = answered(
        &mut c,
        Queue::rw_sqe(nvm::WRITE, 1, 1024, 128),
        Some(&data),
        "a write to a stopped OSD",
    );
    assert_status(&w, Status::NAMESPACE_NOT_READY, "write without ACRE");
    assert_eq!(crd_of(w.cqe.status), 0, "no CRD without ACRE");

    // Advanced Command Retry (Host Behavior Support, FID 16h, ACRE in byte
    // 0), as the Linux host enables it.
    let mut hbs = vec![0u8; 512];
    hbs[0] = 1;
    let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
    sqe.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    let set = c
        .admin()
        .exec(sqe, Some(&hbs), 0)
        .or_panic("Set Features ACRE");
    assert_status(&set, Status::SUCCESS, "Set Features Host Behavior Support");
    let r = answered(
        &mut c,
        Queue::rw_sqe(nvm::READ, 1, 0, 128),
        None,
        "a read from a stopped OSD",
    );
    assert_status(&r, Status::COMMAND_INTERRUPTED, "read with ACRE");
    assert_eq!(crd_of(r.cqe.status), 1, "CRD names CRDT1 once ACRE is on");
    assert!(
        t.log().contains("backend I/O timed out"),
        "the target logs the timeout\n{}",
        t.log_tail()
    );
    drop(osd);

    let start = Instant::now();
    loop {
        let done = io(&mut c)
            .exec(Queue::rw_sqe(nvm::READ, 1, 0, 128), None, 64 << 10)
            .or_panic("a read after the OSD continued");
        if done.status().is_success() {
            assert_same(&done.data, &data, "read after the OSD continued");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "I/O does not work again after the OSD continued: {}",
            done.status()
        );
    }
    io(&mut c)
        .write(1, 1024, &data, 512, true)
        .or_panic("write after");
    drop(c);
    stop(t);
}

/// Removes a cephx client when dropped.
struct Client(String);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = ceph(&["auth", "del", &format!("client.{}", self.0)]);
    }
}

/// Waits until the target has opened its image again `n` times in all,
/// once per blocklisting (reads that meet the blocklisted connection while
/// the new one cannot open start no other reconnection), then reads back
/// `data` (at LBA 128) through `c`.
fn reconnected(t: &Target, n: usize, c: &mut Controller, data: &[u8], what: &str) {
    let start = Instant::now();
    while t.log().matches("open again on a new connection").count() < n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no new connection {what}\n{}",
            t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = t.log();
    let (replaced, opened) = (
        log.matches("the cluster blocklisted this client").count(),
        log.matches("open again on a new connection").count(),
    );
    assert!(
        replaced == n && opened == n,
        "{what}: {replaced} reconnections and {opened} openings for {n} blocklistings\n{}",
        t.log_tail()
    );
    let back = io(c).read(1, 128, 128, 512).or_panic(what);
    assert_same(&back, data, what);
}

/// A client the cluster blocklists (as another client breaking its lock
/// would, or an operator) has every operation refused for good: the target
/// opens the image again on a new connection. Meanwhile I/O is answered
/// with a status the host retries (DNR clear), if any meets the old
/// connection; then it works again, with
/// the data written before, and the image has a new watcher. A namespace
/// blocklisted while idle reconnects too (its image's watch notices).
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_blocklisted_client_reconnects() {
    let _machine = crate::alone();
    let img = Image::create("blocklist", 64 * MIB);
    // A client of its own, whose caps the test takes away for a while.
    let client = format!("blocklist-{}", std::process::id());
    let keyring = ceph_conf().with_file_name(format!("ceph.client.{client}.keyring"));
    ceph(&[
        "auth",
        "get-or-create",
        &format!("client.{client}"),
        "mon",
        "profile rbd",
        "osd",
        "profile rbd pool=rbd",
        "-o",
        keyring.to_str().expect("utf-8"),
    ])
    .assert_success("ceph auth get-or-create");
    let _client = Client(client.clone());
    let t = target_as(
        &img.name,
        "",
        "5s",
        &format!(
            "client_id = \"{client}\"\n  keyring = \"{}\"",
            keyring.display()
        ),
    );
    wait_active(&t);
    let mut c = controller(&t, HOST_A);
    let data = Rng::new(6).bytes(64 << 10);
    io(&mut c)
        .write(1, 0, &data, 512, false)
        .or_panic("write before");
    io(&mut c)
        .set_timeout(Duration::from_secs(30))
        .or_panic("queue timeout");
    let before = watchers(&img);
    assert_eq!(before.len(), 1, "one watcher, the target: {before:?}");
    ceph(&["osd", "blocklist", "add", &before[0]]).assert_success("ceph osd blocklist add");
    let _unlist = Blocklisted(before[0].clone());

    let start = Instant::now();
    let mut refused = Vec::new();
    loop {
        let done = io(&mut c)
            .exec(Queue::rw_sqe(nvm::READ, 1, 0, 128), None, 64 << 10)
            .or_panic("a read while the client is blocklisted");
        let st = done.status();
        if st.is_success() && t.log().contains("open again on a new connection") {
            assert_same(&done.data, &data, "read after reconnecting");
            break;
        }
        if !st.is_success() {
            assert!(
                !dnr_of(done.cqe.status)
                    && (st == Status::NAMESPACE_NOT_READY || st == Status::COMMAND_INTERRUPTED),
                "a read while reconnecting answered {st} (DNR {}): not a status the host retries",
                dnr_of(done.cqe.status)
            );
            refused.push(st);
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no new connection within 60 s ({} reads refused)\n{}",
            refused.len(),
            t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Whether a read met the blocklisted connection depends on which of
    // them and the image's watch saw the refusal first.
    assert!(
        t.log().contains("the cluster blocklisted this client"),
        "{}",
        t.log_tail()
    );
    let fresh = Rng::new(7).bytes(64 << 10);
    io(&mut c)
        .write(1, 128, &fresh, 512, true)
        .or_panic("write after reconnecting");
    assert_same(
        &io(&mut c).read(1, 128, 128, 512).or_panic("read back"),
        &fresh,
        "read back after reconnecting",
    );
    let after = watchers(&img);
    assert!(
        after.len() == 1 && after[0] != before[0],
        "the image is watched by a new client: before {before:?}, after {after:?}"
    );
    println!(
        "reconnected after {:?}; {} reads refused meanwhile ({:?})",
        start.elapsed(),
        refused.len(),
        refused.first()
    );

    // Blocklisted while it cannot connect again (its OSD caps revoked
    // first): I/O meets the old connection and is answered with a status
    // the host retries while the target retries; once the caps are back,
    // the namespace reconnects.
    let now = watchers(&img);
    let (name, caps) = (format!("client.{client}"), ["mon", "profile rbd"]);
    ceph(&["auth", "caps", &name, caps[0], caps[1]]).assert_success("ceph auth caps (revoke)");
    ceph(&["osd", "blocklist", "add", &now[0]]).assert_success("ceph osd blocklist add");
    let _unlist3 = Blocklisted(now[0].clone());
    let start = Instant::now();
    let mut refused = Vec::new();
    while refused.len() < 3 {
        let done = io(&mut c)
            .exec(Queue::rw_sqe(nvm::READ, 1, 0, 128), None, 64 << 10)
            .or_panic("a read while the target cannot reconnect");
        let st = done.status();
        if !st.is_success() {
            assert!(
                !dnr_of(done.cqe.status) && st == Status::NAMESPACE_NOT_READY,
                "a read on a blocklisted connection answered {st} (DNR {})",
                dnr_of(done.cqe.status)
            );
            refused.push(st);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "reads were not refused\n{}",
            t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ceph(&[
        "auth",
        "caps",
        &name,
        "mon",
        "profile rbd",
        "osd",
        "profile rbd pool=rbd",
    ])
    .assert_success("ceph auth caps (restore)");
    reconnected(&t, 2, &mut c, &fresh, "after the caps came back");

    // Blocklisted while idle: the image's watch notices, and the namespace
    // has a new connection before the next I/O.
    let idle = watchers(&img);
    ceph(&["osd", "blocklist", "add", &idle[0]]).assert_success("ceph osd blocklist add");
    let _unlist2 = Blocklisted(idle[0].clone());
    reconnected(&t, 3, &mut c, &fresh, "blocklisted while idle");
    drop(c);
    stop(t);
}

/// A namespace whose cluster does not answer (its monitor accepts
/// connections and stays silent) does not hold up another cluster's: a
/// namespace added by a reload while the first is connecting (for its 10 s
/// timeout) is active within seconds.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_dead_cluster_does_not_hold_up_another() {
    let _machine = crate::alone();
    let img = Image::create("alive", 32 * MIB);
    let dir = TempDir::new("rbd-dead");
    let dead_conf = dir.join("dead.conf");
    // A "monitor" that takes connections and never says a word: connecting
    // waits for the whole timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").or_panic("binding a silent port");
    let port = silent.local_addr().or_panic("its address").port();
    let conf = std::fs::read_to_string(ceph_conf()).or_panic("reading ceph.conf");
    let dead: String = conf
        .lines()
        .map(|l| {
            if l.starts_with("mon_host") {
                format!("mon_host = [v2:127.0.0.1:{port}]")
            } else {
                l.to_string()
            }
        })
        .map(|l| l + "\n")
        .collect();
    std::fs::write(&dead_conf, dead).or_panic("writing dead.conf");
    let namespace = |nsid: u32, image: &str, conf: &std::path::Path| {
        format!(
            "  [[subsystem.namespace]]\n  nsid = {nsid}\n  backend = \"rbd\"\n  pool = \"rbd\"\n  \
             image = \"{image}\"\n  ceph_conf = \"{}\"\n  client_id = \"rdmablk\"\n  timeout = \"10s\"\n",
            conf.display()
        )
    };
    let config = |namespaces: &str| {
        format!(
            "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
             [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n{namespaces}"
        )
    };
    let sock = dir.join("control.sock");
    let sock_arg = sock.to_str().expect("utf-8");
    let one = config(&namespace(1, "nowhere", &dead_conf));
    let t = Target::start_config_with(&one, &["--control", sock_arg], None);
    // The first namespace is connecting to the silent monitor now.
    std::thread::sleep(Duration::from_millis(500));
    let two = one + &namespace(2, &img.name, &ceph_conf());
    std::fs::write(
        t.dir().join("target.toml"),
        two.replace("{port}", &t.port().to_string()),
    )
    .or_panic("writing the config");
    let reloaded = Instant::now();
    let mut reload = Command::new(rdmablk_tests::bin_path("rdmablk-target"));
    reload.args(["reload", "--control", sock_arg]);
    run("rdmablk-target reload", &mut reload, TOOL_TIMEOUT).assert_success("reload");
    wait_active(&t);
    let took = reloaded.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the healthy namespace opened {took:?} after the reload, behind the silent cluster\n{}",
        t.log_tail()
    );
    let mut c = controller(&t, HOST_A);
    assert_eq!(active(&c), vec![2], "only the healthy namespace is active");
    let data = Rng::new(8).bytes(4096);
    c.io[0].write(2, 0, &data, 512, false).or_panic("write");
    assert_same(
        &c.io[0].read(2, 0, 8, 512).or_panic("read"),
        &data,
        "read back",
    );
    drop(c);
    drop(silent);
    stop(t);
}

/// An image whose own configuration turns librbd's cache on (`rbd config
/// image set ... rbd_cache true`, which overrides the target's client
/// options) is not served: the namespace would promise durable writes
/// without a volatile write cache. The target says why and how to fix it;
/// once the setting is removed, the namespace opens (the target retries
/// every 5 s).
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn an_image_configured_with_a_cache_is_not_served() {
    let _machine = crate::alone();
    let img = Image::create("cached", 32 * MIB);
    rbd(&["config", "image", "set", &img.spec(), "rbd_cache", "true"])
        .assert_success("rbd config image set");
    let t = target(&img.name, "", "20s");
    wait_log(&t, "sets rbd_cache = true");
    assert!(
        t.log().contains("rbd config image rm"),
        "the log says how to fix it\n{}",
        t.log_tail()
    );
    let c = controller(&t, HOST_A);
    assert_eq!(active(&c), Vec::<u32>::new(), "not served with a cache");
    rbd(&["config", "image", "rm", &img.spec(), "rbd_cache"]).assert_success("rbd config image rm");
    wait_active(&t);
    assert_eq!(active(&c), vec![1], "served once the cache is off");
    drop(c);
    stop(t);
}

/// A target that cannot start (its listener's port is taken) while its
/// namespace's thread is connecting to the cluster and opening the image
/// exits 1 and says why: never a signal, whichever librados threads are at
/// work when it gives up (exit(3) would run librados's static destructors
/// under them). Several rounds: the moment it gives up falls at another
/// step of the opening each time.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_target_that_cannot_listen_exits_cleanly_while_its_image_opens() {
    let _machine = crate::alone();
    let img = Image::create("nostart", 32 * MIB);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").or_panic("binding a port");
    let port = taken.local_addr().or_panic("its address").port();
    let dir = TempDir::new("rbd-nostart");
    let path = dir.join("target.toml");
    let text = config(&img.name, "", "10s", "client_id = \"rdmablk\"");
    std::fs::write(&path, text.replace("{port}", &port.to_string())).or_panic("writing the config");
    for round in 1..=8 {
        let mut c = Command::new(rdmablk_tests::bin_path("rdmablk-target"));
        c.arg("--config").arg(&path);
        let r = run("rdmablk-target", &mut c, TOOL_TIMEOUT);
        assert_eq!(r.status.code(), Some(1), "round {round}\n{}", r.report());
        assert!(
            r.stderr.contains(&format!("127.0.0.1:{port}")) && r.stderr.contains("in use"),
            "round {round}: the error names neither the address nor the reason\n{}",
            r.report()
        );
    }
    drop(taken);
}

/// A target stopped (SIGTERM) while its namespace's thread is still
/// connecting to the cluster and opening the image exits 0, not with a
/// signal: the stop does not wait for the cluster, and librados is not
/// torn down under that thread. Several rounds, the stop coming a few
/// milliseconds later each time: at another step of the opening.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_target_stopped_while_its_image_opens_exits_0() {
    let _machine = crate::alone();
    let img = Image::create("stopopen", 32 * MIB);
    for round in 0..16u64 {
        let mut t = target(&img.name, "", "10s");
        std::thread::sleep(Duration::from_millis(round * 3));
        let status = t.stop();
        assert_eq!(
            status.code(),
            Some(0),
            "round {round}: stopped {} ms after it listened\n{}",
            round * 3,
            t.log_tail()
        );
    }
}
