//! What the operator's own HTTPS clients trust: the platform's roots (or
//! `SSL_CERT_FILE`), checked with ring, without a process-wide
//! CryptoProvider. The rate providers of ExchangeRates and the OTLP
//! collector are reached with it.

use std::sync::Arc;

/// The TLS configuration of an HTTPS client; the error says why the
/// system's roots could not be loaded.
pub fn client_tls() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
        .map_err(|e| format!("cannot load the system's root certificates: {e}"))?;
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}
