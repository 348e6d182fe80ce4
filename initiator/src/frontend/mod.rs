//! Front-ends that expose a connected namespace locally.

pub mod keeper;
pub mod nbd;
pub mod state;
pub mod ublk;
