//! NBD over TLS (`NBD_OPT_STARTTLS`, X.509): the server's certificate, the
//! CA whose client certificates it takes (if any), and whether a client must
//! use TLS before anything else.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// How the front end treats TLS.
#[derive(Clone, Default)]
pub struct NbdTls {
    /// The server's TLS side; `None`: STARTTLS is answered "unsupported".
    pub(crate) acceptor: Option<TlsAcceptor>,
    /// No option but STARTTLS and ABORT before TLS (`tls = "require"`).
    pub(crate) require: bool,
}

impl std::fmt::Debug for NbdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdTls")
            .field("offered", &self.acceptor.is_some())
            .field("require", &self.require)
            .finish()
    }
}

impl NbdTls {
    /// Plain NBD only.
    pub fn off() -> NbdTls {
        NbdTls::default()
    }

    /// TLS offered (and required when `require`) with the server certificate
    /// chain `cert` and its `key`; with `client_ca`, a client must present a
    /// certificate it signed.
    pub fn new(
        cert: &[u8],
        key: &[u8],
        client_ca: Option<&[u8]>,
        require: bool,
    ) -> anyhow::Result<NbdTls> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("the NBD server certificate: {e}"))?;
        anyhow::ensure!(
            !chain.is_empty(),
            "the NBD server certificate: none in the file"
        );
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| anyhow::anyhow!("the NBD server key: {e}"))?;
        // ring, as for member links (see weir-transport-tcp's tls.rs).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?;
        let config = match client_ca {
            None => builder.with_no_client_auth().with_single_cert(chain, key)?,
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(ca) {
                    roots.add(c.map_err(|e| anyhow::anyhow!("the NBD client CA: {e}"))?)?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()?;
                builder
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(chain, key)?
            }
        };
        Ok(NbdTls {
            acceptor: Some(TlsAcceptor::from(Arc::new(config))),
            require,
        })
    }
}
