//! `[limits]` of `rdmablk-target` over real sockets: no host, by what it
//! sends, holds back or never reads, can starve the others.
//!
//! Each test runs a "victim", a well-behaved host doing verified I/O, beside
//! an attacker, and checks that the victim keeps completing its I/O with no
//! gap longer than a bound derived from the deadline the test configures,
//! that the target ends the attack within that deadline (plus a few
//! seconds), and that what the attacker made the target hold (arena
//! buffers, connections, controllers, memory, descriptors) comes back. The
//! victim's IOPS, alone and under attack, are printed, not asserted.
//!
//! The daemon runs on CPU 0 and the test's threads on CPU 1 (when the
//! machine has both), so that the attacker cannot win by taking the
//! daemon's CPU. The tests of this file run one at a time: each measures the
//! daemon, and a neighbour's flood would blur that.

use rdmablk_common::fabrics::{ConnectCmd, ConnectData, DISCOVERY_NQN};
use rdmablk_common::nvme::identify::{cns, NamespaceId};
use rdmablk_common::nvme::{dnr_of, feature, nvm, Cqe, Sgl, Sqe, Status};
use rdmablk_common::tcp::{decode, encode, Digests, Header, CH_LEN};
use rdmablk_tests::check::{settled_fd_count, OrPanic};
use rdmablk_tests::client::{Controller, Opts, Queue};
use rdmablk_tests::open_subsystem_config;
use rdmablk_tests::{fd_count, vm_rss_kib, Rng, Target, TempDir};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const NSID: u32 = 1;
const SUBNQN: &str = "nqn.2026-11.io.rdmablk:limits";
const VICTIM_HOST: &str = "nqn.2026-11.io.rdmablk:victim";
const ATTACKER_HOST: &str = "nqn.2026-11.io.rdmablk:attacker";
/// The host ID every host of these tests uses (the client's default).
const HOSTID: [u8; 16] = *b"rdmablk-test-hid";
/// Where the daemon runs, and where the test's threads do.
const TARGET_CPU: usize = 0;
const CLIENT_CPU: usize = 1;
/// The victim's I/O stays within the first bytes of the namespace, written
/// once before any measurement, so that its I/O does not grow the daemon's
/// memory (the namespace is anonymous memory, filled on first write).
const VICTIM_REGION: u64 = 4 << 20;
/// Iterations (a write and a verifying read each) of the victim alone.
const SOLO_ITERATIONS: usize = 500;
/// A victim runs no longer than this whatever happens (a safety net: the
/// test stops it long before).
const VICTIM_MAX_RUN: Duration = Duration::from_secs(60);
/// The stats file is rewritten every second.
const STATS_PERIOD: Duration = Duration::from_secs(1);
/// What the target may take beyond a deadline to act on it (its deadlines
/// are checked every 100 ms) and the test to notice.
const SLACK: Duration = Duration::from_secs(3);

// ---- the machine ----------------------------------------------------------

/// One test at a time (see the module comment).
static SERIAL: Mutex<()> = Mutex::new(());

/// What each test starts with: the others done, its threads on
/// [`CLIENT_CPU`], as many descriptors as the hard limit allows.
struct Setup {
    _serial: MutexGuard<'static, ()>,
    /// Whether the daemon is to be pinned (the machine has both CPUs).
    pin: bool,
}

impl Setup {
    fn new() -> Setup {
        let serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let pin = cpu_allowed(TARGET_CPU) && cpu_allowed(CLIENT_CPU);
        if pin {
            // Threads inherit it: the victim's, the keep-alive threads.
            pin_current_thread(CLIENT_CPU);
        } else {
            println!("fewer than two CPUs: the daemon and the test share them");
        }
        raise_open_files_limit();
        Setup {
            _serial: serial,
            pin,
        }
    }

    /// The daemon with `toml` (see [`config`]) writing its stats to `stats`,
    /// on [`TARGET_CPU`].
    fn target(&self, toml: &str, stats: &Path) -> Target {
        let cpu = TARGET_CPU.to_string();
        let stats = stats.to_str().expect("UTF-8 temp path");
        Target::start_config_with(toml, &["--stats", stats], self.pin.then_some(cpu.as_str()))
    }
}

fn cpu_allowed(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data for which all zeroes is the empty set;
    // sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into
    // it, and CPU_ISSET reads it within its bounds (cpu < CPU_SETSIZE).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
            && libc::CPU_ISSET(cpu, &set)
    }
}

fn pin_current_thread(cpu: usize) {
    // SAFETY: as in `cpu_allowed`; sched_setaffinity only reads the set.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        rc,
        0,
        "pinning the test thread to CPU {cpu}: {}",
        io::Error::last_os_error()
    );
}

/// Raises this process's soft limit of open files to the hard one: the
/// floods here open thousands of sockets.
fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`, which we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(rc, 0, "getrlimit: {}", io::Error::last_os_error());
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit only reads `lim`.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
        assert_eq!(rc, 0, "setrlimit: {}", io::Error::last_os_error());
    }
}

/// The daemon's configuration: one memory namespace in [`SUBNQN`] that any
/// host may use, `pollers` pollers, and `limits` (lines of the `[limits]`
/// table).
fn config(pollers: usize, limits: &str) -> String {
    open_subsystem_config(
        &format!("[pollers]\ncount = {pollers}\narena = \"64MiB\"\n\n[limits]\n{limits}"),
        SUBNQN,
        "backend = \"memory\"\nsize = \"256MiB\"",
    )
}

// ---- the stats file ---------------------------------------------------------

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Stats {
    connections: u64,
    queues_connected: u64,
    controllers: u64,
    /// Arena buffers in use, summed over pollers.
    buffers: u64,
}

fn read_stats(path: &Path) -> Option<Stats> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(Stats {
        connections: v["connections"].as_u64()?,
        queues_connected: v["queues_connected"].as_u64()?,
        controllers: v["controllers"].as_u64()?,
        buffers: v["arena_buffers_in_use"]
            .as_array()?
            .iter()
            .map(serde_json::Value::as_u64)
            .sum::<Option<u64>>()?,
    })
}

/// Polls the stats file until `want` holds; panics with the last reading
/// once `deadline` passes.
fn stats_until(path: &Path, deadline: Instant, what: &str, want: impl Fn(Stats) -> bool) -> Stats {
    loop {
        let got = read_stats(path);
        if let Some(s) = got.filter(|s| want(*s)) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the stats file still says {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Samples the stats file every 100 ms until `stop`: the highest value of
/// each counter seen.
fn watch_stats(path: &Path, stop: &AtomicBool) -> Stats {
    let mut max = Stats::default();
    while !stop.load(Ordering::Acquire) {
        if let Some(s) = read_stats(path) {
            max.connections = max.connections.max(s.connections);
            max.queues_connected = max.queues_connected.max(s.queues_connected);
            max.controllers = max.controllers.max(s.controllers);
            max.buffers = max.buffers.max(s.buffers);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    max
}

/// Sets the flag when dropped, so that a panicking test still stops the
/// threads of its scope (which would otherwise keep the scope from ending).
struct SetOnDrop<'a>([&'a AtomicBool; 2]);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        for flag in self.0 {
            flag.store(true, Ordering::Release);
        }
    }
}

// ---- the victim -------------------------------------------------------------

/// A well-behaved host: one controller with one I/O queue doing verified
/// random I/O in [`VICTIM_REGION`].
struct Victim {
    ctrl: Controller,
    rng: Rng,
    bs: u32,
}

/// What a victim did over one run.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// Completed I/Os (writes and reads).
    ios: u64,
    elapsed: Duration,
    /// The longest wait for a completion (from the start or the previous one).
    max_gap: Duration,
}

impl Run {
    fn iops(&self) -> f64 {
        self.ios as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl Victim {
    /// Connects and writes the whole region once.
    fn open(t: &Target) -> Victim {
        let ctrl = Controller::open(t.addr(), SUBNQN, VICTIM_HOST, &Opts::default())
            .or_panic("victim: opening its controller");
        let ns = NamespaceId::parse(
            &ctrl
                .admin()
                .identify(cns::NAMESPACE, NSID)
                .or_panic("victim: Identify Namespace"),
        );
        let bs = ns.block_size();
        let mut v = Victim {
            ctrl,
            rng: Rng::new(0x71c7),
            bs,
        };
        let fill = v.rng.bytes(MIB);
        for off in (0..VICTIM_REGION).step_by(MIB) {
            v.ctrl.io[0]
                .write(NSID, off / bs as u64, &fill, bs, false)
                .or_panic(format_args!("victim: filling its region at byte {off}"));
        }
        v
    }

    /// Writes a random 4 KiB to 64 KiB block at a random place, reads it
    /// back and compares, until `stop` is set or `iterations` are done.
    /// Any failure panics; so does a run longer than [`VICTIM_MAX_RUN`].
    fn run(&mut self, what: &str, iterations: usize, stop: &AtomicBool) -> Run {
        let bs = self.bs as u64;
        let start = Instant::now();
        let mut last = start;
        let mut max_gap = Duration::ZERO;
        let mut ios = 0;
        let mut completed = |ios: &mut u64| {
            let now = Instant::now();
            max_gap = max_gap.max(now - last);
            last = now;
            *ios += 1;
        };
        for i in 0..iterations {
            if stop.load(Ordering::Acquire) {
                break;
            }
            assert!(
                start.elapsed() < VICTIM_MAX_RUN,
                "{what}: the victim ran {VICTIM_MAX_RUN:?} without being stopped"
            );
            let len = 4 * KIB * (1 + self.rng.below(16) as usize);
            let off = self.rng.below((VICTIM_REGION - len as u64) / 4096 + 1) * 4096;
            let data = self.rng.bytes(len);
            let q = &mut self.ctrl.io[0];
            q.write(NSID, off / bs, &data, self.bs, false)
                .or_panic(format_args!(
                    "{what}: victim write #{i} ({len} bytes at byte {off})"
                ));
            completed(&mut ios);
            let got = q
                .read(NSID, off / bs, (len as u64 / bs) as u32, self.bs)
                .or_panic(format_args!(
                    "{what}: victim read #{i} ({len} bytes at byte {off})"
                ));
            completed(&mut ios);
            if let Some(at) = got.iter().zip(&data).position(|(a, b)| a != b) {
                panic!(
                    "{what}: victim read #{i} ({len} bytes at byte {off}) differs from what it wrote at byte {at}"
                );
            }
        }
        Run {
            ios,
            elapsed: start.elapsed(),
            max_gap,
        }
    }

    /// The victim alone, before any attack.
    fn solo(&mut self, what: &str) -> Run {
        let run = self.run(what, SOLO_ITERATIONS, &AtomicBool::new(false));
        assert_eq!(run.ios, 2 * SOLO_ITERATIONS as u64, "{what}: solo run");
        run
    }
}

/// Checks a victim's run under attack against the gap bound, and prints
/// its IOPS beside those it had alone.
fn judge_victim(what: &str, solo: Run, attacked: Run, bound: Duration) {
    println!(
        "{what}: victim IOPS solo {:.0}, under attack {:.0} ({:.2}x); {} I/Os in {:.1?} under attack, longest wait {:.0?} (bound {bound:?})",
        solo.iops(),
        attacked.iops(),
        attacked.iops() / solo.iops(),
        attacked.ios,
        attacked.elapsed,
        attacked.max_gap,
    );
    assert!(
        solo.max_gap <= bound,
        "{what}: the victim alone waited {:?} for a completion (bound {bound:?})",
        solo.max_gap
    );
    assert!(
        attacked.ios >= 2,
        "{what}: the victim completed {} I/Os under attack",
        attacked.ios
    );
    assert!(
        attacked.max_gap <= bound,
        "{what}: the victim waited {:?} for a completion under attack (bound {bound:?})",
        attacked.max_gap
    );
}

/// Runs `attack` while the victim does I/O and a thread samples the stats
/// file, and stops both once it returns (or panics): the victim's run, the
/// highest value of each counter seen, and what `attack` returned.
fn under_attack<T>(
    victim: &mut Victim,
    what: &str,
    stats: &Path,
    attack: impl FnOnce() -> T,
) -> (Run, Stats, T) {
    let stop = AtomicBool::new(false);
    let watch_stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = SetOnDrop([&stop, &watch_stop]);
        let victim = s.spawn(|| victim.run(what, usize::MAX, &stop));
        let watch = s.spawn(|| watch_stats(stats, &watch_stop));
        let got = attack();
        watch_stop.store(true, Ordering::Release);
        let peak = watch.join().expect("stats watcher");
        stop.store(true, Ordering::Release);
        let attacked = victim
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        (attacked, peak, got)
    })
}

// ---- raw protocol -------------------------------------------------------------

/// The largest PDU a raw queue accepts (a C2HData of 128 KiB and change).
const RAW_MAX_PDU: usize = 1 << 20;

/// A queue driven PDU by PDU: it sends what it is told and reads only when
/// asked, so it can leave the target's PDUs unread.
struct RawQueue {
    sock: TcpStream,
    next_cid: u16,
}

impl RawQueue {
    /// Connects and exchanges ICReq/ICResp (no digests).
    fn connect(addr: SocketAddr) -> io::Result<RawQueue> {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(Duration::from_secs(10)))?;
        sock.set_write_timeout(Some(Duration::from_secs(10)))?;
        let mut q = RawQueue { sock, next_cid: 0 };
        let icreq = Header::IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        };
        q.sock
            .write_all(&encode(&icreq, 0, &[], Digests::default(), 1))?;
        match q.recv()? {
            Header::IcResp { .. } => Ok(q),
            h => Err(io::Error::other(format!("expected ICResp, got {h:?}"))),
        }
    }

    /// Reads one PDU; only its header is kept.
    fn recv(&mut self) -> io::Result<Header> {
        let mut buf = vec![0u8; CH_LEN];
        self.sock.read_exact(&mut buf)?;
        let plen = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")) as usize;
        if !(CH_LEN..=RAW_MAX_PDU).contains(&plen) {
            return Err(io::Error::other(format!("PDU with PLEN {plen}")));
        }
        buf.resize(plen, 0);
        self.sock.read_exact(&mut buf[CH_LEN..])?;
        let (pdu, _) = decode(&buf, Digests::default(), RAW_MAX_PDU)
            .map_err(|e| io::Error::other(format!("bad PDU from the target: {e}")))?
            .ok_or_else(|| io::Error::other("PDU shorter than its PLEN"))?;
        Ok(pdu.header)
    }

    /// Sends a command capsule with `sgl` and in-capsule `data`; its CID.
    fn send(&mut self, mut sqe: Sqe, sgl: &Sgl, data: &[u8]) -> io::Result<u16> {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        sqe.set_cid(cid);
        sqe.set_sgl(sgl);
        let pdu = encode(&Header::CapsuleCmd(sqe), 0, data, Digests::default(), 1);
        self.sock.write_all(&pdu)?;
        Ok(cid)
    }

    /// Connect as I/O queue `qid` (depth `sqsize + 1`) of controller
    /// `cntlid`; the response.
    fn connect_io(&mut self, qid: u16, sqsize: u16, hostnqn: &str, cntlid: u16) -> io::Result<Cqe> {
        let cmd = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato: 0,
        };
        let data = ConnectData {
            hostid: HOSTID,
            cntlid,
            subnqn: SUBNQN.into(),
            hostnqn: hostnqn.into(),
        }
        .encode();
        let sgl = Sgl::InCapsule {
            offset: 0,
            len: data.len() as u32,
        };
        let cid = self.send(cmd.to_sqe(0, &sgl), &sgl, &data)?;
        match self.recv()? {
            Header::CapsuleResp(cqe) if cqe.cid == cid => Ok(cqe),
            h => Err(io::Error::other(format!(
                "expected the Connect response, got {h:?}"
            ))),
        }
    }

    /// Whether the target closed or reset the connection, found without
    /// reading (which would let the target send more).
    fn closed_by_peer(&self) -> bool {
        closed_by_peer(&[&self.sock]) == 1
    }

    /// Reads and discards until EOF or an error other than a timeout, for
    /// at most `within`: whether the connection ended.
    fn read_to_close(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut scratch = vec![0u8; 256 << 10];
        while Instant::now() < deadline {
            match self.sock.read(&mut scratch) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => return true,
            }
        }
        false
    }
}

/// How many of `socks` the peer closed or reset (poll: RDHUP, HUP or ERR),
/// found without reading.
fn closed_by_peer(socks: &[&TcpStream]) -> usize {
    let mut fds: Vec<libc::pollfd> = socks
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        })
        .collect();
    // SAFETY: poll reads and writes `fds.len()` pollfds of our vector, whose
    // descriptors `socks` keeps open.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    assert!(rc >= 0, "poll: {}", io::Error::last_os_error());
    fds.iter()
        .filter(|p| p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
        .count()
}

/// Arena buffers the target may use during an attack of 1 MiB commands
/// with the default budgets: the attacker's association_buffer (8 MiB, its
/// two queues 4 MiB each) in 1 MiB buffers, and the victim's (one command
/// at a time, but its buffer comes back only once the send of its data
/// completes, which may be after its next command arrived).
const ATTACK_BUFFERS_MAX: u64 = 8 + 2;

/// An attacker: a controller whose I/O queues (one per poller, depth 128)
/// are [`RawQueue`]s, the admin queue kept alive by the client.
struct Attacker {
    ctrl: Controller,
    queues: Vec<RawQueue>,
}

impl Attacker {
    fn open(t: &Target, io_queues: u16) -> Attacker {
        let ctrl = Controller::open(
            t.addr(),
            SUBNQN,
            ATTACKER_HOST,
            &Opts {
                io_queues: 0,
                ..Opts::default()
            },
        )
        .or_panic("attacker: opening its controller");
        let n = io_queues as u32 - 1;
        let granted = ctrl
            .admin()
            .set_features(feature::NUM_QUEUES, n | n << 16)
            .or_panic("attacker: Set Features (Number of Queues)");
        assert!(
            granted & 0xffff >= n && granted >> 16 >= n,
            "attacker asked for {io_queues} I/O queues, got {granted:#x}"
        );
        let queues = (1..=io_queues)
            .map(|qid| {
                let mut q = RawQueue::connect(t.addr())
                    .or_panic(format_args!("attacker: I/O queue {qid} ICReq"));
                let cqe = q
                    .connect_io(qid, 127, ATTACKER_HOST, ctrl.cntlid)
                    .or_panic(format_args!("attacker: I/O queue {qid} Connect"));
                assert!(
                    cqe.status().is_success(),
                    "attacker: I/O queue {qid} Connect: {}",
                    cqe.status()
                );
                q
            })
            .collect();
        Attacker { ctrl, queues }
    }

    /// Submits `n` commands of 1 MiB on every I/O queue, their data
    /// described by a transport SGL: reads whose data it will not read, or
    /// writes whose data it will not send.
    fn submit_1mib(&mut self, opcode: u8, n: usize, bs: u32) {
        let nlb = (MIB / bs as usize) as u32;
        for (i, q) in self.queues.iter_mut().enumerate() {
            for k in 0..n {
                let slba = (k * MIB) as u64 / bs as u64;
                q.send(
                    Queue::rw_sqe(opcode, NSID, slba, nlb),
                    &Sgl::Transport { len: MIB as u32 },
                    &[],
                )
                .or_panic(format_args!("attacker: queue {} command #{k}", i + 1));
            }
        }
    }

    /// Waits until the target has closed every I/O queue, or `deadline`:
    /// when the last one was seen closed, if all were.
    fn wait_closed(&self, deadline: Instant) -> Option<Instant> {
        loop {
            if self.queues.iter().all(RawQueue::closed_by_peer) {
                return Some(Instant::now());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

// ---- a stalled attacker ---------------------------------------------------------

/// An attack in which the attacker, beside the victim, submits 128
/// commands of 1 MiB on each of its 2 I/O queues and then stalls them: it
/// does not take their data, or does not send it, until the target ends
/// the queues for `[limits]` key `limit`.
struct Stall {
    what: &'static str,
    /// The commands, [`nvm::READ`] or [`nvm::WRITE`].
    opcode: u8,
    /// The `[limits]` key that ends the attack, and its value (whole seconds).
    limit: &'static str,
    timeout: Duration,
    /// For the messages: what the commands were ("its reads"), what the
    /// attacker failed to do after them, and what the target did to its
    /// queues.
    commands: &'static str,
    stalled: &'static str,
    ended: &'static str,
}

/// A [`Stall`] ready to run: the daemon with its limit, the victim (its
/// solo run done) and the attacker connected.
struct Stalling {
    // In drop order: the hosts, then the daemon, then its stats file.
    attacker: Attacker,
    victim: Victim,
    solo: Run,
    _t: Target,
    stats: PathBuf,
    _dir: TempDir,
    stall: Stall,
}

impl Stall {
    /// Starts the daemon (2 pollers, `limit = timeout`), the victim and the
    /// attacker.
    fn prepare(self, setup: &Setup) -> Stalling {
        let dir = TempDir::new(&format!("limits-{}", self.limit));
        let stats = dir.join("stats.json");
        let limits = format!("{} = \"{}s\"", self.limit, self.timeout.as_secs());
        let t = setup.target(&config(2, &limits), &stats);
        let mut victim = Victim::open(&t);
        let solo = victim.solo(self.what);
        let attacker = Attacker::open(&t, 2);
        Stalling {
            attacker,
            victim,
            solo,
            _t: t,
            stats,
            _dir: dir,
            stall: self,
        }
    }
}

impl Stalling {
    /// Runs the attack beside the victim. The target must end every
    /// attacker's I/O queue no sooner than the limit and no later than
    /// [`SLACK`] after it; meanwhile at most [`ATTACK_BUFFERS_MAX`] arena
    /// buffers are in use, and the victim waits at most half the limit for
    /// any completion. Then no buffer stays in use, and only the victim's
    /// association and the attacker's admin queue remain.
    fn run(&mut self) {
        let Stalling {
            attacker,
            victim,
            solo,
            stats,
            stall,
            ..
        } = self;
        let Stall {
            what,
            opcode,
            limit,
            timeout,
            commands,
            stalled,
            ended,
        } = *stall;
        let stats: &Path = stats;
        let bs = victim.bs;
        let (attacked, peak, closed) = under_attack(victim, what, stats, || {
            let start = Instant::now();
            attacker.submit_1mib(opcode, 128, bs);
            let closed = attacker.wait_closed(start + timeout + SLACK);
            closed.map(|at| at - start)
        });
        let held = peak.buffers;
        let Some(closed) = closed else {
            let open = attacker
                .queues
                .iter()
                .filter(|q| !q.closed_by_peer())
                .count();
            panic!(
                "{what}: {open} of the attacker's I/O queues still open {:?} after {stalled} ({limit} {timeout:?})",
                timeout + SLACK
            );
        };
        println!(
            "{what}: the attacker's queues were {ended} {closed:.1?} after {commands} ({limit} {timeout:?}); at most {held} arena buffers in use meanwhile"
        );
        assert!(
            closed >= timeout,
            "{what}: the attacker's queues were closed {closed:?} after {commands}, before {limit} ({timeout:?})"
        );
        assert!(
            (1..=ATTACK_BUFFERS_MAX).contains(&held),
            "{what}: the stats file showed at most {held} arena buffers in use during the attack; want 1 to {ATTACK_BUFFERS_MAX} (the attacker's association_buffer in 1 MiB buffers, and the victim's)"
        );
        for (i, q) in attacker.queues.iter_mut().enumerate() {
            assert!(
                q.read_to_close(Duration::from_secs(5)),
                "{what}: reading the attacker's I/O queue {} did not end in EOF or a reset",
                i + 1
            );
        }
        judge_victim(what, *solo, attacked, timeout / 2);
        // The victim stopped: no buffer may stay in use. Its association and
        // the attacker's admin queue remain.
        stats_until(
            stats,
            Instant::now() + 3 * STATS_PERIOD,
            "after the attack",
            |s| s.buffers == 0 && s.queues_connected == 3 && s.connections == 3,
        );
    }
}

// ---- tests ----------------------------------------------------------------------

/// A host that submits reads of 1 MiB and never reads its socket holds, at
/// most, its queues' buffer budget; once its sends make no progress for
/// `limits.send_timeout` its queues are reset and the buffers come back.
/// The victim, sharing the pollers, does not notice.
#[test]
fn host_that_stops_reading_is_torn_down() {
    let setup = Setup::new();
    let mut attack = Stall {
        what: "host that stops reading",
        opcode: nvm::READ,
        limit: "send_timeout",
        timeout: Duration::from_secs(4),
        commands: "its reads",
        stalled: "it stopped reading",
        ended: "reset",
    }
    .prepare(&setup);
    stats_until(
        &attack.stats,
        Instant::now() + 5 * STATS_PERIOD,
        "victim (2 queues) and attacker (3) connected",
        |s| s.queues_connected == 5 && s.controllers == 2,
    );
    attack.run();
    attack
        .attacker
        .ctrl
        .admin()
        .keep_alive()
        .or_panic("the attacker's admin queue after its I/O queues were torn down");
}

/// A host that submits writes of 1 MiB and never sends the data the R2Ts
/// ask for holds its queues' buffer budget for `limits.data_timeout`, then
/// its queues are closed and the buffers come back.
#[test]
fn unanswered_r2t_is_torn_down() {
    let setup = Setup::new();
    Stall {
        what: "unanswered R2T",
        opcode: nvm::WRITE,
        limit: "data_timeout",
        timeout: Duration::from_secs(3),
        commands: "its writes",
        stalled: "writes whose data it never sent",
        ended: "closed",
    }
    .prepare(&setup)
    .run();
}

/// Discovery associations whose hosts asked for no keep-alive (KATO 0)
/// still expire after `limits.discovery_keep_alive`; an association whose
/// host never enables the controller ends after `limits.enable_timeout`.
#[test]
fn idle_discovery_associations_expire() {
    const IDLE: usize = 1000;
    let setup = Setup::new();
    let what = "idle discovery associations";
    let keep_alive = Duration::from_secs(6);
    let enable_timeout = Duration::from_secs(2);
    let dir = TempDir::new("limits-discovery");
    let stats = dir.join("stats.json");
    let t = setup.target(
        &config(2, "discovery_keep_alive = \"6s\"\nenable_timeout = \"2s\""),
        &stats,
    );
    let mut victim = Victim::open(&t);
    let solo = victim.solo(what);

    // Admin Connects whose hosts never set CC.EN, to an NVM subsystem (KATO
    // 0: no keep-alive deadline) and to the discovery subsystem.
    let start = Instant::now();
    let mut never_enabled: Vec<(&str, Queue)> = [(SUBNQN, "nvm"), (DISCOVERY_NQN, "discovery")]
        .into_iter()
        .map(|(nqn, kind)| {
            let host = format!("nqn.2026-11.io.rdmablk:never-enabled-{kind}");
            let mut q = Queue::connect(t.addr(), Digests::default())
                .or_panic(format_args!("{kind}: ICReq"));
            let cqe = q
                .fabrics_connect(0, 31, 0, nqn, &host, HOSTID, 0xffff)
                .or_panic(format_args!("{kind}: admin Connect"));
            assert!(
                cqe.status().is_success(),
                "{kind}: admin Connect: {}",
                cqe.status()
            );
            (kind, q)
        })
        .collect();
    for (kind, q) in &mut never_enabled {
        let left = (start + enable_timeout + SLACK).saturating_duration_since(Instant::now());
        assert!(
            q.is_closed_by_peer(left),
            "{kind} association never enabled still open {:?} after its Connect (enable_timeout {enable_timeout:?})",
            start.elapsed()
        );
        let elapsed = start.elapsed();
        assert!(
            elapsed >= enable_timeout,
            "{kind} association never enabled closed {elapsed:?} after its Connect, before enable_timeout ({enable_timeout:?})"
        );
        println!("{what}: {kind} association never enabled closed after {elapsed:.1?}");
    }
    drop(never_enabled);

    let (attacked, peak, (idle, created, gone)) = under_attack(&mut victim, what, &stats, || {
        let opts = Opts {
            io_queues: 0,
            kato_ms: 0,
            auto_keep_alive: false,
            ..Opts::default()
        };
        let begin = Instant::now();
        let idle: Vec<Controller> = (0..IDLE)
            .map(|i| {
                let host = format!("nqn.2026-11.io.rdmablk:idle-{i}");
                Controller::open(t.addr(), DISCOVERY_NQN, &host, &opts)
                    .or_panic(format_args!("discovery association #{i} as {host}"))
            })
            .collect();
        let created = Instant::now();
        println!(
            "{what}: {IDLE} discovery associations enabled in {:.1?}",
            created - begin
        );
        // Each expires discovery_keep_alive after it was enabled; the stats
        // file may lag a period.
        stats_until(
            &stats,
            created + keep_alive + SLACK + STATS_PERIOD,
            "idle discovery associations past discovery_keep_alive",
            |s| s.controllers == 1 && s.connections == 2 && s.queues_connected == 2,
        );
        let gone = created.elapsed();
        (idle, created, gone)
    });
    println!(
        "{what}: at most {} controllers and {} connections seen; all idle ones gone {gone:.1?} after the last was enabled (discovery_keep_alive {keep_alive:?})",
        peak.controllers, peak.connections
    );
    // The target closed every one of them.
    let mut still_open = 0;
    for c in &idle {
        if !c.admin().is_closed_by_peer(Duration::from_millis(200)) {
            still_open += 1;
        }
    }
    assert_eq!(
        still_open,
        0,
        "{what}: discovery admin queues still open {:?} after the last was enabled",
        created.elapsed()
    );
    judge_victim(what, solo, attacked, keep_alive / 2);
    stats_until(
        &stats,
        Instant::now() + 3 * STATS_PERIOD,
        "after the idle associations",
        |s| s.buffers == 0 && s.controllers == 1 && s.connections == 2,
    );
}

// ---- connection flood --------------------------------------------------------

/// A TCP connection started without waiting for it (non-blocking connect).
fn start_connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let SocketAddr::V4(v4) = addr else {
        return Err(io::Error::other("IPv4 only"));
    };
    // SAFETY: socket(2) takes plain integers and returns a new descriptor,
    // which TcpStream then owns (and closes on drop).
    let sock = unsafe {
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        TcpStream::from_raw_fd(fd)
    };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: connect(2) reads a sockaddr_in of the length given, which
    // lives on our stack for the call.
    let rc = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(sock)
}

/// One connection of the flood.
struct FloodConn {
    sock: TcpStream,
    /// Sends an ICReq once connected (the others send nothing).
    icreq: bool,
    /// Connected (and the ICReq, if any, sent) or failed: nothing left to do.
    done: bool,
}

/// Opens `n` connections as fast as it can, every other one sending an
/// ICReq once connected; returns once all are connected or failed (or at
/// `deadline`), with how many failed to connect.
fn flood(addr: SocketAddr, n: usize, deadline: Instant) -> (Vec<FloodConn>, usize) {
    let icreq = encode(
        &Header::IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        },
        0,
        &[],
        Digests::default(),
        1,
    );
    let mut conns: Vec<FloodConn> = (0..n)
        .map(|i| FloodConn {
            sock: start_connect(addr).or_panic(format_args!("flood connection #{i}")),
            icreq: i % 2 == 0,
            done: false,
        })
        .collect();
    let mut failed = 0;
    loop {
        let waiting: Vec<usize> = (0..conns.len()).filter(|&i| !conns[i].done).collect();
        if waiting.is_empty() || Instant::now() >= deadline {
            break;
        }
        let mut fds: Vec<libc::pollfd> = waiting
            .iter()
            .map(|&i| libc::pollfd {
                fd: conns[i].sock.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            })
            .collect();
        // SAFETY: poll reads and writes the pollfds of our vector, whose
        // descriptors `conns` keeps open.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        assert!(rc >= 0, "poll: {}", io::Error::last_os_error());
        for (p, &i) in fds.iter().zip(&waiting) {
            if p.revents == 0 {
                continue;
            }
            let c = &mut conns[i];
            c.done = true;
            match c.sock.take_error() {
                Ok(None) if c.icreq => {
                    // The target may have closed it already: no matter.
                    let _ = (&c.sock).write(&icreq);
                }
                Ok(None) => {}
                _ => failed += 1,
            }
        }
    }
    (conns, failed)
}

/// What the flood's connections look like from the host, found without
/// reading: closed by the target, or still open, answered (ICResp) or not.
#[derive(Clone, Copy, Debug, Default)]
struct FloodView {
    closed: usize,
    /// Of the connections that sent an ICReq: still open.
    icreq_open: usize,
    /// Of those, answered with an ICResp: connections the target took.
    icreq_answered: usize,
    /// Of the connections that sent nothing: still open (taken by the
    /// target, or still in the kernel's accept queue).
    silent_open: usize,
}

fn flood_view(conns: &[FloodConn]) -> FloodView {
    let mut fds: Vec<libc::pollfd> = conns
        .iter()
        .map(|c| libc::pollfd {
            fd: c.sock.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        })
        .collect();
    // SAFETY: poll reads and writes the pollfds of our vector, whose
    // descriptors `conns` keeps open.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    assert!(rc >= 0, "poll: {}", io::Error::last_os_error());
    let mut v = FloodView::default();
    for (p, c) in fds.iter().zip(conns) {
        if p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            v.closed += 1;
        } else if c.icreq {
            v.icreq_open += 1;
            if p.revents & libc::POLLIN != 0 {
                v.icreq_answered += 1;
            }
        } else {
            v.silent_open += 1;
        }
    }
    v
}

/// Thousands of connections that never Connect: the target keeps at most
/// `limits.pending_connections` of them, the victim keeps its pace, and
/// once they are gone the daemon's memory and descriptors are back where
/// they were.
///
/// Seen from the host, a connection the target has not accepted yet looks
/// like one it keeps: with a flood this fast the listen queue overflows and
/// the kernel completes handshakes (SYN cookies) it hands to the daemon
/// only when the host sends something. So the limit is checked on the
/// daemon (its stats and descriptors), and on the host with the half that
/// sends an ICReq: each is either answered or closed, at most
/// `pending_connections` answered.
#[test]
fn connection_flood_leaves_no_trace() {
    const FLOOD: usize = 3000;
    const PENDING: usize = 256;
    let setup = Setup::new();
    let what = "connection flood";
    // Longer than the test holds the connections: the target closes those
    // beyond the limit at accept, not at this deadline.
    let handshake_timeout = Duration::from_secs(10);
    let dir = TempDir::new("limits-flood");
    let stats = dir.join("stats.json");
    let t = setup.target(
        &config(
            2,
            &format!("pending_connections = {PENDING}\nhandshake_timeout = \"10s\""),
        ),
        &stats,
    );
    let mut victim = Victim::open(&t);
    let solo = victim.solo(what);
    let pid = t.pid();
    let base_fds = settled_fd_count(pid);
    let base_rss = vm_rss_kib(pid);

    let (attacked, peak, (hold, flood_end)) = under_attack(&mut victim, what, &stats, || {
        let start = Instant::now();
        let (conns, failed) = flood(t.addr(), FLOOD, start + Duration::from_secs(15));
        let connected = Instant::now();
        let unfinished = conns.iter().filter(|c| !c.done).count();
        assert_eq!(
            unfinished,
            0,
            "{what}: {unfinished} connections neither connected nor failed {:?} into the flood",
            connected - start
        );
        println!(
            "{what}: {FLOOD} connections opened in {:.1?} ({failed} failed to connect)",
            connected - start
        );
        // Hold them 2 s, then look at the daemon.
        std::thread::sleep(Duration::from_secs(2));
        let hold = (vm_rss_kib(pid), fd_count(pid), flood_view(&conns));
        // The ICReq half: every one answered or closed, at most
        // pending_connections answered; well before handshake_timeout.
        let deadline = start + handshake_timeout - Duration::from_secs(2);
        let mut view = hold.2;
        while view.icreq_open > view.icreq_answered && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            view = flood_view(&conns);
        }
        println!(
            "{what}: after the 2 s hold {:?}; {:.1?} into the flood {view:?}",
            hold.2,
            start.elapsed()
        );
        assert!(
            view.icreq_open == view.icreq_answered && view.icreq_answered <= PENDING,
            "{what}: of {} connections that sent an ICReq, {} are open and {} of those answered, {:?} into the flood (pending_connections {PENDING})",
            FLOOD.div_ceil(2),
            view.icreq_open,
            view.icreq_answered,
            start.elapsed()
        );
        drop(conns);
        let flood_end = Instant::now();
        (hold, flood_end)
    });
    let (hold_rss, hold_fds, _) = hold;
    judge_victim(what, solo, attacked, handshake_timeout / 4);
    assert!(
        peak.connections <= PENDING as u64 + 2,
        "{what}: the stats file showed {} connections, more than pending_connections ({PENDING}) and the victim's 2",
        peak.connections
    );
    // One more for the stats file being rewritten.
    assert!(
        hold_fds <= base_fds + PENDING + 1,
        "{what}: the daemon held {hold_fds} descriptors during the flood, {base_fds} before it (pending_connections {PENDING})"
    );

    // Within 10 s of the flood's end, memory and descriptors are back.
    let deadline = flood_end + Duration::from_secs(10);
    let rss_bound = base_rss + base_rss / 10;
    let (mut rss, mut fds);
    loop {
        rss = vm_rss_kib(pid);
        fds = fd_count(pid);
        if (rss <= rss_bound && fds <= base_fds) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "{what}: daemon VmRSS {base_rss} KiB before, {hold_rss} KiB holding the flood, {rss} KiB {:.1?} after it ({:+.1}%); descriptors {base_fds}, {hold_fds}, {fds}; at most {} connections in the stats file",
        flood_end.elapsed(),
        (rss as f64 / base_rss as f64 - 1.0) * 100.0,
        peak.connections
    );
    assert!(
        rss <= rss_bound,
        "{what}: daemon VmRSS {rss} KiB 10 s after the flood, more than 10% over the {base_rss} KiB before it"
    );
    assert!(
        fds <= base_fds,
        "{what}: the daemon holds {fds} descriptors 10 s after the flood, {base_fds} before it"
    );
    stats_until(
        &stats,
        Instant::now() + 3 * STATS_PERIOD,
        "after the flood",
        |s| s.connections == 2 && s.queues_connected == 2 && s.buffers == 0,
    );
}

// ---- admission ---------------------------------------------------------------

/// An admin Connect as `host` on a fresh connection; the response.
fn admin_connect(t: &Target, host: &str) -> (Queue, Cqe) {
    let mut q =
        Queue::connect(t.addr(), Digests::default()).or_panic(format_args!("ICReq as {host}"));
    let cqe = q
        .fabrics_connect(0, 31, 0, SUBNQN, host, HOSTID, 0xffff)
        .or_panic(format_args!("admin Connect as {host}"));
    (q, cqe)
}

/// The Connect status for a target out of room: Controller Busy, a Connect
/// command-specific status (SCT 1h, SC 81h; NVMe Base 2.1, Figure 105
/// (Controller Busy)), with DNR clear so that the host retries later rather
/// than giving up.
fn assert_busy(cqe: &Cqe, what: &str) {
    assert_eq!(
        cqe.status(),
        Status::CONTROLLER_BUSY,
        "{what}: got {}, want Controller Busy",
        cqe.status()
    );
    assert!(
        !dnr_of(cqe.status),
        "{what}: Controller Busy with DNR set (status field {:#06x}): the host would not retry",
        cqe.status
    );
}

/// Retries an admin Connect as `host` (a new connection each time) until it
/// succeeds, for up to 5 s.
fn admin_connect_eventually(t: &Target, host: &str, what: &str) -> Queue {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (q, cqe) = admin_connect(t, host);
        if cqe.status().is_success() {
            return q;
        }
        assert!(
            cqe.status() == Status::CONTROLLER_BUSY && Instant::now() < deadline,
            "{what}: admin Connect as {host} still refused: {}",
            cqe.status()
        );
        drop(q);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `limits.connections` and `limits.associations_per_host`: a Connect
/// beyond either is answered Controller Busy with DNR clear (NVMe Base 2.1,
/// Figure 105 (Controller Busy)), and succeeds once room is made.
#[test]
fn connect_beyond_limits_gets_controller_busy() {
    let setup = Setup::new();
    let host = |n: u32| format!("nqn.2026-11.io.rdmablk:host-{n}");
    let dir = TempDir::new("limits-busy");

    // connections = 3.
    let t = setup.target(&config(2, "connections = 3"), &dir.join("stats-a.json"));
    let opts_io = |io_queues| Opts {
        io_queues,
        ..Opts::default()
    };
    let first = Controller::open(t.addr(), SUBNQN, &host(1), &opts_io(1))
        .or_panic("first host: controller with 1 I/O queue (2 queues)");
    let second = Controller::open(t.addr(), SUBNQN, &host(2), &opts_io(0))
        .or_panic("second host: admin queue (the 3rd queue)");
    let (refused, cqe) = admin_connect(&t, &host(3));
    assert_busy(&cqe, "admin Connect of a 3rd host with 3 queues connected");
    drop(refused);
    // An I/O queue beyond the limit is refused the same way, and its queue
    // id stays free for a later Connect.
    second
        .admin()
        .set_features(feature::NUM_QUEUES, 0)
        .or_panic("second host: Set Features (Number of Queues)");
    let mut io_q = Queue::connect(t.addr(), Digests::default()).or_panic("second host: ICReq");
    let cqe = io_q
        .fabrics_connect(1, 127, 0, SUBNQN, &host(2), HOSTID, second.cntlid)
        .or_panic("second host: I/O queue Connect");
    assert_busy(&cqe, "I/O queue Connect with 3 queues connected");
    drop(io_q);

    drop(first);
    let mut third = admin_connect_eventually(&t, &host(3), "after the first host left");
    // Two queues are free: the third host's admin queue took one; the
    // second host's I/O queue takes the other.
    let mut io_q = Queue::connect(t.addr(), Digests::default()).or_panic("second host: ICReq");
    let cqe = io_q
        .fabrics_connect(1, 127, 0, SUBNQN, &host(2), HOSTID, second.cntlid)
        .or_panic("second host: I/O queue Connect");
    assert!(
        cqe.status().is_success(),
        "second host's I/O queue Connect once room was made: {}",
        cqe.status()
    );
    io_q.read(NSID, 0, 8, 512)
        .or_panic("read on the second host's I/O queue");
    third
        .prop_get(rdmablk_common::nvme::property::CAP, true)
        .or_panic("Property Get on the third host's admin queue");
    drop((t, second, third, io_q));

    // associations_per_host = 2.
    let t = setup.target(
        &config(2, "associations_per_host = 2"),
        &dir.join("stats-b.json"),
    );
    let a = Controller::open(t.addr(), SUBNQN, &host(1), &opts_io(1))
        .or_panic("host 1: first association");
    let b = Controller::open(t.addr(), SUBNQN, &host(1), &opts_io(1))
        .or_panic("host 1: second association");
    let (refused, cqe) = admin_connect(&t, &host(1));
    assert_busy(
        &cqe,
        "a 3rd association of one host (associations_per_host 2)",
    );
    drop(refused);
    // Another host is not counted against host 1.
    let other = Controller::open(t.addr(), SUBNQN, &host(2), &opts_io(1))
        .or_panic("host 2 while host 1 is at its limit");
    drop(a);
    let mut again = admin_connect_eventually(&t, &host(1), "after host 1 ended an association");
    again
        .prop_get(rdmablk_common::nvme::property::CAP, true)
        .or_panic("Property Get on host 1's new admin queue");
    drop((b, other));
}
