//! Greeting (`hello.nuvolaris.org/v1`): a ConfigMap holding a message.
//!
//! Recipe: generate a ConfigMap named after the Greeting, in its namespace,
//! whose `message` key is `spec.message`; `kubectl apply -k`. On deletion,
//! `kubectl delete -k` the same overlay.

use std::collections::BTreeMap;

use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::handler::{Handler, HandlerError, Kind, Plan, namespaced_api};
use crate::kinds::{FromOptions, KindOptions};
use crate::overlay::{ConfigMapGenerator, GeneratorOptions, Overlay};
use crate::status::CommonStatus;

/// A Greeting asks for a ConfigMap holding its message.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "hello.nuvolaris.org",
    version = "v1",
    kind = "Greeting",
    plural = "greetings",
    shortname = "greet",
    namespaced,
    status = "CommonStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message"}"#
)]
pub struct GreetingSpec {
    /// What to say.
    #[schemars(length(min = 1, max = 200))]
    pub message: String,
}

impl Kind for Greeting {
    const NAME: &'static str = "greeting";
    const FINALIZER: &'static str = "hello.nuvolaris.org/kustomize-operator";

    fn common_status(&self) -> Option<&CommonStatus> {
        self.status.as_ref()
    }

    fn api(client: kube::Client, namespace: Option<&str>) -> kube::Api<Self> {
        namespaced_api(client, namespace)
    }
}

/// Builds Greeting overlays.
#[derive(Debug, Default)]
pub struct GreetingHandler;

impl FromOptions for GreetingHandler {
    fn from_options(_: &KindOptions) -> Self {
        Self
    }
}

impl GreetingHandler {
    /// The overlay for a Greeting: one generated ConfigMap named after it.
    pub fn overlay(greeting: &Greeting) -> Result<Overlay, HandlerError> {
        let namespace = greeting
            .namespace()
            .ok_or_else(|| HandlerError::Invalid("a Greeting must have a namespace".into()))?;
        Ok(Overlay {
            base: Some(Greeting::NAME.into()),
            namespace: Some(namespace),
            config_map_generators: vec![ConfigMapGenerator {
                name: greeting.name_any(),
                namespace: None,
                data: BTreeMap::from([("message".into(), greeting.spec.message.clone())]),
            }],
            // A stable name, so an update replaces the ConfigMap's data.
            generator_options: Some(GeneratorOptions {
                disable_name_suffix_hash: true,
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

impl Handler for GreetingHandler {
    type Resource = Greeting;
    type Observed = ();

    async fn observe(&self, _: &Greeting, _: &kube::Client) -> Result<(), HandlerError> {
        Ok(())
    }

    fn observe_offline(&self, _: &Greeting, _: &[serde_json::Value]) -> Result<(), HandlerError> {
        Ok(())
    }

    fn plan(&self, greeting: &Greeting, _: &()) -> Result<Plan, HandlerError> {
        Ok(Plan::apply(Self::overlay(greeting)?))
    }

    fn cleanup(&self, greeting: &Greeting) -> Result<Plan, HandlerError> {
        Ok(Plan::delete(Self::overlay(greeting)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_goes_into_a_configmap_named_after_the_greeting() {
        let mut g = Greeting::new(
            "hi",
            GreetingSpec {
                message: "Hello, world".into(),
            },
        );
        g.metadata.namespace = Some("demo".into());
        let overlay = GreetingHandler::overlay(&g).unwrap();
        assert_eq!(overlay.namespace.as_deref(), Some("demo"));
        let cm = &overlay.config_map_generators[0];
        assert_eq!(cm.name, "hi");
        assert_eq!(cm.data["message"], "Hello, world");
    }
}
