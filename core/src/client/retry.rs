//! A request's retries: which errors a retry may cure ([`ClientError::retryable`]),
//! how long each attempt waits for its reply, the pause between attempts, and
//! when the request gives up ([`Attempts`]).

use crate::device::DevError;
use crate::error::WeirError;
use crate::transport::TransportError;
use crate::wire::EncodeError;
use std::time::Duration;

/// How long a request's first attempt waits for its reply: well above a
/// loaded device's latency (a shorter one turns overload into a retry storm),
/// well below the time a failover takes to be noticed by clients anyway.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(250);
/// Each attempt of a request that timed out waits twice as long as the one
/// before, up to this: a cluster that is slow (an emulated guest, a node
/// rebuilding) is waited for, not hammered with copies of the request.
pub const CALL_TIMEOUT_MAX: Duration = Duration::from_secs(4);
/// How long a request keeps retrying before it fails, unless its client was
/// opened with another bound (`ClientOptions::request_timeout`): longer than
/// any failover, restart or rebuild weir tolerates takes, and longer than the
/// Linux block layer's 30 s command timeout, so a kernel client (or qemu)
/// decides what to do with a slow device before weir fails a request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
pub use crate::wire::REQUEST_TIMEOUT_MAX;
/// Pause before a request's first retry; it doubles with every retry of the
/// request, up to [`RETRY_BACKOFF_MAX`].
const RETRY_BACKOFF: Duration = Duration::from_millis(5);
/// The longest pause between two attempts of a request: a failover's new map
/// is taken at most this late.
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(50);

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The cluster answered with an error.
    #[error(transparent)]
    Weir(#[from] WeirError),
    /// The request could not be sent.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The request could not be encoded (too large).
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The reply did not match the request (a protocol violation by the node).
    #[error("unexpected reply {0}")]
    UnexpectedReply(&'static str),
    /// The reply task stopped: the transport closed.
    #[error("client closed")]
    Closed,
    /// No reply in time.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// A named volume's block has no pool block: its extent was never
    /// written (a write allocates it first), or the volume is gone.
    #[error("{0}")]
    Unmapped(String),
    /// A named volume's block changed hands while a write of it ran: the
    /// write is to be sent again, as a new request, where it is now.
    #[error("the block moved to another pool extent while written")]
    Moved,
    /// A named volume's write needs a pool extent and the pool has none.
    #[error("no space: {0}")]
    NoSpace(String),
    /// The request kept meeting errors a retry may cure until its bound ran
    /// out: the last of them.
    #[error("gave up after {after:?} and {attempts} attempts: {last}")]
    GaveUp {
        /// The request's bound.
        after: Duration,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: Box<ClientError>,
    },
}

impl ClientError {
    /// True for errors a newer map, a later attempt or a moment's wait may
    /// cure: everything but a request that is wrong in itself, a full pool, a
    /// volume that is gone and a client that closed.
    pub fn retryable(&self) -> bool {
        match self {
            ClientError::Timeout(_) => true,
            ClientError::Weir(e) => match e {
                WeirError::NotPrimary(_)
                | WeirError::StaleEpoch { .. }
                | WeirError::Busy
                | WeirError::NoLease(_)
                | WeirError::Unreachable(_)
                // A replica that was sent no payload: the primary drops it
                // and the write goes again.
                | WeirError::PayloadNotHeld
                // A version refused by a replica: a map change is on its way.
                | WeirError::VersionRegression => true,
                // The primary's device is gone or stalled (it stops
                // heartbeating and its extents fail over), or could not read a
                // block that a peer repairs.
                WeirError::Device(d) => matches!(d, DevError::Media(_) | DevError::Timeout | DevError::Gone),
                WeirError::UnknownVolume(_)
                | WeirError::OutOfRange { .. }
                | WeirError::BadLength { .. }
                | WeirError::CrossesExtent => false,
            },
            // A connection down (a peer restarting) comes back; a frame too
            // large never fits.
            ClientError::Transport(t) => !matches!(t, TransportError::FrameTooLarge { .. }),
            ClientError::Encode(_)
            | ClientError::UnexpectedReply(_)
            | ClientError::Closed
            // The named layer resolves a move itself, as a new request.
            | ClientError::Moved
            | ClientError::Unmapped(_)
            | ClientError::NoSpace(_)
            | ClientError::GaveUp { .. } => false,
        }
    }

    /// True for errors every node's front end would give, so that a host with
    /// paths to several sends the request to no other: a request wrong in
    /// itself (past the volume's end, a bad length) or a full pool. An error
    /// a retry may cure, a request given up on (`GaveUp`: another node may
    /// still reach the primaries) and a volume this front end does not know
    /// (its map may be behind) are not.
    pub fn final_everywhere(&self) -> bool {
        match self {
            ClientError::Weir(e) => matches!(
                e,
                WeirError::OutOfRange { .. }
                    | WeirError::BadLength { .. }
                    | WeirError::CrossesExtent
            ),
            ClientError::NoSpace(_) => true,
            _ => false,
        }
    }

    /// A short name of the error's kind, for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientError::Weir(e) => match e {
                WeirError::UnknownVolume(_) => "unknown_volume",
                WeirError::OutOfRange { .. } => "out_of_range",
                WeirError::BadLength { .. } | WeirError::CrossesExtent => "bad_request",
                WeirError::NotPrimary(_) => "not_primary",
                WeirError::StaleEpoch { .. } => "stale_epoch",
                WeirError::VersionRegression => "version_regression",
                WeirError::Device(_) => "device",
                WeirError::Unreachable(_) => "unreachable",
                WeirError::Busy => "busy",
                WeirError::NoLease(_) => "no_lease",
                WeirError::PayloadNotHeld => "payload_not_held",
            },
            ClientError::Transport(_) => "transport",
            ClientError::Encode(_) => "encode",
            ClientError::UnexpectedReply(_) => "unexpected_reply",
            ClientError::Closed => "closed",
            ClientError::Timeout(_) => "timeout",
            ClientError::Unmapped(_) => "unmapped",
            ClientError::Moved => "moved",
            ClientError::NoSpace(_) => "no_space",
            ClientError::GaveUp { .. } => "gave_up",
        }
    }
}

/// A request's retries: when it gives up, how long its next attempt waits for
/// a reply and how long it pauses before that attempt.
#[derive(Clone, Copy, Debug)]
pub struct Attempts {
    started: tokio::time::Instant,
    bound: Duration,
    made: u32,
    call_timeout: Duration,
    backoff: Duration,
}

impl Attempts {
    /// A request started now, retrying for at most `bound`.
    pub fn new(bound: Duration) -> Self {
        Attempts {
            started: crate::time::now(),
            bound,
            made: 0,
            call_timeout: CALL_TIMEOUT,
            backoff: RETRY_BACKOFF,
        }
    }

    /// How long the next attempt waits for its reply: [`CALL_TIMEOUT`],
    /// doubled after each attempt that got none, up to [`CALL_TIMEOUT_MAX`]
    /// (a last attempt may so end that long past the bound).
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// Whether the request is past its bound.
    pub fn spent(&self) -> bool {
        crate::time::now() >= self.started + self.bound
    }

    /// Take `error` from the attempt just made: `Err` with the error to
    /// return if the request ends (not retryable, or its bound spent), else
    /// `Ok(pause)` before the next attempt.
    pub fn failed(&mut self, error: ClientError) -> Result<Duration, ClientError> {
        self.made += 1;
        if !error.retryable() {
            return Err(error);
        }
        if self.spent() {
            return Err(self.give_up(error));
        }
        if matches!(error, ClientError::Timeout(_)) {
            self.call_timeout = (self.call_timeout * 2).min(CALL_TIMEOUT_MAX);
        }
        let pause = self.backoff;
        self.backoff = (self.backoff * 2).min(RETRY_BACKOFF_MAX);
        Ok(pause)
    }

    /// Attempts made so far.
    pub fn made(&self) -> u32 {
        self.made
    }

    /// Count an attempt whose outcome shows elsewhere (a command asked of
    /// the control plane, seen applied or not in the map).
    pub fn note_attempt(&mut self) {
        self.made += 1;
    }

    /// The request's bound.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// The error a request returns when its bound ran out, `last` the error
    /// of its last attempt.
    pub fn give_up(&self, last: ClientError) -> ClientError {
        ClientError::GaveUp {
            after: self.bound,
            attempts: self.made,
            last: Box::new(last),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_wait_longer_after_each_timeout_and_give_up_past_the_bound() {
        let mut a = Attempts::new(Duration::from_secs(3600));
        assert_eq!(a.call_timeout(), CALL_TIMEOUT);
        // Timeouts double the next attempt's wait, up to the cap; pauses
        // double up to theirs.
        let mut pauses = Vec::new();
        for _ in 0..8 {
            pauses.push(a.failed(ClientError::Timeout(a.call_timeout())).unwrap());
        }
        assert_eq!(a.call_timeout(), CALL_TIMEOUT_MAX);
        assert_eq!(pauses[0], RETRY_BACKOFF);
        assert_eq!(pauses[1], RETRY_BACKOFF * 2);
        assert_eq!(*pauses.last().unwrap(), RETRY_BACKOFF_MAX);
        assert_eq!(a.made(), 8);
        // A refusal a newer map cures does not stretch the wait for a reply.
        let mut b = Attempts::new(Duration::from_secs(3600));
        b.failed(WeirError::NoLease(crate::ids::NodeId(1)).into())
            .unwrap();
        assert_eq!(b.call_timeout(), CALL_TIMEOUT);
        // What no retry cures ends the request at once, as it is.
        let bad = WeirError::OutOfRange {
            lba: crate::ids::Lba(9),
            blocks: 1,
            capacity: 8,
        };
        assert!(matches!(
            b.failed(bad.into()),
            Err(ClientError::Weir(WeirError::OutOfRange { .. }))
        ));
        // Past the bound, a retryable error ends it too, named.
        let mut c = Attempts::new(Duration::ZERO);
        let gave_up = c
            .failed(WeirError::Busy.into())
            .expect_err("a zero bound allows one attempt");
        assert_eq!(gave_up.kind(), "gave_up");
        assert!(!gave_up.retryable());
        // Given up here, it may still be answered through another node; a
        // request past the volume's end is refused by every node.
        assert!(!gave_up.final_everywhere());
        let bad: ClientError = WeirError::OutOfRange {
            lba: crate::ids::Lba(9),
            blocks: 1,
            capacity: 8,
        }
        .into();
        assert!(bad.final_everywhere());
        assert!(!ClientError::Closed.final_everywhere());
        let text = gave_up.to_string();
        assert!(
            text.contains("1 attempts") && text.contains("node busy"),
            "{text}"
        );
    }

    #[test]
    fn what_a_retry_may_cure() {
        let node = crate::ids::NodeId(2);
        for e in [
            ClientError::Timeout(CALL_TIMEOUT),
            WeirError::NotPrimary(node).into(),
            WeirError::NoLease(node).into(),
            WeirError::Unreachable(node).into(),
            WeirError::Busy.into(),
            WeirError::Device(DevError::Gone).into(),
            TransportError::UnknownPeer(node).into(),
        ] {
            assert!(e.retryable(), "{e}");
        }
        for e in [
            ClientError::Moved,
            ClientError::NoSpace("full".into()),
            ClientError::Closed,
            WeirError::Device(DevError::OutOfRange).into(),
            WeirError::Device(DevError::Misaligned).into(),
            TransportError::FrameTooLarge { len: 9, max: 8 }.into(),
        ] {
            assert!(!e.retryable(), "{e}");
        }
    }
}
