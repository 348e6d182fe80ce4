//! Ending the process on a panic, on any thread.

/// Makes a panic on any thread end the process once its message is
/// printed, as the release profile's `panic = "abort"` would: a daemon
/// with one I/O thread gone is half alive, and systemd restarts one that
/// ended. A hook rather than the profile setting, because `cargo test`
/// builds its harnesses (and so every dependency) with unwinding whatever
/// the profile says: with the setting, the suite compiled everything twice.
pub fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
}
