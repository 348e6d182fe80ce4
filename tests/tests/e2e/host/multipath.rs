//! rdmablk's own multipath against two rdmablk-target gateways on loopback
//! that export one backing file under one NQN (gateway A optimized, B
//! non-optimized): `rdmablk connect --nbd --path` keeps fio's verified I/O
//! going, without an error, while A is killed with SIGKILL and restarted,
//! and while the gateways' ANA states are swapped by reload; `rdmablk list`
//! shows the paths change. And `rdmablk connect-all`.

use rdmablk_tests::cmdline::tcp_target_args;
use rdmablk_tests::names::DEFAULT_NQN;
use rdmablk_tests::nbd::NbdClient;
use rdmablk_tests::tools::fio;
use rdmablk_tests::{bin_path, free_port, NbdExport, Proc, Ran, Rng, Target, TempDir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One gateway: its configuration file and control socket, and the daemon.
struct Gateway {
    toml: PathBuf,
    sock: PathBuf,
    port: u16,
    t: Option<Target>,
}

impl Gateway {
    /// Writes gateway `name`'s configuration (on `port`, reporting ANA
    /// group 1 `state`, controller ids from `cntlids`) and starts it.
    fn start(
        dir: &Path,
        name: &str,
        port: u16,
        file: &Path,
        state: &str,
        cntlids: (u16, u16),
    ) -> Gateway {
        let mut g = Gateway {
            toml: dir.join(format!("{name}.toml")),
            sock: dir.join(format!("{name}.sock")),
            port,
            t: None,
        };
        g.configure(file, state, cntlids);
        g.run();
        g
    }

    fn configure(&self, file: &Path, state: &str, (min, max): (u16, u16)) {
        let text = format!(
            "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{}\"\n\
             ana_groups = {{ 1 = \"{state}\" }}\n\
             [[subsystem]]\nnqn = \"{DEFAULT_NQN}\"\nallow_any_host = true\n\
             cntlid_min = {min}\ncntlid_max = {max}\n\
             [[subsystem.namespace]]\nbackend = \"file\"\npath = \"{}\"\n",
            self.port,
            file.display()
        );
        std::fs::write(&self.toml, text).expect("writing a gateway's configuration");
    }

    fn run(&mut self) {
        let (toml, sock) = (
            self.toml.display().to_string(),
            self.sock.display().to_string(),
        );
        self.t = Some(Target::start(&["--config", &toml, "--control", &sock]));
    }

    fn reload(&self) {
        let out = Command::new(bin_path("rdmablk-target"))
            .args(["reload", "--control"])
            .arg(&self.sock)
            .output()
            .expect("rdmablk-target reload");
        assert!(
            out.status.success(),
            "reload: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A path as `rdmablk list --json` shows it: its ANA state and whether it
/// is live.
type PathListed = (String, bool);

/// Waits up to 10 s for `line` in the export's log.
fn logged(e: &NbdExport, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !e.report().contains(line) {
        assert!(
            Instant::now() < deadline,
            "no {line:?} in the log\n{}",
            e.report()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two gateways, A optimized and B non-optimized, exporting one shared file
/// of `mib` MiB in `dir`: (A, B, the file).
fn two_gateways(dir: &TempDir, mib: u64) -> (Gateway, Gateway, PathBuf) {
    let file = dir.sparse_file("shared.img", mib << 20);
    let (pa, pb) = (free_port(), free_port());
    let a = Gateway::start(dir.path(), "a", pa, &file, "optimized", (1, 100));
    let b = Gateway::start(dir.path(), "b", pb, &file, "non-optimized", (101, 200));
    (a, b, file)
}

/// fio in the background on `uri`: 4 KiB random writes over `mib` MiB at
/// 2000 IOPS, then all of it read back and verified.
fn slow_verified_fio(uri: &str, mib: u64) -> std::thread::JoinHandle<(Ran, serde_json::Value)> {
    let (uri, size) = (uri.to_string(), format!("--size={mib}M"));
    std::thread::spawn(move || {
        fio(
            &uri,
            &[
                "--name=multipath",
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=16",
                &size,
                "--rate_iops=2000",
                "--verify=crc32c",
                "--verify_fatal=1",
            ],
        )
    })
}

/// Asserts fio's run `r` (report `v`) had no error and verified `mib` MiB.
fn verified(r: &Ran, v: &serde_json::Value, mib: u64, e: &NbdExport) {
    let job = &v["jobs"][0];
    assert!(
        r.status.success() && job["error"] == 0,
        "fio failed across the path changes (job error {})\n{}\n{}",
        job["error"],
        r.report(),
        e.report()
    );
    for dir in ["write", "read"] {
        assert_eq!(
            job[dir]["io_bytes"].as_u64(),
            Some(mib << 20),
            "{dir}\n{}",
            r.report()
        );
    }
}

#[test]
fn an_nbd_export_rides_through_a_gateway_kill_and_ana_changes() {
    let _machine = crate::alone();
    let dir = TempDir::new("multipath");
    let (mut a, b, file) = two_gateways(&dir, 64);
    let (pa, pb) = (a.port, b.port);
    let path_b = format!("tcp://127.0.0.1:{pb}");
    let run_dir = dir.join("run");
    let e = NbdExport::start_in(pa, DEFAULT_NQN, &["--path", &path_b, "-l", "30"], &run_dir);
    let list = || {
        let out = Command::new(bin_path("rdmablk"))
            .args(["list", "--json"])
            .env("RDMABLK_RUN_DIR", &run_dir)
            .output()
            .expect("rdmablk list");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON listing");
        v[0]["paths"]
            .as_array()
            .expect("one connection with paths")
            .iter()
            .map(|p| {
                (
                    p["ana"].as_str().unwrap_or("").to_string(),
                    p["live"] == true,
                )
            })
            .collect::<Vec<_>>()
    };
    let state = |s: &str, live| (s.to_string(), live);
    // What `rdmablk list` shows, within 2 s (the file follows the paths).
    let listed = |want: &dyn Fn(&[PathListed]) -> bool, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut now = list();
        while !want(&now) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            now = list();
        }
        assert!(want(&now), "rdmablk list, {what}: {now:?}");
    };
    listed(
        &|l| l == [state("optimized", true), state("non-optimized", true)],
        "both gateways up",
    );

    // fio writes the 64 MiB at 2000 IOPS (about 8 s), then reads it all
    // back and verifies it, while the paths change under it.
    let fio_run = slow_verified_fio(e.uri(), 64);
    std::thread::sleep(Duration::from_millis(1500));
    a.t.as_mut().expect("A runs").kill();
    logged(&e, "association lost");
    listed(&|l| !l[0].1, "A lost");
    std::thread::sleep(Duration::from_secs(1));
    a.run();
    logged(&e, "association re-established");
    // Swapped: B optimized, A non-optimized.
    b.configure(&file, "optimized", (101, 200));
    b.reload();
    a.configure(&file, "non-optimized", (1, 100));
    a.reload();
    logged(&e, "ANA state non-optimized -> optimized");
    logged(&e, "ANA state optimized -> non-optimized");
    // The target told the host (an Asynchronous Event Request kept
    // outstanding on each path's admin queue).
    logged(&e, &format!("ANA Change notice path=127.0.0.1:{pb}"));
    listed(
        &|l| l == [state("non-optimized", true), state("optimized", true)],
        "after the swap",
    );

    let (r, v) = fio_run.join().expect("fio thread");
    verified(&r, &v, 64, &e);
    // The swap happened while fio wrote: its writes went to B, then back.
    let log = e.report();
    let swapped = log
        .find("ANA state non-optimized -> optimized")
        .expect("logged");
    assert!(
        log[swapped..].contains("NBD client disconnected"),
        "fio ended before the states were swapped\n{log}"
    );
}

/// `rdmablk connect-all` against a discovery controller listing two
/// subsystems for this host: both are served (an NBD socket each, which
/// takes writes that read back), `rdmablk list` shows both, and SIGTERM
/// ends them all.
#[test]
fn connect_all_serves_every_subsystem_listed() {
    let _machine = crate::shared();
    let nqns = [
        "nqn.2026-11.io.rdmablk:all-one",
        "nqn.2026-11.io.rdmablk:all-two",
    ];
    let mut toml =
        "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n".to_string();
    for nqn in nqns {
        toml += &format!(
            "[[subsystem]]\nnqn = \"{nqn}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nbackend = \"memory\"\nsize = \"8MiB\"\n"
        );
    }
    let t = Target::start_config(&toml);
    let dir = TempDir::new("connect-all");
    let (sockets, run_dir) = (dir.join("nbd"), dir.join("run"));
    let mut cmd = Command::new(bin_path("rdmablk"));
    cmd.arg("connect-all")
        .args(tcp_target_args(t.port(), None))
        .arg("--nbd-dir")
        .arg(&sockets)
        .env("RDMABLK_RUN_DIR", &run_dir);
    let mut p = Proc::spawn("rdmablk connect-all", &mut cmd);
    let sock = |nqn: &str| sockets.join(format!("{}.sock", nqn.replace(':', "_")));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !nqns.iter().all(|n| sock(n).exists()) {
        assert!(
            Instant::now() < deadline,
            "no socket for each subsystem\n{}",
            p.report()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, nqn) in nqns.iter().enumerate() {
        let mut c = NbdClient::connect(&sock(nqn)).unwrap_or_else(|r| panic!("{nqn}: {r:?}"));
        let data = Rng::new(i as u64 + 7).bytes(4096);
        c.write(4096, &data).expect("write");
        assert!(
            c.read(4096, 4096).expect("read") == data,
            "{nqn}: read back"
        );
    }
    let out = Command::new(bin_path("rdmablk"))
        .args(["list", "--json"])
        .env("RDMABLK_RUN_DIR", &run_dir)
        .output()
        .expect("rdmablk list");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON listing");
    let mut listed: Vec<&str> = v
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|c| c["subnqn"].as_str())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, nqns, "rdmablk list");
    p.signal(libc::SIGTERM);
    let status = p.wait(Duration::from_secs(20));
    assert!(
        status.success(),
        "connect-all after SIGTERM: {status}\n{}",
        p.report()
    );
    assert!(
        nqns.iter().all(|n| !sock(n).exists()),
        "sockets left behind"
    );
}

/// A gateway that freezes (SIGSTOP: its connections stay open, nothing
/// answers) is left once it misses KATO: fio's verified run completes over
/// the other gateway while the frozen one is still stopped.
#[test]
fn a_frozen_gateway_is_left() {
    let _machine = crate::alone();
    let dir = TempDir::new("multipath-frozen");
    let (a, b, _) = two_gateways(&dir, 32);
    let path_b = format!("tcp://127.0.0.1:{}", b.port);
    let e = NbdExport::start(
        a.port,
        DEFAULT_NQN,
        &["--path", &path_b, "-k", "2", "-l", "30"],
    );
    let fio_run = slow_verified_fio(e.uri(), 32);
    std::thread::sleep(Duration::from_secs(1));
    let pid = a.t.as_ref().expect("A runs").pid();
    rdmablk_tests::send_signal(pid, libc::SIGSTOP);
    let (r, v) = fio_run.join().expect("fio thread");
    rdmablk_tests::send_signal(pid, libc::SIGCONT);
    verified(&r, &v, 32, &e);
    assert!(e.report().contains("association lost"), "{}", e.report());
}
