//! TLS keys for the tests: fixed configured keys, key files only their
//! owner reads, the PSK a host offers with them, and a target whose TLS
//! listener knows one host's key.

use crate::check::OrPanic;
use crate::control::ControlledTarget;
use crate::names::HOST_A;
use crate::TempDir;
use rdmablk_common::tls::key::{ConfiguredKey, Hash, Identity, Labels};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// The subsystem of [`target`].
pub const SUBSYS: &str = "nqn.2026-12.io.rdmablk:tls";

/// A fixed key of `hash`'s length (so that failures reproduce).
pub fn key(hash: Hash, seed: u8) -> ConfiguredKey {
    let n = match hash {
        Hash::Sha256 => 32,
        Hash::Sha384 => 48,
    };
    let bytes: Vec<u8> = (0..n).map(|i| seed.wrapping_add(i as u8 * 11)).collect();
    ConfiguredKey::from_bytes(&bytes, Some(hash))
}

/// `key` in file `name` of `dir`, which only its owner reads.
pub fn key_file(dir: &TempDir, name: &str, key: &ConfiguredKey) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, key.to_interchange()).or_panic("writing the key");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).or_panic("chmod");
    path
}

/// The identity `hostnqn` offers to [`SUBSYS`] with `key` (version `v`),
/// and its TLS PSK.
pub fn offer(key: &ConfiguredKey, v: u8, hostnqn: &str) -> (String, Vec<u8>) {
    let id = Identity::of(v, key, hostnqn, SUBSYS, Labels::Rfc8446);
    let psk = id.tls_psk(key, Labels::Rfc8446).expect("deriving the PSK");
    (id.to_string(), psk.key.to_vec())
}

/// A target (with a control socket) serving [`SUBSYS`] (a 16 MiB memory namespace) whose listener
/// `{port}` has `tls` ("required" or "optional") and `[limits]` `limits`,
/// where HOST_A has `key` (in a file of the returned directory); a second,
/// plaintext listener on `plain` when given.
pub fn target(
    key: &ConfiguredKey,
    tls: &str,
    limits: &str,
    plain: Option<u16>,
) -> (ControlledTarget, TempDir) {
    let dir = TempDir::new("tls-keys");
    let path = key_file(&dir, "host-a.key", key);
    let second = plain.map_or(String::new(), |p| {
        format!("[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{p}\"\n")
    });
    let text = format!(
        "[limits]\n{limits}\n\
         [[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\ntls = \"{tls}\"\n{second}\n\
         [[subsystem]]\nnqn = \"{SUBSYS}\"\n\
         [[subsystem.host]]\nnqn = \"{HOST_A}\"\ntls_key_file = \"{}\"\n\
         [[subsystem.namespace]]\nbackend = \"memory\"\nsize = \"16MiB\"\n",
        path.display()
    );
    (ControlledTarget::start(&text), dir)
}
