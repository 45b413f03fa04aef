//! The webhook's HTTPS endpoint: TLS with the shared certificate (swapped
//! for its successor while it runs, [`ServingCertificate`]), one route,
//! [`super::PATH`], answering `ConversionReview`s.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::certificate::Certificate;
use super::worker::{Refused, Workers};
use super::{Conversions, PATH};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// How many handshakes may be under way at once.
const HANDSHAKES: usize = 64;
/// The largest review read. The API server sends every object of a list
/// that needs converting in one review: a list at a version other than
/// the stored one fails when its objects take more than this.
const MAX_BODY: usize = 64 << 20;

/// Serves the webhook on `addr` until `stop` resolves (or the task is
/// dropped); then closes idle connections and ends once the reviews under
/// way are answered.
pub async fn serve(
    addr: SocketAddr,
    certificate: Arc<ServingCertificate>,
    conversions: Arc<Conversions>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(certificate)?));
    let listener = TlsListener::new(TcpListener::bind(addr).await?, acceptor)?;
    let app = Router::new()
        .route(PATH, post(convert))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(Workers::new(conversions));
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

/// The certificate the webhook serves, which a handshake reads as it
/// starts: swapping it changes what the next connection gets.
#[derive(Debug)]
pub struct ServingCertificate(RwLock<Arc<CertifiedKey>>);

impl ServingCertificate {
    /// Serves `certificate`.
    pub fn new(certificate: &Certificate) -> std::io::Result<Self> {
        Ok(Self(RwLock::new(certified(certificate)?)))
    }

    /// Serves `certificate` from the next handshake on.
    pub fn set(&self, certificate: &Certificate) -> std::io::Result<()> {
        let key = certified(certificate)?;
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = key;
        Ok(())
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let key = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(key.clone())
    }
}

/// `certificate` as rustls serves it.
fn certified(certificate: &Certificate) -> std::io::Result<Arc<CertifiedKey>> {
    let (cert, key) = certificate.server_parts().map_err(std::io::Error::other)?;
    let provider = rustls::crypto::ring::default_provider();
    let key = CertifiedKey::from_der(vec![cert], key, &provider).map_err(std::io::Error::other)?;
    Ok(Arc::new(key))
}

/// TLS 1.2 and 1.3 with the serving certificate, HTTP/1.1.
fn tls_config(certificate: Arc<ServingCertificate>) -> std::io::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| b.with_no_client_auth().with_cert_resolver(certificate))
        .map_err(std::io::Error::other)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A TCP listener whose connections are TLS, each handshaken in a task of
/// its own (at most [`HANDSHAKES`] at once): a client that stalls its
/// handshake holds up nobody else.
struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` until the listener is dropped.
    fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let addr = tcp.local_addr()?;
        let (done, ready) = mpsc::channel(HANDSHAKES);
        tokio::spawn(accept(tcp, acceptor, done));
        Ok(Self { ready, addr })
    }
}

/// Accepts connections and handshakes each in its own task, handing the
/// TLS streams to `done`; ends when its receiver is gone.
async fn accept(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    done: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(HANDSHAKES));
    while !done.is_closed() {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let accepted = tokio::select! {
            () = done.closed() => return,
            accepted = tcp.accept() => accepted,
        };
        let (stream, addr) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "conversion webhook: cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, done) = (acceptor.clone(), done.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = done.send((tls, addr)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%addr, error = %e, "conversion webhook: handshake failed");
                }
                Err(_) => tracing::debug!(%addr, "conversion webhook: handshake timed out"),
            }
            drop(slot);
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The acceptor never ends while this receiver lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// One `ConversionReview`: 400 when it is not one.
async fn convert(State(workers): State<Workers>, body: Bytes) -> Response {
    match workers.answer(body).await {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e @ (Refused::Encode(_) | Refused::Thread(_))) => {
            tracing::warn!(error = %e, "conversion webhook: cannot answer");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::ServerName;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::conversion::certificate;

    /// A POST of `body` to the webhook at `port`, trusting `ca`: the
    /// response's first line.
    async fn post(port: u16, ca: &str, body: &str) -> String {
        post_or_refused(port, ca, body).await.unwrap()
    }

    /// [`post`], or why the handshake failed (`ca` may be a bundle).
    async fn post_or_refused(port: u16, ca: &str, body: &str) -> Result<String, String> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(ca.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let request = format!(
            "POST {PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        tls.read_to_string(&mut response).await.unwrap_or_default();
        Ok(response.lines().next().unwrap_or_default().to_string())
    }

    /// A free local port, its address, and a certificate for 127.0.0.1.
    fn free_port_and_certificate() -> (u16, SocketAddr, Certificate) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let made = certificate::make(&["127.0.0.1".into()]).unwrap();
        (port, ([127, 0, 0, 1], port).into(), made)
    }

    /// The serving certificate of `made`.
    fn serving(made: &Certificate) -> Arc<ServingCertificate> {
        Arc::new(ServingCertificate::new(made).unwrap())
    }

    #[tokio::test]
    async fn a_stalled_handshake_holds_up_no_other_client() {
        let (port, addr, made) = free_port_and_certificate();
        let ca = made.ca_pem.clone();
        tokio::spawn(serve(
            addr,
            serving(&made),
            Arc::default(),
            std::future::pending(),
        ));
        let mut stalled = None;
        for _ in 0..50 {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    stalled = Some(stream);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        assert!(stalled.is_some(), "the webhook listens");
        let answered = tokio::time::timeout(Duration::from_secs(2), post(port, &ca, "{}"));
        let status = answered.await.expect("answered while a handshake stalls");
        assert_eq!(status, "HTTP/1.1 400 Bad Request");
    }

    #[tokio::test]
    async fn once_told_to_stop_it_ends_and_listens_no_more() {
        let (port, addr, made) = free_port_and_certificate();
        let ca = made.ca_pem.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(serve(addr, serving(&made), Arc::default(), async move {
            let _ = stopped.await;
        }));
        let mut answered = String::new();
        for _ in 0..50 {
            if TcpStream::connect(addr).await.is_ok() {
                answered = post(port, &ca, "{}").await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            answered, "HTTP/1.1 400 Bad Request",
            "answers until stopped"
        );
        stop.send(()).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(5), serving).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "no longer listening"
        );
    }

    #[tokio::test]
    async fn a_new_certificate_serves_from_the_next_handshake() {
        let (port, addr, old) = free_port_and_certificate();
        let certificate = serving(&old);
        tokio::spawn(serve(
            addr,
            certificate.clone(),
            Arc::default(),
            std::future::pending(),
        ));
        let mut answered = None;
        for _ in 0..50 {
            if TcpStream::connect(addr).await.is_ok() {
                answered = Some(post(port, &old.ca_pem, "{}").await);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(answered.as_deref(), Some("HTTP/1.1 400 Bad Request"));
        let new = certificate::make(&["127.0.0.1".into()]).unwrap();
        certificate.set(&new).unwrap();
        let refused = post_or_refused(port, &old.ca_pem, "{}").await;
        assert!(
            refused.is_err(),
            "the old CA alone no longer verifies it: {refused:?}"
        );
        let bundle = format!("{}{}", old.ca_pem, new.ca_pem);
        assert_eq!(post(port, &bundle, "{}").await, "HTTP/1.1 400 Bad Request");
    }
}
