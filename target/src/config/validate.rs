//! The rules of the configuration model ([`Config::validate`]), its checks
//! against this machine, and its warnings.

use super::error::{invalid, ConfigError};
use super::listener::{find_duplicate_listener, port_problem};
use super::model::{
    BackendConfig, Config, Limits, ListenerConfig, NamespaceConfig, Pollers, SubsystemConfig,
    Transport, DEFAULT_ARENA_BYTES, MAX_NSID, MAX_POLLERS,
};
use super::nqn::{check_subsystem_nqn, validate_nqn, EXAMPLE_NQN};
use super::qos;
use super::rbd::{self, RbdImage};
use rdmablk_common::units;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;

const MIN_ARENA_BYTES: u64 = 4 << 20;
const ARENA_ALIGN_BYTES: u64 = 4 << 10;
const BLOCK_SIZES: [u32; 2] = [512, 4096];

impl Config {
    /// Checks every rule of the configuration model; [`parse`](super::parse),
    /// [`from_quick_args`](super::from_quick_args) and
    /// [`embedded_default`](super::embedded_default) only return configs
    /// that pass.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_pollers(&self.pollers)?;
        validate_limits(&self.limits, self.pollers.arena_bytes)?;
        validate_listeners(&self.listeners)?;
        if let Some(g) = &self.gateway_group {
            if let Some((i, _)) = self
                .listeners
                .iter()
                .enumerate()
                .find(|(_, l)| !l.ana_groups.is_empty())
            {
                return Err(invalid(
                    format!("listener[{i}].ana_groups"),
                    format!(
                        "set while [gateway_group] {:?} decides every ANA group's state \
                         (its owner reports it optimized, the other gateways inaccessible); \
                         remove ana_groups",
                        g.name
                    ),
                ));
            }
        }
        if let Some(m) = self.metrics {
            let clash = self.listeners.iter().find(|l| {
                l.transport == Transport::Tcp
                    && l.address.port() == m.port()
                    && (l.address.ip() == m.ip()
                        || l.address.ip().is_unspecified()
                        || m.ip().is_unspecified())
            });
            if let Some(l) = clash {
                return Err(invalid(
                    "metrics.listen",
                    format!(
                        "{m} overlaps the NVMe/TCP listener on {}; give the metrics endpoint its own port, e.g. {}",
                        l.address,
                        SocketAddr::new(m.ip(), 9469)
                    ),
                ));
            }
        }
        if self.subsystems.is_empty() {
            return Err(invalid(
                "subsystem",
                format!(
                    "no subsystem configured; add a [[subsystem]] table with \
                     nqn = \"{EXAMPLE_NQN}\" and at least one [[subsystem.namespace]]"
                ),
            ));
        }
        let mut nqns: HashMap<&str, usize> = HashMap::new();
        for (i, subsystem) in self.subsystems.iter().enumerate() {
            let key = format!("subsystem[{i}]");
            check_subsystem_nqn(&format!("{key}.nqn"), &subsystem.nqn)?;
            if let Some(first) = nqns.insert(&subsystem.nqn, i) {
                return Err(invalid(
                    format!("{key}.nqn"),
                    format!(
                        "{:?} is already used by subsystem[{first}]; \
                         give every subsystem its own NQN",
                        subsystem.nqn
                    ),
                ));
            }
            validate_hosts(&key, subsystem)?;
            validate_namespaces(&key, &subsystem.namespaces)?;
            for (j, ns) in subsystem.namespaces.iter().enumerate() {
                validate_tenants(&format!("{key}.namespace[{j}]"), subsystem, ns)?;
            }
        }
        rbd::validate_shared(rbd_images(&self.subsystems))
    }

    /// Checks the configuration against this machine, as `--check` and the
    /// daemon's start do: a file namespace whose file is missing must have a
    /// size to create it with, and memory namespaces must fit in the
    /// machine's memory.
    pub fn check_machine(&self) -> Result<(), ConfigError> {
        let total = machine_memory();
        let mut memory = 0u64;
        for (i, s) in self.subsystems.iter().enumerate() {
            for (j, ns) in s.namespaces.iter().enumerate() {
                let key = format!("subsystem[{i}].namespace[{j}]");
                match &ns.backend {
                    BackendConfig::File {
                        path,
                        create_size: None,
                    } if !path.exists() => {
                        return Err(invalid(
                            format!("{key}.path"),
                            format!(
                                "{} does not exist; create it, or give size = \"...\" to have it created",
                                path.display()
                            ),
                        ));
                    }
                    BackendConfig::Memory { size } => {
                        memory += size;
                        if let Some(total) = total.filter(|&t| memory > t) {
                            return Err(invalid(
                                format!("{key}.size"),
                                format!(
                                    "memory namespaces need {} in all, more than this machine's {}; \
                                     use a file namespace or a smaller size",
                                    units::format_size(memory),
                                    units::format_size(total)
                                ),
                            ));
                        }
                    }
                    BackendConfig::Rbd(image) => {
                        let files = [
                            ("ceph_conf", Some(&image.ceph_conf)),
                            ("keyring", image.keyring.as_ref()),
                        ];
                        for (k, path) in files {
                            if let Some(Err(e)) = path.map(std::fs::metadata) {
                                return Err(invalid(
                                    format!("{key}.{k}"),
                                    format!("{}: {e}", path.expect("checked").display()),
                                ));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// What is valid but probably not meant: one host NQN (which nothing
    /// authenticates) may hold more arena than all the pollers have.
    pub fn warnings(&self) -> Vec<String> {
        let l = &self.limits;
        let arenas = self.pollers.arenas();
        let per_host = l.associations_per_host as u64 * l.association_buffer(arenas);
        let mut w = Vec::new();
        if per_host > arenas {
            w.push(format!(
                "one host may hold {} of arena (limits.associations_per_host {} x \
                 limits.association_buffer {}), more than the {} all pollers have: \
                 lower them, or raise pollers.arena",
                units::format_size(per_host),
                l.associations_per_host,
                units::format_size(l.association_buffer(arenas)),
                units::format_size(arenas)
            ));
        }
        w.extend(rbd_images(&self.subsystems).filter_map(|(key, i)| rbd::warning(&key, i)));
        for (i, s) in self.subsystems.iter().enumerate() {
            for (j, n) in s.namespaces.iter().enumerate() {
                let host = n.host_qos.iter().map(|h| h.limits);
                if std::iter::once(n.qos).chain(host).any(|l| qos::slow(&l)) {
                    w.push(format!(
                        "subsystem[{i}].namespace[{j}]: a bandwidth limit below 1MiB/s holds \
                         a 1 MiB command (the largest transfer) over a second, and a queue of \
                         them far longer; hosts time commands out (the Linux host after 30 s)"
                    ));
                }
            }
        }
        w
    }
}

/// The machine's memory in bytes, if it can be read (sysinfo(2): no /proc
/// file, which the unit's ProcSubset=pid hides).
pub fn machine_memory() -> Option<u64> {
    nix::sys::sysinfo::sysinfo().ok().map(|i| i.ram_total())
}

fn validate_pollers(pollers: &Pollers) -> Result<(), ConfigError> {
    if !(1..=MAX_POLLERS).contains(&pollers.count) {
        return Err(invalid("pollers.count", count_problem(pollers.count)));
    }
    let arena = pollers.arena_bytes;
    let default = units::format_size(DEFAULT_ARENA_BYTES);
    if arena < MIN_ARENA_BYTES {
        return Err(invalid(
            "pollers.arena",
            format!(
                "{} is below the minimum of {}; use at least \"{}\" (default \"{default}\")",
                units::format_size(arena),
                units::format_size(MIN_ARENA_BYTES),
                units::format_size(MIN_ARENA_BYTES),
            ),
        ));
    }
    if !arena.is_multiple_of(ARENA_ALIGN_BYTES) {
        return Err(invalid(
            "pollers.arena",
            format!(
                "{arena} bytes is not a multiple of {}; use e.g. \"{}\" (default \"{default}\")",
                units::format_size(ARENA_ALIGN_BYTES),
                units::format_size(arena / ARENA_ALIGN_BYTES * ARENA_ALIGN_BYTES),
            ),
        ));
    }
    Ok(())
}

/// The largest data buffer one command needs (MDTS, 1 MiB): every queue
/// budget must hold at least one.
pub const MIN_QUEUE_BUFFER: u64 = 1 << 20;
/// The largest admin data buffer (a discovery log page read).
pub const MIN_DISCOVERY_BUFFER: u64 = 256 << 10;

fn validate_limits(l: &Limits, arena: u64) -> Result<(), ConfigError> {
    let fits = |key: &str, v: u64, min: u64, what: &str| {
        if v < min {
            return Err(invalid(
                format!("limits.{key}"),
                format!(
                    "{} is below {} ({what}); use at least \"{}\"",
                    units::format_size(v),
                    units::format_size(min),
                    units::format_size(min)
                ),
            ));
        }
        if v > arena {
            return Err(invalid(
                format!("limits.{key}"),
                format!(
                    "{} is more than a poller's arena ({}); lower it or raise pollers.arena",
                    units::format_size(v),
                    units::format_size(arena)
                ),
            ));
        }
        Ok(())
    };
    fits(
        "queue_buffer",
        l.queue_buffer,
        MIN_QUEUE_BUFFER,
        "one command of the largest transfer",
    )?;
    fits(
        "discovery_buffer",
        l.discovery_buffer,
        MIN_DISCOVERY_BUFFER,
        "one discovery log read",
    )?;
    if let Some(given) = l.association_buffer.filter(|&a| a < l.queue_buffer) {
        return Err(invalid(
            "limits.association_buffer",
            format!(
                "{} is below limits.queue_buffer ({}); an association has at least one queue",
                units::format_size(given),
                units::format_size(l.queue_buffer)
            ),
        ));
    }
    Ok(())
}

fn validate_listeners(listeners: &[ListenerConfig]) -> Result<(), ConfigError> {
    if listeners.is_empty() {
        return Err(invalid(
            "listener",
            "no listener configured; add a [[listener]] table with \
             transport = \"tcp\" and address = \"0.0.0.0:4420\"",
        ));
    }
    for (i, listener) in listeners.iter().enumerate() {
        if let Some(problem) = port_problem(&listener.address) {
            return Err(invalid(
                format!("listener[{i}].address"),
                problem.to_string(),
            ));
        }
    }
    if let Some((first, dup)) = find_duplicate_listener(listeners) {
        return Err(invalid(
            format!("listener[{dup}]"),
            format!(
                "duplicates listener[{first}] ({} {}); remove one of them",
                listeners[dup].transport, listeners[dup].address
            ),
        ));
    }
    Ok(())
}

fn validate_hosts(key: &str, subsystem: &SubsystemConfig) -> Result<(), ConfigError> {
    for (h, host) in subsystem.hosts.iter().enumerate() {
        validate_nqn(host).map_err(|reason| {
            invalid(
                format!("{key}.hosts[{h}]"),
                format!("{host:?} is not a valid host NQN: {reason}"),
            )
        })?;
    }
    for (h, a) in subsystem.auth.iter().enumerate() {
        validate_nqn(&a.nqn).map_err(|reason| {
            invalid(
                format!("{key}.host[{h}].nqn"),
                format!("{:?} is not a valid host NQN: {reason}", a.nqn),
            )
        })?;
        if subsystem.hosts.contains(&a.nqn) || subsystem.auth[..h].iter().any(|o| o.nqn == a.nqn) {
            return Err(invalid(
                format!("{key}.host[{h}].nqn"),
                format!("{} is listed twice; a host is either in hosts or has one [[subsystem.host]] table", a.nqn),
            ));
        }
    }
    for (i, t) in subsystem.tls_keys.iter().enumerate() {
        let twice = subsystem.hosts.contains(&t.nqn)
            || subsystem.tls_keys[..i].iter().any(|o| o.nqn == t.nqn);
        if validate_nqn(&t.nqn).is_ok() && twice {
            return Err(invalid(
                format!("{key}.host"),
                format!("{} is listed twice; a host is either in hosts or has one [[subsystem.host]] table", t.nqn),
            ));
        }
        validate_nqn(&t.nqn).map_err(|reason| {
            invalid(
                format!("{key}.host"),
                format!("{:?} is not a valid host NQN: {reason}", t.nqn),
            )
        })?;
    }
    if !subsystem.allow_any_host
        && subsystem.hosts.is_empty()
        && subsystem.auth.is_empty()
        && subsystem.tls_keys.is_empty()
    {
        return Err(invalid(
            format!("{key}.hosts"),
            "empty while allow_any_host = false, so no host could ever connect: \
             list host NQNs in hosts = [...] or set allow_any_host = true",
        ));
    }
    Ok(())
}

fn validate_namespaces(key: &str, namespaces: &[NamespaceConfig]) -> Result<(), ConfigError> {
    if namespaces.is_empty() {
        return Err(invalid(
            format!("{key}.namespace"),
            "no namespace configured; add a [[subsystem.namespace]] table, \
             e.g. backend = \"memory\" and size = \"1GiB\"",
        ));
    }
    let mut nsids: HashMap<u32, usize> = HashMap::new();
    for (j, ns) in namespaces.iter().enumerate() {
        let ns_key = format!("{key}.namespace[{j}]");
        if !(1..=MAX_NSID).contains(&ns.nsid) {
            return Err(invalid(format!("{ns_key}.nsid"), nsid_problem(ns.nsid)));
        }
        if let Some(first) = nsids.insert(ns.nsid, j) {
            return Err(invalid(
                format!("{ns_key}.nsid"),
                format!(
                    "nsid {} is already used by {key}.namespace[{first}]; give each \
                     namespace a distinct nsid (an omitted nsid defaults to the \
                     namespace's 1-based position)",
                    ns.nsid
                ),
            ));
        }
        if let Some(problem) = block_size_problem(ns.block_size) {
            return Err(invalid(format!("{ns_key}.block_size"), problem));
        }
        match &ns.backend {
            BackendConfig::File { path, create_size } => {
                if path.as_os_str().is_empty() {
                    return Err(invalid(
                        format!("{ns_key}.path"),
                        "empty; set path = \"/path/to/image-or-block-device\"",
                    ));
                }
                if let Some(size) = create_size {
                    if let Some(problem) = size_problem(*size, ns.block_size) {
                        return Err(invalid(format!("{ns_key}.size"), problem));
                    }
                }
            }
            BackendConfig::Memory { size } | BackendConfig::Null { size } => {
                if let Some(problem) = size_problem(*size, ns.block_size) {
                    return Err(invalid(format!("{ns_key}.size"), problem));
                }
            }
            BackendConfig::Rbd(image) => rbd::validate(&ns_key, image)?,
        }
    }
    unique_ids(key, namespaces)
}

/// No two namespaces of a subsystem given the same NGUID, UUID or EUI-64:
/// a host would take them for one namespace reached by two paths.
fn unique_ids(key: &str, namespaces: &[NamespaceConfig]) -> Result<(), ConfigError> {
    let mut seen: HashMap<(&str, Vec<u8>), usize> = HashMap::new();
    for (j, ns) in namespaces.iter().enumerate() {
        let ids = &ns.ids;
        for (name, id) in [
            ("nguid", ids.nguid.map(|i| i.to_vec())),
            ("uuid", ids.uuid.map(|i| i.to_vec())),
            ("eui64", ids.eui64.map(|i| i.to_vec())),
        ] {
            let Some(id) = id else { continue };
            if let Some(first) = seen.insert((name, id), j) {
                return Err(invalid(
                    format!("{key}.namespace[{j}].{name}"),
                    format!(
                        "the same {name} as {key}.namespace[{first}]; hosts would take the \
                         two for one namespace: give each its own, or leave it out to have \
                         one derived"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A namespace's `hosts` and `host_qos`: valid NQNs, each once, of hosts
/// the subsystem admits; a host's limits for a host that sees the namespace.
fn validate_tenants(
    key: &str,
    subsystem: &SubsystemConfig,
    ns: &NamespaceConfig,
) -> Result<(), ConfigError> {
    let admitted = |nqn: &str| {
        subsystem.allow_any_host
            || subsystem.hosts.iter().any(|h| h == nqn)
            || subsystem.auth.iter().any(|a| a.nqn == nqn)
    };
    let check = |k: String, nqn: &str, earlier: &mut Vec<String>| {
        validate_nqn(nqn)
            .map_err(|reason| invalid(&k, format!("{nqn:?} is not a valid host NQN: {reason}")))?;
        if earlier.iter().any(|e| e == nqn) {
            return Err(invalid(k, format!("{nqn} is listed twice")));
        }
        if !admitted(nqn) {
            return Err(invalid(
                k,
                format!(
                    "{nqn} may not connect to the subsystem; add it to the subsystem's hosts                      (or a [[subsystem.host]] table) first"
                ),
            ));
        }
        earlier.push(nqn.to_owned());
        Ok(())
    };
    let mut seen = Vec::new();
    for (h, nqn) in ns.hosts.iter().flatten().enumerate() {
        check(format!("{key}.hosts[{h}]"), nqn, &mut seen)?;
    }
    let mut seen = Vec::new();
    for (h, q) in ns.host_qos.iter().enumerate() {
        let k = format!("{key}.host_qos[{h}].nqn");
        check(k.clone(), &q.nqn, &mut seen)?;
        if !ns.visible_to(&q.nqn) {
            return Err(invalid(
                k,
                format!(
                    "{} does not see this namespace (it is not in its hosts), so its \
                     limits would never apply",
                    q.nqn
                ),
            ));
        }
    }
    Ok(())
}

/// Every RBD image of the configuration, with its namespace's key.
fn rbd_images(subsystems: &[SubsystemConfig]) -> impl Iterator<Item = (String, &RbdImage)> {
    subsystems.iter().enumerate().flat_map(|(i, s)| {
        s.namespaces
            .iter()
            .enumerate()
            .filter_map(move |(j, ns)| match &ns.backend {
                BackendConfig::Rbd(image) => {
                    Some((format!("subsystem[{i}].namespace[{j}]"), image))
                }
                _ => None,
            })
    })
}

/// What is wrong with a poller count out of range.
pub(super) fn count_problem(count: impl fmt::Display) -> String {
    format!(
        "{count} is out of range; use 1 to {MAX_POLLERS} \
         (default: the number of online CPUs)"
    )
}

/// What is wrong with an nsid out of range.
pub(super) fn nsid_problem(nsid: impl fmt::Display) -> String {
    format!("{nsid} is out of range; use 1 to {MAX_NSID}")
}

/// What is wrong with an LBA size other than 512 or 4096; `None` for those.
pub(super) fn block_size_problem(block_size: impl Into<i64>) -> Option<String> {
    let block_size = block_size.into();
    (!BLOCK_SIZES.iter().any(|&b| i64::from(b) == block_size))
        .then(|| format!("{block_size} is not a supported LBA size; use 512 or 4096"))
}

/// What is wrong with a capacity that is zero or not a multiple of the
/// block size; `None` if neither.
pub(super) fn size_problem(size: u64, block_size: u32) -> Option<String> {
    let block = u64::from(block_size);
    if size == 0 {
        return Some("must be greater than 0; e.g. size = \"1GiB\"".to_owned());
    }
    if !size.is_multiple_of(block) {
        let suggestion = (size / block * block).max(block);
        return Some(format!(
            "{size} bytes is not a multiple of block_size {block_size}; \
             use a multiple such as \"{}\"",
            units::format_size(suggestion)
        ));
    }
    None
}
