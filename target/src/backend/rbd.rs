//! A Ceph RBD image through librbd, loaded at run time.
//!
//! The cluster connection and the image's opening happen on a thread of
//! the namespace's own (they block for up to the configured timeout); the
//! namespace is inactive until the image is open, then activated with a
//! Namespace Attribute Changed notice. The same thread then follows the
//! image's resizes (an update watch). I/O runs on the pollers through
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
//! wakes the namespace's thread, which opens the image again on a new
//! connection, puts it in place of the old one, and closes the old one once
//! its operations ended. The namespace stays active meanwhile; its I/O is
//! answered with a status the host retries.

mod ffi;
mod objects;
#[rustfmt::skip]
mod sys;

use super::{Access, BackendOp, FixedBuf};
use crate::base::completions::Completions;
use crate::config::RbdImage;
use ffi::{Aio, Finish, Image};
pub use ffi::{Cluster, Pool};
pub use objects::Watch;
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

/// How long after a failed open the next attempt starts.
const RETRY_OPEN: Duration = Duration::from_secs(5);

/// What every cluster connection is opened with, besides the timeouts.
/// - No client cache: two gateways exporting one image must not serve
///   reads from private caches, and a write is durable when acknowledged.
/// - A discard zeroes partial objects too, so deallocated blocks read
///   back as zeroes, as Identify Namespace's DLFEAT says.
/// - Writes leave from the caller's buffer without a copy.
///
/// The first `REQUIRED_OPTIONS` are what the namespace promises its hosts:
/// an image whose pool or image configuration overrides them is not served.
const CLIENT_OPTIONS: [(&str, &str); 3] = [
    ("rbd_cache", "false"),
    ("rbd_skip_partial_discard", "false"),
    ("rbd_disable_zero_copy_writes", "false"),
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
    /// What operations tell the namespace's thread.
    health: Arc<Health>,
    /// Set by `close` (shutdown): an image opened later is closed at once.
    /// Held while the image is made available, so that neither misses the
    /// other.
    closing: Mutex<bool>,
    /// Whether the opening thread was started.
    started: AtomicBool,
}

/// Shared by a backend's operations and its thread.
#[derive(Default)]
struct Health {
    /// The image (its address) whose client an operation found
    /// blocklisted; 0 for none. The thread acts only if that image is still
    /// the namespace's: a late report about a replaced one changes nothing.
    blocklisted: AtomicUsize,
    /// Wakes the namespace's thread.
    wake: OnceLock<mpsc::SyncSender<()>>,
}

impl Health {
    /// The cluster refused an operation of `image`'s client (EBLOCKLISTED).
    fn blocklisted(&self, image: &Arc<Image>) {
        self.blocklisted
            .store(Arc::as_ptr(image) as usize, Ordering::Release);
        if let Some(w) = self.wake.get() {
            // One pending wake-up is enough: the thread looks at both.
            let _ = w.try_send(());
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
    /// view of a removed namespace): the image is closed on a thread of its
    /// own, as closing waits for the cluster.
    fn drop(&mut self) {
        let image = self.image.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(image) = image.take() {
            let spawned = std::thread::Builder::new()
                .name("rbd-close".into())
                .spawn(move || drop(image));
            if let Err(e) = spawned {
                tracing::warn!("no thread to close an RBD image ({e}); the process will");
            }
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

    fn op(&self, aio: Aio, result: OnSuccess) -> Access {
        Access::Submit(BackendOp::Rbd(RbdOp {
            image: self.current(),
            health: self.health.clone(),
            aio,
            result,
        }))
    }

    pub fn read(&self, offset: u64, buf: FixedBuf) -> Access {
        let (buf, len) = (buf.ptr, buf.len);
        self.op(Aio::Read { offset, buf, len }, OnSuccess::Bytes)
    }

    pub fn write(&self, offset: u64, buf: FixedBuf) -> Access {
        let (buf, len) = (buf.ptr, buf.len);
        self.op(
            Aio::Write { offset, buf, len },
            OnSuccess::BytesOr(len as i32),
        )
    }

    /// Writes `data` at `offset` if the bytes there equal `cmp` (as long),
    /// atomically at the OSD; ends with -EILSEQ when they differ.
    pub fn compare_and_write(&self, offset: u64, cmp: FixedBuf, data: FixedBuf) -> Access {
        self.op(
            Aio::CompareAndWrite {
                offset,
                cmp: cmp.ptr,
                buf: data.ptr,
                len: cmp.len,
                mismatch: std::ptr::null_mut(),
            },
            OnSuccess::Zero,
        )
    }

    pub fn flush(&self) -> Access {
        self.op(Aio::Flush, OnSuccess::Zero)
    }

    /// Discards (deallocate) or writes zeroes; both read back as zeroes.
    pub fn zero(&self, offset: u64, len: u64, deallocate: bool) -> Access {
        let aio = if deallocate {
            Aio::Discard { offset, len }
        } else {
            Aio::WriteZeroes { offset, len }
        };
        self.op(aio, OnSuccess::Zero)
    }

    /// The image's size now; 0 while it is not open.
    pub fn current_size(&self) -> io::Result<u64> {
        match self.current() {
            Some(i) => i.size(),
            None => Ok(0),
        }
    }

    /// Waits until every acknowledged write is durable (at shutdown).
    pub fn sync(&self) -> io::Result<()> {
        match self.current() {
            Some(i) => i.flush(),
            None => Ok(()),
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

    /// Starts, once, the thread that opens the image of `ns` (whose backend
    /// this is), activates the namespace and follows the image's resizes;
    /// `changed` tells the subsystem's controllers that the namespace
    /// changed. The thread ends when the namespace goes.
    pub fn start(&self, ns: Weak<dyn RbdNamespace>, changed: impl Fn() + Send + 'static) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let name = format!("rbd-{}", self.spec.image);
        let spawned = std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(move || manage(ns, changed));
        if let Err(e) = spawned {
            tracing::error!("cannot start the thread that opens an RBD image: {e}");
        }
    }
}

/// The namespace an RBD backend serves, as the thread that opens its image
/// sees it (the NVMe layer's namespace implements it).
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

/// The life of an RBD namespace after it is made: open (retrying until it
/// works or the namespace is gone), activate, then follow resizes; when the
/// cluster blocklisted the client, replace the connection and open again.
fn manage(ns: Weak<dyn RbdNamespace>, changed: impl Fn()) {
    // The senders are the backend's and its images' watches' only: this
    // thread ends once the namespace and its images are gone.
    let (wake, woken) = mpsc::sync_channel::<()>(1);
    match ns.upgrade() {
        Some(n) => {
            let _ = n.rbd().health.wake.set(wake);
        }
        None => return,
    }
    if !open_until_done(&ns, &changed) {
        return;
    }
    // Woken by the image's update watch (a resize) or by an operation the
    // cluster refused (blocklisted).
    loop {
        if woken.recv().is_err() {
            return;
        }
        let Some(n) = ns.upgrade() else {
            return;
        };
        let r = n.rbd();
        let reported = r.health.blocklisted.swap(0, Ordering::AcqRel);
        match r.current() {
            Some(old) if Arc::as_ptr(&old) as usize == reported => {
                drop(n);
                if !reconnect(&ns, old, &changed) {
                    return;
                }
            }
            _ => follow_resize(&*n, &changed),
        }
    }
}

/// Opens the image of the namespace behind `ns` and makes it the
/// namespace's, retrying every RETRY_OPEN; the image's update watch wakes
/// the namespace's thread. False once the namespace is gone.
fn open_until_done(ns: &Weak<dyn RbdNamespace>, changed: &impl Fn()) -> bool {
    // A failure is logged as an error when it is new, then quietly while it
    // repeats every RETRY_OPEN.
    let mut last_failure = String::new();
    // Kept while the image does not exist yet: no new connection per try.
    let mut connected: Option<Arc<Cluster>> = None;
    loop {
        let Some(n) = ns.upgrade() else {
            return false;
        };
        let r = n.rbd();
        let opened = match connected.take() {
            Some(c) => Ok(c),
            None => cluster(&r.spec),
        }
        .and_then(|c| {
            open(&c, &r.spec, r.read_only).inspect_err(|e| {
                if ffi::errno_of(e) == Some(libc::ENOENT) {
                    connected = Some(c.clone());
                }
            })
        });
        match opened {
            Ok(mut opened) => {
                let notice = r.health.wake.get().cloned();
                if let Err(e) = opened.watch(move || {
                    // One pending notice is enough: the size is read anew.
                    if let Some(n) = &notice {
                        let _ = n.try_send(());
                    }
                }) {
                    tracing::warn!(image = %r.spec.spec(), "resizes will not be seen: {e}");
                }
                match activate(&*n, opened) {
                    Ok(first) => {
                        if first {
                            changed();
                        } else {
                            follow_resize(&*n, changed);
                        }
                        return true;
                    }
                    Err(e) => tracing::error!(image = %r.spec.spec(), "{e}; retrying"),
                }
            }
            Err(e) if e.to_string() == last_failure => tracing::debug!(
                image = %r.spec.spec(),
                "still cannot open the RBD image: {e}; retrying in {RETRY_OPEN:?}"
            ),
            Err(e) => {
                tracing::error!(
                    image = %r.spec.spec(),
                    client = %r.spec.client_id,
                    "cannot open the RBD image: {e}; retrying every {RETRY_OPEN:?}"
                );
                last_failure = e.to_string();
            }
        }
        drop(n);
        std::thread::sleep(RETRY_OPEN);
    }
}

/// Replaces `old`, whose client the cluster blocklisted: the shared
/// connection is forgotten, the image opened again on a new one and put in
/// its place (I/O meanwhile fails on the old one with a status the host
/// retries), then the old one is closed once the operations started on it
/// have ended (librbd ends them with an error, within the client's
/// operation timeout). False once the namespace is gone.
fn reconnect(ns: &Weak<dyn RbdNamespace>, old: Arc<Image>, changed: &impl Fn()) -> bool {
    let Some(n) = ns.upgrade() else {
        return false;
    };
    let r = n.rbd();
    let (spec, client, timeout) = (r.spec.spec(), r.spec.client_id.clone(), r.spec.timeout);
    tracing::warn!(
        image = %spec,
        client = %client,
        "the cluster blocklisted this client (another client took the image's lock, or an \
         operator); opening the image again on a new connection; I/O meanwhile is answered \
         with a status the host retries"
    );
    forget_cluster(&r.spec, old.cluster());
    drop(n);
    let reopened = open_until_done(ns, changed);
    let deadline = Instant::now() + 2 * timeout + Duration::from_secs(5);
    while Arc::strong_count(&old) > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if Arc::strong_count(&old) > 1 {
        // Closing it would free what librbd still uses: it is left open.
        tracing::error!(
            image = %spec,
            "operations of the blocklisted connection did not end; its image is left open"
        );
        std::mem::forget(old);
    } else {
        old.close();
    }
    reopened
}

/// Grows the namespace to its image's size (a resize seen by the update
/// watch, or while the connection was replaced) and tells the controllers.
fn follow_resize(n: &dyn RbdNamespace, changed: &impl Fn()) {
    let r = n.rbd();
    let Some(image) = r.current() else {
        return;
    };
    let now = n.size();
    match image.size() {
        Ok(size) if size > now => {
            n.grow_to(size / r.block_size as u64 * r.block_size as u64);
            tracing::info!(image = %r.spec.spec(), size, "RBD image grew; namespace resized");
            changed();
        }
        Ok(size) if size < now => tracing::warn!(
            image = %r.spec.spec(),
            size,
            served = now,
            "RBD image shrank; the namespace keeps its size and I/O past the image's end fails"
        ),
        Ok(_) => {}
        // The watch also fires when the client is blocklisted: an idle
        // namespace gets a new connection too.
        Err(e) if blocklisted(&e) => r.health.blocklisted(&image),
        Err(e) => tracing::warn!(image = %r.spec.spec(), "cannot read the image's size: {e}"),
    }
}

/// Makes `opened` the image of `n`: at the first opening, sets the size and
/// identifiers and activates the namespace (returns true); later (after a
/// blocklisted connection), the image must be the same one (same id). Its
/// configuration must keep what the namespace promises (`REQUIRED_OPTIONS`).
fn activate(n: &dyn RbdNamespace, opened: Image) -> io::Result<bool> {
    let r = n.rbd();
    for &(name, want) in &CLIENT_OPTIONS[..REQUIRED_OPTIONS] {
        if let Some(v) = opened.config(name)?.filter(|v| v != want) {
            return Err(io::Error::other(format!(
                "the image's configuration sets {name} = {v} (the target needs {want}: \
                 acknowledged writes durable, deallocated blocks reading zeroes); remove it \
                 with `rbd config image rm {spec} {name}` or `rbd config pool rm {pool} {name}`",
                spec = r.spec.spec(),
                pool = r.spec.pool
            )));
        }
    }
    let size = opened.size()?;
    let id = opened.id()?;
    let s = &r.spec;
    let first = r.image_id.get().is_none();
    if let Some(was) = r.image_id.get().filter(|&was| *was != id) {
        return Err(io::Error::other(format!(
            "the image is not the one this namespace served (id {id}, was {was}): \
             it was removed and made again; restart the target to serve the new one"
        )));
    }
    if first {
        let blocks = size / r.block_size as u64;
        if blocks == 0 {
            return Err(io::Error::other(format!(
                "the image is smaller than one {}-byte block",
                r.block_size
            )));
        }
        n.grow_to(blocks * r.block_size as u64);
        n.derive_ids(&format!(
            "rbd:{}/{}/{id}",
            s.pool,
            s.namespace.as_deref().unwrap_or("")
        ));
    }
    let closing = r.closing.lock().unwrap_or_else(PoisonError::into_inner);
    if *closing {
        return Err(io::Error::other("the daemon is stopping"));
    }
    *r.image.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(opened));
    let _ = r.image_id.set(id.clone());
    r.active.store(true, Ordering::Release);
    drop(closing);
    if first {
        tracing::info!(
            image = %s.spec(),
            image_id = %id,
            nsid = n.nsid(),
            size,
            "RBD image open; namespace active"
        );
    } else {
        tracing::info!(image = %s.spec(), nsid = n.nsid(), "RBD image open again on a new connection");
    }
    Ok(first)
}

/// Connects (or shares a connection) and opens the image.
fn open(cluster: &Arc<Cluster>, spec: &RbdImage, read_only: bool) -> io::Result<Image> {
    cluster.open(
        &spec.pool,
        spec.namespace.as_deref().unwrap_or(""),
        &spec.image,
        read_only,
    )
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

/// One librbd call of a command, started by its queue with the command's
/// token (`RbdOp::start`).
pub struct RbdOp {
    /// None before the image opened (the namespace is inactive then) or
    /// after shutdown.
    image: Option<Arc<Image>>,
    health: Arc<Health>,
    aio: Aio,
    result: OnSuccess,
}

/// What a successful operation reports, in io_uring's convention, which the
/// command's completion expects: a read, the bytes librbd returned (fewer
/// past the end of an image that shrank, which the command then answers as
/// an error rather than send stale buffer bytes); a write, those or its
/// length; the others 0.
#[derive(Clone, Copy)]
enum OnSuccess {
    Bytes,
    BytesOr(i32),
    Zero,
}

impl RbdOp {
    /// Starts the call; its end reaches `completions` as (`token`, result):
    /// -ENOTCONN at once when there is no image.
    ///
    /// # Safety
    /// A read or write's arena buffer stays with the command until the
    /// completion was dispatched.
    pub unsafe fn start(self, token: u64, completions: &Arc<Completions>) {
        let Some(image) = self.image else {
            return completions.push(token, -libc::ENOTCONN);
        };
        let done = Box::new(Done {
            token,
            result: self.result,
            completions: completions.clone(),
            image: Some(image.clone()),
            health: self.health,
            mismatch: std::cell::UnsafeCell::new(0),
        });
        let mut aio = self.aio;
        if let Aio::CompareAndWrite { mismatch, .. } = &mut aio {
            // librbd writes it when the operation ends; `done` (on the
            // heap, moved only as a pointer) lives until then.
            *mismatch = done.mismatch.get();
        }
        // SAFETY: the buffers stay valid until completion (as the caller
        // promised), and `done` keeps the image from being closed until then
        // (an image is closed only by its last holder: see `reconnect`).
        unsafe { image.start(aio, done) };
    }
}

/// Where a librbd completion goes.
struct Done {
    token: u64,
    result: OnSuccess,
    completions: Arc<Completions>,
    /// Held until the operation ended.
    image: Option<Arc<Image>>,
    health: Arc<Health>,
    /// Where a compare and write that did not match says where (librbd
    /// writes it).
    mismatch: std::cell::UnsafeCell<u64>,
}

impl Finish for Done {
    fn finish(mut self: Box<Self>, rc: i64) {
        if rc == -(libc::ESHUTDOWN as i64) {
            if let Some(image) = &self.image {
                // librados' EBLOCKLISTED.
                self.health.blocklisted(image);
            }
        }
        // The image goes before the command can complete: its completion
        // may drop the namespace, and the last holder of an image must not
        // be a librbd thread (closing waits for them).
        drop(self.image.take());
        let bytes = || i32::try_from(rc).unwrap_or(i32::MAX);
        let res = match self.result {
            _ if rc < 0 => i32::try_from(rc).unwrap_or(-libc::EIO),
            OnSuccess::Bytes => bytes(),
            OnSuccess::BytesOr(len) if rc == 0 => len,
            OnSuccess::BytesOr(_) => bytes(),
            OnSuccess::Zero => 0,
        };
        self.completions.push(self.token, res);
    }
}
