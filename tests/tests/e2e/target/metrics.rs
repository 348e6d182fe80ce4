//! The target's Prometheus endpoint (`[metrics] listen`): what a scrape says
//! after known I/O from `rdmablk bench`, hosts and errors, promtool's lint,
//! and an HTTP server that a silent or oversized client cannot hold.

use rdmablk_common::nvme::{nvm, Status};
use rdmablk_tests::check::{assert_status, open, wait_until, OrPanic};
use rdmablk_tests::client::{Opts, Queue};
use rdmablk_tests::cmdline::tcp_target_args;
use rdmablk_tests::metrics::{http, samples, scrape};
use rdmablk_tests::names::{DEFAULT_NQN, HOST_A};
use rdmablk_tests::{bin_path, free_port, open_subsystem_config, Target};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NS_BYTES: u64 = 64 << 20;

/// A target with a 64 MiB memory namespace and metrics on a free port.
fn target_with_metrics() -> (Target, SocketAddr) {
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .expect("address");
    let t = Target::start_config(&open_subsystem_config(
        &format!("[metrics]\nlisten = \"{metrics}\""),
        DEFAULT_NQN,
        "nsid = 1\nbackend = \"memory\"\nsize = \"64MiB\"",
    ));
    (t, metrics)
}

fn ns_series(name: &str, extra: &str) -> String {
    format!("{name}{{subsystem=\"{DEFAULT_NQN}\",nsid=\"1\"{extra}}}")
}

fn value(s: &BTreeMap<String, f64>, series: &str) -> f64 {
    *s.get(series)
        .unwrap_or_else(|| panic!("no {series} in the scrape: {:#?}", s.keys()))
}

/// `promtool check metrics` (Debian's prometheus package) has nothing to
/// say about a scrape.
fn promtool_is_content(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .or_panic("running promtool (scripts/setup.sh --test installs it)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .or_panic("feeding promtool");
    let out = child.wait_with_output().or_panic("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {}\n{said}\n--- scrape ---\n{text}",
        out.status
    );
}

/// The command and byte counters equal what `rdmablk bench` did; the
/// latency histogram counts every command; nothing is left in flight.
#[test]
fn counters_match_the_io_bench_did() {
    let _machine = crate::shared();
    let (t, metrics) = target_with_metrics();
    let before = samples(&scrape(metrics));
    for op in ["read", "write", "other"] {
        let extra = format!(",op=\"{op}\"");
        assert_eq!(
            value(
                &before,
                &ns_series("rdmablk_namespace_commands_total", &extra)
            ),
            0.0
        );
    }
    let out = Command::new(bin_path("rdmablk"))
        .arg("bench")
        .args(tcp_target_args(t.port(), Some(DEFAULT_NQN)))
        .args(["--rw", "randrw", "--bs", "4k", "--qd", "8"])
        .args(["--runtime", "2s", "--json"])
        .output()
        .or_panic("running rdmablk bench");
    assert!(
        out.status.success(),
        "bench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    let (reads, writes) = (
        j["read"]["ios"].as_u64().expect("read ios"),
        j["write"]["ios"].as_u64().expect("write ios"),
    );
    assert!(
        reads > 100 && writes > 100,
        "bench did {reads} reads, {writes} writes"
    );

    // The bench has exited; the target closes its controllers once it read
    // the end of each connection.
    wait_until(
        Duration::from_secs(5),
        "the bench's controllers to end",
        || !scrape(metrics).contains("rdmablk_host_controllers{"),
    );
    let text = scrape(metrics);
    let s = samples(&text);
    for (op, ios) in [("read", reads), ("write", writes)] {
        let extra = format!(",op=\"{op}\"");
        assert_eq!(
            value(&s, &ns_series("rdmablk_namespace_commands_total", &extra)),
            ios as f64,
            "{op} commands"
        );
        assert_eq!(
            value(&s, &ns_series("rdmablk_namespace_bytes_total", &extra)),
            (ios * 4096) as f64,
            "{op} bytes"
        );
        // The subsystem's one namespace: its histogram is the namespace's.
        let subsystem = |name: &str, extra: &str| {
            format!("{name}{{subsystem=\"{DEFAULT_NQN}\",op=\"{op}\"{extra}}}")
        };
        let count = subsystem("rdmablk_subsystem_command_duration_seconds_count", "");
        assert_eq!(value(&s, &count), ios as f64, "{op} latency count");
        let inf = subsystem(
            "rdmablk_subsystem_command_duration_seconds_bucket",
            ",le=\"+Inf\"",
        );
        assert_eq!(value(&s, &inf), ios as f64, "{op} +Inf bucket");
        let sum = subsystem("rdmablk_subsystem_command_duration_seconds_sum", "");
        let seconds = ns_series("rdmablk_namespace_command_seconds_total", &extra);
        assert_eq!(
            value(&s, &seconds),
            value(&s, &sum),
            "{op}: the namespace's time is its subsystem's"
        );
        assert!(value(&s, &seconds) > 0.0, "{op}: commands took time");
    }
    assert_eq!(
        value(&s, &ns_series("rdmablk_namespace_commands_in_flight", "")),
        0.0
    );
    assert_eq!(
        value(&s, &ns_series("rdmablk_namespace_size_bytes", "")),
        NS_BYTES as f64
    );
    assert!(
        !text.contains("rdmablk_namespace_errors_total{"),
        "errors after a clean run:\n{text}"
    );
    assert!(
        !text.contains("rdmablk_host_controllers{"),
        "bench has left, its controllers should be gone:\n{text}"
    );
    assert!(value(&s, "rdmablk_poller_busy_seconds_total{poller=\"0\"}") > 0.0);
    let ana = format!(
        "rdmablk_ana_state{{listener=\"tcp://{}\",group=\"1\",state=\"optimized\"}}",
        t.addr()
    );
    assert_eq!(value(&s, &ana), 1.0, "the namespace's ANA group");
    promtool_is_content(&text);
}

/// A connected host shows as controllers and queues by host NQN and
/// transport, and goes when it leaves; a read past the end counts as an
/// LBA Out of Range error of the namespace (NVMe Base 2.1, 3.3.3.2.2).
#[test]
fn hosts_and_errors_show_while_they_last() {
    let _machine = crate::shared();
    let (t, metrics) = target_with_metrics();
    let mut c = open(&t, DEFAULT_NQN, HOST_A, &Opts::default());
    let s = samples(&scrape(metrics));
    let host = format!("{{host=\"{HOST_A}\",transport=\"tcp\",tls=\"false\"}}");
    assert_eq!(value(&s, &format!("rdmablk_host_controllers{host}")), 1.0);
    assert_eq!(
        value(&s, &format!("rdmablk_host_queues{host}")),
        1.0 + c.io.len() as f64,
        "admin queue and I/O queues"
    );

    let past_end = NS_BYTES / 512;
    let q = &mut c.io[0];
    let cid = q
        .submit(Queue::rw_sqe(nvm::READ, 1, past_end, 8), None, 4096)
        .or_panic("submit");
    let done = q.wait(cid).or_panic("read past the end");
    assert_status(&done, Status::LBA_OUT_OF_RANGE, "read past the end");
    let text = scrape(metrics);
    let s = samples(&text);
    let errors = ns_series(
        "rdmablk_namespace_errors_total",
        ",status=\"LBA Out of Range\",sct=\"0\",sc=\"0x80\"",
    );
    assert_eq!(value(&s, &errors), 1.0, "{text}");
    assert_eq!(
        value(
            &s,
            &ns_series("rdmablk_namespace_commands_total", ",op=\"read\"")
        ),
        1.0
    );
    promtool_is_content(&text);

    drop(c);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = scrape(metrics);
        if !text.contains(&format!("rdmablk_host_controllers{host}")) {
            break;
        }
        assert!(Instant::now() < deadline, "the host left 5 s ago:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Other paths and methods get 404 and 405, an oversized request 431, and
/// a client that connects and says nothing holds the endpoint for its read
/// deadline (2 s) at most.
#[test]
fn the_endpoint_refuses_what_it_does_not_serve() {
    let _machine = crate::shared();
    let (_t, metrics) = target_with_metrics();
    let (status, _) = http(metrics, b"GET /nothing HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    let (status, _) = http(
        metrics,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    let mut big = b"GET /metrics HTTP/1.1\r\n".to_vec();
    big.extend(std::iter::repeat_n(b"X-Pad: 0123456789abcdef\r\n".as_slice(), 600).flatten());
    big.extend_from_slice(b"\r\n");
    let (status, _) = http(metrics, &big);
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    let (status, body) = http(metrics, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_eq!((status.as_str(), body.as_str()), ("HTTP/1.1 200 OK", ""));

    let _silent = TcpStream::connect(metrics).or_panic("a silent client");
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    scrape(metrics);
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "a silent client held the endpoint for {:?}",
        start.elapsed()
    );
}
