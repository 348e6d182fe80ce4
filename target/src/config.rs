//! Target configuration: TOML text (or the command-line quick form) turned
//! into a validated [`Config`].
//!
//! Parsing happens in two steps: the TOML is deserialized into loosely typed
//! raw tables (unknown keys are rejected there), then converted and checked.
//! Every semantic error is a [`ConfigError::Invalid`] naming the key path
//! (e.g. `subsystem[0].namespace[1].block_size`), what is wrong and how to
//! fix it. The example configuration shipped with the daemon is
//! `config/target.toml`.

use rdmablk_common::units;

use rdmablk_common::auth::{DhGroup, Hash, Secret};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod rbd;
pub use rbd::RbdImage;

/// NQN of the subsystem created by [`embedded_default`] and the quick form
/// when no NQN is given.
pub const DEFAULT_NQN: &str = "nqn.2026-11.io.rdmablk:default";

/// Well-known NQN of the discovery subsystem; reserved, so no configured
/// subsystem may use it.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// IANA-registered NVMe-oF port.
const DEFAULT_PORT: u16 = 4420;
const DEFAULT_ARENA_BYTES: u64 = 64 << 20;
const MIN_ARENA_BYTES: u64 = 4 << 20;
const ARENA_ALIGN_BYTES: u64 = 4 << 10;
const MAX_POLLERS: usize = 256;
const MAX_NSID: u32 = 1024;
const DEFAULT_BLOCK_SIZE: u32 = 512;
const BLOCK_SIZES: [u32; 2] = [512, 4096];
const EMBEDDED_MEMORY_BYTES: u64 = 1 << 30;
/// Longest NQN in bytes (NVMe base specification, "NVMe Qualified Names").
const MAX_NQN_BYTES: usize = 223;
/// Prefix of NQNs built from a UUID rather than a domain name.
const NQN_UUID_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";
const EXAMPLE_NQN: &str = "nqn.2026-11.io.example:disk0";
/// Highest controller id of the dynamic controller model (NVMe Base 2.1,
/// 3.1.1: FFF0h and up are reserved).
pub const MAX_CNTLID: u16 = 0xffef;

/// A complete, validated target configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// I/O poller threads.
    pub pollers: Pollers,
    /// Addresses the target accepts connections on (at least one).
    pub listeners: Vec<Listener>,
    /// Exported NVM subsystems (at least one, unique NQNs).
    pub subsystems: Vec<Subsystem>,
    /// What hosts may hold, and how long the target waits for them.
    pub limits: Limits,
    /// Where the Prometheus metrics endpoint listens (`[metrics] listen`);
    /// off when `None`.
    pub metrics: Option<SocketAddr>,
}

/// Resource limits and deadlines (`[limits]`): what any one host can make
/// the target hold, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connected queues (admin and I/O, all hosts) at once; a Connect
    /// beyond answers Controller Busy.
    pub connections: usize,
    /// Connections that have not sent their Connect yet; more are closed
    /// (TCP) or rejected (RDMA) at once.
    pub pending_connections: usize,
    /// Associations (controllers) one host NQN may have at once; a Connect
    /// beyond answers Controller Busy.
    pub associations_per_host: usize,
    /// Arena bytes one queue may hold for its commands' data.
    pub queue_buffer: u64,
    /// Arena bytes all queues of one association may hold together.
    pub association_buffer: u64,
    /// Arena bytes all discovery queues of one poller may hold together.
    pub discovery_buffer: u64,
    /// From connection to ICReq, and to Connect.
    pub handshake_timeout: Duration,
    /// From an admin Connect (or a controller reset) to CC.EN = 1.
    pub enable_timeout: Duration,
    /// For data asked of the host: an R2T's H2CData, an RDMA READ.
    pub data_timeout: Duration,
    /// Without any progress of a queue's sends (the host does not read its
    /// socket, or its RDMA receives are not posted) before it is torn down.
    pub send_timeout: Duration,
    /// Keep-alive timeout of a discovery controller whose host asked for none.
    pub discovery_keep_alive: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 4096,
            pending_connections: 512,
            associations_per_host: 16,
            queue_buffer: 4 << 20,
            association_buffer: 8 << 20,
            discovery_buffer: 2 << 20,
            handshake_timeout: Duration::from_secs(10),
            enable_timeout: Duration::from_secs(10),
            data_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(30),
            discovery_keep_alive: Duration::from_secs(120),
        }
    }
}

/// I/O poller threads settings (`[pollers]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pollers {
    /// Number of poller threads, 1 to 256; default: online CPUs (at most 256).
    pub count: usize,
    /// Per-poller buffer arena in bytes: at least 4 MiB, a multiple of 4 KiB.
    pub arena_bytes: u64,
    /// Spin on the queues instead of sleeping when idle.
    pub busy_poll: bool,
}

/// One listening address (`[[listener]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Listener {
    /// Fabric transport.
    pub transport: Transport,
    /// IP address and port to listen on.
    pub address: SocketAddr,
}

/// NVMe-oF transport of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// NVMe/TCP.
    Tcp,
    /// NVMe/RDMA.
    Rdma,
}

/// One exported NVM subsystem (`[[subsystem]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subsystem {
    /// NVMe Qualified Name, unique among subsystems.
    pub nqn: String,
    /// Let any host connect, ignoring `hosts`.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect when `allow_any_host` is false.
    pub hosts: Vec<String>,
    /// Hosts that must authenticate (`[[subsystem.host]]`); they are
    /// allowed to connect, authenticated.
    pub auth: Vec<HostAuth>,
    /// Namespaces (at least one, unique nsids).
    pub namespaces: Vec<Namespace>,
    /// Controller ids given out (`cntlid_min`, `cntlid_max`): gateways
    /// exporting one subsystem each take a range of their own, as hosts
    /// refuse a controller id seen twice in a subsystem.
    pub cntlids: std::ops::RangeInclusive<u16>,
}

/// A host that authenticates with DH-HMAC-CHAP (`[[subsystem.host]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAuth {
    pub nqn: String,
    /// The host's secret (`dhchap_secret` or `dhchap_secret_file`).
    pub secret: Secret,
    /// The controller's secret, for bidirectional authentication.
    pub ctrl_secret: Option<Secret>,
    /// Hashes accepted, in order of preference.
    pub hashes: Vec<Hash>,
    /// DH groups accepted, in order of preference.
    pub dh_groups: Vec<DhGroup>,
}

/// One namespace of a subsystem (`[[subsystem.namespace]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace ID, 1 to 1024, unique within the subsystem.
    pub nsid: u32,
    /// Where the data lives.
    pub backend: Backend,
    /// LBA size in bytes: 512 or 4096.
    pub block_size: u32,
    /// Reject writes.
    pub read_only: bool,
}

/// Storage behind a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A regular file or a block device.
    File {
        /// Path of the file or device.
        path: PathBuf,
        /// Size in bytes to create the file with if it does not exist.
        create_size: Option<u64>,
    },
    /// Volatile RAM, zero-filled at start.
    Memory {
        /// Capacity in bytes.
        size: u64,
    },
    /// Discards writes and reads zeroes.
    Null {
        /// Capacity in bytes.
        size: u64,
    },
    /// A Ceph RBD image, its size the image's.
    Rbd(RbdImage),
}

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file that was read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Not valid TOML, or a key that is unknown or has the wrong type;
    /// toml's message, with line and column.
    #[error("{0}")]
    Syntax(String),
    /// A value breaks a rule: `key: problem`.
    #[error("{key}: {problem}")]
    Invalid {
        /// Key path such as `subsystem[0].namespace[1].block_size`, or a
        /// command-line flag such as `--listen`.
        key: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

/// The accepted NQN forms, appended to most [`NqnError`] messages.
const NQN_FORMS: &str = "expected nqn.YYYY-MM.reverse.domain:name \
                         (e.g. nqn.2026-11.io.example:disk0) \
                         or nqn.2014-08.org.nvmexpress:uuid:<8-4-4-4-12 hex UUID>";

/// Why [`validate_nqn`] rejected an NQN. The message completes a sentence
/// such as `"…" is not a valid NQN: {reason}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    /// Longer than the 223 bytes the specification allows.
    #[error(
        "it is {len} bytes long; an NQN may be at most {} bytes",
        MAX_NQN_BYTES
    )]
    TooLong {
        /// Length of the rejected NQN in bytes.
        len: usize,
    },
    /// Contains a control character.
    #[error("it contains a control character")]
    ControlCharacter,
    /// The part after `nqn.2014-08.org.nvmexpress:uuid:` is not a UUID.
    #[error(
        "{uuid:?} after \"uuid:\" is not a UUID in 8-4-4-4-12 hex form \
         (e.g. 3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f15)"
    )]
    BadUuid {
        /// The text after `uuid:`.
        uuid: String,
    },
    /// Does not start with `nqn.`.
    #[error("it does not start with \"nqn.\"; {}", NQN_FORMS)]
    MissingPrefix,
    /// No valid `YYYY-MM` date after `nqn.`.
    #[error(
        "{date:?} after \"nqn.\" is not a year-month date YYYY-MM; {}",
        NQN_FORMS
    )]
    BadDate {
        /// The text after `nqn.` up to the first `.` or `:`.
        date: String,
    },
    /// The date is not followed by `.`.
    #[error(
        "the date must be followed by \".\" and a reverse domain name; {}",
        NQN_FORMS
    )]
    MissingDomain,
    /// No `:` after the domain.
    #[error("there is no ':' followed by a name after the domain; {}", NQN_FORMS)]
    MissingName,
    /// The domain is not dot-separated labels of `a-z`, `0-9` and `-`.
    #[error(
        "domain {domain:?} is not a reverse domain name: it needs one or more labels \
         of lowercase letters, digits and '-' separated by single dots; {}",
        NQN_FORMS
    )]
    BadDomain {
        /// The text between the date and the first `:`.
        domain: String,
    },
    /// Nothing after the `:`.
    #[error("the name after ':' is empty; {}", NQN_FORMS)]
    EmptyName,
}

/// The command-line quick form: one subsystem with one namespace, open to
/// any host, e.g. `--listen tcp://127.0.0.1:4420 --memory 1GiB`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuickArgs {
    /// `--listen` URLs (`tcp://ADDR:PORT` or `rdma://ADDR:PORT`); default
    /// `tcp://127.0.0.1:4420` when empty.
    pub listen: Vec<String>,
    /// `--memory SIZE`: a RAM-backed namespace.
    pub memory: Option<String>,
    /// `--file PATH`: a file or block device namespace (must exist).
    pub file: Option<PathBuf>,
    /// `--null SIZE`: a namespace that discards writes and reads zeroes.
    pub null: Option<String>,
    /// `--rbd POOL/IMAGE`: a Ceph RBD image, with `--ceph-conf` and
    /// `--ceph-id`.
    pub rbd: Option<String>,
    pub ceph_conf: Option<PathBuf>,
    pub ceph_id: Option<String>,
    /// `--nqn NQN`: subsystem NQN; default [`DEFAULT_NQN`].
    pub nqn: Option<String>,
    /// `--block-size N`: LBA size, 512 or 4096; default 512.
    pub block_size: Option<u32>,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        })
    }
}

impl Default for Pollers {
    /// One poller per online CPU (at most 256), 64 MiB arenas, no busy polling.
    fn default() -> Self {
        Pollers {
            count: default_poller_count(),
            arena_bytes: DEFAULT_ARENA_BYTES,
            busy_poll: false,
        }
    }
}

impl Config {
    /// Checks every rule of the configuration model; [`parse`],
    /// [`from_quick_args`] and [`embedded_default`] only return configs
    /// that pass.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_pollers(&self.pollers)?;
        validate_limits(&self.limits, self.pollers.arena_bytes)?;
        validate_listeners(&self.listeners)?;
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
        }
        rbd::validate_shared(rbd_images(&self.subsystems))
    }
}

impl Config {
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
                    Backend::File {
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
                    Backend::Memory { size } => {
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
                    Backend::Rbd(image) => {
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
}

impl Config {
    /// What is valid but probably not meant: one host NQN (which nothing
    /// authenticates) may hold more arena than all the pollers have.
    pub fn warnings(&self) -> Vec<String> {
        let l = &self.limits;
        let per_host = l.associations_per_host as u64 * l.association_buffer;
        let arenas = self.pollers.count as u64 * self.pollers.arena_bytes;
        let mut w = Vec::new();
        if per_host > arenas {
            w.push(format!(
                "one host may hold {} of arena (limits.associations_per_host {} x \
                 limits.association_buffer {}), more than the {} all pollers have: \
                 lower them, or raise pollers.arena",
                units::format_size(per_host),
                l.associations_per_host,
                units::format_size(l.association_buffer),
                units::format_size(arenas)
            ));
        }
        w.extend(rbd_images(&self.subsystems).filter_map(|(key, i)| rbd::warning(&key, i)));
        w
    }
}

/// The machine's memory in bytes (MemTotal), if it can be read.
/// The machine's memory in bytes (MemTotal).
pub fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Reads and parses the configuration file at `path`.
///
/// Read errors name the path; the other errors are those of [`parse`].
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let cfg = parse(&text)?;
    if holds_inline_secrets(&text) {
        if let Err(problem) = private_file(path) {
            return Err(invalid(path.display().to_string(), problem));
        }
    }
    Ok(cfg)
}

/// Whether a (valid) configuration gives a DH-HMAC-CHAP secret inline in
/// some `[[subsystem.host]]` table (comments and `*_file` keys aside).
fn holds_inline_secrets(text: &str) -> bool {
    let Ok(v) = toml::from_str::<toml::Value>(text) else {
        return false;
    };
    let tables = |v: Option<&toml::Value>| {
        v.and_then(toml::Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(toml::Value::as_table)
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    tables(v.get("subsystem")).iter().any(|s| {
        tables(s.get("host"))
            .iter()
            .any(|h| h.contains_key("dhchap_secret") || h.contains_key("dhchap_ctrl_secret"))
    })
}

/// Refuses a file holding secrets that others than its owner may read.
fn private_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| e.to_string())?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "holds DH-HMAC-CHAP secrets but its mode is {:o}: others may read them; chmod 600 it",
            mode & 0o777
        ));
    }
    Ok(())
}

/// Parses and validates configuration TOML.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let raw: RawConfig =
        toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string().trim_end().into()))?;
    let config = convert(raw)?;
    config.validate()?;
    Ok(config)
}

/// The configuration used when none is given: one 1 GiB memory namespace
/// (nsid 1) in subsystem [`DEFAULT_NQN`], open to any host, listening on
/// NVMe/TCP `127.0.0.1:4420`, default pollers.
pub fn embedded_default() -> Config {
    Config {
        pollers: Pollers::default(),
        listeners: vec![default_listener()],
        subsystems: vec![Subsystem {
            nqn: DEFAULT_NQN.to_owned(),
            allow_any_host: true,
            hosts: Vec::new(),
            auth: Vec::new(),
            namespaces: vec![Namespace {
                nsid: 1,
                backend: Backend::Memory {
                    size: EMBEDDED_MEMORY_BYTES,
                },
                block_size: DEFAULT_BLOCK_SIZE,
                read_only: false,
            }],
            cntlids: 1..=MAX_CNTLID,
        }],
        limits: Limits::default(),
        metrics: None,
    }
}

/// Builds a configuration from the command-line quick form.
///
/// Exactly one of `memory`, `file` and `null` must be set. The result has
/// one subsystem (`nqn`, default [`DEFAULT_NQN`]) open to any host, with one
/// namespace, nsid 1. Errors name the offending flag as their key.
pub fn from_quick_args(q: &QuickArgs) -> Result<Config, ConfigError> {
    let listeners = if q.listen.is_empty() {
        vec![default_listener()]
    } else {
        q.listen
            .iter()
            .map(|url| parse_listen_url(url))
            .collect::<Result<Vec<_>, _>>()?
    };
    if let Some((first, dup)) = find_duplicate_listener(&listeners) {
        return Err(invalid(
            "--listen",
            format!(
                "{} is given twice (values {} and {}); remove one",
                listener_url(&listeners[dup]),
                first + 1,
                dup + 1
            ),
        ));
    }

    let block_size = q.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    if let Some(problem) = block_size_problem(block_size) {
        return Err(invalid("--block-size", problem));
    }

    const BACKEND_FLAGS: &str = "--memory/--file/--null/--rbd";
    let backend = match (&q.memory, &q.file, &q.null, &q.rbd) {
        (None, None, None, Some(spec)) => Backend::Rbd(rbd::from_quick_args(
            spec,
            q.ceph_conf.as_ref(),
            q.ceph_id.as_deref(),
        )?),
        (Some(size), None, None, None) => Backend::Memory {
            size: quick_size("--memory", size, block_size)?,
        },
        (None, Some(path), None, None) => {
            if path.as_os_str().is_empty() {
                return Err(invalid(
                    "--file",
                    "empty path; give a file or block device, e.g. --file /dev/nvme0n1",
                ));
            }
            Backend::File {
                path: path.clone(),
                create_size: None,
            }
        }
        (None, None, Some(size), None) => Backend::Null {
            size: quick_size("--null", size, block_size)?,
        },
        (None, None, None, None) => {
            return Err(invalid(
                BACKEND_FLAGS,
                "no backend given; pass exactly one of --memory SIZE, --file PATH, \
                 --null SIZE or --rbd POOL/IMAGE, e.g. --memory 1GiB",
            ))
        }
        _ => {
            let given: Vec<&str> = [
                ("--memory", q.memory.is_some()),
                ("--file", q.file.is_some()),
                ("--null", q.null.is_some()),
                ("--rbd", q.rbd.is_some()),
            ]
            .into_iter()
            .filter_map(|(flag, set)| set.then_some(flag))
            .collect();
            return Err(invalid(
                BACKEND_FLAGS,
                format!(
                    "{} were given together; pass exactly one of them",
                    given.join(" and ")
                ),
            ));
        }
    };

    let nqn = q.nqn.clone().unwrap_or_else(|| DEFAULT_NQN.to_owned());
    check_subsystem_nqn("--nqn", &nqn)?;

    let config = Config {
        pollers: Pollers::default(),
        listeners,
        subsystems: vec![Subsystem {
            nqn,
            allow_any_host: true,
            hosts: Vec::new(),
            auth: Vec::new(),
            namespaces: vec![Namespace {
                nsid: 1,
                backend,
                block_size,
                read_only: false,
            }],
            cntlids: 1..=MAX_CNTLID,
        }],
        limits: Limits::default(),
        metrics: None,
    };
    config.validate()?;
    Ok(config)
}

/// Parses a `--listen` URL: `tcp://ADDR:PORT` or `rdma://ADDR:PORT`, with
/// IPv6 addresses in brackets (`rdma://[fe80::1]:4420`). Host names are not
/// resolved. Errors use `--listen` as their key.
pub fn parse_listen_url(s: &str) -> Result<Listener, ConfigError> {
    const KEY: &str = "--listen";
    const SYNTAX: &str = "use tcp://ADDR:PORT or rdma://ADDR:PORT, \
                          e.g. tcp://127.0.0.1:4420 or rdma://[fe80::1]:4420";
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(invalid(KEY, format!("{s:?} is not a listen URL; {SYNTAX}")));
    };
    let Some(transport) = parse_transport(scheme) else {
        return Err(invalid(
            KEY,
            format!("unknown transport {scheme:?} in {s:?}; {SYNTAX}"),
        ));
    };
    let address = parse_socket_addr(rest).map_err(|p| invalid(KEY, format!("in {s:?}: {p}")))?;
    Ok(Listener { transport, address })
}

/// Checks NQN syntax (NVMe base specification, "NVMe Qualified Names").
///
/// Accepts at most 223 bytes in one of two forms:
/// `nqn.YYYY-MM.reverse.domain:name` (a real year-month, domain labels of
/// `a-z`, `0-9` and `-` separated by dots, a non-empty name after the first
/// `:`), or `nqn.2014-08.org.nvmexpress:uuid:` followed by a UUID in
/// 8-4-4-4-12 hex form. Control characters are rejected. The discovery NQN
/// [`DISCOVERY_NQN`] has no `:` part and does not pass. On error, returns
/// the reason as an [`NqnError`].
pub fn validate_nqn(nqn: &str) -> Result<(), NqnError> {
    if nqn.len() > MAX_NQN_BYTES {
        return Err(NqnError::TooLong { len: nqn.len() });
    }
    if nqn.chars().any(char::is_control) {
        return Err(NqnError::ControlCharacter);
    }
    if let Some(uuid) = nqn.strip_prefix(NQN_UUID_PREFIX) {
        return if is_uuid(uuid) {
            Ok(())
        } else {
            Err(NqnError::BadUuid { uuid: uuid.into() })
        };
    }
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return Err(NqnError::MissingPrefix);
    };
    let date = rest.get(..7).unwrap_or(rest);
    if !is_year_month(date) {
        return Err(NqnError::BadDate {
            date: rest.split(['.', ':']).next().unwrap_or(rest).into(),
        });
    }
    if rest.as_bytes().get(7) != Some(&b'.') {
        return Err(NqnError::MissingDomain);
    }
    let Some((domain, name)) = rest[8..].split_once(':') else {
        return Err(NqnError::MissingName);
    };
    let labels_ok = domain.split('.').all(|label| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    });
    if !labels_ok {
        return Err(NqnError::BadDomain {
            domain: domain.into(),
        });
    }
    if name.is_empty() {
        return Err(NqnError::EmptyName);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Raw TOML tables

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    pollers: Option<RawPollers>,
    limits: Option<RawLimits>,
    metrics: Option<RawMetrics>,
    #[serde(default)]
    listener: Vec<RawListener>,
    #[serde(default)]
    subsystem: Vec<RawSubsystem>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPollers {
    count: Option<i64>,
    arena: Option<RawSize>,
    busy_poll: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    connections: Option<i64>,
    pending_connections: Option<i64>,
    associations_per_host: Option<i64>,
    queue_buffer: Option<RawSize>,
    association_buffer: Option<RawSize>,
    discovery_buffer: Option<RawSize>,
    handshake_timeout: Option<RawDuration>,
    enable_timeout: Option<RawDuration>,
    data_timeout: Option<RawDuration>,
    send_timeout: Option<RawDuration>,
    discovery_keep_alive: Option<RawDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListener {
    transport: Option<String>,
    address: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubsystem {
    nqn: Option<String>,
    #[serde(default)]
    allow_any_host: bool,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    host: Vec<RawHost>,
    #[serde(default)]
    namespace: Vec<RawNamespace>,
    cntlid_min: Option<i64>,
    cntlid_max: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    nqn: Option<String>,
    dhchap_secret: Option<String>,
    dhchap_secret_file: Option<PathBuf>,
    dhchap_ctrl_secret: Option<String>,
    dhchap_ctrl_secret_file: Option<PathBuf>,
    dhchap_hash: Option<Vec<String>>,
    dhchap_dhgroup: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNamespace {
    nsid: Option<i64>,
    backend: Option<String>,
    path: Option<String>,
    size: Option<RawSize>,
    block_size: Option<i64>,
    #[serde(default)]
    read_only: bool,
    pool: Option<String>,
    image: Option<String>,
    rbd_namespace: Option<String>,
    ceph_conf: Option<PathBuf>,
    client_id: Option<String>,
    keyring: Option<PathBuf>,
    timeout: Option<RawDuration>,
}

/// A size as written: a string with units, or an integer number of bytes.
#[derive(Debug)]
enum RawSize {
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
enum RawDuration {
    Seconds(i64),
    Text(String),
}

// ---------------------------------------------------------------------------
// Raw → model conversion (types, presence, parsing)

fn convert(raw: RawConfig) -> Result<Config, ConfigError> {
    let pollers = convert_pollers(raw.pollers.unwrap_or_default())?;
    let limits = convert_limits(raw.limits.unwrap_or_default())?;
    let metrics = convert_metrics(raw.metrics.unwrap_or_default())?;
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
    Ok(Config {
        pollers,
        listeners,
        subsystems,
        limits,
        metrics,
    })
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
        queue_buffer: size("queue_buffer", &raw.queue_buffer, d.queue_buffer)?,
        association_buffer: size(
            "association_buffer",
            &raw.association_buffer,
            d.association_buffer,
        )?,
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

/// A duration at `key`: a string with a unit, or whole seconds.
fn duration_value(key: &str, raw: &RawDuration) -> Result<Duration, ConfigError> {
    match raw {
        RawDuration::Seconds(n) => u64::try_from(*n)
            .map(Duration::from_secs)
            .map_err(|_| invalid(key, format!("{n} is negative; give e.g. \"30s\""))),
        RawDuration::Text(t) => units::parse_duration(t).map_err(|e| invalid(key, e.to_string())),
    }
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
    Ok(Pollers {
        count,
        arena_bytes,
        busy_poll: raw.busy_poll.unwrap_or(false),
    })
}

fn convert_listener(i: usize, raw: RawListener) -> Result<Listener, ConfigError> {
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
    Ok(Listener { transport, address })
}

fn convert_subsystem(i: usize, raw: RawSubsystem) -> Result<Subsystem, ConfigError> {
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
    let auth = raw
        .host
        .into_iter()
        .enumerate()
        .map(|(h, r)| convert_host(&format!("{key}.host[{h}]"), r))
        .collect::<Result<Vec<_>, _>>()?;
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
    Ok(Subsystem {
        nqn,
        allow_any_host: raw.allow_any_host,
        hosts: raw.hosts,
        auth,
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

/// A `[[subsystem.host]]` table: the secrets (inline or from a file, which
/// systemd credentials can supply), the hashes and DH groups.
fn convert_host(key: &str, raw: RawHost) -> Result<HostAuth, ConfigError> {
    let nqn = raw
        .nqn
        .ok_or_else(|| invalid(format!("{key}.nqn"), "missing; the host's NQN"))?;
    let secret = |name: &str, inline: Option<String>, file: Option<PathBuf>| {
        let text = match (inline, file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    format!("{key}.{name}"),
                    format!("given inline and as {name}_file; keep one"),
                ))
            }
            (Some(t), None) => t,
            (None, Some(path)) => {
                private_file(&path).map_err(|p| {
                    invalid(
                        format!("{key}.{name}_file"),
                        format!("{}: {p}", path.display()),
                    )
                })?;
                std::fs::read_to_string(&path).map_err(|e| {
                    invalid(
                        format!("{key}.{name}_file"),
                        format!("{}: {e}", path.display()),
                    )
                })?
            }
            (None, None) => return Ok(None),
        };
        Secret::parse(&text)
            .map(Some)
            .map_err(|e| invalid(format!("{key}.{name}"), e.to_string()))
    };
    let host_secret = secret("dhchap_secret", raw.dhchap_secret, raw.dhchap_secret_file)?
        .ok_or_else(|| {
            invalid(
                format!("{key}.dhchap_secret"),
                "missing; give the host's secret as `nvme gen-dhchap-key` prints it (DHHC-1:...),                  or dhchap_secret_file",
            )
        })?;
    let ctrl_secret = secret(
        "dhchap_ctrl_secret",
        raw.dhchap_ctrl_secret,
        raw.dhchap_ctrl_secret_file,
    )?;
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
    Ok(HostAuth {
        nqn,
        secret: host_secret,
        ctrl_secret,
        hashes,
        dh_groups,
    })
}

fn convert_namespace(
    subsystem_key: &str,
    j: usize,
    raw: RawNamespace,
) -> Result<Namespace, ConfigError> {
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
            Backend::File {
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
                Backend::Memory { size }
            } else {
                Backend::Null { size }
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
            Backend::Rbd(rbd::convert(&key, raw_rbd)?)
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
    Ok(Namespace {
        nsid,
        backend,
        block_size,
        read_only: raw.read_only,
    })
}

fn size_value(key: &str, raw: &RawSize) -> Result<u64, ConfigError> {
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

// ---------------------------------------------------------------------------
// Model validation

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
    if l.association_buffer < l.queue_buffer {
        return Err(invalid(
            "limits.association_buffer",
            format!(
                "{} is below limits.queue_buffer ({}); an association has at least one queue",
                units::format_size(l.association_buffer),
                units::format_size(l.queue_buffer)
            ),
        ));
    }
    Ok(())
}

fn validate_listeners(listeners: &[Listener]) -> Result<(), ConfigError> {
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

fn validate_hosts(key: &str, subsystem: &Subsystem) -> Result<(), ConfigError> {
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
    if !subsystem.allow_any_host && subsystem.hosts.is_empty() && subsystem.auth.is_empty() {
        return Err(invalid(
            format!("{key}.hosts"),
            "empty while allow_any_host = false, so no host could ever connect: \
             list host NQNs in hosts = [...] or set allow_any_host = true",
        ));
    }
    Ok(())
}

fn validate_namespaces(key: &str, namespaces: &[Namespace]) -> Result<(), ConfigError> {
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
            Backend::File { path, create_size } => {
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
            Backend::Memory { size } | Backend::Null { size } => {
                if let Some(problem) = size_problem(*size, ns.block_size) {
                    return Err(invalid(format!("{ns_key}.size"), problem));
                }
            }
            Backend::Rbd(image) => rbd::validate(&ns_key, image)?,
        }
    }
    Ok(())
}

/// Every RBD image of the configuration, with its namespace's key.
fn rbd_images(subsystems: &[Subsystem]) -> impl Iterator<Item = (String, &RbdImage)> {
    subsystems.iter().enumerate().flat_map(|(i, s)| {
        s.namespaces
            .iter()
            .enumerate()
            .filter_map(move |(j, ns)| match &ns.backend {
                Backend::Rbd(image) => Some((format!("subsystem[{i}].namespace[{j}]"), image)),
                _ => None,
            })
    })
}

fn check_subsystem_nqn(key: &str, nqn: &str) -> Result<(), ConfigError> {
    if nqn == DISCOVERY_NQN {
        return Err(invalid(
            key,
            format!(
                "{nqn:?} is the well-known discovery NQN, reserved for the discovery \
                 service; choose another NQN, e.g. \"{EXAMPLE_NQN}\""
            ),
        ));
    }
    validate_nqn(nqn)
        .map_err(|reason| invalid(key, format!("{nqn:?} is not a valid NQN: {reason}")))
}

// ---------------------------------------------------------------------------
// Helpers

fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

fn default_poller_count() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_POLLERS)
}

fn default_listener() -> Listener {
    Listener {
        transport: Transport::Tcp,
        address: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT),
    }
}

fn parse_transport(s: &str) -> Option<Transport> {
    if s.eq_ignore_ascii_case("tcp") {
        Some(Transport::Tcp)
    } else if s.eq_ignore_ascii_case("rdma") {
        Some(Transport::Rdma)
    } else {
        None
    }
}

/// Why [`parse_socket_addr`] (or [`port_problem`]) rejected an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum AddressError {
    /// The port is 0.
    #[error(
        "port 0 is not allowed; give a fixed port, usually {} (e.g. \"{suggestion}\")",
        DEFAULT_PORT
    )]
    PortZero {
        /// The same IP address with [`DEFAULT_PORT`].
        suggestion: SocketAddr,
    },
    /// An IP address without a port.
    #[error("{input:?} has no port; add one, e.g. \"{suggestion}\"")]
    NoPort {
        /// The text as given.
        input: String,
        /// The address with [`DEFAULT_PORT`].
        suggestion: SocketAddr,
    },
    /// Not an IP address (host names are not resolved), with or without a port.
    #[error(
        "{input:?} is not an IP address and port; use e.g. \"0.0.0.0:{port}\", \
         or \"[::1]:{port}\" for IPv6 (host names are not resolved)",
        port = DEFAULT_PORT
    )]
    NotAnAddress {
        /// The text as given.
        input: String,
    },
}

/// Parses `IP:PORT` (IPv6 in brackets); on error, returns the problem.
fn parse_socket_addr(s: &str) -> Result<SocketAddr, AddressError> {
    if let Ok(address) = s.parse::<SocketAddr>() {
        return match port_problem(&address) {
            Some(problem) => Err(problem),
            None => Ok(address),
        };
    }
    let unbracketed = s.trim_start_matches('[').trim_end_matches(']');
    Err(match unbracketed.parse::<IpAddr>() {
        Ok(ip) => AddressError::NoPort {
            input: s.into(),
            suggestion: SocketAddr::new(ip, DEFAULT_PORT),
        },
        Err(_) => AddressError::NotAnAddress { input: s.into() },
    })
}

fn port_problem(address: &SocketAddr) -> Option<AddressError> {
    (address.port() == 0).then(|| AddressError::PortZero {
        suggestion: SocketAddr::new(address.ip(), DEFAULT_PORT),
    })
}

/// Indices `(first, duplicate)` of the first repeated (transport, address).
fn find_duplicate_listener(listeners: &[Listener]) -> Option<(usize, usize)> {
    let mut seen: HashMap<&Listener, usize> = HashMap::new();
    for (i, listener) in listeners.iter().enumerate() {
        if let Some(&first) = seen.get(listener) {
            return Some((first, i));
        }
        seen.insert(listener, i);
    }
    None
}

fn listener_url(listener: &Listener) -> String {
    format!("{}://{}", listener.transport, listener.address)
}

fn quick_size(flag: &str, text: &str, block_size: u32) -> Result<u64, ConfigError> {
    let size = units::parse_size(text).map_err(|e| invalid(flag, e.to_string()))?;
    match size_problem(size, block_size) {
        Some(problem) => Err(invalid(flag, problem)),
        None => Ok(size),
    }
}

fn count_problem(count: impl fmt::Display) -> String {
    format!(
        "{count} is out of range; use 1 to {MAX_POLLERS} \
         (default: the number of online CPUs)"
    )
}

fn nsid_problem(nsid: impl fmt::Display) -> String {
    format!("{nsid} is out of range; use 1 to {MAX_NSID}")
}

fn block_size_problem(block_size: impl Into<i64>) -> Option<String> {
    let block_size = block_size.into();
    (!BLOCK_SIZES.iter().any(|&b| i64::from(b) == block_size))
        .then(|| format!("{block_size} is not a supported LBA size; use 512 or 4096"))
}

fn size_problem(size: u64, block_size: u32) -> Option<String> {
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

fn is_year_month(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 7
        || b[4] != b'-'
        || !b
            .iter()
            .enumerate()
            .all(|(i, c)| i == 4 || c.is_ascii_digit())
    {
        return false;
    }
    let month = (b[5] - b'0') * 10 + (b[6] - b'0');
    (1..=12).contains(&month)
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../config/target.toml");

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f15";

    /// A minimal valid config; `extra` is appended to the namespace table,
    /// `tail` after everything.
    fn minimal(extra: &str, tail: &str) -> String {
        format!(
            "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n\
             [[subsystem]]\nnqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nbackend = \"memory\"\nsize = \"1GiB\"\n{extra}\n{tail}"
        )
    }

    fn invalid_of(text: &str) -> (String, String) {
        match parse(text) {
            Err(ConfigError::Invalid { key, problem }) => (key, problem),
            other => panic!("expected Invalid, got {other:?}\n--- config ---\n{text}"),
        }
    }

    #[track_caller]
    pub(super) fn assert_invalid(text: &str, key: &str, problem_part: &str) {
        let (k, p) = invalid_of(text);
        assert_eq!(k, key, "problem was: {p}");
        assert!(
            p.contains(problem_part),
            "{k}: {p:?} lacks {problem_part:?}"
        );
    }

    #[track_caller]
    fn assert_syntax(text: &str, part: &str) {
        match parse(text) {
            Err(ConfigError::Syntax(msg)) => {
                assert!(msg.contains(part), "{msg:?} lacks {part:?}");
                assert!(msg.contains("line"), "keeps the location: {msg}");
            }
            other => panic!("expected Syntax, got {other:?}"),
        }
    }

    #[test]
    fn example_parses() {
        let config = parse(EXAMPLE).expect("shipped example must be valid");
        assert_eq!(
            config.listeners,
            vec![Listener {
                transport: Transport::Tcp,
                address: "0.0.0.0:4420".parse().unwrap(),
            }]
        );
        assert_eq!(config.pollers.arena_bytes, 64 << 20);
        assert!(!config.pollers.busy_poll);
        assert_eq!(config.metrics, Some("127.0.0.1:9469".parse().unwrap()));
        assert_eq!(
            config.limits,
            Limits::default(),
            "the example shows the defaults"
        );
        assert_eq!(config.subsystems.len(), 2);

        let disk = &config.subsystems[0];
        assert!(!disk.allow_any_host);
        assert!(!disk.hosts.is_empty());
        assert_eq!(disk.namespaces.len(), 1);
        assert_eq!(disk.namespaces[0].nsid, 1);
        assert_eq!(
            disk.namespaces[0].backend,
            Backend::File {
                path: PathBuf::from("/var/lib/rdmablk/disk0.img"),
                create_size: Some(10 << 30),
            }
        );

        let ramdisk = &config.subsystems[1];
        assert!(matches!(
            ramdisk.namespaces[0].backend,
            Backend::Memory { .. }
        ));
    }

    /// Only a secret given inline in a `[[subsystem.host]]` table makes the
    /// file itself secret: comments and `*_file` keys do not.
    #[test]
    fn inline_secrets_are_found_in_host_tables_only() {
        assert!(
            !holds_inline_secrets(EXAMPLE),
            "the example's secrets are comments"
        );
        let key = Secret::new(&[1; 32], None).to_dhhc1();
        let table = |k: &str| {
            minimal(
                "",
                &format!("[[subsystem.host]]\nnqn = \"{HOST}\"\n{k} = \"{key}\""),
            )
        };
        assert!(holds_inline_secrets(&table("dhchap_secret")));
        assert!(holds_inline_secrets(&table("dhchap_ctrl_secret")));
        assert!(!holds_inline_secrets(&table("dhchap_secret_file")));
    }

    /// Hashes and DH groups are checked by name, each error at its index.
    #[test]
    fn dhchap_names_are_checked() {
        let key = Secret::new(&[1; 32], None).to_dhhc1();
        let table = |extra: &str| {
            minimal(
                "",
                &format!(
                    "[[subsystem.host]]\nnqn = \"{HOST}\"\ndhchap_secret = \"{key}\"\n{extra}"
                ),
            )
        };
        let ok = parse(&table(
            "dhchap_hash = [\"sha512\"]\ndhchap_dhgroup = [\"null\"]",
        ))
        .expect("valid");
        assert_eq!(ok.subsystems[0].auth[0].hashes, vec![Hash::Sha512]);
        assert_eq!(ok.subsystems[0].auth[0].dh_groups, vec![DhGroup::Null]);
        assert_invalid(
            &table("dhchap_hash = [\"sha256\", \"md5\"]"),
            "subsystem[0].host[0].dhchap_hash[1]",
            "\"md5\": use \"sha256\"",
        );
        assert_invalid(
            &table("dhchap_dhgroup = [\"ffdhe1024\"]"),
            "subsystem[0].host[0].dhchap_dhgroup[0]",
            "use \"null\" or \"ffdhe2048\"",
        );
    }

    /// `[metrics] listen`: an address with a port, not an NVMe/TCP
    /// listener's; without it (or the table), no endpoint.
    #[test]
    fn metrics_rules() {
        assert_eq!(parse(&minimal("", "")).expect("valid").metrics, None);
        assert_eq!(
            parse(&minimal("", "[metrics]")).expect("valid").metrics,
            None
        );
        let on = parse(&minimal("", "[metrics]\nlisten = \"[::1]:9469\""))
            .expect("valid")
            .metrics;
        assert_eq!(on, Some("[::1]:9469".parse().unwrap()));
        for bad in ["localhost:9469", "127.0.0.1", "127.0.0.1:0", ""] {
            let text = minimal("", &format!("[metrics]\nlisten = {bad:?}"));
            assert_invalid(&text, "metrics.listen", "not an IP address with a port");
        }
        let clash = minimal("", "[metrics]\nlisten = \"0.0.0.0:4420\"");
        assert_invalid(
            &clash,
            "metrics.listen",
            "overlaps the NVMe/TCP listener on 127.0.0.1:4420",
        );
        let typo = minimal("", "[metrics]\naddress = \"127.0.0.1:9469\"");
        assert!(matches!(parse(&typo), Err(ConfigError::Syntax(_))));
    }

    #[test]
    fn example_mentions_rdma_listener() {
        assert!(EXAMPLE.contains("transport = \"rdma\""));
    }

    #[test]
    fn embedded_default_is_valid() {
        let config = embedded_default();
        config.validate().unwrap();
        assert_eq!(config.listeners, vec![default_listener()]);
        assert_eq!(config.listeners[0].address.to_string(), "127.0.0.1:4420");
        let subsystem = &config.subsystems[0];
        assert_eq!(subsystem.nqn, DEFAULT_NQN);
        assert!(subsystem.allow_any_host);
        assert_eq!(
            subsystem.namespaces,
            vec![Namespace {
                nsid: 1,
                backend: Backend::Memory { size: 1 << 30 },
                block_size: 512,
                read_only: false,
            }]
        );
        assert_eq!(config.pollers, Pollers::default());
        assert!(validate_nqn(DEFAULT_NQN).is_ok());
    }

    #[test]
    fn defaults_are_applied() {
        let config = parse(&minimal("", "")).unwrap();
        assert_eq!(config.pollers, Pollers::default());
        assert!((1..=MAX_POLLERS).contains(&config.pollers.count));
        let ns = &config.subsystems[0].namespaces[0];
        assert_eq!(ns.nsid, 1);
        assert_eq!(ns.block_size, 512);
        assert!(!ns.read_only);
        assert!(config.subsystems[0].hosts.is_empty());
    }

    #[test]
    fn positional_nsids_and_explicit_values() {
        let text = minimal(
            "block_size = 4096\nread_only = true",
            "[[subsystem.namespace]]\nbackend = \"null\"\nsize = 1048576\n\
             [[subsystem.namespace]]\nnsid = 7\nbackend = \"file\"\npath = \"/dev/null\"\n\
             [pollers]\ncount = 3\narena = 8388608\nbusy_poll = true\n\
             [[listener]]\ntransport = \"RDMA\"\naddress = \"[::1]:4420\"",
        );
        let config = parse(&text).unwrap();
        assert_eq!(
            config.pollers,
            Pollers {
                count: 3,
                arena_bytes: 8 << 20,
                busy_poll: true,
            }
        );
        assert_eq!(config.listeners[1].transport, Transport::Rdma);
        assert_eq!(config.listeners[1].address.to_string(), "[::1]:4420");
        let ns = &config.subsystems[0].namespaces;
        assert_eq!(
            (ns[0].nsid, ns[0].block_size, ns[0].read_only),
            (1, 4096, true)
        );
        assert_eq!(ns[1].nsid, 2);
        assert_eq!(ns[1].backend, Backend::Null { size: 1 << 20 });
        assert_eq!(ns[2].nsid, 7);
        assert_eq!(
            ns[2].backend,
            Backend::File {
                path: PathBuf::from("/dev/null"),
                create_size: None,
            }
        );
    }

    #[test]
    fn transport_display() {
        assert_eq!(Transport::Tcp.to_string(), "tcp");
        assert_eq!(Transport::Rdma.to_string(), "rdma");
    }

    #[test]
    fn error_display_reads_key_colon_problem() {
        let text = minimal(
            "",
            "[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\nblock_size = 1000",
        );
        assert_eq!(
            parse(&text).unwrap_err().to_string(),
            "subsystem[0].namespace[1].block_size: 1000 is not a supported LBA size; use 512 or 4096"
        );
    }

    // --- listeners ---

    #[test]
    fn listener_rules() {
        let subsystem =
            "[[subsystem]]\nnqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true\n\
                         [[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\n";
        assert_invalid(subsystem, "listener", "no listener");

        let dup = minimal(
            "",
            "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"",
        );
        assert_invalid(&dup, "listener[1]", "duplicates listener[0]");
        let same_addr_other_transport = minimal(
            "",
            "[[listener]]\ntransport = \"rdma\"\naddress = \"127.0.0.1:4420\"",
        );
        assert!(parse(&same_addr_other_transport).is_ok());

        for (listener, key, part) in [
            (
                "transport = \"udp\"\naddress = \"1.2.3.4:4420\"",
                "listener[1].transport",
                "\"tcp\" or \"rdma\"",
            ),
            (
                "address = \"1.2.3.4:4420\"",
                "listener[1].transport",
                "missing",
            ),
            ("transport = \"tcp\"", "listener[1].address", "missing"),
            (
                "transport = \"tcp\"\naddress = \"localhost:4420\"",
                "listener[1].address",
                "host names",
            ),
            (
                "transport = \"tcp\"\naddress = \"10.0.0.1\"",
                "listener[1].address",
                "\"10.0.0.1:4420\"",
            ),
            (
                "transport = \"tcp\"\naddress = \"::1\"",
                "listener[1].address",
                "\"[::1]:4420\"",
            ),
            (
                "transport = \"tcp\"\naddress = \"::1:4420\"",
                "listener[1].address",
                "no port",
            ),
            (
                "transport = \"tcp\"\naddress = \"1.2.3.4:0\"",
                "listener[1].address",
                "port 0",
            ),
        ] {
            assert_invalid(
                &minimal("", &format!("[[listener]]\n{listener}")),
                key,
                part,
            );
        }
    }

    // --- subsystems and NQNs ---

    #[test]
    fn subsystem_rules() {
        let listener_only = "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n";
        assert_invalid(listener_only, "subsystem", "no subsystem");

        let second = |body: &str| {
            minimal(
                "",
                &format!(
                    "[[subsystem]]\n{body}\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\""
                ),
            )
        };
        assert_invalid(
            &second("nqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true"),
            "subsystem[1].nqn",
            "already used by subsystem[0]",
        );
        assert_invalid(
            &second(&format!("nqn = \"{DISCOVERY_NQN}\"\nallow_any_host = true")),
            "subsystem[1].nqn",
            "discovery",
        );
        assert_invalid(
            &second("nqn = \"iqn.2026-11.io.example:a\"\nallow_any_host = true"),
            "subsystem[1].nqn",
            "not a valid NQN",
        );
        assert_invalid(
            &second("allow_any_host = true"),
            "subsystem[1].nqn",
            "missing",
        );
        assert_invalid(
            &second("nqn = \"nqn.2026-11.io.example:b\""),
            "subsystem[1].hosts",
            "no host could ever connect: list host NQNs in hosts = [...] or set allow_any_host = true",
        );
        assert_invalid(
            &second(&format!(
                "nqn = \"nqn.2026-11.io.example:b\"\nhosts = [\"{HOST}\", \"host1\"]"
            )),
            "subsystem[1].hosts[1]",
            "not a valid host NQN",
        );
        assert!(parse(&second(&format!(
            "nqn = \"nqn.2026-11.io.example:b\"\nhosts = [\"{HOST}\"]"
        )))
        .is_ok());

        let no_namespace = minimal(
            "",
            "[[subsystem]]\nnqn = \"nqn.2026-11.io.example:b\"\nallow_any_host = true",
        );
        assert_invalid(&no_namespace, "subsystem[1].namespace", "no namespace");
    }

    #[test]
    fn nqn_syntax() {
        for good in [
            "nqn.2026-11.io.rdmablk:disk0",
            "nqn.2014-08.com.example:nvme:nvm-subsystem-sn-d78432",
            "nqn.1999-01.io:x",
            "nqn.2026-11.a-b.c0:name with spaces and ünïcode",
            HOST,
            "nqn.2014-08.org.nvmexpress:uuid:3F2A9C1E-5B7D-4E08-9A61-0C4D2B8E7F15",
            DEFAULT_NQN,
        ] {
            assert_eq!(validate_nqn(good), Ok(()), "{good}");
        }
        let exactly_max = format!("nqn.2026-11.io.example:{}", "x".repeat(223 - 23));
        assert_eq!(exactly_max.len(), 223);
        assert_eq!(validate_nqn(&exactly_max), Ok(()));

        for (bad, reason_part) in [
            (format!("{exactly_max}x"), "at most 223 bytes"),
            ("".to_owned(), "\"nqn.\""),
            ("iqn.2026-11.io.example:a".to_owned(), "\"nqn.\""),
            ("nqn.2026-13.io.example:a".to_owned(), "YYYY-MM"),
            ("nqn.2026-00.io.example:a".to_owned(), "YYYY-MM"),
            ("nqn.26-11.io.example:a".to_owned(), "YYYY-MM"),
            ("nqn.2026-1.io.example:a".to_owned(), "YYYY-MM"),
            ("nqn.2026-11:a".to_owned(), "reverse domain"),
            ("nqn.2026".to_owned(), "YYYY-MM"),
            ("nqn.2026-11.io.example".to_owned(), "no ':'"),
            (DISCOVERY_NQN.to_owned(), "no ':'"),
            ("nqn.2026-11.:a".to_owned(), "domain"),
            ("nqn.2026-11.io..example:a".to_owned(), "domain"),
            ("nqn.2026-11.IO.Example:a".to_owned(), "lowercase"),
            ("nqn.2026-11.io_example:a".to_owned(), "domain"),
            ("nqn.2026-11.io.example:".to_owned(), "empty"),
            ("nqn.2026-11.io.example:a\0b".to_owned(), "control"),
            (format!("{NQN_UUID_PREFIX}3f2a9c1e-5b7d-4e08-9a61"), "UUID"),
            (
                format!("{NQN_UUID_PREFIX}3f2a9c1e5b7d4e089a610c4d2b8e7f15"),
                "UUID",
            ),
            (
                format!("{NQN_UUID_PREFIX}3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f1g"),
                "UUID",
            ),
            (
                format!("{NQN_UUID_PREFIX}3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f15-"),
                "UUID",
            ),
            (NQN_UUID_PREFIX.to_owned(), "UUID"),
        ] {
            let reason = validate_nqn(&bad).expect_err(&bad).to_string();
            assert!(reason.contains(reason_part), "{bad:?}: {reason:?}");
        }
    }

    /// The typed reasons and their exact texts: daemon error messages and
    /// operators' scripts depend on these words.
    #[test]
    fn nqn_and_address_reason_texts() {
        const FORMS: &str = "expected nqn.YYYY-MM.reverse.domain:name \
                             (e.g. nqn.2026-11.io.example:disk0) \
                             or nqn.2014-08.org.nvmexpress:uuid:<8-4-4-4-12 hex UUID>";
        let too_long = format!("nqn.2026-11.io.example:{}", "x".repeat(201));
        for (nqn, error, reason) in [
            (
                too_long.as_str(),
                NqnError::TooLong { len: 224 },
                "it is 224 bytes long; an NQN may be at most 223 bytes".to_owned(),
            ),
            (
                "nqn.2026-11.io.example:a\0b",
                NqnError::ControlCharacter,
                "it contains a control character".to_owned(),
            ),
            (
                "nqn.2014-08.org.nvmexpress:uuid:xyz",
                NqnError::BadUuid { uuid: "xyz".into() },
                "\"xyz\" after \"uuid:\" is not a UUID in 8-4-4-4-12 hex form \
                 (e.g. 3f2a9c1e-5b7d-4e08-9a61-0c4d2b8e7f15)"
                    .to_owned(),
            ),
            (
                "iqn.2026-11.io.example:a",
                NqnError::MissingPrefix,
                format!("it does not start with \"nqn.\"; {FORMS}"),
            ),
            (
                "nqn.2026-13.io.example:a",
                NqnError::BadDate {
                    date: "2026-13".into(),
                },
                format!("\"2026-13\" after \"nqn.\" is not a year-month date YYYY-MM; {FORMS}"),
            ),
            (
                "nqn.2026-11:a",
                NqnError::MissingDomain,
                format!("the date must be followed by \".\" and a reverse domain name; {FORMS}"),
            ),
            (
                "nqn.2026-11.io.example",
                NqnError::MissingName,
                format!("there is no ':' followed by a name after the domain; {FORMS}"),
            ),
            (
                "nqn.2026-11.IO.Example:a",
                NqnError::BadDomain {
                    domain: "IO.Example".into(),
                },
                format!(
                    "domain \"IO.Example\" is not a reverse domain name: it needs one or more \
                     labels of lowercase letters, digits and '-' separated by single dots; \
                     {FORMS}"
                ),
            ),
            (
                "nqn.2026-11.io.example:",
                NqnError::EmptyName,
                format!("the name after ':' is empty; {FORMS}"),
            ),
        ] {
            let got = validate_nqn(nqn).expect_err(nqn);
            assert_eq!(got, error, "{nqn:?}");
            assert_eq!(got.to_string(), reason, "{nqn:?}");
        }

        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        for (address, error, problem) in [
            (
                "127.0.0.1:0",
                AddressError::PortZero {
                    suggestion: addr("127.0.0.1:4420"),
                },
                "port 0 is not allowed; give a fixed port, usually 4420 (e.g. \"127.0.0.1:4420\")",
            ),
            (
                "[::1]:0",
                AddressError::PortZero {
                    suggestion: addr("[::1]:4420"),
                },
                "port 0 is not allowed; give a fixed port, usually 4420 (e.g. \"[::1]:4420\")",
            ),
            (
                "10.0.0.1",
                AddressError::NoPort {
                    input: "10.0.0.1".into(),
                    suggestion: addr("10.0.0.1:4420"),
                },
                "\"10.0.0.1\" has no port; add one, e.g. \"10.0.0.1:4420\"",
            ),
            (
                "[fe80::1]",
                AddressError::NoPort {
                    input: "[fe80::1]".into(),
                    suggestion: addr("[fe80::1]:4420"),
                },
                "\"[fe80::1]\" has no port; add one, e.g. \"[fe80::1]:4420\"",
            ),
            (
                "::1:4420",
                AddressError::NoPort {
                    input: "::1:4420".into(),
                    suggestion: addr("[::1:4420]:4420"),
                },
                "\"::1:4420\" has no port; add one, e.g. \"[::1:4420]:4420\"",
            ),
            (
                "localhost:4420",
                AddressError::NotAnAddress {
                    input: "localhost:4420".into(),
                },
                "\"localhost:4420\" is not an IP address and port; use e.g. \
                 \"0.0.0.0:4420\", or \"[::1]:4420\" for IPv6 (host names are not resolved)",
            ),
        ] {
            let got = parse_socket_addr(address).expect_err(address);
            assert_eq!(got, error, "{address:?}");
            assert_eq!(got.to_string(), problem, "{address:?}");
        }
        assert_eq!(parse_socket_addr("[::]:4420"), Ok(addr("[::]:4420")));
    }

    // --- namespaces ---

    #[test]
    fn namespace_rules() {
        let ns = "subsystem[0].namespace[0]";
        for (extra, key, part) in [
            ("nsid = 0", "nsid", "1 to 1024"),
            ("nsid = 1025", "nsid", "1 to 1024"),
            ("nsid = -1", "nsid", "1 to 1024"),
            ("block_size = 1000", "block_size", "use 512 or 4096"),
            ("block_size = -512", "block_size", "use 512 or 4096"),
            ("block_size = 8192", "block_size", "use 512 or 4096"),
        ] {
            assert_invalid(&minimal(extra, ""), &format!("{ns}.{key}"), part);
        }

        let namespace = |body: &str| {
            let text = "[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n\
                        [[subsystem]]\nnqn = \"nqn.2026-11.io.example:a\"\nallow_any_host = true\n\
                        [[subsystem.namespace]]\n";
            format!("{text}{body}")
        };
        for (body, key, part) in [
            ("size = \"1GiB\"", "backend", "missing"),
            ("backend = \"disk\"\nsize = \"1GiB\"", "backend", "\"file\""),
            ("backend = \"file\"", "path", "missing"),
            ("backend = \"file\"\npath = \"\"", "path", "empty"),
            (
                "backend = \"file\"\npath = \"/x\"\nsize = 1000",
                "size",
                "multiple of block_size 512",
            ),
            (
                "backend = \"file\"\npath = \"/x\"\nsize = 0",
                "size",
                "greater than 0",
            ),
            ("backend = \"memory\"", "size", "missing"),
            ("backend = \"null\"", "size", "missing"),
            (
                "backend = \"memory\"\nsize = \"1GiB\"\npath = \"/x\"",
                "path",
                "only backend = \"file\"",
            ),
            ("backend = \"null\"\nsize = \"0\"", "size", "greater than 0"),
            (
                "backend = \"null\"\nsize = \"1GiB\"\nblock_size = 4096",
                "",
                "",
            ),
            (
                "backend = \"memory\"\nsize = \"6k\"\nblock_size = 4096",
                "size",
                "\"4KiB\"",
            ),
            ("backend = \"memory\"\nsize = 513", "size", "not a multiple"),
            ("backend = \"memory\"\nsize = -4096", "size", "negative"),
            (
                "backend = \"memory\"\nsize = \"1.5GiB\"",
                "size",
                "whole number",
            ),
            (
                "backend = \"memory\"\nsize = \"1GB\"",
                "size",
                "unknown unit",
            ),
        ] {
            let text = namespace(body);
            if key.is_empty() {
                assert!(parse(&text).is_ok(), "{body}");
            } else {
                assert_invalid(&text, &format!("{ns}.{key}"), part);
            }
        }
    }

    #[test]
    fn duplicate_nsids_are_rejected() {
        let explicit = minimal(
            "nsid = 3",
            "[[subsystem.namespace]]\nnsid = 3\nbackend = \"null\"\nsize = \"1GiB\"",
        );
        assert_invalid(
            &explicit,
            "subsystem[0].namespace[1].nsid",
            "nsid 3 is already used by subsystem[0].namespace[0]",
        );
        // An explicit nsid colliding with a later namespace's positional default.
        let positional = minimal(
            "nsid = 2",
            "[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"",
        );
        assert_invalid(
            &positional,
            "subsystem[0].namespace[1].nsid",
            "already used",
        );
    }

    // --- pollers ---

    #[test]
    fn poller_rules() {
        for (pollers, part) in [
            ("count = 0", "1 to 256"),
            ("count = 257", "1 to 256"),
            ("count = -3", "1 to 256"),
            ("arena = \"2MiB\"", "minimum of 4MiB"),
            ("arena = 4194303", "minimum"),
            ("arena = \"4098k\"", "multiple of 4KiB"),
            ("arena = \"64 furlongs\"", "unknown unit"),
            ("arena = -1", "negative"),
        ] {
            let key = if pollers.starts_with("count") {
                "pollers.count"
            } else {
                "pollers.arena"
            };
            assert_invalid(&minimal("", &format!("[pollers]\n{pollers}")), key, part);
        }
        let ok = parse(&minimal("", "[pollers]\ncount = 256\narena = \"4MiB\"")).unwrap();
        assert_eq!((ok.pollers.count, ok.pollers.arena_bytes), (256, 4 << 20));
    }

    #[test]
    fn one_host_holding_every_arena_is_a_warning() {
        let mut cfg = parse(&minimal("", "[pollers]\ncount = 2\narena = \"64MiB\"")).unwrap();
        assert!(cfg.warnings().is_empty(), "defaults: 16 x 8MiB = 2 x 64MiB");
        cfg.pollers.count = 1;
        let w = cfg.warnings();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("limits.associations_per_host 16"), "{}", w[0]);
    }

    #[test]
    fn limit_rules() {
        for (limits, key, part) in [
            ("connections = 0", "limits.connections", "at least 1"),
            (
                "queue_buffer = \"512KiB\"",
                "limits.queue_buffer",
                "largest transfer",
            ),
            (
                "queue_buffer = \"128MiB\"",
                "limits.queue_buffer",
                "pollers.arena",
            ),
            (
                "discovery_buffer = \"4KiB\"",
                "limits.discovery_buffer",
                "256KiB",
            ),
            (
                "queue_buffer = \"8MiB\"\nassociation_buffer = \"4MiB\"",
                "limits.association_buffer",
                "queue_buffer",
            ),
            ("send_timeout = \"10ms\"", "limits.send_timeout", "100ms"),
            ("data_timeout = -1", "limits.data_timeout", "negative"),
            (
                "enable_timeout = \"3 fortnights\"",
                "limits.enable_timeout",
                "unit",
            ),
        ] {
            assert_invalid(&minimal("", &format!("[limits]\n{limits}")), key, part);
        }
        let ok = parse(&minimal(
            "",
            "[limits]\nsend_timeout = \"1500ms\"\ndata_timeout = 7\nconnections = 3",
        ))
        .unwrap();
        assert_eq!(ok.limits.send_timeout, Duration::from_millis(1500));
        assert_eq!(ok.limits.data_timeout, Duration::from_secs(7));
        assert_eq!(ok.limits.connections, 3);
        assert_eq!(ok.limits.queue_buffer, Limits::default().queue_buffer);
        assert_syntax(&minimal("", "[limits]\nconections = 3"), "conections");
    }

    // --- TOML-level errors ---

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        assert_syntax(&format!("colour = \"blue\"\n{}", minimal("", "")), "colour");
        assert_syntax(&minimal("", "colour = \"blue\""), "colour");
        assert_syntax(
            &minimal("", "[[listeners]]\ntransport = \"tcp\""),
            "listeners",
        );
        assert_syntax(&minimal("", "[pollers]\nthreads = 4"), "threads");
        assert_syntax(
            &minimal(
                "",
                "[[listener]]\ntransport = \"tcp\"\naddress = \"1.2.3.4:1\"\nport = 1",
            ),
            "port",
        );
        assert_syntax(
            &minimal(
                "",
                "[[subsystem]]\nnqn = \"nqn.2026-11.io.example:b\"\nallow_any_hosts = true",
            ),
            "allow_any_hosts",
        );
        assert_syntax(&minimal("blocksize = 4096", ""), "blocksize");
    }

    #[test]
    fn toml_errors_keep_line_and_column() {
        let text = minimal("size = ", "");
        match parse(&text) {
            Err(ConfigError::Syntax(msg)) => {
                assert!(msg.contains("line 10"), "{msg}");
                assert!(msg.contains("column"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        assert_syntax(&minimal("read_only = \"yes\"", ""), "read_only");
        assert_syntax(
            &minimal(
                "",
                "[[subsystem.namespace]]\nbackend = \"null\"\nsize = 1.5",
            ),
            "integer number of bytes",
        );
        assert_syntax("[[listener]\n", "line");
    }

    // --- load ---

    #[test]
    fn load_reads_the_file_and_names_it_on_error() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("rdmablk-config-test-{}.toml", std::process::id()));
        std::fs::write(&path, EXAMPLE).unwrap();
        let loaded = load(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(loaded.unwrap(), parse(EXAMPLE).unwrap());

        let missing = dir.join("rdmablk-config-test-does-not-exist.toml");
        let err = load(&missing).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }));
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
    }

    // --- quick form ---

    fn quick(f: impl FnOnce(&mut QuickArgs)) -> Result<Config, ConfigError> {
        let mut q = QuickArgs::default();
        f(&mut q);
        from_quick_args(&q)
    }

    #[track_caller]
    fn assert_quick_invalid(f: impl FnOnce(&mut QuickArgs), key: &str, part: &str) {
        match quick(f) {
            Err(ConfigError::Invalid { key: k, problem }) => {
                assert_eq!(k, key, "{problem}");
                assert!(problem.contains(part), "{problem:?} lacks {part:?}");
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn quick_memory_defaults() {
        let config = quick(|q| q.memory = Some("1GiB".into())).unwrap();
        assert_eq!(config, embedded_default());
    }

    #[test]
    fn quick_file_over_rdma_with_nqn() {
        let config = quick(|q| {
            q.listen = vec!["rdma://10.0.0.1:4420".into(), "tcp://[::1]:4421".into()];
            q.file = Some(PathBuf::from("/dev/nvme0n1"));
            q.nqn = Some("nqn.2026-11.io.example:fast".into());
            q.block_size = Some(4096);
        })
        .unwrap();
        assert_eq!(
            config.listeners,
            vec![
                Listener {
                    transport: Transport::Rdma,
                    address: "10.0.0.1:4420".parse().unwrap(),
                },
                Listener {
                    transport: Transport::Tcp,
                    address: "[::1]:4421".parse().unwrap(),
                },
            ]
        );
        let subsystem = &config.subsystems[0];
        assert_eq!(subsystem.nqn, "nqn.2026-11.io.example:fast");
        assert!(subsystem.allow_any_host);
        assert_eq!(
            subsystem.namespaces,
            vec![Namespace {
                nsid: 1,
                backend: Backend::File {
                    path: PathBuf::from("/dev/nvme0n1"),
                    create_size: None,
                },
                block_size: 4096,
                read_only: false,
            }]
        );
    }

    #[test]
    fn quick_null() {
        let config = quick(|q| q.null = Some("2g".into())).unwrap();
        assert_eq!(
            config.subsystems[0].namespaces[0].backend,
            Backend::Null { size: 2 << 30 }
        );
    }

    #[test]
    fn quick_errors() {
        assert_quick_invalid(|_| {}, "--memory/--file/--null/--rbd", "exactly one");
        assert_quick_invalid(
            |q| {
                q.memory = Some("1GiB".into());
                q.null = Some("1GiB".into());
            },
            "--memory/--file/--null/--rbd",
            "--memory and --null were given together",
        );
        assert_quick_invalid(
            |q| {
                q.memory = Some("1GiB".into());
                q.file = Some("/x".into());
                q.null = Some("1GiB".into());
            },
            "--memory/--file/--null/--rbd",
            "--memory and --file and --null",
        );
        assert_quick_invalid(
            |q| q.memory = Some("1 gigabyte".into()),
            "--memory",
            "unknown unit",
        );
        assert_quick_invalid(|q| q.null = Some("0".into()), "--null", "greater than 0");
        assert_quick_invalid(
            |q| {
                q.memory = Some("6k".into());
                q.block_size = Some(4096);
            },
            "--memory",
            "multiple of block_size 4096",
        );
        assert_quick_invalid(|q| q.file = Some(PathBuf::new()), "--file", "empty path");
        assert_quick_invalid(
            |q| {
                q.memory = Some("1GiB".into());
                q.block_size = Some(1024);
            },
            "--block-size",
            "512 or 4096",
        );
        assert_quick_invalid(
            |q| {
                q.memory = Some("1GiB".into());
                q.nqn = Some("disk0".into());
            },
            "--nqn",
            "not a valid NQN",
        );
        assert_quick_invalid(
            |q| {
                q.memory = Some("1GiB".into());
                q.nqn = Some(DISCOVERY_NQN.into());
            },
            "--nqn",
            "discovery",
        );
        assert_quick_invalid(
            |q| {
                q.memory = Some("1GiB".into());
                q.listen = vec!["tcp://127.0.0.1:4420".into(), "tcp://127.0.0.1:4420".into()];
            },
            "--listen",
            "given twice",
        );
    }

    #[test]
    fn listen_urls() {
        let l = parse_listen_url("tcp://127.0.0.1:4420").unwrap();
        assert_eq!(
            (l.transport, l.address.to_string().as_str()),
            (Transport::Tcp, "127.0.0.1:4420")
        );
        let l = parse_listen_url("rdma://[fe80::1]:4420").unwrap();
        assert_eq!((l.transport, l.address.port()), (Transport::Rdma, 4420));

        for (url, part) in [
            ("127.0.0.1:4420", "not a listen URL"),
            ("udp://127.0.0.1:4420", "unknown transport \"udp\""),
            ("tcp://127.0.0.1", "no port"),
            ("tcp://localhost:4420", "host names"),
            ("tcp://127.0.0.1:4420/", "not an IP address and port"),
            ("tcp://127.0.0.1:0", "port 0"),
            ("", "not a listen URL"),
        ] {
            match parse_listen_url(url) {
                Err(ConfigError::Invalid { key, problem }) => {
                    assert_eq!(key, "--listen");
                    assert!(problem.contains(part), "{url}: {problem:?}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
