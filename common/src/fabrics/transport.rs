//! The fabrics NVMe travels over here, as listeners, hosts and discovery
//! log entries name them.

use super::discovery::trtype;
use std::fmt;
use std::str::FromStr;

/// An NVMe over Fabrics transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// NVMe/TCP.
    Tcp,
    /// NVMe/RDMA (RoCE, InfiniBand).
    Rdma,
}

/// A transport name that is neither `tcp` nor `rdma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown transport; use tcp or rdma")]
pub struct UnknownTransport;

impl Transport {
    /// Every transport.
    pub const ALL: [Transport; 2] = [Transport::Tcp, Transport::Rdma];

    /// Its name in URLs, configuration and command lines: `tcp` or `rdma`.
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }

    /// Its transport type (TRTYPE) in discovery log entries.
    pub const fn trtype(self) -> u8 {
        match self {
            Transport::Tcp => trtype::TCP,
            Transport::Rdma => trtype::RDMA,
        }
    }

    /// The transport of TRTYPE `trtype`, if it is one of ours.
    pub fn from_trtype(trtype: u8) -> Option<Transport> {
        Transport::ALL.into_iter().find(|t| t.trtype() == trtype)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = UnknownTransport;

    /// Parses a name exactly as [`Transport::name`] spells it.
    fn from_str(s: &str) -> Result<Transport, UnknownTransport> {
        Transport::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or(UnknownTransport)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_trtypes() {
        for t in Transport::ALL {
            assert_eq!(t.to_string().parse(), Ok(t));
            assert_eq!(Transport::from_trtype(t.trtype()), Some(t));
        }
        assert_eq!((Transport::Tcp.trtype(), Transport::Rdma.trtype()), (3, 1));
        assert_eq!("udp".parse::<Transport>(), Err(UnknownTransport));
        assert_eq!("TCP".parse::<Transport>(), Err(UnknownTransport));
        assert_eq!(Transport::from_trtype(2), None);
    }
}
