//! The validated configuration: the types the rest of the daemon reads.

use super::rbd::RbdImage;
use rdmablk_common::auth::{DhGroup, Hash, Secret};
use rdmablk_common::spin::{PollMode, SpinBounds};
use rdmablk_common::tls::key::{ConfiguredKey, Labels};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Per-poller arena when `[pollers] arena` is not given.
pub(super) const DEFAULT_ARENA_BYTES: u64 = 64 << 20;
/// Most poller threads.
pub(super) const MAX_POLLERS: usize = 256;
/// LBA size when a namespace gives none.
pub(super) const DEFAULT_BLOCK_SIZE: u32 = 512;
/// Highest controller id of the dynamic controller model (NVMe Base 2.1,
/// 3.1.1: FFF0h and up are reserved).
pub const MAX_CNTLID: u16 = 0xffef;
/// Highest namespace id (and Identify NN, MNAN): as nvmet.
pub const MAX_NSID: u32 = 1024;
/// Highest ANA group id (Identify ANAGRPMAX, NANAGRPID): as nvmet.
pub const MAX_ANA_GROUP: u32 = 128;

/// A complete, validated target configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// I/O poller threads.
    pub pollers: Pollers,
    /// Addresses the target accepts connections on (at least one).
    pub listeners: Vec<ListenerConfig>,
    /// Exported NVM subsystems (at least one, unique NQNs).
    pub subsystems: Vec<SubsystemConfig>,
    /// What hosts may hold, and how long the target waits for them.
    pub limits: Limits,
    /// Where the Prometheus metrics endpoint listens (`[metrics] listen`);
    /// off when `None`.
    pub metrics: Option<SocketAddr>,
    /// Where namespaces keep their reservations through power loss
    /// (`[reservations] state_directory`).
    pub state_directory: PathBuf,
    /// The gateway group this gateway takes part in (`[gateway_group]`):
    /// ANA states then follow the group's leases.
    pub gateway_group: Option<GatewayGroup>,
}

/// Where reservation state files live when the configuration names no place.
pub const DEFAULT_STATE_DIRECTORY: &str = "/var/lib/rdmablk/reservations";

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
    /// TLS handshakes in progress at once (each on a thread of its own,
    /// within `handshake_timeout`); connections beyond are closed at once.
    pub tls_handshakes: usize,
    /// Arena bytes one queue may hold for its commands' data.
    pub queue_buffer: u64,
    /// Arena bytes all queues of one association may hold together, as
    /// written; none: sized from the pollers' arenas
    /// ([`Limits::association_buffer`]).
    pub association_buffer: Option<u64>,
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

/// The association buffer when the file gives none: so much, or less where
/// the pollers' arenas are fewer than `associations_per_host` of it.
pub const DEFAULT_ASSOCIATION_BUFFER: u64 = 8 << 20;

impl Limits {
    /// Arena bytes all queues of one association may hold together: as
    /// written, or by default so that one host's `associations_per_host`
    /// fit in `arenas` (all pollers' arenas), at most
    /// DEFAULT_ASSOCIATION_BUFFER and at least `queue_buffer`. One poller's
    /// 64 MiB shared by 16 associations gives 4 MiB each.
    pub fn association_buffer(&self, arenas: u64) -> u64 {
        self.association_buffer.unwrap_or_else(|| {
            (arenas / self.associations_per_host.max(1) as u64).clamp(
                self.queue_buffer,
                DEFAULT_ASSOCIATION_BUFFER.max(self.queue_buffer),
            )
        })
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 4096,
            pending_connections: 512,
            associations_per_host: 16,
            tls_handshakes: 64,
            queue_buffer: 4 << 20,
            association_buffer: None,
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
    /// Without `busy_poll`: the adaptive window a poller keeps polling for
    /// after its last work before it sleeps.
    pub spin: SpinBounds,
}

impl Pollers {
    /// The bytes of all their arenas.
    pub fn arenas(&self) -> u64 {
        self.count as u64 * self.arena_bytes
    }

    /// How the pollers wait for work.
    pub fn mode(&self) -> PollMode {
        if self.busy_poll {
            PollMode::Busy
        } else {
            PollMode::Adaptive(self.spin)
        }
    }
}

/// A gateway group, as this gateway takes part in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayGroup {
    /// The group's name: gateways with the same name share ANA groups.
    pub name: String,
    /// This gateway's name, unique in the group.
    pub gateway: String,
    /// The pool that holds the group's lease objects.
    pub pool: String,
    pub ceph_conf: PathBuf,
    pub client_id: String,
    pub keyring: Option<PathBuf>,
    /// How long an owner holds an ANA group without renewing.
    pub lease: Duration,
    /// How long a preferred owner is back before it takes its group back.
    pub failback_delay: Duration,
    /// The preferred owner of each ANA group named.
    pub preferred: BTreeMap<u32, String>,
}

/// One listening address (`[[listener]]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenerConfig {
    /// Fabric transport.
    pub transport: Transport,
    /// IP address and port to listen on.
    pub address: SocketAddr,
    /// ANA states this listener reports, by ANA group (`ana_groups`);
    /// groups not named are optimized. Never the transitional `change`.
    pub ana_groups: BTreeMap<u32, AnaState>,
    /// Whether its connections speak TLS (`tls`; NVMe/TCP only).
    pub tls: ListenerTls,
}

/// Whether a listener's connections speak TLS 1.3 (NVMe/TCP 1.1, 3.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ListenerTls {
    /// Plaintext only.
    #[default]
    Off,
    /// TLS only: a plaintext ICReq ends the connection.
    Required,
    /// Both: a connection that opens with a TLS ClientHello speaks TLS.
    Optional,
}

impl ListenerTls {
    /// Its name in the configuration ("off" when not set).
    pub fn name(self) -> &'static str {
        match self {
            ListenerTls::Off => "off",
            ListenerTls::Required => "required",
            ListenerTls::Optional => "optional",
        }
    }
}

impl ListenerConfig {
    /// A listener on `address` with every ANA group optimized.
    pub fn new(transport: Transport, address: SocketAddr) -> Self {
        ListenerConfig {
            transport,
            address,
            ana_groups: BTreeMap::new(),
            tls: ListenerTls::Off,
        }
    }

    /// What identifies the listener: a reload keeps a listener whose
    /// transport and address stay, whatever its ANA states.
    pub fn endpoint(&self) -> (Transport, SocketAddr) {
        (self.transport, self.address)
    }

    /// The state it reports for ANA group `group`.
    pub fn ana_state(&self, group: u32) -> AnaState {
        self.ana_groups
            .get(&group)
            .copied()
            .unwrap_or(AnaState::Optimized)
    }
}

/// An ANA group's state on a path.
pub use rdmablk_common::nvme::ana::AnaState;

/// NVMe-oF transport of a listener: the one type host and target share.
pub use rdmablk_common::fabrics::Transport;

/// One exported NVM subsystem (`[[subsystem]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// NVMe Qualified Name, unique among subsystems.
    pub nqn: String,
    /// Let any host connect, ignoring `hosts`.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect when `allow_any_host` is false.
    pub hosts: Vec<String>,
    /// Hosts that must authenticate (`[[subsystem.host]]` with a
    /// `dhchap_secret`); they are allowed to connect, authenticated.
    pub auth: Vec<HostAuth>,
    /// Hosts' TLS keys (`[[subsystem.host]]` with a `tls_key`); they are
    /// allowed to connect.
    pub tls_keys: Vec<HostTlsKey>,
    /// Namespaces (at least one, unique nsids).
    pub namespaces: Vec<NamespaceConfig>,
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

/// A host's configured TLS PSK (`tls_key` or `tls_key_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTlsKey {
    pub nqn: String,
    pub key: ConfiguredKey,
    /// How its PSKs are derived (`tls_key_legacy`: as libnvme before 1.16
    /// and `nvme gen-tls-key --compat` did).
    pub labels: Labels,
}

/// One namespace of a subsystem (`[[subsystem.namespace]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Namespace ID, 1 to 1024, unique within the subsystem.
    pub nsid: u32,
    /// Where the data lives.
    pub backend: BackendConfig,
    /// LBA size in bytes: 512 or 4096.
    pub block_size: u32,
    /// Reject writes.
    pub read_only: bool,
    /// Its ANA group, 1 to [`MAX_ANA_GROUP`] (`ana_group`, default 1).
    pub ana_group: u32,
    /// Whether it takes reservations (`reservations`, default true): a
    /// namespace that another gateway outside a gateway group also serves
    /// must not, as its registrations would not be shared.
    pub reservations: bool,
    /// The hosts that see it (`hosts`); `None`: every host allowed on the
    /// subsystem.
    pub hosts: Option<Vec<String>>,
    /// Its limits, all hosts together (`qos`).
    pub qos: QosLimits,
    /// Limits of single hosts on it (`[[subsystem.namespace.host_qos]]`).
    pub host_qos: Vec<HostQos>,
    /// The identifiers it keeps from where it was served before (`nguid`,
    /// `uuid`, `eui64`); those not given are derived.
    pub ids: GivenIds,
}

impl NamespaceConfig {
    /// Namespace `nsid` on `backend` with the defaults: writable, ANA group
    /// 1, reservations on, every host sees it, no limit.
    pub fn new(nsid: u32, backend: BackendConfig, block_size: u32) -> Self {
        NamespaceConfig {
            nsid,
            backend,
            block_size,
            read_only: false,
            ana_group: 1,
            reservations: true,
            hosts: None,
            qos: QosLimits::default(),
            host_qos: Vec::new(),
            ids: GivenIds::default(),
        }
    }

    /// Whether host `nqn` sees it.
    pub fn visible_to(&self, nqn: &str) -> bool {
        self.hosts
            .as_ref()
            .is_none_or(|h| h.iter().any(|n| n == nqn))
    }
}

/// The identifiers the configuration gives a namespace (`nguid`, `uuid`,
/// `eui64`): those a host knew it by where it was served before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GivenIds {
    pub nguid: Option<[u8; 16]>,
    pub uuid: Option<[u8; 16]>,
    pub eui64: Option<[u8; 8]>,
}

/// A QoS limit's kind: what it counts, for which commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QosKey {
    /// Commands per second, reads and writes together.
    Iops,
    ReadIops,
    WriteIops,
    /// Bytes per second, reads and writes together.
    Bandwidth,
    ReadBandwidth,
    WriteBandwidth,
}

impl QosKey {
    /// Every key, in the order of [`QosLimits`]' array.
    pub const ALL: [QosKey; 6] = [
        QosKey::Iops,
        QosKey::ReadIops,
        QosKey::WriteIops,
        QosKey::Bandwidth,
        QosKey::ReadBandwidth,
        QosKey::WriteBandwidth,
    ];

    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            QosKey::Iops => "iops",
            QosKey::ReadIops => "read_iops",
            QosKey::WriteIops => "write_iops",
            QosKey::Bandwidth => "bandwidth",
            QosKey::ReadBandwidth => "read_bandwidth",
            QosKey::WriteBandwidth => "write_bandwidth",
        }
    }

    /// The key named `name`.
    pub fn from_name(name: &str) -> Option<QosKey> {
        QosKey::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether it counts bytes (else commands).
    pub fn is_bandwidth(self) -> bool {
        matches!(
            self,
            QosKey::Bandwidth | QosKey::ReadBandwidth | QosKey::WriteBandwidth
        )
    }

    /// Whether it applies to commands of `class`.
    pub fn applies_to(self, class: QosClass) -> bool {
        match self {
            QosKey::Iops | QosKey::Bandwidth => true,
            QosKey::ReadIops | QosKey::ReadBandwidth => class == QosClass::Read,
            QosKey::WriteIops | QosKey::WriteBandwidth => class == QosClass::Write,
        }
    }
}

/// What QoS limits count a command as: the `read_*` keys limit reads, the
/// `write_*` keys writes, the others both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosClass {
    Read,
    Write,
}

/// QoS limits, per second, by [`QosKey`]; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosLimits(pub [Option<u64>; 6]);

impl QosLimits {
    /// The limit of `key`.
    pub fn get(&self, key: QosKey) -> Option<u64> {
        self.0[key as usize]
    }

    pub fn set(&mut self, key: QosKey, value: Option<u64>) {
        self.0[key as usize] = value;
    }

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// The limits set, with their keys.
    pub fn iter(&self) -> impl Iterator<Item = (QosKey, u64)> + '_ {
        QosKey::ALL
            .into_iter()
            .filter_map(|k| self.get(k).map(|v| (k, v)))
    }
}

impl std::fmt::Display for QosLimits {
    /// `read_iops 2000, write_bandwidth 50MiB/s`, or `none`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        for (i, (k, v)) in self.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            if k.is_bandwidth() {
                write!(
                    f,
                    "{sep}{} {}/s",
                    k.name(),
                    rdmablk_common::units::format_size(v)
                )?;
            } else {
                write!(f, "{sep}{} {v}", k.name())?;
            }
        }
        Ok(())
    }
}

/// One host's limits on a namespace (`[[subsystem.namespace.host_qos]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostQos {
    pub nqn: String,
    pub limits: QosLimits,
}

/// Storage behind a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
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

impl Default for Pollers {
    /// One poller per online CPU (at most 256), 64 MiB arenas, adaptive
    /// polling with the default window.
    fn default() -> Self {
        Pollers {
            count: default_poller_count(),
            arena_bytes: DEFAULT_ARENA_BYTES,
            busy_poll: false,
            spin: SpinBounds::DEFAULT,
        }
    }
}

/// One poller per online CPU, at most [`MAX_POLLERS`].
pub(super) fn default_poller_count() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_POLLERS)
}
