//! Talking to the operator's conversion webhook directly, as the API
//! server does: over TLS, trusting the CA the kind's CRD carries.

use std::sync::Arc;

use serde_json::Value;

/// The CA bundle (PEM) the CRD `crd` trusts for its conversion webhook.
pub fn ca_of(crd: &str) -> String {
    let (_, bundle, _) = crate::kubectl(&[
        "get",
        "crd",
        crd,
        "-o",
        "jsonpath={.spec.conversion.webhook.clientConfig.caBundle}",
    ]);
    let ca = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, bundle.trim())
        .expect("a base64 CA bundle");
    String::from_utf8(ca).expect("a PEM bundle")
}

/// A TLS connection to the webhook on the loopback `port`, trusting `ca`.
pub async fn connect(
    port: u16,
    ca: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for ca in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots
            .add(ca.map_err(std::io::Error::other)?)
            .map_err(std::io::Error::other)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name =
        rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(std::io::Error::other)?;
    connector.connect(name, tcp).await
}

/// Sends the ConversionReview `review` to the webhook on `port` and
/// returns the review it answers.
pub async fn review(port: u16, ca: &str, review: &Value) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = review.to_string();
    let mut tls = connect(port, ca).await.expect("a TLS connection");
    let head = format!(
        "POST /convert HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body}"))
}
