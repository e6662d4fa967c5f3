//! Member authentication: mutual TLS 1.3 under the cluster's own CA.
//!
//! Every member holds a certificate signed by the cluster CA that names it
//! (`node-<id>.weir`, see [`member_name`]). The dialer checks that the
//! acceptor's certificate names the node it meant to reach; the acceptor checks
//! that the dialer's certificate names the node its hello claims to be. A
//! connection without a certificate of this cluster, or whose certificate
//! names another node, is refused before any frame is read.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use weir_core::NodeId;

/// A connection's byte stream: plain TCP, or TLS over it.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// A boxed [`Stream`].
pub(crate) type BoxStream = Box<dyn Stream>;

/// A set-up connection: plain TCP (kept as a socket, so that it splits into
/// owned halves), or TLS over it.
pub(crate) enum Link {
    Plain(TcpStream),
    Tls(BoxStream),
}

/// The name a member's certificate carries (a DNS subject alternative name).
pub fn member_name(node: NodeId) -> String {
    format!("node-{}.weir", node.0)
}

/// Why a TLS identity could not be built from its PEM files.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file held nothing usable.
    #[error("{what}: {why}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// What was wrong.
        why: String,
    },
    /// rustls refused the certificates or key.
    #[error("TLS set-up: {0}")]
    Rustls(#[from] rustls::Error),
    /// The CA could not serve as a verifier of client certificates.
    #[error("client verifier: {0}")]
    Verifier(String),
}

/// This endpoint's TLS identity: its certificate and key, and the cluster CA
/// every peer's certificate must chain to.
#[derive(Clone)]
pub struct TlsIdentity {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity")
    }
}

impl PartialEq for TlsIdentity {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(self.acceptor.config(), other.acceptor.config())
    }
}

impl Eq for TlsIdentity {}

impl TlsIdentity {
    /// From PEM text: the cluster CA's certificate, this member's certificate
    /// (chain), and its private key.
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<TlsIdentity, TlsError> {
        let pem = |what: &'static str| {
            move |e: rustls::pki_types::pem::Error| TlsError::Pem {
                what,
                why: e.to_string(),
            }
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca) {
            roots.add(ca.map_err(pem("the CA certificate"))?)?;
        }
        if roots.is_empty() {
            return Err(TlsError::Pem {
                what: "the CA certificate",
                why: "no certificate in it".into(),
            });
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(pem("the member certificate"))?;
        if chain.is_empty() {
            return Err(TlsError::Pem {
                what: "the member certificate",
                why: "no certificate in it".into(),
            });
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(pem("the member key"))?;
        // ring: classical key exchange (X25519), no post-quantum hybrid, for
        // which rustls deprecates it. The links are a cluster's own, inside its
        // data center; aws-lc-rs (with the hybrid) would add a cmake-built C
        // library to every build.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = Arc::new(roots);
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Verifier(e.to_string()))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(TlsIdentity {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }
    /// Dialer side of a channel between members (member links, the RDMA
    /// transport's side channel): a TLS session with `to`, whose certificate
    /// must name it.
    pub async fn connect_member(
        &self,
        tcp: TcpStream,
        to: NodeId,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(member_name(to)).map_err(std::io::Error::other)?;
        self.connector.connect(name, tcp).await
    }

    /// Acceptor side of a channel between members: a TLS session with a
    /// member of this cluster (its certificate checked against the CA); which
    /// member, [`peer_names`] tells once its hello says.
    pub async fn accept_member(
        &self,
        tcp: TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        self.acceptor.accept(tcp).await
    }
}

/// Whether the peer of `tls` holds a certificate naming `node`.
pub(crate) fn certifies(tls: &tokio_rustls::server::TlsStream<TcpStream>, node: NodeId) -> bool {
    peer_certificate(tls).is_some_and(|cert| names(&cert, node))
}

/// The check of which node the peer of `tls` is certified as, kept apart from
/// the stream (its certificate copied).
pub fn peer_names(
    tls: &tokio_rustls::server::TlsStream<TcpStream>,
) -> impl Fn(NodeId) -> bool + Send + Sync + 'static {
    let cert = peer_certificate(tls);
    move |node| cert.as_ref().is_some_and(|cert| names(cert, node))
}

fn peer_certificate(
    tls: &tokio_rustls::server::TlsStream<TcpStream>,
) -> Option<CertificateDer<'static>> {
    let cert = tls.get_ref().1.peer_certificates()?.first()?;
    Some(cert.clone().into_owned())
}

/// Whether `cert` names `node`.
fn names(cert: &CertificateDer<'_>, node: NodeId) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(member_name(node)) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}
