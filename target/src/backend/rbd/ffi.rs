//! Safe wrappers over the librados and librbd calls of [`super::sys`]: the
//! library, loaded once at run time; a cluster connection; an open image
//! and its asynchronous I/O.

use super::sys::{
    rados_ioctx_t, rados_t, rbd_completion_t, rbd_config_option_t, rbd_image_t, Librbd,
};
use crate::base::sched::BatchThreads;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock, PoisonError, RwLock, RwLockReadGuard};

/// The shared object loaded; it pulls in librados.
const LIBRARY: &str = "librbd.so.1";

/// librbd once loading was tried: the library, or why it did not load.
static LIB: OnceLock<Result<Librbd, String>> = OnceLock::new();

/// librbd, loaded on first use: a target without RBD namespaces never
/// loads it.
pub fn library() -> io::Result<&'static Librbd> {
    LIB.get_or_init(|| {
        // SAFETY: loading librbd runs its initialisers, which only set up
        // the library's own state; every symbol is checked for presence
        // (`--dynamic-link-require-all`) and has the signature of the
        // headers the bindings were generated from (librbd's C API is
        // stable across releases).
        unsafe { Librbd::new(LIBRARY) }.map_err(|e| {
            format!(
                "backend = \"rbd\" needs {LIBRARY} ({e}); install librbd1 \
                 (Debian, Ubuntu) or librbd (Fedora)"
            )
        })
    })
    .as_ref()
    .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e.clone()))
}

/// Whether librbd (and with it librados) is loaded in this process.
pub fn loaded() -> bool {
    LIB.get().is_some_and(Result::is_ok)
}

/// An error from a librados or librbd call returning `-errno`.
pub(super) fn check(what: &str, rc: c_int) -> io::Result<c_int> {
    if rc < 0 {
        let kind = io::Error::from_raw_os_error(-rc).kind();
        Err(io::Error::new(
            kind,
            CallError {
                what: what.to_string(),
                errno: -rc,
            },
        ))
    } else {
        Ok(rc)
    }
}

/// A librados or librbd call that failed, and its errno.
#[derive(Debug)]
struct CallError {
    what: String,
    errno: i32,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let e = io::Error::from_raw_os_error(self.errno);
        write!(f, "{}: {e}", self.what)
    }
}

impl std::error::Error for CallError {}

/// The errno of a failed librados or librbd call.
pub fn errno_of(e: &io::Error) -> Option<i32> {
    e.get_ref()?.downcast_ref::<CallError>().map(|c| c.errno)
}

pub(super) fn cstring(what: &str, s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::other(format!("{what} contains a NUL byte")))
}

/// A connection to a Ceph cluster (`rados_t`), shut down on drop.
pub struct Cluster {
    handle: rados_t,
    pub(super) lib: &'static Librbd,
}

// SAFETY: a rados_t may be used from any thread, and concurrently
// (librados documents the handle as thread safe once connected).
unsafe impl Send for Cluster {}
// SAFETY: as above.
unsafe impl Sync for Cluster {}

impl Cluster {
    /// Connects as `client.<id>` with the configuration file `conf`, then
    /// `options` (name, value) set over it.
    pub fn connect(conf: &str, id: &str, options: &[(&str, String)]) -> io::Result<Cluster> {
        let lib = library()?;
        // librados' threads (messenger, completions) start here: they
        // yield to pollers (`base::sched`).
        let _batch = BatchThreads::enter();
        let name = cstring("client id", &format!("client.{id}"))?;
        let mut handle: rados_t = std::ptr::null_mut();
        // SAFETY: `handle` receives the new cluster; the names are C strings
        // that outlive the call.
        check("rados_create2", unsafe {
            (lib.rados_create2)(&mut handle, c"ceph".as_ptr(), name.as_ptr(), 0)
        })?;
        // From here on `Drop` shuts the handle down, connected or not.
        let cluster = Cluster { handle, lib };
        let conf_c = cstring("ceph.conf path", conf)?;
        // SAFETY: a created handle and a C string.
        check(&format!("reading {conf}"), unsafe {
            (lib.rados_conf_read_file)(cluster.handle, conf_c.as_ptr())
        })?;
        for (option, value) in options {
            let (o, v) = (cstring(option, option)?, cstring(option, value)?);
            // SAFETY: a created handle and two C strings.
            check(&format!("setting {option}={value}"), unsafe {
                (lib.rados_conf_set)(cluster.handle, o.as_ptr(), v.as_ptr())
            })?;
        }
        // SAFETY: a configured handle; blocks up to client_mount_timeout.
        check("connecting to the cluster", unsafe {
            (lib.rados_connect)(cluster.handle)
        })?;
        Ok(cluster)
    }

    /// Opens `image` in `pool` (and RBD namespace `namespace`, "" for the
    /// default one) for reading and writing, or for reading only (which
    /// read-only credentials allow); the image keeps the connection alive.
    pub fn open(
        self: &Arc<Self>,
        pool: &str,
        namespace: &str,
        image: &str,
        read_only: bool,
    ) -> io::Result<Image> {
        let lib = self.lib;
        let pool_c = cstring("pool", pool)?;
        let mut ioctx: rados_ioctx_t = std::ptr::null_mut();
        // SAFETY: a connected handle; `ioctx` receives the new context.
        check(&format!("opening pool {pool}"), unsafe {
            (lib.rados_ioctx_create)(self.handle, pool_c.as_ptr(), &mut ioctx)
        })?;
        let ns_c = cstring("RBD namespace", namespace)?;
        // SAFETY: a live I/O context and a C string (copied by librados).
        unsafe { (lib.rados_ioctx_set_namespace)(ioctx, ns_c.as_ptr()) };
        let image_c = cstring("image", image)?;
        let mut handle: rbd_image_t = std::ptr::null_mut();
        let open = if read_only {
            lib.rbd_open_read_only
        } else {
            lib.rbd_open
        };
        // librbd's threads start with the first image.
        let batch = BatchThreads::enter();
        // SAFETY: a live I/O context; `handle` receives the image; no snapshot.
        let rc = unsafe { open(ioctx, image_c.as_ptr(), &mut handle, std::ptr::null()) };
        drop(batch);
        if let Err(e) = check(&format!("opening image {image}"), rc) {
            // SAFETY: the context is ours and nothing uses it any more.
            unsafe { (lib.rados_ioctx_destroy)(ioctx) };
            return Err(e);
        }
        Ok(Image {
            handle,
            ioctx,
            lib,
            watch: None,
            closed: RwLock::new(false),
            cluster: self.clone(),
            in_flight: AtomicUsize::new(0),
        })
    }
}

impl Cluster {
    /// This client's addresses as the cluster's maps name it (what a
    /// blocklist entry must match, e.g. `[v2:127.0.0.1:0/1234,v1:...]`).
    pub fn addresses(&self) -> io::Result<String> {
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: a connected handle; `out` receives a string librados
        // allocated, freed below with its own call.
        check("rados_getaddrs", unsafe {
            (self.lib.rados_getaddrs)(self.handle, &mut out)
        })?;
        // SAFETY: on success `out` is a NUL-terminated string.
        let addrs = unsafe { CStr::from_ptr(out) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: allocated by librados for this call, used no more.
        unsafe { (self.lib.rados_buffer_free)(out) };
        Ok(addrs)
    }

    /// Blocklists the client at `address` (one of a client's addresses,
    /// `ip:port/nonce`) for `expire` (at least a second): the OSDs refuse
    /// its operations from then on, including those already sent.
    pub fn blocklist(&self, address: &str, expire: std::time::Duration) -> io::Result<()> {
        let a = cstring("client address", address)?;
        let secs = expire.as_secs().clamp(1, u32::MAX as u64) as u32;
        // SAFETY: a connected handle and a C string librados only reads
        // (its prototype lacks the const).
        check(&format!("blocklisting {address}"), unsafe {
            (self.lib.rados_blocklist_add)(self.handle, a.as_ptr() as *mut c_char, secs)
        })?;
        Ok(())
    }

    /// An I/O context on pool `pool`, for objects of the daemon's own.
    pub fn pool(self: &Arc<Self>, pool: &str) -> io::Result<Pool> {
        let pool_c = cstring("pool", pool)?;
        let mut ioctx: rados_ioctx_t = std::ptr::null_mut();
        // SAFETY: a connected handle; `ioctx` receives the new context.
        check(&format!("opening pool {pool}"), unsafe {
            (self.lib.rados_ioctx_create)(self.handle, pool_c.as_ptr(), &mut ioctx)
        })?;
        Ok(Pool {
            ioctx,
            cluster: self.clone(),
        })
    }
}

/// An I/O context on one pool (`rados_ioctx_t`), destroyed on drop: object
/// locks and attributes.
pub struct Pool {
    pub(super) ioctx: rados_ioctx_t,
    /// Dropped after the context.
    cluster: Arc<Cluster>,
}

// SAFETY: librados I/O contexts are thread safe for the calls used here.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Pool {
    /// The connection the context is on.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// Takes (or, with `renew`, renews) exclusive lock `name` on object
    /// `oid` (created if missing) for `duration`, as `cookie`, with
    /// description `desc`. EBUSY: another holds it; ENOENT with `renew`:
    /// ours expired or was broken.
    pub fn lock_exclusive(
        &self,
        oid: &str,
        name: &str,
        cookie: &str,
        desc: &str,
        duration: std::time::Duration,
        renew: bool,
    ) -> io::Result<()> {
        let (o, n, c, d) = (
            cstring("object", oid)?,
            cstring("lock name", name)?,
            cstring("lock cookie", cookie)?,
            cstring("lock description", desc)?,
        );
        let mut tv = super::sys::timeval {
            tv_sec: duration.as_secs() as super::sys::__time_t,
            tv_usec: duration.subsec_micros() as super::sys::__suseconds_t,
        };
        // LIBRADOS_LOCK_FLAG_MUST_RENEW: fail rather than take a lock that
        // lapsed meanwhile.
        let flags = if renew { 1 << 1 } else { 0 };
        let lib = self.cluster.lib;
        // SAFETY: a live context, C strings and a timeval that outlive the
        // call.
        check(&format!("locking {oid}"), unsafe {
            (lib.rados_lock_exclusive)(
                self.ioctx,
                o.as_ptr(),
                n.as_ptr(),
                c.as_ptr(),
                d.as_ptr(),
                &mut tv,
                flags,
            )
        })?;
        Ok(())
    }

    /// Releases lock `name` of `oid` held as `cookie`.
    pub fn unlock(&self, oid: &str, name: &str, cookie: &str) -> io::Result<()> {
        let (o, n, c) = (
            cstring("object", oid)?,
            cstring("lock name", name)?,
            cstring("lock cookie", cookie)?,
        );
        let lib = self.cluster.lib;
        // SAFETY: a live context and C strings.
        check(&format!("unlocking {oid}"), unsafe {
            (lib.rados_unlock)(self.ioctx, o.as_ptr(), n.as_ptr(), c.as_ptr())
        })?;
        Ok(())
    }

    /// Attribute `name` of object `oid`; `None` when either is missing.
    pub fn get_attr(&self, oid: &str, name: &str) -> io::Result<Option<Vec<u8>>> {
        let (o, n) = (cstring("object", oid)?, cstring("attribute", name)?);
        let mut buf = vec![0u8; 4096];
        let lib = self.cluster.lib;
        // SAFETY: a live context, C strings, and a buffer of `buf.len()`.
        let rc = unsafe {
            (lib.rados_getxattr)(
                self.ioctx,
                o.as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
            )
        };
        if rc == -libc::ENOENT || rc == -libc::ENODATA {
            return Ok(None);
        }
        let len = check(&format!("reading {oid} {name}"), rc)? as usize;
        buf.truncate(len);
        Ok(Some(buf))
    }

    /// Sets attribute `name` of object `oid` (created if missing).
    pub fn set_attr(&self, oid: &str, name: &str, value: &[u8]) -> io::Result<()> {
        let (o, n) = (cstring("object", oid)?, cstring("attribute", name)?);
        let lib = self.cluster.lib;
        // SAFETY: a live context, C strings, and `value`'s bytes.
        check(&format!("writing {oid} {name}"), unsafe {
            (lib.rados_setxattr)(
                self.ioctx,
                o.as_ptr(),
                n.as_ptr(),
                value.as_ptr() as *const c_char,
                value.len(),
            )
        })?;
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: the context is ours and nothing uses it any more.
        unsafe { (self.cluster.lib.rados_ioctx_destroy)(self.ioctx) };
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: every image (with its I/O context) of this cluster holds
        // an `Arc` of it, so none is left.
        unsafe { (self.lib.rados_shutdown)(self.handle) };
    }
}

/// An open image (`rbd_image_t`) and its I/O context, closed on drop.
pub struct Image {
    handle: rbd_image_t,
    ioctx: rados_ioctx_t,
    lib: &'static Librbd,
    /// The update watch: its handle and the callback's context.
    watch: Option<(u64, *mut WatchContext)>,
    /// Whether `close` ran (the handles are gone). The control calls
    /// (size, id, flush) hold it for reading, `close` for writing; I/O
    /// (`start`) relies on its caller instead (see there).
    closed: RwLock<bool>,
    /// Dropped after the image: the connection outlives it.
    cluster: Arc<Cluster>,
    /// Operations started on it and not ended (counted by `ops`).
    pub(super) in_flight: AtomicUsize,
}

// SAFETY: librbd's image calls are thread safe (its own locks protect the
// image state); the handles are used only while `closed` is false, checked
// under its lock (or, for I/O, by the caller's contract); the watch context
// is touched only by its callback and by `close`, after unregistering it.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

/// What an update watch calls: boxed so that its address stays put.
type WatchContext = Box<dyn Fn() + Send + Sync>;

impl Image {
    /// The connection the image was opened on.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// The image's size in bytes now.
    pub fn size(&self) -> io::Result<u64> {
        let _open = self.open_handle()?;
        let mut size = 0u64;
        // SAFETY: an open image (held open by `_open`); `size` receives the value.
        check("rbd_get_size", unsafe {
            (self.lib.rbd_get_size)(self.handle, &mut size)
        })?;
        Ok(size)
    }

    /// The image's id: stable for its life, unlike its name.
    pub fn id(&self) -> io::Result<String> {
        let _open = self.open_handle()?;
        let mut buf = [0 as c_char; 128];
        // SAFETY: an open image (held open by `_open`); librbd writes a
        // NUL-terminated id of at most `buf.len()` bytes.
        check("rbd_get_id", unsafe {
            (self.lib.rbd_get_id)(self.handle, buf.as_mut_ptr(), buf.len())
        })?;
        // SAFETY: rbd_get_id succeeded, so `buf` holds a C string.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Calls `changed` (on a librbd thread) whenever the image's header
    /// changes, e.g. after a resize; until the image is dropped.
    pub fn watch(&mut self, changed: impl Fn() + Send + Sync + 'static) -> io::Result<()> {
        let ctx: *mut WatchContext = Box::into_raw(Box::new(Box::new(changed)));
        let mut handle = 0u64;
        // librbd's thread pool starts with the first watch.
        let batch = BatchThreads::enter();
        // SAFETY: an open image; `ctx` stays valid until `rbd_update_unwatch`
        // in `Drop` returned (librbd waits for running callbacks there).
        let rc = unsafe {
            (self.lib.rbd_update_watch)(self.handle, &mut handle, Some(on_update), ctx.cast())
        };
        drop(batch);
        if let Err(e) = check("rbd_update_watch", rc) {
            // SAFETY: librbd did not take the context.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(e);
        }
        self.watch = Some((handle, ctx));
        Ok(())
    }

    /// Starts an asynchronous operation; `done` gets its result exactly
    /// once: on a librbd thread, or on this one if librbd refuses it.
    ///
    /// # Safety
    /// A read or write's buffer stays valid (and, for a read, unaliased)
    /// until `done` ran, and so does a compare and write's `mismatch`; the
    /// image is not closed, and is neither closed nor dropped before `done`
    /// ran.
    pub unsafe fn start<F: Finish>(&self, op: Aio, done: Box<F>) {
        let lib = self.lib;
        let arg = Box::into_raw(done);
        let mut c: rbd_completion_t = std::ptr::null_mut();
        // SAFETY: `c` receives the completion; `arg` stays valid until the
        // callback takes it back.
        let rc =
            unsafe { (lib.rbd_aio_create_completion)(arg.cast(), Some(on_complete::<F>), &mut c) };
        if rc < 0 {
            // SAFETY: librbd did not take `arg`.
            return unsafe { Box::from_raw(arg) }.finish(rc as i64);
        }
        let h = self.handle;
        // SAFETY: an open image, a live completion; buffers as the caller
        // promised. rbd_cache is off and zero-copy writes are on (see
        // `super::CLIENT_OPTIONS`), so librbd reads a write's buffer until
        // completion rather than copying it.
        let rc = unsafe {
            match op {
                Aio::Read { offset, buf, len } => {
                    (lib.rbd_aio_read)(h, offset, len, buf.cast::<c_char>(), c)
                }
                Aio::Write { offset, buf, len } => {
                    (lib.rbd_aio_write)(h, offset, len, buf.cast::<c_char>().cast_const(), c)
                }
                Aio::Flush => (lib.rbd_aio_flush)(h, c),
                Aio::Discard { offset, len } => (lib.rbd_aio_discard)(h, offset, len, c),
                Aio::WriteZeroes { offset, len } => {
                    (lib.rbd_aio_write_zeroes)(h, offset, len as usize, c, 0, 0)
                }
                Aio::CompareAndWrite {
                    offset,
                    cmp,
                    buf,
                    len,
                    mismatch,
                } => (lib.rbd_aio_compare_and_write)(
                    h,
                    offset,
                    len,
                    cmp.cast::<c_char>().cast_const(),
                    buf.cast::<c_char>().cast_const(),
                    c,
                    mismatch,
                    0,
                ) as c_int,
            }
        };
        if rc < 0 {
            // Refused before it started: the callback will not run.
            // SAFETY: librbd did not queue the completion; it is ours.
            unsafe { (lib.rbd_aio_release)(c) };
            // SAFETY: as above, `arg` is still ours.
            unsafe { Box::from_raw(arg) }.finish(rc as i64);
        }
    }

    /// Ends the watch, closes the image (releasing its watch and any lock
    /// on the cluster at once, rather than when they time out) and its I/O
    /// context; the first call only. Waits for control calls in progress;
    /// later ones fail. I/O must not be in flight nor follow (see `start`).
    pub fn close(&self) {
        let mut closed = self.closed.write().unwrap_or_else(PoisonError::into_inner);
        if *closed {
            return;
        }
        *closed = true;
        if let Some((handle, ctx)) = self.watch {
            // SAFETY: the watch was registered on this image; after this call
            // no callback runs, so its context can go (once: `closed` guards).
            unsafe {
                (self.lib.rbd_update_unwatch)(self.handle, handle);
                drop(Box::from_raw(ctx));
            }
        }
        // SAFETY: no operation is in flight (as the caller ensures); rbd_close
        // waits for librbd's own work, then the I/O context goes; `closed`
        // keeps this from running twice.
        unsafe {
            (self.lib.rbd_close)(self.handle);
            (self.lib.rados_ioctx_destroy)(self.ioctx);
        }
    }

    /// Holds the image open for a control call; an error once it is closed.
    fn open_handle(&self) -> io::Result<RwLockReadGuard<'_, bool>> {
        let closed = self.closed.read().unwrap_or_else(PoisonError::into_inner);
        if *closed {
            return Err(io::Error::other("the image is closed"));
        }
        Ok(closed)
    }

    /// The image's value of librbd option `name`: the client's, or the
    /// pool's or image's where their configuration overrides it (`rbd
    /// config pool|image set`).
    pub fn config(&self, name: &str) -> io::Result<Option<String>> {
        let _open = self.open_handle()?;
        let list = self.lib.rbd_config_image_list;
        let mut count: c_int = 0;
        // SAFETY: an open image (held open by `_open`); with no room
        // (`count` 0) librbd only writes how many options there are.
        let rc = unsafe { list(self.handle, std::ptr::null_mut(), &mut count) };
        if rc != -libc::ERANGE {
            check("rbd_config_image_list", rc)?;
        }
        let empty = rbd_config_option_t {
            name: std::ptr::null_mut(),
            value: std::ptr::null_mut(),
            source: 0,
        };
        let mut options = vec![empty; count.max(0) as usize];
        // SAFETY: `options` has room for `count` entries, which librbd fills
        // with strings it allocates (freed by the cleanup below).
        check("rbd_config_image_list", unsafe {
            list(self.handle, options.as_mut_ptr(), &mut count)
        })?;
        let filled = &options[..(count.max(0) as usize).min(options.len())];
        let value = filled.iter().find_map(|o| {
            // SAFETY: librbd filled the entry with NUL-terminated strings,
            // alive until the cleanup below.
            let (n, v) = unsafe { (CStr::from_ptr(o.name), CStr::from_ptr(o.value)) };
            (n.to_bytes() == name.as_bytes()).then(|| v.to_string_lossy().into_owned())
        });
        // SAFETY: the entries librbd filled, once.
        unsafe { (self.lib.rbd_config_image_list_cleanup)(options.as_mut_ptr(), count) };
        Ok(value)
    }

    /// Waits until every write so far is durable.
    pub fn flush(&self) -> io::Result<()> {
        let _open = self.open_handle()?;
        // SAFETY: an open image (held open by `_open`).
        check("rbd_flush", unsafe { (self.lib.rbd_flush)(self.handle) })?;
        Ok(())
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        self.close();
    }
}

/// One asynchronous operation.
#[derive(Clone, Copy, Debug)]
pub enum Aio {
    Read {
        offset: u64,
        buf: *mut u8,
        len: usize,
    },
    Write {
        offset: u64,
        buf: *mut u8,
        len: usize,
    },
    Flush,
    Discard {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
    },
    /// Writes `buf` where `len` bytes at `offset` equal `cmp`, atomically
    /// at the OSD; -EILSEQ otherwise, the offset of the first difference
    /// in `*mismatch`.
    CompareAndWrite {
        offset: u64,
        cmp: *mut u8,
        buf: *mut u8,
        len: usize,
        mismatch: *mut u64,
    },
}

/// Who hears of an operation's end, with librbd's return value (bytes
/// or 0, or `-errno`).
pub trait Finish: Send {
    fn finish(self: Box<Self>, rc: i64);
}

unsafe extern "C" fn on_complete<F: Finish>(c: rbd_completion_t, arg: *mut c_void) {
    let Ok(lib) = library() else {
        return;
    };
    // SAFETY: librbd calls this once per completion, with the live
    // completion; reading its value and releasing it are ours to do.
    let rc = unsafe {
        let rc = (lib.rbd_aio_get_return_value)(c);
        (lib.rbd_aio_release)(c);
        rc
    };
    // SAFETY: `arg` is the box `Image::start` gave away for this completion.
    unsafe { Box::from_raw(arg.cast::<F>()) }.finish(rc as i64);
}

unsafe extern "C" fn on_update(arg: *mut c_void) {
    // SAFETY: `arg` is the context `Image::watch` registered, alive until
    // the watch is unregistered, which waits for this call.
    let changed = unsafe { &*arg.cast::<WatchContext>() };
    changed();
}
