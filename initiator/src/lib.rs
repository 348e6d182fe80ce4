//! rdmablk host library: an NVMe over Fabrics host (admin and I/O queues),
//! and the front-ends that expose a remote namespace locally.

pub mod bench;
pub mod frontend;
pub mod fuzzing;
pub mod host;
pub mod hostid;
pub mod signals;
pub mod tls_cli;
