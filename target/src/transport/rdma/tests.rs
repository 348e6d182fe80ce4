//! The NVMe/RDMA command path without hardware: a queue on a fake queue
//! pair that records the work requests posted and plays the device (it
//! reads WRITE and SEND sources when they are posted, and writes what an
//! RDMA READ brings when the test completes it).

use super::connection::RdmaQueue;
use super::wire::{QueuePair, RdmaWire};
use super::*;
use crate::config::{Limits, DEFAULT_NQN};
use crate::engine::binding::Binding;
use crate::engine::queue::Queue;
use crate::testing::*;
use rdmablk_common::nvme::{admin, feature, nvm, Cqe, Sgl, Sqe, Status};
use rdmablk_common::rdma::{Completion, SendOp, SendWr};
use std::io;

/// `ibv_wc_status`: success, and a request flushed by a QP in error.
const WC_SUCCESS: u32 = 0;
const WC_FLUSHED: u32 = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Send { invalidate: Option<u32> },
    Write { remote_addr: u64, rkey: u32 },
    Read { remote_addr: u64, rkey: u32 },
}

/// One work request as posted.
#[derive(Debug)]
struct Posted {
    wr_id: u64,
    op: Op,
    signaled: bool,
    /// Where a READ lands, and its length.
    local: *mut u8,
    len: usize,
    /// What a WRITE or SEND carries, read at post time.
    bytes: Vec<u8>,
}

#[derive(Default)]
struct FakeQp {
    posted: Vec<Posted>,
    disconnected: bool,
}

impl QueuePair for FakeQp {
    unsafe fn post(&mut self, wrs: &[SendWr]) -> io::Result<()> {
        for wr in wrs {
            let sge = wr.sges[0];
            let op = match wr.op {
                SendOp::Send { invalidate } => Op::Send { invalidate },
                SendOp::RdmaWrite { remote_addr, rkey } => Op::Write { remote_addr, rkey },
                SendOp::RdmaRead { remote_addr, rkey } => Op::Read { remote_addr, rkey },
                SendOp::BindWindow { .. } | SendOp::LocalInvalidate { .. } => {
                    unreachable!("the target binds no memory windows")
                }
            };
            let mut bytes = vec![0u8; sge.len as usize];
            if !matches!(op, Op::Read { .. }) {
                // SAFETY: the caller of `post` keeps the source valid until
                // the request completes (inline data through this call).
                unsafe { std::ptr::copy_nonoverlapping(sge.addr, bytes.as_mut_ptr(), bytes.len()) };
            }
            self.posted.push(Posted {
                wr_id: wr.wr_id,
                op,
                signaled: wr.signaled,
                local: sge.addr.cast_mut(),
                len: sge.len as usize,
                bytes,
            });
        }
        Ok(())
    }

    fn disconnect(&mut self) {
        self.disconnected = true;
    }
}

struct Fixture {
    rig: Rig,
    conn: RdmaQueue<FakeQp>,
}

const LKEY: u32 = 0x1234;
const RKEY: u32 = 0xbeef;
const HOST_ADDR: u64 = 0x7f00_0000;

impl Fixture {
    /// Queue `qid` with `credits` RDMA READs, established.
    fn new(rig: Rig, qid: u16, credits: u8) -> Fixture {
        let q = Queue::new(Binding::new(rig.pending()), "unit".into(), 1, 3, qid);
        let mut w = RdmaWire::new(FakeQp::default(), arrival(), LKEY, 3, 32, credits);
        w.phase = Phase::Live;
        Fixture {
            rig,
            conn: RdmaQueue {
                q,
                w,
                dev: 0,
                qp_num: 77,
                send_wr: 0,
            },
        }
    }

    fn posted(&self) -> &[Posted] {
        &self.conn.w.qp.posted
    }

    /// A capsule as an SRQ receive delivers it: `data` in-capsule, in an
    /// arena buffer the command may take.
    fn capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        let mut recv = Some(self.rig.buffer(&[0u8; IN_CAPSULE_DATA]));
        self.rig.arena.write(recv.as_ref().unwrap(), 0, data);
        self.conn
            .on_capsule(sqe, data.len(), &mut recv, &mut self.rig.io());
        if let Some(b) = recv {
            self.rig.arena.free(b);
        }
    }

    /// Completes the posted request `i` (status `status`); a READ first
    /// gets `fill` written where it lands, as the device would.
    fn complete(&mut self, i: usize, status: u32, fill: u8) {
        let p = &self.conn.w.qp.posted[i];
        if p.op
            == (Op::Read {
                remote_addr: HOST_ADDR,
                rkey: RKEY,
            })
            && status == WC_SUCCESS
        {
            // SAFETY: the READ's destination is the command's arena buffer,
            // `len` bytes, held until this completion is handled.
            unsafe { std::ptr::write_bytes(p.local, fill, p.len) };
        }
        let wc = Completion {
            wr_id: p.wr_id,
            status,
            byte_len: 0,
            qp_num: 77,
            invalidated_rkey: None,
        };
        let (kind, slot) = ((wc.wr_id >> 16) & 0xff, wc.wr_id as u16);
        self.conn.on_send_done(kind, slot, &wc, &mut self.rig.io());
    }

    /// The response of the last SEND posted.
    fn response(&self) -> Cqe {
        let send = self.posted().last().expect("a SEND");
        assert!(matches!(send.op, Op::Send { .. }) && send.signaled);
        Cqe::from_bytes(&send.bytes)
    }
}

fn keyed(len: usize, invalidate: bool) -> Sgl {
    Sgl::Keyed {
        addr: HOST_ADDR,
        len: len as u32,
        key: RKEY,
        invalidate,
    }
}

/// Admin Connect with its data in the capsule: the receive's buffer is
/// taken over, one inline SEND answers with the controller id; its
/// completion frees the command.
fn admin_connect(f: &mut Fixture) {
    let data = connect_data(DEFAULT_NQN, HOST, 0xffff);
    f.capsule(&connect_sqe(0, 0, 5000), &data);
    assert_eq!(f.posted().len(), 1);
    let cqe = f.response();
    assert_eq!(cqe.status(), Status::SUCCESS);
    assert_ne!(cqe.dw0, 0xffff, "a controller id");
    assert_eq!(f.conn.q.busy(), 1);
    f.complete(0, WC_SUCCESS, 0);
    assert_eq!(f.conn.q.busy(), 0, "freed by the SEND's completion");
}

/// Controller to host: Identify's data goes in an unsignaled RDMA WRITE
/// chained before the SEND, to the host's address and key. Host to
/// controller: Set Features Host Behavior's data comes by an RDMA READ
/// into the command's buffer, and Get Features returns it (ACRE).
#[test]
fn admin_data_moves_by_rdma_write_and_read() {
    let mut f = Fixture::new(Rig::new(Limits::default()), 0, 4);
    admin_connect(&mut f);
    let mut cc = rdmablk_common::fabrics::PropertyCmd {
        wide: false,
        offset: rdmablk_common::nvme::property::CC,
        value: CC_ENABLE as u64,
    }
    .to_sqe(2, true);
    cc.set_sgl(&keyed(0, false));
    f.capsule(&cc, &[]);
    assert_eq!(f.response().status(), Status::SUCCESS, "CC.EN");

    let mut identify = Sqe::new(admin::IDENTIFY, 3);
    identify.set_cdw(10, 1); // the controller
    identify.set_sgl(&keyed(4096, false));
    let before = f.posted().len();
    f.capsule(&identify, &[]);
    let posted = &f.posted()[before..];
    assert_eq!(posted.len(), 2, "WRITE then SEND");
    assert_eq!(
        posted[0].op,
        Op::Write {
            remote_addr: HOST_ADDR,
            rkey: RKEY
        }
    );
    assert!(
        !posted[0].signaled,
        "the SEND's completion covers the WRITE"
    );
    assert_eq!(&posted[0].bytes[24..32], b"rdmablk ", "model number");
    assert_eq!(f.response().status(), Status::SUCCESS);

    let mut set = Sqe::new(admin::SET_FEATURES, 4);
    set.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    set.set_sgl(&keyed(512, false));
    let before = f.posted().len();
    f.capsule(&set, &[]);
    assert_eq!(f.posted().len(), before + 1, "one READ, no response yet");
    assert_eq!(
        f.posted()[before].op,
        Op::Read {
            remote_addr: HOST_ADDR,
            rkey: RKEY
        }
    );
    let slot = f.posted()[before].wr_id as u16;
    let state = f.conn.q.command(slot).map(|c| c.state);
    assert_eq!(state, Some(crate::nvme::command::State::FetchingData));
    f.complete(before, WC_SUCCESS, 1); // ACRE = 1
    assert_eq!(f.response().status(), Status::SUCCESS, "Set Features");

    let mut get = Sqe::new(admin::GET_FEATURES, 5);
    get.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    get.set_sgl(&keyed(512, true));
    let before = f.posted().len();
    f.capsule(&get, &[]);
    let posted = &f.posted()[before..];
    assert_eq!(posted[0].bytes[0], 1, "ACRE as set");
    assert_eq!(
        posted[1].op,
        Op::Send {
            invalidate: Some(RKEY)
        },
        "the host asked for its key to be invalidated"
    );
}

/// I/O on an I/O queue: writes wait for READ credits (one here), and each
/// READ's completion starts the next; a read returns the bytes written.
#[test]
fn io_reads_wait_for_credits() {
    let rig = Rig::new(Limits::default());
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, 1, 1);
    let data = connect_data(DEFAULT_NQN, HOST, admin.ctrl.cntlid);
    f.capsule(&connect_sqe(1, 0, 0), &data);
    assert_eq!(f.response().status(), Status::SUCCESS, "I/O Connect");
    let write = |cid, slba| {
        let mut sqe = Sqe::new(nvm::WRITE, cid);
        sqe.set_nsid(1);
        sqe.set_cdw(10, slba);
        sqe.set_cdw(12, 7);
        sqe.set_sgl(&keyed(4096, false));
        sqe
    };
    let before = f.posted().len();
    f.capsule(&write(1, 0), &[]);
    f.capsule(&write(2, 8), &[]);
    let reads = |f: &Fixture| {
        f.posted()[before..]
            .iter()
            .filter(|p| matches!(p.op, Op::Read { .. }))
            .count()
    };
    assert_eq!(reads(&f), 1, "one credit, one READ");
    f.complete(before, WC_SUCCESS, 0xa5);
    assert_eq!(reads(&f), 2, "the credit came back");
    let first = Cqe::from_bytes(&f.posted()[before + 1].bytes);
    assert_eq!(first.status(), Status::SUCCESS, "first write");
    f.complete(before + 2, WC_SUCCESS, 0x5a);
    assert_eq!(f.response().status(), Status::SUCCESS, "second write");

    let mut read = Sqe::new(nvm::READ, 3);
    read.set_nsid(1);
    read.set_cdw(12, 15);
    read.set_sgl(&keyed(8192, false));
    let before = f.posted().len();
    f.capsule(&read, &[]);
    let data = &f.posted()[before].bytes;
    assert!(data[..4096].iter().all(|&b| b == 0xa5) && data[4096..].iter().all(|&b| b == 0x5a));
}

/// A capsule refused before it has a slot is answered by its own SEND, and
/// its completion (even flushed) gives the refusal's place back; a queue
/// pair in error flushes what was posted and every slot comes back; more
/// commands than the queue holds close it.
#[test]
fn refusals_flushes_and_overrun() {
    let mut f = Fixture::new(Rig::new(Limits::default()), 0, 4);
    admin_connect(&mut f);
    let mut bad = Sqe::new(admin::IDENTIFY, 9);
    bad.set_cdw(10, 1);
    bad.set_sgl(&Sgl::Transport { len: 4096 });
    f.capsule(&bad, &[]);
    assert_eq!(f.response().status(), Status::SGL_DESCRIPTOR_TYPE_INVALID);
    let refusal = f.posted().len() - 1;
    assert_eq!(
        (f.posted()[refusal].wr_id >> 16) & 0xff,
        WR_RESPONSE_NO_SLOT
    );
    f.complete(refusal, WC_FLUSHED, 0);

    let mut set = Sqe::new(admin::SET_FEATURES, 10);
    set.set_cdw(10, feature::HOST_BEHAVIOR as u32);
    set.set_sgl(&keyed(512, false));
    f.capsule(&set, &[]);
    assert_eq!(f.conn.q.busy(), 1, "waiting for its READ");
    f.conn.close("test");
    assert!(f.conn.w.qp.disconnected);
    let read = f.posted().len() - 1;
    f.complete(read, WC_FLUSHED, 0);
    assert_eq!(f.conn.w.signaled, 0, "everything flushed");
    f.conn.q.teardown(&mut f.rig.io());
    assert_eq!(f.rig.arena.buffers_in_use(), 0, "every buffer back");

    let mut f = Fixture::new(Rig::new(Limits::default()), 0, 4);
    admin_connect(&mut f);
    let depth = f.conn.q.depth();
    for cid in 0..=2 * depth {
        let mut s = set;
        s.set_cid(cid);
        f.capsule(&s, &[]);
    }
    assert!(f.conn.w.qp.disconnected, "the host overran its queue");
}

/// A Connect may not ask for a larger queue than the RDMA connection was
/// made for (HSQSIZE + 1 entries sized its send queue): Connect Invalid
/// Parameters naming SQSIZE (NVMe Base 2.1, Connect response: IATTR 0, IPO
/// 44), on the admin queue and on an I/O queue; the same size is accepted.
#[test]
fn a_connect_larger_than_the_connection_is_refused() {
    for (qid, entries, ok) in [
        (0u16, 16u16, false),
        (1, 16, false),
        (0, 32, true),
        (1, 32, true),
    ] {
        let rig = Rig::new(Limits::default());
        // An I/O queue joins a live controller (its admin association kept).
        let admin = (qid != 0).then(|| enabled(&rig.registry, 1));
        let cntlid = admin.as_ref().map_or(0xffff, |a| a.ctrl.cntlid);
        let mut f = Fixture::new(rig, qid, 4);
        f.conn.w.entries = entries;
        let data = connect_data(DEFAULT_NQN, HOST, cntlid);
        // SQSIZE 31: a queue of 32 entries.
        f.capsule(&connect_sqe(qid, 0, if qid == 0 { 5000 } else { 0 }), &data);
        let cqe = f.response();
        let what = format!("qid {qid} on a connection of {entries} entries");
        if ok {
            assert_eq!(cqe.status(), Status::SUCCESS, "{what}");
        } else {
            assert_eq!(cqe.status(), Status::CONNECT_INVALID_PARAMETERS, "{what}");
            let names_sqsize = rdmablk_common::fabrics::invalid_param_dw0(false, 44);
            assert_eq!(cqe.dw0, names_sqsize, "{what}: names SQSIZE");
        }
    }
}
