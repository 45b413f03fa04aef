//! The fleet: every resource of the kind, listed page by page, after
//! checking that the kind is served and that the caller may read what the
//! plan reads (the missing rights named, all at once).

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

use super::PlanError;

/// Resources per page of the list.
const PAGE: u32 = 500;

/// One right the plan needs: `verb` on `resource` of `group`, in
/// `namespace` (`None`: in every namespace, or cluster-scoped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Right {
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource (plural).
    pub resource: String,
    /// The verb.
    pub verb: &'static str,
    /// Where.
    pub namespace: Option<String>,
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let resource = match self.group.as_str() {
            "" => self.resource.clone(),
            group => format!("{}.{group}", self.resource),
        };
        match &self.namespace {
            Some(ns) => write!(f, "{} {resource} in namespace {ns}", self.verb),
            None => write!(f, "{} {resource} (cluster-wide)", self.verb),
        }
    }
}

/// Fails unless the API server serves `resource` (its CRD installed).
pub async fn served(client: &Client, resource: &ApiResource) -> Result<(), PlanError> {
    let served = crate::kinds::served(client, resource, None)
        .await
        .map_err(|e| PlanError::cluster("the API's resources", &e))?;
    match served {
        crate::kinds::Availability::NotInstalled => Err(PlanError::NotServed(format!(
            "{} {}",
            resource.api_version, resource.kind
        ))),
        _ => Ok(()),
    }
}

/// Fails unless the caller holds every one of `rights`, naming each it
/// lacks.
pub async fn rights(client: &Client, rights: &[Right]) -> Result<(), PlanError> {
    let mut missing = Vec::new();
    for right in rights {
        if !may(client, right).await? {
            missing.push(right.to_string());
        }
    }
    match missing.is_empty() {
        true => Ok(()),
        false => Err(PlanError::Rights(missing)),
    }
}

/// Whether the caller holds `right` (a SelfSubjectAccessReview).
async fn may(client: &Client, right: &Right) -> Result<bool, PlanError> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(right.group.clone()),
                resource: Some(right.resource.clone()),
                namespace: right.namespace.clone(),
                verb: Some(right.verb.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await
        .map_err(|e| PlanError::cluster("an access review", &e))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Every resource at `resource` (in `namespace`, else everywhere), as
/// JSON, by namespace and name.
pub async fn list(
    client: &Client,
    resource: &ApiResource,
    namespaced: bool,
    namespace: Option<&str>,
) -> Result<Vec<Value>, PlanError> {
    let api: Api<DynamicObject> = match (namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, resource),
        _ => Api::all_with(client.clone(), resource),
    };
    let mut items = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(token) = next.take() {
            params = params.continue_token(&token);
        }
        let page = api
            .list(&params)
            .await
            .map_err(|e| PlanError::cluster(&format!("the {}", resource.plural), &e))?;
        for object in page.items {
            let value = serde_json::to_value(&object).map_err(|e| PlanError::Invalid {
                what: format!("a {} listed", resource.kind),
                reason: e.to_string(),
            })?;
            items.push(value);
        }
        next = page.metadata.continue_.filter(|t| !t.is_empty());
        if next.is_none() {
            break;
        }
    }
    items.sort_by_key(|o| {
        (
            o["metadata"]["namespace"].as_str().map(str::to_string),
            o["metadata"]["name"].as_str().map(str::to_string),
        )
    });
    Ok(items)
}
