//! Sample (`nuvolaris.org/v1`): the Nuvolaris training's demo kind.
//!
//! Recipe: take the nginx Deployment of `kustomize/sample/base`, rename it
//! after the Sample, put it in the Sample's namespace, give it a selector
//! label unique to the Sample and `spec.count` replicas; `kubectl apply -k`.
//! On deletion, `kubectl delete -k` the same overlay.

use std::collections::BTreeMap;

use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::handler::{Handler, HandlerError, Kind, Plan, namespaced_api};
use crate::kinds::{FromOptions, KindOptions};
use crate::overlay::{Labels, Overlay, PatchTemplate, Target};
use crate::status::CommonStatus;

/// The label that ties a Deployment (and its selector) to one Sample.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The label naming this operator as the manager.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// A Sample asks for a Deployment of nginx with `count` replicas.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nuvolaris.org",
    version = "v1",
    kind = "Sample",
    plural = "samples",
    singular = "sample",
    shortname = "sam",
    namespaced,
    status = "CommonStatus",
    printcolumn = r#"{"name":"Count","type":"integer","jsonPath":".spec.count"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct SampleSpec {
    /// Replicas of the Deployment.
    #[schemars(range(min = 0, max = 1000))]
    pub count: i32,
}

impl Kind for Sample {
    const NAME: &'static str = "sample";
    const FINALIZER: &'static str = "nuvolaris.org/kustomize-operator";

    fn common_status(&self) -> Option<&CommonStatus> {
        self.status.as_ref()
    }

    fn api(client: kube::Client, namespace: Option<&str>) -> kube::Api<Self> {
        namespaced_api(client, namespace)
    }
}

/// Builds Sample overlays.
#[derive(Debug, Default)]
pub struct SampleHandler;

impl FromOptions for SampleHandler {
    fn from_options(_: &KindOptions) -> Self {
        Self
    }
}

impl SampleHandler {
    /// The overlay for a Sample: one Deployment named after it.
    pub fn overlay(sample: &Sample) -> Result<Overlay, HandlerError> {
        let name = sample.name_any();
        // The name becomes a label value, which Kubernetes caps at 63 characters.
        if name.len() > 63 {
            return Err(HandlerError::Invalid(format!(
                "Sample name {name:?} is {} characters long; at most 63 can be used for its Deployment's selector label",
                name.len()
            )));
        }
        let namespace = sample
            .namespace()
            .ok_or_else(|| HandlerError::Invalid("a Sample must have a namespace".to_string()))?;
        Ok(Overlay {
            base: Some(Sample::NAME.into()),
            namespace: Some(namespace),
            labels: vec![
                Labels {
                    pairs: BTreeMap::from([(INSTANCE_LABEL.into(), name.clone())]),
                    include_selectors: true,
                    include_templates: true,
                },
                Labels {
                    pairs: BTreeMap::from([(MANAGED_BY_LABEL.into(), "kustomize-operator".into())]),
                    include_selectors: false,
                    include_templates: false,
                },
            ],
            patches: vec![PatchTemplate {
                template: "deployment.yaml".into(),
                values: json!({ "name": name, "count": sample.spec.count }),
                target: Some(Target {
                    kind: Some("Deployment".into()),
                    name: Some("nginx".into()),
                    ..Default::default()
                }),
                allow_name_change: false,
            }],
            ..Default::default()
        })
    }
}

impl Handler for SampleHandler {
    type Resource = Sample;
    type Observed = ();

    async fn observe(&self, _: &Sample, _: &kube::Client) -> Result<(), HandlerError> {
        Ok(())
    }

    fn observe_offline(&self, _: &Sample, _: &[serde_json::Value]) -> Result<(), HandlerError> {
        Ok(())
    }

    fn plan(&self, sample: &Sample, _: &()) -> Result<Plan, HandlerError> {
        let mut plan = Plan::apply(Self::overlay(sample)?);
        plan.batch_names = vec![format!("deployment.apps/{}", sample.name_any())];
        Ok(plan)
    }

    fn cleanup(&self, sample: &Sample) -> Result<Plan, HandlerError> {
        Ok(Plan::delete(Self::overlay(sample)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::Step;

    fn sample(name: &str, count: i32) -> Sample {
        let mut s = Sample::new(name, SampleSpec { count });
        s.metadata.namespace = Some("demo".into());
        s
    }

    #[test]
    fn plan_applies_one_overlay_named_after_the_sample() {
        let plan = SampleHandler.plan(&sample("web", 3), &()).unwrap();
        let [
            Step::Apply {
                overlay,
                extra_args,
            },
        ] = plan.steps.as_slice()
        else {
            panic!("unexpected plan {plan:?}");
        };
        assert!(extra_args.is_empty());
        assert_eq!(overlay.base.as_deref(), Some("sample"));
        assert_eq!(overlay.namespace.as_deref(), Some("demo"));
        assert_eq!(
            overlay.patches[0].values,
            json!({"name": "web", "count": 3})
        );
        assert_eq!(overlay.labels[0].pairs[INSTANCE_LABEL], "web");
        assert!(overlay.labels[0].include_selectors);
    }

    #[test]
    fn cleanup_deletes_the_same_overlay() {
        let s = sample("web", 3);
        let plan = SampleHandler.cleanup(&s).unwrap();
        assert_eq!(
            plan.steps,
            vec![Step::Delete {
                overlay: SampleHandler::overlay(&s).unwrap()
            }]
        );
    }

    #[test]
    fn a_name_too_long_for_a_label_is_invalid() {
        let err = SampleHandler
            .plan(&sample(&"a".repeat(64), 1), &())
            .unwrap_err();
        assert!(matches!(err, HandlerError::Invalid(_)));
        assert!(err.to_string().contains("63"));
    }

    #[test]
    fn schema_bounds_count() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(Sample::crd()).unwrap();
        let count = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["count"];
        assert_eq!(count["minimum"].as_f64(), Some(0.0));
        assert_eq!(count["maximum"].as_f64(), Some(1000.0));
        assert_eq!(crd["spec"]["names"]["shortNames"][0], "sam");
    }
}
