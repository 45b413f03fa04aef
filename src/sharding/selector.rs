//! Filtering at the source: the client's layer that adds this replica's
//! share to its lists and watches of the sharded kinds as KEP-5866's
//! `shardSelector` (Kubernetes 1.36 and later, feature gate
//! `ShardedListAndWatch`). An API server that does not know the parameter
//! ignores it and sends every resource; the watches filter what they read
//! either way, so the parameter only saves the transfer and decoding of
//! other replicas' resources.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower::{Layer, Service};

use crate::partition::share::Share;

/// Adds the share to the requests that list or watch a sharded kind.
#[derive(Debug, Clone)]
pub struct SelectorLayer {
    share: Option<Arc<Share>>,
}

impl SelectorLayer {
    /// The layer for `share` (none: requests pass unchanged).
    pub fn new(share: Option<Arc<Share>>) -> Self {
        Self { share }
    }
}

impl<S> Layer<S> for SelectorLayer {
    type Service = SelectorService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SelectorService {
            inner,
            share: self.share.clone(),
        }
    }
}

/// See [`SelectorLayer`].
#[derive(Debug, Clone)]
pub struct SelectorService<S> {
    inner: S,
    share: Option<Arc<Share>>,
}

impl<S, B> Service<Request<B>> for SelectorService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if request.method() == http::Method::GET
            && let Some(share) = &self.share
            && let Some(selector) = share.selector_for(request.uri().path())
            && let Some(uri) = with_selector(request.uri(), &selector)
        {
            *request.uri_mut() = uri;
        }
        self.inner.call(request)
    }
}

/// `uri` with `shardSelector=<selector>` added to its query.
fn with_selector(uri: &http::Uri, selector: &str) -> Option<http::Uri> {
    let query = match uri.query() {
        Some(query) if !query.is_empty() => format!("{query}&"),
        _ => String::new(),
    };
    let path_and_query = format!("{}?{query}shardSelector={}", uri.path(), encode(selector));
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

/// Percent-encodes all but the unreserved characters of a query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_joins_the_query_encoded() {
        let uri: http::Uri = "/apis/nuvolaris.org/v1/samples?&watch=true"
            .parse()
            .unwrap();
        let with = with_selector(&uri, "shardRange(object.metadata.uid, '0x0', '0x8')").unwrap();
        assert_eq!(
            with.to_string(),
            "/apis/nuvolaris.org/v1/samples?&watch=true&shardSelector=shardRange%28object.metadata.uid%2C%20%270x0%27%2C%20%270x8%27%29"
        );
        let bare: http::Uri = "/apis/x/v1/ys".parse().unwrap();
        assert_eq!(
            with_selector(&bare, "a b").unwrap().to_string(),
            "/apis/x/v1/ys?shardSelector=a%20b"
        );
    }
}
