//! Front-ends that expose a connected namespace locally.

mod keeper;
pub mod nbd;
pub mod ublk;
