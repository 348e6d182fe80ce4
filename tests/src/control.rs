//! [`ControlledTarget`]: the daemon started from a configuration file with
//! a control socket, for tests that reconfigure it while it runs (`reload`,
//! `ana set`, `status`).

use crate::check::OrPanic;
use crate::{bin_path, Target, TempDir};
use std::path::PathBuf;
use std::process::Command;

/// A daemon started from a configuration file, with a control socket.
pub struct ControlledTarget {
    /// The daemon.
    pub t: Target,
    sock: PathBuf,
    _dir: TempDir,
}

impl ControlledTarget {
    /// Starts the daemon with `toml` (see [`Target::start_config`]) and a
    /// control socket.
    pub fn start(toml: &str) -> ControlledTarget {
        ControlledTarget::start_on(toml, None)
    }

    /// Like [`ControlledTarget::start`], pinned to `cpus` (a `taskset -c` list) when given.
    pub fn start_on(toml: &str, cpus: Option<&str>) -> ControlledTarget {
        let dir = TempDir::new("reload");
        let sock = dir.join("control.sock");
        let t =
            Target::start_config_with(toml, &["--control", sock.to_str().expect("utf-8")], cpus);
        ControlledTarget { t, sock, _dir: dir }
    }

    /// Rewrites the configuration file (`{port}` as at the start).
    pub fn write(&self, toml: &str) {
        let text = toml.replace("{port}", &self.t.port().to_string());
        std::fs::write(self.t.dir().join("target.toml"), text).or_panic("writing the config");
    }

    /// Runs `rdmablk-target ACTION --control SOCK` (ACTION: words, as
    /// `["ana", "set", "1", "optimized"]`): (success, stdout, stderr).
    pub fn run(&self, action: &[&str]) -> (bool, String, String) {
        let out = Command::new(bin_path("rdmablk-target"))
            .args(action)
            .arg("--control")
            .arg(&self.sock)
            .output()
            .or_panic(format_args!("running rdmablk-target {action:?}"));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Writes `toml` and reloads it, which must succeed; returns its report.
    pub fn reload(&self, toml: &str) -> String {
        self.write(toml);
        let (ok, out, err) = self.run(&["reload"]);
        assert!(ok, "reload refused: {err}\n{out}\n{}", self.t.log_tail());
        out
    }
}
