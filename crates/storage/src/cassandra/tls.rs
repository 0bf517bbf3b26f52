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
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// How to reach the cluster over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CassandraTls {
    /// PEM file of the CA certificate(s) the nodes' certificates chain to.
    pub ca_file: PathBuf,
    /// Check that a node's certificate names the address connected to.
    pub verify_name: bool,
    /// A client certificate (PEM, its chain) and its private key (PEM), for
    /// nodes that require one (`require_client_auth`).
    pub client_identity: Option<(PathBuf, PathBuf)>,
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
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.client_identity {
            None => builder.with_no_client_auth(),
            Some((cert_file, key_file)) => {
                let (cert_shown, key_shown) = (cert_file.display(), key_file.display());
                let chain = CertificateDer::pem_file_iter(cert_file)
                    .map_err(|e| format!("cannot read the client certificate {cert_shown}: {e}"))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("the client certificate {cert_shown} is not PEM: {e}"))?;
                if chain.is_empty() {
                    return Err(format!("the client certificate file {cert_shown} holds no certificate"));
                }
                let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| format!("cannot read a private key from {key_shown}: {e}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("the client certificate {cert_shown} and key {key_shown}: {e}"))?
            }
        };
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
        let missing = CassandraTls { ca_file: dir.path().join("absent.pem"), verify_name: true, client_identity: None };
        assert!(missing.client_config().expect_err("missing").contains("cannot read the CA file"));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").expect("write");
        let error = CassandraTls { ca_file: empty, verify_name: true, client_identity: None }.client_config().expect_err("empty");
        assert!(error.contains("holds no certificate"), "{error}");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n").expect("write");
        assert!(CassandraTls { ca_file: garbage, verify_name: true, client_identity: None }.client_config().is_err());
    }

    #[test]
    fn a_client_identity_that_cannot_be_read_is_refused_with_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        let made = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test CA"])
            .arg("-keyout")
            .arg(dir.path().join("ca.key"))
            .arg("-out")
            .arg(&ca)
            .output()
            .expect("run openssl");
        assert!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
        let with = |cert: &str, key: &str| CassandraTls {
            ca_file: ca.clone(),
            verify_name: true,
            client_identity: Some((dir.path().join(cert), dir.path().join(key))),
        };
        let error = with("absent.pem", "ca.key").client_config().expect_err("no certificate file");
        assert!(error.contains("absent.pem"), "{error}");
        let error = with("ca.pem", "absent.key").client_config().expect_err("no key file");
        assert!(error.contains("absent.key"), "{error}");
        // The CA's own certificate and key make a valid identity.
        with("ca.pem", "ca.key").client_config().expect("a certificate and its key");
    }
}
