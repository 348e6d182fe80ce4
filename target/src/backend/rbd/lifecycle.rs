//! An RBD image's life, as jobs on its namespace's lane of the image
//! workers (`base::lanes`: a few threads, whatever the number of
//! namespaces): opening it (again every RETRY_OPEN until it works or the
//! namespace goes), activating the namespace, following resizes, and
//! opening it again on a new connection when the cluster blocklisted the
//! client.

use super::ffi::{self, Cluster, Image};
use super::{
    blocklisted, cluster, forget_cluster, RbdBackend, RbdNamespace, CLIENT_OPTIONS,
    REQUIRED_OPTIONS,
};
use crate::base::lanes::{Lane, Workers};
use crate::config::RbdImage;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// Threads that open, reopen and close the images of every RBD namespace
/// (each open waits for the cluster, up to the client's timeout): at most
/// this many wait at once.
pub static IMAGE_WORKERS: Workers = Workers::new("rbd-life", 8);

/// How long after a failed open the next attempt starts.
const RETRY_OPEN: Duration = Duration::from_secs(5);
/// How often an image being retired is looked at.
const RETIRE_POLL: Duration = Duration::from_millis(20);

/// One namespace's image life: what its jobs share.
pub(super) struct Life {
    ns: Weak<dyn RbdNamespace>,
    changed: Box<dyn Fn() + Send + Sync>,
    lane: Lane,
    /// A notice waits on the lane: later ones join it.
    noticed: AtomicBool,
    /// Between attempts to open the image.
    opening: Mutex<Opening>,
}

/// What an opening keeps from one attempt to the next.
#[derive(Default)]
struct Opening {
    /// The last failure, logged as an error when new, quietly while it
    /// repeats.
    last_failure: String,
    /// Kept while the image does not exist yet: no new connection per try.
    connected: Option<Arc<Cluster>>,
}

impl RbdBackend {
    /// Starts, once, the life of the image of `ns` (whose backend this is):
    /// opens it, activates the namespace and follows the image's resizes;
    /// `changed` tells the subsystem's controllers that the namespace
    /// changed. It ends when the namespace goes.
    pub fn start(&self, ns: Weak<dyn RbdNamespace>, changed: impl Fn() + Send + Sync + 'static) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let life = Arc::new(Life {
            ns,
            changed: Box::new(changed),
            lane: Lane::new(&IMAGE_WORKERS),
            noticed: AtomicBool::new(false),
            opening: Mutex::default(),
        });
        let _ = self.health.life.set(life.clone());
        life.clone().lane.submit(Box::new(move || life.open()));
    }
}

impl Life {
    /// Something happened to the image: its update watch fired (a resize,
    /// or the client blocklisted), or an operation found the client
    /// blocklisted. One job looks at both, once.
    pub(super) fn notice(self: &Arc<Self>) {
        if self.noticed.swap(true, Ordering::AcqRel) {
            return;
        }
        let life = self.clone();
        self.lane.submit(Box::new(move || {
            life.noticed.store(false, Ordering::Release);
            life.on_notice();
        }));
    }

    /// Replaces the image when its client is the one reported blocklisted,
    /// else follows a resize.
    fn on_notice(self: &Arc<Self>) {
        let Some(n) = self.ns.upgrade() else {
            return;
        };
        let r = n.rbd();
        let reported = r.health.blocklisted.swap(0, Ordering::AcqRel);
        match r.current() {
            Some(old) if Arc::as_ptr(&old) as usize == reported => {
                drop(n);
                self.reconnect(old);
            }
            _ => follow_resize(&*n, &self.changed),
        }
    }

    /// One attempt to open the image of the namespace and make it the
    /// namespace's; another in RETRY_OPEN when it fails, until the
    /// namespace is gone. The image's update watch notices the life.
    fn open(self: &Arc<Self>) {
        let Some(n) = self.ns.upgrade() else {
            return;
        };
        let r = n.rbd();
        let mut o = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
        let opened = match o.connected.take() {
            Some(c) => Ok(c),
            None => cluster(&r.spec),
        }
        .and_then(|c| {
            open(&c, &r.spec, r.read_only).inspect_err(|e| {
                if ffi::errno_of(e) == Some(libc::ENOENT) {
                    o.connected = Some(c.clone());
                }
            })
        });
        match opened {
            Ok(mut opened) => {
                let life = Arc::downgrade(self);
                // One pending notice is enough: the size is read anew.
                if let Err(e) = opened.watch(move || {
                    if let Some(l) = life.upgrade() {
                        l.notice();
                    }
                }) {
                    tracing::warn!(image = %r.spec.spec(), "resizes will not be seen: {e}");
                }
                match activate(&*n, opened) {
                    Ok(true) => (self.changed)(),
                    Ok(false) => follow_resize(&*n, &self.changed),
                    Err(e) => {
                        tracing::error!(image = %r.spec.spec(), "{e}; retrying");
                        self.retry_open();
                    }
                }
                *o = Opening::default();
            }
            Err(e) if e.to_string() == o.last_failure => {
                tracing::debug!(
                    image = %r.spec.spec(),
                    "still cannot open the RBD image: {e}; retrying in {RETRY_OPEN:?}"
                );
                self.retry_open();
            }
            Err(e) => {
                tracing::error!(
                    image = %r.spec.spec(),
                    client = %r.spec.client_id,
                    "cannot open the RBD image: {e}; retrying every {RETRY_OPEN:?}"
                );
                o.last_failure = e.to_string();
                self.retry_open();
            }
        }
    }

    fn retry_open(self: &Arc<Self>) {
        let life = self.clone();
        self.lane
            .submit_after(RETRY_OPEN, Box::new(move || life.open()));
    }

    /// Replaces `old`, whose client the cluster blocklisted: the shared
    /// connection is forgotten, the image opened again on a new one and
    /// put in its place (I/O meanwhile fails on the old one with a status
    /// the host retries); the old one is closed once the operations started
    /// on it have ended (librbd ends them with an error, within the
    /// client's operation timeout), by jobs of its own lane, so that this
    /// one is free at once for what happens to the new one. While the
    /// new one does not open (retried every RETRY_OPEN), I/O still meets
    /// the old one and reports it again: those reports are dropped, one
    /// opening is under way.
    fn reconnect(self: &Arc<Self>, old: Arc<Image>) {
        let Some(n) = self.ns.upgrade() else {
            return;
        };
        let r = n.rbd();
        if !r.retire(&old) {
            return;
        }
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
        let deadline = Instant::now() + 2 * timeout + Duration::from_secs(5);
        close_when_idle(Lane::new(&IMAGE_WORKERS), old, spec, deadline);
        self.open();
    }
}

/// Closes `old`, an image of a blocklisted client, once no operation holds
/// it any more (looked at every RETIRE_POLL on `lane`), or leaves it open
/// past `deadline`.
fn close_when_idle(lane: Lane, old: Arc<Image>, spec: String, deadline: Instant) {
    if Arc::strong_count(&old) == 1 {
        return old.close();
    }
    if Instant::now() >= deadline {
        // Closing it would free what librbd still uses: it is left open.
        tracing::error!(
            image = %spec,
            "operations of the blocklisted connection did not end; its image is left open"
        );
        return std::mem::forget(old);
    }
    let again = lane.clone();
    lane.submit_after(
        RETIRE_POLL,
        Box::new(move || close_when_idle(again, old, spec, deadline)),
    );
}

/// Grows the namespace to its image's size (a resize seen by the update
/// watch, or while the connection was replaced) and tells the controllers.
fn follow_resize(n: &dyn RbdNamespace, changed: &dyn Fn()) {
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
