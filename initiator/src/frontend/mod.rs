//! Front-ends that expose a connected namespace locally.

pub mod nbd;
