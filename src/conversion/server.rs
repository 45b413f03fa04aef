//! The webhook's HTTPS endpoint: TLS with the certificate made at start,
//! one route, [`super::PATH`], answering `ConversionReview`s.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::certificate::Certificate;
use super::{Conversions, PATH, review};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// Serves the webhook on `addr` until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    certificate: Certificate,
    conversions: Arc<Conversions>,
) -> std::io::Result<()> {
    let listener = TlsListener {
        tcp: TcpListener::bind(addr).await?,
        acceptor: TlsAcceptor::from(Arc::new(tls_config(certificate)?)),
    };
    let app = Router::new()
        .route(PATH, post(convert))
        .with_state(conversions);
    axum::serve(listener, app).await
}

/// TLS 1.2 and 1.3 with the serving certificate, HTTP/1.1.
fn tls_config(certificate: Certificate) -> std::io::Result<rustls::ServerConfig> {
    let (cert, key) = certificate.server_parts().map_err(std::io::Error::other)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(vec![cert], key))
        .map_err(std::io::Error::other)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A TCP listener whose connections are TLS, handshaken as they come.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.tcp.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "conversion webhook: cannot accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match tokio::time::timeout(HANDSHAKE, self.acceptor.accept(stream)).await {
                Ok(Ok(tls)) => return (tls, addr),
                Ok(Err(e)) => {
                    tracing::debug!(%addr, error = %e, "conversion webhook: handshake failed")
                }
                Err(_) => tracing::debug!(%addr, "conversion webhook: handshake timed out"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// One `ConversionReview`: 400 when it is not one.
async fn convert(State(conversions): State<Arc<Conversions>>, body: Bytes) -> Response {
    let review = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("not a ConversionReview: {e}"),
            )
                .into_response();
        }
    };
    match serde_json::to_vec(&review::answer(review, &conversions)) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
