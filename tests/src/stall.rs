//! A second path to a file whose I/O can be stalled: nbdkit's file plugin
//! (`cache=none`) with its pause filter, mounted by nbdfuse, so a gateway
//! serving the mount reaches the same bytes as one serving the file, as two
//! gateways reach one SAN LUN. Paused, the path holds the requests already
//! sent down it (a stalled SAN path, or a paused VM's storage stack);
//! resumed, it lands them, whatever the gateway that sent them does meanwhile.

use crate::process::Proc;
use crate::TempDir;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The stallable path: nbdkit and nbdfuse, unmounted and stopped on drop.
pub struct StallablePath {
    mount: PathBuf,
    control: PathBuf,
    nbdfuse: Proc,
    _nbdkit: Proc,
    _dir: TempDir,
}

impl StallablePath {
    /// A path to `file` (its size does not change).
    pub fn new(file: &Path) -> StallablePath {
        let dir = TempDir::new("stall");
        let (sock, control, mount) = (
            dir.join("nbd.sock"),
            dir.join("pause.sock"),
            dir.join("mnt"),
        );
        std::fs::create_dir(&mount).expect("making the mount point");
        let mut kit = Command::new("nbdkit");
        kit.args(["--foreground", "--exit-with-parent", "-U"])
            .arg(&sock)
            .arg("--filter=pause")
            // One request at a time: nbdkit's file plugin reads and writes
            // through the page cache, where a read beside a write of the
            // same block could see half of it.
            .arg("--filter=noparallel")
            .arg("file")
            .arg(file)
            .arg("cache=none")
            .arg("serialize=requests")
            .arg(format!("pause-control={}", control.display()));
        let nbdkit = Proc::spawn("nbdkit", &mut kit);
        wait_for(&sock, "nbdkit's socket");
        let mut fuse = Command::new("nbdfuse");
        fuse.arg(&mount).arg("--unix").arg(&sock);
        let nbdfuse = Proc::spawn("nbdfuse", &mut fuse);
        wait_for(&mount.join("nbd"), "nbdfuse's file");
        StallablePath {
            mount,
            control,
            nbdfuse,
            _nbdkit: nbdkit,
            _dir: dir,
        }
    }

    /// The file through this path.
    pub fn file(&self) -> PathBuf {
        self.mount.join("nbd")
    }

    fn control(&self, command: u8) {
        let mut c =
            UnixStream::connect(&self.control).expect("connecting to nbdkit's pause control");
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a timeout");
        c.write_all(&[command]).expect("a pause command");
        let mut answer = [0u8];
        c.read_exact(&mut answer).expect("nbdkit's answer");
        assert_eq!(
            answer[0],
            command.to_ascii_uppercase(),
            "nbdkit's pause filter answered"
        );
    }

    /// Stalls the path: requests sent from now on wait.
    pub fn stall(&self) {
        self.control(b'p');
    }

    /// Lets it go on: the waiting requests land.
    pub fn resume(&self) {
        self.control(b'r');
    }
}

fn wait_for(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "no {what} at {} after 10 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for StallablePath {
    fn drop(&mut self) {
        // Requests still waiting must not hang the unmount.
        let _ = UnixStream::connect(&self.control).and_then(|mut c| c.write_all(b"r"));
        let unmounted = Command::new("umount").arg(&self.mount).status();
        if !unmounted.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
        self.nbdfuse.kill();
    }
}
