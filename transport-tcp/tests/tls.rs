//! Member authentication: with TLS, only members holding a certificate of the
//! cluster's CA that names them can connect and send a frame.

mod common;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_real as tokio;
use weir_core::NodeId;
use weir_transport_tcp::{member_name, TcpConfig, TcpTransport, TlsIdentity};

/// A CA, and a way to issue member certificates under it.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A TLS identity for a certificate naming `names`, signed by this CA,
    /// trusting `trust`.
    fn identity(&self, names: &[u32], trust: &Ca) -> TlsIdentity {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|&n| member_name(NodeId(n))).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.cert, &self.key)
            .unwrap();
        TlsIdentity::from_pem(
            trust.cert.pem().as_bytes(),
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )
        .unwrap()
    }
}

fn tls(identity: TlsIdentity) -> TcpConfig {
    TcpConfig {
        tls: Some(identity),
        ..config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_the_cluster_ca_exchange_frames_over_tls() {
    init_tracing();
    let ca = Ca::new("weir cluster 7");
    let a = node_with(1, &[], tls(ca.identity(&[1], &ca))).await;
    let a_addr = a.local_addr().unwrap();
    let b = node_with(2, &[(1, a_addr)], tls(ca.identity(&[2], &ca))).await;
    a.set_peer(NodeId(2), b.local_addr().unwrap());
    for i in 0..100 {
        send(&b, 1, frame(i)).await;
    }
    for i in 0..100 {
        assert_eq!(recv(&a).await, (NodeId(2), message(i)));
    }
    // And back, over the connection a dials.
    send(&a, 2, frame(7)).await;
    assert_eq!(recv(&b).await, (NodeId(1), message(7)));
    assert_eq!(a.refused_connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_certificate_another_ca_or_another_nodes_certificate_is_refused_before_any_frame() {
    init_tracing();
    let ca = Ca::new("weir cluster 7");
    let other_ca = Ca::new("weir cluster 7");
    let a = node_with(1, &[], tls(ca.identity(&[1], &ca))).await;
    let a_addr = a.local_addr().unwrap();
    let peers: std::collections::BTreeMap<NodeId, std::net::SocketAddr> =
        [(NodeId(1), a_addr)].into();
    let intruders = [
        // Plain TCP against a TLS member.
        ("no TLS", 5, config()),
        // A certificate of another CA with the same name.
        ("another CA", 5, tls(other_ca.identity(&[5], &ca))),
        // A member's certificate, but its hello claims another node.
        ("another node's certificate", 5, tls(ca.identity(&[4], &ca))),
    ];
    let mut refused = 0;
    for (what, id, config) in intruders {
        let intruder = TcpTransport::bind(NodeId(id), None, peers.clone(), config)
            .await
            .unwrap();
        for i in 0..3 {
            send(&intruder, 1, frame(i)).await;
        }
        // Refused and counted (the intruder dials again, so at least once).
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while a.refused_connections() <= refused {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: never refused"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        refused = a.refused_connections();
        intruder.close();
    }
    // A raw socket that sends a plain hello gets no hello back: at most a TLS
    // alert record (content type 21), then the close.
    let mut s = TcpStream::connect(a_addr).await.unwrap();
    s.write_all(&hello(6, CLUSTER)).await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut back))
        .await
        .expect("a closes the connection")
        .ok();
    assert!(back.is_empty() || back[0] == 21, "{back:?}");
    assert!(
        !back.windows(8).any(|w| w == b"weir-tcp"),
        "no hello answered"
    );
    // Nothing any of them sent arrived; a member's frame does.
    let good = TcpTransport::bind(NodeId(3), None, peers, tls(ca.identity(&[3], &ca)))
        .await
        .unwrap();
    send(&good, 1, frame(9)).await;
    assert_eq!(recv(&a).await, (NodeId(3), message(9)));
    assert_eq!(recv_within(&a, Duration::from_millis(300)).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialer_refuses_an_address_that_answers_with_another_members_certificate() {
    init_tracing();
    let ca = Ca::new("weir cluster 7");
    // b listens with node 3's certificate, but a dials it as node 2.
    let b = node_with(3, &[], tls(ca.identity(&[3], &ca))).await;
    let a = node_with(
        1,
        &[(2, b.local_addr().unwrap())],
        tls(ca.identity(&[1], &ca)),
    )
    .await;
    for i in 0..3 {
        send(&a, 2, frame(i)).await;
    }
    assert_eq!(recv_within(&b, Duration::from_millis(300)).await, None);
}
