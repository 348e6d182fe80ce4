//! RDMA connection manager: event channels, ids (listening or connected,
//! each owning its queue pair), and events copied out and acknowledged at once.

use super::verbs::{set_nonblocking, Cq, CqRef, Device, Pd, Srq};
use rdma_sys::*;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn check(rc: i32, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error(what))
    }
}

/// An RDMA CM event channel with a non-blocking descriptor.
pub struct CmChannel {
    ptr: *mut rdma_event_channel,
}

// SAFETY: librdmacm channels may be used from any thread.
unsafe impl Send for CmChannel {}
// SAFETY: as above.
unsafe impl Sync for CmChannel {}

/// What happened on an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    RouteResolved,
    ConnectRequest,
    Established,
    Rejected,
    Disconnected,
    TimewaitExit,
    DeviceRemoval,
    /// Address or route resolution, connection or reachability failed.
    Error,
    Other,
}

/// An event, copied out of librdmacm (which has been told it is handled).
pub struct CmEvent {
    pub kind: CmEventKind,
    /// The event's name, for logs.
    pub name: String,
    pub status: i32,
    /// The `context` of the id the event is for (see [`CmId::set_context`]).
    pub context: u64,
    /// For a connect request: the new id, owned by the receiver.
    pub new_id: Option<NewId>,
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
}

/// The id of an incoming connection, not yet adopted by a [`CmId`];
/// dropping it refuses the connection.
pub struct NewId(*mut rdma_cm_id);

// SAFETY: an id may move between threads; it is used by one at a time.
unsafe impl Send for NewId {}

impl NewId {
    /// Refuses the connection with `private_data`.
    pub fn reject(self, private_data: &[u8]) -> io::Result<()> {
        // SAFETY: the id is alive (dropped, and so destroyed, after this);
        // the data lives through the call.
        let rc = unsafe {
            rdma_reject(
                self.0,
                private_data.as_ptr().cast(),
                private_data.len() as u8,
            )
        };
        check(rc, "rdma_reject")
    }

    /// The device the connection arrived on.
    pub fn device(&self) -> Device {
        // SAFETY: an incoming id is bound to its device's open context.
        unsafe { Device::from_raw((*self.0).verbs) }
    }

    /// The peer's address, for logs.
    pub fn peer(&self) -> String {
        // SAFETY: the id is alive; the route holds a sockaddr of its family.
        unsafe {
            let a = &(*self.0).route.addr.dst_addr_union;
            sockaddr_string(&a.dst_storage)
        }
    }
}

impl Drop for NewId {
    fn drop(&mut self) {
        // SAFETY: an unadopted id is still ours to destroy.
        unsafe { rdma_destroy_id(self.0) };
    }
}

impl CmChannel {
    pub fn new() -> io::Result<Arc<CmChannel>> {
        // SAFETY: no arguments; null on failure.
        let ptr = unsafe { rdma_create_event_channel() };
        if ptr.is_null() {
            return Err(last_error("rdma_create_event_channel"));
        }
        let ch = CmChannel { ptr };
        set_nonblocking(ch.fd())?;
        Ok(Arc::new(ch))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is open.
        unsafe { (*self.ptr).fd }
    }

    /// The next event, if one is ready.
    pub fn next_event(&self) -> io::Result<Option<CmEvent>> {
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is open (non-blocking); `ev` is writable.
        if unsafe { rdma_get_cm_event(self.ptr, &mut ev) } != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(io::Error::new(e.kind(), format!("rdma_get_cm_event: {e}"))),
            };
        }
        // SAFETY: `ev` is a valid event until acknowledged below; everything
        // needed is copied out first.
        unsafe {
            let e = &*ev;
            let kind = match e.event {
                rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
                rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
                rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
                rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
                rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
                rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
                rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
                rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
                rdma_cm_event_type::RDMA_CM_EVENT_ADDR_ERROR
                | rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_ERROR
                | rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_ERROR
                | rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Error,
                _ => CmEventKind::Other,
            };
            let conn = &e.param.conn;
            let private_data = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data as *const u8,
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            let new_id = (kind == CmEventKind::ConnectRequest).then(|| NewId(e.id));
            let context = if kind == CmEventKind::ConnectRequest {
                (*e.listen_id).context as u64
            } else {
                (*e.id).context as u64
            };
            let out = CmEvent {
                kind,
                name: std::ffi::CStr::from_ptr(rdma_event_str(e.event))
                    .to_string_lossy()
                    .into_owned(),
                status: e.status,
                context,
                new_id,
                private_data,
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
            };
            rdma_ack_cm_event(ev);
            Ok(Some(out))
        }
    }

    /// Waits up to `timeout` for the next event.
    pub fn wait_event(&self, timeout: Duration) -> io::Result<Option<CmEvent>> {
        if let Some(e) = self.next_event()? {
            return Ok(Some(e));
        }
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe {
            libc::poll(
                &mut pfd,
                1,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        self.next_event()
    }
}

impl Drop for CmChannel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel holds an Arc of it, so none is left.
        unsafe { rdma_destroy_event_channel(self.ptr) };
    }
}

/// How a queue pair is built.
pub struct QpConfig<'a> {
    pub pd: &'a Arc<Pd>,
    pub send_cq: &'a Cq,
    pub recv_cq: &'a Cq,
    /// Receives come from this SRQ rather than the QP's own queue.
    pub srq: Option<&'a Arc<Srq>>,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// What a queue pair refers to; kept alive as long as the queue pair.
struct QpDeps {
    _pd: Arc<Pd>,
    _cqs: [CqRef; 2],
    _srq: Option<Arc<Srq>>,
}

/// Connection parameters for accept and connect.
pub struct ConnParam<'a> {
    pub private_data: &'a [u8],
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
}

/// An RDMA CM id and the queue pair it owns.
pub struct CmId {
    ptr: *mut rdma_cm_id,
    channel: Arc<CmChannel>,
    qp: Option<QpDeps>,
}

// SAFETY: an id is used by one thread at a time; librdmacm allows moving it.
unsafe impl Send for CmId {}

impl CmId {
    /// A new id for reliable-connected (TCP port space) connections.
    pub fn new(channel: &Arc<CmChannel>) -> io::Result<CmId> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: the channel is open; `ptr` is writable.
        let rc = unsafe {
            rdma_create_id(
                channel.ptr,
                &mut ptr,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        check(rc, "rdma_create_id")?;
        Ok(CmId {
            ptr,
            channel: channel.clone(),
            qp: None,
        })
    }

    /// Takes ownership of an incoming connection's id and moves its events
    /// to `channel`.
    pub fn adopt(new: NewId, channel: &Arc<CmChannel>) -> io::Result<CmId> {
        let ptr = new.0;
        std::mem::forget(new);
        // SAFETY: the id is valid and its connect request event was acknowledged.
        let rc = unsafe { rdma_migrate_id(ptr, channel.ptr) };
        let id = CmId {
            ptr,
            channel: channel.clone(),
            qp: None,
        };
        check(rc, "rdma_migrate_id")?;
        Ok(id)
    }

    /// Binds to `addr` and listens.
    pub fn listen(&mut self, addr: SocketAddr, backlog: i32) -> io::Result<()> {
        let mut sa = SockAddr::from(addr);
        // SAFETY: `sa` holds a valid sockaddr of its family.
        let rc = unsafe { rdma_bind_addr(self.ptr, sa.as_mut_ptr()) };
        check(rc, "rdma_bind_addr")?;
        // SAFETY: the id is bound.
        check(unsafe { rdma_listen(self.ptr, backlog) }, "rdma_listen")
    }

    /// Starts resolving `dst` to a device (event AddrResolved).
    pub fn resolve_addr(&mut self, dst: SocketAddr, timeout: Duration) -> io::Result<()> {
        let mut sa = SockAddr::from(dst);
        // SAFETY: `sa` holds a valid sockaddr; no source address.
        let rc = unsafe {
            rdma_resolve_addr(
                self.ptr,
                std::ptr::null_mut(),
                sa.as_mut_ptr(),
                timeout.as_millis() as i32,
            )
        };
        check(rc, "rdma_resolve_addr")
    }

    /// Starts resolving the route (event RouteResolved).
    pub fn resolve_route(&mut self, timeout: Duration) -> io::Result<()> {
        // SAFETY: the address is resolved.
        let rc = unsafe { rdma_resolve_route(self.ptr, timeout.as_millis() as i32) };
        check(rc, "rdma_resolve_route")
    }

    /// The device the id is bound to, once it is.
    pub fn device(&self) -> Option<Device> {
        // SAFETY: the id is alive; `verbs` is a context librdmacm keeps open.
        unsafe {
            let ctx = (*self.ptr).verbs;
            (!ctx.is_null()).then(|| Device::from_raw(ctx))
        }
    }

    /// The value events of this id carry as their `context`.
    pub fn set_context(&mut self, v: u64) {
        // SAFETY: the id is alive; the context is an opaque value.
        unsafe { (*self.ptr).context = v as *mut std::ffi::c_void };
    }

    /// The peer's address, for logs.
    pub fn peer(&self) -> String {
        // SAFETY: the id is alive; the route holds a sockaddr of its family.
        unsafe {
            let a = &(*self.ptr).route.addr.dst_addr_union;
            sockaddr_string(&a.dst_storage)
        }
    }

    /// Our own address on the connection (where the peer reached us).
    pub fn local(&self) -> Option<SocketAddr> {
        // SAFETY: the id is alive; the route holds a sockaddr of its family.
        unsafe {
            let a = &(*self.ptr).route.addr.src_addr_union;
            sockaddr(&a.src_storage)
        }
    }

    /// Creates the id's RC queue pair.
    pub fn create_qp(&mut self, c: &QpConfig) -> io::Result<()> {
        // SAFETY: plain data; zeroed is a valid value.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = c.send_cq.as_ptr();
        attr.recv_cq = c.recv_cq.as_ptr();
        attr.srq = c.srq.map_or(std::ptr::null_mut(), |s| s.as_ptr());
        attr.cap.max_send_wr = c.max_send_wr;
        attr.cap.max_recv_wr = if c.srq.is_some() { 0 } else { c.max_recv_wr };
        attr.cap.max_send_sge = c.max_send_sge;
        attr.cap.max_recv_sge = if c.srq.is_some() { 0 } else { c.max_recv_sge };
        attr.cap.max_inline_data = c.max_inline_data;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        // SAFETY: the id has a device; PD, CQs and SRQ are alive and kept so
        // by `QpDeps` for as long as the queue pair.
        let rc = unsafe { rdma_create_qp(self.ptr, c.pd.as_ptr(), &mut attr) };
        check(rc, "rdma_create_qp")?;
        self.qp = Some(QpDeps {
            _pd: c.pd.clone(),
            _cqs: [c.send_cq.keep(), c.recv_cq.keep()],
            _srq: c.srq.cloned(),
        });
        Ok(())
    }

    /// The queue pair, for posting (null before [`CmId::create_qp`]).
    pub fn qp(&self) -> *mut ibv_qp {
        // SAFETY: the id is alive.
        unsafe { (*self.ptr).qp }
    }

    pub fn qp_num(&self) -> u32 {
        let qp = self.qp();
        if qp.is_null() {
            0
        } else {
            // SAFETY: a non-null qp is alive while the id owns it.
            unsafe { (*qp).qp_num }
        }
    }

    fn conn_param(p: &ConnParam) -> rdma_conn_param {
        // SAFETY: plain data; zeroed is a valid value.
        let mut cp: rdma_conn_param = unsafe { std::mem::zeroed() };
        cp.private_data = p.private_data.as_ptr().cast();
        cp.private_data_len = p.private_data.len() as u8;
        cp.responder_resources = p.responder_resources;
        cp.initiator_depth = p.initiator_depth;
        cp.flow_control = 1;
        cp.retry_count = p.retry_count;
        cp.rnr_retry_count = p.rnr_retry_count;
        cp
    }

    /// Accepts an incoming connection (event Established follows).
    pub fn accept(&mut self, p: &ConnParam) -> io::Result<()> {
        let mut cp = Self::conn_param(p);
        // SAFETY: the id has a queue pair; `cp` and its private data live through the call.
        check(unsafe { rdma_accept(self.ptr, &mut cp) }, "rdma_accept")
    }

    /// Connects (event Established or Rejected follows).
    pub fn connect(&mut self, p: &ConnParam) -> io::Result<()> {
        let mut cp = Self::conn_param(p);
        // SAFETY: as accept.
        check(unsafe { rdma_connect(self.ptr, &mut cp) }, "rdma_connect")
    }

    /// Refuses an incoming connection with `private_data`.
    pub fn reject(&mut self, private_data: &[u8]) -> io::Result<()> {
        // SAFETY: the data lives through the call.
        let rc = unsafe {
            rdma_reject(
                self.ptr,
                private_data.as_ptr().cast(),
                private_data.len() as u8,
            )
        };
        check(rc, "rdma_reject")
    }

    /// Starts a disconnect; the queue pair goes to the error state, and
    /// its outstanding work requests complete as flushed.
    pub fn disconnect(&mut self) {
        // SAFETY: the id is alive; disconnecting twice only fails.
        unsafe { rdma_disconnect(self.ptr) };
    }

    /// The channel the id's events arrive on.
    pub fn channel(&self) -> &Arc<CmChannel> {
        &self.channel
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the queue pair goes before the id; all events of the id
        // were acknowledged when they were read (so destroy does not wait).
        unsafe {
            if self.qp.take().is_some() {
                rdma_destroy_qp(self.ptr);
            }
            rdma_destroy_id(self.ptr);
        }
    }
}

/// A sockaddr of either family built from a `SocketAddr`.
struct SockAddr(libc::sockaddr_storage);

impl SockAddr {
    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (&mut self.0 as *mut libc::sockaddr_storage).cast()
    }
}

impl From<SocketAddr> for SockAddr {
    fn from(a: SocketAddr) -> SockAddr {
        // SAFETY: plain data; zeroed is a valid value.
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        match a {
            SocketAddr::V4(v4) => {
                // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
                let sin = unsafe { &mut *(&mut st as *mut _ as *mut libc::sockaddr_in) };
                sin.sin_family = libc::AF_INET as u16;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            SocketAddr::V6(v6) => {
                // SAFETY: as above, for sockaddr_in6.
                let sin6 = unsafe { &mut *(&mut st as *mut _ as *mut libc::sockaddr_in6) };
                sin6.sin6_family = libc::AF_INET6 as u16;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr.s6_addr = v6.ip().octets();
                sin6.sin6_scope_id = v6.scope_id();
            }
        }
        SockAddr(st)
    }
}

fn sockaddr_string(st: &libc::sockaddr_storage) -> String {
    sockaddr(st).map_or_else(|| "?".into(), |a| a.to_string())
}

/// The address a `sockaddr_storage` holds, for the two IP families.
fn sockaddr(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match st.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let sin = unsafe { &*(st as *const _ as *const libc::sockaddr_in) };
            let a = SocketAddrV4::new(
                u32::from_be(sin.sin_addr.s_addr).into(),
                u16::from_be(sin.sin_port),
            );
            Some(a.into())
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let sin6 = unsafe { &*(st as *const _ as *const libc::sockaddr_in6) };
            let a = SocketAddrV6::new(
                sin6.sin6_addr.s6_addr.into(),
                u16::from_be(sin6.sin6_port),
                0,
                sin6.sin6_scope_id,
            );
            Some(a.into())
        }
        _ => None,
    }
}
