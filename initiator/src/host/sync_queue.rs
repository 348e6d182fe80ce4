//! A blocking queue over either transport: used for the admin queue, for
//! discovery, and to connect I/O queues before the io_uring data path takes
//! them over.

use super::rdma::RdmaQueue;
use super::tcp::TcpSync;
use super::{HostError, Params, Transport, COMMAND_TIMEOUT};
use rdmablk_common::fabrics::{ConnectCmd, ConnectData};
use rdmablk_common::nvme::{admin, Cqe, Sgl, Sqe};
use std::net::SocketAddr;
use std::time::Duration;

/// Largest data a blocking command moves (a discovery log of 1024 entries).
const MAX_DATA: usize = (1 << 20) + 4096;

/// A connected, blocking queue.
pub enum SyncQueue {
    Tcp(TcpSync),
    Rdma(Box<RdmaSync>),
}

/// An NVMe/RDMA queue with a registered buffer for command data.
pub struct RdmaSync {
    /// Declared first: the queue (and its registration) goes before `buf`.
    q: RdmaQueue,
    buf: Vec<u8>,
    /// An Asynchronous Event Request is outstanding.
    aer: bool,
    /// How long a command may take to be answered.
    timeout: Duration,
}

/// The tag of an NVMe/RDMA queue's Asynchronous Event Request.
const AER_TAG: u64 = 1;

impl SyncQueue {
    /// Connects queue `qid` of `depth` entries of subsystem `subnqn` at
    /// the transport level (NVMe/TCP: TLS when asked, then ICReq; RDMA CM
    /// with the NVMe/RDMA private data).
    pub fn open(p: &Params, subnqn: &str, qid: u16, depth: u16) -> Result<SyncQueue, HostError> {
        Ok(match p.transport {
            Transport::Tcp => SyncQueue::Tcp(TcpSync::open(p, subnqn)?),
            Transport::Rdma => {
                let mut q = RdmaQueue::connect(p.addr, qid, depth, None)?;
                let mut buf = vec![0u8; MAX_DATA];
                // SAFETY: `buf` is never reallocated and outlives the queue
                // (field order of `RdmaSync`).
                unsafe { q.register(buf.as_mut_ptr(), buf.len()) }?;
                SyncQueue::Rdma(Box::new(RdmaSync {
                    q,
                    buf,
                    aer: false,
                    timeout: COMMAND_TIMEOUT,
                }))
            }
        })
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            SyncQueue::Tcp(q) => q.addr(),
            SyncQueue::Rdma(q) => q.q.addr(),
        }
    }

    /// The TLS cipher suite, when the queue's connection is encrypted.
    pub fn tls_cipher(&self) -> Option<&str> {
        match self {
            SyncQueue::Tcp(q) => q.tls_cipher(),
            SyncQueue::Rdma(_) => None,
        }
    }

    /// Sets the in-capsule data size the target accepts (from IOCCSZ).
    pub fn set_in_capsule(&mut self, n: usize) {
        match self {
            SyncQueue::Tcp(q) => q.in_capsule = n,
            // NVMe/RDMA admin queues take no in-capsule data (the kernel
            // target posts no room for it); I/O queues get it in `into_io_queue`.
            SyncQueue::Rdma(_) => {}
        }
    }

    /// Executes a command: `data_out` goes to the controller, `data_in_len`
    /// bytes come back.
    pub fn exec(
        &mut self,
        sqe: Sqe,
        data_out: &[u8],
        data_in_len: usize,
    ) -> Result<(Cqe, Vec<u8>), HostError> {
        match self {
            SyncQueue::Tcp(q) => q.exec(sqe, data_out, data_in_len),
            SyncQueue::Rdma(q) => {
                let len = data_out.len().max(data_in_len);
                if len > q.buf.len() {
                    return Err(HostError::Protocol(format!(
                        "a {len}-byte admin transfer is too large"
                    )));
                }
                q.buf[..data_out.len()].copy_from_slice(data_out);
                let to_host = data_in_len > 0;
                // SAFETY: `buf` is registered with the queue and not touched
                // until the command is over.
                let cqe = unsafe {
                    q.q.exec_blocking(sqe, q.buf.as_mut_ptr(), len, to_host, q.timeout)
                }?;
                Ok((cqe, q.buf[..data_in_len].to_vec()))
            }
        }
    }

    /// Sends an Asynchronous Event Request that stays outstanding (one at a
    /// time); its completion comes back through [`SyncQueue::take_events`].
    pub fn request_event(&mut self) -> Result<(), HostError> {
        match self {
            SyncQueue::Tcp(q) => q.request_event(),
            SyncQueue::Rdma(q) if q.aer => Ok(()),
            SyncQueue::Rdma(q) => {
                let sqe = Sqe::new(admin::ASYNC_EVENT, 0);
                // SAFETY: no data: the command points at no memory.
                let sent = unsafe { q.q.submit(sqe, std::ptr::null_mut(), 0, false, AER_TAG) };
                q.aer = sent.is_some();
                if q.aer {
                    Ok(())
                } else {
                    Err(HostError::Protocol(
                        "no room for an Asynchronous Event Request".into(),
                    ))
                }
            }
        }
    }

    /// Completions of Asynchronous Event Requests received so far, looking
    /// at what arrived without waiting.
    pub fn take_events(&mut self) -> Result<Vec<Cqe>, HostError> {
        match self {
            SyncQueue::Tcp(q) => q.take_events(),
            SyncQueue::Rdma(q) => {
                if let Some(why) = q.q.failed() {
                    return Err(HostError::Protocol(why.to_string()));
                }
                q.q.on_cq_ready();
                q.q.on_cm_ready();
                let mut done = Vec::new();
                q.q.take_done(&mut done);
                let events: Vec<Cqe> = done
                    .into_iter()
                    .filter(|d| d.tag == AER_TAG)
                    .map(|d| d.cqe)
                    .collect();
                if !events.is_empty() {
                    q.aer = false;
                }
                Ok(events)
            }
        }
    }

    /// Executes a command that must succeed within `timeout` (instead of
    /// the usual [`COMMAND_TIMEOUT`]).
    pub fn exec_ok_within(
        &mut self,
        timeout: Duration,
        what: &str,
        sqe: Sqe,
        data_out: &[u8],
        data_in_len: usize,
    ) -> Result<(Cqe, Vec<u8>), HostError> {
        self.set_timeout(timeout)?;
        let r = self.exec_ok(what, sqe, data_out, data_in_len);
        self.set_timeout(COMMAND_TIMEOUT)?;
        r
    }

    fn set_timeout(&mut self, t: Duration) -> Result<(), HostError> {
        match self {
            SyncQueue::Tcp(q) => q.set_timeout(t),
            SyncQueue::Rdma(q) => {
                q.timeout = t;
                Ok(())
            }
        }
    }

    /// Executes a command and fails unless it succeeds.
    pub fn exec_ok(
        &mut self,
        what: &str,
        sqe: Sqe,
        data_out: &[u8],
        data_in_len: usize,
    ) -> Result<(Cqe, Vec<u8>), HostError> {
        let (cqe, data) = self.exec(sqe, data_out, data_in_len)?;
        if !cqe.status().is_success() {
            return Err(HostError::Status {
                what: what.into(),
                status: cqe.status(),
            });
        }
        Ok((cqe, data))
    }

    /// Fabrics Connect; returns the CQE for the caller to interpret.
    pub fn connect(&mut self, cmd: ConnectCmd, data: &ConnectData) -> Result<Cqe, HostError> {
        let sqe = cmd.to_sqe(0, &Sgl::Null);
        Ok(self.exec(sqe, &data.encode(), 0)?.0)
    }

    /// The queue, for the io_uring data path.
    pub fn into_io_queue(self, limits: super::QueueLimits) -> Result<super::IoQueue, HostError> {
        match self {
            SyncQueue::Tcp(q) => {
                let limits = super::QueueLimits {
                    digests: q.digests,
                    max_h2c: q.max_h2c,
                    ..limits
                };
                let (sock, tls) = q.into_stream()?;
                Ok(super::IoQueue::new(
                    super::Link::Tcp(Box::new(super::tcp::TcpQueue::new(sock, tls, limits))),
                    limits.crdt,
                ))
            }
            SyncQueue::Rdma(q) => {
                let RdmaSync { mut q, buf, .. } = *q;
                // Nothing is in flight: the buffer's registration can go with it.
                q.forget_regions();
                drop(buf);
                q.set_in_capsule(limits.in_capsule);
                Ok(super::IoQueue::new(
                    super::Link::Rdma(Box::new(q)),
                    limits.crdt,
                ))
            }
        }
    }
}
