//! One `ConversionReview` answered: every object converted to the version
//! asked for, in order, each checked against that version's schema, or a
//! failure naming the first that could not be, or did not fit, and where
//! (the API server then fails the request that needed it, and nothing is
//! written). Never the objects' content in a message.

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde_json::Value;

use super::Conversions;

/// The answer to `review`.
pub fn answer(review: ConversionReview, conversions: &Conversions) -> ConversionReview {
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(e) => {
            let status = Status::failure(&e.to_string(), "BadRequest").with_code(400);
            return ConversionResponse::invalid(status).into_review();
        }
    };
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let response = ConversionResponse::for_request(request);
    match convert_all(objects, &desired, conversions) {
        Ok(converted) => response.success(converted),
        Err(message) => response.failure(Status::failure(&message, "Invalid").with_code(422)),
    }
    .into_review()
}

/// `objects` at `desired` (`group/version`), or why one could not be.
fn convert_all(
    objects: Vec<Value>,
    desired: &str,
    conversions: &Conversions,
) -> Result<Vec<Value>, String> {
    let Some((group, version)) = desired.split_once('/') else {
        return Err(format!("desiredAPIVersion {desired:?} has no group"));
    };
    objects
        .into_iter()
        .map(|object| {
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let versions = conversions
                .get(group, &kind)
                .ok_or_else(|| format!("the operator serves no kind {kind} in {group}"))?;
            versions.convert(object, version).map_err(|e| e.to_string())
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::*;
    use crate::conversion::{ANNOTATION, Filed};
    use crate::kinds::declared::versions::Versions;

    /// The CRD of a kind `kind` of `group` stored at v2, serving v1 too,
    /// carrying `versions` in its annotation.
    pub(in crate::conversion) fn crd(
        group: &str,
        kind: &str,
        versions: &Versions,
    ) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition
    {
        let version = |name: &str, storage: bool, spec: Value| {
            json!({"name": name, "served": true, "storage": storage, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": spec},
            }}})
        };
        let extra = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        let v2 = json!({"type": "object", "required": ["text"], "properties": {
            "text": {"type": "string"}, "count": {"type": "integer"}, "extra": extra,
        }});
        let v1 = json!({"type": "object", "properties": {
            "message": {"type": "string"}, "extra": extra,
        }});
        serde_json::from_value(json!({
            "metadata": {"name": format!("greetings.{group}"), "annotations": {
                ANNOTATION: serde_json::to_string(versions).unwrap(),
            }},
            "spec": {"group": group, "names": {"kind": kind, "plural": "greetings"},
                "scope": "Namespaced", "versions": [version("v2", true, v2), version("v1", false, v1)]},
        }))
        .unwrap()
    }

    /// Greeting's conversions: v2 the hub, v1's `message` its `text`, and
    /// `up` as computed fields of v2.
    pub(in crate::conversion) fn versions_with(up: Value) -> Versions {
        let v1 = serde_json::from_value(json!({
            "name": "v1",
            "schema": {"type": "object"},
            "conversion": {"moves": [{"from": "spec.message", "to": "spec.text"}], "up": up},
        }))
        .unwrap();
        Versions::new("hello.example.com", "Greeting", "v2", vec![v1]).unwrap()
    }

    /// Greeting's conversions, filed from its CRD.
    pub(in crate::conversion) fn conversions() -> Conversions {
        let conversions = Conversions::default();
        let crd = crd("hello.example.com", "Greeting", &versions_with(json!({})));
        conversions.file(std::sync::Arc::new(Filed::from_crd(&crd).unwrap()));
        conversions
    }

    fn review(desired: &str, objects: Value) -> ConversionReview {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": objects},
        }))
        .unwrap()
    }

    fn greeting(version: &str, spec: Value) -> Value {
        json!({"apiVersion": format!("hello.example.com/{version}"), "kind": "Greeting",
               "metadata": {"name": "a"}, "spec": spec})
    }

    /// What the version asked for does not declare is not in the answer:
    /// the API server would prune it when it reads, but not in the live
    /// object of a server-side apply, where it fails the apply.
    #[test]
    fn a_field_the_version_asked_for_does_not_declare_is_pruned() {
        let objects = json!([greeting(
            "v2",
            json!({"text": "two", "count": 2, "extra": {"k": 1}})
        )]);
        let answer = answer(review("hello.example.com/v1", objects), &conversions());
        let response = answer.response.unwrap();
        assert!(response.result.is_success(), "{:?}", response.result);
        assert_eq!(
            response.converted_objects,
            [greeting("v1", json!({"message": "two", "extra": {"k": 1}}))]
        );
    }

    #[test]
    fn every_object_is_converted_in_order_and_the_uid_kept() {
        let objects = json!([
            greeting("v1", json!({"message": "one"})),
            greeting("v2", json!({"text": "two"})),
        ]);
        let answer = answer(review("hello.example.com/v2", objects), &conversions());
        let response = answer.response.unwrap();
        assert_eq!(response.uid, "u-1");
        assert!(response.result.is_success(), "{:?}", response.result);
        assert_eq!(
            response.converted_objects,
            [
                greeting("v2", json!({"text": "one"})),
                greeting("v2", json!({"text": "two"}))
            ]
        );
        let wire = serde_json::to_value(answer_types()).unwrap();
        assert_eq!(wire["kind"], "ConversionReview");
    }

    fn answer_types() -> ConversionReview {
        answer(review("hello.example.com/v1", json!([])), &conversions())
    }

    #[test]
    fn an_unknown_kind_or_version_fails_the_whole_review_without_the_objects() {
        let objects = json!([greeting("v1", json!({"message": "secret words"}))]);
        let answer = answer(review("hello.example.com/v9", objects), &conversions());
        let response = answer.response.unwrap();
        assert!(response.result.is_failure());
        assert!(response.converted_objects.is_empty());
        assert!(!response.result.message.contains("secret"));
        let other = json!([{"apiVersion": "x.io/v1", "kind": "Other"}]);
        let response = super::answer(review("x.io/v2", other), &conversions())
            .response
            .unwrap();
        assert_eq!(
            response.result.message,
            "the operator serves no kind Other in x.io"
        );
    }
}

#[cfg(test)]
mod output {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::tests::{crd, versions_with};
    use super::*;
    use crate::conversion::Filed;

    fn answered(up: Value, spec: Value) -> kube::core::conversion::ConversionResponse {
        let conversions = Conversions::default();
        let crd = crd("hello.example.com", "Greeting", &versions_with(up));
        conversions.file(Arc::new(Filed::from_crd(&crd).unwrap()));
        let review = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": "hello.example.com/v2", "objects": [
                {"apiVersion": "hello.example.com/v1", "kind": "Greeting",
                 "metadata": {"name": "q2", "namespace": "team-a"}, "spec": spec},
            ]},
        }))
        .unwrap();
        answer(review, &conversions).response.unwrap()
    }

    #[test]
    fn what_fits_the_version_asked_for_is_answered() {
        let response = answered(
            json!({"spec.count": "size(self.spec.message)"}),
            json!({"message": "hi"}),
        );
        assert!(response.result.is_success(), "{:?}", response.result);
        assert_eq!(
            response.converted_objects[0]["spec"],
            json!({"text": "hi", "count": 2})
        );
    }

    #[test]
    fn a_wrong_type_or_a_missing_required_field_fails_the_review_naming_the_object_and_field() {
        let up = json!({"spec.count": "self.spec.message"});
        let response = answered(up, json!({"message": "secret words"}));
        assert!(response.result.is_failure());
        assert!(response.converted_objects.is_empty());
        assert_eq!(
            response.result.message,
            "team-a/q2: spec.count: expected integer, got string"
        );
        let response = answered(json!({}), json!({}));
        assert!(response.result.is_failure());
        assert_eq!(
            response.result.message,
            "team-a/q2: spec.text: Required value"
        );
    }
}
