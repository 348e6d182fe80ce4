//! Which of an endpoint's queues its poller pumps in a round: those that
//! had an event since their last pump (a socket or work completion, a
//! backend operation, a CM event, their adoption), those still at work at
//! their last pump (commands in progress, bytes to parse or to send, a
//! close under way), and every queue after a tick or a wake (deadlines,
//! asynchronous events, ended controllers, the stop). A quiet queue (an
//! idle host's) costs nothing per round, so a poller with a thousand idle
//! hosts serves a busy one as fast as it would alone.

/// The queues to pump next round, by index.
#[derive(Debug, Default)]
pub struct Ready {
    /// Whether each queue is listed (indices past the end: not).
    marked: Vec<bool>,
    list: Vec<u32>,
    /// Every queue, this round.
    all: bool,
}

impl Ready {
    /// Queue `idx` is pumped next round.
    pub fn mark(&mut self, idx: u32) {
        let i = idx as usize;
        if self.marked.len() <= i {
            self.marked.resize(i + 1, false);
        }
        if !self.marked[i] {
            self.marked[i] = true;
            self.list.push(idx);
        }
    }

    /// Every queue is pumped next round.
    pub fn mark_all(&mut self) {
        self.all = true;
    }

    /// Moves the queues to pump this round into `out` (every index below
    /// `len` after [`Ready::mark_all`]), and clears the marks: a queue
    /// still at work after its pump is marked again.
    pub fn take(&mut self, len: usize, out: &mut Vec<u32>) {
        out.clear();
        for &i in &self.list {
            self.marked[i as usize] = false;
        }
        if std::mem::take(&mut self.all) {
            out.extend(0..len as u32);
            self.list.clear();
        } else {
            out.append(&mut self.list);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_queues_come_once_and_are_cleared() {
        let mut r = Ready::default();
        let mut out = Vec::new();
        r.mark(5);
        r.mark(2);
        r.mark(5);
        r.take(8, &mut out);
        assert_eq!(out, [5, 2]);
        r.take(8, &mut out);
        assert!(out.is_empty(), "a queue not marked again is not pumped");
        r.mark(5);
        r.take(8, &mut out);
        assert_eq!(out, [5], "marks are cleared, so a queue can come again");
    }

    #[test]
    fn mark_all_covers_every_queue_once() {
        let mut r = Ready::default();
        let mut out = Vec::new();
        r.mark(1);
        r.mark_all();
        r.take(4, &mut out);
        assert_eq!(out, [0, 1, 2, 3]);
        r.take(4, &mut out);
        assert!(out.is_empty());
    }
}
