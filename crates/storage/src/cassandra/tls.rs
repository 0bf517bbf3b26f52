//! CQL over TLS: the nodes' certificates are checked against a CA the
//! operator names (never the system's web roots: a cluster's CA is its own).
//!
//! The driver connects to each node by its IP address and asks rustls to
//! check the certificate against that address, so by default a node's
//! certificate must carry its IP as a subjectAltName. Clusters whose
//! certificates name hosts only (pods whose addresses change) can turn the
//! name check off: the chain to the CA is still verified, so only a holder of
//! a certificate from that CA can pose as a node.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// How to reach the cluster over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CassandraTls {
    /// PEM file of the CA certificate(s) the nodes' certificates chain to.
    pub ca_file: PathBuf,
    /// Check that a node's certificate names the address connected to.
    pub verify_name: bool,
}

impl CassandraTls {
    /// The rustls configuration, or why the CA file cannot serve.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        let shown = self.ca_file.display();
        let mut roots = RootCertStore::empty();
        let certificates = CertificateDer::pem_file_iter(&self.ca_file).map_err(|e| format!("cannot read the CA file {shown}: {e}"))?;
        for certificate in certificates {
            let certificate = certificate.map_err(|e| format!("the CA file {shown} is not PEM: {e}"))?;
            roots.add(certificate).map_err(|e| format!("the CA file {shown} holds a certificate rustls refuses: {e}"))?;
        }
        if roots.is_empty() {
            return Err(format!("the CA file {shown} holds no certificate"));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| format!("the CA file {shown}: {e}"))?;
        let verifier: Arc<dyn ServerCertVerifier> = if self.verify_name { verifier } else { Arc::new(ChainOnly(verifier)) };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }
}

/// The CA's verifier, with a certificate that does not name the address
/// connected to accepted (everything else is still checked).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(Error::InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_is_missing_empty_or_not_pem_is_refused_with_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = CassandraTls { ca_file: dir.path().join("absent.pem"), verify_name: true };
        assert!(missing.client_config().expect_err("missing").contains("cannot read the CA file"));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").expect("write");
        let error = CassandraTls { ca_file: empty, verify_name: true }.client_config().expect_err("empty");
        assert!(error.contains("holds no certificate"), "{error}");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n").expect("write");
        assert!(CassandraTls { ca_file: garbage, verify_name: true }.client_config().is_err());
    }
}
