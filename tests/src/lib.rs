//! End-to-end test harness: finds the built binaries, runs `rdmablk-target`
//! on a free loopback port with its log captured, and speaks NVMe/TCP to it
//! through [`client`].
//!
//! When a test panics, every [`Target`] it holds prints the tail of its log
//! and keeps its temporary directory for inspection.
//!
//! Environment: `RDMABLK_BIN_DIR` (where the binaries are; default
//! `build/release`, then `build/debug`, which must be newer than their
//! sources), `RUST_LOG` (passed to the daemon; default `debug`),
//! `RDMABLK_KEEP_TEMP` (keep temporary directories even when tests pass),
//! `TMPDIR` (where they go; file namespaces use O_DIRECT, so it must not be
//! a tmpfs that lacks it).

pub mod args;
mod bins;
pub mod check;
pub mod client;
pub mod dhchap;
pub mod nbd;
pub mod proxy;
pub mod tools;

pub use bins::{bin_path, workspace_root};

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a daemon may take to start listening, and to exit after SIGTERM.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of log shown when a test fails.
const LOG_TAIL: usize = 8 << 10;

/// A temporary directory, removed on drop unless the thread is panicking
/// or `RDMABLK_KEEP_TEMP` is set (then it is kept and its path printed).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("rdmablk-tests-{label}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for inspection: {}", self.path.display());
        } else if std::env::var_os("RDMABLK_KEEP_TEMP").is_some() {
            eprintln!("kept (RDMABLK_KEEP_TEMP): {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// Number of open file descriptors of process `pid`.
pub fn fd_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/fd: {e}"))
        .count()
}

/// CPU time (user and system, all threads) process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/stat: {e}"));
    // After the command's closing parenthesis: utime and stime are the 12th
    // and 13th fields, in clock ticks.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let ticks: u64 = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|x| x.parse::<u64>().expect("a tick count"))
        .sum();
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// Resident set size (VmRSS) of process `pid`, in KiB.
pub fn vm_rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// The last `max` bytes of a file, lossily decoded, starting at a line.
fn file_tail(path: &Path, max: usize) -> String {
    let Ok(mut f) = fs::File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max as u64);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start))
        .and_then(|_| f.read_to_end(&mut buf))
        .is_err()
    {
        return format!("(cannot read {})", path.display());
    }
    let text = String::from_utf8_lossy(&buf);
    let text = if start > 0 {
        text.split_once('\n').map_or(&*text, |(_, rest)| rest)
    } else {
        &text
    };
    if text.trim().is_empty() {
        "(log is empty)".into()
    } else {
        text.to_string()
    }
}

/// A running `rdmablk-target`, killed on drop.
pub struct Target {
    child: Child,
    addr: SocketAddr,
    log_path: PathBuf,
    /// Bound to `$NOTIFY_SOCKET`: where the daemon's sd_notify states arrive.
    notify: UnixDatagram,
    notified: Vec<String>,
    exit: Option<ExitStatus>,
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
        Target::with_free_port(|port| {
            let dir = TempDir::new("target");
            let path = dir.join("target.toml");
            fs::write(&path, toml_text.replace("{port}", &port.to_string()))
                .expect("writing the config");
            let path = path.to_str().expect("UTF-8 temp path").to_string();
            let mut args = vec!["--config", path.as_str()];
            args.extend_from_slice(extra_args);
            Target::spawn_in(dir, &args, loopback(port), cpus)
        })
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
        Target::spawn_in(TempDir::new("target"), args, addr, None)
    }

    /// Spawns the daemon (through `taskset -c CPUS` when `cpus` is given)
    /// with its log in `dir` and waits until `addr` accepts. Err (with the
    /// log tail) if it exits first, so a lost port race can retry.
    fn spawn_in(
        dir: TempDir,
        args: &[&str],
        addr: SocketAddr,
        cpus: Option<&str>,
    ) -> Result<Target, String> {
        let bin = bin_path("rdmablk-target");
        let log_path = dir.join("target.log");
        let log = fs::File::create(&log_path).expect("creating the log file");
        let notify_path = dir.join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).expect("binding the notify socket");
        let mut cmd = match cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cpus]).arg(&bin);
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
            child,
            addr,
            log_path,
            notify,
            notified: Vec::new(),
            exit: None,
            dir,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = t.child.try_wait().expect("try_wait") {
                t.exit = Some(status);
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

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The daemon's temporary directory (its log, and its config if any).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
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
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait().expect("try_wait") {
            Some(status) => {
                self.exit = Some(status);
                false
            }
            None => true,
        }
    }

    /// Sends SIGTERM without waiting.
    pub fn terminate(&mut self) {
        if !self.is_running() {
            return;
        }
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) takes plain integers and touches no memory of ours;
        // the pid is our own child, not yet reaped, so it cannot be reused.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM): {}", std::io::Error::last_os_error());
    }

    /// Waits up to `timeout` for the process to exit; panics (with the log
    /// tail) if it does not.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                panic!(
                    "rdmablk-target (pid {}) still running {timeout:?} after SIGTERM",
                    self.pid()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.exit.expect("exited")
    }

    /// SIGTERM, then wait up to 10 s for the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        self.terminate();
        self.wait(STOP_TIMEOUT)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.exit = Some(status);
            }
        }
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

/// A deterministic xorshift generator for test data and random LBAs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }
}

/// Sends signal `sig` (e.g. `libc::SIGTERM`) to process `pid`.
///
/// Callers must only name a child they have not reaped yet, so the pid cannot
/// have been reused.
pub fn send_signal(pid: u32, sig: i32) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// A command line for messages: the program and its arguments, space separated.
pub fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Any child process of a test (a tool such as `qemu-io`, or `rdmablk`),
/// with stdout and stderr captured to files in its own temporary directory.
/// Killed (SIGKILL) on drop; when the test panics, it prints the tails of
/// both outputs, unless a failure message already included its
/// [`Proc::report`].
pub struct Proc {
    name: String,
    cmdline: String,
    child: Child,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    exit: Option<ExitStatus>,
    started: Instant,
    /// A report went into a message: the drop need not print it again.
    reported: std::cell::Cell<bool>,
    // Last, so the process is gone before its directory is removed.
    dir: TempDir,
}

impl Proc {
    /// Spawns `cmd` with stdin from /dev/null.
    pub fn spawn(name: &str, cmd: &mut Command) -> Proc {
        Proc::spawn_in(TempDir::new(name), name, cmd, Stdio::null())
    }

    /// Spawns `cmd` with a pipe on its stdin, returned beside it.
    pub fn spawn_with_stdin(name: &str, cmd: &mut Command) -> (Proc, std::process::ChildStdin) {
        let mut p = Proc::spawn_in(TempDir::new(name), name, cmd, Stdio::piped());
        let stdin = p.child.stdin.take().expect("piped stdin");
        (p, stdin)
    }

    /// Spawns `cmd` with its outputs (and whatever else the caller puts
    /// there) in `dir`.
    pub fn spawn_in(dir: TempDir, name: &str, cmd: &mut Command, stdin: Stdio) -> Proc {
        let stdout_path = dir.join("stdout");
        let stderr_path = dir.join("stderr");
        let out = fs::File::create(&stdout_path).expect("creating the stdout file");
        let err = fs::File::create(&stderr_path).expect("creating the stderr file");
        let cmdline = command_line(cmd);
        let child = cmd
            .stdin(stdin)
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({cmdline}): {e}"));
        Proc {
            name: name.to_string(),
            cmdline,
            child,
            stdout_path,
            stderr_path,
            exit: None,
            started: Instant::now(),
            reported: std::cell::Cell::new(false),
            dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// The process's temporary directory (its captured outputs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything it printed on stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.stdout_path).unwrap_or_default()).into_owned()
    }

    /// Everything it printed on stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.stderr_path).unwrap_or_default()).into_owned()
    }

    /// The command line, exit status and the ends of both outputs, framed
    /// for a failure message.
    pub fn report(&self) -> String {
        self.reported.set(true);
        let status = match self.exit {
            Some(s) => s.to_string(),
            None => "still running".to_string(),
        };
        format!(
            "---- {} ({}): {status} after {:.1?} ----\n$ {}\n---- stdout tail ----\n{}\n---- stderr tail ----\n{}\n---- end of {} ----",
            self.name,
            self.pid(),
            self.started.elapsed(),
            self.cmdline,
            file_tail(&self.stdout_path, LOG_TAIL),
            file_tail(&self.stderr_path, LOG_TAIL),
            self.name
        )
    }

    /// Whether the process is still running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait().expect("try_wait") {
            Some(status) => {
                self.exit = Some(status);
                false
            }
            None => true,
        }
    }

    /// The exit status, if it has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.is_running();
        self.exit
    }

    /// Sends `sig` if the process is still running.
    pub fn signal(&mut self, sig: i32) {
        if self.is_running() {
            send_signal(self.pid(), sig);
        }
    }

    /// Waits up to `timeout` for the process to exit: `None` if it is still
    /// running then.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.exit
    }

    /// Waits up to `timeout` for the exit status; panics with the report
    /// (after a SIGKILL) if the process is still running then.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        match self.wait_timeout(timeout) {
            Some(s) => s,
            None => {
                self.kill();
                panic!(
                    "{} still running after {timeout:?}; killed it\n{}",
                    self.name,
                    self.report()
                );
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.exit = Some(status);
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() && !self.reported.get() {
            eprintln!("{}", self.report());
        }
    }
}

/// A finished command: what [`run`] returns.
pub struct Ran {
    pub name: String,
    pub cmdline: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Ran {
    /// The command line, exit status and both outputs (their ends), framed
    /// for a failure message.
    pub fn report(&self) -> String {
        let tail = |s: &str| {
            let start = s.len().saturating_sub(LOG_TAIL);
            let start = (start..=s.len())
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(s.len());
            if s.trim().is_empty() {
                "(empty)".to_string()
            } else {
                s[start..].to_string()
            }
        };
        format!(
            "---- {}: {} after {:.1?} ----\n$ {}\n---- stdout ----\n{}\n---- stderr ----\n{}\n---- end of {} ----",
            self.name,
            self.status,
            self.elapsed,
            self.cmdline,
            tail(&self.stdout),
            tail(&self.stderr),
            self.name
        )
    }

    /// Panics with the report unless the command exited 0.
    pub fn assert_success(&self, what: &str) -> &Ran {
        assert!(
            self.status.success(),
            "{what}: {} failed\n{}",
            self.name,
            self.report()
        );
        self
    }
}

/// Runs `cmd` to completion (stdin from /dev/null), capturing its outputs;
/// panics with what it printed if it runs longer than `timeout`.
pub fn run(name: &str, cmd: &mut Command, timeout: Duration) -> Ran {
    let mut p = Proc::spawn(name, cmd);
    let status = p.wait(timeout);
    Ran {
        name: p.name.clone(),
        cmdline: p.cmdline.clone(),
        status,
        stdout: p.stdout(),
        stderr: p.stderr(),
        elapsed: p.started.elapsed(),
    }
}

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
        let dir = TempDir::new("nbd");
        let (listen, socket) = match listen {
            Some(l) => (l.to_string(), None),
            None => {
                let s = dir.join("nbd.sock");
                (format!("unix:{}", s.display()), Some(s))
            }
        };
        let mut cmd = rdmablk_command("connect", port, nqn);
        cmd.args(["--nbd", &listen]).args(extra);
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

    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.is_running()
    }

    /// The command line, exit status and output tails, for failure messages.
    pub fn report(&self) -> String {
        self.proc.report()
    }
}

/// Subsystem and host NQNs the end-to-end tests share.
pub mod names {
    pub const DEFAULT_NQN: &str = "nqn.2026-11.io.rdmablk:default";
    pub const OPEN_NQN: &str = "nqn.2026-11.io.rdmablk:open";
    pub const PRIVATE_NQN: &str = "nqn.2026-11.io.rdmablk:private";
    pub const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:6c3e2f0a-2b1d-4c5e-9f8a-1a2b3c4d5e6f";
    pub const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0f9e8d7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f";
}

/// A configuration (for [`Target::start_config`]): the tables in `top`
/// (such as `[pollers]` or `[limits]`), a loopback listener, and subsystem
/// `nqn`, which any host may use, with one namespace whose keys are
/// `namespace` (e.g. `backend = "memory"` and `size = "64MiB"`).
pub fn open_subsystem_config(top: &str, nqn: &str, namespace: &str) -> String {
    format!(
        r#"
{top}

[[listener]]
transport = "tcp"
address = "127.0.0.1:{{port}}"

[[subsystem]]
nqn = "{nqn}"
allow_any_host = true

  [[subsystem.namespace]]
{namespace}
"#
    )
}

/// A configuration (for [`Target::start_config`]) with two subsystems: one
/// any host may use, one only [`names::HOST_A`] may use.
pub fn two_subsystems_config() -> String {
    use names::*;
    format!(
        r#"
[[listener]]
transport = "tcp"
address = "127.0.0.1:{{port}}"

[[subsystem]]
nqn = "{OPEN_NQN}"
allow_any_host = true

  [[subsystem.namespace]]
  backend = "memory"
  size = "64MiB"

[[subsystem]]
nqn = "{PRIVATE_NQN}"
allow_any_host = false
hosts = ["{HOST_A}"]

  [[subsystem.namespace]]
  backend = "memory"
  size = "16MiB"
"#
    )
}

/// `rdmablk SUBCOMMAND -t tcp -a 127.0.0.1 -s PORT -n NQN`, for the caller
/// to add to.
pub fn rdmablk_command(subcommand: &str, port: u16, nqn: &str) -> Command {
    let mut c = Command::new(bin_path("rdmablk"));
    c.args([
        subcommand,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port.to_string(),
        "-n",
        nqn,
    ]);
    c
}
