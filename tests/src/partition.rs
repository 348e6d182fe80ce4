//! The partition suite's cluster and its run: gateways (`rdmablk-target`),
//! each in a network namespace of its own ([`testnet`](crate::testnet)); a
//! host namespace where `rdmablk connect --nbd` exports each namespace
//! over a path to every gateway; the [`workload`](crate::workload)'s
//! clients on those exports; the [`nemesis`](crate::nemesis)'s schedules
//! run against the gateways; and the [`history`](crate::history)
//! checker's verdict, with how long I/O paused after each kind of fault.

use crate::history::{self, Outcome, Recorder, Report};
use crate::nemesis::{self, Fault, Schedule, Window};
use crate::stall::StallablePath;
use crate::testnet::{Link, Node};
use crate::workload::{self, Export, Options, Workload};
use crate::{bin_path, send_signal, NbdExport, Target, TempDir, STOP_TIMEOUT};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Every gateway's NVMe/TCP port (each has an address of its own).
pub const PORT: u16 = 4420;
/// Every gateway's metrics port.
pub const METRICS_PORT: u16 = 9464;
/// How long a gateway may take to stop on SIGTERM: the unit's
/// `TimeoutStopSec`.
const RESTART_WITHIN: Duration = Duration::from_secs(30);
/// The host namespace's address: 198.18.0.`HOST`.
const HOST: u8 = 21;
/// Gateway `i`'s address: 198.18.0.`FIRST_GATEWAY + i`.
const FIRST_GATEWAY: u8 = 11;

/// A gateway in its namespace, started from a configuration file of its own.
pub struct Gateway {
    pub name: String,
    // Before its node: the daemon is killed before its namespace goes.
    target: Option<Target>,
    pub node: Node,
    config: PathBuf,
    cuts: Vec<Link>,
}

impl Gateway {
    /// The running daemon.
    pub fn t(&self) -> &Target {
        self.target.as_ref().expect("the gateway runs")
    }

    /// Whether its daemon runs (not killed or stopped by the nemesis).
    pub fn is_up(&self) -> bool {
        self.target.is_some()
    }

    /// Its path, as the host names it.
    pub fn url(&self) -> String {
        format!("tcp://{}:{PORT}", self.node.addr())
    }

    /// Starts its daemon.
    pub fn start(&mut self) {
        let launcher = self.node.launcher();
        self.target = Some(Target::start_launched(&launcher, &self.config));
    }

    fn cut(&mut self, link: Link, on: bool) {
        self.cuts.retain(|l| *l != link);
        if on {
            self.cuts.push(link);
        }
        self.node.cut(&self.cuts);
    }
}

/// The gateways, the host namespace, and the Ceph OSD's pid (for
/// [`Fault::PauseOsd`]), as the nemesis acts on them.
pub struct Cluster {
    pub gateways: Vec<Gateway>,
    pub host: Node,
    host_cuts: Vec<Link>,
    osd: Option<u32>,
    /// Gateways' stallable paths to their storage, by gateway.
    stalls: BTreeMap<usize, StallablePath>,
    /// What went wrong with a fault itself (a gateway that would not
    /// stop), for the verdict.
    incidents: Vec<String>,
    /// Keeps the gateways' configurations.
    _dir: TempDir,
}

impl Cluster {
    /// Gateways named `names`, their configurations made by `config(name,
    /// address)` (listening on `address:PORT`, metrics on
    /// `address:METRICS_PORT`), started in turn; `osd` is the Ceph OSD's
    /// pid when the namespaces are RBD images.
    pub fn start(
        names: &[&str],
        config: &dyn Fn(&str, std::net::Ipv4Addr) -> String,
        osd: Option<u32>,
    ) -> Cluster {
        let dir = TempDir::new("partition");
        let mut gateways = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let node = Node::new(name, FIRST_GATEWAY + i as u8);
            let path = dir.join(&format!("{name}.toml"));
            std::fs::write(&path, config(name, node.addr()))
                .expect("writing a gateway's configuration");
            let mut g = Gateway {
                name: name.to_string(),
                node,
                config: path,
                target: None,
                cuts: Vec::new(),
            };
            g.start();
            gateways.push(g);
        }
        Cluster {
            gateways,
            host: Node::new("host", HOST),
            host_cuts: Vec::new(),
            osd,
            stalls: BTreeMap::new(),
            incidents: Vec::new(),
            _dir: dir,
        }
    }

    /// `rdmablk connect --nbd` in the host namespace for namespace `nsid`
    /// of `nqn`, with a path to every gateway (the first as `-a`) and
    /// `extra` arguments.
    pub fn export(&self, nqn: &str, nsid: u32, extra: &[&str]) -> NbdExport {
        let mut cmd = self.host.command(bin_path("rdmablk"));
        let first = self.gateways[0].node.addr().to_string();
        cmd.args([
            "connect",
            "-t",
            "tcp",
            "-a",
            &first,
            "-s",
            &PORT.to_string(),
        ])
        .args(["-n", nqn, "--nsid", &nsid.to_string()]);
        for g in &self.gateways[1..] {
            cmd.args(["--path", &g.url()]);
        }
        cmd.args(extra);
        NbdExport::start_command(cmd)
    }

    /// Gives gateway `gateway` the stallable path its storage goes
    /// through ([`Fault::StallStorage`]).
    pub fn stall_with(&mut self, gateway: usize, path: StallablePath) {
        self.stalls.insert(gateway, path);
    }

    fn stall(&self, gateway: usize) -> &StallablePath {
        self.stalls
            .get(&gateway)
            .unwrap_or_else(|| panic!("gateway {gateway} has no stallable path to its storage"))
    }

    /// Stops every gateway with SIGTERM, together (each closes its images,
    /// which can then be removed at once).
    pub fn stop(&mut self) {
        for g in &mut self.gateways {
            if let Some(t) = &mut g.target {
                t.terminate();
            }
        }
        for g in &mut self.gateways {
            if let Some(mut t) = g.target.take() {
                t.wait(STOP_TIMEOUT);
            }
        }
    }

    fn host_cut(&mut self, link: Link, on: bool) {
        self.host_cuts.retain(|l| *l != link);
        if on {
            self.host_cuts.push(link);
        }
        self.host.cut(&self.host_cuts);
    }
}

impl nemesis::Cluster for Cluster {
    fn inject(&mut self, fault: Fault, gateway: usize) {
        let host = Link::Peer(self.host.addr());
        let g = &mut self.gateways[gateway];
        match fault {
            Fault::Kill => {
                if let Some(mut t) = g.target.take() {
                    t.kill();
                }
            }
            Fault::Freeze => send_signal(g.t().pid(), libc::SIGSTOP),
            Fault::Restart => {
                if let Some(mut t) = g.target.take() {
                    // A stopping daemon waits for what librbd still holds
                    // (up to its `timeout`, 20 s): systemd's bound.
                    t.terminate();
                    match t.wait_exit(RESTART_WITHIN) {
                        Some(status) if status.success() => {}
                        Some(status) => self.incidents.push(format!(
                            "{} exited {status} on SIGTERM\n{}",
                            g.name,
                            t.log_tail()
                        )),
                        None => {
                            // As systemd would: SIGKILL, and the run goes on.
                            self.incidents.push(format!(
                                "{} still ran {RESTART_WITHIN:?} after SIGTERM (killed)\n{}",
                                g.name,
                                t.log_tail()
                            ));
                            t.kill();
                        }
                    }
                }
            }
            Fault::CutCeph => g.cut(Link::Ceph, true),
            Fault::CutHosts | Fault::Flap => g.cut(host, true),
            Fault::CutPath => {
                let path = Link::Peer(g.node.addr());
                self.host_cut(path, true);
            }
            Fault::PauseOsd => send_signal(self.osd.expect("an OSD to pause"), libc::SIGSTOP),
            Fault::StallStorage => self.stall(gateway).stall(),
        }
    }

    fn heal(&mut self, fault: Fault, gateway: usize) {
        let host = Link::Peer(self.host.addr());
        let g = &mut self.gateways[gateway];
        match fault {
            Fault::Kill | Fault::Restart => g.start(),
            Fault::Freeze => send_signal(g.t().pid(), libc::SIGCONT),
            Fault::CutCeph => g.cut(Link::Ceph, false),
            Fault::CutHosts | Fault::Flap => g.cut(host, false),
            Fault::CutPath => {
                let path = Link::Peer(g.node.addr());
                self.host_cut(path, false);
            }
            Fault::PauseOsd => send_signal(self.osd.expect("an OSD to pause"), libc::SIGCONT),
            Fault::StallStorage => self.stall(gateway).resume(),
        }
    }

    fn flap(&mut self, gateway: usize, cut: bool) {
        let host = Link::Peer(self.host.addr());
        self.gateways[gateway].cut(host, cut);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A frozen gateway or a paused OSD must not outlive the test.
        for g in &self.gateways {
            if let Some(t) = &g.target {
                send_signal(t.pid(), libc::SIGCONT);
            }
        }
        if let Some(osd) = self.osd {
            send_signal(osd, libc::SIGCONT);
        }
    }
}

/// What a run of schedules showed.
pub struct Verdict {
    /// The checker's report on the whole history.
    pub report: Report,
    /// Each schedule run, with its faults as they happened.
    pub schedules: Vec<(Schedule, Vec<Window>)>,
    /// For each kind of fault, the longest time any namespace went without
    /// a completed operation, from the fault's start to `settle` after its
    /// end.
    pub pauses: BTreeMap<Fault, Duration>,
    /// Faults that did not go as they should (a gateway that would not
    /// stop on SIGTERM).
    pub incidents: Vec<String>,
    /// The slowest operations longer than half the deadline, slowest
    /// first, each with the schedule it started during.
    pub slowest: Vec<String>,
}

impl Verdict {
    /// The schedules, the faults by kind, the pauses and the checker's
    /// counts, for the test's output.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for (schedule, _) in &self.schedules {
            s.push_str(&format!("schedule {schedule}\n"));
        }
        let mut kinds: BTreeMap<Fault, usize> = BTreeMap::new();
        for w in self.schedules.iter().flat_map(|(_, w)| w) {
            *kinds.entry(w.fault).or_default() += 1;
        }
        s.push_str(&format!("{} schedules; faults:", self.schedules.len()));
        for (k, n) in &kinds {
            s.push_str(&format!(" {} {n}", k.name()));
        }
        s.push_str("\nlongest time without a completed operation after each kind of fault:");
        for (k, d) in &self.pauses {
            s.push_str(&format!(" {} {:.1}s", k.name(), d.as_secs_f64()));
        }
        s.push_str(&format!("\n{}", self.report.summary()));
        for slow in &self.slowest {
            s.push_str(&format!("\nslow: {slow}"));
        }
        s
    }

    /// Each anomaly the checker found, with the schedule during which (or
    /// in whose settling) it showed: at the end of its last operation.
    pub fn anomalies(&self) -> Vec<String> {
        self.report
            .anomalies
            .iter()
            .map(|a| {
                let at = a
                    .ops()
                    .iter()
                    .map(|o| o.end.unwrap_or(o.start))
                    .max()
                    .unwrap_or_default();
                format!(
                    "anomaly: {a}\n  (showed during schedule {})",
                    during(&self.schedules, at)
                )
            })
            .collect()
    }
}

/// The schedule running (or settling) at `at`.
fn during(schedules: &[(Schedule, Vec<Window>)], at: Duration) -> String {
    schedules
        .iter()
        .rev()
        .find(|(_, w)| w.first().is_some_and(|w| w.injected <= at))
        .map_or("before the first schedule".to_string(), |(s, _)| {
            s.to_string()
        })
}

/// The `SLOWEST` longest operations of `history` past half `deadline`,
/// each with the schedule it started during.
fn slowest(
    history: &history::History,
    schedules: &[(Schedule, Vec<Window>)],
    deadline: Duration,
) -> Vec<String> {
    const SLOWEST: usize = 5;
    let mut slow: Vec<_> = history
        .ops
        .iter()
        .filter_map(|o| Some((o.end? - o.start, o)))
        .filter(|(took, _)| *took > deadline / 2)
        .collect();
    slow.sort_by_key(|s| std::cmp::Reverse(s.0));
    slow.iter()
        .take(SLOWEST)
        .map(|(took, o)| {
            format!(
                "{:.1}s: {o}\n  (started during schedule {})",
                took.as_secs_f64(),
                during(schedules, o.start)
            )
        })
        .collect()
}

/// The schedules of `RDMABLK_PARTITION_SCHEDULES` seeds (default 3) from
/// `RDMABLK_PARTITION_SEED` on (default 1), of `kinds` of fault over
/// `gateways` gateways.
pub fn schedules_from_env(gateways: usize, kinds: &[Fault]) -> Vec<Schedule> {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let first = env("RDMABLK_PARTITION_SEED", 1);
    let count = env("RDMABLK_PARTITION_SCHEDULES", 3);
    (first..first + count)
        .map(|seed| Schedule::generate(seed, gateways, kinds))
        .collect()
}

/// Runs the workload on `exports` while each of `schedules` runs against
/// `cluster`, `settle` called after each (it waits until the cluster is
/// back as it started); then reads every register once and checks the
/// history, an operation longer than `opts.deadline` being hung. With
/// `RDMABLK_HISTORY_FILE` set, the history is written there, an operation
/// a line.
pub fn run_schedules(
    cluster: &mut Cluster,
    exports: &[Export],
    opts: &Options,
    schedules: &[Schedule],
    settle: &mut dyn FnMut(&mut Cluster),
) -> Verdict {
    let recorder = Recorder::new();
    let load = Workload::start(exports, opts, &recorder, 1);
    std::thread::sleep(Duration::from_secs(1));
    let mut ran = Vec::new();
    for schedule in schedules {
        eprintln!("partition: running schedule {schedule}");
        let now = || recorder.now();
        let windows = nemesis::run(schedule, cluster, &now);
        settle(cluster);
        ran.push((schedule.clone(), windows));
    }
    load.stop();
    workload::read_all(exports, opts, &recorder, 0);
    let history = recorder.history();
    if let Some(path) = std::env::var_os("RDMABLK_HISTORY_FILE") {
        let text: String = history.ops.iter().map(|o| format!("{o}\n")).collect();
        std::fs::write(&path, text).expect("writing RDMABLK_HISTORY_FILE");
    }
    let report = history::check(&history, opts.deadline);
    let pauses = pauses(&history, &ran, Duration::from_secs(10));
    let slowest = slowest(&history, &ran, opts.deadline);
    Verdict {
        report,
        schedules: ran,
        pauses,
        incidents: std::mem::take(&mut cluster.incidents),
        slowest,
    }
}

/// For each kind of fault, the longest time a namespace went without a
/// completed operation between the fault's start and `after` past its end.
fn pauses(
    history: &history::History,
    schedules: &[(Schedule, Vec<Window>)],
    after: Duration,
) -> BTreeMap<Fault, Duration> {
    let mut done: BTreeMap<u32, Vec<Duration>> = BTreeMap::new();
    for op in &history.ops {
        if let (Outcome::Ok, Some(end)) = (op.outcome, op.end) {
            done.entry(op.register.namespace).or_default().push(end);
        }
    }
    for ends in done.values_mut() {
        ends.sort();
    }
    let mut longest: BTreeMap<Fault, Duration> = BTreeMap::new();
    for w in schedules.iter().flat_map(|(_, w)| w) {
        let (from, to) = (w.injected, w.healed + after);
        for ends in done.values() {
            let mut last = from;
            let mut gap = Duration::ZERO;
            for &e in ends.iter().filter(|&&e| e > from && e <= to) {
                gap = gap.max(e - last);
                last = e;
            }
            let l = longest.entry(w.fault).or_default();
            *l = (*l).max(gap);
        }
    }
    longest
}
