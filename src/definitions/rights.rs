//! Whether the identity that writes a kind's objects may do what its
//! overlays need: one `SelfSubjectAccessReview` per verb and resource of
//! the rules `rbac` prints for the kind. Missing rights are listed, so
//! `RightsGranted=False` says what to grant (`kustomize-operator rbac`
//! prints it as one aggregated ClusterRole). A right granted is not asked
//! again for a few seconds ([`Granted`]): many definitions need the same
//! rights (`create configmaps`), and each looks again every few minutes.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::core::GroupVersionKind;
use kube::discovery::Scope;

use crate::kinds::declared::file::ReachRule;
use crate::kinds::declared::rbac::{KindRules, ObjectType, Rule};

/// The verbs the operator itself needs on the objects of a kind whose
/// writes run as a tenant's ServiceAccount: reading them (ownership,
/// health) stays with the operator.
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// How long a right granted is taken as granted without asking again: a
/// right revoked shows this much later at most; a right missing is asked
/// again every time, so one granted shows at once.
const GRANTED_FOR: Duration = Duration::from_secs(20);

/// The rights reviews granted lately, shared by every definition's look:
/// who (`None`: the operator's own account), and what they may do.
#[derive(Debug, Default)]
pub struct Granted(Mutex<HashMap<Question, Instant>>);

/// One access review's question.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Question {
    user: Option<String>,
    group: String,
    resource: String,
    verb: String,
    namespace: Option<String>,
}

impl Granted {
    /// True when `question` was granted within [`GRANTED_FOR`].
    fn recently(&self, question: &Question) -> bool {
        let granted = crate::sync::lock(&self.0);
        granted
            .get(question)
            .is_some_and(|at| at.elapsed() < GRANTED_FOR)
    }

    /// `question` was granted now; answers past [`GRANTED_FOR`] go.
    fn record(&self, question: Question) {
        let mut granted = crate::sync::lock(&self.0);
        granted.retain(|_, at| at.elapsed() < GRANTED_FOR);
        granted.insert(question, Instant::now());
    }
}

/// One right the identity lacks: `create configmaps`, `list greetings.hello.io`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The verb.
    pub verb: String,
    /// The resource (`configmaps`, `deployments.apps`).
    pub resource: String,
}

impl Missing {
    /// The same right, said to be `user`'s.
    pub fn as_user(self, user: &str) -> Self {
        Self {
            verb: format!("({user}) {}", self.verb),
            ..self
        }
    }
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)
    }
}

/// The rules the operator's own account must hold: all of them, or, when
/// a tenant's account writes the objects, those on the kind's own
/// resources, reading the objects, watching what the references read, and
/// impersonating ServiceAccounts.
pub fn operator_rules(rules: &KindRules, tenant_writes: bool) -> Vec<Rule> {
    if !tenant_writes {
        return rules.all();
    }
    let mut needed = rules.own.clone();
    needed.extend(rules.objects.iter().map(|r| Rule {
        verbs: READ_VERBS.iter().map(|v| v.to_string()).collect(),
        ..r.clone()
    }));
    // The references are read as the tenant; the operator only watches.
    needed.extend(rules.reads.iter().map(|r| Rule {
        verbs: vec!["list".into(), "watch".into()],
        ..r.clone()
    }));
    needed.push(Rule {
        api_groups: vec![String::new()],
        resources: vec!["serviceaccounts".into()],
        verbs: vec!["impersonate".into()],
    });
    needed
}

/// The rights of `rules` that `user` (the client's own identity when
/// `None`, else impersonated) lacks, cluster-wide.
pub async fn missing(
    client: &Client,
    granted: &Granted,
    rules: &[Rule],
    user: Option<&str>,
) -> Result<Vec<Missing>, kube::Error> {
    let mut missing = Vec::new();
    for rule in rules {
        for group in &rule.api_groups {
            for resource in &rule.resources {
                for verb in &rule.verbs {
                    if !review(client, granted, user, group, resource, verb, None).await? {
                        missing.push(Missing {
                            verb: verb.clone(),
                            resource: qualified(group, resource),
                        });
                    }
                }
            }
        }
    }
    Ok(missing)
}

/// What the identity writing a kind's objects could reach beyond a
/// resource's own namespace, asked of discovery and of access reviews.
/// A namespaced kind's objects stay in its resource's namespace (the
/// engine refuses any other) unless its kind file declares more
/// (`declared`, each said here); a cluster-scoped kind's may go anywhere
/// its writer may write: each object type says where that is.
pub async fn reach(
    client: &Client,
    granted: &Granted,
    user: Option<&str>,
    namespaced_kind: bool,
    types: &BTreeSet<ObjectType>,
    declared: &[ReachRule],
) -> Result<Vec<String>, kube::Error> {
    if namespaced_kind {
        if declared.is_empty() {
            return Ok(vec![
                "nothing beyond each resource's own namespace (a namespaced kind's objects stay there)"
                    .into(),
            ]);
        }
        return Ok(declared.iter().map(declared_line).collect());
    }
    let mut lines = Vec::new();
    for (api_version, kind) in types {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => found,
            Err(kube::Error::Api(e)) if e.code == 404 => {
                lines.push(format!("{kind} ({api_version}): not served by the cluster"));
                continue;
            }
            Err(e) => return Err(e),
        };
        let name = qualified(&resource.group, &resource.plural);
        let line = if caps.scope == Scope::Cluster {
            if review(
                client,
                granted,
                user,
                &resource.group,
                &resource.plural,
                "create",
                None,
            )
            .await?
            {
                format!("{name}: cluster-scoped, may be created and changed")
            } else {
                format!("{name}: cluster-scoped, not granted")
            }
        } else if review(
            client,
            granted,
            user,
            &resource.group,
            &resource.plural,
            "create",
            Some("kube-system"),
        )
        .await?
        {
            format!("{name}: in every namespace, kube-system included")
        } else {
            format!("{name}: only in namespaces that grant it")
        };
        lines.push(line);
    }
    Ok(lines)
}

/// What one declared `reach` entry allows, as the definition's status says it.
fn declared_line(rule: &ReachRule) -> String {
    let what = format!("{} ({})", rule.kind, rule.api_version);
    match &rule.namespaces {
        None => format!("{what}: cluster-scoped, declared in spec.reach"),
        Some(patterns) => format!(
            "{what}: in namespaces {}, declared in spec.reach",
            patterns.join(", ")
        ),
    }
}

/// `resource.group`, or `resource` in the core group; a subresource
/// stays after a slash (`greetings.hello.io/status`).
fn qualified(group: &str, resource: &str) -> String {
    let (name, sub) = match resource.split_once('/') {
        Some((name, sub)) => (name, Some(sub)),
        None => (resource, None),
    };
    let base = if group.is_empty() {
        name.to_string()
    } else {
        format!("{name}.{group}")
    };
    match sub {
        Some(sub) => format!("{base}/{sub}"),
        None => base,
    }
}

/// Whether `user` (the client's own identity when `None`) may `verb`
/// `resource` (`name` or `name/subresource`) of `group`, in `namespace` or
/// cluster-wide: a SelfSubjectAccessReview, impersonating `user` when
/// given (the operator holds `impersonate` for the accounts it writes as);
/// not asked when `granted` lately.
async fn review(
    client: &Client,
    granted: &Granted,
    user: Option<&str>,
    group: &str,
    resource: &str,
    verb: &str,
    namespace: Option<&str>,
) -> Result<bool, kube::Error> {
    let question = Question {
        user: user.map(str::to_string),
        group: group.to_string(),
        resource: resource.to_string(),
        verb: verb.to_string(),
        namespace: namespace.map(str::to_string),
    };
    if granted.recently(&question) {
        return Ok(true);
    }
    let allowed = ask(client, &question).await?;
    if allowed {
        granted.record(question);
    }
    Ok(allowed)
}

/// The SelfSubjectAccessReview itself.
async fn ask(client: &Client, question: &Question) -> Result<bool, kube::Error> {
    let (name, subresource) = match question.resource.split_once('/') {
        Some((name, sub)) => (name, Some(sub.to_string())),
        None => (question.resource.as_str(), None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(question.group.clone()),
                resource: Some(name.to_string()),
                subresource,
                namespace: question.namespace.clone(),
                verb: Some(question.verb.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer: SelfSubjectAccessReview = match question.user.as_deref() {
        None => {
            Api::<SelfSubjectAccessReview>::all(client.clone())
                .create(&PostParams::default(), &review)
                .await?
        }
        Some(user) => {
            let body = serde_json::to_vec(&review).map_err(kube::Error::SerdeError)?;
            let request =
                http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .header("Impersonate-User", user)
                    .body(body)
                    .map_err(kube::Error::HttpError)?;
            client.request(request).await?
        }
    };
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(group: &str, resource: &str, verbs: &[&str]) -> Rule {
        Rule {
            api_groups: vec![group.into()],
            resources: vec![resource.into()],
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn a_tenant_writing_leaves_the_operator_reads_and_impersonation() {
        let rules = KindRules {
            own: vec![rule("hello.io", "greetings", &["get", "patch"])],
            objects: vec![rule("", "configmaps", &["get", "create", "delete"])],
            reads: vec![rule("", "secrets", &["get", "list", "watch"])],
        };
        assert_eq!(operator_rules(&rules, false), rules.all());
        let tenant = operator_rules(&rules, true);
        assert_eq!(
            tenant,
            [
                rules.own[0].clone(),
                rule("", "configmaps", &["get", "list", "watch"]),
                rule("", "secrets", &["list", "watch"]),
                rule("", "serviceaccounts", &["impersonate"]),
            ]
        );
    }

    #[test]
    fn a_right_granted_is_taken_as_granted_for_a_while_and_no_longer() {
        let question = |user: Option<&str>| Question {
            user: user.map(str::to_string),
            group: String::new(),
            resource: "configmaps".into(),
            verb: "create".into(),
            namespace: None,
        };
        let granted = Granted::default();
        assert!(!granted.recently(&question(None)));
        granted.record(question(None));
        assert!(granted.recently(&question(None)));
        assert!(
            !granted.recently(&question(Some("system:serviceaccount:t:w"))),
            "another account"
        );
        crate::sync::lock(&granted.0).insert(question(None), Instant::now() - GRANTED_FOR);
        assert!(
            !granted.recently(&question(None)),
            "asked again once it is old"
        );
        granted.record(question(Some("u")));
        assert_eq!(
            crate::sync::lock(&granted.0).len(),
            1,
            "the old answer went"
        );
    }

    #[test]
    fn resources_are_named_with_their_group() {
        assert_eq!(qualified("", "configmaps"), "configmaps");
        assert_eq!(qualified("apps", "deployments"), "deployments.apps");
        assert_eq!(
            qualified("hello.io", "greetings/status"),
            "greetings.hello.io/status"
        );
    }
}
