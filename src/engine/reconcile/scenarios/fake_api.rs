//! A mocked API server for the reconcile scenarios: a `tower` service that
//! keeps objects as JSON files in a folder, one per API path, and answers
//! the requests a reconcile makes (discovery of the core group, `GET`,
//! `POST` to a collection, and JSON, merge and server-side apply patches,
//! the status subresource included; lists, and watches that bring no
//! event). The fake kubectl
//! (`fake_kubectl.py`) writes and deletes the same files, so what one
//! applies the other reads back, as with a real API server.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{Either, StreamBody};
use hyper::body::Frame;
use kube::client::Body;
use serde_json::{Value, json};

/// The mocked API server's objects and the requests it served.
pub(super) struct FakeApi {
    objects: PathBuf,
    requests: Mutex<Vec<String>>,
    versions: AtomicU64,
}

impl FakeApi {
    /// A server keeping its objects under `dir/objects`.
    pub(super) fn new(dir: &Path) -> Arc<Self> {
        let objects = dir.join("objects");
        std::fs::create_dir_all(&objects).expect("the objects folder");
        Arc::new(Self {
            objects,
            requests: Mutex::default(),
            versions: AtomicU64::new(1),
        })
    }

    /// A kube client whose every request this server answers.
    pub(super) fn client(self: &Arc<Self>) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let api = api.clone();
            async move {
                let watch = request
                    .uri()
                    .query()
                    .is_some_and(|q| q.contains("watch=true"));
                let response = if watch {
                    // A watch: no event ever comes (a list brings what is).
                    let events = futures::stream::pending::<Result<Frame<Bytes>, Infallible>>();
                    Response::new(Either::Right(StreamBody::new(events)))
                } else {
                    api.serve(request).await.map(Either::Left)
                };
                Ok::<_, Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    /// The object at `path`, if there is one.
    pub(super) fn get(&self, path: &str) -> Option<Value> {
        let text = std::fs::read_to_string(self.file(path)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Stores `object` at `path` with a new resourceVersion.
    pub(super) fn put(&self, path: &str, mut object: Value) -> Value {
        let version = self.versions.fetch_add(1, Ordering::SeqCst).to_string();
        object["metadata"]["resourceVersion"] = json!(version);
        let text = serde_json::to_string_pretty(&object).expect("an object serializes");
        std::fs::write(self.file(path), text).expect("the object is stored");
        object
    }

    /// The objects stored under `prefix` (a collection's path), by path.
    pub(super) fn list(&self, prefix: &str) -> BTreeMap<String, Value> {
        let Ok(entries) = std::fs::read_dir(&self.objects) else {
            return BTreeMap::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|f| Some(format!("/{}", f.strip_suffix(".json")?.replace('%', "/"))))
            .filter(|path| path.starts_with(prefix))
            .filter_map(|path| Some((path.clone(), self.get(&path)?)))
            .collect()
    }

    /// The requests served so far (`METHOD path`), oldest first.
    pub(super) fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("the request log").clone()
    }

    /// Where the object at `path` is kept (the fake kubectl uses the same
    /// name: the path without its leading slash, `/` as `%`).
    fn file(&self, path: &str) -> PathBuf {
        let name = path.trim_matches('/').replace('/', "%");
        self.objects.join(format!("{name}.json"))
    }

    async fn serve(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_string();
        self.requests
            .lock()
            .expect("the request log")
            .push(format!("{} {path}", parts.method));
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = match body.collect_bytes().await {
            Ok(bytes) => bytes,
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
        };
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        match parts.method {
            Method::GET if path == "/api/v1" => respond(StatusCode::OK, &core_resources()),
            Method::GET => match self.get(&path) {
                Some(object) => respond(StatusCode::OK, &object),
                // A list (a watch's first): every object under the path.
                None if parts.uri.query().is_some() => self.list_response(&path),
                None => not_found(&path),
            },
            Method::POST => self.create(&path, body),
            Method::PATCH => self.patch(&path, &content_type, body),
            method => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                &format!("{method} is not served here"),
            ),
        }
    }

    /// A list of the objects in the collection `path`, at the latest
    /// resourceVersion.
    fn list_response(&self, path: &str) -> Response<Body> {
        let items: Vec<Value> = self.list(&format!("{path}/")).into_values().collect();
        let version = self.versions.load(Ordering::SeqCst).to_string();
        let list = json!({
            "apiVersion": "v1", "kind": "List",
            "metadata": {"resourceVersion": version},
            "items": items,
        });
        respond(StatusCode::OK, &list)
    }

    /// `POST` to a collection: stores the object under its name.
    fn create(&self, collection: &str, object: Value) -> Response<Body> {
        let Some(name) = object["metadata"]["name"].as_str() else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "no metadata.name");
        };
        let path = format!("{collection}/{name}");
        if self.get(&path).is_some() {
            return status(StatusCode::CONFLICT, "AlreadyExists", &path);
        }
        respond(StatusCode::CREATED, &self.put(&path, object))
    }

    /// `PATCH` of an object or its status. A server-side apply of the
    /// status replaces it (one field manager writes it whole); an object
    /// being deleted whose last finalizer goes is deleted.
    fn patch(&self, path: &str, content_type: &str, patch: Value) -> Response<Body> {
        let (object_path, subresource) = match path.strip_suffix("/status") {
            Some(object) => (object, true),
            None => (path, false),
        };
        let Some(mut object) = self.get(object_path) else {
            return not_found(object_path);
        };
        let applied = match content_type {
            "application/json-patch+json" => {
                absent_as_null(&mut object, &patch);
                serde_json::from_value(patch)
                    .map_err(|e| e.to_string())
                    .and_then(|p: json_patch::Patch| {
                        json_patch::patch(&mut object, &p).map_err(|e| e.to_string())
                    })
            }
            "application/apply-patch+yaml" if subresource => {
                object["status"] = patch["status"].clone();
                Ok(())
            }
            "application/merge-patch+json" => {
                json_patch::merge(&mut object, &patch);
                Ok(())
            }
            other => Err(format!("patch type {other} is not served here")),
        };
        if let Err(message) = applied {
            // A failed `test` operation: the object changed meanwhile.
            return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &message);
        }
        let finalized = object["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty);
        if finalized && !object["metadata"]["deletionTimestamp"].is_null() {
            let _ = std::fs::remove_file(self.file(object_path));
            return respond(StatusCode::OK, &object);
        }
        respond(StatusCode::OK, &self.put(object_path, object))
    }
}

/// Makes the fields a JSON patch `test`s for `null` explicit: the API
/// server's patch treats an absent field as `null` (kube-runtime's first
/// finalizer patch relies on it), RFC 6902 does not.
fn absent_as_null(object: &mut Value, patch: &Value) {
    let tests = patch.as_array().into_iter().flatten();
    let null_tests = tests.filter(|op| op["op"] == "test" && op["value"].is_null());
    for path in null_tests.filter_map(|op| op["path"].as_str()) {
        let Some((parent, field)) = path.rsplit_once('/') else {
            continue;
        };
        if let Some(Value::Object(parent)) = object.pointer_mut(parent) {
            parent.entry(field).or_insert(Value::Null);
        }
    }
}

/// The core group's resources a reconcile looks up (discovery).
fn core_resources() -> Value {
    let resource = |name: &str, kind: &str| {
        json!({
            "name": name, "singularName": kind.to_lowercase(), "namespaced": true,
            "kind": kind, "verbs": ["get", "list", "watch", "patch", "delete"],
        })
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "v1",
        "resources": [resource("configmaps", "ConfigMap"), resource("secrets", "Secret")],
    })
}

fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string().into_bytes()));
    *response.status_mut() = code;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn not_found(path: &str) -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{path} not found"),
    )
}

/// A `Status` answer, as the API server gives with every error.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": reason, "message": message,
        "code": code.as_u16(),
    });
    respond(code, &body)
}
