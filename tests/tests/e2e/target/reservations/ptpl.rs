//! Persist Through Power Loss across a `kill -9`, and state files the
//! daemon cannot trust.

use super::*;

fn file_ns(path: &Path) -> String {
    format!("  backend = \"file\"\n  path = \"{}\"", path.display())
}

/// The PTPL state file of namespace `nsid` of [`DEFAULT_NQN`] in `state`.
fn state_file(state: &Path, nsid: u32) -> PathBuf {
    state.join(format!("{DEFAULT_NQN}.ns{nsid}.ptpl"))
}

fn refused_file(state: &Path, nsid: u32) -> PathBuf {
    state.join(format!("{DEFAULT_NQN}.ns{nsid}.ptpl.refused"))
}

/// Get Features Reservation Persistence (83h) of namespace 1: PTPL.
fn ptpl(c: &Controller) -> u32 {
    namespace_feature(c, feature::RESV_PERSIST, "Get Features 83h") & 1
}

fn set_ptpl(c: &Controller, on: bool) {
    let done = c
        .admin()
        .set_features_ns(feature::RESV_PERSIST, NSID, on as u32)
        .or_panic("Set Features 83h");
    assert_status(&done, Status::SUCCESS, "Set Features 83h");
}

/// SIGKILL (no chance to save anything), then the same configuration again.
fn kill_and_restart(t: &mut Target, toml: &str) -> Target {
    t.kill();
    assert!(!t.is_running(), "the daemon survived SIGKILL");
    Target::start_config(toml)
}

/// Persist Through Power Loss (NVMe Base 2.1, 8.1.22, and the Reservation
/// Persistence feature 83h): with PTPL set by
/// Register (CPTPL 11b), the registrants, the holder, the type and the
/// generation survive `kill -9` and a restart, with PTPLS set and access
/// checked as before; cleared with Set Features 83h, a restart forgets
/// them; set with Set Features 83h, the next registrations survive; cleared
/// with CPTPL 10b, forgotten again.
#[test]
fn ptpl_keeps_registrations_and_the_reservation_across_kill_9() {
    let _machine = crate::shared();
    let state = TempDir::new("resv-ptpl");
    let files = TempDir::new("resv-ptpl-ns");
    let toml = config(
        state.path(),
        &[&file_ns(&files.sparse_file("ns1.img", 16 << 20))],
    );
    const KA: u64 = 0x0a0a_0a0a_0a0a_0a0a;
    const KB: u64 = 0x0b0b_0b0b_0b0b_0b0b;
    let mut t = Target::start_config(&toml);
    let (mut a, mut b) = (open_as(&t, &A), open_as(&t, &B));
    assert_eq!(ptpl(&a), 0, "PTPL of a new namespace");
    ok(
        reg(io(&mut a), REGISTER | CPTPL_SET, 0, KA),
        "A registers, CPTPL 11b",
    );
    assert_eq!(ptpl(&a), 1, "PTPL after CPTPL 11b");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(
        acq(io(&mut a), ACQUIRE | rt(4), KA, 0),
        "A acquires Exclusive Access - Registrants Only",
    );
    let before = report(io(&mut b));
    assert_eq!(
        (before.gen, before.rtype, before.regctl, before.ptpls),
        (2, 4, 2, 1),
        "{before:?}"
    );
    assert_eq!(
        before.registrants,
        sorted(vec![r(&A, KA, true), r(&B, KB, false)])
    );
    assert!(
        state_file(state.path(), 1).exists(),
        "no state file {} (state directory: {:?})",
        state_file(state.path(), 1).display(),
        std::fs::read_dir(state.path()).map(|d| d.count())
    );

    drop((a, b));
    let mut t = kill_and_restart(&mut t, &toml);
    let (mut a, mut b, mut c) = (open_as(&t, &A), open_as(&t, &B), open_as(&t, &C));
    assert_eq!(
        report(io(&mut c)),
        before,
        "the report after kill -9 and a restart"
    );
    assert_eq!(ptpl(&a), 1, "PTPL after the restart");
    let done = io(&mut c)
        .exec(Queue::rw_sqe(nvm::READ, NSID, 0, 1), None, BS)
        .or_panic("C reads");
    want(
        done,
        Status::RESERVATION_CONFLICT,
        "a non-registrant's read under type 4",
    );
    io(&mut b)
        .write(NSID, 0, &[7; BS as usize], BS, false)
        .or_panic("a registrant writes under type 4");
    io(&mut a).read(NSID, 0, 1, BS).or_panic("the holder reads");

    // Cleared with Set Features: forgotten at the next start.
    set_ptpl(&a, false);
    assert_eq!(ptpl(&a), 0, "PTPL after Set Features 83h = 0");
    assert_eq!(report(io(&mut a)).ptpls, 0);
    drop((a, b, c));
    let mut t = kill_and_restart(&mut t, &toml);
    let (mut a, mut b) = (open_as(&t, &A), open_as(&t, &B));
    let rep = report(io(&mut a));
    assert_eq!(
        (rep.rtype, rep.regctl, rep.ptpls),
        (0, 0, 0),
        "after a restart without PTPL: {rep:?}"
    );
    assert_eq!(ptpl(&a), 0);

    // Set with Set Features, then registrations: kept.
    set_ptpl(&a, true);
    ok(reg(io(&mut a), REGISTER, 0, KA), "A registers");
    ok(reg(io(&mut b), REGISTER, 0, KB), "B registers");
    ok(acq(io(&mut b), ACQUIRE | rt(5), KB, 0), "B acquires type 5");
    let before = report(io(&mut a));
    assert_eq!(
        (before.rtype, before.regctl, before.ptpls),
        (5, 2, 1),
        "{before:?}"
    );
    drop((a, b));
    let mut t = kill_and_restart(&mut t, &toml);
    let (mut a, mut b) = (open_as(&t, &A), open_as(&t, &B));
    assert_eq!(report(io(&mut b)), before, "PTPL set by Set Features 83h");

    // Cleared by Register with CPTPL 10b (a replace by the same key).
    ok(
        reg(io(&mut a), REPLACE | CPTPL_CLEAR, KA, KA),
        "replace, CPTPL 10b",
    );
    assert_eq!(ptpl(&a), 0, "PTPL after CPTPL 10b");
    drop((a, b));
    let t = kill_and_restart(&mut t, &toml);
    let mut a = open_as(&t, &A);
    let rep = report(io(&mut a));
    assert_eq!((rep.rtype, rep.regctl), (0, 0), "after CPTPL 10b: {rep:?}");
}

/// The ERROR lines of a daemon's log that name `file_name`.
fn error_lines(t: &Target, file_name: &str) -> Vec<String> {
    t.log()
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains(file_name))
        .map(str::to_string)
        .collect()
}

/// A PTPL state file the daemon cannot trust is refused (renamed
/// `*.refused`, an ERROR line saying why) and the namespace starts with no
/// registrations, while the daemon starts and another namespace keeps its
/// own: garbage; the valid file of another namespace copied over; the
/// namespace's own file after the namespace grew.
#[test]
fn corrupt_and_foreign_ptpl_files_are_refused() {
    let _machine = crate::shared();
    let state = TempDir::new("resv-ptpl-bad");
    let files = TempDir::new("resv-ptpl-bad-ns");
    let img1 = files.sparse_file("ns1.img", 16 << 20);
    let img2 = files.sparse_file("ns2.img", 8 << 20);
    let toml = config(state.path(), &[&file_ns(&img1), &file_ns(&img2)]);
    let (f1, f2) = (state_file(state.path(), 1), state_file(state.path(), 2));
    let refused = refused_file(state.path(), 1);
    let name1 = format!("{DEFAULT_NQN}.ns1.ptpl");
    const KA: u64 = 0x1a;
    const KA2: u64 = 0x2a;

    // Register on both namespaces with PTPL, then kill.
    let mut t = Target::start_config(&toml);
    let mut a = open_as(&t, &A);
    ok(
        reg(io(&mut a), REGISTER | CPTPL_SET, 0, KA),
        "A registers on namespace 1",
    );
    ok(
        resv(
            io(&mut a),
            nvm::RESV_REGISTER,
            2,
            REGISTER | CPTPL_SET,
            &[0, KA2],
        ),
        "A registers on namespace 2",
    );
    assert!(f1.exists() && f2.exists(), "state files {f1:?}, {f2:?}");
    drop(a);
    t.kill();

    // Checks a daemon started over a bad file of namespace 1.
    let check = |t: &Target, case: &str| {
        let mut a = open_as(t, &A);
        let rep = report(io(&mut a));
        assert_eq!(
            (rep.regctl, rep.rtype),
            (0, 0),
            "{case}: namespace 1 starts with no registrations: {rep:?}"
        );
        let rep2 = report_ns(io(&mut a), 2);
        assert_eq!(
            rep2.registrants,
            vec![r(&A, KA2, false)],
            "{case}: namespace 2 keeps its registration"
        );
        assert!(
            refused.exists(),
            "{case}: no {refused:?}; the state directory holds {:?}",
            std::fs::read_dir(state.path())
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
        assert!(!f1.exists(), "{case}: {f1:?} still there");
        let lines = error_lines(t, &name1);
        assert!(
            !lines.is_empty(),
            "{case}: no ERROR line naming {name1}\n{}",
            t.log_tail()
        );
        eprintln!("{case}: {}", lines.join("\n"));
        lines
    };

    // Garbage.
    std::fs::write(&f1, b"not a reservation state file\n\x00\xff\xfe garbage")
        .or_panic("writing garbage");
    let mut t = Target::start_config(&toml);
    check(&t, "a corrupt file");
    t.kill();

    // The valid state file of namespace 2, copied over namespace 1's.
    std::fs::remove_file(&refused).or_panic("removing the refused file");
    std::fs::copy(&f2, &f1).or_panic("copying namespace 2's state file");
    let mut t = Target::start_config(&toml);
    check(&t, "namespace 2's file as namespace 1's");

    // Namespace 1's own file, after namespace 1 grew.
    std::fs::remove_file(&refused).or_panic("removing the refused file");
    let mut a = open_as(&t, &A);
    ok(
        reg(io(&mut a), REGISTER | CPTPL_SET, 0, KA),
        "A registers on namespace 1 again",
    );
    assert!(f1.exists(), "no state file {f1:?}");
    drop(a);
    t.kill();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img1)
        .and_then(|f| f.set_len(32 << 20))
        .or_panic("growing namespace 1's file");
    let t = Target::start_config(&toml);
    let lines = check(&t, "namespace 1 resized");
    assert!(
        lines.iter().any(|l| l.to_lowercase().contains("size")),
        "the refusal of a resized namespace's file does not name the size: {lines:?}"
    );
}
