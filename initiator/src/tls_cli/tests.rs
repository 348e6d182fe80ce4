use super::*;
use clap::Parser;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;

#[derive(Parser)]
struct Host {
    #[command(flatten)]
    tls: TlsArgs,
}

#[derive(Parser)]
struct Gen {
    #[command(flatten)]
    g: GenTlsKeyArgs,
}

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:36ebf5a9-1df9-47b3-a6d0-e9ba32e428a2";
const SUBNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f1e9b8f2-6a7d-4f3e-9d1c-3f4b2f8e7a10";

fn tls(args: &[&str]) -> Result<Option<TlsParams>, String> {
    let mut argv = vec!["rdmablk"];
    argv.extend_from_slice(args);
    Host::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .tls
        .resolve()
}

fn gen(args: &[&str]) -> Result<(ConfiguredKey, Option<Identity>), String> {
    let mut argv = vec!["gen-tls-key"];
    argv.extend_from_slice(args);
    Gen::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .g
        .run(HOSTNQN)
}

fn key_file(text: &str, mode: u32) -> (tempdir::Dir, PathBuf) {
    let dir = tempdir::Dir::new();
    let path = dir.0.join("host.key");
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    (dir, path)
}

/// A directory of its own under the system's temporary one, removed on drop.
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);

    impl Dir {
        pub fn new() -> Dir {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("rdmablk-tls-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn no_flags_no_tls() {
    assert!(tls(&[]).unwrap().is_none());
}

#[test]
fn tls_without_a_key_says_where_keys_come_from() {
    let e = tls(&["--tls"]).unwrap_err();
    assert!(
        e.contains("--tls-key-file") && e.contains("gen-tls-key"),
        "{e}"
    );
}

#[test]
fn a_key_alone_turns_tls_on_with_identity_0() {
    let key = ConfiguredKey::generate(Hash::Sha256)
        .unwrap()
        .to_interchange();
    for args in [vec!["--tls-key", &key], vec!["--tls", "--tls-key", &key]] {
        let p = tls(&args).unwrap().expect("TLS on");
        assert_eq!(p.key.to_interchange(), key);
        assert_eq!((p.identity, p.labels), (0, Labels::Rfc8446));
        let id = p.identity(HOSTNQN, SUBNQN).to_string();
        assert_eq!(id, format!("NVMe0R01 {HOSTNQN} {SUBNQN}"));
    }
}

#[test]
fn identity_1_and_compat() {
    let key = ConfiguredKey::generate(Hash::Sha384)
        .unwrap()
        .to_interchange();
    let p = tls(&["--tls-key", &key, "--tls-identity", "1", "--tls-compat"])
        .unwrap()
        .unwrap();
    assert_eq!((p.identity, p.labels), (1, Labels::LegacyLibnvme));
    assert!(p
        .identity(HOSTNQN, SUBNQN)
        .to_string()
        .starts_with(&format!("NVMe1R02 {HOSTNQN} {SUBNQN} ")));
    assert!(tls(&["--tls-key", &key, "--tls-identity", "2"]).is_err());
}

#[test]
fn identity_or_compat_without_a_key_is_refused() {
    assert!(tls(&["--tls-identity", "1"])
        .unwrap_err()
        .contains("apply to TLS"));
    assert!(tls(&["--tls-compat"]).unwrap_err().contains("apply to TLS"));
}

#[test]
fn a_bad_key_is_named_but_not_quoted() {
    let e = tls(&["--tls-key", "NVMeTLSkey-1:01:c2VjcmV0c2VjcmV0:"]).unwrap_err();
    assert!(e.starts_with("--tls-key: "), "{e}");
    assert!(!e.contains("c2VjcmV0c2VjcmV0"), "{e}");
}

#[test]
fn key_and_key_file_conflict() {
    let key = ConfiguredKey::generate(Hash::Sha256)
        .unwrap()
        .to_interchange();
    assert!(tls(&["--tls-key", &key, "--tls-key-file", "/nonexistent"]).is_err());
}

#[test]
fn key_file_is_read_when_private() {
    let key = ConfiguredKey::generate(Hash::Sha256)
        .unwrap()
        .to_interchange();
    let (_dir, path) = key_file(&format!("{key}\n"), 0o600);
    let p = tls(&["--tls-key-file", path.to_str().unwrap()])
        .unwrap()
        .unwrap();
    assert_eq!(p.key.to_interchange(), key);
}

#[test]
fn key_file_others_may_read_is_refused() {
    let key = ConfiguredKey::generate(Hash::Sha256)
        .unwrap()
        .to_interchange();
    let (_dir, path) = key_file(&key, 0o644);
    let e = tls(&["--tls", "--tls-key-file", path.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("mode is 644") && e.contains("chmod 600"), "{e}");
    assert!(!e.contains(&key[16..40]), "{e}");
}

#[test]
fn missing_key_file_is_named() {
    let e = tls(&["--tls-key-file", "/nonexistent/host.key"]).unwrap_err();
    assert!(e.contains("/nonexistent/host.key"), "{e}");
}

#[test]
fn generated_keys_parse_back_with_their_length() {
    for (args, hash, len) in [
        (vec![], Hash::Sha256, 32),
        (vec!["--hmac", "1"], Hash::Sha256, 32),
        (vec!["--hmac", "2"], Hash::Sha384, 48),
    ] {
        let (key, identity) = gen(&args).unwrap();
        assert!(identity.is_none());
        let text = key.to_interchange();
        let prefix = format!("NVMeTLSkey-1:{:02}:", hash.id());
        assert!(text.starts_with(&prefix) && text.ends_with(':'), "{text}");
        let back = ConfiguredKey::parse(&text).unwrap();
        assert_eq!(back, key);
        assert_eq!(back.hash(), hash);
        assert_eq!(
            format!("{back:?}"),
            format!("ConfiguredKey({len} bytes, transform Some({hash:?}))")
        );
    }
    assert_ne!(gen(&[]).unwrap().0, gen(&[]).unwrap().0, "keys are random");
    assert!(gen(&["--hmac", "3"]).is_err());
}

#[test]
fn secret_gives_the_bytes() {
    let hex32 = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    let (key, _) = gen(&["--secret", hex32]).unwrap();
    let want: Vec<u8> = (0..32).map(|i| (i % 16) as u8 * 0x11).collect();
    assert_eq!(key, ConfiguredKey::from_bytes(&want, Some(Hash::Sha256)));
    let e = gen(&["--hmac", "2", "--secret", hex32]).unwrap_err();
    assert!(e.contains("32 bytes") && e.contains("96 hex digits"), "{e}");
    assert!(gen(&["--secret", "0g"])
        .unwrap_err()
        .contains("not hexadecimal"));
    assert!(gen(&["--secret", "001"])
        .unwrap_err()
        .contains("not hexadecimal"));
}

#[test]
fn identity_printed_is_the_one_the_host_offers() {
    let (_, identity) = gen(&["--subnqn", SUBNQN]).unwrap();
    let identity = identity.unwrap().to_string();
    assert_eq!(identity, format!("NVMe0R01 {HOSTNQN} {SUBNQN}"));
    let (key1, identity1) = gen(&["-n", SUBNQN, "-q", "nqn.h", "-I", "1"]).unwrap();
    let host = TlsParams {
        key: key1,
        identity: 1,
        labels: Labels::Rfc8446,
    };
    assert_eq!(identity1.unwrap(), host.identity("nqn.h", SUBNQN));
    assert!(
        gen(&["--hostnqn", "nqn.h"]).is_err(),
        "--hostnqn needs --subnqn"
    );
}
