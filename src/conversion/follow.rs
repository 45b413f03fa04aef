//! Every replica's webhook answers from the CRDs themselves: the operator
//! that applies a CRD of several versions writes its kind's conversions
//! into it ([`super::ANNOTATION`]), and each replica, leader or not, just
//! started or not, follows the CRDs and answers with what the applied CRD
//! says, compiled as it is read ([`Filed::from_crd`]).
//!
//! A CRD is only believed about itself, and only if it is one the operator
//! serves: its conversions are filed under its own group and kind, when
//! its marker label names a `KindDefinition` this operator serves (one
//! that exists and matches its definition selector) which declares that
//! very CRD (its group, kind and plural). Anything else is refused, and
//! said in the log; a CRD refused or gone removes what it had filed
//! itself, never what another CRD filed ([`Conversions::remove`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::{ANNOTATION, Conversions, Filed, Unfiled};

/// How often a CRD whose definition could not be looked up is tried again.
const RETRY: Duration = Duration::from_secs(10);

/// The definitions whose CRDs a replica answers for: those it serves.
#[derive(Debug, Clone)]
pub struct Following {
    /// The label on a CRD naming the definition it was applied for.
    pub marker: String,
    /// Where the API serves definitions.
    pub definitions: ApiResource,
    /// Only definitions matching this label selector (default: all).
    pub selector: Option<String>,
}

/// Follows the CRDs carrying `following`'s marker until the task is
/// dropped, keeping `conversions` to what each declares for itself.
pub async fn follow(client: Client, conversions: Arc<Conversions>, following: Following) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let definitions = Api::<DynamicObject>::all_with(client, &following.definitions);
    let config = watcher::Config::default().labels(&following.marker);
    let events = watcher(crds, config).default_backoff();
    futures::pin_mut!(events);
    // CRDs whose definition could not be looked up, by name: tried again.
    let mut pending = BTreeMap::new();
    let mut retry = tokio::time::interval(RETRY);
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Ok(watcher::Event::Apply(crd) | watcher::Event::InitApply(crd))) => {
                    pending.remove(&crd.name_any());
                    if !applied(&crd, &definitions, &following, &conversions).await {
                        pending.insert(crd.name_any(), crd);
                    }
                }
                Some(Ok(watcher::Event::Delete(crd))) => {
                    pending.remove(&crd.name_any());
                    tracing::info!(crd = %crd.name_any(), "conversion webhook: the CRD is gone; what it filed for its own kind is no longer answered with");
                    unfile(&crd, &conversions);
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %crate::error_text::watch(&e), "conversion webhook: cannot follow the CRDs");
                }
            },
            _ = retry.tick(), if !pending.is_empty() => {
                for (name, crd) in std::mem::take(&mut pending) {
                    if !applied(&crd, &definitions, &following, &conversions).await {
                        pending.insert(name, crd);
                    }
                }
            }
        }
    }
}

/// Files or refuses what the CRD `crd` declares; false when its
/// definition could not be looked up (to be tried again).
async fn applied(
    crd: &CustomResourceDefinition,
    definitions: &Api<DynamicObject>,
    following: &Following,
    conversions: &Conversions,
) -> bool {
    if !crd.annotations().contains_key(ANNOTATION) {
        // A kind of one version: nothing to look up.
        unfile(crd, conversions);
        return true;
    }
    let marker = crd.labels().get(&following.marker).cloned();
    let definition = match &marker {
        Some(name) => match served_definition(definitions, following, name).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(crd = %crd.name_any(), definition = name, error = %crate::error_text::kube(&e), "conversion webhook: cannot look up the CRD's definition; tried again");
                return false;
            }
        },
        None => None,
    };
    match filing(crd, marker.as_deref(), definition.as_ref()) {
        Ok(filed) => conversions.file(Arc::new(filed)),
        Err(refused) => {
            if refused.suspect() {
                tracing::warn!(crd = %crd.name_any(), "conversion webhook: {refused}; its kind is not answered for from it");
            } else {
                tracing::debug!(crd = %crd.name_any(), "conversion webhook: {refused}");
            }
            unfile(crd, conversions);
        }
    }
    true
}

/// The definition `name` if this operator serves it: it exists and
/// matches the definition selector.
async fn served_definition(
    definitions: &Api<DynamicObject>,
    following: &Following,
    name: &str,
) -> Result<Option<DynamicObject>, kube::Error> {
    let mut params = ListParams::default().fields(&format!("metadata.name={name}"));
    if let Some(selector) = &following.selector {
        params = params.labels(selector);
    }
    let mut found = definitions.list(&params).await?.items;
    Ok(found.pop().filter(|d| d.name_any() == name))
}

/// What the CRD `crd` files: its conversions, if its marker names
/// (`marker`) the served definition `definition`, which declares this CRD.
pub(super) fn filing(
    crd: &CustomResourceDefinition,
    marker: Option<&str>,
    definition: Option<&DynamicObject>,
) -> Result<Filed, Unfiled> {
    let name = crd.name_any();
    let Some(marker) = marker else {
        return Err(Unfiled::Unmarked { crd: name });
    };
    let Some(definition) = definition else {
        return Err(Unfiled::NotServed {
            crd: name,
            definition: marker.to_string(),
        });
    };
    let declared = declared_crd(definition);
    if declared.as_ref() != Some(&(name.clone(), crd.spec.names.kind.clone())) {
        let (declared, kind) = declared.unwrap_or_default();
        return Err(Unfiled::NotDeclared {
            crd: name,
            definition: marker.to_string(),
            declared,
            kind,
        });
    }
    Filed::from_crd(crd)
}

/// The name (`plural.group`) and kind of the CRD `definition` declares.
fn declared_crd(definition: &DynamicObject) -> Option<(String, String)> {
    let spec = &definition.data["spec"];
    let group = spec["group"].as_str()?;
    let plural = spec["names"]["plural"].as_str()?;
    let kind = spec["names"]["kind"].as_str()?;
    Some((format!("{plural}.{group}"), kind.to_string()))
}

/// Removes what `crd` filed for its own group and kind, if it did.
fn unfile(crd: &CustomResourceDefinition, conversions: &Conversions) {
    let (group, kind) = (&crd.spec.group, &crd.spec.names.kind);
    conversions.remove(group, kind, &crd.name_any());
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::review::tests::{crd, versions_with};
    use super::*;

    /// The KindDefinition `name`, declaring the kind `kind` of `group`.
    fn definition(name: &str, group: &str, kind: &str) -> DynamicObject {
        let resource = ApiResource {
            group: "kustomize-operator.io".into(),
            version: "v1alpha1".into(),
            api_version: "kustomize-operator.io/v1alpha1".into(),
            kind: "KindDefinition".into(),
            plural: "kinddefinitions".into(),
        };
        let mut object = DynamicObject::new(name, &resource);
        object.data =
            json!({"spec": {"group": group, "names": {"kind": kind, "plural": "greetings"}}});
        object
    }

    #[test]
    fn a_crd_files_its_own_kind_only_when_its_definition_declares_it() {
        let versions = versions_with(json!({}));
        let own = crd("hello.example.com", "Greeting", &versions);
        let def = definition("greeting", "hello.example.com", "Greeting");
        let filed = filing(&own, Some("greeting"), Some(&def)).unwrap();
        assert_eq!(filed.key(), ("hello.example.com".into(), "Greeting".into()));
        assert_eq!(filed.crd(), "greetings.hello.example.com");

        let refused = filing(&own, Some("greeting"), None).unwrap_err();
        assert!(matches!(refused, Unfiled::NotServed { .. }), "{refused}");
        assert!(!refused.suspect(), "another operator's: said quietly");
        assert!(filing(&own, None, Some(&def)).is_err());
        let other = definition("greeting", "other.example.com", "Greeting");
        let refused = filing(&own, Some("greeting"), Some(&other)).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("declares the CRD greetings.other.example.com"),
            "{refused}"
        );
    }

    #[test]
    fn a_decoy_carrying_another_kinds_conversions_files_nothing_and_removes_nothing() {
        let versions = versions_with(json!({}));
        let conversions = Conversions::default();
        let own = crd("hello.example.com", "Greeting", &versions);
        let def = definition("greeting", "hello.example.com", "Greeting");
        conversions.file(Arc::new(
            filing(&own, Some("greeting"), Some(&def)).unwrap(),
        ));

        // Its own group and kind, another's annotation.
        let decoy = crd("decoy.example.com", "Decoy", &versions);
        let decoy_def = definition("decoy", "decoy.example.com", "Decoy");
        let refused = filing(&decoy, Some("decoy"), Some(&decoy_def)).unwrap_err();
        assert!(matches!(refused, Unfiled::AnotherKind { .. }), "{refused}");
        assert!(refused.suspect());
        // Another CRD of the same kind, marked with A's definition.
        let mut twin = own.clone();
        twin.metadata.name = Some("decoys.hello.example.com".into());
        twin.spec.names.plural = "decoys".into();
        let refused = filing(&twin, Some("greeting"), Some(&def)).unwrap_err();
        assert!(matches!(refused, Unfiled::NotDeclared { .. }), "{refused}");
        assert!(refused.suspect());

        for gone in [&decoy, &twin] {
            unfile(gone, &conversions);
        }
        let kept = conversions.get("hello.example.com", "Greeting").unwrap();
        assert_eq!(kept.crd(), "greetings.hello.example.com");
        unfile(&own, &conversions);
        assert!(conversions.get("hello.example.com", "Greeting").is_none());
    }

    #[test]
    fn an_annotation_whose_computed_field_does_not_compile_is_refused_whole() {
        let versions = versions_with(json!({"spec.count": "size(self.spec.message)"}));
        let mut own = crd("hello.example.com", "Greeting", &versions);
        let def = definition("greeting", "hello.example.com", "Greeting");
        let filed = filing(&own, Some("greeting"), Some(&def)).unwrap();
        assert_eq!(filed.versions(), &versions, "computed fields compiled");
        let annotations = own.metadata.annotations.as_mut().unwrap();
        let text =
            annotations[super::super::ANNOTATION].replace("size(self.spec.message)", "size(");
        annotations.insert(super::super::ANNOTATION.into(), text);
        let refused = filing(&own, Some("greeting"), Some(&def)).unwrap_err();
        assert!(
            refused.to_string().contains("v1.conversion.up.spec.count"),
            "{refused}"
        );
    }
}
