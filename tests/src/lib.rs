//! End-to-end test harness: finds the built binaries, runs `rdmablk-target`
//! on a free loopback port with its log captured, and speaks NVMe/TCP to it
//! through [`client`].
//!
//! By concern: processes ([`Target`], [`control::ControlledTarget`],
//! [`Proc`] and [`run`], [`NbdExport`], what `/proc` says of them);
//! configurations and names ([`open_subsystem_config`], [`names`]); host
//! command lines ([`cmdline`]); the NVMe/TCP test host ([`client`],
//! [`dhchap`]) and what it speaks ([`events`], [`reservation`]); the NBD
//! test client ([`nbd`]); the metrics endpoint ([`metrics`]); assertions
//! ([`check`]); external tools ([`tools`]); this process's limits
//! ([`limits`]); temporary directories ([`TempDir`]) and test data
//! ([`Rng`]); the partition suite: network namespaces ([`testnet`]), a
//! stallable storage path ([`stall`]), its workload ([`workload`]), faults
//! ([`nemesis`]), the history checker ([`history`]) and the cluster they
//! run on ([`partition`]).
//!
//! When a test panics, every [`Target`] it holds prints the tail of its log
//! and keeps its temporary directory for inspection.
//!
//! Environment: `RDMABLK_BIN_DIR` (where the binaries are; default
//! `build/release`, then `build/debug`, which must be newer than their
//! sources), `RUST_LOG` (passed to the daemon; default `debug`),
//! `RDMABLK_KEEP_TEMP` (keep temporary directories even when tests pass),
//! `TMPDIR` (where they go; file namespaces use O_DIRECT, so it must not be
//! a tmpfs that lacks it).

pub mod args;
mod bins;
pub mod check;
pub mod client;
pub mod cmdline;
mod config;
pub mod control;
pub mod dhchap;
pub mod events;
pub mod history;
pub mod limits;
pub mod metrics;
pub mod nbd;
mod nbd_export;
pub mod nemesis;
pub mod partition;
mod process;
mod procfs;
pub mod proxy;
pub mod reservation;
mod rng;
pub mod stall;
mod target;
mod temp;
pub mod testnet;
pub mod tls;
pub mod tools;
pub mod workload;

pub use bins::{bin_path, workspace_root};
pub use cmdline::rdmablk_command;
pub use config::{names, open_subsystem_config, two_subsystems_config};
pub use nbd_export::NbdExport;
pub use process::{command_line, run, send_signal, Proc, Ran};
pub use procfs::{cpu_time, fd_count, thread_count, vm_rss_kib};
pub use rng::Rng;
pub use target::{free_port, Target, START_TIMEOUT, STOP_TIMEOUT};
pub use temp::TempDir;
