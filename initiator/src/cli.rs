//! The command line: subcommands and their flags (clap definitions); what
//! runs them is in `run`.

use clap::{Args, Parser, Subcommand};
use rdmablk::bench::Pattern;
use rdmablk::frontend::nbd::Listen;
use rdmablk::tls_cli::{GenTlsKeyArgs, TlsArgs};
use rdmablk_common::spin::{PollMode, SpinBounds};
use rdmablk_common::units;
use std::path::PathBuf;

/// Where nvme-cli keeps its discovery controllers.
pub(crate) const DISCOVERY_CONF: &str = "/etc/nvme/discovery.conf";

/// NVMe over Fabrics host: discover subsystems, connect a namespace as a
/// local disk (NBD), or benchmark it. Flags follow nvme-cli.
#[derive(Parser)]
#[command(name = "rdmablk", version = rdmablk_common::cli_docs::VERSION)]
pub(crate) struct Cli {
    /// Log level when RUST_LOG is not set: error, warn, info, debug, trace.
    #[arg(long, global = true, value_name = "LEVEL", default_value = "warn")]
    pub(crate) log_level: String,
    #[command(subcommand)]
    pub(crate) cmd: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
    /// Print a new NVMe/TCP TLS pre-shared key (configured PSK) in the
    /// interchange format, NVMeTLSkey-1:01:<base64>:, alone on stdout (as
    /// `nvme gen-tls-key` prints it). Give it to the host (--tls-key-file)
    /// and to the target, which holds it for this host's NQN. With
    /// --subnqn, stderr also shows the identity the host will offer.
    #[command(after_help = "Examples:
  (umask 077; rdmablk gen-tls-key > host.key)     # a file only its owner may read
  rdmablk gen-tls-key --hmac 2 --subnqn nqn.2024-01.io.example:disk0
  rdmablk connect -t tcp -a 10.0.0.1 -n NQN --tls-key-file host.key --nbd unix:/run/disk0.sock")]
    GenTlsKey(GenTlsKeyArgs),
    /// Write the man pages (rdmablk(8) and one per subcommand) and the bash,
    /// zsh and fish completions into DIR: what the package installs.
    #[command(hide = true)]
    GenerateDocs {
        /// Where: man/, bash/, zsh/ and fish/ are made in it.
        dir: PathBuf,
    },
}

#[derive(Args)]
pub(crate) struct ConnectAllArgs {
    /// The discovery controller's transport: tcp or rdma.
    #[arg(short = 't', long = "transport", default_value = "tcp")]
    pub(crate) transport: String,
    /// The discovery controller's address; without it, every controller
    /// listed in --discovery-conf (nvme-cli's format) is asked.
    #[arg(short = 'a', long = "traddr")]
    pub(crate) traddr: Option<String>,
    /// The discovery controller's port.
    #[arg(short = 's', long = "trsvcid", default_value_t = 4420)]
    pub(crate) trsvcid: u16,
    /// Discovery controllers, one per line (-t, -a, -s, -q, -I), when -a is not given.
    #[arg(long = "discovery-conf", value_name = "FILE", default_value = DISCOVERY_CONF)]
    pub(crate) discovery_conf: PathBuf,
    /// Host NQN (default: /etc/nvme/hostnqn, else derived from /etc/machine-id).
    #[arg(short = 'q', long = "hostnqn")]
    pub(crate) hostnqn: Option<String>,
    /// Host identifier, a UUID (default: /etc/nvme/hostid, else derived).
    #[arg(short = 'I', long = "hostid")]
    pub(crate) hostid: Option<String>,
    /// Serve each subsystem as an NBD export, its socket in DIR (the NQN,
    /// with characters other than letters, digits, - . _ made _, then .sock).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "ublk",
        conflicts_with = "ublk"
    )]
    pub(crate) nbd_dir: Option<PathBuf>,
    /// Serve each subsystem as a ublk device, ids from --ublk-id-base up in
    /// NQN order.
    #[arg(long)]
    pub(crate) ublk: bool,
    /// The ublk device id of the first subsystem (with --ublk).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "ublk")]
    pub(crate) ublk_id_base: u32,
    /// I/O queues of each connection.
    #[arg(short = 'i', long = "nr-io-queues", default_value_t = 1)]
    pub(crate) nr_io_queues: u16,
    /// Seconds without a usable path before a connection gives up.
    #[arg(short = 'l', long = "ctrl-loss-tmo", default_value_t = 600)]
    pub(crate) ctrl_loss_tmo: u64,
}

#[derive(Args)]
pub(crate) struct ListArgs {
    /// Print the connections as a JSON array.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Where the target is and who we are.
#[derive(Args, Clone)]
pub(crate) struct Target {
    /// Transport: tcp (NVMe/TCP) or rdma (NVMe/RDMA: RoCE, InfiniBand).
    #[arg(short = 't', long = "transport", default_value = "tcp")]
    pub(crate) transport: String,
    /// Target address (IP or host name).
    #[arg(short = 'a', long = "traddr")]
    pub(crate) traddr: String,
    /// Target port.
    #[arg(short = 's', long = "trsvcid", default_value_t = 4420)]
    pub(crate) trsvcid: u16,
    /// Host NQN (default: /etc/nvme/hostnqn, else derived from /etc/machine-id).
    #[arg(short = 'q', long = "hostnqn")]
    pub(crate) hostnqn: Option<String>,
    /// Host identifier, a UUID (default: /etc/nvme/hostid, else derived from /etc/machine-id).
    #[arg(short = 'I', long = "hostid")]
    pub(crate) hostid: Option<String>,
    /// Header digests (CRC32C).
    #[arg(short = 'g', long = "hdr-digest")]
    pub(crate) hdr_digest: bool,
    /// Data digests (CRC32C).
    #[arg(short = 'G', long = "data-digest")]
    pub(crate) data_digest: bool,
    /// Ask the target to disable SQ flow control (as nvme-cli's option):
    /// it then reports no SQ head, and an NVMe/TCP target may end a read
    /// with its last data PDU instead of a response. A target that refuses
    /// (Invalid Field) is connected again without it.
    #[arg(long = "disable-sqflow")]
    pub(crate) disable_sqflow: bool,
    /// DH-HMAC-CHAP host secret, as `nvme gen-dhchap-key` prints it
    /// (DHHC-1:XX:...:), for targets that require authentication. Every
    /// queue authenticates; the secret is not logged.
    #[arg(short = 'S', long = "dhchap-secret", value_name = "DHHC-1:...")]
    pub(crate) dhchap_secret: Option<String>,
    /// The controller's DH-HMAC-CHAP secret: authenticate the target too
    /// (bidirectional); a target that fails is refused.
    #[arg(short = 'C', long = "dhchap-ctrl-secret", value_name = "DHHC-1:...")]
    pub(crate) dhchap_ctrl_secret: Option<String>,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
}

/// A subsystem to use.
#[derive(Args, Clone)]
pub(crate) struct Subsys {
    #[command(flatten)]
    pub(crate) target: Target,
    /// Subsystem NQN. Without it, the discovery log at the address must
    /// list exactly one NVMe subsystem on this transport: that one is used,
    /// at the address its entry gives, with SQ flow control disabled when
    /// the entry allows it (TREQ), as `nvme connect-all` does.
    #[arg(short = 'n', long = "nqn")]
    pub(crate) nqn: Option<String>,
    /// Namespace id (default: the first active namespace).
    #[arg(long)]
    pub(crate) nsid: Option<u32>,
    /// I/O queue entries.
    #[arg(short = 'Q', long = "queue-size", default_value_t = 128)]
    pub(crate) queue_size: u16,
    /// Keep-alive timeout in seconds (0 disables keep-alive).
    #[arg(short = 'k', long = "keep-alive-tmo", default_value_t = 5)]
    pub(crate) keep_alive_tmo: u32,
    /// One more path to the same subsystem (multipath), e.g. another gateway
    /// or the same target over another transport: tcp://ADDR:PORT or
    /// rdma://ADDR:PORT (repeatable; -t/-a/-s give the first path). The
    /// namespace must report the same identifiers on every path. I/O goes
    /// to the ANA-optimized paths (the one with the fewest commands
    /// outstanding), to non-optimized ones only when no optimized path is
    /// live, and moves to another path, without an error, when a path dies
    /// or its state changes.
    #[arg(long = "path", value_name = "TRANSPORT://ADDR:PORT")]
    pub(crate) paths: Vec<String>,
}

#[derive(Args)]
pub(crate) struct ConnectArgs {
    #[command(flatten)]
    pub(crate) subsys: Subsys,
    /// Serve the namespace as an NBD export: unix:PATH or tcp:HOST:PORT.
    #[arg(
        long,
        value_name = "unix:PATH|tcp:HOST:PORT",
        required_unless_present = "ublk",
        conflicts_with = "ublk"
    )]
    pub(crate) nbd: Option<Listen>,
    /// NBD clients served at most (handshakes that began included); beyond,
    /// a client is told the export is full (NBD_REP_ERR_POLICY). Four times
    /// as many handshakes (at least 1024) run at once; a client silent
    /// since it connected makes room for a new one.
    #[arg(long, value_name = "N", default_value_t = 256, requires = "nbd")]
    pub(crate) nbd_max_clients: usize,
    /// Serve the namespace as a ublk block device, /dev/ublkbN (Linux 6.0+,
    /// modprobe ublk_drv).
    #[arg(long)]
    pub(crate) ublk: bool,
    /// ublk device id N (/dev/ublkbN); a device left by a crashed rdmablk
    /// with this id is recovered. Default: the kernel picks a free id.
    #[arg(long, value_name = "N", requires = "ublk")]
    pub(crate) ublk_id: Option<u32>,
    /// Requests in flight per ublk queue.
    #[arg(long, value_name = "N", default_value_t = 64, requires = "ublk")]
    pub(crate) queue_depth: u16,
    #[command(flatten)]
    pub(crate) poll: PollArgs,
    /// I/O queues (one thread each; one ublk queue each); NBD clients are
    /// spread over them.
    #[arg(
        short = 'i',
        long = "nr-io-queues",
        visible_alias = "queues",
        default_value_t = 1
    )]
    pub(crate) nr_io_queues: u16,
    /// Seconds to keep re-establishing a lost association (I/O waits
    /// meanwhile) before failing it and exiting.
    #[arg(short = 'l', long = "ctrl-loss-tmo", default_value_t = 600)]
    pub(crate) ctrl_loss_tmo: u64,
}

/// How each I/O queue's thread waits for completions.
#[derive(Args)]
pub(crate) struct PollArgs {
    /// Spin on each queue's io_uring (and NVMe/RDMA completion queue) and
    /// never sleep: the lowest latency, one core kept fully busy whatever
    /// the load (as SPDK's perf does); pin it with taskset.
    #[arg(long)]
    pub(crate) busy_poll: bool,
    /// Adaptive polling (the default): after its last completion a queue's
    /// thread keeps polling for a window, then sleeps; the window starts
    /// here and shrinks back here when sleeps are long.
    #[arg(long, value_name = "DURATION", default_value = "5us")]
    pub(crate) spin_min: String,
    /// The longest the window grows to (while completions keep arriving
    /// just after the thread went to sleep). 0: sleep as soon as idle.
    #[arg(long, value_name = "DURATION", default_value = "100us")]
    pub(crate) spin_max: String,
}

impl PollArgs {
    pub(crate) fn mode(&self) -> Result<PollMode, String> {
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
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) subsys: Subsys,
    /// Access pattern: randread, randwrite, read, write, randrw.
    #[arg(long, default_value = "randread")]
    pub(crate) rw: Pattern,
    /// Bytes per I/O (e.g. 4k, 128k, 1m); larger than the target's MDTS is split.
    #[arg(long, default_value = "4k")]
    pub(crate) bs: String,
    /// I/Os in flight per queue.
    #[arg(long, default_value_t = 32)]
    pub(crate) qd: usize,
    /// How long to run (e.g. 10s, 500ms, 2m).
    #[arg(long, default_value = "10s")]
    pub(crate) runtime: String,
    /// I/O queues (one thread each).
    #[arg(long, default_value_t = 1)]
    pub(crate) queues: u16,
    /// Write self-checking blocks (LBA, run id, CRC32C) and check every block read back.
    #[arg(long)]
    pub(crate) verify: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) poll: PollArgs,
    /// Seconds without a usable path (all lost or none ANA-usable) before
    /// the run fails; meanwhile lost paths are reconnected and I/O waits.
    #[arg(short = 'l', long = "ctrl-loss-tmo", default_value_t = 10)]
    pub(crate) ctrl_loss_tmo: u64,
}
