//! `rdmablk connect-all`: connects every NVMe subsystem that discovery
//! controllers list for this host, with all the paths their entries name,
//! one `rdmablk connect` process per subsystem (so each is an independent
//! export that `rdmablk list` shows and a signal ends cleanly).

use super::params::{discovery_params, MAX_PATHS};
use crate::cli::Target;
use rdmablk::host::{Session, Transport};
use rdmablk::signals::{stop_set, StopSignals};
use rdmablk_common::fabrics::discovery::subtype;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

/// Subsystems one `connect-all` serves at most (a process each), whatever
/// a discovery log lists.
const MAX_SUBSYSTEMS: usize = 128;

/// How each subsystem is served.
pub enum Frontend {
    /// An NBD export per subsystem in this directory.
    NbdDir(PathBuf),
    /// ublk devices with ids from this one up, in NQN order.
    Ublk(u32),
}

/// Options passed to every `rdmablk connect`.
pub struct Common<'a> {
    pub hostnqn: Option<&'a str>,
    pub hostid: Option<&'a str>,
    pub extra: Vec<String>,
}

/// The discovery controllers of `path` (nvme-cli's discovery.conf: one per
/// line, `-t/--transport -a/--traddr -s/--trsvcid -q/--hostnqn
/// -I/--hostid`, `#` comments); `default` fills in what a line leaves out.
pub fn read_conf(path: &Path, default: &Target) -> Result<Vec<Target>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (give the discovery controller with -a, or list them there as nvme-cli does)",
            path.display()
        )
    })?;
    let mut all = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut t = default.clone();
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            let (key, inline) = match w.split_once('=') {
                Some((k, v)) => (k, Some(v.to_string())),
                None => (w, None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| words.next().map(str::to_string))
                    .ok_or_else(|| format!("{}:{}: {key} needs a value", path.display(), n + 1))
            };
            match key {
                "-t" | "--transport" => t.transport = value()?,
                "-a" | "--traddr" => t.traddr = value()?,
                "-s" | "--trsvcid" => {
                    let v = value()?;
                    t.trsvcid = v
                        .parse()
                        .map_err(|_| format!("{}:{}: port {v:?}", path.display(), n + 1))?;
                }
                "-q" | "--hostnqn" => t.hostnqn = Some(value()?),
                "-I" | "--hostid" => t.hostid = Some(value()?),
                other => {
                    tracing::warn!("{}:{}: {other} ignored", path.display(), n + 1);
                }
            }
        }
        if t.traddr.is_empty() {
            return Err(format!("{}:{}: no address (-a)", path.display(), n + 1));
        }
        all.push(t);
    }
    Ok(all)
}

/// The NVM subsystems the discovery controllers list for this host, each
/// with its paths (TRANSPORT://ADDR:PORT, in the order listed, without
/// repeats).
pub fn subsystems(controllers: &[Target]) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in controllers {
        let p = discovery_params(t)?;
        let entries = Session::discover(&p).map_err(|e| format!("{}: {e}", p.addr))?;
        for e in entries.iter().filter(|e| e.subtype == subtype::NVME) {
            let Some(transport) = Transport::from_trtype(e.trtype) else {
                continue;
            };
            let host = e.traddr.trim();
            let ip: std::net::IpAddr = match host.parse() {
                // A wildcard entry: the address the host reached.
                Ok(ip) if !std::net::IpAddr::is_unspecified(&ip) => ip,
                _ => p.addr.ip(),
            };
            let url = format!(
                "{}://{}",
                transport.name(),
                std::net::SocketAddr::new(ip, e.trsvcid.trim().parse().unwrap_or(4420))
            );
            if !found.contains_key(&e.subnqn) && found.len() == MAX_SUBSYSTEMS {
                return Err(format!(
                    "the discovery logs list more than {MAX_SUBSYSTEMS} subsystems for this host; \
                     connect-all serves at most {MAX_SUBSYSTEMS}: split them over discovery \
                     controllers (or connect them one by one)"
                ));
            }
            let paths = found.entry(e.subnqn.clone()).or_default();
            if paths.len() == MAX_PATHS {
                tracing::warn!(subsystem = %e.subnqn, "more than {MAX_PATHS} paths listed: {url} not used");
            } else if !paths.contains(&url) {
                paths.push(url);
            }
        }
    }
    Ok(found)
}

/// A file name for subsystem `nqn`'s NBD socket.
fn socket_name(nqn: &str) -> String {
    let safe: String = nqn
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.sock")
}

/// Starts one `rdmablk connect` per subsystem and waits for them all,
/// ending them on SIGINT/SIGTERM.
pub fn run(
    found: &BTreeMap<String, Vec<String>>,
    frontend: &Frontend,
    common: &Common,
) -> Result<ExitCode, String> {
    if found.is_empty() {
        return Err("the discovery log lists no NVMe subsystem for this host".into());
    }
    stop_set()
        .thread_block()
        .map_err(|e| format!("blocking signals: {e}"))?;
    let signals = StopSignals::new()?;
    let exe = std::env::current_exe().map_err(|e| format!("finding rdmablk: {e}"))?;
    let mut children: Vec<(String, Child)> = Vec::new();
    for (i, (nqn, paths)) in found.iter().enumerate() {
        let (first, rest) = paths.split_first().expect("a listed subsystem has a path");
        let (scheme, addr) = first.split_once("://").expect("a path URL");
        let addr: std::net::SocketAddr = addr.parse().expect("a path address");
        let mut c = Command::new(&exe);
        c.args(["connect", "-t", scheme, "-a", &addr.ip().to_string()])
            .args(["-s", &addr.port().to_string(), "-n", nqn]);
        for p in rest {
            c.args(["--path", p]);
        }
        match frontend {
            Frontend::NbdDir(dir) => {
                let sock = dir.join(socket_name(nqn));
                c.arg("--nbd").arg(format!("unix:{}", sock.display()));
            }
            Frontend::Ublk(base) => {
                c.args(["--ublk", "--ublk-id", &(base + i as u32).to_string()]);
            }
        }
        if let Some(q) = common.hostnqn {
            c.args(["-q", q]);
        }
        if let Some(id) = common.hostid {
            c.args(["-I", id]);
        }
        c.args(&common.extra);
        tracing::info!(subsystem = %nqn, paths = paths.len(), "connecting");
        let child = c
            .spawn()
            .map_err(|e| format!("starting rdmablk connect: {e}"))?;
        children.push((nqn.clone(), child));
    }
    let (mut failed, mut stopping) = (0, false);
    while !children.is_empty() {
        if let Some(sig) = signals.wait(Duration::from_millis(200)) {
            stopping = true;
            tracing::info!("signal {sig}: ending {} connection(s)", children.len());
            for (_, c) in &children {
                let pid = nix::unistd::Pid::from_raw(c.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            }
        }
        children.retain_mut(|(nqn, c)| match c.try_wait() {
            Ok(Some(status)) => {
                if !status.success() && !stopping {
                    tracing::error!(subsystem = %nqn, "rdmablk connect ended: {status}");
                    failed += 1;
                }
                false
            }
            Ok(None) => true,
            Err(_) => false,
        });
        if stopping {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
