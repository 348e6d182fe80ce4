//! How the target's pollers and the host's engines wait for work (adaptive
//! polling, `common::spin`): an idle target and an idle connected host
//! sleep; a spin window longer than the round trip keeps both sides polling
//! through a load, which their own counters show (bench's batching figures,
//! the target's sleeps in its metrics and status), and a window of zero
//! sleeps between commands; busy polling never sleeps.

use rdmablk_tests::cmdline::tcp_target_args;
use rdmablk_tests::control::ControlledTarget;
use rdmablk_tests::metrics::{samples, scrape};
use rdmablk_tests::names::DEFAULT_NQN;
use rdmablk_tests::tools::{bench, check_bench, fio, TOOL_TIMEOUT};
use rdmablk_tests::{bin_path, cpu_time, free_port, run, NbdExport, Target};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

/// A daemon with one poller pinned to the first CPU, `pollers` added to
/// `[pollers]`, metrics on a free port, and a 64 MiB memory namespace; and
/// that port.
fn daemon(pollers: &str) -> (ControlledTarget, u16) {
    let metrics = free_port();
    let d = ControlledTarget::start_on(
        &format!(
            "[pollers]\ncount = 1\n{pollers}\n\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\n\
         [[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
         [[subsystem]]\nnqn = \"{DEFAULT_NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = \"memory\"\nsize = \"64MiB\"\n"
        ),
        Some("0"),
    );
    (d, metrics)
}

/// CPU the process used over `secs` seconds from now, as a share of a core.
fn cpu_share(pid: u32, secs: f64) -> f64 {
    let (c0, t0) = (cpu_time(pid), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    (cpu_time(pid) - c0).as_secs_f64() / t0.elapsed().as_secs_f64()
}

#[test]
fn an_idle_target_and_an_idle_connected_host_sleep() {
    let _machine = crate::alone();
    let t = Target::start(&["--memory", "64MiB", "--pollers", "2"]);
    let e = NbdExport::start(t.port(), DEFAULT_NQN, &[]);
    // Work first, one command at a time: the spin windows of both sides
    // grow to cover the round trip.
    let (r, v) = fio(
        e.uri(),
        &[
            "--name=warm",
            "--rw=randread",
            "--bs=4k",
            "--iodepth=1",
            "--size=64M",
            "--runtime=1",
            "--time_based",
        ],
    );
    assert!(
        r.status.success() && v["jobs"][0]["read"]["io_bytes"].as_u64().unwrap_or(0) > 0,
        "fio read nothing\n{}",
        r.report()
    );
    std::thread::sleep(Duration::from_millis(300));
    let (target, host) = std::thread::scope(|s| {
        let target = s.spawn(|| cpu_share(t.pid(), 3.0));
        (target.join().expect("target"), cpu_share(e.pid(), 3.0))
    });
    assert!(
        target < 0.03 && host < 0.03,
        "idle for 3 s after a load, the target used {:.1} % of a core and the \
         connected host {:.1} %: one of them does not go to sleep",
        target * 100.0,
        host * 100.0
    );
    // What this measures tells a poller that never sleeps.
    let (busy, _) = daemon("busy_poll = true");
    let spinning = cpu_share(busy.t.pid(), 1.0);
    assert!(
        spinning > 0.25,
        "a busy-polling poller used only {:.1} % of a core",
        spinning * 100.0
    );
}

/// One command at a time for 2 s with the host's `flags` (pinned to the
/// second CPU: a thread that shares its CPU stops polling) against a target
/// whose `[pollers]` add `spin`; returns commands per wake-up of the host
/// (None: it never slept) and of the target, and the target's status.
fn run_qd1(spin: &str, flags: &[&str]) -> (Option<f64>, f64, String) {
    let (d, metrics) = daemon(spin);
    let mut args = vec![
        "--rw",
        "randread",
        "--bs",
        "4k",
        "--qd",
        "1",
        "--runtime",
        "2s",
        "--json",
    ];
    args.extend_from_slice(flags);
    let mut c = Command::new("taskset");
    c.args(["-c", "1"])
        .arg(bin_path("rdmablk"))
        .arg("bench")
        .args(tcp_target_args(d.t.port(), Some(DEFAULT_NQN)))
        .args(&args);
    let r = run("rdmablk bench", &mut c, TOOL_TIMEOUT);
    let v = check_bench(&r, 4096.0, &["read"], "bench at QD 1");
    let host = v["commands_per_wakeup"].as_f64();
    assert!(
        v["commands_per_send"].as_f64().is_some_and(|x| x >= 1.0),
        "commands per send over NVMe/TCP: {v}"
    );
    let s = samples(&scrape(SocketAddr::from(([127, 0, 0, 1], metrics))));
    let commands = s
        .get(&format!(
            "rdmablk_namespace_commands_total{{subsystem=\"{DEFAULT_NQN}\",nsid=\"1\",op=\"read\"}}"
        ))
        .copied()
        .unwrap_or(0.0);
    let sleeps = s
        .get("rdmablk_poller_sleeps_total{poller=\"0\"}")
        .copied()
        .expect("rdmablk_poller_sleeps_total in the scrape");
    assert!(commands > 500.0, "the target answered {commands} reads");
    let (ok, status, err) = d.run(&["status"]);
    assert!(ok, "status: {err}");
    (host, commands / sleeps.max(1.0), status)
}

#[test]
fn a_window_longer_than_the_round_trip_keeps_both_sides_polling() {
    let _machine = crate::alone();
    // 5 ms is far above a loopback round trip: the host waits for each
    // completion polling, and the target for each next command.
    let (host, target, status) = run_qd1(
        "spin_min = \"5ms\"\nspin_max = \"5ms\"",
        &["--spin-min", "5ms", "--spin-max", "5ms"],
    );
    // (None: the host never slept at all.)
    let (spun_host, spun_target) = (host.unwrap_or(f64::INFINITY), target);
    assert!(
        spun_host > 10.0 && spun_target > 10.0,
        "with 5 ms windows, commands per wake-up: host {spun_host:.1}, target {spun_target:.1} \
         (each side should sleep only when the other is slower than 5 ms)"
    );
    assert!(
        status.contains("pollers: adaptive polling: spin 5000us to 5000us after the last work")
            && status.contains("  poller 0: "),
        "status:\n{status}"
    );

    // A window of zero: both sides sleep whenever a round finds nothing,
    // about once per command; less often when a side lost its CPU for
    // longer than the other took to answer (a shared virtual machine loses
    // its CPUs often: up to 4.4 commands per wake-up were seen).
    let (host, target, status) = run_qd1("spin_max = 0", &["--spin-max", "0"]);
    let host = host.expect("a host that never spins sleeps");
    assert!(
        host < 10.0 && target < 10.0 && spun_host > 3.0 * host && spun_target > 3.0 * target,
        "without spinning, commands per wake-up: host {host:.1}, target {target:.1} \
         (with 5 ms windows: {spun_host:.1}, {spun_target:.1})"
    );
    assert!(
        status.contains("pollers: sleep when idle (no spinning)"),
        "status:\n{status}"
    );

    // Busy polling never sleeps.
    let (host, _, _) = run_qd1("", &["--busy-poll"]);
    assert_eq!(host, None, "a busy-polling host slept");
}

#[test]
fn spin_flags_are_checked_before_connecting() {
    let _machine = crate::shared();
    // Nothing listens on this port: an accepted flag would fail to connect.
    let port = free_port();
    for (flags, says) in [
        (["--spin-min", "0"], "above zero"),
        (["--spin-min", "200us"], "above its maximum"),
        (["--spin-max", "1s"], "busy polling"),
        (["--spin-max", "5parsecs"], "--spin-max"),
    ] {
        let r = bench(port, DEFAULT_NQN, &flags);
        assert!(
            !r.status.success() && r.stderr.contains(says) && !r.stderr.contains("connect"),
            "bench {flags:?}: want an error saying {says:?}\n{}",
            r.report()
        );
    }
}
