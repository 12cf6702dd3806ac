//! The cluster's certificates: one CA, and one key pair per node named `node-<rank>`.
//!
//! Every node presents its certificate and checks its peers' against the CA, so a node needs
//! `ca.pem` and its own `node-<rank>.pem` and `node-<rank>.key`; `ca.key` stays with whoever
//! makes certificates.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::QuicError;

/// The name in a node's certificate, checked by its peers.
pub fn node_name(rank: usize) -> String {
    format!("node-{rank}")
}

/// PEM texts of a cluster's CA and node certificates.
pub struct ClusterCerts {
    /// The CA certificate (every node trusts it).
    pub ca_pem: String,
    /// The CA key (keep it off the nodes).
    pub ca_key_pem: String,
    /// Per node: certificate and key.
    pub nodes: Vec<(String, String)>,
}

impl ClusterCerts {
    /// The identity of node `rank`: its certificate and key, and the CA.
    pub fn identity(&self, rank: usize) -> Result<NodeIdentity, QuicError> {
        let (cert, key) = self.nodes.get(rank).ok_or_else(|| {
            QuicError::Certificates(format!("no certificate for node {rank} of {}", self.nodes.len()))
        })?;
        NodeIdentity::from_pem(rank, &self.ca_pem, cert, key)
    }
}

fn rc(e: rcgen::Error) -> QuicError {
    QuicError::Certificates(e.to_string())
}

/// A CA and `nodes` node certificates signed by it.
pub fn generate(nodes: usize) -> Result<ClusterCerts, QuicError> {
    let ca_key = KeyPair::generate().map_err(rc)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "ringtune cluster CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(rc)?;
    let mut out = Vec::with_capacity(nodes);
    for rank in 0..nodes {
        let key = KeyPair::generate().map_err(rc)?;
        let mut params = CertificateParams::new(vec![node_name(rank)]).map_err(rc)?;
        params.distinguished_name.push(DnType::CommonName, node_name(rank));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &ca_cert, &ca_key).map_err(rc)?;
        out.push((cert.pem(), key.serialize_pem()));
    }
    Ok(ClusterCerts { ca_pem: ca_cert.pem(), ca_key_pem: ca_key.serialize_pem(), nodes: out })
}

/// Writes `ca.pem`, `ca.key`, `node-<rank>.pem` and `node-<rank>.key` into `dir` (keys
/// readable by the owner only): everything, for whoever makes the cluster's certificates.
pub fn write(dir: &Path, certs: &ClusterCerts) -> Result<(), QuicError> {
    write_for_nodes(dir, certs)?;
    put(dir, "ca.key", &certs.ca_key_pem, true)
}

/// Writes what the nodes read, `ca.pem`, `node-<rank>.pem` and `node-<rank>.key`, and not
/// `ca.key`: for certificates made for one run, whose CA key nobody needs afterwards.
pub fn write_for_nodes(dir: &Path, certs: &ClusterCerts) -> Result<(), QuicError> {
    put(dir, "ca.pem", &certs.ca_pem, false)?;
    for (rank, (cert, key)) in certs.nodes.iter().enumerate() {
        put(dir, &format!("{}.pem", node_name(rank)), cert, false)?;
        put(dir, &format!("{}.key", node_name(rank)), key, true)?;
    }
    Ok(())
}

/// Writes `text` to `dir/name`, readable by the owner only when `secret`.
fn put(dir: &Path, name: &str, text: &str, secret: bool) -> Result<(), QuicError> {
    let path = dir.join(name);
    let written = if secret {
        ringtune_files::write_secret_atomically(&path, text.as_bytes())
    } else {
        ringtune_files::write_atomically(&path, text.as_bytes())
    };
    written.map_err(|e| QuicError::Io(e.to_string()))
}

/// What a node presents and trusts.
#[derive(Debug)]
pub struct NodeIdentity {
    /// The node's rank (its certificate says `node-<rank>`).
    pub rank: usize,
    /// The CA certificate.
    pub ca: CertificateDer<'static>,
    /// The node's certificate chain.
    pub chain: Vec<CertificateDer<'static>>,
    /// The node's private key.
    pub key: PrivateKeyDer<'static>,
}

impl NodeIdentity {
    /// Reads `ca.pem`, `node-<rank>.pem` and `node-<rank>.key` from `dir`.
    pub fn load(dir: &Path, rank: usize) -> Result<Self, QuicError> {
        let file = |name: String| -> PathBuf { dir.join(name) };
        let missing = |path: &Path, e: String| {
            QuicError::Certificates(format!("{}: {e} (make certificates with `ringtune certs`)", path.display()))
        };
        let ca_path = file("ca.pem".into());
        let ca = CertificateDer::from_pem_file(&ca_path).map_err(|e| missing(&ca_path, e.to_string()))?;
        let cert_path = file(format!("{}.pem", node_name(rank)));
        let chain = CertificateDer::pem_file_iter(&cert_path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| missing(&cert_path, e.to_string()))?;
        let key_path = file(format!("{}.key", node_name(rank)));
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| missing(&key_path, e.to_string()))?;
        Self::from_parts(rank, ca, chain, key)
    }

    /// An identity from PEM texts (for throwaway clusters made in memory).
    pub fn from_pem(rank: usize, ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Self, QuicError> {
        let bad = |e: rustls_pki_types::pem::Error| QuicError::Certificates(e.to_string());
        let ca = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(bad)?;
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>().map_err(bad)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(bad)?;
        Self::from_parts(rank, ca, chain, key)
    }

    fn from_parts(
        rank: usize,
        ca: CertificateDer<'static>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, QuicError> {
        let leaf = chain.first().ok_or_else(|| QuicError::Certificates("the node certificate file is empty".into()))?;
        if !certificate_names(leaf, &node_name(rank)) {
            return Err(QuicError::Certificates(format!(
                "the certificate given for rank {rank} is not for {}",
                node_name(rank)
            )));
        }
        Ok(NodeIdentity { rank, ca, chain, key })
    }
}

/// Whether `cert` is valid for the DNS name `name`.
pub(crate) fn certificate_names(cert: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(end_entity) = webpki::EndEntityCert::try_from(cert) else { return false };
    let Ok(server_name) = ServerName::try_from(name) else { return false };
    end_entity.verify_is_valid_for_subject_name(&server_name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_load_and_name_their_node() {
        let dir = tempfile::tempdir().expect("dir");
        write(dir.path(), &generate(2).expect("generate")).expect("write");
        let id = NodeIdentity::load(dir.path(), 1).expect("load");
        assert_eq!(id.rank, 1);
        // node-0's files are not an identity for rank 1.
        std::fs::copy(dir.path().join("node-0.pem"), dir.path().join("node-1.pem")).expect("copy");
        let err = NodeIdentity::load(dir.path(), 1).expect_err("wrong node").to_string();
        assert!(err.contains("not for node-1"), "{err}");
        let err = NodeIdentity::load(dir.path(), 5).expect_err("missing").to_string();
        assert!(err.contains("node-5.pem") && err.contains("ringtune certs"), "{err}");
    }

    #[test]
    fn certificates_for_the_nodes_leave_the_ca_key_out() {
        let (all, nodes_only) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let certs = generate(2).expect("generate");
        write(all.path(), &certs).expect("write");
        write_for_nodes(nodes_only.path(), &certs).expect("write for nodes");
        assert!(all.path().join("ca.key").is_file());
        assert!(!nodes_only.path().join("ca.key").exists());
        for rank in 0..2 {
            assert_eq!(NodeIdentity::load(nodes_only.path(), rank).expect("load").rank, rank);
        }
    }
}
