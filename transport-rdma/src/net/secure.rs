//! How a connection's side channel is secured: plain TCP, or (in the daemon,
//! with `[tls]`) mutual TLS under the cluster CA, so that the hellos (queue
//! pair numbers, PSNs, region keys) and the heartbeats travel only between
//! members, and a peer is refused when its certificate does not name the node
//! its hello claims (or the node dialed).

use std::future::Future;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use weir_core::NodeId;

/// A side channel's bytes.
pub trait SideStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> SideStream for T {}

impl std::fmt::Debug for dyn SideStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SideStream")
    }
}

/// A boxed [`SideStream`].
pub type Side = Box<dyn SideStream>;

/// Whether the peer's credentials name a node.
pub type Certifies = Box<dyn Fn(NodeId) -> bool + Send>;

/// A set-up step in flight.
pub type Setup<T> = Pin<Box<dyn Future<Output = std::io::Result<T>> + Send>>;

/// Secures side channels (the daemon implements it with weir-transport-tcp's
/// `TlsIdentity`).
pub trait SideSecurity: std::fmt::Debug + Send + Sync + 'static {
    /// Dialer: a secure session with `to`, whose credentials must name it.
    fn connect(&self, tcp: TcpStream, to: NodeId) -> Setup<Side>;
    /// Acceptor: a secure session with a peer whose credentials the cluster
    /// vouches for, and the check of which node they name.
    fn accept(&self, tcp: TcpStream) -> Setup<(Side, Certifies)>;
}
