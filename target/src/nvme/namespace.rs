//! A namespace: its backend, size, identifiers, metrics and the services
//! it carries (reservations with their state file, write gate, tenancy),
//! and its opening from the configuration.

use crate::backend::rbd::RbdNamespace;
use crate::backend::{Backend, FileBackend, MemoryBackend, RbdBackend};
use crate::base::ids::NamespaceIds;
use crate::base::metrics::NsMetrics;
use crate::config::{self, BackendConfig, GivenIds, NamespaceConfig};
use crate::service::reservation::ptpl::{Identity, Persistent, StateFile};
use crate::service::reservation::Reservations;
use crate::service::tenancy::Tenancy;
use crate::service::write_gate::WriteGate;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

/// How many times its size a memory namespace can grow to on a reload.
const MEMORY_GROWTH: u64 = 64;

/// An exported namespace.
pub struct Namespace {
    pub nsid: u32,
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Size in logical blocks: grows on a reload.
    blocks: AtomicU64,
    /// Writes refused (flipped by a reload).
    read_only: AtomicBool,
    /// Its ANA group (a reload may move it).
    ana_group: AtomicU32,
    pub backend: Backend,
    /// NGUID, UUID and EUI-64, stable across restarts: set when the
    /// namespace is made, or when its RBD image opens (those not given
    /// derive from the image's id).
    ids: OnceLock<NamespaceIds>,
    /// The identifiers the configuration gives.
    given_ids: GivenIds,
    /// Commands, bytes, errors and latency, per poller.
    pub metrics: NsMetrics,
    /// Its registrations and reservation; `None` where the configuration
    /// turned reservations off.
    pub reservations: Option<Reservations>,
    /// Where they persist through power loss.
    state_file: Option<StateFile>,
    /// The order of its writes against Compare and Write and Preempt and
    /// Abort.
    pub gate: WriteGate,
    /// Who sees it, and its QoS limits.
    pub tenancy: Tenancy,
}

impl Namespace {
    /// log2 of the block size.
    pub fn lba_shift(&self) -> u32 {
        self.block_size.trailing_zeros()
    }

    /// Size in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }

    pub fn read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }

    /// Its ANA group.
    #[inline]
    pub fn ana_group(&self) -> u32 {
        self.ana_group.load(Ordering::Acquire)
    }

    pub fn set_ana_group(&self, group: u32) {
        self.ana_group.store(group, Ordering::Release);
    }

    /// Makes `bytes` (a whole number of blocks, not less than now) the
    /// namespace's size; the backend must already hold them.
    pub fn grow_to(&self, bytes: u64) {
        let before = self
            .blocks
            .fetch_max(bytes / self.block_size as u64, Ordering::AcqRel);
        // The state file names the size: a grown namespace keeps its
        // reservations at the next start. Not on a poller: a reload, or
        // the image's thread.
        if before != self.blocks()
            && self
                .reservations
                .as_ref()
                .is_some_and(|r| r.snapshot().ptpl)
        {
            if let Err(e) = self.persist() {
                tracing::error!(
                    nsid = self.nsid,
                    "cannot save the reservation state of the grown namespace: {e}"
                );
            }
        }
    }

    /// Its size as its state file records it (none for RBD images, which
    /// Ceph resizes).
    fn recorded_size(&self) -> Option<u64> {
        (!matches!(self.backend, Backend::Rbd(_))).then(|| self.blocks() * self.block_size as u64)
    }

    /// Whether the namespace is active: it takes I/O and is listed (an RBD
    /// namespace once its image opened).
    pub fn is_active(&self) -> bool {
        self.backend.is_ready()
    }

    /// Its identifiers (zeroes until it is active).
    pub fn ids(&self) -> NamespaceIds {
        self.ids.get().copied().unwrap_or(NamespaceIds {
            nguid: [0; 16],
            uuid: [0; 16],
            eui64: None,
        })
    }

    /// The identifiers its configuration gives.
    pub fn given_ids(&self) -> &GivenIds {
        &self.given_ids
    }
}

impl Namespace {
    /// The namespace its state file or shared record is for.
    pub fn reservations_identity(&self) -> Option<&Identity> {
        self.state_file.as_ref().map(StateFile::identity)
    }
}

impl Persistent for Namespace {
    /// Writes the state file; where a gateway group shares the state, its
    /// record takes this PTPL (the one thing changed outside a reservation
    /// command: Set Features).
    fn persist(&self) -> std::io::Result<()> {
        let Some(r) = &self.reservations else {
            return Ok(());
        };
        if let Some(record) = r.record() {
            let ptpl = r.snapshot().ptpl;
            let res = record.change(&mut |st| {
                st.ptpl = ptpl;
                Ok(crate::service::reservation::Outcome {
                    changed: true,
                    ..Default::default()
                })
            });
            return match res {
                0 => Ok(()),
                e => Err(std::io::Error::from_raw_os_error(-e)),
            };
        }
        match &self.state_file {
            Some(f) => f.save(&r.snapshot(), self.recorded_size()),
            None => Ok(()),
        }
    }
}

impl RbdNamespace for Namespace {
    fn rbd(&self) -> &RbdBackend {
        match &self.backend {
            Backend::Rbd(r) => r,
            _ => unreachable!("an RBD namespace has an RBD backend"),
        }
    }

    fn nsid(&self) -> u32 {
        self.nsid
    }

    fn size(&self) -> u64 {
        self.blocks() * self.block_size as u64
    }

    fn grow_to(&self, bytes: u64) {
        Namespace::grow_to(self, bytes)
    }

    fn derive_ids(&self, key: &str) {
        let _ = self.ids.set(NamespaceIds::derive(key, &self.given_ids));
    }
}

/// Opens a namespace's backend; its metrics have a slot for each of
/// `pollers`. Logs what it opened.
pub fn open_namespace(
    nqn: &str,
    n: &NamespaceConfig,
    pollers: usize,
    state_dir: &Path,
) -> std::io::Result<Namespace> {
    let (backend, size) = match &n.backend {
        BackendConfig::Rbd(image) => {
            // Opened in the background (`Registry::start_backends`): the
            // namespace is inactive until then.
            let backend = RbdBackend::new(image.clone(), n.block_size, n.read_only)?;
            tracing::info!(
                subsystem = %nqn,
                nsid = n.nsid,
                "namespace on {}; inactive until the image is open",
                backend.describe()
            );
            (Backend::Rbd(Box::new(backend)), 0)
        }
        BackendConfig::File { path, create_size } => {
            let f = FileBackend::open(path, *create_size, n.block_size, n.read_only)?;
            let size = f.size();
            (Backend::File(f), size)
        }
        BackendConfig::Memory { size } => {
            // Room to grow on a reload: up to what the machine could hold
            // (a memory namespace must fit in memory anyway), and
            // MEMORY_GROWTH times its size, so that thousands of small
            // namespaces stay within the process's address space.
            let machine = config::machine_memory().unwrap_or(*size);
            let reserve = machine.min(size.saturating_mul(MEMORY_GROWTH));
            (Backend::Memory(MemoryBackend::new(*size, reserve)?), *size)
        }
        BackendConfig::Null { size } => (Backend::Null, *size),
    };
    let rbd = matches!(backend, Backend::Rbd(_));
    let blocks = size / n.block_size as u64;
    if blocks == 0 && !rbd {
        return Err(std::io::Error::other(format!(
            "smaller than one {}-byte block; give it a size",
            n.block_size
        )));
    }
    if !rbd {
        tracing::info!(
            subsystem = %nqn,
            nsid = n.nsid,
            blocks,
            block_size = n.block_size,
            read_only = n.read_only,
            "namespace on {}",
            backend.describe()
        );
    }
    let state_file = n.reservations.then(|| {
        StateFile::new(
            state_dir,
            Identity {
                subsystem: nqn.to_owned(),
                nsid: n.nsid,
                backend: backend_identity(&n.backend),
                block_size: n.block_size,
                size: None,
            },
        )
    });
    let reservations = state_file
        .as_ref()
        .map(|f| Reservations::new(f.load((!rbd).then_some(size))));
    Ok(Namespace {
        nsid: n.nsid,
        block_size: n.block_size,
        blocks: AtomicU64::new(blocks),
        read_only: AtomicBool::new(n.read_only),
        ana_group: AtomicU32::new(n.ana_group),
        backend,
        // An RBD namespace's derive from its image's id, once it is open.
        ids: if rbd {
            OnceLock::new()
        } else {
            OnceLock::from(NamespaceIds::derive(&format!("{nqn}/{}", n.nsid), &n.ids))
        },
        given_ids: n.ids,
        metrics: NsMetrics::new(pollers),
        reservations,
        state_file,
        gate: WriteGate::new(pollers),
        tenancy: Tenancy::new(n),
    })
}

/// What a state file names as the namespace's storage.
fn backend_identity(b: &BackendConfig) -> String {
    match b {
        BackendConfig::File { path, .. } => format!("file:{}", path.display()),
        BackendConfig::Rbd(image) => format!("rbd:{}", image.spec()),
        BackendConfig::Memory { .. } => "memory".into(),
        BackendConfig::Null { .. } => "null".into(),
    }
}
