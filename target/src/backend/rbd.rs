//! A Ceph RBD image through librbd, loaded at run time.
//!
//! The cluster connection and the image's opening happen on the image
//! workers, a few threads all namespaces share (they block for up to the
//! configured timeout: `lifecycle`); the namespace is inactive until the
//! image is open, then activated with a Namespace Attribute Changed
//! notice. Its jobs then follow the image's resizes (an update watch). I/O runs on the pollers through
//! librbd's asynchronous calls: a write leaves from the arena buffer
//! without a copy (zero-copy writes), a read is copied once by librbd into
//! it. Completions come back through the poller's [`Completions`], so no
//! poller ever blocks on the cluster and librbd threads only record results.
//!
//! librbd cannot cancel an operation: its buffer stays with the command,
//! and the command in its queue, until librbd completed it, whatever
//! happens to the queue meanwhile (see `Queue::idle_backend`).
//!
//! A client the cluster blocklisted (another client broke its lock, or an
//! operator) gets every operation refused for good: the first refusal
//! notices the image's life, which opens the image again on a new
//! connection, puts it in place of the old one, and closes the old one once
//! its operations ended. The namespace stays active meanwhile; its I/O is
//! answered with a status the host retries.
//!
//! Here the backend and the cluster connections it shares; `ops` (the
//! image's I/O), `lifecycle` (the image's life), `ffi` (librbd and
//! librados), `objects` (RADOS attributes, compare-and-set, watch and
//! notify) and `sys` (the bindings).

mod ffi;
mod lifecycle;
mod objects;
pub mod ops;
#[rustfmt::skip]
mod sys;

use crate::config::RbdImage;
pub use ffi::{Cluster, Image, Pool};
pub use objects::Watch;
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

/// What every cluster connection is opened with, besides the timeouts.
/// - No client cache: two gateways exporting one image must not serve
///   reads from private caches, and a write is durable when acknowledged.
/// - A discard zeroes partial objects too, so deallocated blocks read
///   back as zeroes, as Identify Namespace's DLFEAT says.
/// - Writes leave from the caller's buffer without a copy.
/// - librbd starts an operation in the poller that calls it rather than
///   handing it to its io_context thread first: one thread wake-up less
///   per I/O, about a fifth of the gateway's CPU time per 4K read
///   (bench/rbd.sh). Nothing on that path waits for the cluster: librbd
///   queues what needs the exclusive lock or a refresh and starts it later.
/// - Without librados' throttle of operations in flight, whose wait would
///   stall the poller and every queue on it: the daemon's own budgets
///   bound what is in flight (a read or write holds an arena buffer; every
///   command, a submission queue entry of a bounded number of queues).
///
/// The first `REQUIRED_OPTIONS` are what the namespace promises its hosts:
/// an image whose pool or image configuration overrides them is not served.
const CLIENT_OPTIONS: [(&str, &str); 6] = [
    ("rbd_cache", "false"),
    ("rbd_skip_partial_discard", "false"),
    ("rbd_disable_zero_copy_writes", "false"),
    ("rbd_non_blocking_aio", "false"),
    ("objecter_inflight_ops", "0"),
    ("objecter_inflight_op_bytes", "0"),
];
const REQUIRED_OPTIONS: usize = 2;

/// A namespace's RBD image: what to open, and the image once open.
pub struct RbdBackend {
    spec: RbdImage,
    block_size: u32,
    /// Opened for reading only (a read-only namespace).
    read_only: bool,
    /// The open image: none before the first opening (and after shutdown).
    image: Mutex<Option<Arc<Image>>>,
    /// The image's id at its first opening: a later one must be the same
    /// image, not another made under its name.
    image_id: OnceLock<String>,
    /// The image opened once: the namespace is active (until shutdown).
    active: AtomicBool,
    /// What operations tell the image's life.
    health: Arc<Health>,
    /// Set by `close` (shutdown): an image opened later is closed at once.
    /// Held while the image is made available, so that neither misses the
    /// other.
    closing: Mutex<bool>,
    /// Whether the image's life was started.
    started: AtomicBool,
    /// Images replaced because the cluster blocklisted their client, while
    /// operations started on them may still be in flight.
    retired: Mutex<Vec<Weak<Image>>>,
}

/// Shared by a backend's operations and its image's life.
#[derive(Default)]
struct Health {
    /// The image (its address) whose client an operation found
    /// blocklisted; 0 for none. The life acts only if that image is still
    /// the namespace's: a late report about a replaced one changes nothing.
    blocklisted: AtomicUsize,
    /// The image's life, told of what happens.
    life: OnceLock<Arc<lifecycle::Life>>,
}

impl Health {
    /// The cluster refused an operation of `image`'s client (EBLOCKLISTED).
    fn blocklisted(&self, image: &Arc<Image>) {
        self.blocklisted
            .store(Arc::as_ptr(image) as usize, Ordering::Release);
        if let Some(l) = self.life.get() {
            l.notice();
        }
    }
}

/// Ends the process at once with status `code` when librados is loaded;
/// returns when it is not. For the daemon's end (stopped, or a start that
/// failed), when librados may still be at work on threads of its own (an
/// image opening, a connection waiting for a monitor): exit(3) would run
/// librados's static destructors under them, and they crash. `_exit`
/// leaves out those destructors and the atexit handlers; the kernel closes
/// the connections. The images that were open are closed already (the
/// stop's last step), and librbd holds no data of ours (a write completes
/// once the cluster has it).
pub fn exit_now_if_loaded(code: u8) {
    if !ffi::loaded() {
        return;
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit(2) ends the process and has no precondition; nothing
    // runs after it in this process.
    unsafe { libc::_exit(code.into()) }
}

impl Drop for RbdBackend {
    /// The last holder of a namespace may be a poller (a command, a queue's
    /// view of a removed namespace): the image is closed by the image
    /// workers, as closing waits for the cluster.
    fn drop(&mut self) {
        let image = self.image.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(image) = image.take() {
            let lane = crate::base::lanes::Lane::new(&lifecycle::IMAGE_WORKERS);
            lane.submit(Box::new(move || drop(image)));
        }
    }
}

impl RbdBackend {
    /// The backend of `spec`, not open yet, to be opened for reading only
    /// when `read_only`; fails when librbd cannot be loaded.
    pub fn new(spec: RbdImage, block_size: u32, read_only: bool) -> io::Result<RbdBackend> {
        ffi::library()?;
        Ok(RbdBackend {
            spec,
            block_size,
            read_only,
            image: Mutex::new(None),
            image_id: OnceLock::new(),
            active: AtomicBool::new(false),
            health: Arc::default(),
            closing: Mutex::new(false),
            started: AtomicBool::new(false),
            retired: Mutex::default(),
        })
    }

    /// Whether the image is (to be) opened for writing.
    pub fn writable(&self) -> bool {
        !self.read_only
    }

    /// Whether the image was opened (the namespace takes I/O), and the
    /// daemon is not stopping.
    pub fn is_open(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// The open image, if there is one now.
    fn current(&self) -> Option<Arc<Image>> {
        self.image
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Has the image opened again on a new connection, as when an
    /// operation found its client blocklisted, if its client is one of
    /// `fenced` (addresses as [`Cluster::addresses`] gives them); returns
    /// the image replaced, for [`RbdBackend::replaced`]. An image opened
    /// since on a new client (its operations found out first) is kept.
    pub fn reconnect_if_fenced(&self, fenced: &BTreeSet<String>) -> Option<Arc<Image>> {
        let old = self.current()?;
        let address = old.cluster().addresses().ok()?;
        if !fenced.contains(&address) {
            return None;
        }
        self.health.blocklisted(&old);
        Some(old)
    }

    /// Counts `image`, whose client the cluster blocklisted, among those
    /// whose operations can no longer land; false when it was already
    /// (it is being replaced: later reports about it change nothing).
    fn retire(&self, image: &Arc<Image>) -> bool {
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired.retain(|i| i.strong_count() > 0);
        if retired
            .iter()
            .any(|i| std::ptr::eq(i.as_ptr(), Arc::as_ptr(image)))
        {
            return false;
        }
        retired.push(Arc::downgrade(image));
        true
    }

    /// Operations in flight on this namespace's images whose client the
    /// cluster blocklisted: none of them can land any more (the OSDs refuse
    /// that client), though librbd may never end some of them.
    pub fn stranded_ops(&self) -> usize {
        let retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired
            .iter()
            .filter_map(Weak::upgrade)
            .map(|i| i.in_flight.load(Ordering::Acquire))
            .sum()
    }

    /// Whether `old` is no longer the namespace's image.
    pub fn replaced(&self, old: &Arc<Image>) -> bool {
        !self.current().is_some_and(|i| Arc::ptr_eq(&i, old))
    }

    /// Closes the image for good, at shutdown once no I/O can be in flight:
    /// its watch and any lock on the cluster go at once rather than when
    /// they time out, so that another gateway or client takes over quickly.
    /// An image still opening is closed as soon as it opens.
    pub fn close(&self) {
        let mut closing = self.closing.lock().unwrap_or_else(PoisonError::into_inner);
        *closing = true;
        self.active.store(false, Ordering::Release);
        if let Some(i) = self.current() {
            i.close();
        }
    }

    /// The image's size now; 0 while it is not open.
    pub fn current_size(&self) -> io::Result<u64> {
        match self.current() {
            Some(i) => i.size(),
            None => Ok(0),
        }
    }

    /// Waits until every acknowledged write is durable (at shutdown). A
    /// client the cluster blocklisted (fenced by another gateway) has
    /// nothing to flush: without a client cache (`CLIENT_OPTIONS`), a write
    /// was acknowledged once the cluster had it.
    pub fn sync(&self) -> io::Result<()> {
        let Some(image) = self.current() else {
            return Ok(());
        };
        match image.flush() {
            Err(e) if blocklisted(&e) => {
                tracing::warn!(
                    image = %self.spec.spec(),
                    "not flushed: the cluster blocklisted this client (fenced); every write \
                     acknowledged was on the cluster already"
                );
                Ok(())
            }
            r => r,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "RBD image {} (client.{}, {}{})",
            self.spec.spec(),
            self.spec.client_id,
            self.spec.ceph_conf.display(),
            if self.read_only { ", read-only" } else { "" }
        )
    }
}

/// The namespace an RBD backend serves, as its image's life sees it (the
/// NVMe layer's namespace implements it).
pub trait RbdNamespace: Send + Sync {
    /// Its backend.
    fn rbd(&self) -> &RbdBackend;
    /// Its NSID (for logs).
    fn nsid(&self) -> u32;
    /// Its size in bytes now.
    fn size(&self) -> u64;
    /// Makes `bytes` (a whole number of blocks, not less than now) its size.
    fn grow_to(&self, bytes: u64);
    /// Sets its identifiers (those the configuration does not give derived
    /// from `key`), before it becomes active.
    fn derive_ids(&self, key: &str);
}

/// The connection of one (ceph.conf, client id), while images use it.
type Slot = Arc<Mutex<Weak<Cluster>>>;

/// The slots by (ceph.conf, client id): as many as the configuration names.
static CLUSTERS: Mutex<Option<HashMap<(PathBuf, String), Slot>>> = Mutex::new(None);

/// The slot of `spec`'s (ceph.conf, client id).
fn slot(spec: &RbdImage) -> Slot {
    let mut clusters = CLUSTERS.lock().unwrap_or_else(PoisonError::into_inner);
    clusters
        .get_or_insert_with(HashMap::new)
        .entry(spec.cluster_key())
        .or_default()
        .clone()
}

/// How long the stop blocklists this process's own clients for (their
/// instances are never used again: a restart connects anew).
const OWN_BLOCKLIST: Duration = Duration::from_secs(60);

/// Ends the watches of every image still open at once, by blocklisting
/// this process's own cluster clients: the stop's way out when closing the
/// images one by one would outlast it (each close makes librbd walk the
/// admin socket hooks of every image its client has open, so closing
/// thousands takes minutes). Their operations fail from then on; nothing
/// of ours is in flight any more. Returns how many clients were.
pub fn blocklist_own_clients() -> usize {
    let slots: Vec<Slot> = CLUSTERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .flat_map(|m| m.values().cloned())
        .collect();
    let mut done = 0;
    for slot in slots {
        let Some(c) = slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .upgrade()
        else {
            continue;
        };
        match c
            .addresses()
            .and_then(|a| c.blocklist(&a, OWN_BLOCKLIST).map(|()| a))
        {
            Ok(a) => {
                tracing::info!(client = %a, "blocklisted this process's own cluster client: its images' watches end now");
                done += 1;
            }
            Err(e) => tracing::warn!("cannot blocklist this process's own cluster client: {e}"),
        }
    }
    done
}

/// Stops sharing `old` (its client was blocklisted): the next image of its
/// (ceph.conf, client id) makes a new connection.
fn forget_cluster(spec: &RbdImage, old: &Arc<Cluster>) {
    let slot = slot(spec);
    let mut current = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if current.as_ptr() == Arc::as_ptr(old) {
        *current = Weak::new();
    }
}

/// The connection for `spec`'s (ceph.conf, client id), shared by the images
/// that use it; made on first use.
fn cluster(spec: &RbdImage) -> io::Result<Arc<Cluster>> {
    // The slot is held while connecting: a second image of the same cluster
    // waits for this connection rather than making its own, and images of
    // other clusters do not wait (a dead one takes up to its timeout).
    let slot = slot(spec);
    let mut current = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(c) = current.upgrade() {
        return Ok(c);
    }
    let cluster = connect(
        &spec.ceph_conf,
        &spec.client_id,
        spec.keyring.as_deref(),
        spec.timeout,
    )?;
    *current = Arc::downgrade(&cluster);
    Ok(cluster)
}

/// A new connection to the cluster of `conf` as `client.<id>` (with
/// `keyring` when ceph.conf names none), whose operations fail after
/// `timeout`, with the client options every connection of the daemon has.
pub fn connect(
    conf: &std::path::Path,
    id: &str,
    keyring: Option<&std::path::Path>,
    timeout: Duration,
) -> io::Result<Arc<Cluster>> {
    let secs = timeout.as_secs().max(1).to_string();
    let mut options: Vec<(&str, String)> = CLIENT_OPTIONS
        .iter()
        .map(|&(k, v)| (k, v.to_string()))
        .collect();
    for k in [
        "rados_osd_op_timeout",
        "rados_mon_op_timeout",
        "client_mount_timeout",
    ] {
        options.push((k, secs.clone()));
    }
    if let Some(k) = keyring {
        options.push(("keyring", k.display().to_string()));
    }
    let conf = conf.display().to_string();
    let cluster = Arc::new(Cluster::connect(&conf, id, &options)?);
    tracing::info!(conf = %conf, client = %id, "connected to the Ceph cluster");
    Ok(cluster)
}

/// Whether the cluster refused a call because it blocklisted the client
/// (librados' EBLOCKLISTED): the connection is of no more use.
pub fn blocklisted(e: &io::Error) -> bool {
    ffi::errno_of(e) == Some(libc::ESHUTDOWN)
}

/// The addresses of every cluster connection images use now: what the
/// OSDs must refuse to fence this daemon off its images.
pub fn image_clients() -> Vec<String> {
    let clusters = CLUSTERS.lock().unwrap_or_else(PoisonError::into_inner);
    let live = clusters.iter().flat_map(|m| m.values());
    live.filter_map(|slot| {
        slot.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .upgrade()
    })
    .filter_map(|c| c.addresses().ok())
    .collect()
}
