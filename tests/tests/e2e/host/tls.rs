//! rdmablk's host against rdmablk-target over NVMe/TCP with TLS 1.3
//! (user-space records on this machine's kernel, which has no kernel TLS):
//! `bench --verify` with both hashes and both identity versions, fio
//! verifying through an NBD export whose paths are encrypted, and the
//! messages that tell an operator what to fix: a wrong key, TLS missing on
//! either side.

use rdmablk_common::tls::key::Hash;
use rdmablk_tests::names::HOST_A;
use rdmablk_tests::tls::{key, key_file, target, SUBSYS};
use rdmablk_tests::tools::{bench, check_bench, fio_ok};
use rdmablk_tests::{NbdExport, Target};
use std::os::unix::fs::PermissionsExt;

/// `bench` of HOST_A against `t` with `args`.
fn bench_a(t: &Target, args: &[&str]) -> rdmablk_tests::Ran {
    let mut all = vec!["-q", HOST_A];
    all.extend_from_slice(args);
    bench(t.port(), SUBSYS, &all)
}

#[test]
fn bench_verifies_with_both_hashes_and_identity_versions() {
    let _machine = crate::shared();
    for (hash, suite) in [
        (Hash::Sha256, "TLS_AES_128_GCM_SHA256"),
        (Hash::Sha384, "TLS_AES_256_GCM_SHA384"),
    ] {
        let k = key(hash, 21);
        let (d, dir) = target(&k, "required", "", None);
        let t = &d.t;
        let file = key_file(&dir, "host.key", &k);
        let file = file.to_str().expect("utf-8");
        for v in ["0", "1"] {
            let r = bench_a(
                t,
                &[
                    "--tls-key-file",
                    file,
                    "--tls-identity",
                    v,
                    "--rw",
                    "randrw",
                    "--bs",
                    "4k",
                    "--qd",
                    "16",
                    "--runtime",
                    "1",
                    "--verify",
                    "--json",
                ],
            );
            check_bench(
                &r,
                4096.0,
                &["read", "write"],
                &format!("{hash:?} identity {v}"),
            );
            assert!(
                r.stderr
                    .contains(&format!("is encrypted: TLS 1.3, {suite}")),
                "{}",
                r.report()
            );
        }
        // Large transfers: records split and joined across 128 KiB I/Os.
        let r = bench_a(
            t,
            &[
                "--tls-key-file",
                file,
                "--rw",
                "randrw",
                "--bs",
                "128k",
                "--qd",
                "4",
                "--runtime",
                "1",
                "--verify",
                "--json",
            ],
        );
        check_bench(&r, 131072.0, &["read", "write"], &format!("{hash:?} 128k"));
    }
}

#[test]
fn fio_verifies_through_an_nbd_export_over_tls() {
    let _machine = crate::shared();
    let k = key(Hash::Sha256, 23);
    let (d, dir) = target(&k, "required", "", None);
    let t = &d.t;
    let file = key_file(&dir, "host.key", &k);
    let e = NbdExport::start(
        t.port(),
        SUBSYS,
        &[
            "-q",
            HOST_A,
            "--tls-key-file",
            file.to_str().expect("utf-8"),
        ],
    );
    fio_ok(
        e.uri(),
        &[
            "--name=tls",
            "--rw=randwrite",
            "--bs=16k",
            "--size=8M",
            "--iodepth=8",
            "--verify=crc32c",
            "--do_verify=1",
        ],
        8 << 20,
        "fio through NBD over TLS",
    );
    let (_, s, _) = d.run(&["status"]);
    assert!(
        s.contains("over tcp with TLS (TLS_AES_128_GCM_SHA256)"),
        "status does not show the encrypted host:\n{s}"
    );
}

#[test]
fn the_host_says_what_to_fix() {
    let _machine = crate::shared();
    let k = key(Hash::Sha256, 25);
    let (d, dir) = target(&k, "required", "", None);
    let t = &d.t;

    // A key the target does not hold for this host.
    let wrong = key_file(&dir, "wrong.key", &key(Hash::Sha256, 26));
    let r = bench_a(
        t,
        &[
            "--tls-key-file",
            wrong.to_str().expect("utf-8"),
            "--runtime",
            "1",
        ],
    );
    assert!(!r.status.success(), "{}", r.report());
    assert!(
        r.stderr
            .contains("must hold this host's key for identity `NVMe0R01"),
        "{}",
        r.report()
    );
    t.wait_log("key is not the one configured for identity NVMe0R01");

    // No TLS where it is required.
    let r = bench_a(t, &["--runtime", "1"]);
    assert!(!r.status.success(), "{}", r.report());
    assert!(r.stderr.contains("add --tls"), "{}", r.report());

    // TLS where the target has none.
    let plain = Target::start(&["--memory", "16MiB"]);
    let good = key_file(&dir, "good.key", &k);
    let r = bench(
        plain.port(),
        rdmablk_tests::names::DEFAULT_NQN,
        &[
            "--tls-key-file",
            good.to_str().expect("utf-8"),
            "--runtime",
            "1",
        ],
    );
    assert!(!r.status.success(), "{}", r.report());
    assert!(
        r.stderr.contains("is its listener configured with tls"),
        "{}",
        r.report()
    );

    // A key file others may read.
    let open = key_file(&dir, "open.key", &k);
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let r = bench_a(
        t,
        &[
            "--tls-key-file",
            open.to_str().expect("utf-8"),
            "--runtime",
            "1",
        ],
    );
    assert!(!r.status.success(), "{}", r.report());
    assert!(r.stderr.contains("chmod 600"), "{}", r.report());
}
