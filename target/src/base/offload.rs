//! Work too slow for a poller (the finite-field Diffie-Hellman of
//! DH-HMAC-CHAP: tens of milliseconds for the large groups) runs on one
//! worker thread of its own, so that a host authenticating, or a peer
//! claiming to be one, never stalls the queues of other hosts.
//!
//! Jobs wait in one queue per owner (the host NQN a job is for), served in
//! turn, so that one host's many jobs do not delay another's. At most
//! MAX_WAITING jobs wait in all; when a job arrives at a full queue, the
//! newest job of the owner with the most waiting is dropped, or the new
//! one if its owner has that many: one host cannot crowd the others out.
//! A dropped job's command sees that (the transaction fails, and the host
//! may try again).
//!
//! A command waits for its job as for a backend operation: the job's end is
//! recorded in its poller's [`Completions`], which wakes the poller.

use crate::base::completions::Completions;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

/// Jobs waiting for the worker at most. With ffdhe8192 (about 40 ms a job
/// here) a full queue is about 1.3 s of work, well inside the handshake
/// timeout of the hosts that wait for it.
const MAX_WAITING: usize = 32;

/// Work for the worker thread, and whom it is for.
pub struct Job {
    run: Box<dyn FnOnce() + Send>,
    owner: String,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("Job")
    }
}

/// A job in the queue, with where its end is recorded.
struct Waiting {
    run: Box<dyn FnOnce() + Send>,
    token: u64,
    completions: Arc<Completions>,
}

impl Waiting {
    /// Records that the job will not run.
    fn refuse(self) {
        self.completions.push(self.token, -libc::EBUSY);
    }
}

/// The waiting jobs: a queue per owner, owners served in turn.
#[derive(Default)]
struct Queues {
    by_owner: HashMap<String, VecDeque<Waiting>>,
    /// Owners with jobs waiting, in the order they are served.
    turn: VecDeque<String>,
    total: usize,
}

impl Queues {
    /// Queues `w` for `owner`; what is dropped instead when the queue is full.
    fn push(&mut self, owner: String, w: Waiting) -> Option<Waiting> {
        let mut dropped = None;
        if self.total >= MAX_WAITING {
            let mine = self.by_owner.get(&owner).map_or(0, VecDeque::len);
            let longest = self
                .by_owner
                .iter()
                .max_by_key(|(_, q)| q.len())
                .map(|(o, q)| (o.clone(), q.len()));
            match longest {
                Some((o, n)) if n > mine + 1 => {
                    dropped = self.by_owner.get_mut(&o).and_then(VecDeque::pop_back);
                    self.total -= 1;
                }
                _ => return Some(w),
            }
        }
        let q = self.by_owner.entry(owner.clone()).or_default();
        if q.is_empty() {
            self.turn.push_back(owner);
        }
        q.push_back(w);
        self.total += 1;
        dropped
    }

    /// The next job: the first of the owner whose turn it is.
    fn pop(&mut self) -> Option<Waiting> {
        while let Some(owner) = self.turn.pop_front() {
            let Some(q) = self.by_owner.get_mut(&owner) else {
                continue;
            };
            let w = q.pop_front();
            if q.is_empty() {
                self.by_owner.remove(&owner);
            } else {
                self.turn.push_back(owner);
            }
            if let Some(w) = w {
                self.total -= 1;
                return Some(w);
            }
        }
        None
    }
}

/// The queues and the worker that serves them.
struct Worker {
    queues: Mutex<Queues>,
    ready: Condvar,
    /// The thread could not be started: every job is refused.
    absent: bool,
}

impl Job {
    /// Runs the job on this thread (tests).
    #[cfg(test)]
    pub fn run_here(self) {
        (self.run)()
    }

    /// Starts the job; `completions` then records `token` with 0 once it
    /// ran, or with -EBUSY when it is dropped without running (see the
    /// module's documentation).
    pub fn start(self, token: u64, completions: &Arc<Completions>) {
        let w = Waiting {
            run: self.run,
            token,
            completions: completions.clone(),
        };
        let worker = worker();
        if worker.absent {
            return w.refuse();
        }
        let dropped = {
            let mut q = worker.queues.lock().unwrap_or_else(PoisonError::into_inner);
            q.push(self.owner, w)
        };
        worker.ready.notify_one();
        if let Some(d) = dropped {
            d.refuse();
        }
    }
}

/// The result of a job, shared by the job and the one waiting for it.
pub struct Task<T>(Arc<Mutex<Option<T>>>);

impl<T: Send + 'static> Task<T> {
    /// A task of `owner` that runs `f` on the worker once its [`Job`] is
    /// started.
    pub fn new(owner: &str, f: impl FnOnce() -> T + Send + 'static) -> (Task<T>, Job) {
        let cell = Arc::new(Mutex::new(None));
        let out = cell.clone();
        let run = Box::new(move || {
            // Nobody waits any more (the queue went, the transaction
            // started over): the work is skipped.
            if Arc::strong_count(&out) > 1 {
                let r = f();
                *out.lock().expect("task lock") = Some(r);
            }
        });
        let owner = owner.to_string();
        (Task(cell), Job { run, owner })
    }

    /// The result, once the job ran; `None` before, or when it was dropped.
    pub fn take(&self) -> Option<T> {
        self.0.lock().expect("task lock").take()
    }
}

/// The worker; its thread starts with the first job.
fn worker() -> &'static Worker {
    static WORKER: OnceLock<Worker> = OnceLock::new();
    WORKER.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("offload".into())
            .spawn(serve);
        if let Err(e) = &spawned {
            tracing::error!(
                "cannot start the offload thread: {e}; authentication with a DH group fails"
            );
        }
        Worker {
            queues: Mutex::new(Queues::default()),
            ready: Condvar::new(),
            absent: spawned.is_err(),
        }
    })
}

/// The worker thread: runs jobs as they come, owners in turn.
fn serve() {
    let w = worker();
    loop {
        let job = {
            let mut q = w.queues.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(job) = q.pop() {
                    break job;
                }
                q = w.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        (job.run)();
        job.completions.push(job.token, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmablk_common::ring::Wakeup;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
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

    // One test: the worker is the process's, and the second part fills it.
    #[test]
    fn jobs_run_off_the_poller_owners_in_turn_and_one_owner_cannot_crowd_out_another() {
        let completions = Completions::new(Wakeup::new().unwrap());
        let caller = std::thread::current().id();
        let (task, job) = Task::new("a", move || std::thread::current().id() != caller);
        assert_eq!(task.take(), None, "not run before it is started");
        job.start(7, &completions);
        assert_eq!(ends(&completions, 1), vec![(7, 0)]);
        assert_eq!(task.take(), Some(true), "ran on another thread");

        // The worker held by one job, owner "a" fills the queue.
        let (release, held) = mpsc::channel::<()>();
        let (_holder, job) = Task::new("holder", move || held.recv().ok());
        job.start(1000, &completions);
        std::thread::sleep(Duration::from_millis(50));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let mut start = |owner: &str, token: u64| {
            let order = order.clone();
            let (t, job) = Task::new(owner, move || {
                order.lock().unwrap().push(token);
                token
            });
            job.start(token, &completions);
            tasks.push((token, t));
        };
        for i in 0..MAX_WAITING as u64 {
            start("a", i);
        }
        // Owner "b" arrives at a full queue: "a"'s newest job makes room.
        start("b", 500);
        // "a" again: it has the most waiting, so its new job is refused.
        start("a", 501);
        let last_a = MAX_WAITING as u64 - 1;
        assert_eq!(
            ends(&completions, 2),
            vec![(last_a, -libc::EBUSY), (501, -libc::EBUSY)]
        );
        release.send(()).unwrap();
        let all = ends(&completions, MAX_WAITING + 1);
        assert_eq!(all.len(), MAX_WAITING + 1, "the holder and 32 jobs ran");
        assert!(all.iter().all(|&(_, res)| res == 0));
        // Owners in turn: "b" right after "a"'s first job.
        assert_eq!(order.lock().unwrap()[..2], [0, 500]);
        for (token, t) in &tasks {
            let ran = *token != last_a && *token != 501;
            assert_eq!(t.take(), ran.then_some(*token), "job {token}");
        }

        // A job whose waiter is gone does no work.
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let (task, job) = Task::new("a", move || flag.store(true, Ordering::Release));
        drop(task);
        job.run_here();
        assert!(!ran.load(Ordering::Acquire));
    }
}
