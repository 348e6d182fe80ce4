//! `abort::abort_on_panic`: a panic on any thread ends the whole process
//! (SIGABRT) once its message is printed, as the daemon and the host need
//! (a process with one I/O thread gone is half alive). The test runs itself
//! again as a child that installs the hook and panics on a second thread.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

const CHILD: &str = "RDMABLK_ABORT_TEST_CHILD";

#[test]
fn a_panic_on_another_thread_ends_the_process() {
    if std::env::var_os(CHILD).is_some() {
        rdmablk_common::abort::abort_on_panic();
        let worker = std::thread::spawn(|| panic!("a worker thread fails"));
        let _ = worker.join();
        // Only reached if the panic let the process live on.
        std::process::exit(0);
    }
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "a_panic_on_another_thread_ends_the_process",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .expect("running the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "the child lived on or ended otherwise: {:?}\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("a worker thread fails"),
        "the panic's message was not printed first:\n{stderr}"
    );
}
