//! The host, `rdmablk`: its NBD front-end against clients we did not write,
//! the NBD export's resource model, multipath over two gateways, and
//! `connect --ublk` with and without ublk.

mod multipath;
mod nbd;
mod nbd_export;
mod tls;
mod ublk_unavailable;
