//! `rdmablk-target qos set`: changes a namespace's QoS limits (all its hosts
//! together, or one host's) on the running daemon without rewriting the
//! configuration file. They hold until the next reload or restart, which
//! apply the file. Commands held under the limits replaced go at once; the
//! new limits apply from the next command.

use crate::app::reload::Running;
use crate::config::{qos_setting, validate_nqn};

/// The request line's words after `qos set`: `SUBSYSTEM NSID HOST|- KEY=VALUE...`.
/// Returns what changed, one line, or why nothing did.
pub fn set(running: &Running, args: &str) -> Result<Vec<String>, String> {
    let words: Vec<&str> = args.split_whitespace().collect();
    let [nqn, nsid, host, settings @ ..] = &words[..] else {
        return Err("usage: qos set SUBSYSTEM NSID HOST|- KEY=VALUE...".into());
    };
    if settings.is_empty() {
        return Err(
            "no limit given; e.g. read_iops=2000 write_bandwidth=50MiB (none removes one)".into(),
        );
    }
    let sub = running
        .registry
        .find(nqn)
        .filter(|s| !s.is_discovery())
        .ok_or_else(|| format!("no subsystem {nqn}"))?;
    let ns = nsid
        .parse::<u32>()
        .ok()
        .and_then(|id| sub.namespace(id))
        .ok_or_else(|| format!("subsystem {nqn} has no namespace {nsid:?}"))?;
    let host = (*host != "-").then_some(*host);
    if let Some(h) = host {
        validate_nqn(h).map_err(|e| format!("{h:?} is not a valid host NQN: {e}"))?;
        if !sub.admits(h) || !ns.tenancy.visible_to(h) {
            return Err(format!(
                "host {h} does not see namespace {} of {nqn}; its limits would never apply",
                ns.nsid
            ));
        }
    }
    let (shared, hosts) = ns.tenancy.limits();
    let mut limits = match host {
        None => shared,
        Some(h) => hosts
            .into_iter()
            .find(|(n, _)| n == h)
            .map(|(_, l)| l)
            .unwrap_or_default(),
    };
    for s in settings {
        qos_setting(&mut limits, s)?;
    }
    let whom = host.map_or("all hosts".to_string(), |h| format!("host {h}"));
    let line = format!("{nqn}: namespace {} qos for {whom}: {limits}", ns.nsid);
    if !ns.tenancy.set_limits(host, limits) {
        return Ok(vec![format!("{line} (unchanged)")]);
    }
    sub.refresh_views();
    tracing::info!("qos set: {line}");
    Ok(vec![line])
}
