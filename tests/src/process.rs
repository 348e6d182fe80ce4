//! Child processes of a test: [`Proc`] (running, outputs captured to
//! files) and [`run`] (to completion, a [`Ran`]), with failure reports.

use crate::TempDir;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Bytes of log shown when a test fails.
pub(crate) const LOG_TAIL: usize = 8 << 10;

/// The last `max` bytes of a file, lossily decoded, starting at a line.
pub(crate) fn file_tail(path: &Path, max: usize) -> String {
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

/// A child process and, once it has been reaped, how it exited.
pub(crate) struct Reaper {
    child: Child,
    exit: Option<ExitStatus>,
}

impl Reaper {
    /// Watches `child`, not reaped yet.
    pub(crate) fn new(child: Child) -> Reaper {
        Reaper { child, exit: None }
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if it has been reaped.
    pub(crate) fn exit(&self) -> Option<ExitStatus> {
        self.exit
    }

    /// Whether the process is still running (reaps it if it has exited).
    pub(crate) fn is_running(&mut self) -> bool {
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

    /// Waits up to `timeout` for the process to exit: `None` if it is still
    /// running then.
    pub(crate) fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.exit
    }

    /// SIGKILL and reap.
    pub(crate) fn kill(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.exit = Some(status);
            }
        }
    }
}

/// Any child process of a test (a tool such as `qemu-io`, or `rdmablk`),
/// with stdout and stderr captured to files in its own temporary directory.
/// Killed (SIGKILL) on drop; when the test panics, it prints the tails of
/// both outputs, unless a failure message already included its
/// [`Proc::report`].
pub struct Proc {
    name: String,
    cmdline: String,
    child: Reaper,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
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
        let stdin = p.child.child.stdin.take().expect("piped stdin");
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
            child: Reaper::new(child),
            stdout_path,
            stderr_path,
            started: Instant::now(),
            reported: std::cell::Cell::new(false),
            dir,
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The name it was given for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its command line, as [`command_line`] writes it.
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
        let status = match self.child.exit() {
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
        self.child.is_running()
    }

    /// The exit status, if it has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.is_running();
        self.child.exit()
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
        self.child.wait_timeout(timeout)
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
        self.child.kill();
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
