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
//! daemon's CPU. Each test runs alone (`crate::alone`): it measures the
//! daemon, and a neighbour's flood would blur that.

use rdmablk_common::bytes::get_u32;
use rdmablk_common::fabrics::{ConnectCmd, ConnectData, DISCOVERY_NQN};
use rdmablk_common::nvme::identify::{cns, NamespaceId};
use rdmablk_common::nvme::{dnr_of, feature, nvm, Cqe, Sgl, Sqe, Status};
use rdmablk_common::tcp::{decode, encode, Digests, Header, CH_LEN};
use rdmablk_tests::check::{settled_fd_count, OrPanic};
use rdmablk_tests::client::{quiet, Controller, Opts, Queue};
use rdmablk_tests::limits::{raise_open_files_limit, restore_open_files_limit};
use rdmablk_tests::open_subsystem_config;
use rdmablk_tests::{fd_count, vm_rss_kib, Rng, Target, TempDir};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLockWriteGuard;
use std::time::{Duration, Instant};

mod admission;
mod flood;
mod stall;

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

/// What each test starts with: no other test of the binary running (see
/// the module comment), its threads on [`CLIENT_CPU`], as many descriptors
/// as the hard limit allows. Dropping it gives the test thread back its
/// CPUs and the process its limit: with `--test-threads=1` the same thread
/// goes on to run the binary's other tests.
struct Setup {
    /// Whether the daemon is to be pinned (the machine has both CPUs).
    pin: bool,
    /// The test thread's CPUs before.
    cpus: libc::cpu_set_t,
    /// The open-files limit before.
    open_files: libc::rlimit,
    _machine: RwLockWriteGuard<'static, ()>,
}

impl Setup {
    fn new() -> Setup {
        let machine = crate::alone();
        let cpus = current_cpus();
        // SAFETY: CPU_ISSET reads the set within its bounds (cpu < CPU_SETSIZE).
        let pin =
            unsafe { libc::CPU_ISSET(TARGET_CPU, &cpus) && libc::CPU_ISSET(CLIENT_CPU, &cpus) };
        if pin {
            // Threads inherit it: the victim's, the keep-alive threads.
            pin_current_thread(CLIENT_CPU);
        } else {
            println!("fewer than two CPUs: the daemon and the test share them");
        }
        // The floods here open thousands of sockets.
        let open_files = raise_open_files_limit(libc::rlim_t::MAX);
        Setup {
            pin,
            cpus,
            open_files,
            _machine: machine,
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

impl Drop for Setup {
    fn drop(&mut self) {
        // SAFETY: sched_setaffinity only reads the set, which we own.
        // Failures are left be: the next test starts over.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.cpus);
        }
        restore_open_files_limit(&self.open_files);
    }
}

/// The CPUs the calling thread may run on.
fn current_cpus() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data for which all zeroes is the empty set;
    // sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let rc = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        assert_eq!(rc, 0, "sched_getaffinity: {}", io::Error::last_os_error());
        set
    }
}

fn pin_current_thread(cpu: usize) {
    // SAFETY: as in `current_cpus`; CPU_SET writes within the set's bounds
    // (cpu < CPU_SETSIZE), sched_setaffinity only reads it.
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
        let plen = get_u32(&buf, 4) as usize;
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
