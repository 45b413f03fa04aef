//! The kind's resources, as a rollout's gate sees them: listed a page at
//! a time in the namespace the operator serves (or all), each cut down to
//! where it stands ([`Seen`]) when a step reached so far takes it.

use std::collections::BTreeMap;

use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use serde_json::Value;

use super::super::context::DefinitionContext;
use super::super::serving::Revisions;
use crate::kinds::declared::rollout::PIN_LABEL;
use crate::kinds::declared::rollout::gate::Seen;
use crate::kinds::declared::rollout::steps::Steps;

/// The resources of a kind read per list call.
const PAGE: u32 = 500;

/// The kind's resources, as a rollout at `step` of `steps` to revision
/// `latest` sees them.
#[derive(Debug, Default)]
pub struct RolloutView {
    /// The resources the rollout moves (all but the pinned).
    pub resources: u64,
    /// Of them, those whose status says the latest revision.
    pub updated: u64,
    /// Those of the steps up to `step`, as the gate sees them.
    pub members: Vec<Seen>,
}

/// Lists the resources of the kind the operator serves (its namespace,
/// or all), a page at a time, keeping what the gate of `step` reads.
pub async fn observe(
    ctx: &DefinitionContext,
    served: &Revisions,
    steps: &Steps,
    step: usize,
    latest: u32,
) -> Result<RolloutView, kube::Error> {
    let Some(kind) = served.rollout.latest_kind() else {
        return Ok(RolloutView::default());
    };
    let api = match &ctx.engine.settings().namespace {
        Some(ns) if kind.namespaced() => {
            Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &kind.resource)
        }
        _ => Api::<DynamicObject>::all_with(ctx.client.clone(), &kind.resource),
    };
    let with_view = steps.step(step).is_some_and(|s| s.expression.is_some());
    let mut observed = RolloutView::default();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        for object in &page.items {
            let labels: BTreeMap<String, String> = object.labels().clone();
            if labels.contains_key(PIN_LABEL) {
                continue;
            }
            let value = serde_json::to_value(object).unwrap_or(Value::Null);
            observed.resources += 1;
            if value["status"]["revision"].as_u64() == Some(u64::from(latest)) {
                observed.updated += 1;
            }
            let namespace = object.namespace();
            if steps.reached(step, namespace.as_deref(), &object.name_any(), &labels) {
                observed.members.push(Seen::of(&value, latest, with_view));
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(observed),
        }
    }
}
