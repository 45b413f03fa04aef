//! The HTTP JSON rate provider: a URL template with `{base}` and `{currency}`,
//! and a dotted path to the rate in the response (e.g. `rates.{currency}`).
//!
//! HTTP goes through reqwest with rustls on the `ring` crypto provider, the
//! one kube already uses. The TLS configuration is built here with that
//! provider passed explicitly, so no process-wide default provider is needed
//! (and none is installed). Requests carry a timeout and a User-Agent; the
//! response body is read up to [`BODY_LIMIT`].

use std::sync::OnceLock;
use std::time::Duration;

/// The User-Agent sent to the provider.
pub const USER_AGENT: &str = concat!("kustomize-operator/", env!("CARGO_PKG_VERSION"));
/// Longest response body read, in bytes.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// Why a rate could not be fetched. Messages never contain the URL's query
/// (it may carry an API key).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FetchError {
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    /// The URL template does not yield a valid http(s) URL.
    #[error("invalid provider URL: {0}")]
    Url(String),
    /// No response within the timeout.
    #[error("{url}: no response within {timeout:?}")]
    Timeout {
        /// Scheme, host and path of the request.
        url: String,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The request failed (connection refused, TLS, reset, ...).
    #[error("{url}: {reason}")]
    Request {
        /// Scheme, host and path of the request.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The provider answered with a non-success status.
    #[error("{url}: HTTP {status}")]
    Status {
        /// Scheme, host and path of the request.
        url: String,
        /// The HTTP status code.
        status: u16,
    },
    /// The response is larger than [`BODY_LIMIT`].
    #[error("{url}: response larger than {BODY_LIMIT} bytes")]
    TooLarge {
        /// Scheme, host and path of the request.
        url: String,
    },
    /// The response is not JSON.
    #[error("{url}: response is not JSON: {reason}")]
    NotJson {
        /// Scheme, host and path of the request.
        url: String,
        /// The parser's message.
        reason: String,
    },
    /// The response has nothing at the rate path (e.g. an unknown currency).
    #[error("{url}: no rate at {path:?} in the response")]
    Missing {
        /// Scheme, host and path of the request.
        url: String,
        /// The rate path.
        path: String,
    },
    /// The value at the rate path is not a positive number.
    #[error("{url}: the value at {path:?} is not a positive number: {value}")]
    NotARate {
        /// Scheme, host and path of the request.
        url: String,
        /// The rate path.
        path: String,
        /// The value found (trimmed).
        value: String,
    },
}

/// Where rates come from.
#[derive(Debug)]
pub struct Provider {
    url_template: String,
    rate_path: String,
    timeout: Duration,
    client: OnceLock<Result<reqwest::Client, String>>,
}

impl Provider {
    /// A provider; the HTTP client is built on first use.
    pub fn new(url_template: &str, rate_path: &str, timeout: Duration) -> Self {
        Self {
            url_template: url_template.to_string(),
            rate_path: rate_path.to_string(),
            timeout,
            client: OnceLock::new(),
        }
    }

    /// The URL for a pair. `base` and `currency` must be ISO 4217 codes
    /// (checked by the caller); they are substituted as they are.
    pub fn url(&self, base: &str, currency: &str) -> Result<reqwest::Url, FetchError> {
        expand_url(&self.url_template, base, currency)
    }

    /// The rate path for a currency, e.g. `rates.USD`.
    pub fn rate_path(&self, base: &str, currency: &str) -> String {
        substitute(&self.rate_path, base, currency)
    }

    fn client(&self) -> Result<&reqwest::Client, FetchError> {
        self.client
            .get_or_init(|| build_client(self.timeout))
            .as_ref()
            .map_err(|e| FetchError::Client(e.clone()))
    }

    /// Fetches the rate of `currency` in `base`, as a decimal string.
    pub async fn fetch(&self, base: &str, currency: &str) -> Result<String, FetchError> {
        let url = self.url(base, currency)?;
        let shown = redacted(&url);
        let client = self.client()?;
        let request_error = |e: reqwest::Error| {
            if e.is_timeout() {
                FetchError::Timeout {
                    url: shown.clone(),
                    timeout: self.timeout,
                }
            } else {
                FetchError::Request {
                    url: shown.clone(),
                    reason: error_chain(&e.without_url()),
                }
            }
        };
        let mut response = client
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(request_error)?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Status {
                url: shown,
                status: status.as_u16(),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(request_error)? {
            if body.len() + chunk.len() > BODY_LIMIT {
                return Err(FetchError::TooLarge { url: shown });
            }
            body.extend_from_slice(&chunk);
        }
        let json: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| FetchError::NotJson {
                url: shown.clone(),
                reason: e.to_string(),
            })?;
        let path = self.rate_path(base, currency);
        rate_at(&json, &path).map_err(|e| match e {
            RateError::Missing => FetchError::Missing { url: shown, path },
            RateError::NotARate(value) => FetchError::NotARate {
                url: shown,
                path,
                value,
            },
        })
    }
}

/// Checks a URL template: it must name `{currency}` and expand to an
/// http(s) URL. Used to validate the command-line flag.
pub fn check_url_template(template: &str) -> Result<(), String> {
    if !template.contains("{currency}") {
        return Err(format!(
            "URL template {template:?} must contain {{currency}} (and usually {{base}})"
        ));
    }
    expand_url(template, "EUR", "USD")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn substitute(template: &str, base: &str, currency: &str) -> String {
    template
        .replace("{base}", base)
        .replace("{currency}", currency)
}

fn expand_url(template: &str, base: &str, currency: &str) -> Result<reqwest::Url, FetchError> {
    let expanded = substitute(template, base, currency);
    let url = reqwest::Url::parse(&expanded).map_err(|e| FetchError::Url(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(FetchError::Url(format!(
            "{}: expected an http or https URL with a host",
            redacted(&url)
        )));
    }
    Ok(url)
}

/// Scheme, host, port and path of a URL: what errors may show. The query and
/// any user info are left out, since they may carry credentials.
pub fn redacted(url: &reqwest::Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{}://{host}:{port}{}", url.scheme(), url.path()),
        None => format!("{}://{host}{}", url.scheme(), url.path()),
    }
}

fn build_client(timeout: Duration) -> Result<reqwest::Client, String> {
    let tls = crate::trust::client_tls()?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .user_agent(USER_AGENT)
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .map_err(|e| error_chain(&e))
}

/// Why no rate was found at a path.
#[derive(Debug, Clone, PartialEq)]
pub enum RateError {
    /// Nothing at the path.
    Missing,
    /// Something that is not a positive number (shown, trimmed).
    NotARate(String),
}

/// The positive number at a dotted `path` (object keys; array indexes as
/// numbers), as a decimal string. A JSON number or a numeric string is accepted.
pub fn rate_at(json: &serde_json::Value, path: &str) -> Result<String, RateError> {
    let mut value = json;
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        value = match value {
            serde_json::Value::Object(map) => map.get(segment),
            serde_json::Value::Array(items) => {
                segment.parse::<usize>().ok().and_then(|i| items.get(i))
            }
            _ => None,
        }
        .ok_or(RateError::Missing)?;
    }
    let text = match value {
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::String(s) => s.trim().to_string(),
        serde_json::Value::Null => return Err(RateError::Missing),
        other => {
            return Err(RateError::NotARate(crate::text::truncate(
                &other.to_string(),
                64,
            )));
        }
    };
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(text),
        _ => Err(RateError::NotARate(crate::text::truncate(&text, 64))),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = cause.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    #[test]
    fn rate_is_found_at_a_dotted_path() {
        let body =
            json!({"base": "EUR", "rates": {"USD": 1.1901, "JPY": "125.5"}, "list": [{"r": 2}]});
        assert_eq!(rate_at(&body, "rates.USD"), Ok("1.1901".into()));
        assert_eq!(rate_at(&body, "rates.JPY"), Ok("125.5".into()));
        assert_eq!(rate_at(&body, "list.0.r"), Ok("2".into()));
        assert_eq!(rate_at(&body, "rates.GBP"), Err(RateError::Missing));
        assert_eq!(rate_at(&body, "base.x"), Err(RateError::Missing));
        assert!(matches!(
            rate_at(&body, "base"),
            Err(RateError::NotARate(_))
        ));
        assert!(matches!(
            rate_at(&body, "rates"),
            Err(RateError::NotARate(_))
        ));
        for bad in [
            json!({"r": -1}),
            json!({"r": 0}),
            json!({"r": "NaN"}),
            json!({"r": "inf"}),
        ] {
            assert!(
                matches!(rate_at(&bad, "r"), Err(RateError::NotARate(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn url_template_is_expanded_and_checked() {
        let p = Provider::new(
            "https://api.example.org/latest?base={base}&symbols={currency}",
            "rates.{currency}",
            Duration::from_secs(1),
        );
        assert_eq!(
            p.url("EUR", "USD").unwrap().as_str(),
            "https://api.example.org/latest?base=EUR&symbols=USD"
        );
        assert_eq!(p.rate_path("EUR", "USD"), "rates.USD");
        assert!(check_url_template("https://x/{base}/{currency}").is_ok());
        assert!(check_url_template("https://x/{base}").is_err());
        assert!(check_url_template("ftp://x/{currency}").is_err());
        assert!(check_url_template("not a url {currency}").is_err());
    }

    #[test]
    fn errors_do_not_show_the_query() {
        let url =
            reqwest::Url::parse("https://user:pw@h.example:8443/p/q?access_key=SECRET").unwrap();
        assert_eq!(redacted(&url), "https://h.example:8443/p/q");
    }

    /// A TLS server on loopback presenting `tests/fixtures/tls/server.pem`
    /// (signed by a test CA that no system trusts) to one client; returns
    /// its port.
    fn untrusted_tls_server() -> u16 {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(include_bytes!(
            "../../../tests/fixtures/tls/server.pem"
        ))
        .collect::<Result<_, _>>()
        .unwrap();
        let key = PrivateKeyDer::from_pem_slice(include_bytes!(
            "../../../tests/fixtures/tls/server-key.pem"
        ))
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut tcp, _)) = listener.accept() {
                let mut tls = rustls::ServerConnection::new(Arc::new(config)).unwrap();
                // The handshake ends when the client refuses the certificate.
                while tls.is_handshaking() {
                    if tls.complete_io(&mut tcp).is_err() {
                        break;
                    }
                }
            }
        });
        port
    }

    #[tokio::test]
    async fn tls_works_without_a_process_wide_crypto_provider_and_refuses_an_unknown_issuer() {
        // A real TLS server whose certificate no system root signed: the
        // client must get through the handshake to verifying it (no panic
        // for want of a default CryptoProvider) and refuse it as an
        // unknown issuer, saying so. (tests/exchange_rate.rs completes a
        // fetch once the operator trusts the test CA.)
        let port = untrusted_tls_server();
        let p = Provider::new(
            &format!("https://127.0.0.1:{port}/{{base}}/{{currency}}"),
            "rate",
            Duration::from_secs(5),
        );
        let err = p.fetch("EUR", "USD").await.unwrap_err();
        let FetchError::Request { url, reason } = &err else {
            panic!("not a request error: {err:?}");
        };
        assert_eq!(url, &format!("https://127.0.0.1:{port}/EUR/USD"));
        assert!(
            reason.contains("invalid peer certificate: UnknownIssuer"),
            "{err}"
        );
    }
}
