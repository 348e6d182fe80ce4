//! Verbs objects with owners: protection domain, memory region, completion
//! channel and queue, shared receive queue, and posting to queue pairs.
//! Children hold their parents (`Arc`) so destruction runs child first.

use rdma_sys::*;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn check(rc: i32, what: &str) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        // Verbs post calls return the errno rather than setting it.
        e if e > 0 => Err(io::Error::new(
            io::Error::from_raw_os_error(e).kind(),
            format!("{what}: {}", io::Error::from_raw_os_error(e)),
        )),
        _ => Err(last_error(what)),
    }
}

/// A device context opened by the RDMA CM. librdmacm keeps its contexts
/// open for the life of the process, so the handle is freely copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device(*mut ibv_context);

// SAFETY: verbs contexts are thread safe; the pointer is only an identity
// and an argument to verbs calls.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// Limits of a device that the transports size themselves by.
#[derive(Clone, Copy, Debug)]
pub struct DeviceAttrs {
    /// RDMA READs a QP may have outstanding as the initiator.
    pub max_qp_init_rd_atom: u8,
    /// RDMA READs a QP may serve at once as the responder.
    pub max_qp_rd_atom: u8,
    pub max_srq_wr: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cqe: u32,
    /// Type 2 memory windows (2A or 2B): [`Mw`] and [`SendOp::BindWindow`].
    pub memory_windows: bool,
    /// The IEEE vendor id (soft-RoCE: 0xFFFFFF, 0 before Linux 5.5).
    pub vendor_id: u32,
}

impl DeviceAttrs {
    /// Whether the device is soft-RoCE (rxe), told by its vendor id as SPDK
    /// does.
    pub fn is_soft_roce(&self) -> bool {
        self.vendor_id == 0xff_ffff || self.vendor_id == 0
    }
}

impl Device {
    /// # Safety
    /// `ctx` must be a context that stays open for the life of the process
    /// (one from an RDMA CM id).
    pub unsafe fn from_raw(ctx: *mut ibv_context) -> Device {
        Device(ctx)
    }

    pub fn as_ptr(&self) -> *mut ibv_context {
        self.0
    }

    /// The device's name (`rxe0`, `mlx5_0`...).
    pub fn name(&self) -> String {
        // SAFETY: the context is open; ibv_get_device_name returns a string
        // owned by the device that lives as long as it.
        unsafe {
            let p = ibv_get_device_name((*self.0).device);
            if p.is_null() {
                return "?".into();
            }
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }

    /// Whether the device is iWARP (soft-iWARP `siw`, Chelsio...).
    pub fn is_iwarp(&self) -> bool {
        // SAFETY: the context and its device are open.
        unsafe { (*(*self.0).device).transport_type == ibv_transport_type::IBV_TRANSPORT_IWARP }
    }

    pub fn attrs(&self) -> io::Result<DeviceAttrs> {
        // SAFETY: ibv_device_attr is plain data; zeroed is a valid value.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `a` is writable.
        let rc = unsafe { ibv_query_device(self.0, &mut a) };
        check(rc, "ibv_query_device")?;
        Ok(DeviceAttrs {
            max_qp_init_rd_atom: a.max_qp_init_rd_atom.clamp(0, 255) as u8,
            max_qp_rd_atom: a.max_qp_rd_atom.clamp(0, 255) as u8,
            max_srq_wr: a.max_srq_wr.max(0) as u32,
            max_qp_wr: a.max_qp_wr.max(0) as u32,
            max_sge: a.max_sge.max(0) as u32,
            max_cqe: a.max_cqe.max(0) as u32,
            memory_windows: a.device_cap_flags
                & (ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
                    | ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0)
                != 0,
            vendor_id: a.vendor_id,
        })
    }
}

/// Names of the RDMA devices this machine has (empty when none).
pub fn device_names() -> Vec<String> {
    let mut n = 0;
    // SAFETY: ibv_get_device_list returns an array of `n` devices, freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let names = (0..n as usize)
        .map(|i| {
            // SAFETY: `i < n` entries of the list are valid devices.
            unsafe {
                let name = ibv_get_device_name(*list.add(i));
                std::ffi::CStr::from_ptr(name)
                    .to_string_lossy()
                    .into_owned()
            }
        })
        .collect();
    // SAFETY: the list came from ibv_get_device_list and is freed once.
    unsafe { ibv_free_device_list(list) };
    names
}

/// A protection domain.
pub struct Pd {
    ptr: *mut ibv_pd,
    pub device: Device,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    pub fn new(device: Device) -> io::Result<Arc<Pd>> {
        // SAFETY: the device context is open.
        let ptr = unsafe { ibv_alloc_pd(device.as_ptr()) };
        if ptr.is_null() {
            return Err(last_error("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd { ptr, device }))
    }

    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.ptr
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc of this Pd, so none is left.
        unsafe { ibv_dealloc_pd(self.ptr) };
    }
}

/// Access rights of a memory region.
pub mod access {
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 2;
    pub const REMOTE_READ: u32 = 4;
    /// Memory windows may be bound to the region.
    pub const MW_BIND: u32 = 16;
}

/// A registered memory region.
pub struct Mr {
    ptr: *mut ibv_mr,
    addr: usize,
    len: usize,
    _pd: Arc<Pd>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes at `addr` with `access` (see [`access`]).
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped, and while it
    /// is registered the device may read or write it (as `access` allows)
    /// whenever an operation posted with its keys says so.
    pub unsafe fn register(pd: &Arc<Pd>, addr: *mut u8, len: usize, access: u32) -> io::Result<Mr> {
        // SAFETY: the caller guarantees the memory stays mapped while registered.
        let ptr = unsafe { ibv_reg_mr(pd.as_ptr(), addr.cast(), len, access as i32) };
        if ptr.is_null() {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::ENOMEM)
                || e.raw_os_error() == Some(libc::EPERM)
            {
                " (pinning memory needs LimitMEMLOCK=infinity or CAP_IPC_LOCK; see `ulimit -l`)"
            } else {
                ""
            };
            return Err(io::Error::new(
                e.kind(),
                format!("registering {len} bytes with the RDMA device failed: {e}{hint}"),
            ));
        }
        Ok(Mr {
            ptr,
            addr: addr as usize,
            len,
            _pd: pd.clone(),
        })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: the region is registered.
        unsafe { (*self.ptr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: the region is registered.
        unsafe { (*self.ptr).rkey }
    }

    /// Whether `len` bytes at `addr` lie inside the region.
    pub fn contains(&self, addr: *const u8, len: usize) -> bool {
        let a = addr as usize;
        a >= self.addr && a + len <= self.addr + self.len
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .finish()
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once.
        unsafe { ibv_dereg_mr(self.ptr) };
    }
}

/// A type 2 memory window: remote access to a range of a region (one with
/// [`access::MW_BIND`]) over one queue pair, granted by a
/// [`SendOp::BindWindow`] on that queue pair and revoked by invalidation
/// (the peer's SEND with Invalidate, or a [`SendOp::LocalInvalidate`]).
pub struct Mw {
    ptr: *mut ibv_mw,
    _pd: Arc<Pd>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for Mw {}
// SAFETY: as above.
unsafe impl Sync for Mw {}

impl Mw {
    /// Allocates an unbound window (the device must have `memory_windows`).
    pub fn new(pd: &Arc<Pd>) -> io::Result<Mw> {
        // SAFETY: the PD is alive; the window holds it.
        let ptr = unsafe { ibv_alloc_mw(pd.as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) }
            .unwrap_or(std::ptr::null_mut());
        if ptr.is_null() {
            return Err(last_error("ibv_alloc_mw (type 2)"));
        }
        Ok(Mw {
            ptr,
            _pd: pd.clone(),
        })
    }

    /// The key of the window's latest bind posted (at first, the one it was
    /// allocated with); each bind uses a new one ([`next_rkey`]).
    pub fn rkey(&self) -> u32 {
        // SAFETY: the window is allocated.
        unsafe { (*self.ptr).rkey }
    }
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("Mw").field("rkey", &self.rkey()).finish()
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: allocated once, deallocated once (a bound window is
        // unbound by its deallocation).
        unsafe { ibv_dealloc_mw(self.ptr) };
    }
}

/// The key a window's next bind gets: its low 8 bits (the consumer-owned
/// tag) advanced, so a key of an earlier bind no longer matches.
pub fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// A completion channel: its file descriptor becomes readable when a CQ
/// armed with [`Cq::arm`] gets a completion.
pub struct CompChannel {
    ptr: *mut ibv_comp_channel,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for CompChannel {}
// SAFETY: as above.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    /// Creates a channel with a non-blocking descriptor.
    pub fn new(device: Device) -> io::Result<Arc<CompChannel>> {
        // SAFETY: the device context is open.
        let ptr = unsafe { ibv_create_comp_channel(device.as_ptr()) };
        if ptr.is_null() {
            return Err(last_error("ibv_create_comp_channel"));
        }
        let ch = Arc::new(CompChannel { ptr });
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is open.
        unsafe { (*self.ptr).fd }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ on the channel holds an Arc of it, so none is left.
        unsafe { ibv_destroy_comp_channel(self.ptr) };
    }
}

pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(last_error("fcntl O_NONBLOCK"));
    }
    Ok(())
}

/// One work completion, as the transports need it.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` (0) or the error status.
    pub status: u32,
    pub byte_len: u32,
    pub qp_num: u32,
    /// For a receive: the rkey the peer's SEND with Invalidate named, if
    /// the completion reports one (see [`Cq::poll`]).
    pub invalidated_rkey: Option<u32>,
}

impl Completion {
    pub fn ok(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_SUCCESS
    }

    /// The status as text.
    pub fn status_str(&self) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        unsafe {
            std::ffi::CStr::from_ptr(ibv_wc_status_str(self.status))
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Whether the operation was flushed because its queue pair is in error.
    pub fn is_flush(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR
    }
}

struct CqInner {
    ptr: *mut ibv_cq,
    _channel: Arc<CompChannel>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: queue pairs using the CQ hold a `CqRef`, so none is left.
        unsafe { ibv_destroy_cq(self.ptr) };
    }
}

/// Keeps a completion queue alive (held by the queue pairs that use it).
#[derive(Clone)]
pub struct CqRef(#[allow(dead_code)] Arc<CqInner>);

/// A completion queue bound to a completion channel.
pub struct Cq {
    inner: Arc<CqInner>,
    channel: Arc<CompChannel>,
    /// Events taken from the channel and not yet acknowledged.
    unacked: u32,
    wcs: Vec<ibv_wc>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for Cq {}

impl Cq {
    pub fn new(device: Device, entries: u32, channel: &Arc<CompChannel>) -> io::Result<Cq> {
        // SAFETY: the device and channel are open; the CQ keeps the channel alive.
        let ptr = unsafe {
            ibv_create_cq(
                device.as_ptr(),
                entries as i32,
                std::ptr::null_mut(),
                channel.ptr,
                0,
            )
        };
        if ptr.is_null() {
            return Err(last_error("ibv_create_cq"));
        }
        let mut cq = Cq {
            inner: Arc::new(CqInner {
                ptr,
                _channel: channel.clone(),
            }),
            channel: channel.clone(),
            unacked: 0,
            // SAFETY: ibv_wc is plain data; zeroed is a valid value.
            wcs: (0..64).map(|_| unsafe { std::mem::zeroed() }).collect(),
        };
        cq.arm()?;
        Ok(cq)
    }

    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.inner.ptr
    }

    /// A handle that keeps the CQ alive.
    pub fn keep(&self) -> CqRef {
        CqRef(self.inner.clone())
    }

    /// The descriptor to wait on (shared by the channel's CQs).
    pub fn fd(&self) -> RawFd {
        self.channel.fd()
    }

    /// Asks for a channel event at the next completion.
    pub fn arm(&mut self) -> io::Result<()> {
        // SAFETY: the CQ is alive.
        check(
            unsafe { ibv_req_notify_cq(self.as_ptr(), 0) },
            "ibv_req_notify_cq",
        )
    }

    /// Consumes pending channel events (non-blocking) and re-arms the CQ.
    /// Call when the descriptor was readable, then [`Cq::poll`] until empty.
    pub fn take_events(&mut self) -> io::Result<()> {
        loop {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the channel is open and non-blocking; outputs are writable.
            let rc = unsafe { ibv_get_cq_event(self.channel.ptr, &mut cq, &mut ctx) };
            if rc != 0 {
                break;
            }
            self.unacked += 1;
        }
        if self.unacked >= 16 {
            // SAFETY: acknowledging events taken from this CQ's channel.
            unsafe { ibv_ack_cq_events(self.as_ptr(), self.unacked) };
            self.unacked = 0;
        }
        self.arm()
    }

    /// Takes up to 64 completions; returns how many were added to `out`.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<usize> {
        // SAFETY: `wcs` has room for its length of entries.
        let n = unsafe { ibv_poll_cq(self.as_ptr(), self.wcs.len() as i32, self.wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other("ibv_poll_cq failed"));
        }
        // Where a receive's completion says its SEND carried Invalidate:
        // libibverbs' IBV_WC_WITH_INV, or bit 2, the kernel's
        // IB_WC_WITH_INVALIDATE, which rxe (and providers polled through the
        // kernel) pass on unchanged; libibverbs names that bit
        // IBV_WC_IP_CSUM_OK, a flag of raw packet queue pairs. Callers check
        // the rkey against keys they gave out.
        let with_inv = ibv_wc_flags::IBV_WC_WITH_INV.0 | ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
        for wc in &self.wcs[..n as usize] {
            let inv = if wc.opcode == ibv_wc_opcode::IBV_WC_RECV && wc.wc_flags & with_inv != 0 {
                // SAFETY: with IBV_WC_WITH_INV the union holds the rkey.
                Some(unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey })
            } else {
                None
            };
            out.push(Completion {
                wr_id: wc.wr_id,
                status: wc.status,
                byte_len: wc.byte_len,
                qp_num: wc.qp_num,
                invalidated_rkey: inv,
            });
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        if self.unacked > 0 {
            // SAFETY: the CQ is alive (`inner`); these events came from it.
            unsafe { ibv_ack_cq_events(self.as_ptr(), self.unacked) };
        }
    }
}

/// A scatter/gather element: registered local memory.
#[derive(Clone, Copy, Debug)]
pub struct Sge {
    pub addr: *const u8,
    pub len: u32,
    pub lkey: u32,
}

/// Scatter/gather entries as verbs wants them; a few live inline, so
/// posting allocates nothing.
type IbvSges = smallvec::SmallVec<[ibv_sge; 4]>;

fn to_ibv_sges(sges: &[Sge]) -> IbvSges {
    sges.iter()
        .map(|s| ibv_sge {
            addr: s.addr as u64,
            length: s.len,
            lkey: s.lkey,
        })
        .collect()
}

/// A shared receive queue.
pub struct Srq {
    ptr: *mut ibv_srq,
    _pd: Arc<Pd>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for Srq {}
// SAFETY: as above.
unsafe impl Sync for Srq {}

impl Srq {
    pub fn new(pd: &Arc<Pd>, max_wr: u32, max_sge: u32) -> io::Result<Srq> {
        // SAFETY: plain data; zeroed is a valid value.
        let mut attr: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = max_wr;
        attr.attr.max_sge = max_sge;
        // SAFETY: the PD is alive; ibv_create_srq (not the _ex variant,
        // whose mask handling in rdma-sys is wrong).
        let ptr = unsafe { ibv_create_srq(pd.as_ptr(), &mut attr) };
        if ptr.is_null() {
            return Err(last_error("ibv_create_srq"));
        }
        Ok(Srq {
            ptr,
            _pd: pd.clone(),
        })
    }

    pub fn as_ptr(&self) -> *mut ibv_srq {
        self.ptr
    }

    /// Posts one receive.
    ///
    /// # Safety
    /// The memory of `sges` must be registered and left to the device until
    /// the receive completes (or the SRQ is destroyed).
    pub unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> io::Result<()> {
        let mut list = to_ibv_sges(sges);
        // SAFETY: plain data; zeroed is a valid value.
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = list.as_mut_ptr();
        wr.num_sge = list.len() as i32;
        let mut bad = std::ptr::null_mut();
        // SAFETY: `wr` and its list live through the call; the caller
        // guarantees the memory.
        check(
            unsafe { ibv_post_srq_recv(self.ptr, &mut wr, &mut bad) },
            "ibv_post_srq_recv",
        )
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: queue pairs on the SRQ are destroyed before it.
        unsafe { ibv_destroy_srq(self.ptr) };
    }
}

/// What a send-queue work request does.
#[derive(Clone, Copy, Debug)]
pub enum SendOp<'a> {
    /// A SEND; `invalidate` asks the peer to invalidate that rkey.
    Send {
        invalidate: Option<u32>,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    /// Binds `window` with the new key `rkey` to `len` bytes at `addr`
    /// inside `region`, for the peer to use as `access` allows
    /// ([`access::REMOTE_READ`], [`access::REMOTE_WRITE`]).
    BindWindow {
        window: &'a Mw,
        rkey: u32,
        region: &'a Mr,
        addr: *const u8,
        len: u32,
        access: u32,
    },
    /// Invalidates the window bound with `rkey`: no peer can use it after.
    LocalInvalidate {
        rkey: u32,
    },
}

/// One send-queue work request.
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp<'a>,
    pub sges: &'a [Sge],
    pub signaled: bool,
    /// Copy the data into the work request (small SENDs).
    pub inline: bool,
}

/// Posts a chain of send work requests to `qp` with one doorbell.
///
/// # Safety
/// `qp` must be a live queue pair; local memory in the requests must be
/// registered and left to the device until the requests complete (inline
/// data excepted: it is copied during the call).
pub unsafe fn post_send(qp: *mut ibv_qp, wrs: &[SendWr]) -> io::Result<()> {
    // Built whole before any pointer into them is taken, and not moved
    // after: the chain's pointers stay valid through the call.
    let mut lists: smallvec::SmallVec<[IbvSges; 2]> =
        wrs.iter().map(|w| to_ibv_sges(w.sges)).collect();
    // SAFETY: plain data; zeroed is a valid value.
    let mut raw: smallvec::SmallVec<[ibv_send_wr; 2]> = (0..wrs.len())
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    for (i, w) in wrs.iter().enumerate() {
        let r = &mut raw[i];
        r.wr_id = w.wr_id;
        r.sg_list = lists[i].as_mut_ptr();
        r.num_sge = lists[i].len() as i32;
        let mut flags = 0;
        if w.signaled {
            flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if w.inline {
            flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        r.send_flags = flags;
        match w.op {
            SendOp::Send { invalidate: None } => r.opcode = ibv_wr_opcode::IBV_WR_SEND,
            SendOp::Send {
                invalidate: Some(k),
            } => {
                r.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                r.imm_data_invalidated_rkey_union.invalidated_rkey = k;
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                r.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                r.wr.rdma.remote_addr = remote_addr;
                r.wr.rdma.rkey = rkey;
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                r.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
                r.wr.rdma.remote_addr = remote_addr;
                r.wr.rdma.rkey = rkey;
            }
            SendOp::BindWindow {
                window,
                rkey,
                region,
                addr,
                len,
                access,
            } => {
                r.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
                r.bind_mw_tso_union.bind_mw = bind_mw_t {
                    mw: window.ptr,
                    rkey,
                    bind_info: ibv_mw_bind_info {
                        mr: region.ptr,
                        addr: addr as u64,
                        length: len as u64,
                        mw_access_flags: access,
                    },
                };
            }
            SendOp::LocalInvalidate { rkey } => {
                r.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
                r.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
        }
    }
    for i in 1..raw.len() {
        let next: *mut ibv_send_wr = &mut raw[i];
        raw[i - 1].next = next;
    }
    let mut bad = std::ptr::null_mut();
    // SAFETY: the chain and its lists live through the call; the caller
    // guarantees the queue pair and the memory.
    let rc = unsafe { ibv_post_send(qp, raw.as_mut_ptr(), &mut bad) };
    check(rc, "ibv_post_send")?;
    // The provider names a window by its current key in the next bind (rxe
    // refuses a stale one): keep it, as libibverbs' ibv_bind_mw does.
    for w in wrs {
        if let SendOp::BindWindow { window, rkey, .. } = w.op {
            // SAFETY: the window is allocated; only verbs calls made with
            // it read this field, and the caller posts from one thread.
            unsafe { (*window.ptr).rkey = rkey };
        }
    }
    Ok(())
}

/// Posts one receive to a queue pair's own receive queue.
///
/// # Safety
/// As [`Srq::post_recv`], and `qp` must be a live queue pair without an SRQ.
pub unsafe fn post_recv(qp: *mut ibv_qp, wr_id: u64, sges: &[Sge]) -> io::Result<()> {
    let mut list = to_ibv_sges(sges);
    // SAFETY: plain data; zeroed is a valid value.
    let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = list.as_mut_ptr();
    wr.num_sge = list.len() as i32;
    let mut bad = std::ptr::null_mut();
    // SAFETY: `wr` and its list live through the call.
    let rc = unsafe { ibv_post_recv(qp, &mut wr, &mut bad) };
    check(rc, "ibv_post_recv")
}
