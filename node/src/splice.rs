//! The daemon's splice between a node and its own NBD front end (weir-core's
//! [`weir_core::splice`], over the node's TCP or RDMA endpoint): messages
//! between them go through a channel instead of through the kernel's
//! loopback TCP; messages to every other node go over the endpoint.

use crate::net::Net;

/// One side of the daemon's splice.
pub type Spliced = weir_core::splice::Spliced<Net>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use weir_core::splice::{splice, SPLICE_FRAMES_MAX};
    use weir_core::transport::{SendError, Transport, TransportError};
    use weir_core::wire::{Frame, Message};
    use weir_core::NodeId;
    use weir_transport_tcp::TcpTransport;

    #[tokio_real::test(crate = "tokio_real")]
    async fn frames_between_the_spliced_ends_skip_tcp_and_others_use_it() {
        let tcp_a = TcpTransport::bind(
            NodeId(1),
            Some("127.0.0.1:0".parse().unwrap()),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
        let net = Arc::new(Net::Tcp(tcp_a.clone()));
        let (a, b) = splice(NodeId(1), Some(net), NodeId(900), None);
        b.send(NodeId(1), Frame::from(b"to the node".to_vec()))
            .unwrap();
        assert_eq!(
            a.recv().await.unwrap(),
            (NodeId(900), Frame::from(b"to the node".to_vec()))
        );
        a.send(NodeId(900), Frame::from(b"reply".to_vec())).unwrap();
        assert_eq!(
            b.recv().await.unwrap(),
            (NodeId(1), Frame::from(b"reply".to_vec()))
        );
        // b has no TCP: any other peer is unknown to it.
        assert_eq!(
            b.send(NodeId(2), Frame::default()),
            Err(TransportError::UnknownPeer(NodeId(2)).into())
        );
        assert_eq!(a.local_id(), NodeId(1));
        tcp_a.close();
    }

    #[tokio_real::test(crate = "tokio_real")]
    async fn messages_to_the_spliced_peer_are_handed_over_not_encoded() {
        let (a, b) = splice::<Net>(NodeId(1), None, NodeId(900), None);
        let data = bytes::Bytes::from(vec![7u8; 4096]);
        let msg = Message::fetched(weir_core::OpId(3), Ok(data.clone()));
        let frame = b.frame(NodeId(1), msg.clone()).unwrap();
        assert!(frame.head.is_empty() && frame.payload.is_empty() && frame.local.is_some());
        b.send(NodeId(1), frame).unwrap();
        let (from, frame) = a.recv().await.unwrap();
        let got = Message::decode(frame).unwrap();
        assert_eq!((from, &got), (NodeId(900), &msg));
        // The payload is the same memory, not a copy.
        assert_eq!(got.payload().unwrap().as_ptr(), data.as_ptr());
        // To anyone else, the message is encoded for the wire.
        let other = b.frame(NodeId(2), msg.clone()).unwrap();
        assert!(other.local.is_none() && !other.head.is_empty());
        assert_eq!(Message::decode(other).unwrap(), msg);
    }

    #[tokio_real::test(crate = "tokio_real")]
    async fn a_full_channel_hands_frames_back_until_the_other_side_takes_one() {
        let (a, b) = splice::<Net>(NodeId(1), None, NodeId(900), None);
        // Nothing refused yet: writable at once.
        a.writable().await;
        for i in 0..SPLICE_FRAMES_MAX {
            a.send(NodeId(900), Frame::from(vec![i as u8])).unwrap();
        }
        let last = Frame::from(b"one more".to_vec());
        assert_eq!(
            a.send(NodeId(900), last.clone()),
            Err(SendError::Full(last.clone()))
        );
        let waiting = tokio_real::time::timeout(std::time::Duration::from_millis(50), a.writable());
        assert!(waiting.await.is_err(), "no room until b takes a frame");
        assert_eq!(b.recv().await.unwrap(), (NodeId(1), Frame::from(vec![0])));
        a.writable().await;
        a.send(NodeId(900), last).unwrap();
    }
}
