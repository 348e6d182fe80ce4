//! The command-line quick form (`--listen`, `--memory`, `--file`, `--null`,
//! `--rbd`, `--nqn`, `--block-size`): one subsystem with one namespace.

use super::error::{invalid, ConfigError};
use super::listener::{
    default_listener, find_duplicate_listener, listener_url, parse_socket_addr, parse_transport,
};
use super::model::{
    BackendConfig, Config, Limits, ListenerConfig, NamespaceConfig, Pollers, SubsystemConfig,
    DEFAULT_BLOCK_SIZE, DEFAULT_STATE_DIRECTORY, MAX_CNTLID,
};
use super::nqn::{check_subsystem_nqn, DEFAULT_NQN};
use super::rbd;
use super::validate::{block_size_problem, size_problem};
use rdmablk_common::units;
use std::path::PathBuf;

/// The command-line quick form: one subsystem with one namespace, open to
/// any host, e.g. `--listen tcp://127.0.0.1:4420 --memory 1GiB`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuickArgs {
    /// `--listen` URLs (`tcp://ADDR:PORT` or `rdma://ADDR:PORT`); default
    /// `tcp://127.0.0.1:4420` when empty.
    pub listen: Vec<String>,
    /// `--memory SIZE`: a RAM-backed namespace.
    pub memory: Option<String>,
    /// `--file PATH`: a file or block device namespace (must exist).
    pub file: Option<PathBuf>,
    /// `--null SIZE`: a namespace that discards writes and reads zeroes.
    pub null: Option<String>,
    /// `--rbd POOL/IMAGE`: a Ceph RBD image, with `--ceph-conf` and
    /// `--ceph-id`.
    pub rbd: Option<String>,
    pub ceph_conf: Option<PathBuf>,
    pub ceph_id: Option<String>,
    /// `--nqn NQN`: subsystem NQN; default [`DEFAULT_NQN`].
    pub nqn: Option<String>,
    /// `--block-size N`: LBA size, 512 or 4096; default 512.
    pub block_size: Option<u32>,
}

/// Builds a configuration from the command-line quick form.
///
/// Exactly one of `memory`, `file` and `null` must be set. The result has
/// one subsystem (`nqn`, default [`DEFAULT_NQN`]) open to any host, with one
/// namespace, nsid 1. Errors name the offending flag as their key.
pub fn from_quick_args(q: &QuickArgs) -> Result<Config, ConfigError> {
    let listeners = if q.listen.is_empty() {
        vec![default_listener()]
    } else {
        q.listen
            .iter()
            .map(|url| parse_listen_url(url))
            .collect::<Result<Vec<_>, _>>()?
    };
    if let Some((first, dup)) = find_duplicate_listener(&listeners) {
        return Err(invalid(
            "--listen",
            format!(
                "{} is given twice (values {} and {}); remove one",
                listener_url(&listeners[dup]),
                first + 1,
                dup + 1
            ),
        ));
    }

    let block_size = q.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    if let Some(problem) = block_size_problem(block_size) {
        return Err(invalid("--block-size", problem));
    }

    const BACKEND_FLAGS: &str = "--memory/--file/--null/--rbd";
    let backend = match (&q.memory, &q.file, &q.null, &q.rbd) {
        (None, None, None, Some(spec)) => BackendConfig::Rbd(rbd::from_quick_args(
            spec,
            q.ceph_conf.as_ref(),
            q.ceph_id.as_deref(),
        )?),
        (Some(size), None, None, None) => BackendConfig::Memory {
            size: quick_size("--memory", size, block_size)?,
        },
        (None, Some(path), None, None) => {
            if path.as_os_str().is_empty() {
                return Err(invalid(
                    "--file",
                    "empty path; give a file or block device, e.g. --file /dev/nvme0n1",
                ));
            }
            BackendConfig::File {
                path: path.clone(),
                create_size: None,
            }
        }
        (None, None, Some(size), None) => BackendConfig::Null {
            size: quick_size("--null", size, block_size)?,
        },
        (None, None, None, None) => {
            return Err(invalid(
                BACKEND_FLAGS,
                "no backend given; pass exactly one of --memory SIZE, --file PATH, \
                 --null SIZE or --rbd POOL/IMAGE, e.g. --memory 1GiB",
            ))
        }
        _ => {
            let given: Vec<&str> = [
                ("--memory", q.memory.is_some()),
                ("--file", q.file.is_some()),
                ("--null", q.null.is_some()),
                ("--rbd", q.rbd.is_some()),
            ]
            .into_iter()
            .filter_map(|(flag, set)| set.then_some(flag))
            .collect();
            return Err(invalid(
                BACKEND_FLAGS,
                format!(
                    "{} were given together; pass exactly one of them",
                    given.join(" and ")
                ),
            ));
        }
    };

    let nqn = q.nqn.clone().unwrap_or_else(|| DEFAULT_NQN.to_owned());
    check_subsystem_nqn("--nqn", &nqn)?;

    let config = Config {
        pollers: Pollers::default(),
        listeners,
        subsystems: vec![SubsystemConfig {
            nqn,
            allow_any_host: true,
            hosts: Vec::new(),
            auth: Vec::new(),
            tls_keys: Vec::new(),
            namespaces: vec![NamespaceConfig::new(1, backend, block_size)],
            cntlids: 1..=MAX_CNTLID,
        }],
        limits: Limits::default(),
        metrics: None,
        state_directory: DEFAULT_STATE_DIRECTORY.into(),
        gateway_group: None,
    };
    config.validate()?;
    Ok(config)
}

/// Parses a `--listen` URL: `tcp://ADDR:PORT` or `rdma://ADDR:PORT`, with
/// IPv6 addresses in brackets (`rdma://[fe80::1]:4420`). Host names are not
/// resolved. Errors use `--listen` as their key.
pub fn parse_listen_url(s: &str) -> Result<ListenerConfig, ConfigError> {
    const KEY: &str = "--listen";
    const SYNTAX: &str = "use tcp://ADDR:PORT or rdma://ADDR:PORT, \
                          e.g. tcp://127.0.0.1:4420 or rdma://[fe80::1]:4420";
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(invalid(KEY, format!("{s:?} is not a listen URL; {SYNTAX}")));
    };
    let Some(transport) = parse_transport(scheme) else {
        return Err(invalid(
            KEY,
            format!("unknown transport {scheme:?} in {s:?}; {SYNTAX}"),
        ));
    };
    let address = parse_socket_addr(rest).map_err(|p| invalid(KEY, format!("in {s:?}: {p}")))?;
    Ok(ListenerConfig::new(transport, address))
}

/// A `--memory` or `--null` size: units parsed, a multiple of the block size.
fn quick_size(flag: &str, text: &str, block_size: u32) -> Result<u64, ConfigError> {
    let size = units::parse_size(text).map_err(|e| invalid(flag, e.to_string()))?;
    match size_problem(size, block_size) {
        Some(problem) => Err(invalid(flag, problem)),
        None => Ok(size),
    }
}
