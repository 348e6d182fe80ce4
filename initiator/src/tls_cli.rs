//! The command line's NVMe/TCP over TLS options (`--tls`, `--tls-key`,
//! `--tls-key-file`, `--tls-identity`, `--tls-compat`) and `rdmablk
//! gen-tls-key`: here rather than in the binary so that their parsing is
//! tested.

use crate::host::TlsParams;
use clap::Args;
use rdmablk_common::tls::key::{ConfiguredKey, Hash, Identity, Labels};
use std::path::{Path, PathBuf};

/// NVMe/TCP over TLS 1.3 with a pre-shared key (TP 8011).
#[derive(Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// Encrypt every connection of the path(s) with TLS 1.3 and a
    /// pre-shared key (NVMe/TCP only). Needs --tls-key-file or --tls-key;
    /// giving a key alone turns TLS on too.
    #[arg(long)]
    pub tls: bool,
    /// The host's configured TLS PSK, NVMeTLSkey-1:01:<base64>: (or :02:),
    /// as `rdmablk gen-tls-key` or `nvme gen-tls-key` prints it. The
    /// target must hold the same key for this host NQN. A key on the
    /// command line shows in `ps`: prefer --tls-key-file.
    #[arg(long, value_name = "NVMeTLSkey-1:..", conflicts_with = "tls_key_file")]
    pub tls_key: Option<String>,
    /// A file holding the configured TLS PSK (NVMeTLSkey-1:...:, one
    /// line); refused if group or others may read it (chmod 600).
    #[arg(long, value_name = "PATH")]
    pub tls_key_file: Option<PathBuf>,
    /// The TLS PSK identity offered: 0 (default): `NVMe0R0x <hostnqn>
    /// <subnqn>`, what SPDK accepts; 1: with the PSK's digest, for Linux
    /// nvmet keyrings filled by `nvme gen-tls-key -I 1`.
    #[arg(long, value_name = "0|1", value_parser = clap::value_parser!(u8).range(0..=1))]
    pub tls_identity: Option<u8>,
    /// Derive the TLS PSK as libnvme before 1.16 did (nvme-cli's --compat),
    /// for keys put in a kernel keyring by those versions.
    #[arg(long)]
    pub tls_compat: bool,
}

impl TlsArgs {
    /// The TLS settings these options ask for: `None` without TLS.
    pub fn resolve(&self) -> Result<Option<TlsParams>, String> {
        let key = match (&self.tls_key, &self.tls_key_file) {
            (Some(k), _) => Some(ConfiguredKey::parse(k).map_err(|e| format!("--tls-key: {e}"))?),
            (None, Some(path)) => Some(read_key_file(path)?),
            (None, None) => None,
        };
        let Some(key) = key else {
            if self.tls {
                return Err(
                    "--tls needs the host's pre-shared key: give --tls-key-file PATH \
                     (or --tls-key NVMeTLSkey-1:...:); make one with `rdmablk gen-tls-key` \
                     and give the target the same key for this host NQN"
                        .into(),
                );
            }
            if self.tls_identity.is_some() || self.tls_compat {
                return Err(
                    "--tls-identity and --tls-compat apply to TLS: give --tls-key-file PATH".into(),
                );
            }
            return Ok(None);
        };
        Ok(Some(TlsParams {
            key,
            identity: self.tls_identity.unwrap_or(0),
            labels: labels(self.tls_compat),
        }))
    }
}

fn labels(compat: bool) -> Labels {
    if compat {
        Labels::LegacyLibnvme
    } else {
        Labels::Rfc8446
    }
}

/// Reads a configured PSK from `path`, which only its owner may read.
pub fn read_key_file(path: &Path) -> Result<ConfiguredKey, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("--tls-key-file {shown}: {e}"))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "--tls-key-file {shown}: holds a TLS PSK but its mode is {:o}: others may read it; \
             chmod 600 {shown}",
            mode & 0o777
        ));
    }
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path).map_err(|e| format!("--tls-key-file {shown}: {e}"))?,
    );
    ConfiguredKey::parse(&text).map_err(|e| format!("--tls-key-file {shown}: {e}"))
}

/// `rdmablk gen-tls-key`: a new configured PSK.
#[derive(Args, Clone, Debug)]
pub struct GenTlsKeyArgs {
    /// The hash that transforms the key, and its length: 1 (SHA-256, 32
    /// bytes, cipher suite TLS_AES_128_GCM_SHA256) or 2 (SHA-384, 48
    /// bytes, TLS_AES_256_GCM_SHA384).
    #[arg(short = 'm', long, value_name = "1|2", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=2))]
    pub hmac: u8,
    /// The key's bytes in hex (64 digits for --hmac 1, 96 for --hmac 2)
    /// instead of random ones.
    #[arg(short = 's', long, value_name = "HEX")]
    pub secret: Option<String>,
    /// Also print (on stderr) the identity this host NQN offers to
    /// --subnqn with the key; default: the host's NQN, as connect uses.
    #[arg(short = 'q', long, requires = "subnqn")]
    pub hostnqn: Option<String>,
    /// The subsystem NQN of the identity printed on stderr.
    #[arg(short = 'n', long, visible_alias = "subsysnqn")]
    pub subnqn: Option<String>,
    /// The version of the identity printed (as --tls-identity).
    #[arg(short = 'I', long, value_name = "0|1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1), requires = "subnqn")]
    pub identity: u8,
    /// Derive the identity's digest as libnvme before 1.16 (as
    /// --tls-compat).
    #[arg(long, requires = "subnqn")]
    pub compat: bool,
}

impl GenTlsKeyArgs {
    /// The key, and the identity `default_hostnqn` (unless --hostnqn says
    /// otherwise) offers with it when --subnqn is given.
    pub fn run(&self, default_hostnqn: &str) -> Result<(ConfiguredKey, Option<Identity>), String> {
        let hash = if self.hmac == 2 {
            Hash::Sha384
        } else {
            Hash::Sha256
        };
        let key = match &self.secret {
            None => ConfiguredKey::generate(hash)
                .map_err(|e| format!("no random bytes from the system: {e}"))?,
            Some(hex) => {
                let bytes = parse_hex(hex).ok_or(
                    "--secret: not hexadecimal (two digits a byte, no separators)".to_string(),
                )?;
                if bytes.len() != hash.key_len() {
                    return Err(format!(
                        "--secret: {} bytes; --hmac {} takes {} ({} hex digits)",
                        bytes.len(),
                        self.hmac,
                        hash.key_len(),
                        2 * hash.key_len()
                    ));
                }
                ConfiguredKey::from_bytes(&bytes, Some(hash))
            }
        };
        let identity = self.subnqn.as_deref().map(|subnqn| {
            let hostnqn = self.hostnqn.as_deref().unwrap_or(default_hostnqn);
            Identity::of(self.identity, &key, hostnqn, subnqn, labels(self.compat))
        });
        Ok((key, identity))
    }
}

/// The bytes of a string of hex digit pairs.
fn parse_hex(s: &str) -> Option<zeroize::Zeroizing<Vec<u8>>> {
    let s = s.trim().as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes = s
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect::<Option<Vec<u8>>>()?;
    Some(zeroize::Zeroizing::new(bytes))
}

#[cfg(test)]
mod tests;
