//! From the command line's target flags to the host's connection
//! parameters: one path, more paths, or the subsystem discovery names.

use crate::cli::{Subsys, Target};
use rdmablk::host::{Attachment, HostError, Params, Session, Transport};
use rdmablk::hostid;
use rdmablk_common::auth::host::HostSecrets;
use rdmablk_common::auth::Secret;
use rdmablk_common::fabrics::discovery::{subtype, treq, DiscoveryEntry};
use rdmablk_common::tcp::Digests;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Why TLS and NVMe/RDMA do not go together.
const RDMA_TLS: &str = "--tls: TLS is an NVMe/TCP feature; NVMe/RDMA connections are not \
     encrypted (use -t tcp, or leave --tls and the key out)";

/// Paths one connection may have (each is an association of its own).
pub(crate) const MAX_PATHS: usize = 16;

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
    let tls = t.tls.resolve()?;
    if transport == Transport::Rdma && tls.is_some() {
        return Err(RDMA_TLS.into());
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
        tls,
    })
}

/// The parameters of discovery controller `t`.
pub(crate) fn discovery_params(t: &Target) -> Result<Params, String> {
    params(t, "", 0, 32, 1)
}

/// Connects every path (the first from -t/-a/-s, then each --path) and
/// picks the namespace to use.
pub(crate) fn open(s: &Subsys, io_queues: u16) -> Result<Attachment, HostError> {
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
    let att = Attachment::open(&paths, s.nsid)?;
    for session in &att.sessions {
        let p = session.params();
        let cipher = session.tls_cipher.as_deref();
        if let Some(cipher) = cipher {
            eprintln!(
                "rdmablk: path {}://{} is encrypted: TLS 1.3, {cipher}",
                p.transport.name(),
                p.addr
            );
        }
    }
    Ok(att)
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
    if transport == Transport::Rdma && first.tls.is_some() {
        return Err(format!("--path {url}: {RDMA_TLS}"));
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
