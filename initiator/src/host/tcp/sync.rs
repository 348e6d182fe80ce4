//! A blocking NVMe/TCP queue: used for the admin queue, for discovery, and to
//! bring up I/O queues before the io_uring data path takes their sockets.

use crate::host::{HostError, Params, COMMAND_TIMEOUT};
use rdmablk_common::fabrics::CONNECT_DATA_LEN;
use rdmablk_common::nvme::{admin, Cqe, Sgl, Sqe, Status};
use rdmablk_common::tcp::stream::Records;
use rdmablk_common::tcp::{self, Digests, Header, Transfer};
use rdmablk_common::tls::ktls::{self, KtlsError};
use rdmablk_common::tls::TlsSocket;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Largest PDU accepted from a target.
pub const MAX_PDU: usize = 4 << 20;

/// The first byte of a TLS alert record: what a TLS listener answers a
/// plaintext ICReq with, if it answers.
const TLS_ALERT: u8 = 21;
/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 22;

/// A queue's connection: plaintext, or through TLS.
enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsSocket>),
}

impl Conn {
    /// The socket (for its options).
    fn socket(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(t) => t.socket(),
        }
    }

    /// The socket and, with TLS in user space, the record layer for the
    /// data path: where the kernel has TLS, the session goes to it and the
    /// socket carries plaintext.
    fn into_parts(self) -> Result<(TcpStream, Option<Box<Records>>), HostError> {
        match self {
            Conn::Plain(s) => Ok((s, None)),
            Conn::Tls(t) => {
                let (sock, session) = t.into_parts();
                match ktls::offload(&sock, &session) {
                    Ok(()) => {
                        tracing::debug!(
                            cipher = session.cipher(),
                            "the queue's TLS goes to the kernel"
                        );
                        Ok((sock, None))
                    }
                    Err(KtlsError::Keys(e)) => Err(HostError::Protocol(format!(
                        "kernel TLS refused the session's keys: {e}"
                    ))),
                    Err(why) => {
                        tracing::debug!("TLS in user space: {why}");
                        Ok((sock, Some(Box::new(Records::new(session)))))
                    }
                }
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(t) => t.flush(),
        }
    }
}

/// A connected, initialized NVMe/TCP queue with blocking command execution.
pub struct TcpSync {
    sock: Conn,
    addr: SocketAddr,
    /// The TLS cipher suite, when the connection is encrypted.
    cipher: Option<String>,
    pub digests: Digests,
    /// MAXH2CDATA from the target.
    pub max_h2c: usize,
    /// In-capsule data the target accepts (from IOCCSZ; 0 until known).
    pub in_capsule: usize,
    next_cid: u16,
    rx: Vec<u8>,
    /// The command id of the Asynchronous Event Request outstanding, if any.
    aer: Option<u16>,
    /// Completions of Asynchronous Event Requests not yet taken.
    events: Vec<Cqe>,
    /// How long a command may take to be answered.
    timeout: Duration,
}

impl TcpSync {
    /// Opens the TCP connection to `p.addr`, runs the TLS handshake when
    /// `p.tls` asks (offering the identity of `p.hostnqn` for `subnqn`),
    /// and performs ICReq/ICResp.
    pub fn open(p: &Params, subnqn: &str) -> Result<TcpSync, HostError> {
        let (addr, digests) = (p.addr, p.digests);
        let sock =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| {
                match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => HostError::NoListener(addr),
                    _ => HostError::Unreachable { addr, source: e },
                }
            })?;
        sock.set_nodelay(true)?;
        let (sock, cipher) = match &p.tls {
            None => (Conn::Plain(sock), None),
            Some(tls) => {
                let engine = tls.handshake(&sock, addr, &p.hostnqn, subnqn)?;
                let cipher = engine.cipher();
                tracing::debug!(%addr, cipher, "TLS handshake done");
                let tls = TlsSocket::new(sock, &engine)
                    .map_err(|e| HostError::Protocol(format!("TLS with {addr}: {e}")))?;
                (Conn::Tls(Box::new(tls)), Some(cipher))
            }
        };
        sock.socket().set_read_timeout(Some(COMMAND_TIMEOUT))?;
        let mut q = TcpSync {
            sock,
            addr,
            cipher,
            digests: Digests::default(),
            max_h2c: 0,
            in_capsule: 0,
            next_cid: 0,
            rx: Vec::new(),
            aer: None,
            events: Vec::new(),
            timeout: COMMAND_TIMEOUT,
        };
        let icreq = Header::IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        };
        q.sock
            .write_all(&tcp::encode(&icreq, 0, &[], Digests::default(), 1))?;
        match q.recv_icresp()? {
            (
                Header::IcResp {
                    pfv,
                    digests: got,
                    maxh2cdata,
                    cpda,
                },
                _,
                _,
            ) => {
                if pfv != 0 || cpda != 0 {
                    return Err(HostError::Protocol(format!(
                        "ICResp with PFV {pfv}, CPDA {cpda} is not supported"
                    )));
                }
                if got != digests {
                    return Err(HostError::Protocol(format!(
                        "asked for digests {digests:?}, target answered {got:?}"
                    )));
                }
                q.digests = got;
                q.max_h2c = maxh2cdata as usize;
            }
            (h, _, _) => {
                return Err(HostError::Protocol(format!(
                    "expected ICResp, got PDU type {:#x}",
                    h.pdu_type()
                )))
            }
        }
        if q.max_h2c < 4096 {
            return Err(HostError::Protocol(format!(
                "MAXH2CDATA {} is below 4096",
                q.max_h2c
            )));
        }
        Ok(q)
    }

    /// The answer to ICReq. Without TLS, a target that closes the
    /// connection (or resets it, or answers with a TLS record) before
    /// ICResp wants TLS: said so.
    fn recv_icresp(&mut self) -> Result<(Header, u8, Vec<u8>), HostError> {
        if let Conn::Plain(sock) = &self.sock {
            let mut first = [0u8; 1];
            let wants_tls = match sock.peek(&mut first) {
                Ok(0) => true,
                Ok(_) => matches!(first[0], TLS_ALERT | TLS_HANDSHAKE),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
                Err(e) => return Err(self.read_error(e)),
            };
            if wants_tls {
                return Err(HostError::TlsRequired(self.addr));
            }
        }
        self.recv_pdu()
    }

    /// The socket and, on a TLS connection, its record layer, for handing
    /// to the asynchronous data path.
    pub fn into_stream(self) -> Result<(TcpStream, Option<Box<Records>>), HostError> {
        self.sock.into_parts()
    }

    /// The TLS cipher suite, when the connection is encrypted.
    pub fn tls_cipher(&self) -> Option<&str> {
        self.cipher.as_deref()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn recv_exact(&mut self, n: usize) -> Result<(), HostError> {
        let have = self.rx.len();
        self.rx.resize(have + n, 0);
        let r = self.sock.read_exact(&mut self.rx[have..]);
        r.map_err(|e| self.read_error(e))
    }

    /// What a failed read means.
    fn read_error(&self, e: std::io::Error) -> HostError {
        match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                HostError::Protocol("the target closed the connection".into())
            }
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => HostError::Protocol(
                format!("no answer from {} within {:?}", self.addr, self.timeout),
            ),
            _ => HostError::Io(e),
        }
    }

    /// Reads one whole PDU: its header, common header flags and data.
    fn recv_pdu(&mut self) -> Result<(Header, u8, Vec<u8>), HostError> {
        self.rx.clear();
        self.recv_exact(tcp::CH_LEN)?;
        let plen = tcp::peek_len(&self.rx, MAX_PDU)
            .map_err(|e| HostError::Protocol(e.to_string()))?
            .expect("common header present");
        self.recv_exact(plen - tcp::CH_LEN)?;
        let expect = if matches!(self.rx[0], tcp::pdu_type::ICRESP) {
            Digests::default()
        } else {
            self.digests
        };
        let (pdu, _) = tcp::decode(&self.rx, expect, MAX_PDU)
            .map_err(|e| HostError::Protocol(e.to_string()))?
            .expect("whole PDU buffered");
        if !pdu.data_digest_ok {
            return Err(HostError::Protocol("data digest mismatch".into()));
        }
        if let Header::TermReq { fes, fei, .. } = pdu.header {
            return Err(HostError::Protocol(format!(
                "target terminated the connection (FES {fes}, FEI {fei})"
            )));
        }
        Ok((pdu.header, pdu.flags, pdu.data.to_vec()))
    }

    /// Executes a command: `data_out` goes to the controller (in the capsule
    /// when small enough, else on R2T), `data_in_len` bytes come back.
    pub fn exec(
        &mut self,
        mut sqe: Sqe,
        data_out: &[u8],
        data_in_len: usize,
    ) -> Result<(Cqe, Vec<u8>), HostError> {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        sqe.set_cid(cid);
        let inline =
            !data_out.is_empty() && (data_out.len() <= self.in_capsule.max(CONNECT_DATA_LEN));
        let sgl = if inline {
            Sgl::InCapsule {
                offset: 0,
                len: data_out.len() as u32,
            }
        } else if !data_out.is_empty() || data_in_len > 0 {
            Sgl::Transport {
                len: data_out.len().max(data_in_len) as u32,
            }
        } else {
            Sgl::Null
        };
        sqe.set_sgl(&sgl);
        let payload = if inline { data_out } else { &[] };
        self.sock.write_all(&tcp::encode(
            &Header::CapsuleCmd(sqe),
            0,
            payload,
            self.digests,
            1,
        ))?;
        let mut data_in = vec![0u8; data_in_len];
        loop {
            match self.recv_pdu()? {
                (Header::CapsuleResp(cqe), _, _) if cqe.cid == cid => return Ok((cqe, data_in)),
                (Header::C2HData(t), fl, data) if t.cccid == cid => {
                    let end = t.offset as usize + data.len();
                    if end > data_in.len() {
                        return Err(HostError::Protocol(format!(
                            "C2HData beyond the {data_in_len} bytes asked for"
                        )));
                    }
                    data_in[t.offset as usize..end].copy_from_slice(&data);
                    // NVMe/TCP 1.0, 3.6.2.9: the last C2HData with SUCCESS
                    // completes the command; no response capsule follows
                    // (SPDK sets it whatever the Connect asked).
                    let done = tcp::flags::LAST_PDU | tcp::flags::SUCCESS;
                    if fl & done == done {
                        return Ok((Cqe::new(cid, Status::SUCCESS), data_in));
                    }
                }
                (Header::R2T(t), _, _) if t.cccid == cid => self.send_h2c(t, data_out)?,
                (Header::CapsuleResp(cqe), _, _) if Some(cqe.cid) == self.aer => {
                    self.aer = None;
                    self.events.push(cqe);
                }
                (h, _, _) => {
                    return Err(HostError::Protocol(format!(
                        "unexpected PDU type {:#x}",
                        h.pdu_type()
                    )))
                }
            }
        }
    }

    /// Sets how long a command may take to be answered.
    pub fn set_timeout(&mut self, t: Duration) -> Result<(), HostError> {
        self.sock.socket().set_read_timeout(Some(t))?;
        self.timeout = t;
        Ok(())
    }

    /// Sends an Asynchronous Event Request that stays outstanding (one at a
    /// time): its completion is kept for [`TcpSync::take_events`].
    pub fn request_event(&mut self) -> Result<(), HostError> {
        if self.aer.is_some() {
            return Ok(());
        }
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        let mut sqe = Sqe::new(admin::ASYNC_EVENT, cid);
        sqe.set_sgl(&Sgl::Null);
        self.sock.write_all(&tcp::encode(
            &Header::CapsuleCmd(sqe),
            0,
            &[],
            self.digests,
            1,
        ))?;
        self.aer = Some(cid);
        Ok(())
    }

    /// Completions of Asynchronous Event Requests, those that arrived while
    /// other commands ran and those waiting on the socket now (read without
    /// waiting for more).
    pub fn take_events(&mut self) -> Result<Vec<Cqe>, HostError> {
        while self.aer.is_some() && self.readable()? {
            match self.recv_pdu()? {
                (Header::CapsuleResp(cqe), _, _) if Some(cqe.cid) == self.aer => {
                    self.aer = None;
                    self.events.push(cqe);
                }
                (h, _, _) => {
                    return Err(HostError::Protocol(format!(
                        "unexpected PDU type {:#x} with no command outstanding",
                        h.pdu_type()
                    )))
                }
            }
        }
        Ok(std::mem::take(&mut self.events))
    }

    /// Whether bytes wait on the socket, or in the TLS engine.
    fn readable(&self) -> Result<bool, HostError> {
        if let Conn::Tls(t) = &self.sock {
            if t.buffered() {
                return Ok(true);
            }
        }
        let mut fd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(self.sock.socket()),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut fd, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(n > 0 && fd.revents != 0)
    }

    fn send_h2c(&mut self, r2t: Transfer, data: &[u8]) -> Result<(), HostError> {
        let end = r2t.offset as usize + r2t.len as usize;
        if end > data.len() {
            return Err(HostError::Protocol("R2T beyond the command's data".into()));
        }
        for (t, fl) in tcp::split_transfer(r2t, self.max_h2c) {
            let (at, n) = (t.offset as usize, t.len as usize);
            self.sock.write_all(&tcp::encode(
                &Header::H2CData(t),
                fl,
                &data[at..at + n],
                self.digests,
                1,
            ))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
