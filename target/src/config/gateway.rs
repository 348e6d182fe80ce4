//! `[gateway_group]`: gateways in front of one Ceph cluster that share the
//! ANA groups of their namespaces. Each ANA group is owned by the gateway
//! holding its lease (a RADOS object lock); the others report it
//! inaccessible.

use super::error::{invalid, ConfigError};
use super::model::{GatewayGroup, MAX_ANA_GROUP};
use super::raw::{duration_value, RawGatewayGroup};
use super::rbd::{DEFAULT_CEPH_CONF, DEFAULT_CLIENT_ID};
use std::collections::BTreeMap;
use std::time::Duration;

/// The lease when none is given: a dead owner's groups move within about
/// this long.
const DEFAULT_LEASE: Duration = Duration::from_secs(3);
/// How long a returning preferred owner waits before taking its groups back.
const DEFAULT_FAILBACK_DELAY: Duration = Duration::from_secs(10);
/// Shortest lease: renewals go every third of it, through a cluster that
/// answers in tens of milliseconds at best.
const MIN_LEASE: Duration = Duration::from_secs(1);

/// A name of the group or of a gateway: what object names can carry.
fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 64 {
        return Some("must be 1 to 64 characters");
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    (!ok).then_some("may hold only letters, digits, '-', '_' and '.'")
}

pub(super) fn convert(raw: RawGatewayGroup) -> Result<GatewayGroup, ConfigError> {
    let key = "gateway_group";
    let name_of = |k: &str, v: Option<String>, example: &str| {
        let v = v.ok_or_else(|| {
            invalid(
                format!("{key}.{k}"),
                format!("missing; e.g. {k} = \"{example}\""),
            )
        })?;
        match name_problem(&v) {
            Some(p) => Err(invalid(format!("{key}.{k}"), format!("{v:?} {p}"))),
            None => Ok(v),
        }
    };
    let name = name_of("name", raw.name, "rack-1")?;
    let gateway = name_of("gateway", raw.gateway, "gw-a")?;
    let lease = match &raw.lease {
        Some(d) => duration_value(&format!("{key}.lease"), d)?,
        None => DEFAULT_LEASE,
    };
    if lease < MIN_LEASE {
        return Err(invalid(
            format!("{key}.lease"),
            format!("{lease:?} is below the shortest lease, 1s"),
        ));
    }
    let failback_delay = match &raw.failback_delay {
        Some(d) => duration_value(&format!("{key}.failback_delay"), d)?,
        None => DEFAULT_FAILBACK_DELAY,
    };
    let mut preferred = BTreeMap::new();
    for (g, gw) in raw.preferred {
        let k = format!("{key}.preferred.{g}");
        let group = g
            .parse::<u32>()
            .ok()
            .filter(|g| (1..=MAX_ANA_GROUP).contains(g))
            .ok_or_else(|| {
                invalid(
                    &k,
                    format!("ANA group {g} is out of range; use 1 to {MAX_ANA_GROUP}"),
                )
            })?;
        if let Some(p) = name_problem(&gw) {
            return Err(invalid(k, format!("gateway {gw:?} {p}")));
        }
        preferred.insert(group, gw);
    }
    Ok(GatewayGroup {
        name,
        gateway,
        pool: raw.pool.unwrap_or_else(|| "rbd".into()),
        ceph_conf: raw.ceph_conf.unwrap_or_else(|| DEFAULT_CEPH_CONF.into()),
        client_id: raw.client_id.unwrap_or_else(|| DEFAULT_CLIENT_ID.into()),
        keyring: raw.keyring,
        lease,
        failback_delay,
        preferred,
    })
}
