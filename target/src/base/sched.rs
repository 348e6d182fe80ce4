//! Threads that must not take the CPU from a poller the moment they wake:
//! a library's workers (librados, librbd) started under `SCHED_BATCH`.
//!
//! Under the kernel's fair scheduler a woken thread preempts the one
//! running on its CPU. A librbd completion thread sharing a CPU with the
//! poller it completes for would interrupt the poller for every reply,
//! finish one operation, wake the poller and switch back: two context
//! switches per I/O. A `SCHED_BATCH` thread gets the same share of CPU time
//! but waits for the poller to sleep or yield (the poller yields after
//! every few operations it hands over, `base::completions`, and between
//! rounds while such threads hold its operations), and then finishes every
//! reply that arrived in one go. On an idle CPU it runs at once, as before.

/// The calling thread under `SCHED_BATCH` until dropped, then back under
/// its own policy; threads it starts meanwhile keep `SCHED_BATCH` (Linux
/// threads inherit their creator's policy).
pub struct BatchThreads {
    previous: Option<libc::c_int>,
}

impl BatchThreads {
    /// Switches the calling thread; where that is refused (a seccomp
    /// filter, a real-time policy) the threads start under the usual one.
    pub fn enter() -> BatchThreads {
        // SAFETY: queries the calling thread's policy.
        let previous = unsafe { libc::sched_getscheduler(0) };
        if previous != libc::SCHED_OTHER {
            return BatchThreads { previous: None };
        }
        if let Err(e) = set_policy(libc::SCHED_BATCH) {
            tracing::debug!("SCHED_BATCH refused ({e}): library threads start under SCHED_OTHER");
            return BatchThreads { previous: None };
        }
        BatchThreads {
            previous: Some(previous),
        }
    }
}

impl Drop for BatchThreads {
    fn drop(&mut self) {
        if let Some(policy) = self.previous {
            if let Err(e) = set_policy(policy) {
                tracing::warn!("could not restore the thread's scheduling policy: {e}");
            }
        }
    }
}

fn set_policy(policy: libc::c_int) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: changes the calling thread's policy; `param` outlives the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: queries the calling thread's policy.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn threads_started_inside_keep_sched_batch_and_the_caller_gets_its_policy_back() {
        std::thread::spawn(|| {
            let before = policy();
            let child = {
                let _batch = BatchThreads::enter();
                assert_eq!(policy(), libc::SCHED_BATCH);
                std::thread::spawn(|| {
                    let inherited = policy();
                    // A thread of the library, started later, too.
                    let grandchild = std::thread::spawn(policy).join().unwrap();
                    (inherited, grandchild)
                })
            };
            assert_eq!(policy(), before);
            assert_eq!(
                child.join().unwrap(),
                (libc::SCHED_BATCH, libc::SCHED_BATCH)
            );
        })
        .join()
        .unwrap();
    }
}
