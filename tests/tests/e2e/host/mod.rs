//! The host, `rdmablk`: its NBD front-end against clients we did not write,
//! the NBD export's resource model, and `connect --ublk` without ublk.

mod nbd;
mod nbd_export;
mod ublk_unavailable;
