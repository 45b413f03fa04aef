//! Whether a CustomResourceDefinition is established (its API served):
//! waited for by a reconcile whose build holds a CRD and resources of it,
//! and by a KindDefinition before its kind is served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject};
use kube::core::{GroupVersionKind, ObjectMeta};
use kube::{Api, Client};
use serde_json::Value;

/// How long a new CRD may take to be established.
pub(crate) const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// How often it is looked at meanwhile.
const ESTABLISH_POLL: Duration = Duration::from_millis(200);

/// The CRD `name`'s metadata once it is established (within
/// [`ESTABLISH_TIMEOUT`]; `None` when it is not by then) at its current
/// generation, where the API server says (see [`is_established`]), and
/// discovery serves its kind at every version it serves. The API server
/// publishes a new group's discovery a moment after it sets `Established`;
/// a lookup in between finds no such kind, and an apply of the kind's
/// objects then would fail once before converging. The metadata is as
/// read then, after the API server's own status writes of the apply.
pub(crate) async fn wait_established(
    client: &Client,
    name: &str,
) -> Result<Option<ObjectMeta>, kube::Error> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &crd_resource());
    let deadline = tokio::time::Instant::now() + ESTABLISH_TIMEOUT;
    loop {
        match api.get_opt(name).await? {
            Some(crd)
                if is_established(&summary(&crd))
                    && discovered(client, &served_kinds(&crd.data["spec"])).await? =>
            {
                return Ok(Some(crd.metadata));
            }
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(ESTABLISH_POLL).await;
    }
}

/// What [`is_established`] reads of a live CRD.
fn summary(crd: &DynamicObject) -> Value {
    serde_json::json!({
        "metadata": {"generation": crd.metadata.generation},
        "status": crd.data["status"],
    })
}

/// The kind a CRD's `spec` declares, at each version it serves.
fn served_kinds(spec: &Value) -> Vec<GroupVersionKind> {
    let (Some(group), Some(kind)) = (spec["group"].as_str(), spec["names"]["kind"].as_str()) else {
        return Vec::new();
    };
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] != false)
        .filter_map(|v| v["name"].as_str())
        .map(|version| GroupVersionKind::gvk(group, version, kind))
        .collect()
}

/// True when discovery serves every one of `kinds` (not found: not yet).
async fn discovered(client: &Client, kinds: &[GroupVersionKind]) -> Result<bool, kube::Error> {
    for gvk in kinds {
        match kube::discovery::pinned_kind(client, gvk).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(kube::Error::Discovery(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// What kube needs to read CRDs as JSON: the conditions' `observedGeneration`
/// (in the API since Kubernetes 1.35) is not in the 1.33 API types the
/// operator is built with.
fn crd_resource() -> ApiResource {
    ApiResource::erase::<CustomResourceDefinition>(&())
}

/// True when the CRD's `Established` condition is `True` for its current
/// generation: where the condition says which generation it was set for
/// (`observedGeneration`, in the API since Kubernetes 1.35 though no
/// controller sets it yet as of 1.37.2), a condition of an earlier one (a
/// schema changed a moment ago) does not count yet; where it does not
/// say, `True` is enough.
pub(crate) fn is_established(crd: &Value) -> bool {
    established_at(crd).is_some_and(|observed| {
        match (observed, crd["metadata"]["generation"].as_i64()) {
            (Some(observed), Some(current)) => observed >= current,
            _ => true,
        }
    })
}

/// The `observedGeneration` of a `True` `Established` condition (`Some(None)`
/// when it names none); `None` when the CRD is not established.
pub(crate) fn established_at(crd: &Value) -> Option<Option<i64>> {
    crd["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Established" && c["status"] == "True")
        .map(|c| c["observedGeneration"].as_i64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(generation: i64, condition: Value) -> Value {
        json!({"metadata": {"generation": generation}, "status": {"conditions": [condition]}})
    }

    #[test]
    fn established_counts_for_the_current_generation_where_the_server_says_which() {
        let at = |g: i64| json!({"type": "Established", "status": "True", "observedGeneration": g});
        assert!(is_established(&crd(2, at(2))));
        assert!(!is_established(&crd(3, at(2))), "set for the schema before");
        let unsaid = json!({"type": "Established", "status": "True"});
        assert!(
            is_established(&crd(3, unsaid)),
            "1.33 and 1.34 say no generation"
        );
        let not = json!({"type": "Established", "status": "False", "observedGeneration": 3});
        assert!(!is_established(&crd(3, not)));
        assert!(!is_established(&json!({"metadata": {"generation": 1}})));
    }

    #[test]
    fn the_kinds_waited_for_in_discovery_are_those_of_the_served_versions() {
        let spec = json!({
            "group": "g.example.com",
            "names": {"kind": "Gadget", "plural": "gadgets"},
            "versions": [
                {"name": "v1", "served": true},
                {"name": "v1beta1", "served": false},
                {"name": "v2"},
            ],
        });
        let versions: Vec<String> = served_kinds(&spec).into_iter().map(|k| k.version).collect();
        assert_eq!(versions, ["v1", "v2"]);
        assert!(served_kinds(&json!({"versions": [{"name": "v1"}]})).is_empty());
    }
}
