//! [`Queue`]: one NVMe/TCP connection, its PDUs, and commands in flight on it.

use super::commands::whole_blocks;
use super::{other, Completion, Stats, TermReq, DEFAULT_IN_CAPSULE, DEFAULT_TIMEOUT};
use rdmablk_common::bytes::get_u32;
use rdmablk_common::fabrics::{fctype, CONNECT_DATA_LEN};
use rdmablk_common::nvme::{fuse, nvm, Cqe, Sgl, Sqe, Status, FABRICS_OPCODE};
use rdmablk_common::tcp::{
    data_digest, decode, encode, encode_header, flags, Digests, Header, Transfer, CH_LEN,
};
use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Largest PDU this host accepts (PLEN), a sanity bound against garbage.
const MAX_PDU: usize = 16 << 20;

/// One command in flight.
struct Pending {
    data_out: Option<Vec<u8>>,
    /// Bytes of `data_out` already requested by R2Ts.
    r2t_end: u32,
    data_in: Vec<u8>,
    /// Bytes of C2HData received so far (they must arrive in order).
    received: u32,
    /// R2Ts are recorded in `held` instead of answered, until
    /// [`Queue::release_data`].
    hold: bool,
    held: Vec<Transfer>,
}

/// One NVMe/TCP connection: an admin or I/O queue.
pub struct Queue {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    addr: SocketAddr,
    digests: Digests,
    maxh2cdata: u32,
    /// Alignment of data in PDUs we send, from CPDA.
    data_align: usize,
    in_capsule_limit: u32,
    no_data_sgl: Sgl,
    timeout: Duration,
    next_cid: u16,
    pending: HashMap<u16, Pending>,
    done: VecDeque<Completion>,
    pub stats: Stats,
}

impl Queue {
    /// A TCP connection with nothing sent yet (for bad-input tests that
    /// misbehave before or instead of the ICReq).
    pub fn connect_raw(addr: SocketAddr) -> io::Result<Queue> {
        let stream = TcpStream::connect_timeout(&addr, DEFAULT_TIMEOUT)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(DEFAULT_TIMEOUT))?;
        stream.set_write_timeout(Some(DEFAULT_TIMEOUT))?;
        Ok(Queue {
            reader: BufReader::with_capacity(256 << 10, stream.try_clone()?),
            writer: stream,
            addr,
            digests: Digests::default(),
            maxh2cdata: 0,
            data_align: 1,
            in_capsule_limit: DEFAULT_IN_CAPSULE,
            no_data_sgl: Sgl::Null,
            timeout: DEFAULT_TIMEOUT,
            next_cid: 0,
            pending: HashMap::new(),
            done: VecDeque::new(),
            stats: Stats::default(),
        })
    }

    /// Connects and exchanges ICReq/ICResp, requesting `digests`.
    pub fn connect(addr: SocketAddr, digests: Digests) -> io::Result<Queue> {
        let mut q = Queue::connect_raw(addr)?;
        let icreq = Header::IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        };
        q.send_raw(&encode(&icreq, 0, &[], Digests::default(), 1))?;
        let (header, _) = q.recv_pdu()?;
        let Header::IcResp {
            pfv,
            cpda,
            digests: got,
            maxh2cdata,
        } = header
        else {
            return Err(other(format!("expected ICResp, got {header:?}")));
        };
        if pfv != 0 {
            return Err(other(format!("ICResp PFV {pfv}, expected 0")));
        }
        if (got.header && !digests.header) || (got.data && !digests.data) {
            return Err(other(format!(
                "ICResp enables digests {got:?} that were not requested ({digests:?})"
            )));
        }
        if maxh2cdata < 4096 || maxh2cdata & 3 != 0 {
            return Err(other(format!(
                "ICResp MAXH2CDATA {maxh2cdata}: must be at least 4096 and a multiple of 4"
            )));
        }
        q.digests = got;
        q.maxh2cdata = maxh2cdata;
        q.data_align = if cpda == 0 {
            1
        } else {
            (cpda as usize + 1) * 4
        };
        Ok(q)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Digests the target agreed to.
    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// MAXH2CDATA from the ICResp.
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// Writes up to this many bytes go in the capsule; larger ones wait for R2T.
    pub fn set_in_capsule_limit(&mut self, bytes: u32) {
        self.in_capsule_limit = bytes;
    }

    /// The SGL of commands without data: [`Sgl::Null`] by default; the Linux
    /// host sends `Sgl::Transport { len: 0 }`, and a target must take both.
    pub fn set_no_data_sgl(&mut self, sgl: Sgl) {
        self.no_data_sgl = sgl;
    }

    /// How long a read may block (default 10 s).
    pub fn set_timeout(&mut self, t: Duration) -> io::Result<()> {
        self.timeout = t;
        self.writer.set_read_timeout(Some(t))
    }

    /// Commands submitted and not yet returned by `wait`/`wait_any`.
    pub fn outstanding(&self) -> usize {
        self.pending.len() + self.done.len()
    }

    /// Whether command `cid` has completed (and waits to be returned).
    pub fn has_completed(&self, cid: u16) -> bool {
        self.done.iter().any(|c| c.cid == cid)
    }

    // ---- raw access -------------------------------------------------------

    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    /// Closes our sending side (the target sees EOF).
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        self.writer.shutdown(Shutdown::Write)
    }

    /// Reads the next whole PDU, of any type. A PDU that does not decode is
    /// an error naming the problem; EOF is `UnexpectedEof`.
    pub fn recv_pdu(&mut self) -> io::Result<(Header, Vec<u8>)> {
        let (header, _flags, data) = self.recv_pdu_flags()?;
        Ok((header, data))
    }

    /// [`Queue::recv_pdu`] with the PDU's FLAGS byte (e.g. C2HData's
    /// LAST_PDU and SUCCESS).
    pub fn recv_pdu_flags(&mut self) -> io::Result<(Header, u8, Vec<u8>)> {
        let mut buf = vec![0u8; CH_LEN];
        self.read_exact(&mut buf, "a PDU header")?;
        let plen = get_u32(&buf, 4) as usize;
        if !(CH_LEN..=MAX_PDU).contains(&plen) {
            return Err(other(format!(
                "received PDU type {:#04x} with PLEN {plen}: not a sane PDU length",
                buf[0]
            )));
        }
        buf.resize(plen, 0);
        self.read_exact(&mut buf[CH_LEN..], "the rest of a PDU")?;
        let (pdu, _) = decode(&buf, self.digests, MAX_PDU)
            .map_err(|e| other(format!("received a bad PDU (type {:#04x}): {e}", buf[0])))?
            .ok_or_else(|| other("decode wants more bytes than PLEN".into()))?;
        if !pdu.data_digest_ok {
            return Err(other(format!("data digest mismatch in {:?}", pdu.header)));
        }
        Ok((pdu.header, pdu.flags, pdu.data.to_vec()))
    }

    fn read_exact(&mut self, buf: &mut [u8], what: &str) -> io::Result<()> {
        self.reader.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("target closed the connection while we waited for {what}"),
            ),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "nothing from the target for {:?} while we waited for {what} \
                     ({} commands outstanding)",
                    self.timeout,
                    self.pending.len()
                ),
            ),
            _ => io::Error::new(e.kind(), format!("reading {what}: {e}")),
        })
    }

    /// Whether the peer closes the connection (EOF or reset) within `within`.
    /// Anything read meanwhile is discarded.
    pub fn is_closed_by_peer(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut scratch = vec![0u8; 64 << 10];
        let closed = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            if self.writer.set_read_timeout(Some(left)).is_err() {
                break true;
            }
            match self.reader.read(&mut scratch) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        let _ = self.writer.set_read_timeout(Some(self.timeout));
        closed
    }

    // ---- commands ---------------------------------------------------------

    fn alloc_cid(&mut self) -> u16 {
        loop {
            let cid = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1);
            if !self.pending.contains_key(&cid) && !self.done.iter().any(|c| c.cid == cid) {
                return cid;
            }
        }
    }

    /// Sends a command; returns its CID. The SGL is chosen here: in-capsule
    /// data for writes up to the in-capsule limit (and always for Connect),
    /// a transport SGL for larger writes and for reads, none without data.
    pub fn submit(
        &mut self,
        mut sqe: Sqe,
        data_out: Option<&[u8]>,
        data_in_len: u32,
    ) -> io::Result<u16> {
        let is_connect = sqe.opcode() == FABRICS_OPCODE && sqe.fctype() == fctype::CONNECT;
        let mut in_capsule: &[u8] = &[];
        let sgl = match data_out {
            Some(d) => {
                let len = u32::try_from(d.len()).map_err(|_| other("data over 4 GiB".into()))?;
                // Connect data is always sent in the capsule.
                if len <= self.in_capsule_limit || (is_connect && d.len() == CONNECT_DATA_LEN) {
                    in_capsule = d;
                    self.stats.in_capsule_writes += 1;
                    Sgl::InCapsule { offset: 0, len }
                } else {
                    Sgl::Transport { len }
                }
            }
            None if data_in_len > 0 => Sgl::Transport { len: data_in_len },
            None => self.no_data_sgl,
        };
        sqe.set_sgl(&sgl);
        let r2t_data = data_out
            .filter(|_| in_capsule.is_empty())
            .map(<[u8]>::to_vec);
        self.send_tracked(sqe, in_capsule, r2t_data, data_in_len)
    }

    /// Sends `sqe` exactly as given (its data pointer, PSDT and FUSE bits
    /// untouched; only the CID is assigned), with `in_capsule` as the
    /// capsule's data, and tracks it like [`Queue::submit`]: `data_in_len`
    /// bytes of C2HData are accepted for it. For tests of malformed
    /// commands; the caller makes the SGL describe what it wants.
    pub fn submit_as_is(
        &mut self,
        sqe: Sqe,
        in_capsule: &[u8],
        data_in_len: u32,
    ) -> io::Result<u16> {
        self.send_tracked(sqe, in_capsule, None, data_in_len)
    }

    /// Sends a capsule under a new CID and tracks the command: `data_out`
    /// is sent when R2Ts ask for it, `data_in_len` bytes of C2HData are
    /// accepted.
    fn send_tracked(
        &mut self,
        mut sqe: Sqe,
        in_capsule: &[u8],
        data_out: Option<Vec<u8>>,
        data_in_len: u32,
    ) -> io::Result<u16> {
        let cid = self.alloc_cid();
        sqe.set_cid(cid);
        let pdu = encode(
            &Header::CapsuleCmd(sqe),
            0,
            in_capsule,
            self.digests,
            self.data_align,
        );
        self.pending.insert(
            cid,
            Pending {
                data_out,
                r2t_end: 0,
                data_in: vec![0; data_in_len as usize],
                received: 0,
                hold: false,
                held: Vec::new(),
            },
        );
        if let Err(e) = self.send_raw(&pdu) {
            self.pending.remove(&cid);
            return Err(io::Error::new(
                e.kind(),
                format!("sending the capsule of cid {cid}: {e}"),
            ));
        }
        Ok(cid)
    }

    /// [`Queue::submit_as_is`] and wait; the caller checks the status.
    pub fn exec_as_is(
        &mut self,
        sqe: Sqe,
        in_capsule: &[u8],
        data_in_len: u32,
    ) -> io::Result<Completion> {
        let cid = self.submit_as_is(sqe, in_capsule, data_in_len)?;
        self.wait(cid)
    }

    /// [`Queue::submit`] with the Fused Operation field (CDW0 bits 9:8,
    /// NVMe Base 2.1, Figure 91) set to `fuse`: [`fuse::FIRST`] or
    /// [`fuse::SECOND`] of a fused operation, or any other value for tests
    /// of bad ones.
    pub fn submit_fused(
        &mut self,
        mut sqe: Sqe,
        fuse: u8,
        data_out: Option<&[u8]>,
        data_in_len: u32,
    ) -> io::Result<u16> {
        sqe.set_flags((sqe.flags() & !3) | (fuse & 3));
        self.submit(sqe, data_out, data_in_len)
    }

    /// A fused Compare and Write (NVMe Base 2.1, 3.4.2; NVM Command Set
    /// 2.1, 3.2): Compare of `expect` at `slba` with FUSE 01b, then at once,
    /// next on this queue, Write of `new` to the same blocks with FUSE 10b.
    /// Waits for both and returns (the Compare's, the Write's) completions;
    /// the caller checks the statuses.
    pub fn compare_and_write(
        &mut self,
        nsid: u32,
        slba: u64,
        expect: &[u8],
        new: &[u8],
        block_size: u32,
    ) -> io::Result<(Completion, Completion)> {
        let nlb = whole_blocks(expect.len(), block_size)?;
        if new.len() != expect.len() {
            return Err(other(format!(
                "compare and write: {} bytes to compare, {} to write",
                expect.len(),
                new.len()
            )));
        }
        let compare = Queue::rw_sqe(nvm::COMPARE, nsid, slba, nlb);
        let write = Queue::rw_sqe(nvm::WRITE, nsid, slba, nlb);
        let first = self.submit_fused(compare, fuse::FIRST, Some(expect), 0)?;
        let second = self.submit_fused(write, fuse::SECOND, Some(new), 0)?;
        let first = self.wait(first)?;
        let second = self.wait(second)?;
        Ok((first, second))
    }

    /// Sends a command with `data` to the controller that goes by R2T (a
    /// transport SGL, whatever the in-capsule limit) and holds the data
    /// back: the R2Ts the target sends for it are recorded, not answered,
    /// until [`Queue::release_data`]. Other commands on the queue are
    /// served meanwhile.
    pub fn submit_holding_data(&mut self, mut sqe: Sqe, data: &[u8]) -> io::Result<u16> {
        let len = u32::try_from(data.len()).map_err(|_| other("data over 4 GiB".into()))?;
        if len == 0 {
            return Err(other("holding back no data".into()));
        }
        sqe.set_sgl(&Sgl::Transport { len });
        let cid = self.send_tracked(sqe, &[], Some(data.to_vec()), 0)?;
        if let Some(p) = self.pending.get_mut(&cid) {
            p.hold = true;
        }
        Ok(cid)
    }

    /// Reads PDUs (serving the other commands) until the target has sent
    /// an R2T for `cid`, a command of [`Queue::submit_holding_data`]. An
    /// error if `cid` completes first.
    pub fn wait_held_r2t(&mut self, cid: u16) -> io::Result<()> {
        loop {
            match self.pending.get(&cid) {
                Some(p) if !p.hold => {
                    return Err(other(format!("cid {cid} does not hold its data back")))
                }
                Some(p) if !p.held.is_empty() => return Ok(()),
                Some(_) => {}
                None => {
                    let status = self.done.iter().find(|c| c.cid == cid).map_or_else(
                        || "not outstanding".to_string(),
                        |c| format!("completed with {}", c.status()),
                    );
                    return Err(other(format!(
                        "cid {cid} got no R2T for its held data: {status}"
                    )));
                }
            }
            self.process_one()?;
        }
    }

    /// Sends the data the R2Ts held for `cid` asked for; R2Ts that come
    /// later are answered as usual. The command stays outstanding: `wait`
    /// for it.
    pub fn release_data(&mut self, cid: u16) -> io::Result<()> {
        let Some(p) = self.pending.get_mut(&cid) else {
            let status = self.done.iter().find(|c| c.cid == cid).map_or_else(
                || "not outstanding".to_string(),
                |c| format!("already completed with {}", c.status()),
            );
            return Err(other(format!(
                "releasing the data of cid {cid}, which is {status}"
            )));
        };
        p.hold = false;
        for t in std::mem::take(&mut p.held) {
            self.answer_r2t(t)?;
        }
        Ok(())
    }

    /// Waits for command `cid`, serving R2Ts and data for every command meanwhile.
    pub fn wait(&mut self, cid: u16) -> io::Result<Completion> {
        loop {
            if let Some(i) = self.done.iter().position(|c| c.cid == cid) {
                return Ok(self.done.remove(i).expect("index from position"));
            }
            if !self.pending.contains_key(&cid) {
                return Err(other(format!(
                    "wait for cid {cid}, which is not outstanding"
                )));
            }
            self.process_one()?;
        }
    }

    /// Waits for whichever command finishes first.
    pub fn wait_any(&mut self) -> io::Result<Completion> {
        loop {
            if let Some(c) = self.done.pop_front() {
                return Ok(c);
            }
            if self.pending.is_empty() {
                return Err(other("wait_any with no command outstanding".into()));
            }
            self.process_one()?;
        }
    }

    /// Submit and wait; the caller checks the status.
    pub fn exec(
        &mut self,
        sqe: Sqe,
        data_out: Option<&[u8]>,
        data_in_len: u32,
    ) -> io::Result<Completion> {
        let cid = self.submit(sqe, data_out, data_in_len)?;
        self.wait(cid)
    }

    /// `exec` that fails unless the command succeeds.
    pub(super) fn exec_ok(
        &mut self,
        what: &str,
        sqe: Sqe,
        data_out: Option<&[u8]>,
        data_in_len: u32,
    ) -> io::Result<Completion> {
        self.exec(sqe, data_out, data_in_len)?.check(what)
    }

    /// Reads and handles one PDU.
    fn process_one(&mut self) -> io::Result<()> {
        let (header, fl, data) = self.recv_pdu_flags()?;
        match header {
            Header::CapsuleResp(cqe) => {
                let p = self.take_pending(cqe.cid, "CapsuleResp")?;
                if cqe.status().is_success() && p.received as usize != p.data_in.len() {
                    return Err(other(format!(
                        "cid {}: success after {} of {} bytes of C2HData",
                        cqe.cid,
                        p.received,
                        p.data_in.len()
                    )));
                }
                self.done.push_back(Completion {
                    cid: cqe.cid,
                    cqe,
                    data: p.data_in,
                    success_in_data: false,
                });
            }
            Header::C2HData(t) => self.on_c2h(t, fl, &data)?,
            Header::R2T(t) => self.on_r2t(t)?,
            Header::TermReq { fes, fei, .. } => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    TermReq { fes, fei },
                ));
            }
            h => return Err(other(format!("unexpected PDU from the target: {h:?}"))),
        }
        Ok(())
    }

    fn take_pending(&mut self, cid: u16, what: &str) -> io::Result<Pending> {
        self.pending
            .remove(&cid)
            .ok_or_else(|| other(format!("{what} for cid {cid}, which is not outstanding")))
    }

    fn on_c2h(&mut self, t: Transfer, fl: u8, data: &[u8]) -> io::Result<()> {
        self.stats.c2h_pdus += 1;
        self.stats.c2h_max_len = self.stats.c2h_max_len.max(t.len);
        let p = self.pending.get_mut(&t.cccid).ok_or_else(|| {
            other(format!(
                "C2HData for cid {}, which is not outstanding",
                t.cccid
            ))
        })?;
        let end = t.offset as u64 + t.len as u64;
        if t.offset != p.received || end > p.data_in.len() as u64 {
            return Err(other(format!(
                "cid {}: C2HData offset {} len {} but {} of {} bytes received so far",
                t.cccid,
                t.offset,
                t.len,
                p.received,
                p.data_in.len()
            )));
        }
        p.data_in[t.offset as usize..end as usize].copy_from_slice(data);
        p.received = end as u32;
        if fl & flags::SUCCESS != 0 {
            if fl & flags::LAST_PDU == 0 {
                return Err(other(format!(
                    "cid {}: C2HData with SUCCESS but not LAST_PDU",
                    t.cccid
                )));
            }
            let p = self.take_pending(t.cccid, "C2HData")?;
            if p.received as usize != p.data_in.len() {
                return Err(other(format!(
                    "cid {}: SUCCESS after {} of {} bytes",
                    t.cccid,
                    p.received,
                    p.data_in.len()
                )));
            }
            self.done.push_back(Completion {
                cid: t.cccid,
                cqe: Cqe::new(t.cccid, Status::SUCCESS),
                data: p.data_in,
                success_in_data: true,
            });
        }
        Ok(())
    }

    fn on_r2t(&mut self, t: Transfer) -> io::Result<()> {
        self.stats.r2ts += 1;
        let p = self
            .pending
            .get_mut(&t.cccid)
            .ok_or_else(|| other(format!("R2T for cid {}, which is not outstanding", t.cccid)))?;
        if p.hold {
            p.held.push(t);
            return Ok(());
        }
        self.answer_r2t(t)
    }

    /// Sends the H2CData PDUs an R2T asked for.
    fn answer_r2t(&mut self, t: Transfer) -> io::Result<()> {
        let p = self
            .pending
            .get_mut(&t.cccid)
            .ok_or_else(|| other(format!("R2T for cid {}, which is not outstanding", t.cccid)))?;
        let Some(out) = p.data_out.take() else {
            return Err(other(format!(
                "R2T for cid {}, which has no data to send",
                t.cccid
            )));
        };
        let end = t.offset as u64 + t.len as u64;
        if t.len == 0 || t.offset < p.r2t_end || end > out.len() as u64 {
            return Err(other(format!(
                "cid {}: R2T offset {} len {} for {} bytes of which {} already requested",
                t.cccid,
                t.offset,
                t.len,
                out.len(),
                p.r2t_end
            )));
        }
        p.r2t_end = end as u32;
        let chunk = self.maxh2cdata as usize;
        let range = &out[t.offset as usize..end as usize];
        let mut pdu = Vec::with_capacity(chunk + 64);
        let mut sent = 0;
        let mut result = Ok(());
        for piece in range.chunks(chunk) {
            let last = sent + piece.len() == range.len();
            let h = Header::H2CData(Transfer {
                cccid: t.cccid,
                ttag: t.ttag,
                offset: t.offset + sent as u32,
                len: piece.len() as u32,
            });
            pdu.clear();
            let fl = if last { flags::LAST_PDU } else { 0 };
            encode_header(&mut pdu, &h, fl, piece.len(), self.digests, self.data_align);
            pdu.extend_from_slice(piece);
            if self.digests.data {
                pdu.extend_from_slice(&data_digest(piece));
            }
            result = self.writer.write_all(&pdu).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("sending H2CData for cid {}: {e}", t.cccid),
                )
            });
            if result.is_err() {
                break;
            }
            self.stats.h2c_pdus += 1;
            sent += piece.len();
        }
        if let Some(p) = self.pending.get_mut(&t.cccid) {
            p.data_out = Some(out);
        }
        result
    }
}
