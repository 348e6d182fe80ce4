//! Target configurations and the subsystem and host NQNs tests share.

/// Subsystem and host NQNs the end-to-end tests share.
pub mod names {
    /// The subsystem the daemon serves when no configuration file names one.
    pub const DEFAULT_NQN: &str = "nqn.2026-11.io.rdmablk:default";
    /// A subsystem any host may use.
    pub const OPEN_NQN: &str = "nqn.2026-11.io.rdmablk:open";
    /// A subsystem only listed hosts may use.
    pub const PRIVATE_NQN: &str = "nqn.2026-11.io.rdmablk:private";
    /// A host NQN.
    pub const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:6c3e2f0a-2b1d-4c5e-9f8a-1a2b3c4d5e6f";
    /// Another host NQN.
    pub const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0f9e8d7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f";
}

/// A configuration (for [`Target::start_config`](crate::Target::start_config)): the tables in `top`
/// (such as `[pollers]` or `[limits]`), a loopback listener, and subsystem
/// `nqn`, which any host may use, with one namespace whose keys are
/// `namespace` (e.g. `backend = "memory"` and `size = "64MiB"`).
pub fn open_subsystem_config(top: &str, nqn: &str, namespace: &str) -> String {
    format!(
        r#"
{top}

[[listener]]
transport = "tcp"
address = "127.0.0.1:{{port}}"

[[subsystem]]
nqn = "{nqn}"
allow_any_host = true

  [[subsystem.namespace]]
{namespace}
"#
    )
}

/// A configuration (for [`Target::start_config`](crate::Target::start_config)) with two subsystems: one
/// any host may use, one only [`names::HOST_A`] may use.
pub fn two_subsystems_config() -> String {
    use names::*;
    format!(
        r#"
[[listener]]
transport = "tcp"
address = "127.0.0.1:{{port}}"

[[subsystem]]
nqn = "{OPEN_NQN}"
allow_any_host = true

  [[subsystem.namespace]]
  backend = "memory"
  size = "64MiB"

[[subsystem]]
nqn = "{PRIVATE_NQN}"
allow_any_host = false
hosts = ["{HOST_A}"]

  [[subsystem.namespace]]
  backend = "memory"
  size = "16MiB"
"#
    )
}
