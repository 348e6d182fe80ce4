//! Work of many owners on a few threads whose number does not grow with
//! the owners: the lives of RBD namespaces' images, the changes of shared
//! reservation records, thousands of them on one gateway. Each owner
//! submits through its [`Lane`]: a lane's jobs run in order, never two at
//! once, and lanes take turns on their [`Workers`]' threads (one job each
//! per turn). A job that must wait (a retry, a poll) is scheduled for later
//! with [`Lane::submit_after`] rather than sleeping on a thread.
//!
//! A job that blocks (librbd opening an image while the cluster is out of
//! reach) holds one thread for that long: the threads of a pool are the
//! bound of such waits at once, and the other lanes wait their turn.

use std::collections::{BinaryHeap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

/// Work for a lane.
pub type Job = Box<dyn FnOnce() + Send>;

/// A pool of threads serving lanes; its threads start with its first job.
pub struct Workers {
    name: &'static str,
    threads: usize,
    /// Lanes with jobs, in turn.
    ready: Mutex<VecDeque<Arc<LaneInner>>>,
    has_ready: Condvar,
    /// Jobs scheduled for later.
    timers: Mutex<BinaryHeap<Timer>>,
    timers_changed: Condvar,
    started: Once,
}

/// A job due at a time.
struct Timer {
    at: Instant,
    seq: u64,
    lane: Lane,
    job: Job,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Timer {}

impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Timer {
    /// The earliest first out of the (max-)heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl Workers {
    /// A pool of `threads` threads named after `name`.
    pub const fn new(name: &'static str, threads: usize) -> Workers {
        Workers {
            name,
            threads,
            ready: Mutex::new(VecDeque::new()),
            has_ready: Condvar::new(),
            timers: Mutex::new(BinaryHeap::new()),
            timers_changed: Condvar::new(),
            started: Once::new(),
        }
    }

    /// Threads the pool runs (its timer's included).
    pub fn threads(&self) -> usize {
        self.threads + 1
    }

    fn start(&'static self) {
        self.started.call_once(|| {
            for i in 0..self.threads {
                let spawned = std::thread::Builder::new()
                    .name(format!("{}-{i}", self.name))
                    .spawn(move || self.serve());
                if let Err(e) = spawned {
                    tracing::error!(pool = self.name, "cannot start a worker thread: {e}");
                }
            }
            let spawned = std::thread::Builder::new()
                .name(format!("{}-timer", self.name))
                .spawn(move || self.keep_time());
            if let Err(e) = spawned {
                tracing::error!(pool = self.name, "cannot start the timer thread: {e}");
            }
        });
    }

    fn enqueue(&'static self, lane: Arc<LaneInner>) {
        self.start();
        lock(&self.ready).push_back(lane);
        self.has_ready.notify_one();
    }

    /// A worker: runs one job of the next lane, then puts the lane back at
    /// the end of the turn if it has more.
    fn serve(&'static self) {
        loop {
            let lane = {
                let mut ready = lock(&self.ready);
                loop {
                    match ready.pop_front() {
                        Some(l) => break l,
                        None => {
                            ready = self
                                .has_ready
                                .wait(ready)
                                .unwrap_or_else(PoisonError::into_inner)
                        }
                    }
                }
            };
            let job = lock(&lane.jobs).queue.pop_front();
            if let Some(job) = job {
                if catch_unwind(AssertUnwindSafe(job)).is_err() {
                    tracing::error!(pool = self.name, "a job panicked; its lane goes on");
                }
            }
            let mut jobs = lock(&lane.jobs);
            if jobs.queue.is_empty() {
                jobs.scheduled = false;
            } else {
                drop(jobs);
                lock(&self.ready).push_back(lane);
                self.has_ready.notify_one();
            }
        }
    }

    /// The timer: hands each scheduled job to its lane when it is due.
    fn keep_time(&'static self) {
        let mut timers = lock(&self.timers);
        loop {
            let now = Instant::now();
            match timers.peek().map(|t| t.at) {
                Some(at) if at <= now => {
                    let t = timers.pop().expect("peeked");
                    drop(timers);
                    t.lane.submit(t.job);
                    timers = lock(&self.timers);
                }
                Some(at) => {
                    timers = self
                        .timers_changed
                        .wait_timeout(timers, at - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => {
                    timers = self
                        .timers_changed
                        .wait(timers)
                        .unwrap_or_else(PoisonError::into_inner)
                }
            }
        }
    }
}

/// Runs `f` on every item of `items`, on `threads` scoped threads at most
/// (the items taken in turn): work for thousands of namespaces that waits
/// for the cluster, done in the time of a few waits rather than of all.
/// The errors, in no particular order.
pub fn in_parallel<T: Sync, E: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<(), E> + Sync,
) -> Vec<E> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.min(items.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                if let Err(e) = f(item) {
                    lock(&errors).push(e);
                }
            });
        }
    });
    errors.into_inner().unwrap_or_else(PoisonError::into_inner)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One owner's jobs on a pool: run in order, one at a time.
#[derive(Clone)]
pub struct Lane(Arc<LaneInner>);

struct LaneInner {
    workers: &'static Workers,
    jobs: Mutex<Jobs>,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
    /// In the pool's turn, or running.
    scheduled: bool,
}

impl Lane {
    /// A new lane on `workers`.
    pub fn new(workers: &'static Workers) -> Lane {
        Lane(Arc::new(LaneInner {
            workers,
            jobs: Mutex::default(),
        }))
    }

    /// Runs `job` after the lane's earlier jobs.
    pub fn submit(&self, job: Job) {
        let mut jobs = lock(&self.0.jobs);
        jobs.queue.push_back(job);
        if !std::mem::replace(&mut jobs.scheduled, true) {
            drop(jobs);
            self.0.workers.enqueue(self.0.clone());
        }
    }

    /// Submits `job` once `delay` has passed.
    pub fn submit_after(&self, delay: Duration, job: Job) {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let w = self.0.workers;
        w.start();
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&w.timers).push(Timer {
            at: Instant::now() + delay,
            seq,
            lane: self.clone(),
            job,
        });
        w.timers_changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    static POOL: Workers = Workers::new("test-lanes", 3);

    #[test]
    fn a_lane_runs_its_jobs_in_order_one_at_a_time() {
        let lane = Lane::new(&POOL);
        let running = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        for i in 0..50 {
            let (running, tx) = (running.clone(), tx.clone());
            lane.submit(Box::new(move || {
                assert_eq!(
                    running.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two jobs at once"
                );
                std::thread::sleep(Duration::from_micros(200));
                running.fetch_sub(1, Ordering::SeqCst);
                tx.send(i).unwrap();
            }));
        }
        let got: Vec<i32> = (0..50)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn many_lanes_share_the_pool_and_a_blocked_one_does_not_stop_the_others() {
        let (tx, rx) = mpsc::channel();
        let (release, blocked) = mpsc::channel::<()>();
        let slow = Lane::new(&POOL);
        slow.submit(Box::new(move || {
            let _ = blocked.recv_timeout(Duration::from_secs(10));
        }));
        for i in 0..200 {
            let tx = tx.clone();
            Lane::new(&POOL).submit(Box::new(move || tx.send(i).unwrap()));
        }
        let mut got: Vec<i32> = (0..200)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, (0..200).collect::<Vec<_>>());
        release.send(()).unwrap();
    }

    #[test]
    fn a_job_submitted_after_a_delay_runs_no_sooner() {
        let lane = Lane::new(&POOL);
        let (tx, rx) = mpsc::channel();
        let start = Instant::now();
        lane.submit_after(
            Duration::from_millis(80),
            Box::new(move || tx.send(Instant::now()).unwrap()),
        );
        let ran = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(ran - start >= Duration::from_millis(80));
    }

    #[test]
    fn in_parallel_runs_every_item_once_and_gathers_the_errors() {
        let items: Vec<u32> = (0..100).collect();
        let seen = Mutex::new(Vec::new());
        let errors = in_parallel(&items, 7, |&i| {
            seen.lock().unwrap().push(i);
            if i % 10 == 0 {
                Err(i)
            } else {
                Ok(())
            }
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, items);
        let mut errors = errors;
        errors.sort();
        assert_eq!(errors, (0..10).map(|i| i * 10).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_job_leaves_its_lane_working() {
        let lane = Lane::new(&POOL);
        let (tx, rx) = mpsc::channel();
        lane.submit(Box::new(|| panic!("a job's bug")));
        lane.submit(Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
}
