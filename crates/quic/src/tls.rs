//! rustls configurations for mutual TLS inside the cluster, and checks of peer names.

use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;

use crate::certs::{certificate_names, NodeIdentity};
use crate::QuicError;

/// ALPN of ring links.
pub(crate) const ALPN_RING: &[u8] = b"ringtune-ring/1";
/// ALPN of rendezvous registrations.
pub(crate) const ALPN_RENDEZVOUS: &[u8] = b"ringtune-rdv/1";
/// ALPN of a node asking to join a running ring.
pub(crate) const ALPN_JOIN: &[u8] = b"ringtune-join/1";
/// ALPN of a state sent to one member alone (a node taken in).
pub(crate) const ALPN_DIRECT: &[u8] = b"ringtune-direct/1";

fn tls(e: impl std::fmt::Display) -> QuicError {
    QuicError::Certificates(e.to_string())
}

/// AES-128-GCM only: the bulk of a ring's CPU time is packet encryption, and AES-128 takes 10
/// rounds to AES-256's 14 at the same security margin for our traffic volumes.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    use rustls::crypto::aws_lc_rs as backend;
    #[cfg(not(feature = "aws-lc-rs"))]
    use rustls::crypto::ring as backend;
    let mut provider = backend::default_provider();
    provider.cipher_suites = vec![backend::cipher_suite::TLS13_AES_128_GCM_SHA256];
    Arc::new(provider)
}

fn roots(id: &NodeIdentity) -> Result<Arc<RootCertStore>, QuicError> {
    let mut roots = RootCertStore::empty();
    roots.add(id.ca.clone()).map_err(tls)?;
    Ok(Arc::new(roots))
}

/// Accepts connections only from clients whose certificate the CA signed.
pub(crate) fn server_crypto(id: &NodeIdentity) -> Result<QuicServerConfig, QuicError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(id)?, provider()).build().map_err(tls)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(id.chain.clone(), id.key.clone_key())
        .map_err(tls)?;
    config.alpn_protocols =
        vec![ALPN_RING.to_vec(), ALPN_RENDEZVOUS.to_vec(), ALPN_JOIN.to_vec(), ALPN_DIRECT.to_vec()];
    QuicServerConfig::try_from(config).map_err(tls)
}

/// Presents this node's certificate and accepts servers the CA signed for the name asked for.
pub(crate) fn client_crypto(id: &NodeIdentity, alpn: &[u8]) -> Result<QuicClientConfig, QuicError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_root_certificates(roots(id)?)
        .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
        .map_err(tls)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    QuicClientConfig::try_from(config).map_err(tls)
}

/// The client side of every connection this node opens: its certificate, `alpn`, and the
/// links' `transport` settings.
pub(crate) fn client_config(
    id: &NodeIdentity,
    alpn: &[u8],
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ClientConfig, QuicError> {
    let mut client = quinn::ClientConfig::new(Arc::new(client_crypto(id, alpn)?));
    client.transport_config(transport);
    Ok(client)
}

/// Whether the peer of `conn` presented a certificate for `name` (the CA check already passed
/// during the handshake).
pub(crate) fn peer_is(conn: &quinn::Connection, name: &str) -> bool {
    conn.peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .and_then(|chain| chain.first().map(|leaf| certificate_names(leaf, name)))
        .unwrap_or(false)
}

/// The ALPN protocol a connection agreed on.
pub(crate) fn alpn(conn: &quinn::Connection) -> Option<Vec<u8>> {
    conn.handshake_data()
        .and_then(|any| any.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|h| h.protocol)
}
