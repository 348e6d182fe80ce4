//! rdmablk-target: an NVMe over Fabrics target that exports files, block
//! devices and memory as NVMe namespaces.

mod admission;
mod auth;
mod backend;
mod binding;
mod budget;
mod command;
mod completions;
mod config;
mod control;
mod controller;
mod error;
mod fabric;
mod http;
mod ids;
mod io_cmd;
mod metrics;
mod notify;
mod offload;
mod poller;
mod port;
mod prometheus;
mod queue;
mod reload;
mod stats;
mod status;
mod subsystem;
#[cfg(test)]
mod testing;
mod transport;

use clap::Parser;
use config::{Config, ConfigError, QuickArgs};
use error::{starting, DaemonError};
use metrics::PollerCounters;
use nix::sys::signal::{SigSet, Signal};
use poller::{PollerLink, Shared, Transports};
use reload::Running;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use subsystem::Registry;

/// NVMe over Fabrics target: serves files, block devices and memory as NVMe
/// namespaces over NVMe/TCP and NVMe/RDMA.
///
/// With no arguments it serves a 1 GiB memory namespace
/// (nqn.2026-11.io.rdmablk:default) on tcp://127.0.0.1:4420 to any host.
/// `--config` reads a TOML file (see config/target.toml); the quick form
/// `--listen URL --memory SIZE | --file PATH | --null SIZE | --rbd POOL/IMAGE` builds one
/// subsystem with one namespace that any host may use.
#[derive(Parser, Debug)]
#[command(name = "rdmablk-target", version, after_help = EXAMPLES)]
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
    /// Print what the running daemon serves: listeners, subsystems,
    /// namespaces with their current IOPS and bandwidth, connected hosts.
    Status {
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
  rdmablk-target status";

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(action) = &args.action {
        let (path, what) = match action {
            Action::Reload { control } => (control, "reload"),
            Action::Status { control } => (control, "status"),
        };
        return match control::request(path, what) {
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
    match serve(cfg, embedded, daemon) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("rdmablk-target: {e}");
            ExitCode::FAILURE
        }
    }
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

/// What the daemon was asked for besides its configuration.
struct Daemon {
    /// The configuration file (a reload re-reads it).
    config_path: Option<PathBuf>,
    stats: Option<PathBuf>,
    control: Option<PathBuf>,
}

fn serve(cfg: Config, embedded: bool, daemon: Daemon) -> Result<(), DaemonError> {
    // Signals are taken synchronously by this thread; block them before any
    // other thread exists so that all inherit the mask.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGHUP);
    signals
        .thread_block()
        .map_err(|source| DaemonError::Signals {
            what: "blocking signals",
            source,
        })?;

    raise_open_files_limit();
    let ports = cfg.listeners.iter().map(transport::port).collect();
    let registry = Arc::new(Registry::open(&cfg, ports)?);
    registry.start_backends();
    let shared = Arc::new(Shared {
        registry: registry.clone(),
        stop: AtomicBool::new(false),
        connections: AtomicUsize::new(0),
        buffers_in_use: (0..cfg.pollers.count)
            .map(|_| AtomicUsize::new(0))
            .collect(),
        io_commands: (0..cfg.pollers.count).map(|_| AtomicU64::new(0)).collect(),
        pollers: (0..cfg.pollers.count)
            .map(|_| PollerCounters::default())
            .collect(),
    });
    let started = std::time::Instant::now();
    let transports = Transports {
        ring_ops: transport::ring_ops().collect(),
        endpoints: transport::endpoints,
    };
    let (links, threads): (Vec<PollerLink>, Vec<_>) = (0..cfg.pollers.count)
        .map(|i| {
            poller::spawn(
                i,
                shared.clone(),
                cfg.pollers.arena_bytes as usize,
                cfg.pollers.busy_poll,
                &transports,
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(starting("pollers"))?
        .into_iter()
        .unzip();
    let pollers = Arc::new(links);

    let mut listeners = Vec::new();
    for l in &cfg.listeners {
        listeners.push((*l, transport::start(l, &pollers, &registry)?));
        let any_host = cfg.subsystems.iter().any(|s| s.allow_any_host);
        if any_host && !l.address.ip().is_loopback() {
            tracing::warn!(
                "listening on {} with subsystems that admit any host; list allowed hosts in a config file",
                l.address
            );
        }
    }
    for s in registry.subsystems() {
        let access = s.access();
        tracing::info!(
            subsystem = %s.nqn,
            namespaces = s.namespaces().len(),
            allow_any_host = access.allow_any_host,
            hosts = access.hosts.len(),
            "subsystem ready"
        );
    }
    if embedded {
        let l = &cfg.listeners[0];
        println!(
            "serving the embedded default; connect with: rdmablk connect -t tcp -a {} -s {} -n {} --nbd unix:/tmp/rdmablk.sock",
            l.address.ip(),
            l.address.port(),
            cfg.subsystems[0].nqn
        );
    }
    if let Some(addr) = cfg.metrics {
        let listener = std::net::TcpListener::bind(addr).map_err(|source| DaemonError::Listen {
            url: format!("http://{addr}/metrics"),
            source,
            hint: "",
        })?;
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || http::serve(listener, || prometheus::render(&shared, started)))
            .map_err(starting("the metrics endpoint"))?;
        tracing::info!("metrics on http://{addr}/metrics");
    }
    let running = Arc::new(Mutex::new(Running {
        path: daemon.config_path,
        cfg: cfg.clone(),
        listeners,
        pollers: pollers.clone(),
        registry: registry.clone(),
    }));
    if let Some(path) = &daemon.control {
        let listener = control::bind(path).map_err(|source| DaemonError::Listen {
            url: format!("unix:{}", path.display()),
            source,
            hint: " (the control socket)",
        })?;
        let (running, shared) = (running.clone(), shared.clone());
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || control::serve(listener, running, shared, started))
            .map_err(starting("the control socket"))?;
        tracing::info!("control socket {}", path.display());
    }
    if let Some(path) = daemon.stats {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("stats".into())
            .spawn(move || stats::write_every_second(&path, &shared))
            .map_err(starting("the stats writer"))?;
    }
    notify::notify("READY=1");

    let sig = loop {
        let sig = signals.wait().map_err(|source| DaemonError::Signals {
            what: "waiting for signals",
            source,
        })?;
        if sig != Signal::SIGHUP {
            break sig;
        }
        notify::notify("RELOADING=1");
        match reload::reload(&mut running.lock().expect("running configuration")) {
            Ok(changes) => tracing::info!("SIGHUP: reloaded ({} change(s))", changes.len()),
            Err(e) => {
                tracing::warn!("SIGHUP: reload refused, the running configuration stays: {e}")
            }
        }
        notify::notify("READY=1");
    };
    notify::notify("STOPPING=1");
    tracing::info!(
        "{sig:?}: draining {} connection(s)",
        shared.connections.load(Ordering::Acquire)
    );
    shared.stop.store(true, Ordering::Release);
    for p in pollers.iter() {
        p.wake();
    }
    for t in threads {
        let _ = t.join();
    }
    let mut result = Ok(());
    for s in registry.subsystems() {
        for ns in s.namespaces().iter() {
            if let Err(source) = ns.backend.sync_all() {
                result = Err(DaemonError::Flush {
                    nqn: s.nqn.clone(),
                    nsid: ns.nsid,
                    source,
                });
            }
            // The pollers have ended: nothing is in flight.
            ns.backend.close();
        }
    }
    tracing::info!("stopped");
    result
}

/// Raises the soft limit of open files to the hard one: every connection is
/// a descriptor, and `limits.connections` should be what binds, not the
/// default soft limit of 1024.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!("cannot raise the open files limit from {soft} to {hard}: {e}");
            } else {
                tracing::debug!("open files limit raised from {soft} to {hard}");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read the open files limit: {e}"),
    }
}
