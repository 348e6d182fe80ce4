//! Listen addresses: transports by name, `IP:PORT` parsing with its typed
//! problems, and listeners given twice.

use super::model::{ListenerConfig, Transport};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// IANA-registered NVMe-oF port.
const DEFAULT_PORT: u16 = 4420;

/// NVMe/TCP on `127.0.0.1:4420`: the listener when none is given.
pub(super) fn default_listener() -> ListenerConfig {
    ListenerConfig::new(
        Transport::Tcp,
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT),
    )
}

/// `tcp` or `rdma`, in any case.
pub(super) fn parse_transport(s: &str) -> Option<Transport> {
    Transport::ALL
        .into_iter()
        .find(|t| s.eq_ignore_ascii_case(t.name()))
}

/// Why [`parse_socket_addr`] (or [`port_problem`]) rejected an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum AddressError {
    /// The port is 0.
    #[error(
        "port 0 is not allowed; give a fixed port, usually {} (e.g. \"{suggestion}\")",
        DEFAULT_PORT
    )]
    PortZero {
        /// The same IP address with [`DEFAULT_PORT`].
        suggestion: SocketAddr,
    },
    /// An IP address without a port.
    #[error("{input:?} has no port; add one, e.g. \"{suggestion}\"")]
    NoPort {
        /// The text as given.
        input: String,
        /// The address with [`DEFAULT_PORT`].
        suggestion: SocketAddr,
    },
    /// Not an IP address (host names are not resolved), with or without a port.
    #[error(
        "{input:?} is not an IP address and port; use e.g. \"0.0.0.0:{port}\", \
         or \"[::1]:{port}\" for IPv6 (host names are not resolved)",
        port = DEFAULT_PORT
    )]
    NotAnAddress {
        /// The text as given.
        input: String,
    },
}

/// Parses `IP:PORT` (IPv6 in brackets); on error, returns the problem.
pub(super) fn parse_socket_addr(s: &str) -> Result<SocketAddr, AddressError> {
    if let Ok(address) = s.parse::<SocketAddr>() {
        return match port_problem(&address) {
            Some(problem) => Err(problem),
            None => Ok(address),
        };
    }
    let unbracketed = s.trim_start_matches('[').trim_end_matches(']');
    Err(match unbracketed.parse::<IpAddr>() {
        Ok(ip) => AddressError::NoPort {
            input: s.into(),
            suggestion: SocketAddr::new(ip, DEFAULT_PORT),
        },
        Err(_) => AddressError::NotAnAddress { input: s.into() },
    })
}

/// The problem of port 0 (no fixed port to connect to), if the port is 0.
pub(super) fn port_problem(address: &SocketAddr) -> Option<AddressError> {
    (address.port() == 0).then(|| AddressError::PortZero {
        suggestion: SocketAddr::new(address.ip(), DEFAULT_PORT),
    })
}

/// Indices `(first, duplicate)` of the first repeated (transport, address).
pub(super) fn find_duplicate_listener(listeners: &[ListenerConfig]) -> Option<(usize, usize)> {
    let mut seen = HashMap::new();
    for (i, listener) in listeners.iter().enumerate() {
        if let Some(&first) = seen.get(&listener.endpoint()) {
            return Some((first, i));
        }
        seen.insert(listener.endpoint(), i);
    }
    None
}

/// `transport://address`, as `--listen` takes it.
pub(super) fn listener_url(listener: &ListenerConfig) -> String {
    format!("{}://{}", listener.transport, listener.address)
}
