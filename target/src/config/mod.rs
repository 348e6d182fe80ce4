//! Target configuration: TOML text (or the command-line quick form) turned
//! into a validated [`Config`].
//!
//! Parsing happens in two steps: the TOML is deserialized into loosely typed
//! raw tables (unknown keys are rejected there), then converted and checked.
//! Every semantic error is a [`ConfigError::Invalid`] naming the key path
//! (e.g. `subsystem[0].namespace[1].block_size`), what is wrong and how to
//! fix it. The example configuration shipped with the daemon is
//! `config/target.toml`.
//!
//! The model is in `model`, the raw tables in `raw`, their conversion in
//! `convert` and the model's rules in `validate`; `quick` is the
//! command-line quick form, `nqn` the NQN syntax, `listener` the listen
//! addresses and `rbd` the RBD namespaces.

use error::invalid;
use listener::default_listener;
use model::DEFAULT_BLOCK_SIZE;
use raw::RawConfig;
use std::path::Path;

mod convert;
mod error;
mod gateway;
mod listener;
pub mod manual;
mod model;
mod nqn;
mod qos;
mod quick;
mod raw;
mod rbd;
mod validate;

pub use error::ConfigError;
pub use model::{
    AnaState, BackendConfig, Config, GatewayGroup, GivenIds, HostAuth, HostQos, HostTlsKey, Limits,
    ListenerConfig, ListenerTls, NamespaceConfig, Pollers, QosClass, QosKey, QosLimits,
    SubsystemConfig, Transport, DEFAULT_STATE_DIRECTORY, MAX_ANA_GROUP, MAX_CNTLID, MAX_NSID,
};
pub use nqn::{validate_nqn, DEFAULT_NQN};
pub use qos::apply_setting as qos_setting;
pub use quick::{from_quick_args, QuickArgs};
pub use rbd::RbdImage;
pub use validate::machine_memory;

/// Capacity of the memory namespace of [`embedded_default`].
const EMBEDDED_MEMORY_BYTES: u64 = 1 << 30;

/// Reads and parses the configuration file at `path`.
///
/// Read errors name the path; the other errors are those of [`parse`].
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let cfg = parse(&text)?;
    if holds_inline_secrets(&text) {
        if let Err(problem) = private_file(path) {
            return Err(invalid(path.display().to_string(), problem));
        }
    }
    Ok(cfg)
}

/// Whether a (valid) configuration gives a DH-HMAC-CHAP secret or a TLS key
/// inline in some `[[subsystem.host]]` table (comments and `*_file` keys
/// aside).
fn holds_inline_secrets(text: &str) -> bool {
    let Ok(v) = toml::from_str::<toml::Value>(text) else {
        return false;
    };
    let tables = |v: Option<&toml::Value>| {
        v.and_then(toml::Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(toml::Value::as_table)
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    tables(v.get("subsystem")).iter().any(|s| {
        tables(s.get("host")).iter().any(|h| {
            ["dhchap_secret", "dhchap_ctrl_secret", "tls_key"]
                .iter()
                .any(|k| h.contains_key(*k))
        })
    })
}

/// Refuses a file holding secrets that others than its owner may read.
fn private_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| e.to_string())?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "holds secrets (DH-HMAC-CHAP or TLS keys) but its mode is {:o}: others may read them; chmod 600 it",
            mode & 0o777
        ));
    }
    Ok(())
}

/// Parses and validates configuration TOML.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let raw: RawConfig =
        toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string().trim_end().into()))?;
    let config = convert::convert(raw)?;
    config.validate()?;
    Ok(config)
}

/// The configuration used when none is given: one 1 GiB memory namespace
/// (nsid 1) in subsystem [`DEFAULT_NQN`], open to any host, listening on
/// NVMe/TCP `127.0.0.1:4420`, default pollers.
pub fn embedded_default() -> Config {
    Config {
        pollers: Pollers::default(),
        listeners: vec![default_listener()],
        subsystems: vec![SubsystemConfig {
            nqn: DEFAULT_NQN.to_owned(),
            allow_any_host: true,
            hosts: Vec::new(),
            auth: Vec::new(),
            tls_keys: Vec::new(),
            namespaces: vec![NamespaceConfig::new(
                1,
                BackendConfig::Memory {
                    size: EMBEDDED_MEMORY_BYTES,
                },
                DEFAULT_BLOCK_SIZE,
            )],
            cntlids: 1..=MAX_CNTLID,
        }],
        limits: Limits::default(),
        metrics: None,
        state_directory: DEFAULT_STATE_DIRECTORY.into(),
        gateway_group: None,
    }
}

#[cfg(test)]
mod tests;
