//! The tower layer that puts [`GuardedBody`] on every response of the
//! operator's client.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request, Response, header};
use tower::{Layer, Service};

use super::Guard;
use super::body::{BoxError, GuardedBody, Reading};
use super::scan::Shape;

/// Scans the body of every JSON response (see the module's docs).
#[derive(Clone)]
pub struct GuardLayer {
    pub(super) guard: Arc<Guard>,
}

impl<S> Layer<S> for GuardLayer {
    type Service = GuardService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GuardService {
            inner,
            guard: self.guard.clone(),
        }
    }
}

/// The service [`GuardLayer`] makes.
#[derive(Clone)]
pub struct GuardService<S> {
    inner: S,
    guard: Arc<Guard>,
}

impl<S, B> Service<Request<kube::client::Body>> for GuardService<S>
where
    S: Service<Request<kube::client::Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<GuardedBody<B>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let reading = self.guard.reading(&request);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await.map_err(Into::into)?;
            let json = response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            Ok(if json && response.status().is_success() {
                response.map(|body| GuardedBody::scanned(body, reading))
            } else {
                response.map(GuardedBody::pass)
            })
        })
    }
}

/// What a request's path addresses.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Addressed<'a> {
    /// The API group (`""` for the core group).
    pub group: &'a str,
    /// The resource (`configmaps`).
    pub plural: &'a str,
    /// True when the path names one object (or one of its subresources).
    pub named: bool,
}

impl<'a> Addressed<'a> {
    /// The resource a path (`/apis/g/v/namespaces/ns/plural[/name]`)
    /// addresses, if it addresses one.
    pub fn of(path: &'a str) -> Option<Self> {
        let mut parts = path.trim_matches('/').split('/');
        let group = match (parts.next()?, parts.next()?) {
            ("api", _) => "",
            ("apis", group) => {
                parts.next()?;
                group
            }
            _ => return None,
        };
        let rest: Vec<&str> = parts.collect();
        let (plural, named) = match rest.as_slice() {
            ["namespaces", _, "status" | "finalize"] if group.is_empty() => ("namespaces", true),
            ["namespaces", _, plural, name @ ..] => (*plural, !name.is_empty()),
            [plural, name @ ..] => (*plural, !name.is_empty()),
            [] => return None,
        };
        Some(Self {
            group,
            plural,
            named,
        })
    }
}

/// How the body of `request`'s response is laid out.
pub(super) fn shape_of<B>(request: &Request<B>) -> Shape {
    let query = request.uri().query().unwrap_or_default();
    if query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
    {
        return Shape::Events;
    }
    let collection = Addressed::of(request.uri().path()).is_some_and(|t| !t.named);
    if request.method() == Method::GET && collection {
        Shape::List
    } else {
        Shape::Object
    }
}

impl Guard {
    /// What the response to `request` needs.
    fn reading<B>(&self, request: &Request<B>) -> Reading {
        let metadata_only = request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("as=PartialObjectMetadata"));
        let check = Addressed::of(request.uri().path())
            .filter(|_| !metadata_only)
            .and_then(|t| self.check_of(t.group, t.plural));
        Reading {
            shape: shape_of(request),
            check,
            on_skip: self.on_skip.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_resource() {
        let cases = [
            ("/api/v1/configmaps", Some(("", "configmaps", false))),
            (
                "/api/v1/namespaces/t/configmaps",
                Some(("", "configmaps", false)),
            ),
            (
                "/api/v1/namespaces/t/configmaps/c",
                Some(("", "configmaps", true)),
            ),
            ("/api/v1/namespaces", Some(("", "namespaces", false))),
            ("/api/v1/namespaces/t", Some(("", "namespaces", true))),
            (
                "/api/v1/namespaces/t/status",
                Some(("", "namespaces", true)),
            ),
            (
                "/apis/flant.com/v1/copyratorrules",
                Some(("flant.com", "copyratorrules", false)),
            ),
            (
                "/apis/nuvolaris.org/v1/namespaces/t/samples/s/status",
                Some(("nuvolaris.org", "samples", true)),
            ),
            (
                "/apis/blackadder.io/v1beta1/chaosagents/a",
                Some(("blackadder.io", "chaosagents", true)),
            ),
            ("/version", None),
            ("/apis/apps/v1", None),
        ];
        for (path, expected) in cases {
            let target = Addressed::of(path).map(|t| (t.group, t.plural, t.named));
            assert_eq!(target, expected, "{path}");
        }
    }

    #[test]
    fn watches_lists_and_objects_are_told_apart() {
        let request = |method: Method, uri: &str| {
            Request::builder().method(method).uri(uri).body(()).unwrap()
        };
        assert_eq!(
            shape_of(&request(
                Method::GET,
                "/api/v1/configmaps?watch=true&resourceVersion=1"
            )),
            Shape::Events
        );
        assert_eq!(
            shape_of(&request(Method::GET, "/api/v1/configmaps?limit=500")),
            Shape::List
        );
        assert_eq!(
            shape_of(&request(Method::GET, "/api/v1/namespaces/t/configmaps/c")),
            Shape::Object
        );
        assert_eq!(
            shape_of(&request(
                Method::PATCH,
                "/apis/nuvolaris.org/v1/namespaces/t/samples/s/status"
            )),
            Shape::Object
        );
        assert_eq!(shape_of(&request(Method::GET, "/version")), Shape::Object);
    }
}
