//! The webhook's HTTPS endpoint: TLS with the shared certificate (swapped
//! for its successor while it runs, [`ServingCertificate`]), one route,
//! [`super::PATH`], answering `ConversionReview`s.
//!
//! Anyone who reaches its port is a client (the API server presents no
//! certificate to a conversion webhook: docs/security.md), so what a client
//! can make it hold is bounded before the first byte is buffered: open
//! connections and handshakes under way ([`Limits`]), how long a request's
//! head, its body and a write to the client may take, and the bytes of
//! reviews held at once, reserved by their announced length
//! ([`super::budget`], [`super::intake`]).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;

use super::budget::{Refused, Rooms};
use super::certificate::Certificate;
use super::intake::{Answer, Intake, NotTaken, Pace};
use super::worker::{Refused as NotAnswered, Workers};
use super::{Conversions, PATH};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// How many handshakes may be under way at once (each costs a key
/// exchange's CPU): a client that stalls its handshake holds up nobody
/// else until [`CONNECTIONS`] are open.
const HANDSHAKES: usize = 64;
/// How many connections may be open at once, handshaking or not. Every
/// API server keeps a few to each replica (Go keeps up to 25 idle per
/// host) and opens more in a burst of lists; each connection costs up to
/// about 300 KiB of buffers (TLS records, [`BUFFER`] each way), under
/// 40 MiB for all. Past it, new connections wait in the kernel's queue.
const CONNECTIONS: usize = 128;
/// How long a request's head may take to arrive, counted from the start
/// of the connection or the end of the previous answer, so also how long
/// a connection may stay idle between reviews (hyper's header read
/// timeout is both). The API server writes a head in one go; one of its
/// connections idle that long is closed, and it opens another.
const HEADERS: Duration = Duration::from_secs(10);
/// How long a write to a client may wait: one that stops reading its
/// answer is dropped, and the answer's reservation with it.
const WRITE_STALL: Duration = Duration::from_secs(10);
/// The most a connection buffers each way (hyper's `max_buf_size`): a
/// body arrives in pieces of at most this, an answer leaves in chunks of
/// it ([`super::intake::CHUNK`]); a request head must fit (the API
/// server's take a few hundred bytes).
const BUFFER: usize = 64 << 10;

/// What the webhook lets its clients make it hold; [`Limits::default`]
/// takes the constants of this module and of [`super::budget`] and
/// [`super::intake`], which say why each value.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Connections open at once.
    pub connections: usize,
    /// Handshakes under way at once.
    pub handshakes: usize,
    /// How long a handshake may take.
    pub handshake: Duration,
    /// How long a request's head may take, or a connection stay idle.
    pub headers: Duration,
    /// How long a write to a client may wait.
    pub write_stall: Duration,
    /// The bytes of reviews held at once.
    pub rooms: Rooms,
    /// How long a review's body may take to arrive.
    pub pace: Pace,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: CONNECTIONS,
            handshakes: HANDSHAKES,
            handshake: HANDSHAKE,
            headers: HEADERS,
            write_stall: WRITE_STALL,
            rooms: Rooms::default(),
            pace: Pace::default(),
        }
    }
}

/// Serves the webhook on `addr` until `stop` resolves (or the task is
/// dropped); then closes idle connections and ends once the reviews under
/// way are answered.
pub async fn serve(
    addr: SocketAddr,
    certificate: Arc<ServingCertificate>,
    conversions: Arc<Conversions>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_within(addr, certificate, conversions, Limits::default(), stop).await
}

/// [`serve`] within `limits`.
async fn serve_within(
    addr: SocketAddr,
    certificate: Arc<ServingCertificate>,
    conversions: Arc<Conversions>,
    limits: Limits,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(certificate)?));
    let tcp = TcpListener::bind(addr).await?;
    let desk = Desk {
        intake: Intake::new(limits.rooms, limits.pace),
        workers: Workers::new(conversions),
    };
    let app = Router::new().route(PATH, post(convert)).with_state(desk);
    let slots = Slots::new(&limits);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            accepted = slots.accept(&tcp) => accepted,
        };
        if let Some((stream, peer, held)) = accepted {
            let (acceptor, app, watcher) = (acceptor.clone(), app.clone(), graceful.watcher());
            let connection = Connection {
                peer,
                held,
                limits,
                watcher,
            };
            tokio::spawn(connection.serve(stream, acceptor, app));
        }
    }
    drop(tcp);
    graceful.shutdown().await;
    Ok(())
}

/// The connections open and the handshakes under way, counted.
struct Slots {
    open: Arc<Semaphore>,
    handshakes: Arc<Semaphore>,
}

/// A connection's slot, and its handshake's while it lasts.
struct Held {
    _open: OwnedSemaphorePermit,
    handshake: OwnedSemaphorePermit,
}

impl Slots {
    fn new(limits: &Limits) -> Self {
        Self {
            open: Arc::new(Semaphore::new(limits.connections)),
            handshakes: Arc::new(Semaphore::new(limits.handshakes)),
        }
    }

    /// The next connection, once one may open and handshake (None when
    /// accepting failed: retried after a pause).
    async fn accept(&self, tcp: &TcpListener) -> Option<(TcpStream, SocketAddr, Held)> {
        let open = self.open.clone().acquire_owned().await.ok()?;
        let handshake = self.handshakes.clone().acquire_owned().await.ok()?;
        match tcp.accept().await {
            Ok((stream, peer)) => Some((
                stream,
                peer,
                Held {
                    _open: open,
                    handshake,
                },
            )),
            Err(e) => {
                tracing::warn!(error = %e, "conversion webhook: cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                None
            }
        }
    }
}

/// One client's connection, holding its slots until it ends.
struct Connection {
    peer: SocketAddr,
    held: Held,
    limits: Limits,
    watcher: Watcher,
}

impl Connection {
    /// Handshakes `stream` and serves `app` on it until it closes, a
    /// deadline passes, or the server stops.
    async fn serve(self, stream: TcpStream, acceptor: TlsAcceptor, app: Router) {
        let Self {
            peer,
            held,
            limits,
            watcher,
        } = self;
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(limits.write_stall));
        let tls =
            match tokio::time::timeout(limits.handshake, acceptor.accept(Box::pin(stream))).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "conversion webhook: handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "conversion webhook: handshake timed out");
                    return;
                }
            };
        let Held { _open, handshake } = held;
        drop(handshake);
        // Where clients come from: the addresses a NetworkPolicy names.
        tracing::debug!(%peer, "conversion webhook: connection");
        let http = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.headers)
            .max_buf_size(BUFFER)
            .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
        if let Err(e) = watcher.watch(http).await {
            tracing::debug!(%peer, error = %e, "conversion webhook: connection ended");
        }
    }
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

/// What answers a review: the intake that reserves and reads it, the
/// workers that answer it.
#[derive(Debug, Clone)]
struct Desk {
    intake: Intake,
    workers: Workers,
}

/// One `ConversionReview`: 400 when it is not one; refused before it is
/// read when it cannot be held ([`not_taken`]).
async fn convert(State(desk): State<Desk>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let (review, reservation) = match desk.intake.take(&parts.headers, body).await {
        Ok(taken) => taken,
        Err(e) => return not_taken(&e),
    };
    match desk.workers.answer(review).await {
        Ok(answer) => {
            let body = axum::body::Body::new(Answer::new(answer, reservation));
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(e @ (NotAnswered::Encode(_) | NotAnswered::Thread(_))) => {
            tracing::warn!(error = %e, "conversion webhook: cannot answer");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// The answer to a review not taken in, closing the connection (its body
/// may be unread): 411 without a length, 413 longer than any review read,
/// 503 with `Retry-After` when its room is full (the API server's client
/// retries), 408 when its body came too slowly, 400 when it was not the
/// length announced.
fn not_taken(e: &NotTaken) -> Response {
    tracing::debug!(error = %e, "conversion webhook: review not taken");
    let status = match e {
        NotTaken::Refused(Refused::NoLength) => StatusCode::LENGTH_REQUIRED,
        NotTaken::Refused(Refused::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
        NotTaken::Refused(Refused::Busy { .. }) => StatusCode::SERVICE_UNAVAILABLE,
        NotTaken::Late(_) => StatusCode::REQUEST_TIMEOUT,
        NotTaken::Broken(_) => StatusCode::BAD_REQUEST,
    };
    let mut response = (status, [(header::CONNECTION, "close")], e.to_string()).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        let retry = HeaderValue::from_static("1");
        response.headers_mut().insert(header::RETRY_AFTER, retry);
    }
    response
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::ServerName;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::client::TlsStream;

    use super::*;
    use crate::conversion::certificate;

    /// A POST of `body` to the webhook at `port`, trusting `ca`: the
    /// response's first line.
    async fn post(port: u16, ca: &str, body: &str) -> String {
        post_or_refused(port, ca, body).await.unwrap()
    }

    /// [`post`], or why the handshake failed (`ca` may be a bundle).
    async fn post_or_refused(port: u16, ca: &str, body: &str) -> Result<String, String> {
        let mut tls = connect(port, ca).await?;
        let request = format!(
            "POST {PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        tls.read_to_string(&mut response).await.unwrap_or_default();
        Ok(response.lines().next().unwrap_or_default().to_string())
    }

    /// A TLS connection to the webhook at `port`, trusting `ca`, or why
    /// the handshake failed.
    async fn connect(port: u16, ca: &str) -> Result<TlsStream<TcpStream>, String> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        connect_over(tcp, ca).await
    }

    /// [`connect`] over `tcp`.
    async fn connect_over(tcp: TcpStream, ca: &str) -> Result<TlsStream<TcpStream>, String> {
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
        let name = ServerName::try_from("127.0.0.1").unwrap();
        connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())
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

    /// Limits small enough for a test: rooms of a few KiB (a large one of
    /// 256 KiB), deadlines of a few hundred milliseconds.
    fn tight() -> Limits {
        Limits {
            connections: 8,
            handshakes: 8,
            handshake: Duration::from_secs(5),
            headers: Duration::from_secs(5),
            write_stall: Duration::from_secs(5),
            rooms: Rooms {
                small_max: 4 << 10,
                small: 64 << 10,
                large: 256 << 10,
            },
            pace: Pace {
                base: Duration::from_millis(300),
                rate: 16 << 20,
            },
        }
    }

    /// The webhook answering for Greeting within `limits`, listening: its
    /// port and CA.
    async fn start(limits: Limits) -> (u16, String) {
        let (port, addr, made) = free_port_and_certificate();
        let conversions = Arc::new(crate::conversion::review::tests::conversions());
        let stop = std::future::pending();
        tokio::spawn(serve_within(
            addr,
            serving(&made),
            conversions,
            limits,
            stop,
        ));
        for _ in 0..50 {
            if TcpStream::connect(addr).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (port, made.ca_pem)
    }

    /// A review of one Greeting at v1 asking for v2 (its `message` made
    /// of `fill` bytes when more than 0), padded with spaces to `length`.
    fn review(length: usize, fill: usize) -> String {
        let message = if fill == 0 {
            "hi".to_string()
        } else {
            "m".repeat(fill)
        };
        let review = format!(
            r#"{{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{{"uid":"u-1","desiredAPIVersion":"hello.example.com/v2","objects":[{{"apiVersion":"hello.example.com/v1","kind":"Greeting","metadata":{{"name":"one"}},"spec":{{"message":"{message}"}}}}]}}}}"#
        );
        let padding = " ".repeat(length.saturating_sub(review.len()));
        review + &padding
    }

    /// The head of a POST announcing `length` bytes (chunked when None),
    /// asking to be told to go on before sending its body when `expect`.
    fn head(length: Option<usize>, expect: bool) -> String {
        let length = match length {
            Some(length) => format!("content-length: {length}\r\n"),
            None => "transfer-encoding: chunked\r\n".into(),
        };
        let expect = if expect {
            "expect: 100-continue\r\n"
        } else {
            ""
        };
        format!(
            "POST {PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n{length}{expect}\r\n"
        )
    }

    /// What `tls` answers within `within`: up to the end of a head when
    /// `head_only`, else until it closes (what arrived when it breaks off).
    /// None when nothing came.
    async fn answer(
        tls: &mut TlsStream<TcpStream>,
        within: Duration,
        head_only: bool,
    ) -> Option<String> {
        let mut read = Vec::new();
        let reading = async {
            let mut buffer = [0u8; 16 << 10];
            loop {
                match tls.read(&mut buffer).await {
                    Ok(n) if n > 0 => read.extend_from_slice(&buffer[..n]),
                    _ => return,
                }
                if head_only && read.windows(4).any(|w| w == b"\r\n\r\n") {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(within, reading).await;
        (!read.is_empty()).then(|| String::from_utf8_lossy(&read).into_owned())
    }

    /// The first line of `answer`.
    fn status(answer: Option<&str>) -> &str {
        answer.and_then(|a| a.lines().next()).unwrap_or_default()
    }

    /// A connection that sent the head of a `length`-byte review and was
    /// told to go on: its reservation is made, its body being read.
    async fn reserved(port: u16, ca: &str, length: usize) -> TlsStream<TcpStream> {
        let mut tls = connect(port, ca).await.unwrap();
        tls.write_all(head(Some(length), true).as_bytes())
            .await
            .unwrap();
        let told = answer(&mut tls, Duration::from_secs(2), true).await;
        assert_eq!(status(told.as_deref()), "HTTP/1.1 100 Continue");
        tls
    }

    /// The status of a `length`-byte review sent whole.
    async fn send(port: u16, ca: &str, length: usize) -> String {
        let mut tls = connect(port, ca).await.unwrap();
        let request = format!("{}{}", head(Some(length), false), review(length, 0));
        tls.write_all(request.as_bytes()).await.unwrap();
        let answered = answer(&mut tls, Duration::from_secs(5), false).await;
        status(answered.as_deref()).to_string()
    }

    #[tokio::test]
    async fn a_review_announcing_no_length_or_too_much_is_refused_before_its_body() {
        let limits = tight();
        let (port, ca) = start(limits).await;
        let too_much = limits.rooms.large as usize + 1;
        for (length, refused) in [
            (Some(too_much), "HTTP/1.1 413 Payload Too Large"),
            (None, "HTTP/1.1 411 Length Required"),
        ] {
            let mut tls = connect(port, &ca).await.unwrap();
            tls.write_all(head(length, true).as_bytes()).await.unwrap();
            let answered = answer(&mut tls, Duration::from_secs(2), false).await;
            assert_eq!(status(answered.as_deref()), refused, "{answered:?}");
        }
    }

    #[tokio::test]
    async fn a_stalled_body_is_dropped_at_its_deadline_and_its_room_freed() {
        let limits = tight();
        let (port, ca) = start(limits).await;
        let large = limits.rooms.large as usize;
        let mut stalled = reserved(port, &ca, large).await;
        let body = review(large, 0);
        stalled
            .write_all(&body.as_bytes()[..large - 1])
            .await
            .unwrap();
        // The room is held: another large review is turned away at once,
        // to be sent again.
        let mut turned = connect(port, &ca).await.unwrap();
        turned
            .write_all(head(Some(large), true).as_bytes())
            .await
            .unwrap();
        let busy = answer(&mut turned, Duration::from_secs(2), false).await;
        assert_eq!(status(busy.as_deref()), "HTTP/1.1 503 Service Unavailable");
        assert!(busy.unwrap().to_lowercase().contains("retry-after: 1"));
        // One byte short at the deadline: dropped, and the room is free.
        let deadline = limits.pace.deadline(limits.rooms.large) + Duration::from_secs(2);
        let late = answer(&mut stalled, deadline, false).await;
        assert_eq!(status(late.as_deref()), "HTTP/1.1 408 Request Timeout");
        assert_eq!(send(port, &ca, large).await, "HTTP/1.1 200 OK");
    }

    #[tokio::test]
    async fn a_small_review_is_answered_while_large_ones_stall() {
        let limits = tight();
        let (port, ca) = start(limits).await;
        let large = limits.rooms.large as usize;
        let mut stalled = reserved(port, &ca, large / 2).await;
        let body = review(large / 2, 0);
        stalled
            .write_all(&body.as_bytes()[..large / 2 - 1])
            .await
            .unwrap();
        let _also = reserved(port, &ca, large / 2).await;
        let mut turned = connect(port, &ca).await.unwrap();
        turned
            .write_all(head(Some(large), true).as_bytes())
            .await
            .unwrap();
        let busy = answer(&mut turned, Duration::from_secs(2), false).await;
        assert_eq!(status(busy.as_deref()), "HTTP/1.1 503 Service Unavailable");
        let small = review(200, 0);
        let mut tls = connect(port, &ca).await.unwrap();
        let request = format!("{}{small}", head(Some(small.len()), false));
        tls.write_all(request.as_bytes()).await.unwrap();
        let answered = answer(&mut tls, Duration::from_secs(2), false).await;
        assert_eq!(status(answered.as_deref()), "HTTP/1.1 200 OK");
        assert!(answered.unwrap().contains(r#""text":"hi""#), "converted");
    }

    #[tokio::test]
    async fn a_client_that_sends_no_head_is_dropped_at_the_header_deadline() {
        let limits = Limits {
            headers: Duration::from_millis(300),
            ..tight()
        };
        let (port, ca) = start(limits).await;
        let mut silent = connect(port, &ca).await.unwrap();
        let mut partial = connect(port, &ca).await.unwrap();
        partial
            .write_all(b"POST /convert HTTP/1.1\r\nhost:")
            .await
            .unwrap();
        for tls in [&mut silent, &mut partial] {
            let mut byte = [0u8; 1];
            let closed = tokio::time::timeout(Duration::from_secs(3), tls.read(&mut byte)).await;
            assert!(
                matches!(closed, Ok(Ok(0) | Err(_))),
                "closed at the deadline: {closed:?}"
            );
        }
    }

    #[tokio::test]
    async fn connections_past_the_limit_wait_until_one_closes() {
        let limits = Limits {
            connections: 2,
            ..tight()
        };
        let (port, ca) = start(limits).await;
        let first = connect(port, &ca).await.unwrap();
        let _second = connect(port, &ca).await.unwrap();
        let third = tokio::time::timeout(Duration::from_secs(1), connect(port, &ca)).await;
        assert!(third.is_err(), "no handshake for a third connection");
        drop(first);
        let answered = tokio::time::timeout(Duration::from_secs(3), post(port, &ca, "{}")).await;
        assert_eq!(answered.as_deref(), Ok("HTTP/1.1 400 Bad Request"));
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_its_answer_is_dropped_and_frees_its_room() {
        let large = 8 << 20;
        let limits = Limits {
            write_stall: Duration::from_millis(300),
            rooms: Rooms {
                large,
                ..tight().rooms
            },
            ..tight()
        };
        let (port, ca) = start(limits).await;
        let length = large as usize;
        // An answer larger than the sockets' buffers (the client's made
        // small), never read.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(64 << 10).unwrap();
        let tcp = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        let mut unread = connect_over(tcp, &ca).await.unwrap();
        let request = format!(
            "{}{}",
            head(Some(length), false),
            review(length, length - 400)
        );
        unread.write_all(request.as_bytes()).await.unwrap();
        let mut turned = connect(port, &ca).await.unwrap();
        turned
            .write_all(head(Some(length), true).as_bytes())
            .await
            .unwrap();
        let busy = answer(&mut turned, Duration::from_secs(2), false).await;
        assert_eq!(status(busy.as_deref()), "HTTP/1.1 503 Service Unavailable");
        // Answered (slowly, in a debug build on a busy machine), stalled,
        // dropped: the room is free.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut told = None;
        while tokio::time::Instant::now() < deadline {
            let mut tls = connect(port, &ca).await.unwrap();
            tls.write_all(head(Some(length), true).as_bytes())
                .await
                .unwrap();
            told = answer(&mut tls, Duration::from_secs(2), true).await;
            if status(told.as_deref()) != "HTTP/1.1 503 Service Unavailable" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(status(told.as_deref()), "HTTP/1.1 100 Continue");
        drop(unread);
    }
}
