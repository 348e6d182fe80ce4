//! fio through `rdmablk connect --nbd`, with a path to each of three
//! gateways of one group, on both namespaces (ANA groups 1 and 2), verifying
//! as it writes, while the owner of group 1 (gw-a, its preferred gateway)
//! is killed with SIGKILL three times (`RDMABLK_GATEWAY_KILLS`; bench/long.sh
//! kills it ten times), each time started again and given its
//! group back after the failback delay; then frozen (SIGSTOP) with writes in
//! flight until another gateway fenced it and took the group, and resumed
//! (SIGCONT): it refuses the group's I/O, connects to the cluster again and
//! gets its group back. fio ends without an error, every verification
//! clean; the gateways' metrics count exactly the failovers made.
//!
//! Both images have the exclusive-lock feature: the new owner's first
//! write takes the lock, breaking the fenced gateway's hold on it.
//!
//! The time from each kill to the first write completed through the new
//! owner (its `rdmablk_namespace_bytes_total`, scraped every 10 ms) is
//! printed: median and maximum over the rounds.

use super::gateway_group::{ana_state, config, wait_owner, LEASE_SECS};
use super::*;
use rdmablk_common::nvme::ana::AnaState;
use rdmablk_tests::free_port;
use rdmablk_tests::metrics::{samples, scrape};
use std::net::SocketAddr;

/// How many times gw-a is killed: `RDMABLK_GATEWAY_KILLS`, else 3.
fn kills() -> usize {
    std::env::var("RDMABLK_GATEWAY_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3)
}
const FAILBACK_SECS: u64 = 3;

/// A gateway started from a configuration file of its own, on ports that
/// stay its own across restarts (the host's paths name them).
struct Gateway {
    toml: PathBuf,
    metrics: SocketAddr,
    t: Option<Target>,
}

impl Gateway {
    fn new(dir: &TempDir, group: &str, gw: char, images: (&Image, &Image)) -> Gateway {
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("an address");
        let text = config(
            group,
            gw,
            images,
            FAILBACK_SECS,
            &format!("[metrics]\nlisten = \"{metrics}\"\n"),
        )
        .replace("{port}", &free_port().to_string());
        let toml = dir.join(&format!("gw-{gw}.toml"));
        std::fs::write(&toml, text).or_panic("writing a gateway's configuration");
        let mut g = Gateway {
            toml,
            metrics,
            t: None,
        };
        g.start();
        g
    }

    fn start(&mut self) {
        let toml = self.toml.display().to_string();
        let t = Target::start(&["--config", &toml]);
        wait_active(&t);
        self.t = Some(t);
    }

    fn t(&self) -> &Target {
        self.t.as_ref().expect("the gateway runs")
    }

    fn url(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.t().port())
    }

    /// Bytes written to namespace `nsid` through this gateway so far.
    fn written(&self, nsid: u32) -> f64 {
        let series = format!(
            "rdmablk_namespace_bytes_total{{subsystem=\"{NQN}\",nsid=\"{nsid}\",op=\"write\"}}"
        );
        samples(&scrape(self.metrics))
            .get(&series)
            .copied()
            .unwrap_or_else(|| panic!("no {series} on gateway {}", self.toml.display()))
    }

    /// A sample of this gateway's metrics (0 when it has none).
    fn metric(&self, series: &str) -> f64 {
        samples(&scrape(self.metrics))
            .get(series)
            .copied()
            .unwrap_or(0.0)
    }
}

/// fio writing namespace export `uri` with verification as it goes (every
/// 64 writes read back and checked), until interrupted.
fn fio_until_stopped(uri: &str, dir: &TempDir, name: &str) -> (std::process::Child, PathBuf) {
    let report = dir.join(&format!("{name}.json"));
    let child = Command::new("fio")
        .args([
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--name={name}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--size=32M",
            "--time_based",
            "--runtime=900",
            "--rate_iops=400",
            "--verify=crc32c",
            "--verify_backlog=64",
            "--verify_fatal=1",
            "--output-format=json",
            &format!("--output={}", report.display()),
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .or_panic("starting fio");
    (child, report)
}

/// Interrupts fio and checks it wrote and verified without an error.
fn fio_verified(mut child: std::process::Child, report: &PathBuf, what: &str) {
    send_signal(child.id(), libc::SIGINT);
    let deadline = Instant::now() + TOOL_TIMEOUT;
    while child.try_wait().ok().flatten().is_none() {
        assert!(Instant::now() < deadline, "{what}: fio did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().or_panic("fio");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The report follows fio's line about the signal.
    let text = std::fs::read_to_string(report).unwrap_or_default();
    let json = text.find('{').map_or("", |i| &text[i..]);
    let v: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("{what}: no fio report ({e}):\n{text}\n{said}"));
    let job = &v["jobs"][0];
    assert!(
        job["error"] == 0 && !said.contains("verify:"),
        "{what}: fio failed (job error {})\n{said}",
        job["error"]
    );
    for d in ["write", "read"] {
        assert!(
            job[d]["io_bytes"].as_u64().unwrap_or(0) > 0,
            "{what}: no {d} (the reads are the verification)\n{text}"
        );
    }
}

/// Waits until a write to namespace 1 completed through one of `others`
/// (their counts were `before`); how long that took since `from`.
fn first_write(others: &[&Gateway], before: &[f64], from: Instant, what: &str) -> Duration {
    loop {
        if others.iter().zip(before).any(|(g, b)| g.written(1) > *b) {
            return from.elapsed();
        }
        assert!(
            from.elapsed() < Duration::from_secs(5 * LEASE_SECS),
            "{what}: no write through another gateway\n{}",
            others
                .iter()
                .map(|g| g.t().log_tail())
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn fio_over_every_path_rides_kills_a_freeze_and_failbacks() {
    let _machine = crate::alone();
    let dir = TempDir::new("gateway-fio");
    // Images with an exclusive lock (Ceph's default features): librbd
    // moves it to whichever gateway writes, breaking a fenced holder's.
    let (one, two) = (
        Image::create_with("gwfio1", 32 * MIB, "layering,exclusive-lock"),
        Image::create_with("gwfio2", 32 * MIB, "layering,exclusive-lock"),
    );
    let group = format!("fio-{}", std::process::id());
    let mut a = Gateway::new(&dir, &group, 'a', (&one, &two));
    let b = Gateway::new(&dir, &group, 'b', (&one, &two));
    let c = Gateway::new(&dir, &group, 'c', (&one, &two));
    let settle = Duration::from_secs(4 * LEASE_SECS);
    wait_owner(&[a.t(), b.t(), c.t()], Some(0), 1, settle);
    wait_owner(&[a.t(), b.t(), c.t()], Some(1), 2, settle);

    let paths = [
        "--path".to_string(),
        b.url(),
        "--path".to_string(),
        c.url(),
        "-l".to_string(),
        "60".to_string(),
    ];
    let export = |nsid: &str| {
        let mut args: Vec<&str> = paths.iter().map(String::as_str).collect();
        args.extend(["--nsid", nsid]);
        NbdExport::start(a.t().port(), NQN, &args)
    };
    let (e1, e2) = (export("1"), export("2"));
    let (fio1, report1) = fio_until_stopped(e1.uri(), &dir, "ns1");
    let (fio2, report2) = fio_until_stopped(e2.uri(), &dir, "ns2");
    std::thread::sleep(Duration::from_secs(2));

    let rounds = kills();
    let mut took = Vec::new();
    for round in 1..=rounds {
        let before = [b.written(1), c.written(1)];
        a.t.as_mut().expect("gw-a runs").kill();
        let killed = Instant::now();
        let t = first_write(&[&b, &c], &before, killed, &format!("kill {round}"));
        eprintln!("gateway group: kill {round}: first write through the new owner {t:?} after the SIGKILL");
        took.push(t);
        a.start();
        let back = Duration::from_secs(FAILBACK_SECS + 3 * LEASE_SECS);
        wait_owner(&[a.t(), b.t(), c.t()], Some(0), 1, back);
    }
    took.sort();
    eprintln!(
        "gateway group: from SIGKILL to the first write through the new owner, {rounds} rounds: median {:?}, max {:?}",
        took[rounds / 2],
        took[rounds - 1]
    );

    // Frozen with writes in flight: fenced, its group taken; resumed, it
    // refuses the group, connects again and gets it back.
    send_signal(a.t().pid(), libc::SIGSTOP);
    let frozen = Instant::now();
    let before = [b.written(1), c.written(1)];
    let t = first_write(&[&b, &c], &before, frozen, "the freeze");
    eprintln!("gateway group: first write through the new owner {t:?} after gw-a froze");
    std::thread::sleep(Duration::from_secs(1));
    send_signal(a.t().pid(), libc::SIGCONT);
    // Resumed, it gives the group up: through its watchdog (the lease
    // lapsed while it was frozen) or through a renewal the cluster refuses
    // (its client blocklisted), whichever of its threads runs first.
    let given_up = Instant::now();
    while ![
        "ANA groups [1]: lease not renewed",
        "ANA group 1: lease lost (",
    ]
    .iter()
    .any(|m| a.t().log().contains(m))
    {
        assert!(
            given_up.elapsed() < Duration::from_secs(30),
            "gw-a did not give group 1 up after the freeze\n{}",
            a.t().log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_log(a.t(), "blocklisted this gateway's client");
    wait_owner(
        &[a.t(), b.t(), c.t()],
        Some(0),
        1,
        Duration::from_secs(FAILBACK_SECS + 5 * LEASE_SECS),
    );
    std::thread::sleep(Duration::from_secs(2));
    fio_verified(fio1, &report1, "namespace 1");
    fio_verified(fio2, &report2, "namespace 2");
    assert_eq!(ana_state(b.t(), 2), Some(AnaState::Optimized), "group 2");

    // Every kill and the freeze made one failover, counted where it
    // happened; no other.
    let label = format!("{{group=\"{group}\"}}");
    let failovers: f64 = [&b, &c]
        .iter()
        .map(|g| g.metric(&format!("rdmablk_gateway_failovers_total{label}")))
        .sum();
    assert_eq!(failovers, (rounds + 1) as f64, "failovers counted");
    let owner = format!(
        "rdmablk_gateway_ana_group_owner{{group=\"{group}\",ana_group=\"1\",owner=\"gw-a\"}}"
    );
    let up = format!("rdmablk_gateway_up{{group=\"{group}\",gateway=\"gw-a\",self=\"false\"}}");
    assert_eq!(b.metric(&up), 1.0, "gw-b sees gw-a up");
    assert_eq!(b.metric(&owner), 1.0, "gw-b reads gw-a as group 1's owner");
    let age = a.metric(&format!(
        "rdmablk_gateway_lease_age_seconds{{group=\"{group}\",ana_group=\"1\"}}"
    ));
    assert!(age < LEASE_SECS as f64, "gw-a's lease age {age}");
}

/// Three gateways under fio at full speed on both namespaces (no rate
/// limit, queue depth 32, on the same two cores as the cluster) keep their
/// owners: no failover, no lease lost, no renewal late, for
/// `RDMABLK_SOAK_SECS`: 20 by default, some twenty renewals of each lease
/// (`bench/long.sh` soaks for 600).
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn no_false_failover_at_full_load() {
    let _machine = crate::alone();
    let secs: u64 = std::env::var("RDMABLK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir = TempDir::new("gateway-soak");
    let (one, two) = (
        Image::create("gwsoak1", 32 * MIB),
        Image::create("gwsoak2", 32 * MIB),
    );
    let group = format!("soak-{}", std::process::id());
    let all = [
        Gateway::new(&dir, &group, 'a', (&one, &two)),
        Gateway::new(&dir, &group, 'b', (&one, &two)),
        Gateway::new(&dir, &group, 'c', (&one, &two)),
    ];
    let targets: Vec<&Target> = all.iter().map(Gateway::t).collect();
    let settle = Duration::from_secs(4 * LEASE_SECS);
    wait_owner(&targets, Some(0), 1, settle);
    wait_owner(&targets, Some(1), 2, settle);
    let runtime = format!("--runtime={secs}");
    let exports: Vec<NbdExport> = [1, 2]
        .iter()
        .map(|nsid| {
            NbdExport::start(
                all[0].t().port(),
                NQN,
                &[
                    "--path",
                    &all[1].url(),
                    "--path",
                    &all[2].url(),
                    "--nsid",
                    &nsid.to_string(),
                ],
            )
        })
        .collect();
    let fios: Vec<_> = exports
        .iter()
        .map(|e| {
            Command::new("fio")
                .args(["--ioengine=nbd", "--name=soak", "--rw=randrw", "--bs=4k"])
                .args(["--iodepth=32", "--size=32M", "--time_based", &runtime])
                .arg(format!("--uri={}", e.uri()))
                .current_dir(dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .or_panic("starting fio")
        })
        .collect();
    for f in fios {
        let out = f.wait_with_output().or_panic("fio");
        assert!(
            out.status.success(),
            "fio under full load: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let label = format!("{{group=\"{group}\"}}");
    for (g, name) in all.iter().zip(["gw-a", "gw-b", "gw-c"]) {
        let log = g.t().log();
        for bad in [
            "lease lost",
            "not renewed",
            "fenced",
            "owned by this gateway (from gw",
        ] {
            assert!(
                !log.contains(bad),
                "{name} under load: {bad:?}\n{}",
                g.t().log_tail()
            );
        }
        assert_eq!(
            g.metric(&format!("rdmablk_gateway_failovers_total{label}")),
            0.0,
            "{name}: failovers"
        );
    }
    wait_owner(&targets, Some(0), 1, Duration::ZERO);
    wait_owner(&targets, Some(1), 2, Duration::ZERO);
    let ios: f64 = all.iter().map(|g| g.written(1) + g.written(2)).sum();
    eprintln!(
        "gateway group: {secs} s at full load, {:.0} MiB written, owners kept, no failover",
        ios / MIB as f64
    );
}
