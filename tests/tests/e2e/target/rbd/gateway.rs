//! A gateway group: three gateways export two images, each image in an ANA
//! group of its own with a preferred owner. Each group is optimized on its
//! owner only; `rdmablk bench --verify` writes through all three paths while
//! the owner of group 1 is killed (SIGKILL): another gateway fences it
//! (blocklists its cluster clients) and takes the group, and the writes go
//! on there without an error; the killed gateway, started again, takes its
//! group back after the failback delay, without being fenced, while writes
//! go on; a gateway stopped with SIGTERM hands its group over at once.

use super::gateway_group::{admin_only, ana_state, config, wait_owner, LEASE_SECS};
use super::*;
use rdmablk_common::nvme::ana::AnaState;
use rdmablk_tests::bin_path;
use rdmablk_tests::cmdline::tcp_target_args;
use rdmablk_tests::control::ControlledTarget;

const FAILBACK_SECS: u64 = 6;

/// Gateway `gw` (`gw-a`, `gw-b`, `gw-c`) of group `group`: images `one`
/// (ANA group 1, preferred gw-a) and `two` (group 2, preferred gw-b),
/// controller ids of its own.
fn gateway(group: &str, gw: char, one: &Image, two: &Image) -> ControlledTarget {
    ControlledTarget::start(&config(group, gw, (one, two), FAILBACK_SECS, ""))
}

/// `rdmablk bench --verify` writing namespace 1 through every gateway of
/// `paths` for `secs`.
fn writes(paths: &[&ControlledTarget], secs: u64) -> std::process::Child {
    let mut c = Command::new(bin_path("rdmablk"));
    c.arg("bench")
        .args(tcp_target_args(paths[0].t.port(), None));
    for p in &paths[1..] {
        c.arg("--path")
            .arg(format!("tcp://127.0.0.1:{}", p.t.port()));
    }
    c.args([
        "-n", NQN, "--nsid", "1", "--rw", "randrw", "--bs", "4k", "--qd", "8",
    ])
    .args(["--verify", "--json", "--ctrl-loss-tmo", "20"])
    .arg(format!("--runtime={secs}s"))
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .or_panic("starting rdmablk bench")
}

/// The bench finished with every write and read done and verified.
fn check_writes(child: std::process::Child, what: &str) {
    let out = child.wait_with_output().or_panic("rdmablk bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{what}: bench failed\n{stdout}\n{stderr}"
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("bench JSON");
    assert_eq!(v["verify_errors"].as_f64(), Some(0.0), "{what}: {v}");
    for d in ["read", "write"] {
        assert_eq!(
            v[d]["errors"].as_f64(),
            Some(0.0),
            "{what}: {d} errors: {v}"
        );
        assert!(
            v[d]["ios"].as_f64().unwrap_or(0.0) > 0.0,
            "{what}: no {d}: {v}"
        );
    }
}

#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_killed_owner_is_fenced_and_its_group_moves_then_comes_back() {
    let _machine = crate::alone();
    let (one, two) = (
        Image::create("gw1", 64 * MIB),
        Image::create("gw2", 64 * MIB),
    );
    let group = format!("failover-{}", std::process::id());
    let a = gateway(&group, 'a', &one, &two);
    let b = gateway(&group, 'b', &one, &two);
    let c = gateway(&group, 'c', &one, &two);
    let settle = Duration::from_secs(4 * LEASE_SECS);
    for d in [&a, &b, &c] {
        wait_active(&d.t);
    }
    wait_owner(&[&a.t, &b.t, &c.t], Some(0), 1, settle);
    wait_owner(&[&a.t, &b.t, &c.t], Some(1), 2, settle);

    // Kill the owner of group 1 while writes go through all three paths.
    let bench = writes(&[&a, &b, &c], 14);
    std::thread::sleep(Duration::from_secs(3));
    let mut a = a;
    a.t.kill();
    let killed = Instant::now();
    let (mut owner, mut took) = (None, Duration::ZERO);
    while owner.is_none() {
        for (i, d) in [&b, &c].iter().enumerate() {
            if ana_state(&d.t, 1) == Some(AnaState::Optimized) {
                owner = Some(i);
                took = killed.elapsed();
            }
        }
        assert!(
            killed.elapsed() < settle,
            "group 1 not taken over\n{}\n{}",
            b.t.log_tail(),
            c.t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "gateway group: group 1 optimized on another gateway {took:?} after its owner's SIGKILL"
    );
    let new = [&b, &c][owner.expect("an owner")];
    assert!(
        new.t.log().contains("fenced gw-a's client"),
        "{}",
        new.t.log_tail()
    );
    check_writes(bench, "writes across the failover");
    assert_eq!(
        ana_state(&b.t, 2),
        Some(AnaState::Optimized),
        "group 2 stays with gw-b"
    );

    // gw-a comes back: it takes group 1 back after the failback delay,
    // handed over (not fenced), while writes go on.
    let a2 = gateway(&group, 'a', &one, &two);
    let started = Instant::now();
    wait_active(&a2.t);
    let bench = writes(&[&a2, &b, &c], 6 + FAILBACK_SECS);
    // A tool that reads through gw-a for a few heartbeats and leaves, and
    // stays on the owner: with an admin queue alone it uses no namespace
    // and holds no failback back (were it a host, gw-a would no longer
    // reach one that the owner serves, for the 10 minutes a lost host
    // counts).
    let tool = Controller::open(a2.t.addr(), NQN, HOST_B, &admin_only()).or_panic("a tool on gw-a");
    let _tool_on_owner =
        Controller::open(new.t.addr(), NQN, HOST_B, &admin_only()).or_panic("a tool on the owner");
    std::thread::sleep(Duration::from_secs(LEASE_SECS));
    drop(tool);
    wait_owner(
        &[&a2.t, &b.t, &c.t],
        Some(0),
        1,
        Duration::from_secs(FAILBACK_SECS + 3 * LEASE_SECS),
    );
    let back = started.elapsed();
    eprintln!("gateway group: gw-a owns group 1 again {back:?} after it started");
    assert!(
        back >= Duration::from_secs(FAILBACK_SECS - 1),
        "failback after {back:?}"
    );
    assert!(
        new.t.log().contains("ANA group 1: handed back to gw-a"),
        "{}",
        new.t.log_tail()
    );
    assert!(!a2.t.log().contains("fenced gw-"), "{}", a2.t.log_tail());
    check_writes(bench, "writes across the failback");

    // A gateway that stops hands its group over (no lease to wait out, no
    // fencing).
    stop(b.t);
    let moved = wait_owner(&[&a2.t, &c.t], None, 2, Duration::from_secs(LEASE_SECS));
    eprintln!("gateway group: group 2 moved {moved:?} after gw-b's SIGTERM");
    for d in [&a2, &c] {
        assert!(!d.t.log().contains("fenced gw-b"), "{}", d.t.log_tail());
    }
}

/// A frozen owner (SIGSTOP) with writes inside it loses its group: the
/// other gateway fences it and takes the group. What a host then writes
/// through the new owner is what reads back after the frozen gateway runs
/// again (SIGCONT): none of its delayed writes lands. It refuses I/O on the
/// group from the moment it runs (its lease lapsed while it was frozen) and
/// says so.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_frozen_owner_is_fenced_and_none_of_its_delayed_writes_lands() {
    let _machine = crate::alone();
    const BYTES: u64 = 16 * MIB;
    let (one, two) = (Image::create("gwf1", BYTES), Image::create("gwf2", BYTES));
    let group = format!("frozen-{}", std::process::id());
    let a = gateway(&group, 'a', &one, &two);
    let b = gateway(&group, 'b', &one, &two);
    for d in [&a, &b] {
        wait_active(&d.t);
    }
    let settle = Duration::from_secs(4 * LEASE_SECS);
    wait_owner(&[&a.t, &b.t], Some(0), 1, settle);

    // Writes through gw-a only, many in flight, when it freezes.
    let mut load = Command::new(bin_path("rdmablk"))
        .arg("bench")
        .args(tcp_target_args(a.t.port(), Some(NQN)))
        .args([
            "--nsid",
            "1",
            "--rw",
            "randwrite",
            "--bs",
            "64k",
            "--qd",
            "32",
        ])
        .args(["--runtime", "60s", "--ctrl-loss-tmo", "60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .or_panic("starting rdmablk bench");
    std::thread::sleep(Duration::from_millis(1500));
    send_signal(a.t.pid(), libc::SIGSTOP);
    struct Thaw(u32);
    impl Drop for Thaw {
        fn drop(&mut self) {
            send_signal(self.0, libc::SIGCONT);
        }
    }
    let thaw = Thaw(a.t.pid());
    let frozen = Instant::now();
    while ana_state(&b.t, 1) != Some(AnaState::Optimized) {
        assert!(
            frozen.elapsed() < settle,
            "gw-b did not take group 1\n{}",
            b.t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "gateway group: group 1 optimized on gw-b {:?} after gw-a froze",
        frozen.elapsed()
    );
    assert!(
        b.t.log().contains("fenced gw-a's client"),
        "{}",
        b.t.log_tail()
    );
    let _ = load.kill();
    let _ = load.wait();

    // The host writes the whole namespace through gw-b, then gw-a runs.
    let mut host = controller(&b.t, HOST_B);
    let pattern = Rng::new(29).bytes(BYTES as usize);
    for (i, chunk) in pattern.chunks(256 << 10).enumerate() {
        io(&mut host)
            .write(1, (i * 512) as u64, chunk, 512, false)
            .or_panic("writing through gw-b");
    }
    drop(thaw);
    let thawed = Instant::now();
    // It refuses I/O on the group at once, and says why. As it runs again
    // it also ends the associations of the subsystem while the group has
    // commands in flight (a new one may go with them): the host connects
    // again.
    let st = loop {
        let read = Controller::open(a.t.addr(), NQN, HOST_A, &Opts::default())
            .and_then(|mut c| io(&mut c).exec(Queue::rw_sqe(nvm::READ, 1, 0, 8), None, 4096));
        match read {
            Ok(st) => break st,
            Err(e) => assert!(
                thawed.elapsed() < Duration::from_secs(2),
                "a read through the thawed gw-a: {e}\n{}",
                a.t.log_tail()
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_status(
        &st,
        Status::ANA_INACCESSIBLE,
        "a read through the thawed gw-a",
    );
    eprintln!(
        "gateway group: gw-a refused I/O {:?} after it ran again",
        thawed.elapsed()
    );
    std::thread::sleep(Duration::from_secs(3)); // its delayed writes, if any, would land now

    // Whichever notices first, the renewal that fails (blocklisted) or
    // the lease running late, says the group is inaccessible here.
    assert!(
        a.t.log().contains("inaccessible here"),
        "{}",
        a.t.log_tail()
    );
    // The OSDs refused its client: what it still had to send went nowhere.
    assert!(
        a.t.log().contains("the cluster blocklisted this client"),
        "{}",
        a.t.log_tail()
    );
    assert_eq!(ana_state(&a.t, 1), Some(AnaState::Inaccessible));
    let mut back = Vec::new();
    for i in 0..(BYTES / (256 << 10)) {
        back.extend(
            io(&mut host)
                .read(1, i * 512, 512, 512)
                .or_panic("reading through gw-b"),
        );
    }
    assert!(
        back == pattern,
        "data written through gw-b was overwritten after gw-a ran again"
    );
}

/// The clients a gateway publishes in the lease object of group `g` of
/// gateway group `group` (`rdmablk.owner`: `GATEWAY STATE ADDRESS...`).
fn published(group: &str, g: u32) -> Vec<String> {
    let out = rados(&[
        "getxattr",
        &format!("rdmablk.gwgroup.{group}.ana.{g}"),
        "rdmablk.owner",
    ]);
    out.assert_success("rados getxattr");
    out.stdout
        .split_whitespace()
        .skip(2)
        .map(str::to_string)
        .collect()
}

/// A gateway holding two ANA groups whose images get a new cluster client
/// (the cluster blocklisted the old one) publishes the new client in both
/// lease objects: what a gateway that takes either group over fences. (A
/// republish used to reach one group only: a failover of the other would
/// have fenced the old client and left the new one writing.)
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_new_image_client_is_published_in_every_lease_held() {
    let _machine = crate::alone();
    let (one, two) = (
        Image::create("pub1", 64 * MIB),
        Image::create("pub2", 64 * MIB),
    );
    let group = format!("publish-{}", std::process::id());
    let a = gateway(&group, 'a', &one, &two);
    let b = gateway(&group, 'b', &one, &two);
    let settle = Duration::from_secs(4 * LEASE_SECS);
    for d in [&a, &b] {
        wait_active(&d.t);
    }
    wait_owner(&[&a.t, &b.t], Some(1), 2, settle);
    // gw-b stops: gw-a holds both groups, and alone has the images open.
    stop(b.t);
    wait_owner(&[&a.t], Some(0), 2, settle);
    wait_owner(&[&a.t], Some(0), 1, settle);
    let old = watchers(&one);
    assert_eq!(old.len(), 1, "gw-a alone watches the image: {old:?}");
    for g in [1, 2] {
        assert!(
            published(&group, g).contains(&old[0]),
            "group {g} lists gw-a's image client {}: {:?}",
            old[0],
            published(&group, g)
        );
    }

    ceph(&["osd", "blocklist", "add", &old[0]]).assert_success("ceph osd blocklist add");
    let _unlist = Blocklisted(old[0].clone());
    let start = Instant::now();
    let new = loop {
        let now = watchers(&one);
        if now.len() == 1 && now != old {
            break now[0].clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gw-a did not open its image on a new client: {now:?}\n{}",
            a.t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let start = Instant::now();
    loop {
        let lists = [published(&group, 1), published(&group, 2)];
        if lists
            .iter()
            .all(|l| l.contains(&new) && !l.contains(&old[0]))
        {
            break;
        }
        assert!(
            start.elapsed() < settle,
            "gw-a's new image client {new} not published in both lease objects: {lists:?}\n{}",
            a.t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "gateway group: new image client published in both leases {:?} after it appeared",
        start.elapsed()
    );
    stop(a.t);
}

/// The clients gateway `gw` published on the members object of gateway
/// group `group` (`rdmablk.clients.GW`), if any.
fn member_clients(group: &str, gw: &str) -> Vec<String> {
    let out = rados(&[
        "getxattr",
        &format!("rdmablk.gwgroup.{group}.gateways"),
        &format!("rdmablk.clients.{gw}"),
    ]);
    out.stdout.split_whitespace().map(str::to_string).collect()
}

/// Waits (up to `within`) until gateway `gw` publishes clients other than
/// `before`; returns them.
fn new_member_clients(group: &str, gw: &str, before: &[String], within: Duration) -> Vec<String> {
    let start = Instant::now();
    loop {
        let now = member_clients(group, gw);
        if !now.is_empty() && now != before {
            return now;
        }
        assert!(
            start.elapsed() < within,
            "{gw} published no new clients: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A standby gateway killed (SIGKILL) is fenced once its heartbeat stood
/// still for a lease: its image watches go then, not when the OSD times
/// them out (30 s), and with them the notify timeout (5 s) that every
/// handover of an image's exclusive lock waits for a dead watcher. A
/// gateway restarted quicker than a lease fences its previous process's
/// clients itself.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn a_killed_standby_is_fenced_and_its_watches_go() {
    let _machine = crate::alone();
    let (one, two) = (
        Image::create("standby1", 64 * MIB),
        Image::create("standby2", 64 * MIB),
    );
    let group = format!("standby-{}", std::process::id());
    let a = gateway(&group, 'a', &one, &two);
    let b = gateway(&group, 'b', &one, &two);
    let mut c = gateway(&group, 'c', &one, &two);
    let settle = Duration::from_secs(4 * LEASE_SECS);
    for d in [&a, &b, &c] {
        wait_active(&d.t);
    }
    wait_owner(&[&a.t, &b.t, &c.t], Some(0), 1, settle);
    wait_owner(&[&a.t, &b.t, &c.t], Some(1), 2, settle);
    let clients = new_member_clients(&group, "gw-c", &[], settle);
    let watching = |clients: &[String]| watchers(&one).iter().any(|w| clients.contains(w));
    assert!(
        watching(&clients),
        "gw-c's image client {clients:?} watches the image: {:?}",
        watchers(&one)
    );

    c.t.kill();
    let killed = Instant::now();
    while watching(&clients) {
        assert!(
            killed.elapsed() < settle,
            "gw-c's watch {clients:?} still there {:?} after its SIGKILL\n{}\n{}",
            killed.elapsed(),
            a.t.log_tail(),
            b.t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "gateway group: a killed standby's image watch gone {:?} after its SIGKILL",
        killed.elapsed()
    );
    assert!(
        [&a, &b]
            .iter()
            .any(|d| d.t.log().contains("fenced gw-c (silent for a lease)")),
        "{}\n{}",
        a.t.log_tail(),
        b.t.log_tail()
    );

    // Started again, killed once it published its clients, started again
    // at once: the new process fences its predecessor's clients.
    let mut c2 = gateway(&group, 'c', &one, &two);
    let published = new_member_clients(&group, "gw-c", &clients, settle);
    c2.t.kill();
    let c3 = gateway(&group, 'c', &one, &two);
    wait_log(&c3.t, "fenced this gateway's previous process");
    for a in &published {
        assert!(
            c3.t.log().contains(a.as_str()),
            "{a} not fenced\n{}",
            c3.t.log_tail()
        );
    }
    for d in [a, b, c3] {
        stop(d.t);
    }
}
