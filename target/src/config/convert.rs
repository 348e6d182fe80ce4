//! Raw tables to the model: types, presence and parsing of each key. The
//! rules across keys are [`Config::validate`]'s.

use super::error::{invalid, ConfigError};
use super::listener::{parse_socket_addr, parse_transport};
use super::model::{
    default_poller_count, AnaState, BackendConfig, Config, GivenIds, HostAuth, HostTlsKey, Limits,
    ListenerConfig, ListenerTls, NamespaceConfig, Pollers, QosLimits, SubsystemConfig, Transport,
    DEFAULT_ARENA_BYTES, DEFAULT_BLOCK_SIZE, DEFAULT_STATE_DIRECTORY, MAX_ANA_GROUP, MAX_CNTLID,
};
use super::nqn::EXAMPLE_NQN;
use super::private_file;
use super::raw::{
    duration_value, size_value, RawConfig, RawDuration, RawHost, RawLimits, RawListener,
    RawMetrics, RawNamespace, RawPollers, RawReservations, RawSize, RawSubsystem,
};
use super::validate::{block_size_problem, count_problem, nsid_problem};
use super::{gateway, qos, rbd};
use rdmablk_common::auth::{DhGroup, Hash, Secret};
use rdmablk_common::spin::SpinBounds;
use rdmablk_common::tls::key::{ConfiguredKey, Labels};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use zeroize::Zeroizing;

/// The model of a whole raw configuration, not yet validated.
pub(super) fn convert(raw: RawConfig) -> Result<Config, ConfigError> {
    let pollers = convert_pollers(raw.pollers.unwrap_or_default())?;
    let limits = convert_limits(raw.limits.unwrap_or_default())?;
    let metrics = convert_metrics(raw.metrics.unwrap_or_default())?;
    let state_directory = convert_reservations(raw.reservations.unwrap_or_default())?;
    let listeners = raw
        .listener
        .into_iter()
        .enumerate()
        .map(|(i, l)| convert_listener(i, l))
        .collect::<Result<Vec<_>, _>>()?;
    let subsystems = raw
        .subsystem
        .into_iter()
        .enumerate()
        .map(|(i, s)| convert_subsystem(i, s))
        .collect::<Result<Vec<_>, _>>()?;
    let gateway_group = raw.gateway_group.map(gateway::convert).transpose()?;
    Ok(Config {
        pollers,
        listeners,
        subsystems,
        limits,
        metrics,
        state_directory,
        gateway_group,
    })
}

/// `[reservations] state_directory`: an absolute path.
fn convert_reservations(raw: RawReservations) -> Result<PathBuf, ConfigError> {
    match raw.state_directory {
        None => Ok(PathBuf::from(DEFAULT_STATE_DIRECTORY)),
        Some(p) if p.is_absolute() => Ok(p),
        Some(p) => Err(invalid(
            "reservations.state_directory",
            format!(
                "{:?} is not an absolute path; give e.g. \"{DEFAULT_STATE_DIRECTORY}\"",
                p.display()
            ),
        )),
    }
}

/// `[metrics] listen`: an IP address and a port; without it, no endpoint.
fn convert_metrics(raw: RawMetrics) -> Result<Option<SocketAddr>, ConfigError> {
    let Some(text) = raw.listen else {
        return Ok(None);
    };
    match text.parse::<SocketAddr>() {
        Ok(a) if a.port() != 0 => Ok(Some(a)),
        _ => Err(invalid(
            "metrics.listen",
            format!("{text:?} is not an IP address with a port; give e.g. \"127.0.0.1:9469\""),
        )),
    }
}

fn convert_limits(raw: RawLimits) -> Result<Limits, ConfigError> {
    let d = Limits::default();
    let count = |key: &str, v: Option<i64>, default: usize| match v {
        None => Ok(default),
        Some(n) => usize::try_from(n).ok().filter(|&n| n > 0).ok_or_else(|| {
            invalid(
                format!("limits.{key}"),
                format!("{n}: give a count of at least 1"),
            )
        }),
    };
    let size = |key: &str, v: &Option<RawSize>, default: u64| match v {
        None => Ok(default),
        Some(s) => size_value(&format!("limits.{key}"), s),
    };
    let time = |key: &str, v: &Option<RawDuration>, default: Duration| {
        let key = format!("limits.{key}");
        let t = match v {
            None => return Ok(default),
            Some(raw) => duration_value(&key, raw)?,
        };
        if t < Duration::from_millis(100) {
            return Err(invalid(
                &key,
                "use at least 100ms (deadlines are checked every 100 ms)",
            ));
        }
        Ok(t)
    };
    Ok(Limits {
        connections: count("connections", raw.connections, d.connections)?,
        pending_connections: count(
            "pending_connections",
            raw.pending_connections,
            d.pending_connections,
        )?,
        associations_per_host: count(
            "associations_per_host",
            raw.associations_per_host,
            d.associations_per_host,
        )?,
        tls_handshakes: count("tls_handshakes", raw.tls_handshakes, d.tls_handshakes)?,
        queue_buffer: size("queue_buffer", &raw.queue_buffer, d.queue_buffer)?,
        association_buffer: raw
            .association_buffer
            .as_ref()
            .map(|s| size_value("limits.association_buffer", s))
            .transpose()?,
        discovery_buffer: size(
            "discovery_buffer",
            &raw.discovery_buffer,
            d.discovery_buffer,
        )?,
        handshake_timeout: time(
            "handshake_timeout",
            &raw.handshake_timeout,
            d.handshake_timeout,
        )?,
        enable_timeout: time("enable_timeout", &raw.enable_timeout, d.enable_timeout)?,
        data_timeout: time("data_timeout", &raw.data_timeout, d.data_timeout)?,
        send_timeout: time("send_timeout", &raw.send_timeout, d.send_timeout)?,
        discovery_keep_alive: time(
            "discovery_keep_alive",
            &raw.discovery_keep_alive,
            d.discovery_keep_alive,
        )?,
    })
}

fn convert_pollers(raw: RawPollers) -> Result<Pollers, ConfigError> {
    let count = match raw.count {
        None => default_poller_count(),
        Some(n) => usize::try_from(n).map_err(|_| invalid("pollers.count", count_problem(n)))?,
    };
    let arena_bytes = match &raw.arena {
        None => DEFAULT_ARENA_BYTES,
        Some(size) => size_value("pollers.arena", size)?,
    };
    let d = SpinBounds::DEFAULT;
    let window = |key: &str, v: &Option<RawDuration>, default| match v {
        None => Ok(default),
        Some(raw) => duration_value(key, raw),
    };
    let min = window("pollers.spin_min", &raw.spin_min, d.min)?;
    let max = window("pollers.spin_max", &raw.spin_max, d.max)?;
    let key = if raw.spin_min.is_some() {
        "pollers.spin_min"
    } else {
        "pollers.spin_max"
    };
    let spin = SpinBounds::new(min, max).map_err(|e| invalid(key, e))?;
    Ok(Pollers {
        count,
        arena_bytes,
        busy_poll: raw.busy_poll.unwrap_or(false),
        spin,
    })
}

fn convert_listener(i: usize, raw: RawListener) -> Result<ListenerConfig, ConfigError> {
    let key = format!("listener[{i}]");
    let transport = match raw.transport.as_deref() {
        None => {
            return Err(invalid(
                format!("{key}.transport"),
                "missing; set transport = \"tcp\" or \"rdma\"",
            ))
        }
        Some(t) => parse_transport(t).ok_or_else(|| {
            invalid(
                format!("{key}.transport"),
                format!("{t:?} is not a supported transport; use \"tcp\" or \"rdma\""),
            )
        })?,
    };
    let address = match raw.address.as_deref() {
        None => {
            return Err(invalid(
                format!("{key}.address"),
                "missing; set address = \"0.0.0.0:4420\" (IPv6: \"[::]:4420\")",
            ))
        }
        Some(a) => {
            parse_socket_addr(a).map_err(|p| invalid(format!("{key}.address"), p.to_string()))?
        }
    };
    let ana_groups = raw
        .ana_groups
        .iter()
        .map(|(group, state)| ana_group_state(&key, group, state))
        .collect::<Result<_, _>>()?;
    let tls = match raw.tls.as_deref() {
        None => ListenerTls::Off,
        Some("required") => ListenerTls::Required,
        Some("optional") => ListenerTls::Optional,
        Some(other) => {
            return Err(invalid(
                format!("{key}.tls"),
                format!(
                    "{other:?}: use \"required\" (TLS only) or \"optional\" (TLS and plaintext)"
                ),
            ))
        }
    };
    if tls != ListenerTls::Off && transport != Transport::Tcp {
        return Err(invalid(
            format!("{key}.tls"),
            "TLS is NVMe/TCP's; an RDMA listener takes none",
        ));
    }
    Ok(ListenerConfig {
        transport,
        address,
        ana_groups,
        tls,
    })
}

/// One `ana_groups` entry of listener `key`: a group id and a state a
/// configuration may give (not the transitional `change`).
fn ana_group_state(key: &str, group: &str, state: &str) -> Result<(u32, AnaState), ConfigError> {
    let gkey = format!("{key}.ana_groups.{group}");
    let id = group
        .parse::<u32>()
        .ok()
        .filter(|g| (1..=MAX_ANA_GROUP).contains(g))
        .ok_or_else(|| invalid(&gkey, ana_group_problem(group)))?;
    match state.parse::<AnaState>() {
        Ok(AnaState::Change) => Err(invalid(
            gkey,
            "\"change\" is transitional: it is set with `rdmablk-target ana set GROUP change` \
             while a group moves, never in the file; give optimized, non-optimized, \
             inaccessible or persistent-loss",
        )),
        Ok(s) => Ok((id, s)),
        Err(_) => Err(invalid(
            gkey,
            format!(
                "{state:?} is not an ANA state; use optimized, non-optimized, inaccessible \
                 or persistent-loss"
            ),
        )),
    }
}

/// What is wrong with an ANA group id out of range.
/// A namespace's `nguid`, `uuid` or `eui64` (`name`) of `N` bytes, when
/// given.
fn given_id<const N: usize>(
    key: &str,
    name: &str,
    text: Option<&str>,
) -> Result<Option<[u8; N]>, ConfigError> {
    let example = match name {
        "uuid" => "\"3a9f0c4e-1b2d-4c5e-8f70-0123456789ab\"",
        "nguid" => "\"3a9f0c4e1b2d4c5e8f700123456789ab\"",
        _ => "\"002538b571b12345\"",
    };
    text.map(|t| {
        parse_hex(t).map_err(|why| {
            invalid(
                format!("{key}.{name}"),
                format!(
                    "{t:?} is not a valid {name}: {why}; write its {} hex digits \
                     as nvme-cli shows them, e.g. {name} = {example}",
                    2 * N
                ),
            )
        })
    })
    .transpose()
}

/// Parses an identifier of `N` bytes written as hex digits, with `-` or
/// `:` between them allowed (a UUID's form, nvme-cli's and nvmet's).
fn parse_hex<const N: usize>(text: &str) -> Result<[u8; N], String> {
    let digits: Vec<u8> = text.bytes().filter(|c| !matches!(c, b'-' | b':')).collect();
    if digits.len() != 2 * N {
        return Err(format!(
            "{} hex digits, not {} (dashes and colons aside)",
            2 * N,
            digits.len()
        ));
    }
    if let Some(&c) = digits.iter().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("{:?} is not a hex digit", c as char));
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
        out[i] = hex(pair[0]) << 4 | hex(pair[1]);
    }
    if out == [0; N] {
        return Err("all zeroes, which NVMe reserves for \"none\"".into());
    }
    Ok(out)
}

pub(super) fn ana_group_problem(group: impl fmt::Display) -> String {
    format!("ANA group {group} is out of range; use 1 to {MAX_ANA_GROUP}")
}

fn convert_subsystem(i: usize, raw: RawSubsystem) -> Result<SubsystemConfig, ConfigError> {
    let key = format!("subsystem[{i}]");
    let nqn = raw.nqn.ok_or_else(|| {
        invalid(
            format!("{key}.nqn"),
            format!("missing; set nqn = \"{EXAMPLE_NQN}\" (a unique NVMe Qualified Name)"),
        )
    })?;
    let namespaces = raw
        .namespace
        .into_iter()
        .enumerate()
        .map(|(j, n)| convert_namespace(&key, j, n))
        .collect::<Result<Vec<_>, _>>()?;
    let (mut auth, mut tls_keys) = (Vec::new(), Vec::new());
    for (h, r) in raw.host.into_iter().enumerate() {
        let (a, t) = convert_host(&format!("{key}.host[{h}]"), r)?;
        auth.extend(a);
        tls_keys.extend(t);
    }
    let cntlid = |k: &str, v: Option<i64>, default: u16| match v {
        None => Ok(default),
        Some(n) => u16::try_from(n)
            .ok()
            .filter(|c| (1..=MAX_CNTLID).contains(c))
            .ok_or_else(|| {
                invalid(
                    format!("{key}.{k}"),
                    format!("{n} is outside 1 to {MAX_CNTLID} (0x{MAX_CNTLID:x})"),
                )
            }),
    };
    let (min, max) = (
        cntlid("cntlid_min", raw.cntlid_min, 1)?,
        cntlid("cntlid_max", raw.cntlid_max, MAX_CNTLID)?,
    );
    if min > max {
        return Err(invalid(
            format!("{key}.cntlid_max"),
            format!("{max} is below cntlid_min {min}"),
        ));
    }
    Ok(SubsystemConfig {
        nqn,
        allow_any_host: raw.allow_any_host,
        hosts: raw.hosts,
        auth,
        tls_keys,
        namespaces,
        cntlids: min..=max,
    })
}

/// Hashes accepted when a host's table names none: all, strongest last.
const DEFAULT_HASHES: [Hash; 3] = [Hash::Sha256, Hash::Sha384, Hash::Sha512];
/// DH groups accepted when a host's table names none, in order of
/// preference: a DH exchange first, the null group (no DH) last.
const DEFAULT_DH_GROUPS: [DhGroup; 6] = [
    DhGroup::Ffdhe2048,
    DhGroup::Ffdhe3072,
    DhGroup::Ffdhe4096,
    DhGroup::Ffdhe6144,
    DhGroup::Ffdhe8192,
    DhGroup::Null,
];

/// A list of names at `key` read with `parse`, or `default` when absent;
/// an unknown name is an error at its index saying what to `use`.
fn name_list<T: Copy>(
    key: &str,
    names: Option<Vec<String>>,
    default: &[T],
    parse: fn(&str) -> Option<T>,
    use_: &str,
) -> Result<Vec<T>, ConfigError> {
    let Some(names) = names else {
        return Ok(default.to_vec());
    };
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            parse(n).ok_or_else(|| invalid(format!("{key}[{i}]"), format!("{n:?}: use {use_}")))
        })
        .collect()
}

/// A `[[subsystem.host]]` table: its DH-HMAC-CHAP secrets (inline or from
/// a file, which systemd credentials can supply), hashes and DH groups,
/// and its TLS key; it gives either or both.
fn convert_host(
    key: &str,
    raw: RawHost,
) -> Result<(Option<HostAuth>, Option<HostTlsKey>), ConfigError> {
    let nqn = raw
        .nqn
        .ok_or_else(|| invalid(format!("{key}.nqn"), "missing; the host's NQN"))?;
    let dhchap = |name: &str, inline, file| {
        secret_text(key, name, inline, file)?
            .map(|text| {
                Secret::parse(&text).map_err(|e| invalid(format!("{key}.{name}"), e.to_string()))
            })
            .transpose()
    };
    let host_secret = dhchap("dhchap_secret", raw.dhchap_secret, raw.dhchap_secret_file)?;
    let ctrl_secret = dhchap(
        "dhchap_ctrl_secret",
        raw.dhchap_ctrl_secret,
        raw.dhchap_ctrl_secret_file,
    )?;
    let tls_key = secret_text(key, "tls_key", raw.tls_key, raw.tls_key_file)?
        .map(|text| {
            ConfiguredKey::parse(&text)
                .map_err(|e| invalid(format!("{key}.tls_key"), e.to_string()))
        })
        .transpose()?
        .map(|k| HostTlsKey {
            nqn: nqn.clone(),
            key: k,
            labels: if raw.tls_key_legacy {
                Labels::LegacyLibnvme
            } else {
                Labels::Rfc8446
            },
        });
    let Some(secret) = host_secret else {
        if tls_key.is_none() {
            return Err(invalid(
                format!("{key}.dhchap_secret"),
                "missing; give the host's DH-HMAC-CHAP secret as `nvme gen-dhchap-key` prints it \
                 (DHHC-1:...) or dhchap_secret_file, or its TLS key (tls_key, tls_key_file) as \
                 `rdmablk gen-tls-key` prints it (NVMeTLSkey-1:...)",
            ));
        }
        if ctrl_secret.is_some() || raw.dhchap_hash.is_some() || raw.dhchap_dhgroup.is_some() {
            return Err(invalid(
                format!("{key}.dhchap_secret"),
                "missing, while other dhchap_ keys are given",
            ));
        }
        return Ok((None, tls_key));
    };
    let hashes = name_list(
        &format!("{key}.dhchap_hash"),
        raw.dhchap_hash,
        &DEFAULT_HASHES,
        Hash::from_name,
        "\"sha256\", \"sha384\" or \"sha512\"",
    )?;
    let dh_groups = name_list(
        &format!("{key}.dhchap_dhgroup"),
        raw.dhchap_dhgroup,
        &DEFAULT_DH_GROUPS,
        DhGroup::from_name,
        "\"null\" or \"ffdhe2048\" ... \"ffdhe8192\"",
    )?;
    if hashes.is_empty() || dh_groups.is_empty() {
        return Err(invalid(
            key.to_string(),
            "dhchap_hash and dhchap_dhgroup need at least one entry each",
        ));
    }
    let auth = HostAuth {
        nqn,
        secret,
        ctrl_secret,
        hashes,
        dh_groups,
    };
    Ok((Some(auth), tls_key))
}

/// The text of secret `name` of host table `key`: given inline, or read
/// from `name_file`, which only its owner may read.
fn secret_text(
    key: &str,
    name: &str,
    inline: Option<String>,
    file: Option<PathBuf>,
) -> Result<Option<Zeroizing<String>>, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(invalid(
            format!("{key}.{name}"),
            format!("given inline and as {name}_file; keep one"),
        )),
        (Some(t), None) => Ok(Some(Zeroizing::new(t))),
        (None, Some(path)) => {
            let at = |p: String| {
                invalid(
                    format!("{key}.{name}_file"),
                    format!("{}: {p}", path.display()),
                )
            };
            private_file(&path).map_err(at)?;
            let text = std::fs::read_to_string(&path).map_err(|e| at(e.to_string()))?;
            Ok(Some(Zeroizing::new(text)))
        }
        (None, None) => Ok(None),
    }
}

fn convert_namespace(
    subsystem_key: &str,
    j: usize,
    raw: RawNamespace,
) -> Result<NamespaceConfig, ConfigError> {
    let key = format!("{subsystem_key}.namespace[{j}]");
    let nsid = match raw.nsid {
        // Position (1-based); out-of-range positions are caught by validation.
        None => u32::try_from(j + 1).unwrap_or(u32::MAX),
        Some(n) => u32::try_from(n).map_err(|_| invalid(format!("{key}.nsid"), nsid_problem(n)))?,
    };
    let block_size = match raw.block_size {
        None => DEFAULT_BLOCK_SIZE,
        Some(b) => u32::try_from(b).map_err(|_| {
            invalid(
                format!("{key}.block_size"),
                block_size_problem(b).unwrap_or_default(),
            )
        })?,
    };
    let size = raw
        .size
        .as_ref()
        .map(|s| size_value(&format!("{key}.size"), s))
        .transpose()?;
    let Some(backend_name) = raw.backend else {
        return Err(invalid(
            format!("{key}.backend"),
            "missing; set backend = \"file\", \"memory\", \"null\" or \"rbd\"",
        ));
    };
    let backend_name = backend_name.to_ascii_lowercase();
    let raw_rbd = rbd::RawRbd {
        pool: raw.pool,
        image: raw.image,
        rbd_namespace: raw.rbd_namespace,
        ceph_conf: raw.ceph_conf,
        client_id: raw.client_id,
        keyring: raw.keyring,
        timeout: raw.timeout,
    };
    if let Some(k) = raw_rbd.any().filter(|_| backend_name != "rbd") {
        return Err(invalid(
            format!("{key}.{k}"),
            format!(
                "only backend = \"rbd\" uses {k}; remove it or set backend = \"rbd\" \
                 (backend is {backend_name:?})"
            ),
        ));
    }
    let backend = match backend_name.as_str() {
        "file" => {
            let Some(path) = raw.path else {
                return Err(invalid(
                    format!("{key}.path"),
                    "missing; backend = \"file\" needs path = \"/path/to/image-or-block-device\"",
                ));
            };
            BackendConfig::File {
                path: PathBuf::from(path),
                create_size: size,
            }
        }
        name @ ("memory" | "null") => {
            if raw.path.is_some() {
                return Err(invalid(
                    format!("{key}.path"),
                    format!(
                        "only backend = \"file\" uses a path; remove path \
                         or set backend = \"file\" (backend is {name:?})"
                    ),
                ));
            }
            let Some(size) = size else {
                return Err(invalid(
                    format!("{key}.size"),
                    format!("missing; backend = {name:?} needs a capacity, e.g. size = \"1GiB\""),
                ));
            };
            if name == "memory" {
                BackendConfig::Memory { size }
            } else {
                BackendConfig::Null { size }
            }
        }
        "rbd" => {
            for (k, set) in [("path", raw.path.is_some()), ("size", size.is_some())] {
                if set {
                    return Err(invalid(
                        format!("{key}.{k}"),
                        format!(
                            "backend = \"rbd\" takes no {k}: the image is named by pool \
                             and image, and its size is the image's"
                        ),
                    ));
                }
            }
            BackendConfig::Rbd(rbd::convert(&key, raw_rbd)?)
        }
        _ => {
            return Err(invalid(
                format!("{key}.backend"),
                format!(
                    "{backend_name:?} is not a supported backend; use \"file\" \
                     (a file or block device), \"memory\", \"null\" or \"rbd\" \
                     (a Ceph RBD image)"
                ),
            ))
        }
    };
    let ana_group = match raw.ana_group {
        None => 1,
        Some(g) => u32::try_from(g)
            .ok()
            .filter(|g| (1..=MAX_ANA_GROUP).contains(g))
            .ok_or_else(|| invalid(format!("{key}.ana_group"), ana_group_problem(g)))?,
    };
    let limits = match raw.qos {
        Some(q) => qos::convert(&format!("{key}.qos"), q)?,
        None => QosLimits::default(),
    };
    let host_qos = raw
        .host_qos
        .into_iter()
        .enumerate()
        .map(|(h, q)| qos::convert_host(&format!("{key}.host_qos[{h}]"), q))
        .collect::<Result<Vec<_>, _>>()?;
    let ids = GivenIds {
        nguid: given_id(&key, "nguid", raw.nguid.as_deref())?,
        uuid: given_id(&key, "uuid", raw.uuid.as_deref())?,
        eui64: given_id(&key, "eui64", raw.eui64.as_deref())?,
    };
    Ok(NamespaceConfig {
        nsid,
        backend,
        block_size,
        read_only: raw.read_only,
        ana_group,
        reservations: raw.reservations.unwrap_or(true),
        hosts: raw.hosts,
        qos: limits,
        host_qos,
        ids,
    })
}
