//! The client's read window ([`ReadWindow`]) in async form: a read waits for its
//! turn, and its turn ends when it is answered or dropped.

use crate::flow::{FlowConfig, ReadFlowStats, ReadWindow, Turn};
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::sync::oneshot;

struct Inner {
    window: ReadWindow,
    next_ticket: u64,
    /// Whom to wake for each waiting ticket.
    wakers: BTreeMap<u64, oneshot::Sender<()>>,
}

/// One client's read window and the reads waiting for it.
pub(super) struct ReadFlow {
    inner: Mutex<Inner>,
    /// The origin of the window's clock.
    origin: tokio::time::Instant,
}

/// A read's turn: its bytes count in flight until [`ReadTurn::answered`], or
/// until it is dropped (the read was given up).
pub(super) struct ReadTurn<'a> {
    flow: &'a ReadFlow,
    bytes: u64,
    since: tokio::time::Instant,
    ended: bool,
}

/// A read waiting for its turn; dropped unwoken, it leaves the line.
struct Waiting<'a> {
    flow: &'a ReadFlow,
    ticket: u64,
    bytes: u64,
    armed: bool,
}

impl ReadFlow {
    pub(super) fn new(config: FlowConfig) -> Self {
        ReadFlow {
            inner: Mutex::new(Inner {
                window: ReadWindow::new(config),
                next_ticket: 0,
                wakers: BTreeMap::new(),
            }),
            origin: crate::time::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("read window lock")
    }

    fn now_ns(&self) -> u64 {
        (crate::time::now() - self.origin).as_nanos() as u64
    }

    /// Wait until a read of `bytes` may go.
    pub(super) async fn turn(&self, bytes: u64) -> ReadTurn<'_> {
        let (ticket, woken) = {
            let mut inner = self.lock();
            let ticket = inner.next_ticket;
            inner.next_ticket += 1;
            match inner.window.take(ticket, bytes) {
                Turn::Go => return self.went(bytes),
                Turn::Wait => {
                    let (tx, rx) = oneshot::channel();
                    inner.wakers.insert(ticket, tx);
                    (ticket, rx)
                }
            }
        };
        let mut waiting = Waiting {
            flow: self,
            ticket,
            bytes,
            armed: true,
        };
        // An error is the sender dropped without a wake, which `wake` never does.
        let _ = woken.await;
        waiting.armed = false;
        self.went(bytes)
    }

    fn went(&self, bytes: u64) -> ReadTurn<'_> {
        ReadTurn {
            flow: self,
            bytes,
            since: crate::time::now(),
            ended: false,
        }
    }

    fn wake(inner: &mut Inner, tickets: Vec<u64>) {
        for ticket in tickets {
            if let Some(tx) = inner.wakers.remove(&ticket) {
                // A waiter dropped meanwhile finds itself woken and gives its
                // bytes back (see `Waiting`'s drop).
                let _ = tx.send(());
            }
        }
    }

    pub(super) fn stats(&self) -> ReadFlowStats {
        self.lock().window.stats()
    }
}

impl ReadTurn<'_> {
    /// The read was answered; `marks` is the count of marked packets received
    /// over every path so far and `rtt_ns` the latest RTT sample towards the
    /// node that answered.
    pub(super) fn answered(mut self, marks: u64, rtt_ns: u64) {
        self.ended = true;
        let flow = self.flow;
        let response = (crate::time::now() - self.since).as_nanos() as u64;
        let now = flow.now_ns();
        let mut inner = flow.lock();
        inner.window.observe(marks, rtt_ns, now);
        let go = inner.window.done(self.bytes, response);
        ReadFlow::wake(&mut inner, go);
    }
}

impl Drop for ReadTurn<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let mut inner = self.flow.lock();
            let go = inner.window.abandon(self.bytes);
            ReadFlow::wake(&mut inner, go);
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut inner = self.flow.lock();
        let go = match inner.window.cancel(self.ticket) {
            Some(go) => {
                inner.wakers.remove(&self.ticket);
                go
            }
            // Woken already: its bytes were counted in flight.
            None => inner.window.abandon(self.bytes),
        };
        ReadFlow::wake(&mut inner, go);
    }
}
