//! The operator's connections to the API server: HTTP/2, so that its
//! watches share a few connections instead of holding one each.
//!
//! kube's own stack speaks HTTP/1.1 only. There every watch is a TCP and
//! TLS connection of its own, with hyper's buffers and rustls' state (some
//! 60 KiB each), and every new watch pays a TLS handshake. A served
//! KindDefinition has one or two watches, so 200 of them held 400
//! connections.
//!
//! Here TLS offers `h2` before `http/1.1`. Over HTTP/2 one connection
//! carries many requests at once, as client-go's do. Its streams are
//! capped by the server (Go's default is 250; kube-apiserver's flag
//! `--http2-max-streams-per-connection`), and a stream past the cap waits
//! until another ends. A watch does not end, so a request past the cap
//! would wait for good: [`Lanes`] opens a new connection before one
//! carries [`STREAMS_PER_CONNECTION`] requests, as Go's transport opens one
//! when the cap is reached. A server (or proxy) that offers only HTTP/1.1
//! gets a connection per request, as before.
//!
//! The rest of the stack is kube's: its base URI, retry policy,
//! authentication and extra headers. A connection's health is checked with
//! HTTP/2 pings ([`KEEP_ALIVE`]) where kube's stack sets a read timeout.
//! A proxy in the kubeconfig is left to kube's own stack.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::Client as Pool;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt as _, DynBody};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// Requests one connection carries at once; the next opens another. Below
/// the API server's cap (250 by Go's default) and common proxies' (128).
pub const STREAMS_PER_CONNECTION: usize = 100;

/// How much a connection may receive that its streams have not read yet,
/// as Go's client allows: a window no larger would let a few watches whose
/// readers lag hold back every other stream on their connection. A
/// stream's own window (hyper's, 2 MiB) still bounds what one holds.
pub const CONNECTION_WINDOW: u32 = 1 << 30;

/// How often an idle connection is pinged, and how long the answer may
/// take before the connection is dropped (and its watches start again).
pub const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(20));

/// The service a client is built on: the type kube's own stack has.
pub type Service = tower::util::BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// A client builder, its transport HTTP/2 where the server speaks it.
pub type Stack = ClientBuilder<Service>;

/// A client builder for `config`. Builders made from one [`Lanes`] share
/// its connections; kube's own builder is used when a proxy is set.
pub fn builder(config: &Config, lanes: &Lanes<HttpsPool>) -> Result<Stack, kube::Error> {
    if config.proxy_url.is_some() {
        return ClientBuilder::try_from(config.clone());
    }
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .service(lanes.clone())
        .map_response(|response| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        })
        .boxed();
    Ok(ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    ))
}

/// A pool of connections to the API server over TLS, offering HTTP/2.
pub type HttpsPool = Pool<hyper_rustls::HttpsConnector<HttpConnector>, Body>;

/// Lanes of connections to the cluster in `config`, none open yet.
pub fn https_lanes(config: &Config) -> Result<Lanes<HttpsPool>, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    // A request's frames go out as written, as Go's client does: Nagle's
    // algorithm held an HTTP/2 request's body behind its headers until the
    // server's delayed ACK (a reconcile's p50 211 -> 306 ms).
    http.set_nodelay(true);
    let mut tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .map_err(kube::client::RustlsTlsError::InvalidServerName)
            .map_err(kube::Error::RustlsTls)?;
        tls = tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let connector = tls.enable_all_versions().wrap_connector(http);
    let mut pool = Pool::builder(TokioExecutor::new());
    pool.timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(KEEP_ALIVE.0)
        .http2_keep_alive_timeout(KEEP_ALIVE.1)
        .http2_keep_alive_while_idle(true)
        .http2_initial_connection_window_size(CONNECTION_WINDOW);
    Ok(Lanes::new(STREAMS_PER_CONNECTION, move || {
        pool.build(connector.clone())
    }))
}

/// Services (each with connections of its own) that requests are spread
/// over: a request goes to the first lane carrying fewer than its limit,
/// or to a new lane. A request is carried until its response's body is
/// dropped, so a watch holds its place for as long as it runs.
pub struct Lanes<S> {
    open: Arc<Mutex<Vec<Lane<S>>>>,
    make: Arc<dyn Fn() -> S + Send + Sync>,
    limit: usize,
}

impl<S> Clone for Lanes<S> {
    fn clone(&self) -> Self {
        Self {
            open: self.open.clone(),
            make: self.make.clone(),
            limit: self.limit,
        }
    }
}

/// One service, and how many requests it carries.
struct Lane<S> {
    service: S,
    carried: Arc<AtomicUsize>,
}

impl<S: Clone> Lanes<S> {
    /// No lane yet; `make` makes each, carrying at most `limit` requests.
    pub fn new(limit: usize, make: impl Fn() -> S + Send + Sync + 'static) -> Self {
        Self {
            open: Arc::default(),
            make: Arc::new(make),
            limit: limit.max(1),
        }
    }

    /// How many requests each lane carries now, in the order opened.
    #[cfg(test)]
    fn carried(&self) -> Vec<usize> {
        let lanes = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        lanes
            .iter()
            .map(|lane| lane.carried.load(Ordering::Relaxed))
            .collect()
    }

    /// The lane for the next request, its place in it taken.
    fn take(&self) -> (S, Carried) {
        let mut lanes = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let free = lanes
            .iter()
            .position(|lane| lane.carried.load(Ordering::Relaxed) < self.limit);
        let index = free.unwrap_or_else(|| {
            lanes.push(Lane {
                service: (self.make)(),
                carried: Arc::default(),
            });
            lanes.len() - 1
        });
        let lane = &lanes[index];
        lane.carried.fetch_add(1, Ordering::Relaxed);
        (lane.service.clone(), Carried(lane.carried.clone()))
    }
}

impl<S, R, B> tower::Service<Request<R>> for Lanes<S>
where
    S: tower::Service<Request<R>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    R: Send + 'static,
{
    type Response = Response<Counted<B>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each call takes its lane's own service and waits for it there.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<R>) -> Self::Future {
        let (service, carried) = self.take();
        Box::pin(async move {
            let response = service.oneshot(request).await.map_err(Into::into)?;
            Ok(response.map(|body| Counted {
                body,
                _carried: carried,
            }))
        })
    }
}

/// A place taken in a lane, given back when dropped.
struct Carried(Arc<AtomicUsize>);

impl Drop for Carried {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response's body, holding its request's place in its lane.
pub struct Counted<B> {
    body: B,
    _carried: Carried,
}

impl<B: HttpBody + Unpin> HttpBody for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::Service as _;

    type Answering = tower::util::BoxCloneSyncService<Request<()>, Response<String>, BoxError>;

    /// Lanes answering every request with an empty body, and how many
    /// were made.
    fn lanes(limit: usize) -> (Lanes<Answering>, Arc<AtomicUsize>) {
        let made = Arc::new(AtomicUsize::new(0));
        let counted = made.clone();
        let lanes = Lanes::new(limit, move || {
            counted.fetch_add(1, Ordering::Relaxed);
            tower::util::BoxCloneSyncService::new(tower::service_fn(|_: Request<()>| async {
                Ok::<_, BoxError>(Response::new(String::new()))
            }))
        });
        (lanes, made)
    }

    #[tokio::test]
    async fn a_lane_full_of_open_responses_opens_the_next() {
        let (mut lanes, made) = lanes(2);
        let mut open = Vec::new();
        for _ in 0..5 {
            open.push(lanes.call(Request::new(())).await.unwrap());
        }
        assert_eq!(lanes.carried(), vec![2, 2, 1]);
        assert_eq!(made.load(Ordering::Relaxed), 3);
        drop(open.remove(0));
        assert_eq!(lanes.carried(), vec![1, 2, 1]);
        // A freed place is taken before a new lane is opened.
        open.push(lanes.call(Request::new(())).await.unwrap());
        assert_eq!(lanes.carried(), vec![2, 2, 1]);
        assert_eq!(made.load(Ordering::Relaxed), 3);
        drop(open);
        assert_eq!(lanes.carried(), vec![0, 0, 0]);
    }

    #[tokio::test]
    async fn a_failed_request_gives_its_place_back() {
        let mut lanes = Lanes::new(1, || {
            tower::service_fn(|_: Request<()>| async {
                Err::<Response<String>, BoxError>("refused".into())
            })
        });
        assert!(lanes.call(Request::new(())).await.is_err());
        assert!(lanes.call(Request::new(())).await.is_err());
        assert_eq!(lanes.carried(), vec![0]);
    }
}
