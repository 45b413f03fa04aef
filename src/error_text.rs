//! Errors in the words a kubectl user reads. kube's own `Display` of an
//! API error prints the API server's `Status` in Rust's debug form
//! (`ApiError: ... (Status { status: Some(Failure), code: 422, ...`);
//! every condition, event and log line that carries an API error says it
//! through here instead: the API server's message, with the object and the
//! fields where the answer names them, the reason in words when the
//! message does not carry it, never a debug form.

use std::error::Error as StdError;

use kube::core::Status;
use kube::core::response::reason;
use kube::runtime::watcher;

/// The reason kube gives an answer whose body is not a `Status` (a plain
/// `404 page not found`, a proxy's page).
const UNPARSED: &str = "Failed to parse error data";

/// At most this many characters of an answer that is not a `Status`.
const BODY_SHOWN: usize = 200;

/// What a failed API call says, in one line, as a kubectl user reads it:
/// the API server's own message for a refused request (`deployments.apps
/// "web" is forbidden: ...`), the fields of an invalid object, else the
/// client's error in words.
pub fn kube(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status_text(status, None),
        kube::Error::HyperError(source) => {
            format!("cannot reach the API server: {}", sources(source))
        }
        kube::Error::Service(source) => {
            format!("cannot reach the API server: {}", sources(&**source))
        }
        kube::Error::SerdeError(source) => {
            format!("cannot read the API server's answer: {source}")
        }
        kube::Error::FromUtf8(_) => "the API server's answer is not UTF-8".into(),
        kube::Error::ReadEvents(source) => format!("cannot read the watch: {source}"),
        kube::Error::Discovery(discovery) => discovery_text(discovery),
        kube::Error::Auth(source) => {
            format!("cannot authenticate to the API server: {}", sources(source))
        }
        other => sources(other),
    }
}

/// What a failed API call about `object` (`Sample team-a/web`) says: the
/// object first, then what the API server said of it.
pub fn about(object: impl std::fmt::Display, e: &kube::Error) -> String {
    let object = object.to_string();
    match e {
        kube::Error::Api(status) => status_text(status, Some(&object)),
        other => format!("{object}: {}", kube(other)),
    }
}

/// What a watch's failure says.
pub fn watch(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(e) => format!("cannot list: {}", kube(e)),
        watcher::Error::WatchStartFailed(e) => format!("cannot start watching: {}", kube(e)),
        watcher::Error::WatchError(status) => {
            format!("the watch failed: {}", status_text(status, None))
        }
        watcher::Error::WatchFailed(e) => format!("the watch broke: {}", kube(e)),
        watcher::Error::NoResourceVersion => {
            "the API server's list has no resourceVersion (does the resource support watch?)".into()
        }
    }
}

/// What an API server's `Status` says (see [`about`] for `object`).
pub fn status(status: &Status) -> String {
    status_text(status, None)
}

/// True when the API server answered that it serves nothing at the path
/// asked (a bare `404 page not found`, not a `Status`): the kind's CRD is
/// gone, or its version or scope is not the one asked for. An object that
/// does not exist is a `Status` with reason `NotFound`, and not this.
pub fn path_not_served(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 && s.reason == UNPARSED)
}

/// [`path_not_served`], for a watch's failure.
pub fn watch_path_not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => path_not_served(e),
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => false,
    }
}

/// A failed reconcile under a finalizer (`kube::runtime::finalizer`), in
/// words: the reconcile's own error as it says it, a deletion's behind
/// "deleting", the finalizer's patches by name. kube-runtime's `Display`
/// says "failed to apply object" of any failed reconcile, though nothing
/// may have been applied.
pub fn finalizer<E: StdError + 'static>(e: &kube::runtime::finalizer::Error<E>) -> String {
    use kube::runtime::finalizer::Error;
    match e {
        Error::ApplyFailed(e) => any(e),
        Error::CleanupFailed(e) => format!("deleting: {}", any(e)),
        Error::AddFinalizer(e) => format!("adding the finalizer: {}", kube(e)),
        Error::RemoveFinalizer(e) => format!("removing the finalizer: {}", kube(e)),
        other => any(other),
    }
}

/// Any error, in words: the kinds above as they say, any other error as
/// its own message followed by its sources' (each said once).
pub fn any(e: &(dyn StdError + 'static)) -> String {
    if let Some(k) = e.downcast_ref::<kube::Error>() {
        return kube(k);
    }
    if let Some(w) = e.downcast_ref::<watcher::Error>() {
        return watch(w);
    }
    if let Some(s) = e.downcast_ref::<Status>() {
        return status(s);
    }
    let own = e.to_string();
    let Some(source) = e.source() else {
        return own;
    };
    if own.contains("(Status {") {
        // A wrapper printing a kube error as its own (`transparent`): say
        // what comes before it, then the Status in words.
        let before = own.split("ApiError: ").next().unwrap_or_default();
        return format!("{before}{}", any(source));
    }
    let inner = source.to_string();
    if !inner.is_empty() && own.contains(&inner) {
        own.replacen(&inner, &any(source), 1)
    } else {
        own
    }
}

/// The message of `status`: about `object` when given (else about what its
/// details name), its causes by field, the reason in words when the
/// message does not say it.
fn status_text(status: &Status, object: Option<&str>) -> String {
    if status.reason == UNPARSED || (status.reason.is_empty() && status.message.is_empty()) {
        return unparsed(status, object);
    }
    let causes = causes(status);
    let named = object.map(str::to_string).or_else(|| subject(status));
    let message = status.message.trim();
    let text = if status.reason == reason::INVALID && !causes.is_empty() {
        // The fields are the message: `Sample team-a/web: spec.count: ...`.
        match &named {
            Some(name) => format!("{name}: {}", causes.join("; ")),
            None => causes.join("; "),
        }
    } else if message.is_empty() {
        match &named {
            Some(name) => format!("{name}: {}", reason_words(status)),
            None => reason_words(status),
        }
    } else {
        match object {
            Some(object) => format!("{object}: {message}"),
            None => message.to_string(),
        }
    };
    let missing: Vec<&str> = (causes.iter())
        .filter(|c| !text.contains(c.as_str()))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        text
    } else {
        format!("{text} ({})", missing.join("; "))
    }
}

/// The causes of `status`, each `field: message` (the message alone when
/// it names no field).
fn causes(status: &Status) -> Vec<String> {
    let Some(details) = &status.details else {
        return Vec::new();
    };
    details
        .causes
        .iter()
        .filter(|c| !c.message.is_empty() || !c.field.is_empty())
        .map(|c| match (c.field.as_str(), c.message.as_str()) {
            ("", message) => message.to_string(),
            (field, "") => format!("{field}: {}", words_of_reason(&c.reason)),
            (field, message) if message.starts_with(field) => message.to_string(),
            (field, message) => format!("{field}: {message}"),
        })
        .collect()
}

/// What the details of `status` name: `samples.nuvolaris.org "web"`.
fn subject(status: &Status) -> Option<String> {
    let details = status.details.as_ref()?;
    if details.name.is_empty() {
        return None;
    }
    let kind = match (details.kind.as_str(), details.group.as_str()) {
        ("", _) => return Some(format!("\"{}\"", details.name)),
        (kind, "") => kind.to_string(),
        (kind, group) => format!("{kind}.{group}"),
    };
    Some(format!("{kind} \"{}\"", details.name))
}

/// An answer that was not a `Status`: what kubectl says of it, and the
/// first line of what the API server sent.
fn unparsed(status: &Status, object: Option<&str>) -> String {
    let body = first_line(&status.message);
    let said = match status.code {
        404 => format!(
            "the API server does not serve this kind at this path ({body}): its CRD is gone, or its version or scope is not the one asked for"
        ),
        code => {
            let words = http_words(code);
            match body.is_empty() {
                true => format!("the API server answered {code} {words}"),
                false => format!("the API server answered {code} {words}: {body}"),
            }
        }
    };
    match object {
        Some(object) => format!("{object}: {said}"),
        None => said,
    }
}

/// The first line of `text`, at most [`BODY_SHOWN`] characters.
fn first_line(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or_default().trim();
    match line.char_indices().nth(BODY_SHOWN) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_string(),
    }
}

/// The reason of `status` in words (from its code when it has none).
fn reason_words(status: &Status) -> String {
    match status.reason.as_str() {
        "" => http_words(status.code),
        known => words_of_reason(known),
    }
}

/// An API reason (`NotFound`) in words (`not found`).
fn words_of_reason(reason: &str) -> String {
    let words = match reason {
        reason::UNAUTHORIZED => "unauthorized: the credentials were refused",
        reason::FORBIDDEN => "forbidden",
        reason::NOT_FOUND => "not found",
        reason::ALREADY_EXISTS => "already exists",
        reason::CONFLICT => "changed by someone else since it was read (conflict)",
        reason::GONE => "gone: the version asked for is too old",
        reason::INVALID => "invalid",
        reason::SERVER_TIMEOUT | reason::TIMEOUT => "timed out",
        reason::STORAGE_READ_ERROR => "the API server cannot read it from its storage",
        reason::TOO_MANY_REQUESTS => "too many requests: the API server asks to try again later",
        reason::BAD_REQUEST => "bad request",
        reason::METHOD_NOT_ALLOWED => "not allowed on this resource",
        reason::NOT_ACCEPTABLE => "not acceptable",
        reason::REQUEST_ENTITY_TOO_LARGE => "too large",
        reason::UNSUPPORTED_MEDIA_TYPE => "unsupported media type",
        reason::INTERNAL_ERROR => "internal error of the API server",
        reason::EXPIRED => "expired",
        reason::SERVICE_UNAVAILABLE => "the API server is unavailable",
        // The causes' reasons (`FieldValueRequired`, ...) and any other:
        // the words of its camel case.
        other => return camel_words(other),
    };
    words.to_string()
}

/// `FieldValueRequired` → `field value required`.
fn camel_words(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// An HTTP status code in words: `Service Unavailable`.
fn http_words(code: u16) -> String {
    http::StatusCode::from_u16(code)
        .ok()
        .and_then(|c| c.canonical_reason())
        .unwrap_or("(no reason)")
        .to_string()
}

/// What kube's discovery could not find, in words.
fn discovery_text(e: &kube::error::DiscoveryError) -> String {
    use kube::error::DiscoveryError as D;
    match e {
        D::InvalidGroupVersion(gv) => format!("{gv} is not a group/version"),
        D::MissingKind(kind) => format!("the API server does not serve the kind {kind}"),
        D::MissingApiGroup(group) => format!("the API server does not serve the API group {group}"),
        D::MissingResource(resource) => {
            format!("the API server does not serve the resource {resource}")
        }
        D::EmptyApiGroup(group) => format!("the API group {group} serves no version"),
    }
}

/// An error's message and its sources' (a source is said only when the
/// message before it does not include it already).
fn sources(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(source) = next {
        let said = source.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = source.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use kube::core::response::{StatusCause, StatusDetails, StatusSummary};

    use super::*;

    /// A Status as the API server sends it (decoded as kube decodes it).
    fn answer(json: serde_json::Value) -> kube::Error {
        kube::Error::Api(Box::new(serde_json::from_value(json).unwrap()))
    }

    /// What kube makes of an answer that is not a Status.
    fn unparsed_answer(code: u16, body: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure(body, UNPARSED).with_code(code)))
    }

    fn invalid() -> kube::Error {
        answer(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Sample.nuvolaris.org \"web\" is invalid: [spec.count: Invalid value: -1: spec.count in body should be greater than or equal to 0, spec.image: Required value]",
            "reason": "Invalid",
            "details": {"name": "web", "group": "nuvolaris.org", "kind": "Sample", "causes": [
                {"reason": "FieldValueInvalid", "message": "Invalid value: -1: spec.count in body should be greater than or equal to 0", "field": "spec.count"},
                {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.image"},
            ]},
            "code": 422,
        }))
    }

    /// Every kind of error the operator meets, as the helper says it.
    fn every_kind() -> Vec<(&'static str, String)> {
        let not_found = answer(serde_json::json!({
            "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "deployments.apps \"web\" not found",
            "details": {"name": "web", "group": "apps", "kind": "deployments"},
        }));
        let forbidden = answer(serde_json::json!({
            "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": "configmaps \"a\" is forbidden: User \"system:serviceaccount:t:w\" cannot patch resource \"configmaps\" in API group \"\" in the namespace \"t\"",
            "details": {"name": "a", "kind": "configmaps"},
        }));
        let conflict = answer(serde_json::json!({
            "kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled on samples.nuvolaris.org \"web\": the object has been modified; please apply your changes to the latest version and try again",
            "details": {"name": "web", "group": "nuvolaris.org", "kind": "samples"},
        }));
        let bare = kube::Error::Api(Box::new(Status {
            status: Some(StatusSummary::Failure),
            code: 503,
            reason: "ServiceUnavailable".into(),
            details: Some(StatusDetails {
                name: "web".into(),
                kind: "samples".into(),
                group: "nuvolaris.org".into(),
                uid: String::new(),
                causes: vec![StatusCause {
                    reason: "FieldValueRequired".into(),
                    message: String::new(),
                    field: "spec.image".into(),
                }],
                retry_after_seconds: 0,
            }),
            ..Status::default()
        }));
        let transport = kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "tcp connect error: Connection refused (os error 111)",
        )));
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let serde =
            kube::Error::SerdeError(serde_json::from_str::<serde_json::Value>(&deep).unwrap_err());
        let shape = kube::Error::SerdeError(
            serde_json::from_str::<k8s_openapi::api::core::v1::ConfigMap>(r#"{"data": 5}"#)
                .unwrap_err(),
        );
        vec![
            ("invalid", kube(&invalid())),
            ("invalid, about", about("Sample team-a/web", &invalid())),
            ("not found", kube(&not_found)),
            ("forbidden", kube(&forbidden)),
            ("conflict", kube(&conflict)),
            ("no message", kube(&bare)),
            (
                "404 page not found",
                kube(&unparsed_answer(404, "404 page not found\n")),
            ),
            (
                "a proxy's page",
                kube(&unparsed_answer(502, "<html>\n<body>Bad Gateway</body>")),
            ),
            ("transport", kube(&transport)),
            ("refused body", kube(&serde)),
            ("wrong shape", kube(&shape)),
            (
                "watch",
                watch(&watcher::Error::WatchStartFailed(unparsed_answer(
                    404,
                    "404 page not found",
                ))),
            ),
            (
                "watch event",
                watch(&watcher::Error::WatchError(Box::new(
                    Status::failure("too old resource version: 1 (5)", "Expired").with_code(410),
                ))),
            ),
            (
                "discovery",
                kube(&kube::Error::Discovery(
                    kube::error::DiscoveryError::MissingKind("Greeting".into()),
                )),
            ),
        ]
    }

    #[test]
    fn no_error_is_said_in_a_debug_form() {
        for (what, said) in every_kind() {
            for shape in [
                "Status {",
                "Some(",
                "None",
                "ErrorResponse",
                "StatusDetails",
                "ApiError",
                "\\\"",
            ] {
                assert!(!said.contains(shape), "{what}: {said}");
            }
            assert!(!said.is_empty(), "{what}");
        }
    }

    #[test]
    fn each_kind_says_what_kubectl_says() {
        let said: std::collections::HashMap<_, _> = every_kind().into_iter().collect();
        assert_eq!(
            said["invalid"],
            "Sample.nuvolaris.org \"web\": spec.count: Invalid value: -1: spec.count in body should be greater than or equal to 0; spec.image: Required value"
        );
        assert_eq!(
            said["invalid, about"],
            "Sample team-a/web: spec.count: Invalid value: -1: spec.count in body should be greater than or equal to 0; spec.image: Required value"
        );
        assert_eq!(said["not found"], "deployments.apps \"web\" not found");
        assert!(said["forbidden"].starts_with("configmaps \"a\" is forbidden: User"));
        assert!(
            said["conflict"]
                .starts_with("Operation cannot be fulfilled on samples.nuvolaris.org \"web\"")
        );
        assert_eq!(
            said["no message"],
            "samples.nuvolaris.org \"web\": the API server is unavailable (spec.image: field value required)"
        );
        assert!(
            said["404 page not found"].starts_with(
                "the API server does not serve this kind at this path (404 page not found)"
            ),
            "{}",
            said["404 page not found"]
        );
        assert_eq!(
            said["a proxy's page"],
            "the API server answered 502 Bad Gateway: <html>"
        );
        assert_eq!(
            said["transport"],
            "cannot reach the API server: tcp connect error: Connection refused (os error 111)"
        );
        assert!(
            said["refused body"]
                .starts_with("cannot read the API server's answer: recursion limit exceeded")
        );
        assert!(
            said["wrong shape"].starts_with("cannot read the API server's answer: invalid type")
        );
        assert!(said["watch"].starts_with("cannot start watching: the API server does not serve"));
        assert_eq!(
            said["watch event"],
            "the watch failed: too old resource version: 1 (5)"
        );
        assert_eq!(
            said["discovery"],
            "the API server does not serve the kind Greeting"
        );
    }

    #[test]
    fn a_wrapper_is_said_in_its_own_words_then_the_api_servers() {
        #[derive(Debug, thiserror::Error)]
        enum Wrapper {
            #[error("the CRD {crd}: {source}")]
            Named { crd: String, source: kube::Error },
            #[error(transparent)]
            Transparent(kube::Error),
        }
        let named = Wrapper::Named {
            crd: "greetings.hello.io".into(),
            source: invalid(),
        };
        assert_eq!(
            any(&named),
            "the CRD greetings.hello.io: Sample.nuvolaris.org \"web\": spec.count: Invalid value: -1: spec.count in body should be greater than or equal to 0; spec.image: Required value"
        );
        let transparent = any(&Wrapper::Transparent(invalid()));
        assert!(!transparent.contains("Status {"), "{transparent}");
        assert!(
            transparent.contains("spec.count: Invalid value"),
            "{transparent}"
        );
        let finalizer: kube::runtime::finalizer::Error<std::io::Error> =
            kube::runtime::finalizer::Error::AddFinalizer(unparsed_answer(
                404,
                "404 page not found",
            ));
        let said = any(&finalizer);
        assert!(
            said.starts_with("failed to add finalizer: the API server does not serve"),
            "{said}"
        );
    }

    /// kube-runtime would say "failed to apply object" of a reconcile that
    /// failed before applying anything.
    #[test]
    fn a_failed_reconcile_is_said_in_its_own_words() {
        use kube::runtime::finalizer::Error;
        let failed = || std::io::Error::other("FetchFailed: fetching the EUR/USD rate: no DNS");
        assert_eq!(
            finalizer(&Error::ApplyFailed(failed())),
            "FetchFailed: fetching the EUR/USD rate: no DNS"
        );
        assert_eq!(
            finalizer(&Error::CleanupFailed(failed())),
            "deleting: FetchFailed: fetching the EUR/USD rate: no DNS"
        );
        let patch = finalizer(&Error::<std::io::Error>::AddFinalizer(invalid()));
        assert!(patch.starts_with("adding the finalizer: "), "{patch}");
        assert!(!patch.contains("Status {"), "{patch}");
    }

    #[test]
    fn only_a_bare_404_is_a_path_not_served() {
        assert!(path_not_served(&unparsed_answer(404, "404 page not found")));
        let absent = answer(
            serde_json::json!({"status": "Failure", "reason": "NotFound", "code": 404, "message": "x"}),
        );
        assert!(!path_not_served(&absent));
        assert!(!path_not_served(&unparsed_answer(502, "bad gateway")));
        assert!(watch_path_not_served(&watcher::Error::WatchStartFailed(
            unparsed_answer(404, "404 page not found")
        )));
        assert!(!watch_path_not_served(&watcher::Error::NoResourceVersion));
    }
}
