//! What runs each subcommand of the command line (`cli`).

mod bench;
mod connect;
mod connect_all;
mod discover;
mod gen_tls_key;
mod params;
mod print;

pub(crate) use bench::run as bench;
pub(crate) use connect::{connect, connect_all};
pub(crate) use discover::{discover, list};
pub(crate) use gen_tls_key::gen_tls_key;
