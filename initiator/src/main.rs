//! rdmablk: discover NVMe-oF subsystems, connect a remote namespace and
//! export it locally, or benchmark it.

mod connect_all;

/// Paths one connection may have (each is an association of its own).
const MAX_PATHS: usize = 16;

use clap::{Args, Parser, Subcommand};
use rdmablk::bench::{self, Bench, Job, Pattern, Progress, Stats};
use rdmablk::frontend::keeper::{EngineSpec, Engines, Keeper, Until};
use rdmablk::frontend::nbd::{self, Listen};
use rdmablk::frontend::state;
use rdmablk::frontend::ublk;
use rdmablk::host::{Attachment, HostError, Params, Session, Transport};
use rdmablk::hostid;
use rdmablk::signals::stop_set;
use rdmablk_common::auth::host::HostSecrets;
use rdmablk_common::auth::Secret;
use rdmablk_common::fabrics::discovery::{adrfam, eflags, subtype, treq, DiscoveryEntry};
use rdmablk_common::spin::{PollMode, SpinBounds};
use rdmablk_common::tcp::Digests;
use rdmablk_common::units;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// NVMe over Fabrics host: discover subsystems, connect a namespace as a
/// local disk (NBD), or benchmark it. Flags follow nvme-cli.
#[derive(Parser)]
#[command(name = "rdmablk", version)]
struct Cli {
    /// Log level when RUST_LOG is not set: error, warn, info, debug, trace.
    #[arg(long, global = true, value_name = "LEVEL", default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the discovery log of a target, as `nvme discover` does.
    #[command(after_help = "Example:\n  rdmablk discover -t tcp -a 127.0.0.1 -s 4420")]
    Discover(Target),
    /// Connect a namespace and serve it locally until SIGINT/SIGTERM: as an
    /// NBD export (--nbd) or as a ublk block device /dev/ublkbN (--ublk).
    #[command(after_help = "Examples:
  rdmablk connect -t tcp -a 127.0.0.1 -s 4420 -n NQN --nbd unix:/run/rdmablk/disk0.sock
  rdmablk connect -t tcp -a 10.0.0.1 -n NQN --nbd tcp:127.0.0.1:10809 -i 2
  rdmablk connect -t rdma -a 10.0.0.1 -n NQN --ublk --ublk-id 0 --queues 2
Then: nbd-client -unix /run/rdmablk/disk0.sock /dev/nbd0, qemu-img info nbd+unix:///?socket=..., nbdfuse, fio --ioengine=nbd;
or use /dev/ublkb0 like any disk (mkfs, mount, fio). After a crash, the same command with the same
--ublk-id takes the device over again: I/O that waited completes (systemd's Restart= does this).")]
    Connect(ConnectArgs),
    /// Benchmark a namespace: IOPS, bandwidth, latency percentiles.
    #[command(after_help = "Examples:
  rdmablk bench -t tcp -a 127.0.0.1 -s 4420 -n NQN --rw randread --bs 4k --qd 32 --runtime 10s
  rdmablk bench -t tcp -a 127.0.0.1 -s 4420 -n NQN --rw randrw --bs 64k --qd 16 --verify --json")]
    Bench(BenchArgs),
    /// List the namespaces `rdmablk connect` serves on this machine: each
    /// with its front-end (NBD URI or ublk device) and its paths, with their
    /// transport, address, controller id, ANA state and whether they are
    /// live.
    #[command(after_help = "Example:\n  rdmablk list\n  rdmablk list --json")]
    List(ListArgs),
    /// Connect every NVMe subsystem that the discovery controller (-a), or
    /// each one in /etc/nvme/discovery.conf, lists for this host, with all
    /// the paths its entries name (one `rdmablk connect` each), and serve
    /// them until SIGINT/SIGTERM.
    #[command(after_help = "Examples:
  rdmablk connect-all -t tcp -a 10.0.0.1 -s 4420 --nbd-dir /run/rdmablk
  rdmablk connect-all --ublk --ublk-id-base 10       # controllers from /etc/nvme/discovery.conf")]
    ConnectAll(ConnectAllArgs),
}

#[derive(Args)]
struct ConnectAllArgs {
    /// The discovery controller's transport: tcp or rdma.
    #[arg(short = 't', long = "transport", default_value = "tcp")]
    transport: String,
    /// The discovery controller's address; without it, every controller
    /// listed in --discovery-conf (nvme-cli's format) is asked.
    #[arg(short = 'a', long = "traddr")]
    traddr: Option<String>,
    /// The discovery controller's port.
    #[arg(short = 's', long = "trsvcid", default_value_t = 4420)]
    trsvcid: u16,
    /// Discovery controllers, one per line (-t, -a, -s, -q, -I), when -a is not given.
    #[arg(long = "discovery-conf", value_name = "FILE", default_value = connect_all::DISCOVERY_CONF)]
    discovery_conf: PathBuf,
    /// Host NQN (default: /etc/nvme/hostnqn, else derived from /etc/machine-id).
    #[arg(short = 'q', long = "hostnqn")]
    hostnqn: Option<String>,
    /// Host identifier, a UUID (default: /etc/nvme/hostid, else derived).
    #[arg(short = 'I', long = "hostid")]
    hostid: Option<String>,
    /// Serve each subsystem as an NBD export, its socket in DIR (the NQN,
    /// with characters other than letters, digits, - . _ made _, then .sock).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "ublk",
        conflicts_with = "ublk"
    )]
    nbd_dir: Option<PathBuf>,
    /// Serve each subsystem as a ublk device, ids from --ublk-id-base up in
    /// NQN order.
    #[arg(long)]
    ublk: bool,
    /// The ublk device id of the first subsystem (with --ublk).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "ublk")]
    ublk_id_base: u32,
    /// I/O queues of each connection.
    #[arg(short = 'i', long = "nr-io-queues", default_value_t = 1)]
    nr_io_queues: u16,
    /// Seconds without a usable path before a connection gives up.
    #[arg(short = 'l', long = "ctrl-loss-tmo", default_value_t = 600)]
    ctrl_loss_tmo: u64,
}

#[derive(Args)]
struct ListArgs {
    /// Print the connections as a JSON array.
    #[arg(long)]
    json: bool,
}

/// Where the target is and who we are.
#[derive(Args, Clone)]
struct Target {
    /// Transport: tcp (NVMe/TCP) or rdma (NVMe/RDMA: RoCE, InfiniBand).
    #[arg(short = 't', long = "transport", default_value = "tcp")]
    transport: String,
    /// Target address (IP or host name).
    #[arg(short = 'a', long = "traddr")]
    traddr: String,
    /// Target port.
    #[arg(short = 's', long = "trsvcid", default_value_t = 4420)]
    trsvcid: u16,
    /// Host NQN (default: /etc/nvme/hostnqn, else derived from /etc/machine-id).
    #[arg(short = 'q', long = "hostnqn")]
    hostnqn: Option<String>,
    /// Host identifier, a UUID (default: /etc/nvme/hostid, else derived from /etc/machine-id).
    #[arg(short = 'I', long = "hostid")]
    hostid: Option<String>,
    /// Header digests (CRC32C).
    #[arg(short = 'g', long = "hdr-digest")]
    hdr_digest: bool,
    /// Data digests (CRC32C).
    #[arg(short = 'G', long = "data-digest")]
    data_digest: bool,
    /// Ask the target to disable SQ flow control (as nvme-cli's option):
    /// it then reports no SQ head, and an NVMe/TCP target may end a read
    /// with its last data PDU instead of a response. A target that refuses
    /// (Invalid Field) is connected again without it.
    #[arg(long = "disable-sqflow")]
    disable_sqflow: bool,
    /// DH-HMAC-CHAP host secret, as `nvme gen-dhchap-key` prints it
    /// (DHHC-1:XX:...:), for targets that require authentication. Every
    /// queue authenticates; the secret is not logged.
    #[arg(short = 'S', long = "dhchap-secret", value_name = "DHHC-1:...")]
    dhchap_secret: Option<String>,
    /// The controller's DH-HMAC-CHAP secret: authenticate the target too
    /// (bidirectional); a target that fails is refused.
    #[arg(short = 'C', long = "dhchap-ctrl-secret", value_name = "DHHC-1:...")]
    dhchap_ctrl_secret: Option<String>,
}

/// A subsystem to use.
#[derive(Args, Clone)]
struct Subsys {
    #[command(flatten)]
    target: Target,
    /// Subsystem NQN. Without it, the discovery log at the address must
    /// list exactly one NVMe subsystem on this transport: that one is used,
    /// at the address its entry gives, with SQ flow control disabled when
    /// the entry allows it (TREQ), as `nvme connect-all` does.
    #[arg(short = 'n', long = "nqn")]
    nqn: Option<String>,
    /// Namespace id (default: the first active namespace).
    #[arg(long)]
    nsid: Option<u32>,
    /// I/O queue entries.
    #[arg(short = 'Q', long = "queue-size", default_value_t = 128)]
    queue_size: u16,
    /// Keep-alive timeout in seconds (0 disables keep-alive).
    #[arg(short = 'k', long = "keep-alive-tmo", default_value_t = 5)]
    keep_alive_tmo: u32,
    /// One more path to the same subsystem (multipath), e.g. another gateway
    /// or the same target over another transport: tcp://ADDR:PORT or
    /// rdma://ADDR:PORT (repeatable; -t/-a/-s give the first path). The
    /// namespace must report the same identifiers on every path. I/O goes
    /// to the ANA-optimized paths (the one with the fewest commands
    /// outstanding), to non-optimized ones only when no optimized path is
    /// live, and moves to another path, without an error, when a path dies
    /// or its state changes.
    #[arg(long = "path", value_name = "TRANSPORT://ADDR:PORT")]
    paths: Vec<String>,
}

#[derive(Args)]
struct ConnectArgs {
    #[command(flatten)]
    subsys: Subsys,
    /// Serve the namespace as an NBD export: unix:PATH or tcp:HOST:PORT.
    #[arg(
        long,
        value_name = "unix:PATH|tcp:HOST:PORT",
        required_unless_present = "ublk",
        conflicts_with = "ublk"
    )]
    nbd: Option<Listen>,
    /// NBD clients served at most (handshakes that began included); beyond,
    /// a client is told the export is full (NBD_REP_ERR_POLICY). Four times
    /// as many handshakes (at least 1024) run at once; a client silent
    /// since it connected makes room for a new one.
    #[arg(long, value_name = "N", default_value_t = 256, requires = "nbd")]
    nbd_max_clients: usize,
    /// Serve the namespace as a ublk block device, /dev/ublkbN (Linux 6.0+,
    /// modprobe ublk_drv).
    #[arg(long)]
    ublk: bool,
    /// ublk device id N (/dev/ublkbN); a device left by a crashed rdmablk
    /// with this id is recovered. Default: the kernel picks a free id.
    #[arg(long, value_name = "N", requires = "ublk")]
    ublk_id: Option<u32>,
    /// Requests in flight per ublk queue.
    #[arg(long, value_name = "N", default_value_t = 64, requires = "ublk")]
    queue_depth: u16,
    #[command(flatten)]
    poll: PollArgs,
    /// I/O queues (one thread each; one ublk queue each); NBD clients are
    /// spread over them.
    #[arg(
        short = 'i',
        long = "nr-io-queues",
        visible_alias = "queues",
        default_value_t = 1
    )]
    nr_io_queues: u16,
    /// Seconds to keep re-establishing a lost association (I/O waits
    /// meanwhile) before failing it and exiting.
    #[arg(short = 'l', long = "ctrl-loss-tmo", default_value_t = 600)]
    ctrl_loss_tmo: u64,
}

/// How each I/O queue's thread waits for completions.
#[derive(Args)]
struct PollArgs {
    /// Spin on each queue's io_uring (and NVMe/RDMA completion queue) and
    /// never sleep: the lowest latency, one core kept fully busy whatever
    /// the load (as SPDK's perf does); pin it with taskset.
    #[arg(long)]
    busy_poll: bool,
    /// Adaptive polling (the default): after its last completion a queue's
    /// thread keeps polling for a window, then sleeps; the window starts
    /// here and shrinks back here when sleeps are long.
    #[arg(long, value_name = "DURATION", default_value = "5us")]
    spin_min: String,
    /// The longest the window grows to (while completions keep arriving
    /// just after the thread went to sleep). 0: sleep as soon as idle.
    #[arg(long, value_name = "DURATION", default_value = "100us")]
    spin_max: String,
}

impl PollArgs {
    fn mode(&self) -> Result<PollMode, String> {
        let window =
            |flag: &str, v: &str| units::parse_duration(v).map_err(|e| format!("--{flag}: {e}"));
        let min = window("spin-min", &self.spin_min)?;
        let max = window("spin-max", &self.spin_max)?;
        let bounds =
            SpinBounds::new(min, max).map_err(|e| format!("--spin-min/--spin-max: {e}"))?;
        Ok(if self.busy_poll {
            PollMode::Busy
        } else {
            PollMode::Adaptive(bounds)
        })
    }
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    subsys: Subsys,
    /// Access pattern: randread, randwrite, read, write, randrw.
    #[arg(long, default_value = "randread")]
    rw: Pattern,
    /// Bytes per I/O (e.g. 4k, 128k, 1m); larger than the target's MDTS is split.
    #[arg(long, default_value = "4k")]
    bs: String,
    /// I/Os in flight per queue.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// How long to run (e.g. 10s, 500ms, 2m).
    #[arg(long, default_value = "10s")]
    runtime: String,
    /// I/O queues (one thread each).
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Write self-checking blocks (LBA, run id, CRC32C) and check every block read back.
    #[arg(long)]
    verify: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    poll: PollArgs,
    /// Seconds without a usable path (all lost or none ANA-usable) before
    /// the run fails; meanwhile lost paths are reconnected and I/O waits.
    #[arg(short = 'l', long = "ctrl-loss-tmo", default_value_t = 10)]
    ctrl_loss_tmo: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // libublk logs its own progress at info: keep it to warnings.
        .or_else(|_| {
            tracing_subscriber::EnvFilter::try_new(format!("{},libublk=warn", cli.log_level))
        })
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.cmd {
        Command::Discover(t) => discover(&t),
        Command::Connect(c) => connect(&c),
        Command::Bench(b) => run_bench(&b),
        Command::List(l) => list(&l),
        Command::ConnectAll(a) => connect_all(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rdmablk: {e}");
            ExitCode::FAILURE
        }
    }
}

fn params(
    t: &Target,
    subnqn: &str,
    kato_s: u32,
    queue_size: u16,
    io_queues: u16,
) -> Result<Params, String> {
    let transport: Transport = t
        .transport
        .parse()
        .map_err(|e| format!("-t {}: {e}", t.transport))?;
    let addr: SocketAddr = (t.traddr.as_str(), t.trsvcid)
        .to_socket_addrs()
        .map_err(|e| format!("-a {}: {e}", t.traddr))?
        .next()
        .ok_or_else(|| format!("-a {}: no address", t.traddr))?;
    let hostid = match &t.hostid {
        Some(s) => hostid::parse_uuid(s)
            .ok_or_else(|| format!("-I {s}: not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"))?,
        None => hostid::default_hostid(),
    };
    if transport == Transport::Rdma && (t.hdr_digest || t.data_digest) {
        return Err("-g/-G: digests are an NVMe/TCP feature; NVMe/RDMA has none".into());
    }
    let secret = |flag: &str, s: &Option<String>| {
        s.as_deref()
            .map(|s| Secret::parse(s).map_err(|e| format!("{flag}: {e}")))
            .transpose()
    };
    let dhchap = match (
        secret("--dhchap-secret", &t.dhchap_secret)?,
        secret("--dhchap-ctrl-secret", &t.dhchap_ctrl_secret)?,
    ) {
        (Some(h), c) => Some(HostSecrets::new(h, c)),
        (None, Some(_)) => {
            return Err(
                "--dhchap-ctrl-secret needs --dhchap-secret (the host authenticates first)".into(),
            )
        }
        (None, None) => None,
    };
    Ok(Params {
        transport,
        addr,
        subnqn: subnqn.into(),
        hostnqn: t.hostnqn.clone().unwrap_or_else(hostid::default_hostnqn),
        hostid,
        digests: Digests {
            header: t.hdr_digest,
            data: t.data_digest,
        },
        kato: Duration::from_secs(kato_s as u64),
        queue_size,
        io_queues,
        disable_sqflow: t.disable_sqflow,
        dhchap,
    })
}

/// The parameters of discovery controller `t`.
fn discovery_params(t: &Target) -> Result<Params, String> {
    params(t, "", 0, 32, 1)
}

fn connect_all(a: &ConnectAllArgs) -> Result<ExitCode, String> {
    let base = Target {
        transport: a.transport.clone(),
        traddr: a.traddr.clone().unwrap_or_default(),
        trsvcid: a.trsvcid,
        hostnqn: a.hostnqn.clone(),
        hostid: a.hostid.clone(),
        hdr_digest: false,
        data_digest: false,
        disable_sqflow: false,
        dhchap_secret: None,
        dhchap_ctrl_secret: None,
    };
    let controllers = match &a.traddr {
        Some(_) => vec![base],
        None => connect_all::read_conf(&a.discovery_conf, &base)?,
    };
    let found = connect_all::subsystems(&controllers)?;
    let frontend = match &a.nbd_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            connect_all::Frontend::NbdDir(dir.clone())
        }
        None => connect_all::Frontend::Ublk(a.ublk_id_base),
    };
    let common = connect_all::Common {
        hostnqn: a.hostnqn.as_deref(),
        hostid: a.hostid.as_deref(),
        extra: vec![
            "-i".into(),
            a.nr_io_queues.to_string(),
            "-l".into(),
            a.ctrl_loss_tmo.to_string(),
        ],
    };
    for (nqn, paths) in &found {
        println!("{nqn}: {}", paths.join(" "));
    }
    connect_all::run(&found, &frontend, &common)
}

fn list(l: &ListArgs) -> Result<ExitCode, String> {
    let all = state::list(&state::run_dir());
    if l.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", state::render(&all));
    }
    Ok(ExitCode::SUCCESS)
}

fn discover(t: &Target) -> Result<ExitCode, String> {
    let p = discovery_params(t)?;
    let entries = Session::discover(&p).map_err(|e| e.to_string())?;
    println!(
        "\nDiscovery Log Number of Records {}, Generation counter 1",
        entries.len()
    );
    for (i, e) in entries.iter().enumerate() {
        print_entry(i, e);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_entry(i: usize, e: &DiscoveryEntry) {
    let trtype = Transport::from_trtype(e.trtype).map_or("unrecognized", Transport::name);
    let adrfam = match e.adrfam {
        adrfam::IPV4 => "ipv4",
        adrfam::IPV6 => "ipv6",
        _ => "unrecognized",
    };
    let subtype = match e.subtype {
        subtype::NVME => "nvme subsystem",
        subtype::REFERRAL => "discovery subsystem referral",
        subtype::CURRENT_DISCOVERY => "current discovery subsystem",
        _ => "unrecognized",
    };
    let treq = match e.treq & 3 {
        1 => "required",
        2 => "not required",
        _ => "not specified",
    };
    println!("=====Discovery Log Entry {i}======");
    println!("trtype:  {trtype}");
    println!("adrfam:  {adrfam}");
    println!("subtype: {subtype}");
    let sqflow = if e.treq & treq::SQ_FLOW_CONTROL_DISABLE != 0 {
        ", sq flow control disable supported"
    } else {
        ""
    };
    println!("treq:    {treq}{sqflow}");
    let flags: Vec<&str> = [
        (eflags::EPCSD, "explicit discovery connections"),
        (eflags::DUPRETINFO, "duplicate discovery information"),
    ]
    .iter()
    .filter(|(bit, _)| e.eflags & bit != 0)
    .map(|(_, name)| *name)
    .collect();
    if !flags.is_empty() {
        println!("eflags:  {}", flags.join(", "));
    }
    println!("portid:  {}", e.portid);
    println!("trsvcid: {}", e.trsvcid);
    println!("subnqn:  {}", e.subnqn);
    println!("traddr:  {}", e.traddr);
}

/// Connects every path (the first from -t/-a/-s, then each --path) and
/// picks the namespace to use.
fn open(s: &Subsys, io_queues: u16) -> Result<Attachment, HostError> {
    let first = match &s.nqn {
        Some(nqn) => params(&s.target, nqn, s.keep_alive_tmo, s.queue_size, io_queues)
            .map_err(HostError::Protocol)?,
        None => discovered(s, io_queues)?,
    };
    if s.paths.len() >= MAX_PATHS {
        return Err(HostError::Protocol(format!(
            "{} --path options: use at most {} (each is an association)",
            s.paths.len(),
            MAX_PATHS - 1
        )));
    }
    let mut paths = vec![first.clone()];
    for url in &s.paths {
        paths.push(path_params(&first, url).map_err(HostError::Protocol)?);
    }
    Attachment::open(&paths, s.nsid)
}

/// The parameters of another path to `first`'s subsystem: `url` is
/// TRANSPORT://ADDR:PORT.
fn path_params(first: &Params, url: &str) -> Result<Params, String> {
    let bad = |why: String| format!("--path {url}: {why}; use tcp://ADDR:PORT or rdma://ADDR:PORT");
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("no transport".into()))?;
    let transport: Transport = scheme.parse().map_err(|e| bad(format!("{e}")))?;
    let addr = rest
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("no address".into()))?;
    if transport == Transport::Rdma && (first.digests.header || first.digests.data) {
        return Err(bad(
            "digests (-g/-G) are an NVMe/TCP feature; NVMe/RDMA has none".into(),
        ));
    }
    if first.addr == addr && first.transport == transport {
        return Err(bad("it is the first path again".into()));
    }
    Ok(Params {
        transport,
        addr,
        ..first.clone()
    })
}

/// The parameters of the one NVMe subsystem the discovery log at the
/// target lists on this transport: its entry's address, and SQ flow control
/// disabled when the entry says the controller allows it (TREQ bit 2).
fn discovered(s: &Subsys, io_queues: u16) -> Result<Params, HostError> {
    let mut p = params(&s.target, "", s.keep_alive_tmo, s.queue_size, io_queues)
        .map_err(HostError::Protocol)?;
    let want = p.transport.trtype();
    let entries: Vec<DiscoveryEntry> = Session::discover(&p)?
        .into_iter()
        .filter(|e| e.subtype == subtype::NVME && e.trtype == want)
        .collect();
    let mut nqns: Vec<&str> = entries.iter().map(|e| e.subnqn.as_str()).collect();
    nqns.sort_unstable();
    nqns.dedup();
    let e = match nqns.as_slice() {
        [_] => &entries[0],
        [] => {
            return Err(HostError::Protocol(format!(
                "the discovery log at {} lists no NVMe subsystem over {}: nothing to connect",
                p.addr, s.target.transport
            )))
        }
        many => {
            return Err(HostError::Protocol(format!(
                "the discovery log at {} lists {} subsystems; choose one with -n: {}",
                p.addr,
                many.len(),
                many.join(", ")
            )))
        }
    };
    let bad = |what: &str| {
        HostError::Protocol(format!(
            "the discovery log entry of {} has an unusable {what}: traddr {:?}, trsvcid {:?}",
            e.subnqn, e.traddr, e.trsvcid
        ))
    };
    let ip: std::net::IpAddr = e.traddr.trim().parse().map_err(|_| bad("address"))?;
    let port: u16 = e.trsvcid.trim().parse().map_err(|_| bad("port"))?;
    // An entry naming a wildcard address: the address we reached.
    p.addr = if ip.is_unspecified() {
        SocketAddr::new(p.addr.ip(), port)
    } else {
        SocketAddr::new(ip, port)
    };
    p.subnqn = e.subnqn.clone();
    p.disable_sqflow |= e.treq & treq::SQ_FLOW_CONTROL_DISABLE != 0;
    tracing::info!(
        subnqn = %p.subnqn,
        addr = %p.addr,
        disable_sqflow = p.disable_sqflow,
        "using the subsystem the discovery log lists"
    );
    Ok(p)
}

fn connect(c: &ConnectArgs) -> Result<ExitCode, String> {
    if c.nr_io_queues == 0 {
        return Err("-i 0: use at least one I/O queue".into());
    }
    // Signals are taken by the main thread; every thread inherits the mask.
    stop_set()
        .thread_block()
        .map_err(|e| format!("blocking signals: {e}"))?;
    if c.ublk {
        // Before connecting: a missing driver is the user's first problem.
        ublk::check_available()?;
        if c.queue_depth == 0 {
            return Err("--queue-depth 0: use at least 1".into());
        }
    }
    let poll = c.poll.mode()?;
    let att = open(&c.subsys, c.nr_io_queues).map_err(|e| e.to_string())?;
    let ctrl_loss_tmo = Duration::from_secs(c.ctrl_loss_tmo);
    match &c.nbd {
        Some(listen) => nbd::serve(
            att,
            listen,
            c.nr_io_queues,
            ctrl_loss_tmo,
            c.nbd_max_clients,
            poll,
        )?,
        None => ublk::serve(
            att,
            ublk::UblkOptions {
                id: c.ublk_id,
                queues: c.nr_io_queues,
                depth: c.queue_depth,
                ctrl_loss_tmo,
                poll,
            },
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

fn run_bench(b: &BenchArgs) -> Result<ExitCode, String> {
    let bs = units::parse_size(&b.bs).map_err(|e| format!("--bs: {e}"))? as usize;
    let runtime = units::parse_duration(&b.runtime).map_err(|e| format!("--runtime: {e}"))?;
    let poll = b.poll.mode()?;
    if b.qd == 0 || b.qd > 4096 {
        return Err(format!("--qd {}: use 1 to 4096", b.qd));
    }
    if b.queues == 0 {
        return Err("--queues 0: use at least 1".into());
    }
    let att = open(&b.subsys, b.queues).map_err(|e| e.to_string())?;
    let ns = att.ns;
    let block = ns.block_size as usize;
    if bs == 0 || !bs.is_multiple_of(block) || bs > rdmablk_common::mem::MAX_BUF {
        return Err(format!(
            "--bs {}: use a multiple of the namespace's {block}-byte blocks, at most {}",
            b.bs,
            units::format_size(rdmablk_common::mem::MAX_BUF as u64)
        ));
    }
    if b.verify && ns.read_only {
        return Err("--verify writes, but the namespace is read-only".into());
    }
    let queues = att.io_queues().min(b.queues) as u64;
    let units_total = ns.size_bytes() / bs as u64;
    if units_total < queues {
        return Err(format!(
            "the namespace ({} bytes) is smaller than {queues} I/Os of --bs",
            ns.size_bytes()
        ));
    }
    let per_queue = units_total / queues;
    let run_id = (std::process::id() as u64) << 32
        ^ Instant::now().elapsed().as_nanos() as u64
        ^ now_nanos();
    let progress = Arc::new(Progress::default());
    spawn_signal_watch(progress.clone());
    let cpu_before = rdmablk_common::usage::process_cpu();
    let qd = b.qd.min(att.queue_size() as usize - 1).max(1);
    let max_transfer = att.max_transfer();
    let keeper = Keeper::new(att, Duration::from_secs(b.ctrl_loss_tmo));
    let spec = EngineSpec {
        queues: queues as u16,
        arena_bytes: (qd * bs.next_power_of_two().max(4096) + (8 << 20)).next_multiple_of(4 << 20),
        name: "bench",
        poll,
    };
    let engines = Engines::spawn(&keeper, spec, |q, _| {
        let q = q as u64;
        let job = Job {
            pattern: b.rw,
            bs,
            qd,
            runtime,
            verify: b.verify,
            ns,
            first_unit: q * per_queue,
            units: per_queue,
            max_transfer,
            run_id,
        };
        Ok(Bench::new(
            job,
            progress.clone(),
            run_id ^ (q + 1).wrapping_mul(0x9e37_79b9),
        ))
    })?;
    let done = std::sync::atomic::AtomicBool::new(false);
    let watched = std::thread::scope(|s| {
        s.spawn(|| print_progress(&progress, &done));
        let w = keeper.watch(&engines, Until::EnginesDone);
        done.store(true, Ordering::Release);
        w
    });
    if let Err(e) = &watched.result {
        // No path for ctrl-loss-tmo: the drivers end with what ran.
        progress.stop.store(true, Ordering::Relaxed);
        engines.wake_all();
        eprintln!("rdmablk: {e}");
    }
    let (failure, benches) = engines.join();
    let mut total = Stats::default();
    for bench in benches {
        total.merge(&bench.stats);
        for p in bench.problems {
            eprintln!("rdmablk: {p}");
        }
    }
    total.cpu = rdmablk_common::usage::process_cpu().saturating_sub(cpu_before);
    for s in watched.sessions {
        if let Err(e) = s.shutdown() {
            tracing::warn!("controller shutdown: {e}");
        }
    }
    if b.subsys.target.data_digest || b.subsys.target.hdr_digest {
        tracing::debug!("digests were on");
    }
    if b.json {
        println!("{}", bench::to_json(&total));
    } else {
        print!("{}", bench::to_text(&total));
    }
    if let Some(e) = failure.or(watched.result.err()) {
        eprintln!("rdmablk: I/O queue failed: {e}");
        return Ok(ExitCode::FAILURE);
    }
    let errors = total.read.errors + total.write.errors;
    if errors > 0 || total.verify_errors > 0 {
        eprintln!(
            "rdmablk: {errors} I/O errors, {} verify mismatches",
            total.verify_errors
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints IOPS, bandwidth and errors every second until `done`.
fn print_progress(progress: &Progress, done: &std::sync::atomic::AtomicBool) {
    let start = Instant::now();
    let mut last = (0u64, 0u64);
    let mut shown = 0;
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        let secs = start.elapsed().as_secs();
        if secs == shown {
            continue;
        }
        shown = secs;
        let ios = progress.reads.load(Ordering::Relaxed) + progress.writes.load(Ordering::Relaxed);
        let bytes = progress.bytes.load(Ordering::Relaxed);
        eprint!(
            "\r[{:>4.0}s] {:>10.0} IOPS {:>9.1} MiB/s  errors {}   ",
            start.elapsed().as_secs_f64(),
            (ios - last.0) as f64,
            (bytes - last.1) as f64 / (1 << 20) as f64,
            progress.errors.load(Ordering::Relaxed)
        );
        last = (ios, bytes);
    }
    eprintln!();
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Ends the benchmark early on SIGINT/SIGTERM, reporting what ran.
fn spawn_signal_watch(progress: Arc<Progress>) {
    let set = stop_set();
    if set.thread_block().is_err() {
        return;
    }
    std::thread::spawn(move || {
        if set.wait().is_ok() {
            progress.stop.store(true, Ordering::Relaxed);
        }
    });
}
