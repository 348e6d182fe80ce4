//! The daemon under test: [`Target`], a running `rdmablk-target` on a
//! loopback port with its log and sd_notify states captured.

use crate::process::{file_tail, Reaper, LOG_TAIL};
use crate::send_signal;
use crate::{bin_path, TempDir};
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a daemon may take to start listening.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a daemon may take to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A running `rdmablk-target`, killed on drop.
pub struct Target {
    child: Reaper,
    addr: SocketAddr,
    log_path: PathBuf,
    /// Bound to `$NOTIFY_SOCKET`: where the daemon's sd_notify states arrive.
    notify: UnixDatagram,
    notified: Vec<String>,
    // Last, so the daemon is gone before its directory is removed.
    dir: TempDir,
}

impl Target {
    /// Starts the daemon with `args`. Unless they contain `--listen` or
    /// `--config`, it listens on a free loopback port.
    pub fn start(args: &[&str]) -> Target {
        if let Some(i) = args.iter().position(|a| *a == "--listen") {
            let url = args.get(i + 1).expect("--listen needs a value");
            let addr = url
                .strip_prefix("tcp://")
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| {
                    panic!("the harness understands --listen tcp://IP:PORT, not {url}")
                });
            return Target::spawn(args, addr).unwrap_or_else(|e| panic!("{e}"));
        }
        if let Some(i) = args.iter().position(|a| *a == "--config") {
            let path = args.get(i + 1).expect("--config needs a value");
            let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
            let addr = first_listener(&text)
                .unwrap_or_else(|| panic!("no tcp listener address in {path}"));
            return Target::spawn(args, addr).unwrap_or_else(|e| panic!("{e}"));
        }
        Target::with_free_port(|port| {
            let listen = format!("tcp://127.0.0.1:{port}");
            let mut all = vec!["--listen", listen.as_str()];
            all.extend_from_slice(args);
            Target::spawn(&all, loopback(port))
        })
    }

    /// Starts the daemon listening on `port` with `extra_args`.
    pub fn start_on(port: u16, extra_args: &[&str]) -> Target {
        let listen = format!("tcp://127.0.0.1:{port}");
        let mut all = vec!["--listen", listen.as_str()];
        all.extend_from_slice(extra_args);
        Target::spawn(&all, loopback(port)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the daemon with a configuration file made from `toml_text`, in
    /// which `{port}` is replaced by a free loopback port. The file is kept
    /// in the daemon's temporary directory.
    pub fn start_config(toml_text: &str) -> Target {
        Target::start_config_with(toml_text, &[], None)
    }

    /// Like [`Target::start_config`], with `extra_args` after `--config FILE`
    /// (e.g. `--stats PATH`) and, when `cpus` is given (a `taskset -c` list
    /// such as `"0"`), the daemon and all its threads pinned to those CPUs.
    /// `taskset` execs the daemon, so [`Target::pid`] is the daemon's.
    pub fn start_config_with(toml_text: &str, extra_args: &[&str], cpus: Option<&str>) -> Target {
        let launcher: Vec<&str> = cpus.map_or(vec![], |c| vec!["taskset", "-c", c]);
        Target::with_free_port(|port| {
            let dir = TempDir::new("target");
            let path = dir.join("target.toml");
            fs::write(&path, toml_text.replace("{port}", &port.to_string()))
                .expect("writing the config");
            let path = path.to_str().expect("UTF-8 temp path").to_string();
            let mut args = vec!["--config", path.as_str()];
            args.extend_from_slice(extra_args);
            Target::spawn_in(dir, &args, loopback(port), &launcher)
        })
    }

    /// Starts the daemon with `--config CONFIG` through `launcher`, a
    /// command that execs the daemon's command line given after it (such as
    /// `ip netns exec NAME`), so [`Target::pid`] is the daemon's; waits
    /// until the configuration's first TCP listener accepts.
    pub fn start_launched(launcher: &[&str], config: &Path) -> Target {
        let text = fs::read_to_string(config)
            .unwrap_or_else(|e| panic!("reading {}: {e}", config.display()));
        let addr = first_listener(&text)
            .unwrap_or_else(|| panic!("no tcp listener address in {}", config.display()));
        let path = config.to_str().expect("UTF-8 config path");
        Target::spawn_in(TempDir::new("target"), &["--config", path], addr, launcher)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs `spawn` with fresh ports until one is not taken by someone else
    /// between our probe and the daemon's bind.
    fn with_free_port(mut spawn: impl FnMut(u16) -> Result<Target, String>) -> Target {
        let mut last = String::new();
        for _ in 0..3 {
            match spawn(free_port()) {
                Ok(t) => return t,
                Err(e) if e.contains("in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}")
    }

    fn spawn(args: &[&str], addr: SocketAddr) -> Result<Target, String> {
        Target::spawn_in(TempDir::new("target"), args, addr, &[])
    }

    /// Spawns the daemon (through `launcher`, such as `taskset -c CPUS`,
    /// when not empty) with its log in `dir` and waits until `addr`
    /// accepts. Err (with the log tail) if it exits first, so a lost port
    /// race can retry.
    fn spawn_in(
        dir: TempDir,
        args: &[&str],
        addr: SocketAddr,
        launcher: &[&str],
    ) -> Result<Target, String> {
        let bin = bin_path("rdmablk-target");
        let log_path = dir.join("target.log");
        let log = fs::File::create(&log_path).expect("creating the log file");
        let notify_path = dir.join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).expect("binding the notify socket");
        let mut cmd = match launcher.split_first() {
            Some((program, launcher_args)) => {
                let mut c = Command::new(program);
                c.args(launcher_args).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        cmd.env("NOTIFY_SOCKET", &notify_path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log fd"))
            .stderr(log);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "debug");
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut t = Target {
            child: Reaper::new(child),
            addr,
            log_path,
            notify,
            notified: Vec::new(),
            dir,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if !t.child.is_running() {
                let status = t.child.exit().expect("reaped");
                let msg = format!(
                    "rdmablk-target {args:?} exited ({status}) before listening on {addr}\n{}",
                    t.log_tail()
                );
                return Err(msg);
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(t);
            }
            if Instant::now() >= deadline {
                // Dropping `t` during the panic kills it and prints its log.
                panic!("rdmablk-target {args:?} not accepting on {addr} after {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The daemon's temporary directory (its log, and its config if any).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Waits up to 5 s for `text` to appear in the log; panics with the
    /// log's tail if it does not.
    pub fn wait_log(&self, text: &str) {
        crate::check::wait_until(
            Duration::from_secs(5),
            format!("the log line {text:?}\n{}", self.log_tail()),
            || self.log().contains(text),
        );
    }

    /// The end of the log, framed for a failure message.
    pub fn log_tail(&self) -> String {
        format!(
            "---- rdmablk-target log tail ({}) ----\n{}\n---- end of log ----",
            self.log_path.display(),
            file_tail(&self.log_path, LOG_TAIL)
        )
    }

    /// Waits up to `timeout` for the daemon to send the sd_notify `state`
    /// (e.g. `"STOPPING=1"`); true if it has, now or before.
    pub fn wait_notify(&mut self, state: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 4096];
        loop {
            if self.notified.iter().any(|s| s == state) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // With no time left, still take what is already queued.
            let wait = left.max(Duration::from_millis(1));
            self.notify
                .set_read_timeout(Some(wait))
                .expect("notify socket timeout");
            match self.notify.recv(&mut buf) {
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    self.notified.extend(text.lines().map(str::to_string));
                }
                Err(_) if left.is_zero() => return false,
                Err(_) => {}
            }
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.is_running()
    }

    /// Sends SIGTERM without waiting.
    pub fn terminate(&mut self) {
        if self.is_running() {
            // Our own child, not reaped yet: its pid cannot have been reused.
            send_signal(self.pid(), libc::SIGTERM);
        }
    }

    /// Waits up to `timeout` for the process to exit: its status, or None
    /// if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.child.wait_timeout(timeout)
    }

    /// Waits up to `timeout` for the process to exit; panics (with the log
    /// tail) if it does not.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        self.child.wait_timeout(timeout).unwrap_or_else(|| {
            panic!(
                "rdmablk-target (pid {}) still running {timeout:?} after SIGTERM",
                self.pid()
            )
        })
    }

    /// SIGTERM, then wait up to 10 s for the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        self.terminate();
        self.wait(STOP_TIMEOUT)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.child.kill();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The first `address = "…"` of a `[[listener]]` with tcp transport (a line
/// scan is enough for the configs tests write).
fn first_listener(toml_text: &str) -> Option<SocketAddr> {
    toml_text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "address")
            .then(|| value.trim().trim_matches('"').parse().ok())
            .flatten()
    })
}
