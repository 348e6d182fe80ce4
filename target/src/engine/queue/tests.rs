//! The command state machine and the capsule rules through a fake wire: no
//! socket, no queue pair, no ring (backend operations are collected, and
//! their completions fed back by hand).

use super::*;
use crate::config::{self, Limits, QuickArgs};
use crate::nvme::subsystem::Registry;
use crate::testing::*;
use rdmablk_common::fabrics::cattr;
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::{fuse, nvm, Sgl};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A transport that records what the state machine asks of it.
struct FakeWire {
    caps: TransportCaps,
    /// (slot, bytes received when asked).
    fetched: Vec<(u16, usize)>,
    /// (slot, response, data returned before it).
    responses: Vec<(Option<u16>, Cqe, Option<Vec<u8>>)>,
    sends: SendWatch,
    arrival: Arrival,
    /// Whether it holds a response not sent yet.
    holding: bool,
}

impl FakeWire {
    fn new(caps: TransportCaps) -> FakeWire {
        FakeWire {
            caps,
            fetched: Vec::new(),
            responses: Vec::new(),
            sends: SendWatch::default(),
            arrival: arrival(),
            holding: false,
        }
    }

    fn last(&self) -> &(Option<u16>, Cqe, Option<Vec<u8>>) {
        self.responses.last().expect("a response")
    }
}

impl Wire for FakeWire {
    const DATA_OVERDUE: &'static str = "data overdue";
    const SENDS_STALLED: &'static str = "sends stalled";

    fn caps(&self) -> TransportCaps {
        self.caps
    }

    fn arrival(&self) -> &Arrival {
        &self.arrival
    }

    fn fetch(&mut self, slot: u16, cmd: &mut Command, _io: &mut Io) {
        self.fetched.push((slot, cmd.received));
        cmd.requested = cmd.len;
    }

    fn respond(&mut self, r: Response<'_>, io: &mut Io) {
        let data = r.data.map(|(b, len)| {
            let mut v = vec![0u8; len];
            io.arena.read(b, 0, &mut v);
            v
        });
        self.responses.push((r.slot, r.cqe, data));
    }

    fn closing(&self) -> bool {
        false
    }

    fn shut(&mut self) {}

    fn sends(&self) -> &SendWatch {
        &self.sends
    }

    fn drained(&self) -> bool {
        !self.holding
    }

    fn idle(&self) -> bool {
        true
    }
}

/// NVMe/TCP's kind of SGLs (transport data blocks), and NVMe/RDMA's (keyed).
const STREAM: TransportCaps = CAPS;
const KEYED: TransportCaps = TransportCaps {
    sgls: sgls::SUPPORTED | sgls::KEYED | sgls::OFFSET,
    ..CAPS
};

/// A queue of `rig` with its fake wire.
struct Fixture {
    rig: Rig,
    q: Queue,
    w: FakeWire,
}

impl Fixture {
    fn new(rig: Rig, caps: TransportCaps) -> Fixture {
        let q = Queue::new(Binding::new(rig.pending()), "unit".into(), 0, 0, 0);
        Fixture {
            rig,
            q,
            w: FakeWire::new(caps),
        }
    }

    fn receive(&mut self, sqe: &Sqe, data: &[u8]) -> Intake {
        let data = InCapsule::Bytes {
            data,
            digest_ok: true,
        };
        self.q.receive(sqe, data, &mut self.rig.io(), &mut self.w)
    }

    /// Sends a capsule; returns its status once answered.
    fn status(&mut self, sqe: &Sqe, data: &[u8]) -> Status {
        assert_eq!(self.receive(sqe, data), Intake::Taken);
        let (slot, cqe, _) = *self.w.last();
        self.q.sent(slot, &mut self.rig.io());
        cqe.status()
    }

    fn state(&self, slot: u16) -> Option<State> {
        self.q.command(slot).map(|c| c.state)
    }

    /// Connects the queue as I/O queue 1 of `admin`'s controller.
    fn connect_io(&mut self, admin: &crate::nvme::controller::Association, cattr: u8) -> Cqe {
        let sqe = connect_sqe(1, cattr, 0);
        let data = connect_data(&admin.ctrl.subsys.nqn, HOST, admin.ctrl.cntlid);
        assert_eq!(self.status(&sqe, &data), Status::SUCCESS, "I/O Connect");
        self.w.last().1
    }

    fn data_arrived(&mut self, slot: u16, end: usize) {
        let io = &mut self.rig.io();
        self.q.data_arrived(slot, end, true, io, &mut self.w);
    }
}

fn rw(opcode: u8, cid: u16, slba: u64, len: usize, sgl: Sgl) -> Sqe {
    let mut sqe = Sqe::new(opcode, cid);
    sqe.set_nsid(1);
    sqe.set_cdw(10, slba as u32);
    sqe.set_cdw(11, (slba >> 32) as u32);
    sqe.set_cdw(12, (len / 512) as u32 - 1);
    sqe.set_sgl(&sgl);
    sqe
}

/// A Disconnect with command id `cid`.
fn disconnect_sqe(cid: u16) -> Sqe {
    let mut sqe = Sqe::new(rdmablk_common::nvme::FABRICS_OPCODE, cid);
    // FCTYPE is the SQE's byte 4.
    sqe.set_nsid(rdmablk_common::fabrics::fctype::DISCONNECT as u32);
    sqe.set_sgl(&transport(0));
    sqe
}

fn transport(len: usize) -> Sgl {
    Sgl::Transport { len: len as u32 }
}

fn in_capsule(len: usize) -> Sgl {
    Sgl::InCapsule {
        offset: 0,
        len: len as u32,
    }
}

/// A registry whose namespace is a 16 MiB file (its I/O goes to the ring)
/// with `limits`.
fn file_registry(limits: Limits) -> Arc<Registry> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("rdmablk-unit-{}-{n}", std::process::id());
    let path = std::env::temp_dir().join(name);
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(16 << 20))
        .expect("namespace file");
    let cfg = config::from_quick_args(&QuickArgs {
        file: Some(path.clone()),
        ..QuickArgs::default()
    })
    .expect("quick form");
    let mut cfg = cfg;
    cfg.limits = limits;
    let reg = Arc::new(Registry::open(&cfg, Vec::new()).expect("registry"));
    let _ = std::fs::remove_file(path);
    reg
}

/// Received → fetching data → responding → free for a write whose data
/// the host sends on request; received → returning data for the read of
/// it, which carries the same bytes; a Connect and the Disconnect that
/// unbinds the queue (NVMe Base 2.1, 6.4), after which I/O is a Command
/// Sequence Error again.
#[test]
fn write_and_read_through_every_state() {
    let rig = Rig::new(Limits::default());
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    assert_eq!(f.connect_io(&admin, 0).dw0, admin.ctrl.cntlid as u32);
    assert_eq!(f.q.qid, 1);

    let write = rw(nvm::WRITE, 10, 8, 8192, transport(8192));
    assert_eq!(f.receive(&write, &[]), Intake::Taken);
    assert_eq!(f.state(0), Some(State::FetchingData));
    assert_eq!(f.w.fetched, [(0, 0)]);
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    let buf = f.q.command(0).unwrap().buf.as_ref().unwrap();
    f.rig.arena.write(buf, 0, &pattern);
    f.data_arrived(0, 8192);
    assert_eq!(f.state(0), Some(State::Responding));
    let (slot, cqe, data) = f.w.last().clone();
    assert_eq!((slot, cqe.status(), data), (Some(0), Status::SUCCESS, None));
    f.q.sent(slot, &mut f.rig.io());
    assert_eq!(f.state(0), None, "freed once sent");

    let read = rw(nvm::READ, 11, 8, 8192, transport(8192));
    assert_eq!(f.receive(&read, &[]), Intake::Taken);
    assert_eq!(f.state(0), Some(State::ReturningData));
    let (_, cqe, data) = f.w.last();
    assert_eq!(cqe.status(), Status::SUCCESS);
    assert!(data.as_deref() == Some(&pattern[..]), "the bytes written");
    f.q.sent(Some(0), &mut f.rig.io());

    let disconnect = disconnect_sqe(12);
    assert_eq!(f.status(&disconnect, &[]), Status::SUCCESS);
    assert!(f.q.bind.assoc.is_none(), "unbound");
    assert_eq!(
        f.status(&rw(nvm::READ, 13, 0, 512, transport(512)), &[]),
        Status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(f.q.busy(), 0);
    f.q.teardown(&mut f.rig.io());
    assert_eq!(f.rig.arena.buffers_in_use(), 0, "every buffer back");
}

/// A file namespace: commands wait on the backend, a short transfer
/// continues where it stopped, and only the last completion responds.
#[test]
fn backend_completions_finish_commands() {
    let rig = Rig::with_registry(file_registry(Limits::default()));
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    f.rig.submitted.clear();
    let write = rw(nvm::WRITE, 20, 0, 4096, in_capsule(4096));
    assert_eq!(f.receive(&write, &[5u8; 4096]), Intake::Taken);
    assert_eq!(f.state(0), Some(State::OnBackend));
    assert_eq!(f.rig.submitted.len(), 1, "one WRITE_FIXED");
    let answered = f.w.responses.len();
    f.q.on_backend(0, 1024, &mut f.rig.io(), &mut f.w);
    assert_eq!(f.state(0), Some(State::OnBackend), "short: continues");
    assert_eq!(f.rig.submitted.len(), 2, "the rest submitted");
    assert_eq!(f.w.responses.len(), answered);
    f.q.on_backend(0, 3072, &mut f.rig.io(), &mut f.w);
    assert_eq!(f.state(0), Some(State::Responding));
    assert_eq!(f.w.last().1.status(), Status::SUCCESS);

    // A failed operation is an Internal Error (NVMe Base 2.1, Figure 101: 06h).
    let read = rw(nvm::READ, 21, 0, 4096, transport(4096));
    assert_eq!(f.receive(&read, &[]), Intake::Taken);
    f.q.on_backend(1, -libc::EIO, &mut f.rig.io(), &mut f.w);
    assert_eq!(f.state(1), Some(State::Responding), "no data returned");
    let (_, cqe, data) = f.w.last();
    assert_eq!(
        (cqe.status(), data.is_none()),
        (Status::INTERNAL_ERROR, true)
    );
    assert!(f.q.idle_backend());
}

/// A Disconnect's completion is the last of its queue (NVMe Base 2.1,
/// 6.4): a command still waiting for a buffer is aborted (Command Aborted
/// due to SQ Deletion) at once, one on the backend answers when it ends,
/// and only then the Disconnect.
#[test]
fn disconnect_answers_last() {
    let limits = Limits {
        queue_buffer: 8192,
        ..Limits::default()
    };
    let rig = Rig::with_registry(file_registry(limits));
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    let on_backend = rw(nvm::WRITE, 20, 0, 4096, in_capsule(4096));
    assert_eq!(f.receive(&on_backend, &[5u8; 4096]), Intake::Taken);
    let waiting = rw(nvm::WRITE, 21, 8, 8192, transport(8192));
    assert_eq!(f.receive(&waiting, &[]), Intake::Taken);
    assert_eq!(
        [f.state(0), f.state(1)],
        [Some(State::OnBackend), Some(State::AwaitingBuffer)]
    );
    let disconnect = disconnect_sqe(22);
    let before = f.w.responses.len();
    assert_eq!(f.receive(&disconnect, &[]), Intake::Taken);
    assert!(f.q.bind.assoc.is_none(), "the queue is deleted at once");
    f.q.on_backend(0, 4096, &mut f.rig.io(), &mut f.w);
    let answered: Vec<(u16, Status)> = f.w.responses[before..]
        .iter()
        .map(|r| (r.1.cid, r.1.status()))
        .collect();
    assert_eq!(
        answered,
        [
            (21, Status::ABORTED_SQ_DELETION),
            (20, Status::SUCCESS),
            (22, Status::SUCCESS)
        ],
        "the waiting write aborted, the one on the backend done, then the Disconnect"
    );
}

/// A queue over its buffer budget waits for its own buffers to come back,
/// in arrival order, without stopping other commands.
#[test]
fn commands_wait_for_buffers_in_order() {
    let limits = Limits {
        queue_buffer: 8192,
        ..Limits::default()
    };
    let rig = Rig::new(limits);
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    assert_eq!(
        f.receive(&rw(nvm::WRITE, 1, 0, 8192, transport(8192)), &[]),
        Intake::Taken
    );
    assert_eq!(
        f.receive(&rw(nvm::WRITE, 2, 0, 4096, transport(4096)), &[]),
        Intake::Taken
    );
    assert_eq!(
        f.receive(&rw(nvm::WRITE, 3, 0, 512, transport(512)), &[]),
        Intake::Taken
    );
    assert_eq!(
        [f.state(0), f.state(1), f.state(2)],
        [
            Some(State::FetchingData),
            Some(State::AwaitingBuffer),
            Some(State::AwaitingBuffer)
        ]
    );
    // A command without data goes by.
    let mut flush = Sqe::new(nvm::FLUSH, 4);
    flush.set_nsid(1);
    flush.set_sgl(&transport(0));
    assert_eq!(f.status(&flush, &[]), Status::SUCCESS);
    f.data_arrived(0, 8192);
    f.q.sent(Some(0), &mut f.rig.io());
    f.q.grant_buffers(&mut f.rig.io(), &mut f.w);
    assert_eq!(
        [f.state(1), f.state(2)],
        [Some(State::FetchingData), Some(State::FetchingData)]
    );
    assert_eq!(
        f.w.fetched.iter().map(|s| s.0).collect::<Vec<_>>(),
        [0, 1, 2]
    );
}

/// One rule per status for every capsule, whatever the transport: the SGL
/// descriptor types the transport takes (NVMe Base 2.1, Figure 102: 11h),
/// in-capsule data at offset 0 (16h) and exactly as long as what arrived,
/// within IOCCSZ (0Fh); no in-capsule data for reads or for descriptors
/// that point elsewhere (0Fh); a data digest that does not match is a
/// Transient Transport Error (NVMe/TCP 1.0, 3.6.2.3).
#[test]
fn capsule_rules() {
    let rig = Rig::new(Limits::default());
    let admin = enabled(&rig.registry, 1);
    let keyed = Sgl::Keyed {
        addr: 0x1000,
        len: 4096,
        key: 9,
        invalidate: false,
    };
    let cases: [(TransportCaps, Sgl, usize, Status, &str); 8] = [
        (
            STREAM,
            Sgl::InCapsule {
                offset: 16,
                len: 4096,
            },
            4096,
            Status::SGL_OFFSET_INVALID,
            "in-capsule data at an offset",
        ),
        (
            STREAM,
            in_capsule(4096),
            2048,
            Status::SGL_DATA_LENGTH_INVALID,
            "less data than the SGL",
        ),
        (
            STREAM,
            in_capsule(2048),
            4096,
            Status::SGL_DATA_LENGTH_INVALID,
            "more data than the SGL",
        ),
        (
            KEYED,
            in_capsule(16384),
            16384,
            Status::SGL_DATA_LENGTH_INVALID,
            "beyond IOCCSZ",
        ),
        (
            STREAM,
            keyed,
            0,
            Status::SGL_DESCRIPTOR_TYPE_INVALID,
            "a keyed SGL on a stream",
        ),
        (
            KEYED,
            transport(4096),
            0,
            Status::SGL_DESCRIPTOR_TYPE_INVALID,
            "a transport SGL on RDMA",
        ),
        (
            STREAM,
            transport(4096),
            4096,
            Status::SGL_DATA_LENGTH_INVALID,
            "data beside a transport SGL",
        ),
        (
            KEYED,
            keyed,
            512,
            Status::SGL_DATA_LENGTH_INVALID,
            "data beside a keyed SGL",
        ),
    ];
    for (caps, sgl, arrived, want, what) in cases {
        let mut f = Fixture::new(Rig::with_registry(rig.registry.clone()), caps);
        f.connect_io(&admin, 0);
        let sqe = rw(nvm::WRITE, 7, 0, 4096, sgl);
        assert_eq!(f.status(&sqe, &vec![0u8; arrived]), want, "{what}");
        assert_eq!(f.q.busy(), 0, "{what}: nothing held");
        f.q.teardown(&mut f.rig.io());
    }
    let mut f = Fixture::new(Rig::with_registry(rig.registry.clone()), STREAM);
    f.connect_io(&admin, 0);
    let read = rw(nvm::READ, 8, 0, 512, in_capsule(512));
    assert_eq!(
        f.status(&read, &[0u8; 512]),
        Status::SGL_DATA_LENGTH_INVALID,
        "a read with data"
    );
    let write = rw(nvm::WRITE, 9, 0, 512, in_capsule(512));
    let data = InCapsule::Bytes {
        data: &[0u8; 512],
        digest_ok: false,
    };
    assert_eq!(
        f.q.receive(&write, data, &mut f.rig.io(), &mut f.w),
        Intake::Taken
    );
    assert_eq!(
        f.w.last().1.status(),
        Status::TRANSIENT_TRANSPORT_ERROR,
        "digest"
    );
}

/// Refusals not yet sent are bounded by the queue's depth (beyond, the
/// capsule waits); commands by twice the depth (beyond, the host overran
/// its queue and the queue closes, as nvmet's "out of commands").
#[test]
fn refusals_and_commands_are_bounded_by_the_depth() {
    let rig = Rig::new(Limits::default());
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    let depth = f.q.depth() as usize;
    let bad = rw(nvm::WRITE, 1, 0, 512, in_capsule(1024));
    for i in 0..depth {
        assert_eq!(f.receive(&bad, &[0u8; 1024]), Intake::Taken, "refusal {i}");
    }
    assert_eq!(f.receive(&bad, &[0u8; 1024]), Intake::Stall);
    f.q.sent(None, &mut f.rig.io());
    assert_eq!(f.receive(&bad, &[0u8; 1024]), Intake::Taken);
    for _ in 0..depth {
        f.q.sent(None, &mut f.rig.io());
    }
    for i in 0..2 * depth {
        let w = rw(nvm::WRITE, i as u16, 0, 512, transport(512));
        assert_eq!(f.receive(&w, &[]), Intake::Taken, "command {i}");
    }
    let w = rw(nvm::WRITE, 999, 0, 512, transport(512));
    assert_eq!(f.receive(&w, &[]), Intake::Overrun);
}

/// Responses report the SQ head, or FFFFh once the host disabled SQ flow
/// control at Connect (NVMe over Fabrics 1.1, 3.3.2 and Figure 20).
#[test]
fn sq_head_or_flow_control_disabled() {
    let rig = Rig::new(Limits::default());
    let admin = enabled(&rig.registry, 2);
    for (cattr, heads) in [(0, [1u16, 2, 3]), (cattr::DISABLE_SQ_FLOW, [0xffff; 3])] {
        let mut f = Fixture::new(Rig::with_registry(rig.registry.clone()), STREAM);
        let mut got = vec![f.connect_io(&admin, cattr).sqhd];
        for cid in 0..2 {
            f.status(&rw(nvm::READ, cid, 0, 512, transport(512)), &[]);
            got.push(f.w.last().1.sqhd);
        }
        assert_eq!(got, heads, "CATTR {cattr:#x}");
        f.q.teardown(&mut f.rig.io());
    }
}

/// Deadlines: a queue without a Connect, and data asked of the host that
/// does not come.
#[test]
fn overdue_connect_and_data() {
    let limits = Limits {
        handshake_timeout: Duration::ZERO,
        data_timeout: Duration::ZERO,
        ..Limits::default()
    };
    let rig = Rig::new(limits.clone());
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(
        f.q.overdue(&f.w, &limits),
        Some("no Connect within limits.handshake_timeout of the connection")
    );
    f.connect_io(&admin, 0);
    assert_eq!(f.q.overdue(&f.w, &limits), None);
    f.receive(&rw(nvm::WRITE, 1, 0, 512, transport(512)), &[]);
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(f.q.overdue(&f.w, &limits), Some(FakeWire::DATA_OVERDUE));
}

/// A queue of an ended association closes once its wire has sent what it
/// holds (an AUTH_Failure1 reaches the host before the disconnect), and
/// `END_GRACE` after the end whatever it holds.
#[test]
fn an_ended_association_closes_once_its_responses_are_sent() {
    let limits = Limits::default();
    let rig = Rig::new(limits.clone());
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    assert_eq!(f.q.overdue(&f.w, &limits), None, "a live association");
    admin.ctrl.kill("unit test");
    f.w.holding = true;
    assert_eq!(f.q.overdue(&f.w, &limits), None, "a response on the wire");
    f.w.holding = false;
    assert_eq!(f.q.overdue(&f.w, &limits), Some("controller ended"));
    f.w.holding = true;
    std::thread::sleep(crate::engine::binding::END_GRACE + Duration::from_millis(20));
    assert_eq!(
        f.q.overdue(&f.w, &limits),
        Some("controller ended"),
        "past END_GRACE"
    );
}

/// A fused pair: a first sent as `sgl`, and its second.
fn fused(opcode: u8, cid: u16, fuse_bits: u8, sgl: Sgl) -> Sqe {
    let mut sqe = rw(opcode, cid, 64, 512, sgl);
    sqe.set_flags(sqe.flags() | fuse_bits);
    sqe
}

/// NVMe Base 2.1, 3.4.2: a first whose data failed before its second
/// came ends at once, and the second then fails with it (Failed Fused
/// Command) rather than wait for a partner that has answered already.
#[test]
fn a_second_after_its_failed_first_fails_at_once() {
    let rig = Rig::new(Limits::default());
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    let first = fused(nvm::COMPARE, 1, fuse::FIRST, transport(512));
    assert_eq!(f.receive(&first, &[]), Intake::Taken);
    assert_eq!(f.state(0), Some(State::FetchingData));
    f.q.data_arrived(0, 512, false, &mut f.rig.io(), &mut f.w);
    assert_eq!(f.w.last().1.status(), Status::TRANSIENT_TRANSPORT_ERROR);
    let second = fused(nvm::WRITE, 2, fuse::SECOND, in_capsule(512));
    assert_eq!(f.receive(&second, &[7; 512]), Intake::Taken);
    let (_, cqe, _) = *f.w.last();
    assert_eq!((cqe.cid, cqe.status()), (2, Status::ABORTED_FAILED_FUSED));
}

/// A first followed by anything but its second: Missing Fused Command, and
/// the other command runs; a second alone: Missing Fused Command too.
#[test]
fn a_first_without_its_second_and_a_lone_second() {
    let rig = Rig::new(Limits::default());
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    let first = fused(nvm::COMPARE, 1, fuse::FIRST, in_capsule(512));
    assert_eq!(f.receive(&first, &[0; 512]), Intake::Taken);
    assert_eq!(f.state(0), Some(State::AwaitingPartner));
    let read = rw(nvm::READ, 2, 0, 512, transport(512));
    assert_eq!(f.receive(&read, &[]), Intake::Taken);
    let answers: Vec<(u16, Status)> =
        f.w.responses
            .iter()
            .skip(1)
            .map(|(_, c, _)| (c.cid, c.status()))
            .collect();
    assert_eq!(
        answers,
        [(1, Status::ABORTED_MISSING_FUSED), (2, Status::SUCCESS)]
    );
    let second = fused(nvm::WRITE, 3, fuse::SECOND, in_capsule(512));
    assert_eq!(f.status(&second, &[1; 512]), Status::ABORTED_MISSING_FUSED);
}

/// A matching pair writes (memory namespace: at once); a mismatch leaves
/// the blocks as they were.
#[test]
fn compare_and_write_writes_only_on_a_match() {
    let rig = Rig::new(Limits::default());
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    let pair = |f: &mut Fixture, expect: u8, new: u8, cid: u16| {
        let first = fused(nvm::COMPARE, cid, fuse::FIRST, in_capsule(512));
        let second = fused(nvm::WRITE, cid + 1, fuse::SECOND, in_capsule(512));
        f.receive(&first, &[expect; 512]);
        f.receive(&second, &[new; 512]);
        let n = f.w.responses.len();
        f.w.responses[n - 2..]
            .iter()
            .map(|(_, c, _)| c.status())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        pair(&mut f, 0, 5, 10),
        [Status::SUCCESS, Status::SUCCESS],
        "zeroes compare equal"
    );
    assert_eq!(
        pair(&mut f, 0, 6, 20),
        [Status::COMPARE_FAILURE, Status::ABORTED_FAILED_FUSED]
    );
    let read = rw(nvm::READ, 30, 64, 512, transport(512));
    f.receive(&read, &[]);
    assert_eq!(f.w.last().2.as_deref(), Some(&[5u8; 512][..]));
}

/// Writes over their namespace's QoS limit (10 per second: 100 ms each,
/// 5 ms of tolerance) wait without a buffer and without asking for their
/// data; each goes on, in order, when its time comes (the poller is told
/// when); a read, under no limit, goes by; a Disconnect aborts one still
/// held, and the namespace counts them.
#[test]
fn commands_over_their_limit_wait_in_order_without_a_buffer() {
    let rig = Rig::new(Limits::default());
    let sub = rig.registry.subsystems()[0].clone();
    let ns = sub.namespace(1).expect("namespace 1");
    let mut limits = config::QosLimits::default();
    limits.set(config::QosKey::WriteIops, Some(10));
    assert!(ns.tenancy.set_limits(None, limits));
    let admin = enabled(&rig.registry, 1);
    let mut f = Fixture::new(rig, STREAM);
    f.connect_io(&admin, 0);
    for cid in 1..=3 {
        let write = rw(nvm::WRITE, cid, 0, 4096, transport(4096));
        assert_eq!(f.receive(&write, &[]), Intake::Taken);
    }
    let start = Instant::now();
    assert_eq!(
        [f.state(0), f.state(1), f.state(2)],
        [
            Some(State::FetchingData),
            Some(State::Throttled),
            Some(State::Throttled)
        ]
    );
    assert!(
        f.q.command(1).unwrap().buf.is_none(),
        "no buffer while held"
    );
    assert_eq!(f.w.fetched, [(0, 0)]);
    let wake = f.rig.wake_at.expect("the poller is told when to wake");
    let first = wake.saturating_duration_since(start);
    assert!(first <= Duration::from_millis(95), "{first:?}");
    assert!(first >= Duration::from_millis(80), "{first:?}");
    assert_eq!(
        f.status(&rw(nvm::READ, 4, 0, 512, transport(512)), &[]),
        Status::SUCCESS
    );

    f.q.pump(&mut f.rig.io(), &mut f.w);
    assert_eq!(f.state(1), Some(State::Throttled), "not before its time");
    std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    f.rig.wake_at = None;
    f.q.pump(&mut f.rig.io(), &mut f.w);
    assert_eq!(
        [f.state(1), f.state(2)],
        [Some(State::FetchingData), Some(State::Throttled)]
    );
    assert_eq!(f.w.fetched, [(0, 0), (1, 0)], "in order");
    let next = f.rig.wake_at.expect("the next time");
    assert!(
        next >= wake + Duration::from_millis(90),
        "{:?}",
        next - wake
    );

    f.data_arrived(0, 4096);
    f.data_arrived(1, 4096);
    let disconnect = disconnect_sqe(9);
    let before = f.w.responses.len();
    assert_eq!(f.receive(&disconnect, &[]), Intake::Taken);
    let answered: Vec<(u16, Status)> = f.w.responses[before..]
        .iter()
        .map(|r| (r.1.cid, r.1.status()))
        .collect();
    assert_eq!(
        answered,
        [(3, Status::ABORTED_SQ_DELETION), (9, Status::SUCCESS)]
    );
    for slot in 0..5 {
        f.q.sent(Some(slot), &mut f.rig.io());
    }
    assert_eq!(ns.metrics.throttled(), 2);
    assert_eq!(ns.metrics.queued(), 0, "none held any more");
}
