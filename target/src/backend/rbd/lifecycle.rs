//! An RBD image's life on its namespace's thread: opening it (retrying
//! until it works or the namespace goes), activating the namespace,
//! following resizes, and opening it again on a new connection when the
//! cluster blocklisted the client.

use super::ffi::{self, Cluster, Image};
use super::{
    blocklisted, cluster, forget_cluster, RbdBackend, RbdNamespace, CLIENT_OPTIONS,
    REQUIRED_OPTIONS,
};
use crate::config::RbdImage;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

impl RbdBackend {
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

/// How long after a failed open the next attempt starts.
const RETRY_OPEN: Duration = Duration::from_secs(5);

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
/// retries); a thread of its own closes the old one once the operations
/// started on it have ended (librbd ends them with an error, within the
/// client's operation timeout), so that this thread is free at once for
/// what happens to the new one. False once the namespace is gone.
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
    r.retire(&old);
    drop(n);
    let deadline = Instant::now() + 2 * timeout + Duration::from_secs(5);
    let held = old.clone();
    let closing = std::thread::Builder::new()
        .name("rbd-retire".into())
        .spawn(move || close_when_idle(old, &spec, deadline));
    match closing {
        Ok(_) => drop(held),
        Err(e) => {
            // Closing it here could free what librbd still uses.
            tracing::error!("no thread to close a blocklisted RBD image ({e}); it is left open");
            std::mem::forget(held);
        }
    }
    open_until_done(ns, changed)
}

/// Closes `old`, an image of a blocklisted client, once no operation holds
/// it any more, or leaves it open past `deadline`.
fn close_when_idle(old: Arc<Image>, spec: &str, deadline: Instant) {
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
