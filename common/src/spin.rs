//! How an I/O thread (a target poller, a host engine) waits when a round of
//! its loop found nothing to do: it keeps polling its ring (and RDMA CQs)
//! for a window after its last work, then sleeps in the ring. The window
//! adapts: it doubles when work arrives shortly after the thread went to
//! sleep (a longer spin would have saved that wake-up) and shrinks by an
//! eighth when a sleep is longer than any window (spinning would have been
//! for nothing), so a busy thread never sleeps between batches, a rare slow
//! round trip does not undo that, and an idle one costs no CPU. A polling
//! thread yields its CPU each round it finds nothing; when another thread
//! ran meanwhile, the CPU is shared and it sleeps at once: polling would
//! take the time of the very thread it may be waiting for.

use std::time::{Duration, Instant};

/// The bounds of the adaptive spin window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpinBounds {
    /// The window it starts from and shrinks back to.
    pub min: Duration,
    /// The window it grows to at most: the longest a thread polls after its
    /// last work. Zero: sleep as soon as a round finds nothing.
    pub max: Duration,
}

impl SpinBounds {
    /// The defaults: a wake-up costs several microseconds on virtual CPUs,
    /// and a round trip over NVMe/TCP on a data-centre network tens.
    pub const DEFAULT: SpinBounds = SpinBounds {
        min: Duration::from_micros(5),
        max: Duration::from_micros(100),
    };

    /// Never spins: sleep whenever a round finds nothing.
    pub const SLEEP: SpinBounds = SpinBounds {
        min: Duration::ZERO,
        max: Duration::ZERO,
    };

    /// Checks that `min` ≤ `max` and that a window that may grow starts above zero.
    pub fn new(min: Duration, max: Duration) -> Result<SpinBounds, String> {
        if max.is_zero() {
            return Ok(SpinBounds::SLEEP);
        }
        if min.is_zero() {
            return Err(format!(
                "the spin window's minimum must be above zero when its maximum is {max:?} \
                 (a window of zero never grows); give e.g. 5us, or a maximum of 0 to never spin"
            ));
        }
        if min > max {
            return Err(format!(
                "the spin window's minimum ({min:?}) is above its maximum ({max:?})"
            ));
        }
        if max > MAX_WINDOW {
            return Err(format!(
                "a spin window of {max:?} is longer than {MAX_WINDOW:?}: \
                 for a thread that never sleeps, use busy polling"
            ));
        }
        Ok(SpinBounds { min, max })
    }
}

/// A yield that took longer let another thread run on this CPU.
const YIELDED: Duration = Duration::from_micros(10);

/// The longest window accepted: beyond it, busy polling says what is meant.
const MAX_WINDOW: Duration = Duration::from_millis(10);

/// How an I/O thread waits for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// Never sleeps: one core busy whatever the load, the lowest latency.
    Busy,
    /// Polls for an adaptive window after its last work, then sleeps.
    Adaptive(SpinBounds),
}

impl Default for PollMode {
    fn default() -> Self {
        PollMode::Adaptive(SpinBounds::DEFAULT)
    }
}

/// One thread's spin window and what it did with it.
#[derive(Debug)]
pub struct Spin {
    mode: PollMode,
    window: Duration,
    /// When the thread last did work.
    last_work: Instant,
    /// Whether it went to sleep since.
    slept: bool,
    /// Times it went to sleep in the ring.
    sleeps: u64,
}

impl Spin {
    pub fn new(mode: PollMode) -> Spin {
        let window = match mode {
            PollMode::Busy => Duration::ZERO,
            PollMode::Adaptive(b) => b.min,
        };
        Spin {
            mode,
            window,
            last_work: Instant::now(),
            slept: false,
            sleeps: 0,
        }
    }

    /// Whether the thread must never sleep (it polls what it otherwise
    /// waits on, and need not arm wake-ups for it).
    pub fn busy(&self) -> bool {
        self.mode == PollMode::Busy
    }

    /// Whether a round that finds nothing may sleep at once (no spinning).
    fn never_spins(&self) -> bool {
        matches!(self.mode, PollMode::Adaptive(b) if b.max.is_zero())
    }

    /// After a round that did work (`worked`: I/O completions, commands,
    /// data; not timers) or not: whether the next round sleeps in the ring
    /// until something completes (true) or only polls (false).
    #[inline]
    pub fn sleep_next(&mut self, worked: bool) -> bool {
        let PollMode::Adaptive(bounds) = self.mode else {
            return false;
        };
        let now = Instant::now();
        let sleep = self.sleep_next_at(worked, now);
        if sleep || worked {
            return sleep;
        }
        // Polling on with nothing to do: a thread that is ready to run on
        // this CPU goes first. Alone on its CPU, this returns at once; if
        // another thread ran meanwhile, the CPU is shared (the target beside
        // an NBD export, an application beside its engine) and polling on
        // would take that thread's time: sleep, from the shortest window.
        std::thread::yield_now();
        if now.elapsed() > YIELDED {
            self.window = bounds.min;
            self.slept = true;
            self.sleeps += 1;
            return true;
        }
        false
    }

    /// [`Spin::sleep_next`] at `now`.
    fn sleep_next_at(&mut self, worked: bool, now: Instant) -> bool {
        let PollMode::Adaptive(bounds) = self.mode else {
            return false;
        };
        if self.never_spins() {
            if !worked {
                self.sleeps += 1;
            }
            return !worked;
        }
        if worked {
            if self.slept {
                // The idle time this work ended: a window that long would
                // have caught it without a wake-up.
                let idle = now.saturating_duration_since(self.last_work);
                self.window = if idle <= bounds.max {
                    (self.window * 2).min(bounds.max)
                } else {
                    (self.window - self.window / 8).max(bounds.min)
                };
                self.slept = false;
            }
            self.last_work = now;
            return false;
        }
        if self.slept || now.saturating_duration_since(self.last_work) >= self.window {
            if !self.slept {
                self.sleeps += 1;
            }
            self.slept = true;
            return true;
        }
        false
    }

    /// The window now.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Times the thread went to sleep in its ring: each costs a wake-up.
    pub fn sleeps(&self) -> u64 {
        self.sleeps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn spin_at(mode: PollMode, now: Instant) -> Spin {
        let mut s = Spin::new(mode);
        s.last_work = now;
        s
    }

    fn adaptive(min: u64, max: u64) -> PollMode {
        PollMode::Adaptive(SpinBounds::new(us(min), us(max)).unwrap())
    }

    #[test]
    fn a_thread_spins_for_its_window_after_work_then_sleeps() {
        let t0 = Instant::now();
        let mut s = spin_at(adaptive(5, 100), t0);
        assert!(!s.sleep_next_at(true, t0));
        assert!(
            !s.sleep_next_at(false, t0 + us(4)),
            "inside the 5 us window"
        );
        assert!(s.sleep_next_at(false, t0 + us(5)), "the window passed");
        assert!(
            s.sleep_next_at(false, t0 + us(900)),
            "woken by a timer: sleeps on"
        );
        assert_eq!(s.sleeps(), 1);
    }

    #[test]
    fn work_soon_after_a_sleep_grows_the_window_up_to_its_maximum() {
        let mut now = Instant::now();
        let mut s = spin_at(adaptive(5, 100), now);
        let mut windows = Vec::new();
        for _ in 0..7 {
            s.sleep_next_at(true, now);
            // Nothing until the window passed: the thread sleeps, and work
            // comes 30 us after the last (within the maximum).
            now += s.window();
            assert!(s.sleep_next_at(false, now));
            now += us(30) - s.window().min(us(30));
            s.sleep_next_at(true, now);
            windows.push(s.window().as_micros());
            if s.window() >= us(30) {
                break;
            }
        }
        assert_eq!(windows, [10, 20, 40]);
        // Work every 30 us is now caught spinning: no more sleeps.
        let sleeps = s.sleeps();
        for _ in 0..100 {
            now += us(30);
            assert!(!s.sleep_next_at(true, now));
            assert!(!s.sleep_next_at(false, now + us(29)));
        }
        assert_eq!(s.sleeps(), sleeps);
        // Work every 90 us grows it to the maximum and not beyond, where
        // it is caught spinning.
        for _ in 0..10 {
            if s.window() < us(90) {
                now += s.window();
                assert!(s.sleep_next_at(false, now));
                now += us(90) - s.window();
            } else {
                assert!(!s.sleep_next_at(false, now + us(89)));
                now += us(90);
            }
            s.sleep_next_at(true, now);
        }
        assert_eq!(s.window(), us(100));
    }

    #[test]
    fn long_sleeps_shrink_the_window_back_to_its_minimum() {
        let mut now = Instant::now();
        let mut s = spin_at(adaptive(5, 100), now);
        s.window = us(80);
        let mut windows = Vec::new();
        for _ in 0..22 {
            s.sleep_next_at(true, now);
            now += s.window();
            assert!(s.sleep_next_at(false, now));
            now += us(5000);
            s.sleep_next_at(true, now);
            windows.push(s.window().as_micros());
        }
        assert_eq!(windows[..3], [70, 61, 53]);
        assert_eq!(windows[19..], [5, 5, 5]);
    }

    #[test]
    fn busy_never_sleeps_and_a_zero_maximum_never_spins() {
        let t0 = Instant::now();
        let mut busy = spin_at(PollMode::Busy, t0);
        assert!(busy.busy());
        assert!(!busy.sleep_next_at(false, t0 + Duration::from_secs(5)));
        let mut sleepy = spin_at(PollMode::Adaptive(SpinBounds::SLEEP), t0);
        assert!(!sleepy.busy());
        assert!(!sleepy.sleep_next_at(true, t0));
        assert!(sleepy.sleep_next_at(false, t0));
        assert_eq!(sleepy.sleeps(), 1);
    }

    /// Pins the calling thread to `cpu`.
    fn pin(cpu: usize) {
        // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is below CPU_SETSIZE (it came from the thread's own set).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: pid 0 is the calling thread; the set is valid for its size.
        let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        assert_eq!(
            r,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }

    #[test]
    fn a_thread_that_shares_its_cpu_stops_polling() {
        // SAFETY: as in `pin`.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; the set is valid for its size.
        let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        assert_eq!(r, 0);
        // SAFETY: the index is below CPU_SETSIZE.
        let cpu = (0..libc::CPU_SETSIZE as usize)
            .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .expect("a CPU");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let other = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin(cpu);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        pin(cpu);
        // A 9 ms window: alone on its CPU the thread would poll all of it.
        let mut s = Spin::new(adaptive(9000, 9000));
        s.sleep_next(true);
        let t0 = Instant::now();
        let mut slept_after = None;
        while t0.elapsed() < Duration::from_millis(50) {
            if s.sleep_next(false) {
                slept_after = Some(t0.elapsed());
                break;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        other.join().expect("the other thread");
        let after = slept_after.expect("it never went to sleep");
        assert!(
            after < Duration::from_millis(9),
            "with another thread ready on its CPU it polled for {after:?}"
        );
        assert_eq!(s.sleeps(), 1);
    }

    #[test]
    fn bounds_are_checked() {
        assert_eq!(SpinBounds::new(us(0), us(0)), Ok(SpinBounds::SLEEP));
        assert_eq!(SpinBounds::new(us(50), us(0)), Ok(SpinBounds::SLEEP));
        assert!(SpinBounds::new(us(0), us(10))
            .unwrap_err()
            .contains("above zero"));
        assert!(SpinBounds::new(us(20), us(10))
            .unwrap_err()
            .contains("above its maximum"));
        assert!(SpinBounds::new(us(5), Duration::from_secs(1))
            .unwrap_err()
            .contains("busy polling"));
        assert_eq!(SpinBounds::new(us(5), us(100)), Ok(SpinBounds::DEFAULT));
    }
}
