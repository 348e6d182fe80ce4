//! QoS limits: a namespace's `qos` table and its `host_qos` tables, as
//! read from the file and as `rdmablk-target qos set` gives them.

use super::error::{invalid, ConfigError};
use super::model::{HostQos, QosKey, QosLimits};
use super::raw::{size_value, RawQos};
use rdmablk_common::units;

/// Smallest bandwidth limit: one 4 KiB block per second.
const MIN_BANDWIDTH: u64 = 4096;

/// The limits of a `qos` table at `key`, which names no host.
pub(super) fn convert(key: &str, raw: RawQos) -> Result<QosLimits, ConfigError> {
    if raw.nqn.is_some() {
        return Err(invalid(
            format!("{key}.nqn"),
            "the namespace's qos applies to all its hosts together; give one host's \
             limits in a [[subsystem.namespace.host_qos]] table with nqn = \"...\"",
        ));
    }
    limits(key, raw)
}

/// A `[[subsystem.namespace.host_qos]]` table at `key`.
pub(super) fn convert_host(key: &str, mut raw: RawQos) -> Result<HostQos, ConfigError> {
    let nqn = raw.nqn.take().ok_or_else(|| {
        invalid(
            format!("{key}.nqn"),
            "missing; the NQN of the host these limits apply to",
        )
    })?;
    let limits = limits(key, raw)?;
    if limits.is_empty() {
        return Err(invalid(
            key.to_string(),
            format!(
                "no limit given for {nqn}; set at least one of {}",
                key_names()
            ),
        ));
    }
    Ok(HostQos { nqn, limits })
}

fn limits(key: &str, raw: RawQos) -> Result<QosLimits, ConfigError> {
    let mut out = QosLimits::default();
    let iops = [
        (QosKey::Iops, raw.iops),
        (QosKey::ReadIops, raw.read_iops),
        (QosKey::WriteIops, raw.write_iops),
    ];
    for (k, v) in iops {
        if let Some(n) = v {
            let v = u64::try_from(n)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| invalid(format!("{key}.{}", k.name()), iops_problem(n)))?;
            out.set(k, Some(v));
        }
    }
    let bandwidths = [
        (QosKey::Bandwidth, raw.bandwidth),
        (QosKey::ReadBandwidth, raw.read_bandwidth),
        (QosKey::WriteBandwidth, raw.write_bandwidth),
    ];
    for (k, v) in bandwidths {
        if let Some(raw) = v {
            let k_key = format!("{key}.{}", k.name());
            let v = size_value(&k_key, &raw)?;
            if v < MIN_BANDWIDTH {
                return Err(invalid(k_key, bandwidth_problem(v)));
            }
            out.set(k, Some(v));
        }
    }
    Ok(out)
}

fn iops_problem(n: impl std::fmt::Display) -> String {
    format!("{n} is not a positive number of commands per second; remove the key for no limit")
}

fn bandwidth_problem(v: u64) -> String {
    format!(
        "{v} bytes per second is below the smallest limit, 4KiB; \
         give e.g. \"50MiB\" (per second), or remove the key for no limit"
    )
}

/// Whether a bandwidth limit of `limits` holds a 1 MiB command (the
/// largest transfer) over a second.
pub(super) fn slow(limits: &QosLimits) -> bool {
    limits.iter().any(|(k, v)| k.is_bandwidth() && v < 1 << 20)
}

/// The limit names, for messages.
pub fn key_names() -> String {
    QosKey::ALL.map(QosKey::name).join(", ")
}

/// Applies one `KEY=VALUE` of `rdmablk-target qos set` to `limits`: a
/// count for the IOPS keys, a size (per second) for the bandwidths, or
/// `none` to remove the limit.
pub fn apply_setting(limits: &mut QosLimits, setting: &str) -> Result<(), String> {
    let (name, value) = setting
        .split_once('=')
        .ok_or_else(|| format!("{setting:?}: give KEY=VALUE, e.g. read_iops=2000"))?;
    let key = QosKey::from_name(name)
        .ok_or_else(|| format!("{name:?} is not a QoS limit; use {}", key_names()))?;
    if value == "none" {
        limits.set(key, None);
        return Ok(());
    }
    let v = if key.is_bandwidth() {
        let v = units::parse_size(value).map_err(|e| format!("{name}: {e}"))?;
        if v < MIN_BANDWIDTH {
            return Err(format!("{name}: {}", bandwidth_problem(v)));
        }
        v
    } else {
        value
            .parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{name}: {}", iops_problem(value)))?
    };
    limits.set(key, Some(v));
    Ok(())
}
