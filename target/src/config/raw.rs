//! The raw TOML tables: loosely typed, unknown keys rejected, each value as
//! written; and the values of its sizes and durations.

use super::error::{invalid, ConfigError};
use rdmablk_common::units;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) pollers: Option<RawPollers>,
    pub(super) limits: Option<RawLimits>,
    pub(super) metrics: Option<RawMetrics>,
    pub(super) reservations: Option<RawReservations>,
    pub(super) gateway_group: Option<RawGatewayGroup>,
    #[serde(default)]
    pub(super) listener: Vec<RawListener>,
    #[serde(default)]
    pub(super) subsystem: Vec<RawSubsystem>,
}

/// `[pollers]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPollers {
    pub(super) count: Option<i64>,
    pub(super) arena: Option<RawSize>,
    pub(super) busy_poll: Option<bool>,
    pub(super) spin_min: Option<RawDuration>,
    pub(super) spin_max: Option<RawDuration>,
}

/// `[limits]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) connections: Option<i64>,
    pub(super) pending_connections: Option<i64>,
    pub(super) associations_per_host: Option<i64>,
    pub(super) tls_handshakes: Option<i64>,
    pub(super) queue_buffer: Option<RawSize>,
    pub(super) association_buffer: Option<RawSize>,
    pub(super) discovery_buffer: Option<RawSize>,
    pub(super) handshake_timeout: Option<RawDuration>,
    pub(super) enable_timeout: Option<RawDuration>,
    pub(super) data_timeout: Option<RawDuration>,
    pub(super) send_timeout: Option<RawDuration>,
    pub(super) discovery_keep_alive: Option<RawDuration>,
}

/// `[metrics]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) listen: Option<String>,
}

/// `[reservations]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReservations {
    pub(super) state_directory: Option<PathBuf>,
}

/// One `[[listener]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub(super) transport: Option<String>,
    pub(super) address: Option<String>,
    /// ANA group id (a TOML key is a string) to state name.
    #[serde(default)]
    pub(super) ana_groups: BTreeMap<String, String>,
    /// "required" or "optional".
    pub(super) tls: Option<String>,
}

/// One `[[subsystem]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSubsystem {
    pub(super) nqn: Option<String>,
    #[serde(default)]
    pub(super) allow_any_host: bool,
    #[serde(default)]
    pub(super) hosts: Vec<String>,
    #[serde(default)]
    pub(super) host: Vec<RawHost>,
    #[serde(default)]
    pub(super) namespace: Vec<RawNamespace>,
    pub(super) cntlid_min: Option<i64>,
    pub(super) cntlid_max: Option<i64>,
}

/// One `[[subsystem.host]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    pub(super) nqn: Option<String>,
    pub(super) dhchap_secret: Option<String>,
    pub(super) dhchap_secret_file: Option<PathBuf>,
    pub(super) dhchap_ctrl_secret: Option<String>,
    pub(super) dhchap_ctrl_secret_file: Option<PathBuf>,
    pub(super) dhchap_hash: Option<Vec<String>>,
    pub(super) dhchap_dhgroup: Option<Vec<String>>,
    pub(super) tls_key: Option<String>,
    pub(super) tls_key_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) tls_key_legacy: bool,
}

/// One `[[subsystem.namespace]]` table; the RBD keys go to `rbd::RawRbd`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNamespace {
    pub(super) nsid: Option<i64>,
    pub(super) backend: Option<String>,
    pub(super) path: Option<String>,
    pub(super) size: Option<RawSize>,
    pub(super) block_size: Option<i64>,
    #[serde(default)]
    pub(super) read_only: bool,
    pub(super) ana_group: Option<i64>,
    pub(super) reservations: Option<bool>,
    pub(super) hosts: Option<Vec<String>>,
    pub(super) nguid: Option<String>,
    pub(super) uuid: Option<String>,
    pub(super) eui64: Option<String>,
    pub(super) qos: Option<RawQos>,
    #[serde(default)]
    pub(super) host_qos: Vec<RawQos>,
    pub(super) pool: Option<String>,
    pub(super) image: Option<String>,
    pub(super) rbd_namespace: Option<String>,
    pub(super) ceph_conf: Option<PathBuf>,
    pub(super) client_id: Option<String>,
    pub(super) keyring: Option<PathBuf>,
    pub(super) timeout: Option<RawDuration>,
}

/// A namespace's `qos` table, or one `[[subsystem.namespace.host_qos]]`
/// table (which names its host).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQos {
    pub(super) nqn: Option<String>,
    pub(super) iops: Option<i64>,
    pub(super) read_iops: Option<i64>,
    pub(super) write_iops: Option<i64>,
    pub(super) bandwidth: Option<RawSize>,
    pub(super) read_bandwidth: Option<RawSize>,
    pub(super) write_bandwidth: Option<RawSize>,
}

/// `[gateway_group]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGatewayGroup {
    pub(super) name: Option<String>,
    pub(super) gateway: Option<String>,
    pub(super) pool: Option<String>,
    pub(super) ceph_conf: Option<PathBuf>,
    pub(super) client_id: Option<String>,
    pub(super) keyring: Option<PathBuf>,
    pub(super) lease: Option<RawDuration>,
    pub(super) failback_delay: Option<RawDuration>,
    #[serde(default)]
    pub(super) preferred: BTreeMap<String, String>,
}

/// A size as written: a string with units, or an integer number of bytes.
#[derive(Debug)]
pub(super) enum RawSize {
    Bytes(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;

        impl Visitor<'_> for SizeVisitor {
            type Value = RawSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64MiB\" or an integer number of bytes")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawSize, E> {
                i64::try_from(v)
                    .map(RawSize::Bytes)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize::Text(v.to_owned()))
            }
        }

        deserializer.deserialize_any(SizeVisitor)
    }
}

/// A duration as written: a string with a unit, or an integer of seconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawDuration {
    Seconds(i64),
    Text(String),
}

/// A duration at `key`: a string with a unit, or whole seconds.
pub(super) fn duration_value(key: &str, raw: &RawDuration) -> Result<Duration, ConfigError> {
    match raw {
        RawDuration::Seconds(n) => u64::try_from(*n)
            .map(Duration::from_secs)
            .map_err(|_| invalid(key, format!("{n} is negative; give e.g. \"30s\""))),
        RawDuration::Text(t) => units::parse_duration(t).map_err(|e| invalid(key, e.to_string())),
    }
}

/// A size at `key`: a string with units, or a number of bytes.
pub(super) fn size_value(key: &str, raw: &RawSize) -> Result<u64, ConfigError> {
    match raw {
        RawSize::Bytes(n) => u64::try_from(*n).map_err(|_| {
            invalid(
                key,
                format!("{n} is negative; give a size such as \"64MiB\" or a number of bytes"),
            )
        }),
        RawSize::Text(s) => units::parse_size(s).map_err(|e| invalid(key, e.to_string())),
    }
}
