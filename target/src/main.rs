//! rdmablk-target: an NVMe over Fabrics target that exports files, block
//! devices and memory as NVMe namespaces.

use clap::{CommandFactory, Parser};
use rdmablk_common::cli_docs::{self, ExtraPage};
use rdmablk_target::app::control;
use rdmablk_target::app::serve::{serve, Daemon};
use rdmablk_target::config::{self, AnaState, Config, ConfigError, QuickArgs};
use std::path::PathBuf;
use std::process::ExitCode;

/// NVMe over Fabrics target: serves files, block devices and memory as NVMe
/// namespaces over NVMe/TCP and NVMe/RDMA.
///
/// With no arguments it serves a 1 GiB memory namespace
/// (nqn.2026-11.io.rdmablk:default) on tcp://127.0.0.1:4420 to any host.
/// `--config` reads a TOML file (see config/target.toml); the quick form
/// `--listen URL --memory SIZE | --file PATH | --null SIZE | --rbd POOL/IMAGE` builds one
/// subsystem with one namespace that any host may use.
#[derive(Parser, Debug)]
#[command(name = "rdmablk-target", version = cli_docs::VERSION, after_help = EXAMPLES)]
struct Args {
    /// TOML configuration file.
    #[arg(short, long, value_name = "FILE", conflicts_with_all = ["listen", "memory", "file", "null", "rbd", "nqn", "block_size"])]
    config: Option<PathBuf>,
    /// Validate the configuration (or quick form) and exit.
    #[arg(long)]
    check: bool,
    /// Where to listen: tcp://ADDR:PORT or rdma://ADDR:PORT (may repeat).
    /// Default tcp://127.0.0.1:4420.
    #[arg(short, long, value_name = "URL")]
    listen: Vec<String>,
    /// Serve a memory namespace of this size (e.g. 1GiB).
    #[arg(long, value_name = "SIZE", group = "backend")]
    memory: Option<String>,
    /// Serve this file or block device.
    #[arg(long, value_name = "PATH", group = "backend")]
    file: Option<PathBuf>,
    /// Serve a null namespace of this size (discards writes, reads zeroes).
    #[arg(long, value_name = "SIZE", group = "backend")]
    null: Option<String>,
    /// Serve a Ceph RBD image: POOL/IMAGE or POOL/NAMESPACE/IMAGE. The
    /// namespace becomes active once the image is open.
    #[arg(long, value_name = "SPEC", group = "backend")]
    rbd: Option<String>,
    /// The Ceph cluster's configuration for --rbd (default /etc/ceph/ceph.conf).
    #[arg(long, value_name = "PATH", requires = "rbd")]
    ceph_conf: Option<PathBuf>,
    /// The Ceph client id for --rbd: connects as client.ID (default admin),
    /// with the keyring ceph.conf names for it.
    #[arg(long, value_name = "ID", requires = "rbd")]
    ceph_id: Option<String>,
    /// Subsystem NQN for the quick form.
    #[arg(short, long, value_name = "NQN")]
    nqn: Option<String>,
    /// Logical block size of the quick form's namespace: 512 or 4096.
    #[arg(long, value_name = "BYTES")]
    block_size: Option<u32>,
    /// Poller threads (default: one per core, or [pollers] count).
    #[arg(long, value_name = "N")]
    pollers: Option<usize>,
    /// Log level when RUST_LOG is not set: error, warn, info, debug, trace.
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    log_level: String,
    /// Write counters (connections, controllers, arena buffers in use per
    /// poller) as JSON to this file every second.
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// Answer `rdmablk-target reload` and `status` on this Unix socket
    /// (owner only; the systemd unit uses /run/rdmablk/control.sock).
    #[arg(long, value_name = "SOCKET")]
    control: Option<PathBuf>,
    #[command(subcommand)]
    action: Option<Action>,
}

/// Requests to a running daemon, through its control socket.
#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Make the running daemon re-read its configuration file and apply the
    /// difference: subsystems, namespaces (added, removed, grown,
    /// read-only), allowed hosts, listeners. Waits for the result; exits 1
    /// naming the key when the new configuration is refused (the daemon
    /// keeps the running one). SIGHUP does the same without the answer.
    Reload {
        /// The daemon's control socket.
        #[arg(long, value_name = "SOCKET", default_value = control::DEFAULT_PATH)]
        control: PathBuf,
    },
    /// Print what the running daemon serves: listeners with their ANA
    /// states, subsystems, namespaces with their current IOPS and bandwidth,
    /// connected hosts.
    Status {
        /// The daemon's control socket.
        #[arg(long, value_name = "SOCKET", default_value = control::DEFAULT_PATH)]
        control: PathBuf,
    },
    /// Asymmetric Namespace Access: the state each listener reports for
    /// each ANA group (a namespace's `ana_group`).
    #[command(subcommand)]
    Ana(AnaAction),
    /// QoS limits of a namespace's commands: for all its hosts together or
    /// for one host (the namespace's `qos` and `host_qos` in the file).
    #[command(subcommand)]
    Qos(QosAction),
    /// Write the man pages (rdmablk-target(8) and its subcommands',
    /// rdmablk-target.toml(5)) and the bash, zsh and fish completions into
    /// DIR: what the package installs.
    #[command(hide = true)]
    GenerateDocs {
        /// Where: man/, bash/, zsh/ and fish/ are made in it.
        dir: PathBuf,
    },
}

/// `rdmablk-target qos ...`.
#[derive(clap::Subcommand, Debug)]
enum QosAction {
    /// Set limits of namespace NSID of SUBSYSTEM, for all its hosts together
    /// or (--host) for one host. Each LIMIT is KEY=VALUE: iops, read_iops,
    /// write_iops (commands per second), bandwidth, read_bandwidth,
    /// write_bandwidth (bytes per second, e.g. 50MiB), or KEY=none to remove
    /// one; limits not named stay. Commands over a limit wait, in order
    /// (never an error). Holds until the next reload or restart, which apply
    /// the file.
    #[command(
        after_help = "Example:\n  rdmablk-target qos set nqn.2026-11.io.example:disks 1 read_iops=2000 write_bandwidth=50MiB\n  rdmablk-target qos set nqn.2026-11.io.example:disks 1 --host nqn.2014-08.org.nvmexpress:uuid:... iops=none"
    )]
    Set {
        /// The subsystem's NQN.
        subsystem: String,
        /// The namespace id.
        nsid: u32,
        /// KEY=VALUE, one or more.
        #[arg(required = true, value_name = "LIMIT")]
        limits: Vec<String>,
        /// Limits of this host's commands only.
        #[arg(long, value_name = "NQN")]
        host: Option<String>,
        /// The daemon's control socket.
        #[arg(long, value_name = "SOCKET", default_value = control::DEFAULT_PATH)]
        control: PathBuf,
    },
}

/// `rdmablk-target ana ...`.
#[derive(clap::Subcommand, Debug)]
enum AnaAction {
    /// Set the state of ANA group GROUP on one listener (--listener) or on
    /// all. Hosts connected through it get an ANA Change notice and read the
    /// new state; I/O on an inaccessible or persistent-loss group gets a path
    /// status that sends it to another path. The state holds until the next
    /// reload or restart, which apply the file's `ana_groups`. `change` is
    /// transitional: a group left in it for ANATT (10 s) becomes
    /// inaccessible by itself.
    Set {
        /// ANA group id, 1 to 128.
        group: u32,
        /// optimized, non-optimized, inaccessible, persistent-loss or change.
        state: AnaState,
        /// The listener: ADDR:PORT or tcp://ADDR:PORT, rdma://ADDR:PORT.
        #[arg(long, value_name = "ADDR")]
        listener: Option<String>,
        /// The daemon's control socket.
        #[arg(long, value_name = "SOCKET", default_value = control::DEFAULT_PATH)]
        control: PathBuf,
    },
}

const EXAMPLES: &str = "Examples:
  rdmablk-target
  rdmablk-target --listen tcp://0.0.0.0:4420 --memory 4GiB --nqn nqn.2026-11.io.example:ram
  rdmablk-target --listen tcp://10.0.0.1:4420 --file /dev/nvme0n1 --nqn nqn.2026-11.io.example:disk
  rdmablk-target --listen tcp://10.0.0.1:4420 --rbd rbd/disk1 --ceph-conf /etc/ceph/ceph.conf --ceph-id rdmablk
  rdmablk-target --config /etc/rdmablk/target.toml
  rdmablk-target --check --config /etc/rdmablk/target.toml
  rdmablk-target --config /etc/rdmablk/target.toml --control /run/rdmablk/control.sock
  rdmablk-target reload        # after editing the file: apply it, or say which key is refused
  rdmablk-target status
  rdmablk-target ana set 1 inaccessible --listener 10.0.0.1:4420   # move hosts off this gateway
  rdmablk-target qos set nqn.2026-11.io.example:disk 1 read_iops=2000 write_bandwidth=50MiB";

fn main() -> ExitCode {
    rdmablk_common::abort::abort_on_panic();
    let args = Args::parse();
    if let Some(Action::GenerateDocs { dir }) = &args.action {
        let page = ExtraPage {
            file: config::manual::PAGE_FILE.to_string(),
            roff: config::manual::page(),
        };
        return match cli_docs::write_docs(Args::command(), dir, &["rdmablk(8)"], &[page]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rdmablk-target generate-docs: {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    if let Some(action) = &args.action {
        let (path, what) = match action {
            Action::Reload { control } => (control, "reload".to_string()),
            Action::Status { control } => (control, "status".to_string()),
            Action::Ana(AnaAction::Set {
                group,
                state,
                listener,
                control,
            }) => {
                let on = listener
                    .as_ref()
                    .map(|l| format!(" {l}"))
                    .unwrap_or_default();
                (control, format!("ana set {group} {state}{on}"))
            }
            Action::Qos(QosAction::Set {
                subsystem,
                nsid,
                limits,
                host,
                control,
            }) => {
                let host = host.as_deref().unwrap_or("-");
                let limits = limits.join(" ");
                (
                    control,
                    format!("qos set {subsystem} {nsid} {host} {limits}"),
                )
            }
            Action::GenerateDocs { .. } => unreachable!("handled above"),
        };
        return match control::request(path, &what) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("rdmablk-target {what}: {e}");
                ExitCode::from(2)
            }
        };
    }
    init_logging(&args.log_level);
    let cfg = match load_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rdmablk-target: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    for w in cfg.warnings() {
        if args.check {
            eprintln!("rdmablk-target: warning: {w}");
        } else {
            tracing::warn!("{w}");
        }
    }
    if args.check {
        let namespaces: usize = cfg.subsystems.iter().map(|s| s.namespaces.len()).sum();
        println!(
            "configuration OK: {} listener(s), {} subsystem(s), {namespaces} namespace(s)",
            cfg.listeners.len(),
            cfg.subsystems.len()
        );
        return ExitCode::SUCCESS;
    }
    let embedded = args.config.is_none() && args.listen.is_empty() && !has_quick_backend(&args);
    let daemon = Daemon {
        config_path: args.config.clone(),
        stats: args.stats.clone(),
        control: args.control.clone(),
    };
    let code = match serve(cfg, embedded, daemon) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("rdmablk-target: {e}");
            1
        }
    };
    // A namespace's thread may still be opening its RBD image (a stop or a
    // failed start does not wait for the cluster): librados must not be
    // torn down under it.
    rdmablk_target::backend::rbd::exit_now_if_loaded(code);
    ExitCode::from(code)
}

fn has_quick_backend(a: &Args) -> bool {
    a.memory.is_some() || a.file.is_some() || a.null.is_some() || a.rbd.is_some()
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn load_config(a: &Args) -> Result<Config, ConfigError> {
    let mut cfg = if let Some(path) = &a.config {
        config::load(path)?
    } else if a.listen.is_empty()
        && !has_quick_backend(a)
        && a.nqn.is_none()
        && a.block_size.is_none()
    {
        config::embedded_default()
    } else {
        let q = QuickArgs {
            listen: a.listen.clone(),
            memory: a.memory.clone(),
            file: a.file.clone(),
            null: a.null.clone(),
            rbd: a.rbd.clone(),
            ceph_conf: a.ceph_conf.clone(),
            ceph_id: a.ceph_id.clone(),
            nqn: a.nqn.clone(),
            block_size: a.block_size,
        };
        config::from_quick_args(&q)?
    };
    if let Some(n) = a.pollers {
        if !(1..=256).contains(&n) {
            return Err(ConfigError::Invalid {
                key: "--pollers".into(),
                problem: format!("{n}: use 1 to 256"),
            });
        }
        cfg.pollers.count = n;
    }
    cfg.check_machine()?;
    Ok(cfg)
}
