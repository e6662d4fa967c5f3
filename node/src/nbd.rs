//! The NBD front end: the fixed-newstyle handshake and the transmission phase, so
//! that real clients (qemu, nbdcopy, nbdfuse, fio's nbd engine, the kernel's
//! nbd-client) use a weir volume with no weir code on their side.
//!
//! Handshake: `NBD_OPT_GO`, `NBD_OPT_INFO`, `NBD_OPT_LIST`, `NBD_OPT_ABORT`,
//! `NBD_OPT_STARTTLS` and the old `NBD_OPT_EXPORT_NAME`; every other option is
//! answered `NBD_REP_ERR_UNSUP` (so clients fall back to simple replies). Export
//! name = volume name.
//!
//! TLS ([`NbdTls`], `[nbd] tls`): STARTTLS is acknowledged, then the TLS
//! handshake runs on the same socket and option haggling starts again inside
//! it (nothing negotiated before carries over). With `require`, before TLS
//! every option but STARTTLS and ABORT is answered `NBD_REP_ERR_TLS_REQD`, and
//! `NBD_OPT_EXPORT_NAME` (which has no error reply) closes the connection.
//!
//! Transmission: READ, WRITE (with FUA), FLUSH, TRIM, WRITE_ZEROES, DISC, with
//! simple replies. Requests run concurrently (a client may have many in flight);
//! replies go out as they finish. Hostile input is bounded:
//! - an option payload is at most [`MAX_OPTION`] bytes, a request at most
//!   [`MAX_IO`]; a larger WRITE (its payload would follow) closes the connection,
//!   a larger READ gets `EINVAL`;
//! - a bad request magic closes the connection (the stream cannot be resynced);
//! - unknown commands and flags get `EINVAL`, ranges past the end `EINVAL`
//!   (reads) or `ENOSPC` (writes); a failed READ closes the connection after its
//!   error reply (a simple reply cannot stand in for the data the client expects);
//! - per connection at most [`MAX_INFLIGHT_BYTES`] of request data and
//!   [`MAX_INFLIGHT_REQUESTS`] requests are held, from the request until its reply
//!   is on the socket; the reader waits for room before it reads another request,
//!   so a client that floods requests, or never reads its replies, is slowed by
//!   TCP, not by the server's memory.
//!
//! The protocol is the NBD project's `proto.md`; numbers below are from it.

use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use tokio_real::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, ReadHalf, WriteHalf,
};
use tokio_real::net::{TcpListener, TcpStream};

mod handshake;
mod tls;
use handshake::handshake;
pub use tls::NbdTls;
use tokio_real::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Page-aligned memory for write payloads. Its own budget is no bound: each
/// connection's byte budget (held until the reply is sent) bounds what it holds.
static PAYLOAD_MEMORY: std::sync::LazyLock<weir_core::buf::BufPool> =
    std::sync::LazyLock::new(|| weir_core::buf::BufPool::new(usize::MAX / 2));

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
const CLIENT_FLAGS_KNOWN: u32 = 1 | 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_STARTTLS: u32 = 5;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
const REP_ERR_POLICY: u32 = (1 << 31) | 2;
const REP_ERR_INVALID: u32 = (1 << 31) | 3;
const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;
const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
const REP_ERR_TOO_BIG: u32 = (1 << 31) | 9;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

const TFLAG_HAS_FLAGS: u16 = 1;
const TFLAG_READ_ONLY: u16 = 1 << 1;
const TFLAG_SEND_FLUSH: u16 = 1 << 2;
const TFLAG_SEND_FUA: u16 = 1 << 3;
const TFLAG_SEND_TRIM: u16 = 1 << 5;
const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_FLAG_FUA: u16 = 1;
const CMD_FLAG_NO_HOLE: u16 = 2;

/// NBD error numbers (the protocol's, not the host's).
pub mod errno {
    /// Operation not permitted (a volume this node cannot open).
    pub const EPERM: u32 = 1;
    /// Input/output error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space left (a write past the end).
    pub const ENOSPC: u32 = 28;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// Largest option payload read during the handshake.
pub const MAX_OPTION: u32 = 4096;
/// Largest READ or WRITE (the protocol recommends clients stay at or below 32 MiB).
pub const MAX_IO: u32 = 32 << 20;
/// Request payload bytes held at once per connection.
pub const MAX_INFLIGHT_BYTES: u32 = 64 << 20;
/// Requests in flight at once per connection (until their replies are written).
pub const MAX_INFLIGHT_REQUESTS: usize = 256;
/// Preferred I/O size advertised (weir's block size). The minimum advertised is 1
/// byte: unaligned requests are served by read-modify-write (see `backend.rs`).
pub const BLOCK: u32 = 4096;

/// An export as the server lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// Its name (the volume's).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// An encrypted volume's key, when this node has it (the backend's
    /// business).
    pub key: Option<Arc<crate::crypt::VolumeKey>>,
    /// Why it cannot be opened here, if it cannot (`GO` and `INFO` answer
    /// `NBD_REP_ERR_POLICY` with this).
    pub locked: Option<String>,
    /// Served read-only (a snapshot): the flag says so, and writes, TRIM
    /// and WRITE_ZEROES get `EPERM`.
    pub read_only: bool,
    /// Which volume of that name it is (the backend's business: one deleted
    /// and made again under the name is another).
    pub id: Option<u64>,
}

/// What the NBD server serves. Offsets and lengths are checked against the
/// export's size before a call; errors are NBD error numbers ([`errno`]).
pub trait Backend: Send + Sync + 'static {
    /// Every export, in a stable order.
    fn exports(&self) -> Vec<Export>;
    /// Read `len` bytes at `offset`.
    fn read(
        &self,
        export: &Export,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Bytes, u32>> + Send;
    /// Write `data` at `offset`; with `fua`, durable before the reply.
    fn write(
        &self,
        export: &Export,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), u32>> + Send;
    /// Make every completed write durable.
    fn flush(&self, export: &Export) -> impl Future<Output = Result<(), u32>> + Send;
    /// Zero `len` bytes at `offset` (TRIM and WRITE_ZEROES).
    fn zero(
        &self,
        export: &Export,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> impl Future<Output = Result<(), u32>> + Send;
    /// Note one finished request (for metrics): command, bytes, latency.
    fn record(&self, _command: &'static str, _bytes: u64, _latency: std::time::Duration) {}
}

/// Serve NBD on `listener` until it fails; one task per client.
pub async fn serve<B: Backend>(
    listener: TcpListener,
    backend: Arc<B>,
    tls: NbdTls,
) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let (backend, tls) = (backend.clone(), tls.clone());
        tokio_real::spawn(async move {
            if let Err(e) = handle(stream, backend, &tls).await {
                tracing::info!(%peer, error = %e, "NBD client disconnected");
            }
        });
    }
}

/// Why a connection ended (all are the client's doing or the network's).
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The socket failed or the client went away.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The client broke the protocol; the server closed the connection.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The handshake took too long.
    #[error("handshake timed out")]
    Timeout,
}

/// How long a client has to finish the handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serve one client: handshake, then transmission.
pub async fn handle<B: Backend>(
    stream: TcpStream,
    backend: Arc<B>,
    tls: &NbdTls,
) -> Result<(), ConnError> {
    stream.set_nodelay(true)?;
    let (r, w) = halves(Box::new(stream));
    let (export, r, w) =
        match tokio_real::time::timeout(HANDSHAKE_TIMEOUT, handshake(r, w, &*backend, tls)).await {
            Ok(Ok(Some(done))) => done,
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ConnError::Timeout),
        };
    tracing::debug!(export = %export.name, "NBD transmission starts");
    transmission(r, w, backend, export).await
}

fn transmission_flags(export: &Export) -> u16 {
    // Multi-conn is true: a write is acknowledged once on every in-sync replica's
    // device, and FLUSH flushes every replica's device, so a flush on one
    // connection covers writes completed on any.
    let flags = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_CAN_MULTI_CONN;
    if export.read_only {
        flags | TFLAG_READ_ONLY
    } else {
        flags
    }
}

/// A client connection's bytes: plain TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

type Reader = BufReader<ReadHalf<Box<dyn Stream>>>;
type Writer = BufWriter<WriteHalf<Box<dyn Stream>>>;

fn halves(stream: Box<dyn Stream>) -> (Reader, Writer) {
    let (read, write) = tokio_real::io::split(stream);
    (BufReader::new(read), BufWriter::new(write))
}

/// A reply on its way to the writer task, with the budget it holds until written.
struct Reply {
    cookie: u64,
    error: u32,
    data: Option<Bytes>,
    /// Released once the reply is on the socket.
    _held: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    /// A failed READ: the connection closes after this reply (simple replies
    /// cannot carry an error in place of the data the client expects).
    close: bool,
}

/// The next request's header; `None` when the client hung up or the reply
/// writer ended (a failed READ, or the socket broke): stop reading.
async fn read_header(
    r: &mut Reader,
    tx: &mpsc::Sender<Reply>,
) -> Result<Option<[u8; 28]>, ConnError> {
    let mut header = [0u8; 28];
    let read = tokio_real::select! {
        r = r.read_exact(&mut header) => r,
        () = tx.closed() => return Ok(None),
    };
    match read {
        Ok(_) => Ok(Some(header)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A request's header.
#[derive(Clone, Copy, Debug)]
struct Header {
    flags: u16,
    command: u16,
    cookie: u64,
    offset: u64,
    len: u32,
}

/// A request's header; `None` for a disconnect; an error for a header that
/// ends the connection.
fn parse_request(header: &[u8; 28]) -> Result<Option<Header>, ConnError> {
    let magic = u32::from_be_bytes(header[0..4].try_into().expect("4"));
    let flags = u16::from_be_bytes(header[4..6].try_into().expect("2"));
    let command = u16::from_be_bytes(header[6..8].try_into().expect("2"));
    let cookie = u64::from_be_bytes(header[8..16].try_into().expect("8"));
    let offset = u64::from_be_bytes(header[16..24].try_into().expect("8"));
    let len = u32::from_be_bytes(header[24..28].try_into().expect("4"));
    if magic != REQUEST_MAGIC {
        return Err(ConnError::Protocol(format!("request magic {magic:#x}")));
    }
    if command == CMD_WRITE && len > MAX_IO {
        // Its payload follows and is too large to take: close.
        return Err(ConnError::Protocol(format!("write of {len} bytes")));
    }
    if command == CMD_DISC {
        return Ok(None);
    }
    Ok(Some(Header {
        flags,
        command,
        cookie,
        offset,
        len,
    }))
}

/// A write's payload of `len` bytes, read off the connection; none for
/// other commands. Page-aligned, so the device writes it as it is
/// (O_DIRECT): this read is the one copy of a write's data on its way to
/// the devices here. The caller's byte budget bounds it.
async fn read_payload(r: &mut Reader, command: u16, len: u32) -> std::io::Result<Option<Bytes>> {
    if command != CMD_WRITE {
        return Ok(None);
    }
    let mut buf = PAYLOAD_MEMORY
        .alloc(len as usize)
        .expect("the byte budget bounds payloads");
    r.read_exact(buf.as_mut()).await?;
    weir_core::copies::note(len as usize, weir_core::copies::Copy::Receive);
    Ok(Some(buf.freeze()))
}

/// Serve one request (`check`ed; a write's `payload`) and queue its reply on
/// `tx`, holding its slot and bytes until the reply is on the socket.
async fn serve_request<B: Backend>(
    backend: Arc<B>,
    export: Arc<Export>,
    Header {
        flags,
        command,
        cookie,
        offset,
        len,
    }: Header,
    (check, payload): (Result<(), u32>, Option<Bytes>),
    (tx, slot, bytes): (
        mpsc::Sender<Reply>,
        tokio_real::sync::OwnedSemaphorePermit,
        tokio_real::sync::OwnedSemaphorePermit,
    ),
) {
    let started = std::time::Instant::now();
    let (error, data) = match check {
        Err(e) => (e, None),
        Ok(()) => run(&*backend, &export, command, flags, offset, len, payload).await,
    };
    if error == 0 {
        backend.record(command_name(command), u64::from(len), started.elapsed());
    }
    let close = command == CMD_READ && error != 0;
    let _ = tx
        .send(Reply {
            cookie,
            error,
            data,
            _held: (slot, bytes),
            close,
        })
        .await;
}

async fn transmission<B: Backend>(
    mut r: Reader,
    w: Writer,
    backend: Arc<B>,
    export: Export,
) -> Result<(), ConnError> {
    // Every reply holds one of the connection's request slots until it is on the
    // socket, so the channel never holds more than MAX_INFLIGHT_REQUESTS.
    let (tx, rx) = mpsc::channel::<Reply>(MAX_INFLIGHT_REQUESTS);
    let writer = tokio_real::spawn(write_replies(w, rx));
    let budget = Arc::new(Semaphore::new(MAX_INFLIGHT_BYTES as usize));
    let slots = Arc::new(Semaphore::new(MAX_INFLIGHT_REQUESTS));
    let export = Arc::new(export);
    let result = loop {
        if tx.is_closed() {
            // The writer ended (a failed READ, or the socket broke).
            break Ok(());
        }
        let header = match read_header(&mut r, &tx).await {
            Ok(Some(header)) => header,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let request = match parse_request(&header) {
            Ok(Some(request)) => request,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let Header {
            flags,
            command,
            offset,
            len,
            ..
        } = request;
        // Hold room for the data each request makes: a write's payload (read
        // below), a read's reply, the zeroes a TRIM or WRITE_ZEROES sends; and a
        // slot, so that replies to cheap requests cannot pile up either. Both are
        // held until the reply is on the socket.
        let held = match command {
            CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES => len.min(MAX_IO),
            _ => 0,
        };
        let (Ok(slot), Ok(bytes)) = (
            slots.clone().acquire_owned().await,
            budget.clone().acquire_many_owned(held).await,
        ) else {
            break Ok(());
        };
        let payload = match read_payload(&mut r, command, len).await {
            Ok(payload) => payload,
            Err(e) => break Err(e.into()),
        };
        let check = check_request(command, flags, offset, len, export.size);
        let (backend, export, tx) = (backend.clone(), export.clone(), tx.clone());
        tokio_real::spawn(serve_request(
            backend,
            export,
            request,
            (check, payload),
            (tx, slot, bytes),
        ));
    };
    drop(tx);
    // Replies to requests already taken still go out (DISC waits for them).
    let _ = writer.await;
    result
}

fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "read",
        CMD_WRITE => "write",
        CMD_FLUSH => "flush",
        CMD_TRIM => "trim",
        CMD_WRITE_ZEROES => "write_zeroes",
        _ => "other",
    }
}

/// Check a request's command, flags and range; the NBD error if it is bad.
fn check_request(command: u16, flags: u16, offset: u64, len: u32, size: u64) -> Result<(), u32> {
    // FUA is accepted on every command once negotiated (it matters for writes).
    let allowed = match command {
        CMD_READ | CMD_FLUSH | CMD_TRIM | CMD_WRITE => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        _ => return Err(errno::EINVAL),
    };
    if flags & !allowed != 0 {
        return Err(errno::EINVAL);
    }
    if command == CMD_FLUSH {
        return Ok(());
    }
    if command == CMD_READ && len > MAX_IO {
        return Err(errno::EINVAL);
    }
    match offset.checked_add(u64::from(len)) {
        Some(end) if end <= size => Ok(()),
        _ if command == CMD_READ => Err(errno::EINVAL),
        _ => Err(errno::ENOSPC),
    }
}

async fn run<B: Backend>(
    backend: &B,
    export: &Export,
    command: u16,
    flags: u16,
    offset: u64,
    len: u32,
    payload: Option<Bytes>,
) -> (u32, Option<Bytes>) {
    let fua = flags & CMD_FLAG_FUA != 0;
    if len == 0 && command != CMD_FLUSH {
        return (0, (command == CMD_READ).then(Bytes::new));
    }
    let result = match command {
        CMD_READ => {
            return match backend.read(export, offset, len).await {
                Ok(data) if data.len() == len as usize => (0, Some(data)),
                Ok(_) => (errno::EIO, None),
                Err(e) => (e, None),
            }
        }
        CMD_WRITE => {
            backend
                .write(export, offset, payload.unwrap_or_default(), fua)
                .await
        }
        CMD_FLUSH => backend.flush(export).await,
        CMD_TRIM | CMD_WRITE_ZEROES => backend.zero(export, offset, len, fua).await,
        _ => Err(errno::EINVAL),
    };
    (result.err().unwrap_or(0), None)
}

async fn write_replies(mut w: Writer, mut rx: mpsc::Receiver<Reply>) -> std::io::Result<()> {
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        // Batch whatever is ready into one flush.
        while let Some(reply) = next {
            w.write_u32(SIMPLE_REPLY_MAGIC).await?;
            w.write_u32(reply.error).await?;
            w.write_u64(reply.cookie).await?;
            if let (0, Some(data)) = (reply.error, &reply.data) {
                w.write_all(data).await?;
            }
            if reply.close {
                w.flush().await?;
                return Ok(());
            }
            next = rx.try_recv().ok();
        }
        w.flush().await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
