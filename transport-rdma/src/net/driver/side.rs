//! The side channel's tasks: the dial and its hellos, then, on both sides,
//! the watch that ends the connection when the side channel ends.
//!
//! After set-up each side writes a [`HEARTBEAT`] byte every
//! [`HEARTBEAT_EVERY`] and gives the connection up after [`SILENT_MAX`] with
//! nothing read: a peer that lost power, or restarted while this side had
//! nothing to send it (no work request in flight, so no RC retry to fail), is
//! seen within that time, not never.

use super::{hello, Event, Hello, NodeId};
use crate::net::secure::{Side, SideSecurity};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A byte each side writes while the connection lives.
pub(super) const HEARTBEAT: u8 = 0x48;
/// How often.
pub(super) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// Nothing read for this long ends the connection.
pub(super) const SILENT_MAX: Duration = Duration::from_secs(5);

/// Dial `addr` for the peer `expect` (through `security` when given), send
/// `mine`, read and check its hello: the stream, its hello and the round trip.
pub(super) async fn dial(
    addr: SocketAddr,
    mine: Hello,
    (cluster, paths, timeout): (u64, u8, Duration),
    expect: NodeId,
    security: Option<Arc<dyn SideSecurity>>,
) -> Result<(Side, Hello, u64), String> {
    let started = Instant::now();
    tokio::time::timeout(timeout, async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).ok();
        let mut s: Side = match &security {
            Some(security) => security
                .connect(tcp, expect)
                .await
                .map_err(|e| format!("TLS: {e}"))?,
            None => Box::new(tcp),
        };
        s.write_all(&mine.encode())
            .await
            .map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())?;
        let mut b = [0u8; hello::LEN];
        s.read_exact(&mut b).await.map_err(|e| e.to_string())?;
        let h = Hello::decode(&b, cluster, paths).map_err(|e| e.to_string())?;
        if h.node != expect || h.path != mine.path {
            return Err(hello::HelloError::Node(h.node).to_string());
        }
        Ok((s, h, started.elapsed().as_nanos() as u64))
    })
    .await
    .unwrap_or_else(|_| Err("timed out".into()))
}

/// The dialer's side once its queue pair can receive: READY, then the watch.
pub(super) async fn dialer(mut s: Side, key: u32, events: mpsc::Sender<Event>) {
    if s.write_all(&[hello::READY]).await.is_ok() && s.flush().await.is_ok() {
        watch(s).await;
    }
    let _ = events.send(Event::Closed { key }).await;
}

/// The acceptor's side: its hello, the dialer's READY, then the watch.
pub(super) async fn acceptor(
    mut s: Side,
    mine: [u8; hello::LEN],
    key: u32,
    timeout: Duration,
    events: mpsc::Sender<Event>,
) {
    let ready = tokio::time::timeout(timeout, async {
        s.write_all(&mine).await?;
        s.flush().await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        Ok::<bool, std::io::Error>(b[0] == hello::READY)
    })
    .await;
    if let Ok(Ok(true)) = ready {
        if events.send(Event::Ready { key }).await.is_err() {
            return;
        }
        watch(s).await;
    }
    let _ = events.send(Event::Closed { key }).await;
}

/// Heartbeats out, anything in, until the side channel ends, fails or stays
/// silent for [`SILENT_MAX`].
async fn watch(s: Side) {
    let (mut r, mut w) = tokio::io::split(s);
    let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
    let mut heard = Instant::now();
    let mut b = [0u8; 64];
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if heard.elapsed() >= SILENT_MAX
                    || w.write_all(&[HEARTBEAT]).await.is_err()
                    || w.flush().await.is_err()
                {
                    return;
                }
            }
            n = r.read(&mut b) => match n {
                Ok(0) | Err(_) => return,
                Ok(_) => heard = Instant::now(),
            },
        }
    }
}
