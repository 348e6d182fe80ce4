//! `rdmablk connect` and `rdmablk connect-all`.

use super::connect_all as all;
use super::params::open;
use crate::cli::{ConnectAllArgs, ConnectArgs, Target};
use rdmablk::frontend::{nbd, ublk};
use rdmablk::signals::stop_set;
use std::process::ExitCode;
use std::time::Duration;

/// Connects every subsystem the discovery controllers list, a process each.
pub(crate) fn connect_all(a: &ConnectAllArgs) -> Result<ExitCode, String> {
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
        tls: Default::default(),
    };
    let controllers = match &a.traddr {
        Some(_) => vec![base],
        None => all::read_conf(&a.discovery_conf, &base)?,
    };
    let found = all::subsystems(&controllers)?;
    let frontend = match &a.nbd_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            all::Frontend::NbdDir(dir.clone())
        }
        None => all::Frontend::Ublk(a.ublk_id_base),
    };
    let common = all::Common {
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
    all::run(&found, &frontend, &common)
}

/// Connects a namespace and serves it until SIGINT/SIGTERM.
pub(crate) fn connect(c: &ConnectArgs) -> Result<ExitCode, String> {
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
