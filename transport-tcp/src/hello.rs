//! Connection setup: the hello each end sends once, before any frame.
//!
//! ```text
//! 0          8                 12        16           24
//! | "weir-tcp" | protocol ver LE | node LE | cluster LE |
//! ```
//!
//! The dialer sends its hello first. The acceptor checks the magic, the protocol
//! version and the cluster, then answers with its own hello; a failed check closes
//! the connection without an answer. The dialer checks that the answer carries the
//! same magic, version and cluster, and the node id it meant to reach (an address
//! now held by another node must not receive that node's traffic).
//!
//! With TLS (`TcpConfig::tls`), the hellos travel inside a mutually
//! authenticated TLS 1.3 session set up first (see `tls.rs`): the dialer's
//! TLS client checks that the acceptor's certificate names the node dialed,
//! and the acceptor checks that the dialer's certificate names the node its
//! hello claims; a mismatch closes the connection without an answer.
//!
//! Versioning rule: bump [`PROTOCOL_VERSION`] whenever the hello's layout or the
//! rules of a connection change (what is sent before or around frames). The frames
//! themselves carry `weir_core::wire::WIRE_VERSION` and are versioned there.

use crate::tls::{self, Link, TlsIdentity};
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use weir_core::NodeId;

/// The eight bytes that open every hello.
pub(crate) const MAGIC: [u8; 8] = *b"weir-tcp";
/// Version of the connection protocol (the hello and the rules around frames).
pub(crate) const PROTOCOL_VERSION: u32 = 1;
/// Length of a hello in bytes.
pub(crate) const HELLO_BYTES: usize = 24;

/// What one end tells the other when a connection opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The sender's node id.
    pub(crate) node: NodeId,
    /// The sender's cluster.
    pub(crate) cluster: u64,
}

/// Why a connection was not set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    /// The socket failed (refused, reset, closed early).
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The other end does not speak this protocol.
    #[error("bad hello magic {0:02x?}")]
    BadMagic([u8; 8]),
    /// The other end speaks another version of this protocol.
    #[error("unsupported protocol version {0} (this build speaks {PROTOCOL_VERSION})")]
    Version(u32),
    /// The other end belongs to another cluster.
    #[error("peer is in cluster {theirs}, this endpoint in cluster {ours}")]
    Cluster {
        /// This endpoint's cluster.
        ours: u64,
        /// The peer's cluster.
        theirs: u64,
    },
    /// The dialed address answered as another node.
    #[error("dialed {expected} but {got} answered")]
    WrongNode {
        /// The node dialed.
        expected: NodeId,
        /// The node that answered.
        got: NodeId,
    },
    /// Setup took longer than the connect timeout.
    #[error("no connection within {0:?}")]
    Timeout(Duration),
    /// The TLS handshake failed: no certificate, one of another CA, or one
    /// that does not name the node dialed (or plain TCP against TLS).
    #[error("TLS: {0}")]
    Tls(io::Error),
    /// The dialer's certificate (of this cluster) names another node than
    /// its hello.
    #[error("the peer's certificate does not name {0}, which its hello claims to be")]
    NotCertified(NodeId),
}

impl Hello {
    /// The hello's bytes.
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut out = [0u8; HELLO_BYTES];
        out[..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&self.node.0.to_le_bytes());
        out[16..24].copy_from_slice(&self.cluster.to_le_bytes());
        out
    }

    /// Parse a hello and check it belongs to `cluster`. Any 24 bytes yield a hello
    /// or an error, never a panic (every index below is a constant into a 24-byte
    /// array, checked at compile time).
    pub(crate) fn decode(b: &[u8; HELLO_BYTES], cluster: u64) -> Result<Hello, HandshakeError> {
        let magic = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
        if magic != MAGIC {
            return Err(HandshakeError::BadMagic(magic));
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != PROTOCOL_VERSION {
            return Err(HandshakeError::Version(version));
        }
        let hello = Hello {
            node: NodeId(u32::from_le_bytes([b[12], b[13], b[14], b[15]])),
            cluster: u64::from_le_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]),
        };
        if hello.cluster != cluster {
            return Err(HandshakeError::Cluster {
                ours: cluster,
                theirs: hello.cluster,
            });
        }
        Ok(hello)
    }
}

/// Dialer side: connect to `to` (over TLS when `tls` is given), exchange
/// hellos. Returns the stream and the time the hello took to be answered (one
/// round trip plus the peer's reaction).
pub(crate) async fn dial(
    addr: std::net::SocketAddr,
    ours: Hello,
    to: NodeId,
    timeout: Duration,
    tls: Option<&TlsIdentity>,
) -> Result<(Link, Duration), HandshakeError> {
    let setup = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let mut stream = match tls {
            Some(tls) => Link::Tls(Box::new(
                tls.connect_member(tcp, to)
                    .await
                    .map_err(HandshakeError::Tls)?,
            )),
            None => Link::Plain(tcp),
        };
        let io: &mut dyn tls::Stream = match &mut stream {
            Link::Plain(tcp) => tcp,
            Link::Tls(tls) => tls.as_mut(),
        };
        let sent = Instant::now();
        io.write_all(&ours.encode()).await?;
        io.flush().await?;
        let mut answer = [0u8; HELLO_BYTES];
        io.read_exact(&mut answer).await?;
        let rtt = sent.elapsed();
        let theirs = Hello::decode(&answer, ours.cluster)?;
        if theirs.node != to {
            return Err(HandshakeError::WrongNode {
                expected: to,
                got: theirs.node,
            });
        }
        Ok((stream, rtt))
    };
    tokio::time::timeout(timeout, setup)
        .await
        .unwrap_or(Err(HandshakeError::Timeout(timeout)))
}

/// Acceptor side: (over TLS when `tls` is given) read the dialer's hello,
/// check it, answer. Returns the stream and the dialer's node id.
pub(crate) async fn accept(
    tcp: TcpStream,
    ours: Hello,
    timeout: Duration,
    tls: Option<&TlsIdentity>,
) -> Result<(Link, NodeId), HandshakeError> {
    let setup = async {
        tcp.set_nodelay(true)?;
        match tls {
            None => {
                let mut stream = tcp;
                let node = answer(&mut stream, ours, |_, _| true).await?;
                Ok((Link::Plain(stream), node))
            }
            Some(identity) => {
                let mut stream = identity
                    .accept_member(tcp)
                    .await
                    .map_err(HandshakeError::Tls)?;
                let node = answer(&mut stream, ours, tls::certifies).await?;
                Ok((Link::Tls(Box::new(stream)), node))
            }
        }
    };
    tokio::time::timeout(timeout, setup)
        .await
        .unwrap_or(Err(HandshakeError::Timeout(timeout)))
}

/// Read the dialer's hello on `stream`, check it (and that `certified` vouches
/// for the node it claims), answer it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ours: Hello,
    certified: impl Fn(&S, NodeId) -> bool,
) -> Result<NodeId, HandshakeError> {
    let mut theirs = [0u8; HELLO_BYTES];
    stream.read_exact(&mut theirs).await?;
    let theirs = Hello::decode(&theirs, ours.cluster)?;
    if !certified(stream, theirs.node) {
        return Err(HandshakeError::NotCertified(theirs.node));
    }
    stream.write_all(&ours.encode()).await?;
    stream.flush().await?;
    Ok(theirs.node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips() {
        let hello = Hello {
            node: NodeId(7),
            cluster: 0xfeed,
        };
        assert_eq!(Hello::decode(&hello.encode(), 0xfeed).ok(), Some(hello));
    }

    #[test]
    fn hello_checks_every_field() {
        let good = Hello {
            node: NodeId(7),
            cluster: 3,
        }
        .encode();
        let mut magic = good;
        magic[0] = b'W';
        assert!(matches!(
            Hello::decode(&magic, 3),
            Err(HandshakeError::BadMagic(_))
        ));
        let mut version = good;
        version[8] = 2;
        assert!(matches!(
            Hello::decode(&version, 3),
            Err(HandshakeError::Version(2))
        ));
        assert!(matches!(
            Hello::decode(&good, 4),
            Err(HandshakeError::Cluster { ours: 4, theirs: 3 })
        ));
    }
}
