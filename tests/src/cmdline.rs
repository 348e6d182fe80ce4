//! Command lines of the host, `rdmablk`, against a target on loopback.

use crate::bin_path;
use std::process::Command;

/// `-t tcp -a 127.0.0.1 -s PORT`, then `-n NQN` when `nqn` is given: the
/// arguments that point `rdmablk` at a target listening on loopback `port`.
pub fn tcp_target_args(port: u16, nqn: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = ["-t", "tcp", "-a", "127.0.0.1", "-s"]
        .into_iter()
        .map(String::from)
        .collect();
    args.push(port.to_string());
    if let Some(nqn) = nqn {
        args.extend(["-n".to_string(), nqn.to_string()]);
    }
    args
}

/// `rdmablk SUBCOMMAND -t tcp -a 127.0.0.1 -s PORT -n NQN`, for the caller
/// to add to.
pub fn rdmablk_command(subcommand: &str, port: u16, nqn: &str) -> Command {
    let mut c = Command::new(bin_path("rdmablk"));
    c.arg(subcommand).args(tcp_target_args(port, Some(nqn)));
    c
}
