//! One connection once set up: a queue of frames to send, drained by a writer,
//! and a reader that delivers whole frames to the endpoint's inbox.
//!
//! The endpoint holds a [`Conn`]; the connection's task holds the matching
//! [`ConnTask`]. Dropping the `Conn` stops the connection: its writer and reader
//! end at their next await and the socket closes. That is how the endpoint resets
//! a connection, replaces it, or shuts everything down.

use crate::tls::Link;
use bytes::BytesMut;
use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use weir_core::buf::BufPool;
use weir_core::wire::{DecodeError, Frame, Message, HEADER_BYTES};
use weir_core::NodeId;

/// What a queued frame costs the send budget beyond its bytes: the channel slot and
/// the `Bytes` handle. It also bounds how many empty frames a queue can hold.
pub(crate) const FRAME_OVERHEAD_BYTES: usize = 64;
/// Frames queued on one connection at most (besides the byte budget): many small
/// frames (acks, heartbeats) cannot take unbounded slots.
pub(crate) const SEND_QUEUE_FRAMES_MAX: usize = 16_384;
/// Most frames the writer hands the kernel in one vectored write (two slices
/// each, well under Linux's IOV_MAX of 1024).
const BATCH_FRAMES_MAX: usize = 64;
/// The reader's buffer: small frames (acks, heartbeats) arrive many to a read;
/// large bodies bypass it and land straight in their own buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Identifies one connection for its whole life, so a task that ends never tears
/// down the connection that replaced it.
pub(crate) type ConnId = u64;

/// The endpoint's handle on a connection (being dialed, or set up).
#[derive(Debug)]
pub(crate) struct Conn {
    /// This connection.
    pub(crate) id: ConnId,
    frames: mpsc::Sender<Frame>,
    /// Bytes queued and not yet written to the socket (with per-frame overhead).
    queued_bytes: Arc<AtomicUsize>,
    /// Since when the queue has refused frames without making room (reset when it
    /// takes one).
    pub(crate) full_since: Option<tokio::time::Instant>,
    /// Never sent on: dropping it is the stop signal.
    _stop: watch::Sender<()>,
}

/// The connection task's side of a [`Conn`].
#[derive(Debug)]
pub(crate) struct ConnTask {
    /// This connection.
    pub(crate) id: ConnId,
    frames: mpsc::Receiver<Frame>,
    queued_bytes: Arc<AtomicUsize>,
    stop: watch::Receiver<()>,
    /// Notified when the writer has made room (senders waiting in `writable`).
    space: Arc<tokio::sync::Notify>,
}

/// Outcome of queueing a frame on a connection.
#[derive(Debug)]
pub(crate) enum Push {
    /// Queued for the writer.
    Queued,
    /// Not queued: the queue is full (in bytes or in frames); the frame is
    /// handed back.
    Full(Frame),
    /// Not queued: the connection's task has ended; the frame is handed back.
    Gone(Frame),
}

/// Why a connection ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The endpoint dropped its [`Conn`] or shut down.
    Stopped,
    /// Writing to the socket failed.
    Write(io::Error),
    /// The peer closed the connection cleanly, between frames.
    PeerClosed,
    /// Reading from the socket failed.
    Read(io::Error),
    /// The peer sent a header that is not a valid frame header: the stream can no
    /// longer be trusted to be in sync.
    BadHeader(DecodeError),
}

/// A new connection's two sides.
pub(crate) fn pair(id: ConnId, space: Arc<tokio::sync::Notify>) -> (Conn, ConnTask) {
    let (frames_tx, frames_rx) = mpsc::channel(SEND_QUEUE_FRAMES_MAX);
    let (stop_tx, stop_rx) = watch::channel(());
    let queued_bytes = Arc::new(AtomicUsize::new(0));
    let conn = Conn {
        id,
        frames: frames_tx,
        queued_bytes: Arc::clone(&queued_bytes),
        full_since: None,
        _stop: stop_tx,
    };
    let task = ConnTask {
        id,
        frames: frames_rx,
        queued_bytes,
        stop: stop_rx,
        space,
    };
    (conn, task)
}

impl Conn {
    /// Queue `frame` unless that would take the queue past `budget_bytes` or
    /// [`SEND_QUEUE_FRAMES_MAX`]. An empty queue takes any frame, so a budget below
    /// one frame cannot wedge a peer. Never waits.
    pub(crate) fn push(&mut self, frame: Frame, budget_bytes: usize) -> Push {
        if !self.takes(frame.len(), budget_bytes) {
            self.full_since
                .get_or_insert_with(tokio::time::Instant::now);
            return Push::Full(frame);
        }
        let cost = frame.len() + FRAME_OVERHEAD_BYTES;
        self.queued_bytes.fetch_add(cost, Ordering::AcqRel);
        match self.frames.try_send(frame) {
            Ok(()) => {
                self.full_since = None;
                Push::Queued
            }
            Err(mpsc::error::TrySendError::Full(frame)) => {
                self.queued_bytes.fetch_sub(cost, Ordering::AcqRel);
                self.full_since
                    .get_or_insert_with(tokio::time::Instant::now);
                Push::Full(frame)
            }
            Err(mpsc::error::TrySendError::Closed(frame)) => {
                self.queued_bytes.fetch_sub(cost, Ordering::AcqRel);
                Push::Gone(frame)
            }
        }
    }

    /// Whether the queue takes a frame of `len` bytes now.
    pub(crate) fn takes(&self, len: usize, budget_bytes: usize) -> bool {
        let queued_bytes = self.queued_bytes.load(Ordering::Acquire);
        let cost = len + FRAME_OVERHEAD_BYTES;
        (queued_bytes == 0 || queued_bytes + cost <= budget_bytes) && self.frames.capacity() > 0
    }

    /// Bytes queued and not yet written to the socket.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued_bytes.load(Ordering::Acquire)
    }
}

impl ConnTask {
    /// Resolves once the endpoint has dropped the matching [`Conn`].
    pub(crate) async fn stopped(&mut self) {
        // Nothing is ever sent, so this only returns when the sender is dropped.
        while self.stop.changed().await.is_ok() {}
    }
}

/// Run a set-up connection until it ends: the writer here, the reader in its own
/// task (so reading and writing proceed on different worker threads). Frames read
/// go to `inbox` tagged with `peer`. Whichever side ends first ends the other.
pub(crate) async fn run(
    stream: Link,
    peer: NodeId,
    task: ConnTask,
    inbox: mpsc::Sender<(NodeId, Frame)>,
    pool: BufPool,
    shutdown: watch::Receiver<bool>,
) -> End {
    match stream {
        // A plain socket splits into owned halves: the writer's half closing
        // sends the FIN at once.
        Link::Plain(tcp) => {
            let (r, w) = tcp.into_split();
            run_halves(r, w, peer, task, inbox, pool, shutdown).await
        }
        Link::Tls(tls) => {
            let (r, w) = tokio::io::split(tls);
            run_halves(r, w, peer, task, inbox, pool, shutdown).await
        }
    }
}

async fn run_halves<R, W>(
    read_half: R,
    write_half: W,
    peer: NodeId,
    mut task: ConnTask,
    inbox: mpsc::Sender<(NodeId, Frame)>,
    pool: BufPool,
    mut shutdown: watch::Receiver<bool>,
) -> End
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send,
{
    let mut reader = AbortOnDrop(tokio::spawn(read_frames(read_half, peer, inbox, pool)));
    let end = {
        let ConnTask {
            frames,
            queued_bytes,
            stop,
            space,
            ..
        } = &mut task;
        tokio::select! {
            result = write_frames(write_half, frames, queued_bytes, space) => match result {
                Ok(()) => End::Stopped,
                Err(e) => End::Write(e),
            },
            joined = &mut reader.0 => joined.unwrap_or(End::Stopped),
            _ = async { while stop.changed().await.is_ok() {} } => End::Stopped,
            _ = shutdown.wait_for(|closed| *closed) => End::Stopped,
        }
    };
    // Dropping `reader` ends the reader task if the writer side ended first.
    end
}

/// Aborts its task when dropped, so a reader never outlives its writer (even if
/// the future running them is dropped rather than run to the end).
struct AbortOnDrop(tokio::task::JoinHandle<End>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Write queued frames until the queue's sender is dropped or the socket fails.
/// Frames go to the kernel in batches by vectored writes straight from their own
/// buffers: payload bytes are never copied in user space.
async fn write_frames<W: AsyncWrite + Unpin>(
    mut socket: W,
    frames: &mut mpsc::Receiver<Frame>,
    queued_bytes: &AtomicUsize,
    space: &tokio::sync::Notify,
) -> io::Result<()> {
    let mut batch: Vec<Frame> = Vec::with_capacity(BATCH_FRAMES_MAX);
    loop {
        if frames.recv_many(&mut batch, BATCH_FRAMES_MAX).await == 0 {
            return Ok(());
        }
        write_all_vectored(&mut socket, &batch).await?;
        let cost: usize = batch.iter().map(|f| f.len() + FRAME_OVERHEAD_BYTES).sum();
        queued_bytes.fetch_sub(cost, Ordering::AcqRel);
        space.notify_waiters();
        batch.clear();
    }
}

/// Write every byte of `frames`, in order, with as few system calls as the kernel
/// allows.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    socket: &mut W,
    frames: &[Frame],
) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = frames
        .iter()
        .flat_map(|f| [IoSlice::new(&f.head), IoSlice::new(&f.payload)])
        .collect();
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    // Drops leading empty slices, so an all-empty batch writes nothing.
    IoSlice::advance_slices(&mut rest, 0);
    while !rest.is_empty() {
        let written = socket.write_vectored(rest).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, written);
    }
    // TLS may hold the last records until flushed; plain TCP holds nothing.
    socket.flush().await
}

/// Read whole frames and deliver them until the peer closes, the socket fails or a
/// header is invalid. A frame costs at most one maximum-size body of memory before
/// it is delivered: the header's lengths are checked against `MAX_BODY_BYTES`
/// before any buffer is allocated. A payload is read straight into page-aligned
/// memory from `pool` (what O_DIRECT and a DMA mapping need), the one copy of it
/// on this side, counted in [`weir_core::copies`]. Waits on the bounded inbox when
/// the node is slow, which stops reading and lets TCP flow control push back on
/// the peer.
async fn read_frames<R: AsyncRead + Unpin>(
    socket: R,
    peer: NodeId,
    inbox: mpsc::Sender<(NodeId, Frame)>,
    pool: BufPool,
) -> End {
    let mut socket = BufReader::with_capacity(READ_BUFFER_BYTES, socket);
    loop {
        match read_frame(&mut socket, &pool).await {
            Ok(Some(frame)) => {
                if inbox.send((peer, frame)).await.is_err() {
                    // The endpoint is gone.
                    return End::Stopped;
                }
            }
            Ok(None) => return End::PeerClosed,
            Err(end) => return end,
        }
    }
}

/// One frame (header, control part, payload), or `None` if the peer closed the
/// stream cleanly before the first byte of a header.
async fn read_frame<R: AsyncRead + Unpin>(
    socket: &mut BufReader<R>,
    pool: &BufPool,
) -> Result<Option<Frame>, End> {
    let mut header = [0u8; HEADER_BYTES];
    let first = socket.read(&mut header).await.map_err(End::Read)?;
    if first == 0 {
        return Ok(None);
    }
    socket
        .read_exact(&mut header[first..])
        .await
        .map_err(End::Read)?;
    let (control_len, payload_len) = Message::frame_lens(&header).map_err(End::BadHeader)?;
    let head_len = HEADER_BYTES + control_len;
    let mut head = BytesMut::with_capacity(head_len);
    head.extend_from_slice(&header);
    while head.len() < head_len {
        // `limit` keeps the read inside this frame even if the allocation is larger.
        let want = head_len - head.len();
        let read = socket
            .read_buf(&mut bytes::BufMut::limit(&mut head, want))
            .await
            .map_err(End::Read)?;
        if read == 0 {
            return Err(End::Read(io::ErrorKind::UnexpectedEof.into()));
        }
    }
    let payload = if payload_len == 0 {
        bytes::Bytes::new()
    } else {
        weir_core::copies::note(payload_len, weir_core::copies::Copy::Receive);
        match pool.alloc(payload_len) {
            Ok(mut buf) => {
                socket.read_exact(buf.as_mut()).await.map_err(End::Read)?;
                buf.freeze()
            }
            Err(_) => {
                // The pool is spent (payloads the node still holds): take plain
                // memory; a device that needs alignment copies it (and counts).
                let mut plain = vec![0u8; payload_len];
                socket.read_exact(&mut plain).await.map_err(End::Read)?;
                plain.into()
            }
        }
    };
    Ok(Some(Frame {
        head: head.freeze(),
        payload,
        local: None,
    }))
}
