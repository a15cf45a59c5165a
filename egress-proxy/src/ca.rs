//! The per-session certificate authority: the proxy ends TLS to a host holding an egress
//! secret with a leaf certificate this CA signs, and the sandbox's trust store holds the
//! CA. Its key never leaves the proxy's memory; a new session gets a new CA, so a CA
//! taken from one sandbox (its certificate is public there anyway) signs nothing for
//! another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::ProxyError;

/// Leaf configurations kept per session (one per host a command reached with TLS ended).
const MAX_LEAVES: usize = 256;

pub struct SessionCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl SessionCa {
    pub fn generate() -> Result<Self, ProxyError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ca_error)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.distinguished_name.push(
            DnType::CommonName,
            "agent-runtime egress proxy (one session)",
        );
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(ca_error)?;
        let cert = params.self_signed(&key).map_err(ca_error)?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
            leaves: Mutex::default(),
        })
    }

    /// The CA certificate, for the sandbox's trust store.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The TLS server configuration presenting a certificate for `host`.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, ProxyError> {
        let mut leaves = self
            .leaves
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(config) = leaves.get(host) {
            return Ok(config.clone());
        }
        let name = host.trim_start_matches('[').trim_end_matches(']');
        let mut params = CertificateParams::new(vec![name.to_owned()]).map_err(ca_error)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(ca_error)?;
        let leaf = params.signed_by(&key, &self.issuer).map_err(ca_error)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone()];
        let mut config = ServerConfig::builder_with_provider(crate::upstream::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ProxyError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| ProxyError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), config.clone());
        Ok(config)
    }
}

fn ca_error(e: rcgen::Error) -> ProxyError {
    ProxyError::Tls(format!("certificate: {e}"))
}
