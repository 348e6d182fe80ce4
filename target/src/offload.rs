//! Work too slow for a poller (the finite-field Diffie-Hellman of
//! DH-HMAC-CHAP: tens of milliseconds for the large groups) runs on one
//! worker thread of its own, so that a host authenticating, or a peer
//! claiming to be one, never stalls the queues of other hosts. The queue of
//! waiting jobs is bounded: past it, a job is dropped and its command sees
//! that (the transaction fails and the host may try again).
//!
//! A command waits for its job as for a backend operation: the job's end is
//! recorded in its poller's [`Completions`], which wakes the poller.

use crate::backend::Completions;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};

/// Jobs waiting for the worker at most. With ffdhe8192 (about 40 ms a job
/// here) a full queue is about 1.3 s of work, well inside the handshake
/// timeout of the hosts that wait for it.
const MAX_WAITING: usize = 32;

/// Work for the worker thread.
pub struct Job(Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl Job {
    /// Runs the job on this thread (tests).
    #[cfg(test)]
    pub fn run_here(self) {
        (self.0)()
    }

    /// Starts the job; `completions` then records `token` with 0 once it
    /// ran, or with -EBUSY at once when too many jobs are waiting (it is
    /// then dropped without running).
    pub fn start(self, token: u64, completions: &Arc<Completions>) {
        let done = completions.clone();
        let job = Box::new(move || {
            (self.0)();
            done.push(token, 0);
        });
        match worker().try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                completions.push(token, -libc::EBUSY)
            }
        }
    }
}

/// The result of a job, shared by the job and the one waiting for it.
pub struct Task<T>(Arc<Mutex<Option<T>>>);

impl<T: Send + 'static> Task<T> {
    /// A task that runs `f` on the worker once its [`Job`] is started.
    pub fn new(f: impl FnOnce() -> T + Send + 'static) -> (Task<T>, Job) {
        let cell = Arc::new(Mutex::new(None));
        let out = cell.clone();
        let job = Job(Box::new(move || {
            // Nobody waits any more (the queue went, the transaction
            // started over): the work is skipped.
            if Arc::strong_count(&out) > 1 {
                let r = f();
                *out.lock().expect("task lock") = Some(r);
            }
        }));
        (Task(cell), job)
    }

    /// The result, once the job ran; `None` before, or when it was dropped.
    pub fn take(&self) -> Option<T> {
        self.0.lock().expect("task lock").take()
    }
}

/// The worker's queue; the thread starts with the first job.
fn worker() -> &'static SyncSender<Box<dyn FnOnce() + Send>> {
    static WORKER: OnceLock<SyncSender<Box<dyn FnOnce() + Send>>> = OnceLock::new();
    WORKER.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel::<Box<dyn FnOnce() + Send>>(MAX_WAITING);
        let spawned = std::thread::Builder::new()
            .name("offload".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            });
        if let Err(e) = spawned {
            // The receiver is gone with the closure: every job is refused
            // (-EBUSY), and authentication fails with a reason in the log.
            tracing::error!("cannot start the offload thread: {e}");
        }
        tx
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmablk_common::ring::Wakeup;
    use std::time::Duration;

    /// Waits for `n` recorded ends.
    fn ends(completions: &Completions, n: usize) -> Vec<(u64, i32)> {
        let mut all = Vec::new();
        for _ in 0..1000 {
            let mut done = Vec::new();
            completions.take(&mut done);
            all.extend(done);
            if all.len() >= n {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        all.sort();
        all
    }

    // One test: the worker is the process's, and the second half fills it.
    #[test]
    fn jobs_run_off_the_poller_and_a_full_queue_refuses_more() {
        let completions = Completions::new(Wakeup::new().unwrap());
        let caller = std::thread::current().id();
        let (task, job) = Task::new(move || std::thread::current().id() != caller);
        assert_eq!(task.take(), None, "not run before it is started");
        job.start(7, &completions);
        assert_eq!(ends(&completions, 1), vec![(7, 0)]);
        assert_eq!(task.take(), Some(true), "ran on another thread");

        // The worker held by one job, MAX_WAITING more wait; the next is
        // refused at once and never runs.
        let (release, held) = mpsc::channel::<()>();
        let (_busy, job) = Task::new(move || held.recv().ok());
        job.start(100, &completions);
        std::thread::sleep(Duration::from_millis(50));
        let tasks: Vec<_> = (0..MAX_WAITING as u64)
            .map(|i| {
                let (t, job) = Task::new(move || i);
                job.start(i, &completions);
                t
            })
            .collect();
        let (refused, job) = Task::new(|| 0u64);
        job.start(999, &completions);
        assert_eq!(ends(&completions, 1), vec![(999, -libc::EBUSY)]);
        release.send(()).unwrap();
        let all = ends(&completions, MAX_WAITING + 1);
        assert_eq!(all.len(), MAX_WAITING + 1);
        assert!(all.iter().all(|&(_, res)| res == 0));
        for (i, t) in tasks.iter().enumerate() {
            assert_eq!(t.take(), Some(i as u64));
        }
        assert_eq!(refused.take(), None);

        // A job whose waiter is gone does no work.
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let (task, job) = Task::new(move || flag.store(true, std::sync::atomic::Ordering::Release));
        drop(task);
        job.run_here();
        assert!(!ran.load(std::sync::atomic::Ordering::Acquire));
    }
}
