//! How a client checks the ctrl node it dialled: the certificate chains to
//! the cluster CA and names a node (`ctrl://node/<id>`). The DNS names and
//! addresses a site's certificates carry are not compared with the name the
//! client dialled, so nodes, agents and operators reach a node by any
//! address without the certificate having to list it; the node identity is
//! what is checked. Only node certificates carry a node identity, so an
//! agent's or an operator's certificate from the same CA is refused.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, OtherError, RootCertStore};

use crate::identity::Identity;

/// Accepts a server certificate signed by the cluster CA that names a ctrl
/// node, whatever name or address the client dialled.
#[derive(Debug)]
pub struct NodeCertVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl NodeCertVerifier {
    /// A verifier trusting `roots` (the cluster CA), with `provider`'s
    /// signature algorithms.
    pub fn new(roots: Arc<RootCertStore>, provider: Arc<CryptoProvider>) -> NodeCertVerifier {
        NodeCertVerifier { roots, provider }
    }
}

/// Why a certificate that chains to the CA is still not a node's.
#[derive(Debug, thiserror::Error)]
enum NotANode {
    #[error("the server's certificate names {0}, not a ctrl node")]
    OtherIdentity(Identity),
    #[error("the server's certificate carries no valid ctrl identity: {0}")]
    NoIdentity(crate::CertError),
}

impl ServerCertVerifier for NodeCertVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let refused = |reason: NotANode| {
            Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(reason))))
        };
        match Identity::from_cert_der(end_entity) {
            Ok(Identity::Node { .. }) => Ok(ServerCertVerified::assertion()),
            Ok(other) => Err(refused(NotANode::OtherIdentity(other))),
            Err(e) => Err(refused(NotANode::NoIdentity(e))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
