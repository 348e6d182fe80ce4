//! This test process's own resource limits.

use std::io;

/// Raises this process's soft limit of open files to at least `want` (at
/// most the hard limit); returns the limit before, for
/// [`restore_open_files_limit`].
pub fn raise_open_files_limit(want: libc::rlim_t) -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`, which we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(rc, 0, "getrlimit: {}", io::Error::last_os_error());
    let before = lim;
    if lim.rlim_cur < want {
        lim.rlim_cur = want.min(lim.rlim_max);
        // SAFETY: setrlimit only reads `lim`.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
        assert_eq!(rc, 0, "setrlimit: {}", io::Error::last_os_error());
    }
    before
}

/// Sets the open-files limit back to `before` (what
/// [`raise_open_files_limit`] returned); a failure is left be, as the next
/// test raises it again.
pub fn restore_open_files_limit(before: &libc::rlimit) {
    // SAFETY: setrlimit only reads `before`, which the caller owns.
    unsafe {
        libc::setrlimit(libc::RLIMIT_NOFILE, before);
    }
}
