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
        Self::with_key(KeyPair::generate().map_err(ca_error)?)
    }

    /// The CA whose P-256 key is `seed` (a scalar drawn from a keyed hash of the session:
    /// `shared.rs`), so every replica of a shared proxy, and the same replica after a
    /// restart, signs for a session with the key its sandbox already trusts. The
    /// certificate's other fields are fixed (rcgen's validity defaults, a serial from the
    /// public key), so its subject and key are the same wherever it is made. `None`: the
    /// seed is not a valid scalar (about one seed in 2^32); the caller draws another.
    pub fn derive(seed: &[u8; 32]) -> Result<Option<Self>, ProxyError> {
        // RFC 5915 ECPrivateKey { version 1, privateKey, [0] prime256v1 }: the public key
        // is left out and computed from the scalar.
        let mut sec1 = Vec::with_capacity(51);
        sec1.extend_from_slice(&[0x30, 0x31, 0x02, 0x01, 0x01, 0x04, 0x20]);
        sec1.extend_from_slice(seed);
        sec1.extend_from_slice(&[
            0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
        ]);
        let Ok(pair) = aws_lc_rs::signature::EcdsaKeyPair::from_private_key_der(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &sec1,
        ) else {
            return Ok(None);
        };
        let pkcs8 = pair
            .to_pkcs8v1()
            .map_err(|_| ProxyError::Tls("certificate: the session key".into()))?;
        let key = KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(pkcs8.as_ref()),
            &rcgen::PKCS_ECDSA_P256_SHA256,
        )
        .map_err(ca_error)?;
        Self::with_key(key).map(Some)
    }

    fn with_key(key: KeyPair) -> Result<Self, ProxyError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ca_error)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.distinguished_name.push(
            DnType::CommonName,
            "agent-runtime egress proxy (one session)",
        );
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
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
