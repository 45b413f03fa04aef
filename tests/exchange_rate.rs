//! ExchangeRate (operators.brennerm.github.io/v1) against the real control
//! plane, with a rate provider served on loopback by the test.

use ko_test_support as common;

use kustomize_operator::kind::{ConditionStatus, ConditionType, Reason};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kustomize_operator::kind::{KustomizeDir, Owner};
use kustomize_operator::kinds::exchange_rate::{
    ExchangeRate, ExchangeRateHandler, ExchangeRateSpec, ExchangeRateStatus, Fetched,
    REFRESH_ANNOTATION, config_map_name,
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

/// What the test provider answers.
#[derive(Debug, Clone)]
enum Mode {
    /// `{"base": .., "rates": {"<currency>": <rate>}}`
    Rate(String),
    /// An error status.
    Status(u16),
    /// 200 with a body that is not JSON.
    Garbage,
    /// JSON without the requested currency.
    NoCurrency,
    /// No answer for 30 s (the operator's timeout is shorter).
    Hang,
}

struct ProviderState {
    mode: Mutex<Mode>,
    requests: AtomicUsize,
    /// When each request came.
    arrivals: Mutex<Vec<std::time::Instant>>,
}

/// A rate provider on 127.0.0.1, answering `/rates/{base}/{currency}`.
struct TestProvider {
    state: Arc<ProviderState>,
    addr: SocketAddr,
}

impl TestProvider {
    async fn start(rate: &str) -> Self {
        let state = Arc::new(ProviderState {
            mode: Mutex::new(Mode::Rate(rate.into())),
            requests: AtomicUsize::new(0),
            arrivals: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/rates/{base}/{currency}", get(answer))
            .with_state(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { state, addr }
    }

    fn set(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = mode;
    }

    fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// The time between each request and the next.
    fn gaps(&self) -> Vec<Duration> {
        let arrivals = self.state.arrivals.lock().unwrap();
        arrivals.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// Operator flags pointing at this provider; refresh intervals down to 1 s.
    fn operator_args(&self) -> Vec<String> {
        vec![
            "--kinds".into(),
            "exchangerate".into(),
            "--exchange-rate-url".into(),
            format!("http://{}/rates/{{base}}/{{currency}}", self.addr),
            "--exchange-rate-path".into(),
            "rates.{currency}".into(),
            "--exchange-rate-timeout".into(),
            "1s".into(),
            "--exchange-rate-min-refresh".into(),
            "1s".into(),
        ]
    }
}

async fn answer(
    State(state): State<Arc<ProviderState>>,
    Path((base, currency)): Path<(String, String)>,
) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    state
        .arrivals
        .lock()
        .unwrap()
        .push(std::time::Instant::now());
    let mode = state.mode.lock().unwrap().clone();
    let json = |body: String| {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    };
    match mode {
        Mode::Rate(rate) => json(
            json!({"amount": 1.0, "base": base, "rates": {currency: rate.parse::<f64>().unwrap()}})
                .to_string(),
        ),
        Mode::Status(code) => {
            (StatusCode::from_u16(code).unwrap(), "provider failure").into_response()
        }
        Mode::Garbage => json("<html>not json</html>".into()),
        Mode::NoCurrency => json(json!({"base": base, "rates": {}}).to_string()),
        Mode::Hang => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            json("{}".into())
        }
    }
}

async fn start_operator(ns: &str, provider: &TestProvider) -> kustomize_operator::Operator {
    let args = provider.operator_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::start_operator(ns, &args).await
}

fn exchange_rate(name: &str, currency: &str, interval: &str) -> ExchangeRate {
    ExchangeRate::new(
        name,
        ExchangeRateSpec {
            currency: currency.into(),
            base: None,
            refresh_interval: Some(interval.into()),
        },
    )
}

async fn status(api: &Api<ExchangeRate>, name: &str) -> ExchangeRateStatus {
    api.get(name).await.unwrap().status.unwrap_or_default()
}

/// Waits until Ready=True with `rate`; returns the status.
async fn wait_rate(api: &Api<ExchangeRate>, name: &str, rate: &str) -> ExchangeRateStatus {
    common::wait_until(
        TIMEOUT,
        format!("{name} Ready with the rate {rate}"),
        || async {
            let s = status(api, name).await;
            s.common.is_ready() && s.rate.rate.as_deref() == Some(rate)
        },
    )
    .await;
    status(api, name).await
}

async fn wait_fetch_failed(api: &Api<ExchangeRate>, name: &str) -> ExchangeRateStatus {
    common::wait_until(
        TIMEOUT,
        format!("{name} Ready=False with reason FetchFailed"),
        || async {
            status(api, name)
                .await
                .common
                .condition(ConditionType::Ready)
                .is_some_and(|c| {
                    c.status == ConditionStatus::False && c.reason == Reason::FetchFailed
                })
        },
    )
    .await;
    status(api, name).await
}

async fn request_refresh(api: &Api<ExchangeRate>, name: &str, value: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {REFRESH_ANNOTATION: value}}})),
    )
    .await
    .unwrap();
}

/// Sets a label on the ExchangeRate: a change that starts a reconcile.
async fn touch(api: &Api<ExchangeRate>, name: &str, value: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": value}}})),
    )
    .await
    .unwrap();
}

/// The ConfigMaps carrying the ExchangeRate's ownership marker.
async fn config_maps_of(client: &Client, ns: &str, er: &ExchangeRate) -> Vec<ConfigMap> {
    let selector = format!("{}={}", Owner::LABEL, er.uid().unwrap());
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

async fn warning_events(client: &Client, ns: &str, name: &str, reason: &str) -> usize {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
        })
        .count()
}

#[tokio::test]
async fn create_then_the_rate_changes_and_the_config_map_is_replaced() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-create").await;
    let provider = TestProvider::start("1.1901").await;
    let operator = start_operator(&ns.name, &provider).await;
    let api: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns.name);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);

    let created = api
        .create(
            &PostParams::default(),
            &exchange_rate("exchange-rate-usd", "USD", "3s"),
        )
        .await
        .unwrap();
    let s = wait_rate(&api, "exchange-rate-usd", "1.1901").await;
    assert_eq!(s.rate.base.as_deref(), Some("EUR"));
    assert_eq!(s.rate.currency.as_deref(), Some("USD"));
    let first = s.rate.config_map_name.clone().expect("configMapName");
    assert!(first.starts_with("exchange-rate-usd-"), "{first}");
    let cmd = s.common.last_command.expect("last command");
    assert!(
        cmd.command.contains("apply --server-side"),
        "{}",
        cmd.command
    );

    // The ConfigMap: the kustomize-hashed name in status, the four literals,
    // owned by the ExchangeRate.
    let cm = config_maps.get(&first).await.unwrap();
    let data = cm.data.clone().unwrap();
    assert_eq!(data["rate"], "1.1901");
    assert_eq!(data["base"], "EUR");
    assert_eq!(data["currency"], "USD");
    assert_eq!(
        Some(data["fetchedAt"].clone()),
        s.rate.fetched_at.map(|t| t.to_string())
    );
    let owner = &cm.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(owner.kind, "ExchangeRate");
    assert_eq!(owner.api_version, "operators.brennerm.github.io/v1");
    assert_eq!(owner.name, "exchange-rate-usd");
    assert_eq!(Some(&owner.uid), created.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));

    // The provider's rate changes: within the interval a new ConfigMap
    // replaces the old one, which the engine prunes (it left the inventory).
    provider.set(Mode::Rate("1.2345".into()));
    let s = wait_rate(&api, "exchange-rate-usd", "1.2345").await;
    let second = s.rate.config_map_name.clone().unwrap();
    assert_ne!(first, second);
    assert_eq!(
        config_maps.get(&second).await.unwrap().data.unwrap()["rate"],
        "1.2345"
    );
    common::wait_until(TIMEOUT, format!("the ConfigMap {first} gone"), || async {
        config_maps.get_opt(&first).await.unwrap().is_none()
    })
    .await;
    // Only the current ConfigMap (or, mid-refresh, the one replacing it) is left.
    let left = config_maps_of(&client, &ns.name, &created).await;
    assert!(left.len() <= 2, "{} ConfigMaps left", left.len());
    // Two fetches with different notes are two events, not one series that
    // keeps the first note.
    let notes: Vec<String> = Api::<Event>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Fetched"))
        .filter_map(|e| e.note)
        .collect();
    assert!(notes.iter().any(|n| n.contains("1.1901")), "{notes:?}");
    assert!(notes.iter().any(|n| n.contains("1.2345")), "{notes:?}");
    operator.stop().await;
}

/// The test-only TLS fixtures (`tests/fixtures/tls/generate`): a CA no
/// system trusts, and a certificate it signed for 127.0.0.1.
fn tls_fixture(name: &str) -> std::path::PathBuf {
    common::repo().join("tests/fixtures/tls").join(name)
}

/// A rate provider over HTTPS on 127.0.0.1, presenting the fixture's
/// certificate: answers `GET /rates/<base>/<currency>` with `rate`, one
/// request per connection, and counts the requests it answered (only
/// after a completed handshake).
struct TlsProvider {
    port: u16,
    answered: Arc<AtomicUsize>,
}

impl TlsProvider {
    fn start(rate: &str) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(tls_fixture("server.pem"))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_file(tls_fixture("server-key.pem")).unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let answered = Arc::new(AtomicUsize::new(0));
        let (count, rate) = (answered.clone(), rate.to_string());
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                let (config, count, rate) = (config.clone(), count.clone(), rate.clone());
                std::thread::spawn(move || {
                    let _ = serve_one(tcp, config, &count, &rate);
                });
            }
        });
        Self { port, answered }
    }

    fn requests(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Operator flags pointing at this provider.
    fn operator_args(&self) -> Vec<String> {
        vec![
            "--kinds".into(),
            "exchangerate".into(),
            "--exchange-rate-url".into(),
            format!(
                "https://127.0.0.1:{}/rates/{{base}}/{{currency}}",
                self.port
            ),
            "--exchange-rate-path".into(),
            "rates.{currency}".into(),
            "--exchange-rate-timeout".into(),
            "5s".into(),
            "--exchange-rate-min-refresh".into(),
            "1s".into(),
            "--metrics-addr".into(),
            String::new(),
        ]
    }
}

/// One HTTPS exchange: the handshake, a request head, a JSON answer.
fn serve_one(
    tcp: std::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
    answered: &AtomicUsize,
    rate: &str,
) -> std::io::Result<()> {
    use std::io::{Read, Write};
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let connection = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        if tls.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split_whitespace().nth(1).unwrap_or_default();
    let (status, body) = match path.strip_prefix("/rates/").and_then(|p| p.split_once('/')) {
        Some((base, currency)) => (
            "200 OK",
            json!({"base": base, "rates": {currency: rate.parse::<f64>().unwrap()}}).to_string(),
        ),
        None => ("404 Not Found", "{}".to_string()),
    };
    answered.fetch_add(1, Ordering::SeqCst);
    write!(
        tls,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    tls.flush()?;
    tls.conn.send_close_notify();
    tls.conn.complete_io(&mut tls.sock)?;
    Ok(())
}

/// A provider over HTTPS whose certificate a private CA signed: refused
/// as an unknown issuer while the operator trusts only the system's roots
/// (the provider answers nothing), fetched once the operator is given the
/// CA the supported way, `SSL_CERT_FILE` (the roots it reads instead of
/// the system's; docs/kinds/exchangerate.md).
#[tokio::test]
async fn an_https_provider_is_fetched_once_its_ca_is_trusted_and_refused_before() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-tls").await;
    let _release = common::StripFinalizersOnDrop(ns.name.clone());
    let provider = TlsProvider::start("4.2");
    let args = provider.operator_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let api: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns.name);

    let mut untrusting = common::OperatorProcess::spawn(&ns.name, &[], &args);
    api.create(&PostParams::default(), &exchange_rate("sek", "SEK", "1h"))
        .await
        .unwrap();
    let s = wait_fetch_failed(&api, "sek").await;
    let message = s
        .common
        .condition(ConditionType::Ready)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&format!(
            "https://127.0.0.1:{}/rates/EUR/SEK",
            provider.port
        )) && message.contains("invalid peer certificate: UnknownIssuer"),
        "{message}"
    );
    // Its first fetch: there is no last value to keep.
    assert!(!message.contains("keeping the last value"), "{message}");
    assert_eq!(
        provider.requests(),
        0,
        "a request got through the handshake"
    );
    assert!(s.rate.rate.is_none(), "{s:?}");
    untrusting.signal(libc::SIGTERM);
    assert!(
        untrusting.wait_exit(TIMEOUT).await.is_some(),
        "the operator did not stop"
    );

    let ca = tls_fixture("ca.pem").display().to_string();
    let _trusting = common::OperatorProcess::spawn(&ns.name, &[("SSL_CERT_FILE", &ca)], &args);
    let s = wait_rate(&api, "sek", "4.2").await;
    assert!(provider.requests() >= 1, "no request answered");
    let name = s.rate.config_map_name.expect("configMapName");
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .get(&name)
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["rate"], "4.2");
}

#[tokio::test]
async fn quiet_until_due_and_the_annotation_forces_a_refresh() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-refresh").await;
    let provider = TestProvider::start("1.1").await;
    let operator = start_operator(&ns.name, &provider).await;
    let api: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns.name);

    api.create(&PostParams::default(), &exchange_rate("chf", "CHF", "1h"))
        .await
        .unwrap();
    let s = wait_rate(&api, "chf", "1.1").await;
    // Nothing is due for an hour: a reconcile (started by a label; the
    // positive marker: it is counted as skipped) fetches nothing and runs
    // no kubectl. (The operator's own status write starts none.)
    let spawned = operator.kubectl_stats().spawned();
    touch(&api, "chf", "1").await;
    common::wait_until(
        TIMEOUT,
        "a skipped reconcile of the ExchangeRate",
        || async { operator.metrics().skipped_count("exchangerate") >= 1 },
    )
    .await;
    let fetches = provider.requests();
    assert_eq!(fetches, 1, "fetches on create");
    assert_eq!(operator.kubectl_stats().spawned(), spawned);

    // The annotation forces a fetch at once; the same value again does not.
    provider.set(Mode::Rate("1.2".into()));
    request_refresh(&api, "chf", "2026-01-01T00:00:00Z").await;
    let s2 = wait_rate(&api, "chf", "1.2").await;
    assert_eq!(
        s2.rate.refresh_requested_at.as_deref(),
        Some("2026-01-01T00:00:00Z")
    );
    assert_ne!(s2.rate.config_map_name, s.rate.config_map_name);
    assert_eq!(provider.requests(), fetches + 1);
    let skipped = operator.metrics().skipped_count("exchangerate");
    request_refresh(&api, "chf", "2026-01-01T00:00:00Z").await;
    // The same value again: a reconcile that finds nothing to do.
    touch(&api, "chf", "2").await;
    common::wait_until(
        TIMEOUT,
        "one more skipped reconcile of the ExchangeRate",
        || async { operator.metrics().skipped_count("exchangerate") > skipped },
    )
    .await;
    assert_eq!(provider.requests(), fetches + 1);
    operator.stop().await;

    // A restarted operator finds everything in status: no fetch, no kubectl.
    let second = start_operator(&ns.name, &provider).await;
    common::wait_until(
        TIMEOUT,
        "a skipped reconcile in the restarted operator",
        || async { second.metrics().skipped_count("exchangerate") >= 1 },
    )
    .await;
    assert_eq!(provider.requests(), fetches + 1);
    assert_eq!(second.kubectl_stats().spawned(), 0);
    second.stop().await;
}

#[tokio::test]
async fn a_failing_provider_keeps_the_last_value() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-fail").await;
    let provider = TestProvider::start("1.5").await;
    let operator = start_operator(&ns.name, &provider).await;
    let api: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns.name);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);

    api.create(&PostParams::default(), &exchange_rate("jpy", "JPY", "1h"))
        .await
        .unwrap();
    let good = wait_rate(&api, "jpy", "1.5").await;
    let mut good_cm = good.rate.config_map_name.clone().unwrap();

    let modes = [
        (Mode::Status(500), "HTTP 500"),
        (Mode::Garbage, "not JSON"),
        (Mode::NoCurrency, "no rate at \"rates.JPY\""),
        (Mode::Hang, "no response within"),
    ];
    for (i, (mode, expected)) in modes.into_iter().enumerate() {
        provider.set(mode.clone());
        request_refresh(&api, "jpy", &format!("attempt-{i}")).await;
        let s = wait_fetch_failed(&api, "jpy").await;
        let message = &s.common.condition(ConditionType::Ready).unwrap().message;
        assert!(message.contains(expected), "{mode:?}: {message}");
        assert!(message.contains("keeping the last value"), "{message}");
        // The last good value stays, in status and in its ConfigMap.
        assert_eq!(s.rate.rate.as_deref(), Some("1.5"), "{mode:?}");
        assert_eq!(s.rate.config_map_name.as_deref(), Some(good_cm.as_str()));
        assert_eq!(
            config_maps.get(&good_cm).await.unwrap().data.unwrap()["rate"],
            "1.5"
        );
        common::wait_until(TIMEOUT, "a FetchFailed warning event about jpy", || async {
            warning_events(&client, &ns.name, "jpy", "FetchFailed").await > 0
        })
        .await;
        // The provider recovers: the retry (with backoff) picks it up.
        provider.set(Mode::Rate("1.5".into()));
        common::wait_until(
            TIMEOUT,
            format!("jpy Ready after the refresh attempt-{i}"),
            || async {
                let s = status(&api, "jpy").await;
                s.common.is_ready()
                    && s.rate.refresh_requested_at.as_deref() == Some(&format!("attempt-{i}"))
            },
        )
        .await;
        // A new fetch: a new fetchedAt, so a new ConfigMap.
        good_cm = status(&api, "jpy").await.rate.config_map_name.unwrap();
    }
    operator.stop().await;
}

/// A failed fetch writes its status (Ready=False, FetchFailed); that
/// write must not start the next fetch ahead of the backoff (1 s, then
/// 2 s): three requests take at least three seconds, not milliseconds.
#[tokio::test]
async fn a_failing_provider_is_asked_again_only_when_the_backoff_allows() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-backoff").await;
    let provider = TestProvider::start("1.5").await;
    provider.set(Mode::Status(500));
    let operator = start_operator(&ns.name, &provider).await;
    let api: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns.name);
    // As `kubectl apply` leaves it: with its last-applied annotation, which
    // the operator's cache drops.
    let mut rate = exchange_rate("chf", "CHF", "1h");
    rate.metadata.annotations = Some(
        [(
            "kubectl.kubernetes.io/last-applied-configuration".to_string(),
            r#"{"kind":"ExchangeRate"}"#.to_string(),
        )]
        .into(),
    );
    api.create(&PostParams::default(), &rate).await.unwrap();
    wait_fetch_failed(&api, "chf").await;
    common::wait_until(
        TIMEOUT,
        "three requests to the failing provider",
        || async { provider.requests() >= 3 },
    )
    .await;
    let gaps = provider.gaps();
    assert!(
        gaps[0] >= Duration::from_millis(900) && gaps[1] >= Duration::from_millis(1800),
        "the provider was asked again ahead of the backoff: {gaps:?}"
    );
    operator.stop().await;
}

/// Deleting an ExchangeRate deletes its ConfigMaps: the engine does, before
/// its finalizer goes. Their ownerReference would let the garbage collector
/// delete them too, but only once the ExchangeRate is gone: the test holds
/// it with a finalizer of its own, so ConfigMaps that go while it is still
/// there were deleted by the engine, which then says so (a `Deleted` event
/// naming them), ran `kubectl delete` for them, and removed its finalizer.
#[tokio::test]
async fn deleting_the_exchange_rate_deletes_its_config_maps() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-gc").await;
    let provider = TestProvider::start("140.5").await;
    let operator = start_operator(&ns.name, &provider).await;
    let api: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns.name);

    let created = api
        .create(&PostParams::default(), &exchange_rate("pln", "PLN", "1h"))
        .await
        .unwrap();
    let s = wait_rate(&api, "pln", "140.5").await;
    let config_map = s.rate.config_map_name.expect("configMapName");
    assert_eq!(config_maps_of(&client, &ns.name, &created).await.len(), 1);
    common::hold(&ns.name, "exchangerate/pln");
    let deletes = || {
        common::metric_sum(
            &operator.metrics().encode(),
            "kustomize_operator_kubectl_runs_total",
            &["verb=\"delete\"", "exit_code=\"0\""],
        )
    };
    let deletes_before = deletes();

    api.delete("pln", &DeleteParams::default()).await.unwrap();
    common::wait_for(
        TIMEOUT,
        "every ConfigMap of pln gone, pln still held by the test alone",
        || async {
            let left = config_maps_of(&client, &ns.name, &created).await.len();
            let finalizers = common::finalizers(&ns.name, "exchangerate/pln");
            if left == 0 && finalizers.as_deref() == Some(&[common::TEST_HOLD.to_string()][..]) {
                Ok(())
            } else {
                Err((left, finalizers))
            }
        },
    )
    .await;
    let note = common::wait_for(TIMEOUT, "a Deleted event about pln", || async {
        match event_note(&client, &ns.name, "pln", "Deleted").await {
            Some(note) => Ok(note),
            None => Err("no Deleted event"),
        }
    })
    .await;
    assert!(
        note.contains("deleted 1 object(s)") && note.contains(&config_map),
        "{note}"
    );
    assert!(
        deletes() > deletes_before,
        "the operator ran no kubectl delete"
    );
    assert!(
        api.get("pln")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "pln is held, being deleted"
    );

    common::release(&ns.name, "exchangerate/pln");
    common::wait_until(TIMEOUT, "the ExchangeRate pln gone", || async {
        api.get_opt("pln").await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
}

/// The note of the latest `reason` event about `name`, if any.
async fn event_note(client: &Client, ns: &str, name: &str, reason: &str) -> Option<String> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .max_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0))
        .and_then(|e| e.note)
}

/// ExchangeRate reports field conflicts rather than overwriting them: a
/// value someone else wrote into its ConfigMap is reported at the next
/// apply (here, the resync), and the ConfigMap is left as they made it.
#[tokio::test]
async fn a_field_someone_else_changed_is_reported_not_overwritten() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-conflict").await;
    let provider = TestProvider::start("2.5").await;
    let mut args = provider.operator_args();
    args.extend(["--resync-interval".to_string(), "2s".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let operator = common::start_operator(&ns.name, &args).await;
    let api: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns.name);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &exchange_rate("nok", "NOK", "1h"))
        .await
        .unwrap();
    let cm = wait_rate(&api, "nok", "2.5")
        .await
        .rate
        .config_map_name
        .unwrap();
    let (ok, _, err) = common::kubectl(&[
        "-n",
        &ns.name,
        "patch",
        "configmap",
        &cm,
        "--type=merge",
        "--field-manager=someone-else",
        "-p",
        r#"{"data":{"rate":"9.9"}}"#,
    ]);
    assert!(ok, "{err}");
    common::wait_until(TIMEOUT, "nok reporting FieldConflict", || async {
        status(&api, "nok")
            .await
            .common
            .condition(ConditionType::Ready)
            .is_some_and(|c| c.reason == Reason::FieldConflict)
    })
    .await;
    let s = status(&api, "nok").await;
    let message = &s.common.condition(ConditionType::Ready).unwrap().message;
    assert!(
        message.contains("someone-else") && message.contains(".data.rate"),
        "{message}"
    );
    assert_eq!(
        config_maps.get(&cm).await.unwrap().data.unwrap()["rate"],
        "9.9"
    );
    // Removing the edited object resolves it: the operator makes it again.
    config_maps
        .delete(&cm, &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "nok Ready again", || async {
        status(&api, "nok").await.common.is_ready()
    })
    .await;
    assert_eq!(
        config_maps.get(&cm).await.unwrap().data.unwrap()["rate"],
        "2.5"
    );
    operator.stop().await;
}

#[tokio::test]
async fn an_interval_below_the_minimum_is_an_invalid_spec() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-min").await;
    let provider = TestProvider::start("1.0").await;
    // The default minimum (1m), not the tests' 1s.
    let url = format!("http://{}/rates/{{base}}/{{currency}}", provider.addr);
    let operator = common::start_operator(
        &ns.name,
        &["--kinds", "exchangerate", "--exchange-rate-url", &url],
    )
    .await;
    let api: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &exchange_rate("cad", "CAD", "30s"))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "cad InvalidSpec, naming the minimum", || async {
        status(&api, "cad")
            .await
            .common
            .condition(ConditionType::Ready)
            .is_some_and(|c| c.reason == Reason::InvalidSpec && c.message.contains("minimum"))
    })
    .await;
    assert_eq!(provider.requests(), 0);
    operator.stop().await;
}

#[tokio::test]
async fn api_server_rejects_bad_currencies_and_intervals() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "er-bad").await;
    let cases = [
        ("currency: usd", "spec.currency"),
        ("currency: DOLLAR", "spec.currency"),
        ("currency: USD\n  base: eur", "spec.base"),
        (
            "currency: USD\n  refreshInterval: 1d",
            "spec.refreshInterval",
        ),
        (
            "currency: USD\n  refreshInterval: \"\"",
            "spec.refreshInterval",
        ),
        (
            "currency: USD\n  refreshInterval: 1.5h",
            "spec.refreshInterval",
        ),
        ("base: EUR", "spec.currency"),
    ];
    for (spec, field) in cases {
        let manifest = format!(
            "apiVersion: operators.brennerm.github.io/v1\nkind: ExchangeRate\nmetadata:\n  name: bad\n  namespace: {}\nspec:\n  {spec}\n",
            ns.name
        );
        let (ok, _, err) = common::kubectl_stdin(&["create", "-f", "-"], &manifest);
        assert!(!ok, "{spec:?} was accepted");
        assert!(err.contains(field), "{spec:?}: {err}");
    }
    // The article's example is accepted unchanged.
    let example =
        std::fs::read_to_string(common::repo().join("deploy/examples/exchangerate.yaml")).unwrap();
    let (ok, _, err) = common::kubectl_stdin(
        &["create", "--dry-run=server", "-n", &ns.name, "-f", "-"],
        &example,
    );
    assert!(ok, "{err}");
}

/// The ConfigMap name put in status is the one `kubectl kustomize` gives,
/// whatever the values (no cluster needed, only kubectl).
#[test]
fn config_map_name_matches_kubectl_kustomize() {
    let dir = KustomizeDir::load(&common::repo().join("kustomize")).unwrap();
    let mut er = exchange_rate("exchange-rate-usd", "USD", "1h");
    er.metadata.namespace = Some("demo".into());
    er.metadata.uid = Some("6c0d1c38-3d4e-4a5b-9f00-0123456789ab".into());
    let values = [
        ("1.1901", "2021-01-18T10:00:00Z"),
        ("0.000012345", "2026-03-01T09:00:01.25Z"),
        ("x <&> \"quoted\" \\ é\u{2028}\ttab", "2026-03-01T09:00:01Z"),
    ];
    for (rate, at) in values {
        let fetched = Fetched {
            rate: rate.into(),
            base: "EUR".into(),
            currency: "USD".into(),
            fetched_at: at.parse().unwrap(),
            generation: Some(1),
            refresh_requested_at: None,
        };
        let overlay = ExchangeRateHandler::overlay(&er, &fetched).unwrap();
        let out = tempfile::tempdir().unwrap();
        overlay
            .render(&dir, None)
            .unwrap()
            .write_to(out.path())
            .unwrap();
        let (ok, built, err) = common::kubectl(&["kustomize", &out.path().display().to_string()]);
        assert!(ok, "{err}");
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&built).unwrap();
        let name = docs[0]["metadata"]["name"].as_str().unwrap().to_string();
        let data: BTreeMap<String, String> =
            serde_json::from_value(docs[0]["data"].clone()).unwrap();
        assert_eq!(data, fetched.data(), "values arrive unchanged");
        assert_eq!(
            name,
            config_map_name("exchange-rate-usd", &fetched.data()),
            "{at:?}"
        );
    }
}
