//! Runs of real clients whose reports tests check: fio (nbd engine) with
//! verification, and `rdmablk bench --json`.

use crate::{run, Ran, TempDir};
use serde_json::Value;
use std::fs;
use std::process::Command;
use std::time::Duration;

/// Longest any single run of a tool may take: a hang fails the test with
/// the tool's output instead of stalling the suite.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Runs fio with its JSON report in a file; returns the run and the report.
pub fn fio(uri: &str, args: &[&str]) -> (Ran, Value) {
    let dir = TempDir::new("fio");
    let report = dir.join("fio.json");
    let uri_arg = format!("--uri={uri}");
    let output = format!("--output={}", report.display());
    let mut c = cmd(
        "fio",
        &["--ioengine=nbd", &uri_arg, "--output-format=json", &output],
    );
    // fio leaves verify state files in its working directory.
    c.args(args).current_dir(dir.path());
    let r = run("fio", &mut c, TOOL_TIMEOUT);
    let text = fs::read_to_string(&report).unwrap_or_default();
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("fio wrote no JSON report ({e}):\n{text}\n{}", r.report()));
    (r, v)
}

/// Asserts a fio job wrote and verified `size` bytes without an error.
pub fn fio_ok(uri: &str, args: &[&str], size: u64, what: &str) {
    let (r, v) = fio(uri, args);
    let job = &v["jobs"][0];
    let verify_lines: Vec<&str> = r
        .stderr
        .lines()
        .chain(r.stdout.lines())
        .filter(|l| l.contains("verify:"))
        .take(10)
        .collect();
    assert!(
        r.status.success() && job["error"] == 0 && verify_lines.is_empty(),
        "{what}: fio failed (job error {}), first verify errors:\n  {}\n{}",
        job["error"],
        verify_lines.join("\n  "),
        r.report()
    );
    let written = job["write"]["io_bytes"].as_u64().unwrap_or(0);
    let read = job["read"]["io_bytes"].as_u64().unwrap_or(0);
    assert_eq!(written, size, "{what}: bytes fio wrote\n{}", r.report());
    assert_eq!(
        read,
        size,
        "{what}: bytes fio read back to verify\n{}",
        r.report()
    );
}

pub fn bench(port: u16, nqn: &str, args: &[&str]) -> Ran {
    let mut c = crate::rdmablk_command("bench", port, nqn);
    c.args(args);
    run("rdmablk bench", &mut c, TOOL_TIMEOUT)
}

/// The one JSON object `bench --json` prints on stdout.
pub fn bench_json(r: &Ran) -> Value {
    let v: Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("bench stdout is not one JSON value ({e})\n{}", r.report()));
    assert!(
        v.is_object(),
        "bench stdout is not an object\n{}",
        r.report()
    );
    v
}

pub fn num(v: &Value, path: &str, r: &Ran) -> f64 {
    let mut x = v;
    for k in path.split('/') {
        x = &x[k];
    }
    x.as_f64().unwrap_or_else(|| {
        panic!(
            "bench JSON: `{path}` missing or not a number in {v}\n{}",
            r.report()
        )
    })
}

/// Checks a successful `bench --json` result that did `bs`-byte I/O in the
/// directions `dirs`.
pub fn check_bench(r: &Ran, bs: f64, dirs: &[&str], what: &str) -> Value {
    r.assert_success(what);
    let v = bench_json(r);
    let ctx = format!("{what}: {v}");
    let cpu = num(&v, "cpu_us_per_io", r);
    assert!(cpu > 0.0, "{ctx}: no CPU time per I/O");
    let mut sum_iops = 0.0;
    let mut sum_bw = 0.0;
    for d in ["read", "write"] {
        let ios = num(&v, &format!("{d}/ios"), r);
        let errors = num(&v, &format!("{d}/errors"), r);
        let iops = num(&v, &format!("{d}/iops"), r);
        let bw = num(&v, &format!("{d}/bw_bytes"), r);
        assert_eq!(errors, 0.0, "{ctx}: {d} errors");
        if dirs.contains(&d) {
            assert!(ios > 0.0 && iops > 0.0 && bw > 0.0, "{ctx}: no {d} I/O");
            let lat: Vec<f64> = ["p50", "p99", "p99.9", "max"]
                .iter()
                .map(|p| num(&v, &format!("{d}/lat_us/{p}"), r))
                .collect();
            assert!(
                lat[0] > 0.0 && lat.windows(2).all(|w| w[0] <= w[1]),
                "{ctx}: {d} latency percentiles p50, p99, p99.9, max not ordered: {lat:?}"
            );
            let bs_seen = bw / iops;
            assert!(
                (bs_seen - bs).abs() <= bs * 0.01,
                "{ctx}: {d} bw_bytes / iops = {bs_seen}, want the block size {bs}"
            );
        }
        sum_iops += iops;
        sum_bw += bw;
    }
    let (iops, bw) = (num(&v, "iops", r), num(&v, "bw_bytes", r));
    assert!(
        (iops - sum_iops).abs() <= 0.01 * iops + 1.0 && (bw - sum_bw).abs() <= 0.01 * bw + 1.0,
        "{ctx}: top-level iops/bw_bytes are not reads and writes together"
    );
    if let Some(n) = v.get("verify_errors") {
        assert_eq!(n.as_u64(), Some(0), "{ctx}: verify_errors");
    }
    v
}
