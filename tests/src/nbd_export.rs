//! The host's NBD front-end as a process: [`NbdExport`].

use crate::cmdline::rdmablk_command;
use crate::{Proc, TempDir, START_TIMEOUT};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running `rdmablk connect ... --nbd LISTEN`: an NBD export of a
/// namespace. Its stdout and stderr are captured; `RUST_LOG` defaults to
/// `debug`. Killed on drop; a panicking test shows its output tails.
pub struct NbdExport {
    proc: Proc,
    socket: Option<PathBuf>,
    uri: String,
}

impl NbdExport {
    /// `rdmablk connect -t tcp -a 127.0.0.1 -s PORT -n NQN --nbd unix:SOCKET
    /// EXTRA...` with the socket in the export's temporary directory; waits
    /// for its `ready:` line. Panics (with its output) if it does not get there.
    pub fn start(port: u16, nqn: &str, extra: &[&str]) -> NbdExport {
        NbdExport::try_start(port, nqn, None, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`NbdExport::start`], with `rdmablk list`'s state in `run_dir`
    /// (`RDMABLK_RUN_DIR`).
    pub fn start_in(port: u16, nqn: &str, extra: &[&str], run_dir: &Path) -> NbdExport {
        NbdExport::spawn(port, nqn, None, extra, Some(run_dir)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`NbdExport::start`], with `--nbd listen` (e.g. `tcp:127.0.0.1:PORT`)
    /// when given, else a unix socket in the export's temporary directory.
    /// Err (with its output) if the process exits before printing `ready:`.
    pub fn try_start(
        port: u16,
        nqn: &str,
        listen: Option<&str>,
        extra: &[&str],
    ) -> Result<NbdExport, String> {
        NbdExport::spawn(port, nqn, listen, extra, None)
    }

    fn spawn(
        port: u16,
        nqn: &str,
        listen: Option<&str>,
        extra: &[&str],
        run_dir: Option<&Path>,
    ) -> Result<NbdExport, String> {
        let mut cmd = rdmablk_command("connect", port, nqn);
        cmd.args(extra);
        NbdExport::spawn_command(cmd, listen, run_dir)
    }

    /// `connect`, a prepared `rdmablk connect ...` command line (run
    /// through `ip netns exec`, say), with `--nbd unix:SOCKET` added; waits
    /// for its `ready:` line. Panics (with its output) if it does not get there.
    pub fn start_command(connect: Command) -> NbdExport {
        NbdExport::spawn_command(connect, None, None).unwrap_or_else(|e| panic!("{e}"))
    }

    fn spawn_command(
        mut cmd: Command,
        listen: Option<&str>,
        run_dir: Option<&Path>,
    ) -> Result<NbdExport, String> {
        let dir = TempDir::new("nbd");
        let (listen, socket) = match listen {
            Some(l) => (l.to_string(), None),
            None => {
                let s = dir.join("nbd.sock");
                (format!("unix:{}", s.display()), Some(s))
            }
        };
        cmd.args(["--nbd", &listen]);
        if let Some(d) = run_dir {
            cmd.env("RDMABLK_RUN_DIR", d);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "debug");
        }
        let mut proc = Proc::spawn_in(dir, "rdmablk connect", &mut cmd, Stdio::null());
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // Check the output before the exit status: a line printed just
            // before exiting still counts.
            let out = proc.stdout();
            let complete = out.rfind('\n').map_or("", |i| &out[..i]);
            if let Some(uri) = complete.lines().find_map(|l| l.strip_prefix("ready: ")) {
                let uri = uri.to_string();
                return Ok(NbdExport { proc, socket, uri });
            }
            if !proc.is_running() {
                return Err(format!(
                    "rdmablk connect exited before printing `ready:`\n{}",
                    proc.report()
                ));
            }
            if Instant::now() >= deadline {
                proc.kill();
                return Err(format!(
                    "rdmablk connect printed no `ready:` line within {START_TIMEOUT:?}\n{}",
                    proc.report()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The NBD URI from the `ready:` line.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The unix socket path, when it listens on one.
    pub fn socket(&self) -> &Path {
        self.socket
            .as_deref()
            .expect("this export listens on TCP, not on a unix socket")
    }

    /// The URI of export `name` on the unix socket (`name` percent-encoded
    /// where URIs need it).
    pub fn uri_for_export(&self, name: &str) -> String {
        let mut enc = String::new();
        for b in name.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                enc.push(b as char);
            } else {
                enc.push_str(&format!("%{b:02X}"));
            }
        }
        format!("nbd+unix:///{enc}?socket={}", self.socket().display())
    }

    /// The `rdmablk connect` process.
    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        self.proc.is_running()
    }

    /// The command line, exit status and output tails, for failure messages.
    pub fn report(&self) -> String {
        self.proc.report()
    }
}
