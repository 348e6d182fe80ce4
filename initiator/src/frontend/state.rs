//! What `rdmablk list` reads: each running `rdmablk connect` keeps a JSON
//! file in the run directory (`RDMABLK_RUN_DIR`, default
//! /run/rdmablk/connect) naming its namespace, its front-end and its paths
//! with their controller, ANA state and whether they are live; rewritten
//! (atomically) when any of it changes, removed when the process ends.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The run directory when `RDMABLK_RUN_DIR` is not set.
const DEFAULT_RUN_DIR: &str = "/run/rdmablk/connect";

/// One running `rdmablk connect`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub pid: u32,
    pub subnqn: String,
    pub nsid: u32,
    /// The NBD URI or the ublk device.
    pub frontend: String,
    pub paths: Vec<PathReport>,
}

/// One path of a connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathReport {
    pub transport: String,
    pub address: String,
    /// The controller's id while the path is live.
    pub cntlid: Option<u16>,
    /// The ANA state the host follows.
    pub ana: String,
    pub live: bool,
    /// The TLS cipher suite when the path is encrypted (NVMe/TCP over TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<String>,
}

/// Where the state files are.
pub fn run_dir() -> PathBuf {
    std::env::var_os("RDMABLK_RUN_DIR")
        .map_or_else(|| PathBuf::from(DEFAULT_RUN_DIR), PathBuf::from)
}

/// This process's state file, removed on drop.
pub struct StateFile {
    path: PathBuf,
    last: Option<Connection>,
}

impl StateFile {
    /// The file of this process in the run directory (made if missing).
    pub fn new() -> std::io::Result<StateFile> {
        let dir = run_dir();
        std::fs::create_dir_all(&dir)?;
        Ok(StateFile {
            path: dir.join(format!("{}.json", std::process::id())),
            last: None,
        })
    }

    /// Writes `c` when it differs from what the file holds.
    pub fn update(&mut self, c: &Connection) {
        if self.last.as_ref() == Some(c) {
            return;
        }
        let tmp = self.path.with_extension("tmp");
        let text = serde_json::to_string_pretty(c).expect("a connection serializes");
        match std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.path)) {
            Ok(()) => self.last = Some(c.clone()),
            Err(e) => tracing::warn!("writing {}: {e}", self.path.display()),
        }
    }
}

impl Drop for StateFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The connections of the running processes in `dir`; files of processes
/// that are gone (killed, crashed) are removed.
pub fn list(dir: &Path) -> Vec<Connection> {
    let mut all = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return all;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(c) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<Connection>(&t).ok())
        else {
            continue;
        };
        if alive(c.pid) {
            all.push(c);
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
    all.sort_by_key(|c| c.pid);
    all
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    !matches!(
        nix::sys::signal::kill(pid, None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// The listing `rdmablk list` prints.
pub fn render(all: &[Connection]) -> String {
    let mut out = String::new();
    for c in all {
        out += &format!(
            "{} namespace {} of {} (pid {})\n",
            c.frontend, c.nsid, c.subnqn, c.pid
        );
        for p in &c.paths {
            let cntlid = p.cntlid.map_or("-".to_string(), |i| i.to_string());
            let live = if p.live { "live" } else { "connecting" };
            let tls = p
                .tls
                .as_ref()
                .map_or(String::new(), |c| format!("  tls {c}"));
            out += &format!(
                "  {:<5} {:<40} cntlid {:<6} {:<16} {live}{tls}\n",
                p.transport, p.address, cntlid, p.ana
            );
        }
    }
    out
}
