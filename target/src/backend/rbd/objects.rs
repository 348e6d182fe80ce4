//! RADOS objects of the daemon's own, beyond locks and single attributes:
//! all of an object's attributes at once, an attribute replaced only if it
//! still holds what was read (one atomic operation on the OSD), and watch
//! and notify (every watcher of an object hears a notify and acknowledges
//! it; the notifier waits for them, up to a timeout).

use super::ffi::{check, cstring, Pool};
use super::sys::rados_xattrs_iter_t;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// LIBRADOS_CMPXATTR_OP_EQ.
const CMPXATTR_EQ: u8 = 1;

impl Pool {
    /// Every attribute of object `oid` (none when it is missing).
    pub fn get_attrs(&self, oid: &str) -> io::Result<Vec<(String, Vec<u8>)>> {
        let o = cstring("object", oid)?;
        let lib = self.cluster().lib;
        let mut iter: rados_xattrs_iter_t = std::ptr::null_mut();
        // SAFETY: a live context and a C string; `iter` receives an
        // iterator ended below.
        let rc = unsafe { (lib.rados_getxattrs)(self.ioctx, o.as_ptr(), &mut iter) };
        if rc == -libc::ENOENT {
            return Ok(Vec::new());
        }
        check(&format!("reading the attributes of {oid}"), rc)?;
        let mut out = Vec::new();
        loop {
            let (mut name, mut val, mut len) = (std::ptr::null(), std::ptr::null(), 0usize);
            // SAFETY: a live iterator; the pointers it sets stay valid
            // until the next call on it.
            let rc = unsafe { (lib.rados_getxattrs_next)(iter, &mut name, &mut val, &mut len) };
            if rc < 0 || name.is_null() {
                break;
            }
            // SAFETY: a NUL-terminated name and `len` bytes of value, as
            // rados_getxattrs_next documents.
            let (n, v) = unsafe {
                (
                    CStr::from_ptr(name).to_string_lossy().into_owned(),
                    std::slice::from_raw_parts(val.cast::<u8>(), len).to_vec(),
                )
            };
            out.push((n, v));
        }
        // SAFETY: the iterator from above, used no more.
        unsafe { (lib.rados_getxattrs_end)(iter) };
        Ok(out)
    }

    /// Sets attribute `name` of `oid` to `new` if it still holds `old` (an
    /// empty `old`: the attribute is missing or empty), in one operation;
    /// `Ok(false)` when it holds something else. The object must exist.
    pub fn compare_and_set_attr(
        &self,
        oid: &str,
        name: &str,
        old: &[u8],
        new: &[u8],
    ) -> io::Result<bool> {
        let (o, n) = (cstring("object", oid)?, cstring("attribute", name)?);
        let lib = self.cluster().lib;
        // SAFETY: creates an operation, released below.
        let op = unsafe { (lib.rados_create_write_op)() };
        if op.is_null() {
            return Err(io::Error::other("rados_create_write_op failed"));
        }
        // SAFETY: a live operation; librados copies the name and values
        // when they are added. Then run on a live context and released.
        let rc = unsafe {
            (lib.rados_write_op_cmpxattr)(
                op,
                n.as_ptr(),
                CMPXATTR_EQ,
                old.as_ptr().cast::<c_char>(),
                old.len(),
            );
            (lib.rados_write_op_setxattr)(op, n.as_ptr(), new.as_ptr().cast::<c_char>(), new.len());
            let rc =
                (lib.rados_write_op_operate)(op, self.ioctx, o.as_ptr(), std::ptr::null_mut(), 0);
            (lib.rados_release_write_op)(op);
            rc
        };
        if rc == -libc::ECANCELED {
            return Ok(false);
        }
        check(&format!("replacing {oid} {name}"), rc)?;
        Ok(true)
    }

    /// Watches `oid` (which must exist): `heard` gets each notify's payload
    /// on a librados thread, and the notify is acknowledged once it
    /// returns. A watch the cluster lost (this client cut off for longer
    /// than `timeout`) calls `lost`. Ends when the [`Watch`] drops.
    pub fn watch(
        self: &Arc<Self>,
        oid: &str,
        timeout: Duration,
        heard: impl Fn(&[u8]) + Send + Sync + 'static,
        lost: impl Fn(i32) + Send + Sync + 'static,
    ) -> io::Result<Watch> {
        let o = cstring("object", oid)?;
        let ctx = Box::into_raw(Box::new(WatchContext {
            pool: self.clone(),
            oid: o.clone(),
            heard: Box::new(heard),
            lost: Box::new(lost),
        }));
        let mut cookie = 0u64;
        let lib = self.cluster().lib;
        // SAFETY: a live context and C string; `ctx` stays valid until
        // rados_unwatch2 returned in `Drop` (librados waits for running
        // callbacks there).
        let rc = unsafe {
            (lib.rados_watch3)(
                self.ioctx,
                o.as_ptr(),
                &mut cookie,
                Some(on_notify),
                Some(on_watch_error),
                timeout.as_secs().clamp(1, u32::MAX as u64) as u32,
                ctx.cast(),
            )
        };
        if let Err(e) = check(&format!("watching {oid}"), rc) {
            // SAFETY: librados did not take the context.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(e);
        }
        Ok(Watch { cookie, ctx })
    }

    /// Sends `payload` to every watcher of `oid` and waits (up to
    /// `timeout`) until each acknowledged it: ETIMEDOUT when one did not.
    pub fn notify(&self, oid: &str, payload: &[u8], timeout: Duration) -> io::Result<()> {
        let o = cstring("object", oid)?;
        let lib = self.cluster().lib;
        let (mut reply, mut reply_len) = (std::ptr::null_mut::<c_char>(), 0usize);
        // SAFETY: a live context, a C string and the payload's bytes;
        // `reply` receives a buffer librados allocated, freed below.
        let rc = unsafe {
            (lib.rados_notify2)(
                self.ioctx,
                o.as_ptr(),
                payload.as_ptr().cast::<c_char>(),
                payload.len() as c_int,
                timeout.as_millis() as u64,
                &mut reply,
                &mut reply_len,
            )
        };
        if !reply.is_null() {
            // SAFETY: allocated by librados for this call.
            unsafe { (lib.rados_buffer_free)(reply) };
        }
        check(&format!("notifying the watchers of {oid}"), rc)?;
        Ok(())
    }
}

/// What a watch does with a notify's payload.
type Heard = Box<dyn Fn(&[u8]) + Send + Sync>;

/// What a watch's callbacks need.
struct WatchContext {
    pool: Arc<Pool>,
    oid: std::ffi::CString,
    heard: Heard,
    lost: Box<dyn Fn(i32) + Send + Sync>,
}

/// A watch on an object, ended on drop.
pub struct Watch {
    cookie: u64,
    ctx: *mut WatchContext,
}

// SAFETY: the context is only read, by librados threads and by `Drop`,
// and all it holds is Send + Sync.
unsafe impl Send for Watch {}
// SAFETY: as above.
unsafe impl Sync for Watch {}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: `ctx` is ours until unwatch returned (no callback runs
        // after it); the pool inside keeps the context alive meanwhile.
        unsafe {
            let pool = &(*self.ctx).pool;
            (pool.cluster().lib.rados_unwatch2)(pool.ioctx, self.cookie);
            drop(Box::from_raw(self.ctx));
        }
    }
}

unsafe extern "C" fn on_notify(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    _notifier: u64,
    data: *mut c_void,
    len: usize,
) {
    // SAFETY: `arg` is the watch's context, alive while the watch is.
    let ctx = unsafe { &*(arg as *const WatchContext) };
    let payload = if data.is_null() {
        &[][..]
    } else {
        // SAFETY: librados passes `len` bytes at `data` for this call.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
    };
    (ctx.heard)(payload);
    let lib = ctx.pool.cluster().lib;
    // SAFETY: a live context and C string; no reply payload.
    unsafe {
        (lib.rados_notify_ack)(
            ctx.pool.ioctx,
            ctx.oid.as_ptr(),
            notify_id,
            cookie,
            std::ptr::null(),
            0,
        )
    };
}

unsafe extern "C" fn on_watch_error(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in `on_notify`.
    let ctx = unsafe { &*(arg as *const WatchContext) };
    (ctx.lost)(err);
}
