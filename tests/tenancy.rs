//! Tenancy: the operator never does for a requester what the requester could
//! not do directly. The ValidatingAdmissionPolicies of `deploy/admission`
//! make the API server refuse a CopyratorRule or ChaosAgent whose author lacks
//! the rights the operator would use for it.
//!
//! Tenants are ServiceAccounts with namespace-scoped rights (the built-in
//! `edit` ClusterRole bound in their namespace, plus the project's kinds),
//! acting through kubeconfigs that hold nothing but their own tokens. Every
//! refusal is checked for the API server's answer (403 Forbidden from the
//! policy, naming the user and the missing right) and for its effect
//! (nothing created, nothing changed). The admin (the test's kubeconfig,
//! system:masters) remains free to copy anywhere.

use ko_test_support as common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kinds::chaos_agent::ChaosAgent;
use kustomize_operator::kinds::copyrator::CopyratorRule;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

const RULE_POLICY: &str = "kustomize-operator-copyrator-rights";
const AGENT_POLICY: &str = "kustomize-operator-chaosagent-rights";
const SHARD_POLICY: &str = "kustomize-operator-shard-guard";
/// The most listed namespaces the policy checks one by one
/// (`ONE_BY_ONE` in hack/generate-copyrator-policy).
const ONE_BY_ONE: usize = 10;
const SCOPE_LABEL: &str = "blackadder.io/namespace";
const TIMEOUT: Duration = Duration::from_secs(60);

static POLICIES: OnceCell<()> = OnceCell::const_new();

/// `kubectl apply -k deploy/admission` (idempotent; the policies stay, as the
/// install's do), once per test binary; returns when the three policies
/// tenants meet refuse a canary user who may create rules and agents and do
/// nothing else.
async fn install_policies() {
    POLICIES
        .get_or_init(|| async {
            let dir = common::repo().join("deploy/admission").display().to_string();
            let (ok, _, err) = common::kubectl(&["apply", "-k", &dir]);
            assert!(ok, "kubectl apply -k deploy/admission: {err}");
            let canary = "ko-tenancy-canary";
            let grants = Manifest::apply(&[
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": canary},
                    "rules": [
                        {"apiGroups": ["flant.com"], "resources": ["copyrators"], "verbs": ["create"]},
                        {"apiGroups": ["blackadder.io"], "resources": ["chaosagents"], "verbs": ["create"]},
                    ],
                }),
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": canary},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": canary},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": canary}],
                }),
            ]);
            let rule = spec_rule("canary", "secret", Some(&["kube-system"]));
            // An agent without modes, labelled for a shard: the shard guard's.
            let mut sharded = agent("ko-tenancy-canary", None, [false; 3]);
            sharded["metadata"]["labels"][SHARD_LABEL] = json!("canary");
            let agent = agent("ko-tenancy-canary", None, [true, false, false]);
            for (object, namespace, policy) in [
                (rule, "default", RULE_POLICY),
                (agent, "default", AGENT_POLICY),
                (sharded, "default", SHARD_POLICY),
            ] {
                let text = object.to_string();
                common::wait_until(TIMEOUT, format!("the policy {policy} to refuse the canary's object"), || async {
                    let (ok, _, err) = common::kubectl_stdin(
                        &["--as", canary, "-n", namespace, "create", "--dry-run=server", "-f", "-"],
                        &text,
                    );
                    !ok && err.contains(&format!("ValidatingAdmissionPolicy '{policy}'"))
                })
                .await;
            }
            drop(grants);
        })
        .await;
}

/// `kubectl apply` of `objects`; returns the manifest file.
fn apply(objects: &[Value]) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(file.path(), serde_json::to_vec(&list).unwrap()).unwrap();
    let (ok, _, err) = common::kubectl(&["apply", "-f", &file.path().display().to_string()]);
    assert!(ok, "applying the test's grants: {err}");
    file
}

/// Objects applied from a manifest, deleted when dropped.
struct Manifest(tempfile::NamedTempFile);

impl Manifest {
    fn apply(objects: &[Value]) -> Self {
        Self(apply(objects))
    }
}

impl Drop for Manifest {
    fn drop(&mut self) {
        let file = self.0.path().display().to_string();
        let _ = common::kubectl(&["delete", "-f", &file, "--ignore-not-found", "--wait=false"]);
    }
}

/// An RBAC rule.
fn allow(group: &str, resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": [group], "resources": resources, "verbs": verbs})
}

/// A ServiceAccount `name` in its home namespace, and what it may do.
struct Tenant {
    home: String,
    name: String,
    token: common::TokenKubeconfig,
    client: Client,
    _cluster_grants: Option<Manifest>,
}

/// What a tenant is granted.
#[derive(Default)]
struct Grants<'a> {
    /// Namespaces where the built-in `edit` ClusterRole is bound.
    edit: &'a [&'a str],
    /// A Role of its own in its home namespace.
    home_rules: Vec<Value>,
    /// Whether that Role also grants CopyratorRules (create, get, list,
    /// update, patch, delete; status patch).
    copyrators: bool,
    /// Verbs on chaosagents, granted cluster-wide (they are cluster-scoped).
    chaos_agents: &'a [&'a str],
    /// Shards it may `use` (the shard guard), cluster-wide; `["*"]`: all.
    shards: &'a [&'a str],
}

impl Tenant {
    /// Creates the ServiceAccount and its grants, mints its token and waits
    /// until the authorizer knows the grants (`ready`: `kubectl auth can-i`
    /// arguments that must be "yes").
    async fn new(
        client: &Client,
        home: &str,
        name: &str,
        grants: Grants<'_>,
        ready: &[&[&str]],
    ) -> Self {
        let subject = json!([{"kind": "ServiceAccount", "name": name, "namespace": home}]);
        let binding = |namespace: &str, kind: &str, role: &str| {
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": format!("{name}-{role}"), "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                "subjects": subject,
            })
        };
        let mut objects = vec![json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": home},
        })];
        for namespace in grants.edit {
            objects.push(binding(namespace, "ClusterRole", "edit"));
        }
        let mut home_rules = grants.home_rules;
        if grants.copyrators {
            home_rules.push(allow(
                "flant.com",
                &["copyrators"],
                &["create", "get", "list", "update", "patch", "delete"],
            ));
            home_rules.push(allow("flant.com", &["copyrators/status"], &["patch"]));
        }
        if !home_rules.is_empty() {
            let own = format!("{name}-own");
            objects.push(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": own, "namespace": home},
                "rules": home_rules,
            }));
            objects.push(binding(home, "Role", &own));
        }
        // Namespaced grants go with their namespaces; cluster-wide ones are
        // deleted with the tenant.
        apply(&objects);
        let mut cluster_rules = Vec::new();
        if !grants.chaos_agents.is_empty() {
            cluster_rules.push(allow(
                "blackadder.io",
                &["chaosagents"],
                grants.chaos_agents,
            ));
        }
        match grants.shards {
            [] => {}
            ["*"] => cluster_rules.push(allow("kustomize-operator.io", &["shards"], &["use"])),
            names => cluster_rules.push(json!({
                "apiGroups": ["kustomize-operator.io"], "resources": ["shards"],
                "resourceNames": names, "verbs": ["use"],
            })),
        }
        let cluster_grants = (!cluster_rules.is_empty()).then(|| {
            let role = format!("ko-tenancy-{home}-{name}-agents");
            Manifest::apply(&[
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": role},
                    "rules": cluster_rules,
                }),
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": role},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": subject,
                }),
            ])
        });
        let token = common::TokenKubeconfig::mint(client, home, name).await;
        for args in ready {
            common::wait_until(
                TIMEOUT,
                format!("{name}'s token allowed: {args:?}"),
                || async { token.can_i(args) },
            )
            .await;
        }
        let client = token.client().await;
        Self {
            home: home.to_string(),
            name: name.to_string(),
            token,
            client,
            _cluster_grants: cluster_grants,
        }
    }

    /// The user name the API server knows the tenant by.
    fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.home, self.name)
    }

    /// Its CopyratorRules (in its home namespace), through its own token.
    fn rules(&self) -> Api<CopyratorRule> {
        Api::namespaced(self.client.clone(), &self.home)
    }

    /// ChaosAgents, through its own token.
    fn agents(&self) -> Api<ChaosAgent> {
        Api::all(self.client.clone())
    }

    /// Whether it may `use` the shard `name` in `namespace` (`None`:
    /// cluster-wide), as the shard guard asks. Not `kubectl auth can-i`:
    /// for a resource the API does not serve, kubectl asks about group ""
    /// and resource `shards.kustomize-operator.io` instead.
    async fn may_use_shard(&self, name: &str, namespace: Option<&str>) -> bool {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some("kustomize-operator.io".into()),
                    resource: Some("shards".into()),
                    name: Some(name.into()),
                    namespace: namespace.map(str::to_string),
                    verb: Some("use".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<SelfSubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .expect("a SelfSubjectAccessReview")
            .status
            .is_some_and(|s| s.allowed)
    }

    /// Waits until the authorizer lets it use the shard `name` there.
    async fn wait_shard(&self, name: &str, namespace: Option<&str>) {
        common::wait_until(
            TIMEOUT,
            format!("{} allowed to use shard {name} in {namespace:?}", self.name),
            || async { self.may_use_shard(name, namespace).await },
        )
        .await;
    }
}

/// A rule in the canonical form, copying what is labelled `copy=yes`;
/// `namespaces: None` leaves the field out (every namespace).
fn spec_rule(name: &str, rule_type: &str, namespaces: Option<&[&str]>) -> Value {
    let mut spec = json!({"ruleType": rule_type, "selector": {"copy": "yes"}});
    if let Some(namespaces) = namespaces {
        spec["namespaces"] = json!(namespaces);
    }
    json!({
        "apiVersion": "flant.com/v1",
        "kind": "CopyratorRule",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// A rule in the Copyrator article's form: the fields at the top level.
fn article_rule(name: &str, source: &str, rule_type: &str, namespaces: &[&str]) -> Value {
    json!({
        "apiVersion": "flant.com/v1",
        "kind": "CopyratorRule",
        "metadata": {"name": name},
        "ruleType": rule_type,
        "selector": {"copy": "yes"},
        "namespaces": namespaces,
        "namespace": source,
    })
}

/// A dry-run ChaosAgent (`[tantrum, cancer, ipsum]`), labelled for `scope` if given.
fn agent(name: &str, scope: Option<&str>, modes: [bool; 3]) -> Value {
    let labels = scope.map_or(json!({}), |ns| json!({SCOPE_LABEL: ns}));
    json!({
        "apiVersion": "blackadder.io/v1beta1",
        "kind": "ChaosAgent",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "tantrumMode": modes[0],
            "cancerMode": modes[1],
            "ipsumMode": modes[2],
            "eagerness": 1,
            "pauseDuration": 3600,
            "dryRun": true,
        },
    })
}

fn typed<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

/// Asserts that the API server refused a request in admission: 403
/// Forbidden from `policy`, saying `user ... may not <missing>`.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(
    result: kube::Result<T>,
    policy: &str,
    user: &str,
    missing: &str,
) {
    let status = match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("the API server should refuse it ({missing}); got {other:?}"),
    };
    assert_eq!(
        (status.code, status.reason.as_str()),
        (403, "Forbidden"),
        "{status:?}"
    );
    assert!(
        status
            .message
            .contains(&format!("ValidatingAdmissionPolicy '{policy}'")),
        "refused, but not by {policy}: {}",
        status.message
    );
    let expected = format!("user {user} may not {missing}");
    assert!(
        status.message.contains(&expected),
        "the message should say {expected:?}: {}",
        status.message
    );
}

/// Creates a rule through `rules`; the test fails unless it is admitted.
async fn admitted(rules: &Api<CopyratorRule>, rule: Value) -> CopyratorRule {
    rules
        .create(&PostParams::default(), &typed(rule))
        .await
        .expect("the API server admits the rule")
}

/// The rule `name` as the admin sees it, if it exists.
async fn stored_rule(client: &Client, namespace: &str, name: &str) -> Option<CopyratorRule> {
    Api::<CopyratorRule>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap()
}

/// The listed namespaces of a stored rule, wherever they are written.
fn listed(rule: &CopyratorRule) -> Vec<String> {
    rule.listed_namespaces().to_vec()
}

/// The reproduction from the report: a tenant labels a node-join credential
/// in its own namespace and asks for it in kube-system. Refused, as are
/// rules into another tenant's namespace, into every namespace, and into
/// more namespaces than the policy checks one by one.
#[tokio::test]
async fn a_tenant_may_not_copy_where_it_may_not_write() {
    let client = common::cluster().await;
    install_policies().await;
    let home = common::TestNamespace::new(&client, "tn-alice").await;
    let other = common::TestNamespace::new(&client, "tn-bob").await;
    let alice = Tenant::new(
        &client,
        &home.name,
        "alice",
        Grants {
            edit: &[&home.name],
            copyrators: true,
            ..Grants::default()
        },
        &[
            &["create", "secrets", "-n", &home.name],
            &["create", "copyrators.flant.com", "-n", &home.name],
        ],
    )
    .await;
    assert!(
        !alice
            .token
            .can_i(&["create", "secrets", "-n", "kube-system"])
    );
    assert!(
        !alice
            .token
            .can_i(&["create", "configmaps", "-n", &other.name])
    );

    let token_id = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let bootstrap = format!("bootstrap-token-{token_id}");
    let credential: Secret = typed(json!({
        "metadata": {"name": bootstrap, "labels": {"copy": "yes"}},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": token_id,
            "token-secret": "0123456789abcdef",
            "usage-bootstrap-authentication": "true",
        },
    }));
    Api::<Secret>::namespaced(alice.client.clone(), &home.name)
        .create(&PostParams::default(), &credential)
        .await
        .expect("alice may create Secrets at home");

    let into = ", which this CopyratorRule copies into";
    let eleven = vec![home.name.as_str(); ONE_BY_ONE + 1];
    let thousand: Vec<String> = (0..1000).map(|i| format!("ko-nowhere-{i}")).collect();
    let thousand: Vec<&str> = thousand.iter().map(String::as_str).collect();
    let cases = [
        (
            spec_rule("evil", "secret", Some(&["kube-system"])),
            format!("create secrets in namespace kube-system{into}"),
        ),
        (
            article_rule("evil-article", &home.name, "secret", &["kube-system"]),
            format!("create secrets in namespace kube-system{into}"),
        ),
        (
            // Checked in list order: the writable first entry passes.
            spec_rule("neighbour", "configmap", Some(&[&home.name, &other.name])),
            format!("create configmaps in namespace {}{into}", other.name),
        ),
        (
            spec_rule("everywhere", "configmap", None),
            format!(
                "create configmaps in all namespaces (cluster-wide){into}: it lists no namespaces, so it copies into every namespace"
            ),
        ),
        (
            spec_rule("eleven", "configmap", Some(&eleven)),
            format!(
                "create configmaps in all namespaces (cluster-wide){into}: it lists {} namespaces, and a rule listing more than {ONE_BY_ONE} needs the right in all of them",
                ONE_BY_ONE + 1
            ),
        ),
        (
            spec_rule("thousand", "secret", Some(&thousand)),
            format!(
                "create secrets in all namespaces (cluster-wide){into}: it lists 1000 namespaces"
            ),
        ),
    ];
    for (rule, missing) in cases {
        let name = rule["metadata"]["name"].as_str().unwrap().to_string();
        let result = alice
            .rules()
            .create(&PostParams::default(), &typed(rule))
            .await;
        assert_refused(result, RULE_POLICY, &alice.user(), &missing);
        assert!(
            stored_rule(&client, &home.name, &name).await.is_none(),
            "{name} was refused but exists"
        );
    }
}

/// An admitted rule cannot be widened by an UPDATE, nor its selector
/// changed by someone who could not write its targets; updates that change
/// none of its fields (the operator's finalizer patch, labels) and status
/// patches are not checked.
#[tokio::test]
async fn an_update_is_checked_when_it_changes_the_rule() {
    let client = common::cluster().await;
    install_policies().await;
    let home = common::TestNamespace::new(&client, "tn-upd").await;
    let mine = common::TestNamespace::new(&client, "tn-upd-mine").await;
    let alice = Tenant::new(
        &client,
        &home.name,
        "alice",
        Grants {
            edit: &[&home.name, &mine.name],
            copyrators: true,
            ..Grants::default()
        },
        &[
            &["create", "configmaps", "-n", &mine.name],
            &["patch", "copyrators.flant.com", "-n", &home.name],
        ],
    )
    .await;
    let rules = alice.rules();
    admitted(
        &rules,
        spec_rule("narrow", "configmap", Some(&[&mine.name])),
    )
    .await;
    let widen = Patch::Merge(json!({"spec": {"namespaces": [mine.name, "kube-system"]}}));
    assert_refused(
        rules.patch("narrow", &PatchParams::default(), &widen).await,
        RULE_POLICY,
        &alice.user(),
        "create configmaps in namespace kube-system, which this CopyratorRule copies into",
    );
    let stored = stored_rule(&client, &home.name, "narrow").await.unwrap();
    assert_eq!(listed(&stored), vec![mine.name.clone()]);

    // The admin may copy into kube-system; alice may not change what that
    // rule copies, but may touch its metadata and status.
    let admin_rules = Api::<CopyratorRule>::namespaced(client.clone(), &home.name);
    admitted(
        &admin_rules,
        spec_rule("admins", "configmap", Some(&["kube-system"])),
    )
    .await;
    let reselect = Patch::Merge(json!({"spec": {"selector": {"copy": "everything"}}}));
    assert_refused(
        rules
            .patch("admins", &PatchParams::default(), &reselect)
            .await,
        RULE_POLICY,
        &alice.user(),
        "create configmaps in namespace kube-system, which this CopyratorRule copies into",
    );
    // The operator's own finalizer patch (a JSON patch with a test), as alice.
    let finalizer = Patch::Json::<()>(
        serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["flant.com/test-finalizer"]},
        ]))
        .unwrap(),
    );
    rules
        .patch("admins", &PatchParams::default(), &finalizer)
        .await
        .expect("a finalizer-only update is admitted");
    let label = Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}}));
    rules
        .patch("admins", &PatchParams::default(), &label)
        .await
        .expect("a label-only update is admitted");
    let status = Patch::Merge(json!({"status": {"message": "written by alice"}}));
    rules
        .patch_status("admins", &PatchParams::default(), &status)
        .await
        .expect("a status patch is admitted");
    let stored = stored_rule(&client, &home.name, "admins").await.unwrap();
    assert_eq!(
        stored.metadata.finalizers,
        Some(vec!["flant.com/test-finalizer".to_string()])
    );
    let drop_finalizer = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    rules
        .patch("admins", &PatchParams::default(), &drop_finalizer)
        .await
        .expect("removing the finalizer is admitted");
}

/// A Secret rule copies Secrets its author must be able to read: a tenant
/// without get/list on Secrets at home is refused (a ConfigMap rule, whose
/// sources it may read, is admitted).
#[tokio::test]
async fn a_secret_rule_needs_the_right_to_read_its_sources() {
    let client = common::cluster().await;
    install_policies().await;
    let home = common::TestNamespace::new(&client, "tn-carol").await;
    let carol = Tenant::new(
        &client,
        &home.name,
        "carol",
        Grants {
            home_rules: vec![
                allow(
                    "",
                    &["configmaps"],
                    &[
                        "get", "list", "watch", "create", "update", "patch", "delete",
                    ],
                ),
                allow("", &["secrets"], &["create", "update", "patch", "delete"]),
            ],
            copyrators: true,
            ..Grants::default()
        },
        &[
            &["create", "secrets", "-n", &home.name],
            &["create", "copyrators.flant.com", "-n", &home.name],
        ],
    )
    .await;
    assert!(!carol.token.can_i(&["get", "secrets", "-n", &home.name]));
    let rules = carol.rules();
    assert_refused(
        rules
            .create(
                &PostParams::default(),
                &typed(spec_rule("peek", "secret", Some(&[&home.name]))),
            )
            .await,
        RULE_POLICY,
        &carol.user(),
        &format!(
            "get secrets in namespace {}, which this CopyratorRule copies from",
            home.name
        ),
    );
    assert!(stored_rule(&client, &home.name, "peek").await.is_none());
    admitted(&rules, spec_rule("share", "configmap", Some(&[&home.name]))).await;
}

/// A tenant copying into namespaces where it may write is admitted, in
/// both forms and up to the most namespaces checked one by one, and the
/// operator copies.
#[tokio::test]
async fn a_tenant_may_copy_where_it_may_write() {
    let client = common::cluster().await;
    install_policies().await;
    let home = common::TestNamespace::new(&client, "tn-ok").await;
    let mine = common::TestNamespace::new(&client, "tn-ok-mine").await;
    let _cleanup = common::StripFinalizersOnDrop(home.name.clone());
    let alice = Tenant::new(
        &client,
        &home.name,
        "alice",
        Grants {
            edit: &[&home.name, &mine.name],
            copyrators: true,
            ..Grants::default()
        },
        &[
            &["create", "secrets", "-n", &mine.name],
            &["create", "copyrators.flant.com", "-n", &home.name],
        ],
    )
    .await;
    let source: ConfigMap = typed(json!({
        "metadata": {"name": "greeting", "labels": {"copy": "yes"}},
        "data": {"hello": "world"},
    }));
    Api::<ConfigMap>::namespaced(alice.client.clone(), &home.name)
        .create(&PostParams::default(), &source)
        .await
        .unwrap();
    let rules = alice.rules();
    let operator = common::start_operator(&home.name, &["--kinds", "copyrator"]).await;
    admitted(&rules, spec_rule("share", "configmap", Some(&[&mine.name]))).await;
    admitted(
        &rules,
        article_rule("share-secrets", &home.name, "secret", &[&mine.name]),
    )
    .await;
    let most = vec![mine.name.as_str(); ONE_BY_ONE];
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    rules
        .create(
            &dry_run,
            &typed(spec_rule("most", "configmap", Some(&most))),
        )
        .await
        .expect("a rule listing as many namespaces as are checked one by one is admitted");

    let copies = Api::<ConfigMap>::namespaced(client.clone(), &mine.name);
    common::wait_until(
        TIMEOUT,
        format!("the copy greeting in {}", mine.name),
        || async {
            copies
                .get_opt("greeting")
                .await
                .unwrap()
                .is_some_and(|c| c.data == source.data)
        },
    )
    .await;
    common::wait_until(TIMEOUT, "the rule share Ready", || async {
        stored_rule(&client, &home.name, "share")
            .await
            .and_then(|r| r.status)
            .is_some_and(|s| s.common.is_ready())
    })
    .await;
    operator.stop().await;
}

/// The admin (system:masters) may copy into every namespace, and into a
/// list of 1000 (the CRD's maxItems), and update such a rule: the policy
/// costs two authorization checks for it, whatever its length.
#[tokio::test]
async fn an_admin_may_copy_into_every_namespace() {
    let client = common::cluster().await;
    install_policies().await;
    let home = common::TestNamespace::new(&client, "tn-admin").await;
    let rules = Api::<CopyratorRule>::namespaced(client.clone(), &home.name);
    // No operator watches this namespace, and nothing is labelled to match.
    admitted(&rules, spec_rule("everywhere", "secret", None)).await;
    let thousand: Vec<String> = (0..1000).map(|i| format!("ko-nowhere-{i}")).collect();
    let thousand: Vec<&str> = thousand.iter().map(String::as_str).collect();
    admitted(&rules, spec_rule("thousand", "secret", Some(&thousand))).await;
    // Updates compare the old and new lists (matchConditions): within budget too.
    let label = Patch::Merge(json!({"metadata": {"labels": {"team": "platform"}}}));
    rules
        .patch("thousand", &PatchParams::default(), &label)
        .await
        .expect("a label-only update of a 1000-namespace rule is admitted");
    let fewer = Patch::Merge(json!({"spec": {"namespaces": thousand[1..]}}));
    rules
        .patch("thousand", &PatchParams::default(), &fewer)
        .await
        .expect("an update of a 1000-namespace rule by the admin is admitted");
    let stored = stored_rule(&client, &home.name, "thousand").await.unwrap();
    assert_eq!(listed(&stored).len(), 999);
}

/// Deletes these ChaosAgents (cluster-scoped) when dropped.
struct AgentGuard(Vec<String>);

impl Drop for AgentGuard {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = common::kubectl(&[
                "delete",
                "chaosagent",
                name,
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
    }
}

/// A ChaosAgent's author must hold the rights its enabled modes use, where
/// it acts: its labelled namespace, or every namespace.
#[tokio::test]
async fn a_chaos_agent_needs_the_rights_of_its_modes_where_it_acts() {
    let client = common::cluster().await;
    install_policies().await;
    let dave_home = common::TestNamespace::new(&client, "tn-dave").await;
    let alice_home = common::TestNamespace::new(&client, "tn-agents").await;
    let other = common::TestNamespace::new(&client, "tn-agents-other").await;
    let (d, a, o) = (&dave_home.name, &alice_home.name, &other.name);
    let name = |who: &str, what: &str| format!("{who}-{what}");
    let _agents = AgentGuard(
        ["all", "cluster", "ipsum", "cancer", "idle"]
            .iter()
            .map(|w| name(d, w))
            .chain(["home", "other", "cluster"].iter().map(|w| name(a, w)))
            .collect(),
    );
    // dave may create agents and nothing else.
    let dave = Tenant::new(
        &client,
        d,
        "dave",
        Grants {
            chaos_agents: &["create"],
            ..Grants::default()
        },
        &[&["create", "chaosagents.blackadder.io"]],
    )
    .await;
    assert!(!dave.token.can_i(&["delete", "pods", "-n", d]));
    let all = [true, true, true];
    let where_d = format!("in namespace {d}, where this ChaosAgent's");
    let everywhere = "in all namespaces (cluster-wide), where this ChaosAgent's tantrumMode kills pods: it has no blackadder.io/namespace label, so it acts in every namespace";
    let cases = [
        (
            agent(&name(d, "all"), Some(d), all),
            format!("delete pods {where_d} tantrumMode kills pods"),
        ),
        (
            agent(&name(d, "cluster"), None, all),
            format!("delete pods {everywhere}"),
        ),
        (
            agent(&name(d, "ipsum"), Some(d), [false, false, true]),
            format!("patch configmaps {where_d} ipsumMode rewrites configmaps"),
        ),
        (
            agent(&name(d, "cancer"), Some(d), [false, true, false]),
            format!("patch deployments {where_d} cancerMode scales deployments"),
        ),
    ];
    let admin_agents = Api::<ChaosAgent>::all(client.clone());
    for (object, missing) in cases {
        let agent_name = object["metadata"]["name"].as_str().unwrap().to_string();
        let result = dave
            .agents()
            .create(&PostParams::default(), &typed(object))
            .await;
        assert_refused(result, AGENT_POLICY, &dave.user(), &missing);
        assert!(admin_agents.get_opt(&agent_name).await.unwrap().is_none());
    }
    // An agent with no mode enabled acts on nothing: it needs no rights.
    dave.agents()
        .create(
            &PostParams::default(),
            &typed(agent(&name(d, "idle"), Some(d), [false; 3])),
        )
        .await
        .expect("an agent without modes is admitted");

    // alice may edit her namespace and create and update agents.
    let alice = Tenant::new(
        &client,
        a,
        "alice",
        Grants {
            edit: &[a],
            chaos_agents: &["create", "get", "update", "patch"],
            ..Grants::default()
        },
        &[
            &["delete", "pods", "-n", a],
            &["patch", "chaosagents.blackadder.io"],
        ],
    )
    .await;
    let agents = alice.agents();
    let home = name(a, "home");
    agents
        .create(&PostParams::default(), &typed(agent(&home, Some(a), all)))
        .await
        .expect("an agent confined to alice's namespace is admitted");
    assert_refused(
        agents
            .create(
                &PostParams::default(),
                &typed(agent(&name(a, "other"), Some(o), all)),
            )
            .await,
        AGENT_POLICY,
        &alice.user(),
        &format!("delete pods in namespace {o}, where this ChaosAgent's tantrumMode kills pods"),
    );
    assert_refused(
        agents
            .create(
                &PostParams::default(),
                &typed(agent(&name(a, "cluster"), None, all)),
            )
            .await,
        AGENT_POLICY,
        &alice.user(),
        &format!("delete pods {everywhere}"),
    );
    // Widening the admitted agent by its label is refused.
    let unlabel = Patch::Merge(json!({"metadata": {"labels": {SCOPE_LABEL: null}}}));
    assert_refused(
        agents.patch(&home, &PatchParams::default(), &unlabel).await,
        AGENT_POLICY,
        &alice.user(),
        &format!("delete pods {everywhere}"),
    );
    let relabel = Patch::Merge(json!({"metadata": {"labels": {SCOPE_LABEL: o}}}));
    assert_refused(
        agents.patch(&home, &PatchParams::default(), &relabel).await,
        AGENT_POLICY,
        &alice.user(),
        &format!("delete pods in namespace {o}"),
    );
    let stored = admin_agents.get(&home).await.unwrap();
    assert_eq!(
        stored.metadata.labels.unwrap_or_default().get(SCOPE_LABEL),
        Some(a)
    );
    // Other labels are not checked.
    let label = Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}}));
    agents
        .patch(&home, &PatchParams::default(), &label)
        .await
        .expect("a label-only update is admitted");
}

// ------------------------------------------------ the operator's own rails
//
// A cluster may lack the policies (older than 1.30, an install without
// them): the operator must still refuse. These rules are created by the
// admin, whom the policies admit, so only the operator's rails stand in the
// way.

async fn rule_status(
    client: &Client,
    ns: &str,
    name: &str,
) -> Option<kustomize_operator::kinds::copyrator::CopyratorRuleStatus> {
    stored_rule(client, ns, name).await.and_then(|r| r.status)
}

/// The brief's reproduction, without the admission policy in the way: a
/// bootstrap token labelled for copying and a rule naming kube-system.
#[tokio::test]
async fn without_the_policy_the_operator_copies_no_token_and_nothing_into_kube_system() {
    let client = common::cluster().await;
    let home = common::TestNamespace::new(&client, "tn-rails").await;
    let other = common::TestNamespace::new(&client, "tn-rails-t").await;
    let _cleanup = common::StripFinalizersOnDrop(home.name.clone());
    let token_name = format!("bootstrap-token-{}", &home.name[home.name.len() - 6..]);
    let secrets = Api::<Secret>::namespaced(client.clone(), &home.name);
    let secret = |name: &str, type_: &str| -> Secret {
        typed(json!({
            "metadata": {"name": name, "labels": {"copy": "yes"}},
            "type": type_,
            "stringData": {"token-id": "abcdef", "token-secret": "0123456789abcdef"},
        }))
    };
    for s in [
        secret(&token_name, "bootstrap.kubernetes.io/token"),
        secret("harmless", "Opaque"),
    ] {
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let operator = common::start_operator(&home.name, &["--kinds", "copyrator"]).await;
    let rules = Api::<CopyratorRule>::namespaced(client.clone(), &home.name);
    admitted(
        &rules,
        spec_rule("evil", "secret", Some(&["kube-system", &other.name])),
    )
    .await;
    common::wait_until(TIMEOUT, "the rule evil Ready", || async {
        rule_status(&client, &home.name, "evil")
            .await
            .is_some_and(|s| s.common.is_ready())
    })
    .await;
    let status = rule_status(&client, &home.name, "evil").await.unwrap();
    let kube_system = status
        .copies
        .targets
        .iter()
        .find(|t| t.namespace == "kube-system")
        .expect("kube-system is reported");
    assert_eq!(kube_system.result, "Excluded", "{kube_system:?}");
    assert!(
        kube_system
            .message
            .as_deref()
            .is_some_and(|m| m.contains("--copyrator-allow-system-namespaces")),
        "{kube_system:?}"
    );
    assert!(
        status
            .copies
            .not_copyable
            .iter()
            .any(|n| n.starts_with(&token_name) && n.contains("bootstrap.kubernetes.io/token")),
        "{:?}",
        status.copies.not_copyable
    );
    // The positive side of the same rule: the harmless Secret was copied.
    let theirs = Api::<Secret>::namespaced(client.clone(), &other.name);
    assert!(theirs.get_opt("harmless").await.unwrap().is_some());
    assert!(theirs.get_opt(&token_name).await.unwrap().is_none());
    let system = Api::<Secret>::namespaced(client.clone(), "kube-system");
    assert!(system.get_opt(&token_name).await.unwrap().is_none());
    assert!(system.get_opt("harmless").await.unwrap().is_none());
    rules.delete("evil", &Default::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the rule evil gone", || async {
        stored_rule(&client, &home.name, "evil").await.is_none()
    })
    .await;
    operator.stop().await;
}

/// An object created by someone else between the operator's look and its
/// apply is not taken over: new copies are applied without forcing, so the
/// other manager's fields make the apply fail, and the object keeps its
/// data and carries no marker.
#[tokio::test]
async fn an_object_created_in_the_middle_of_an_apply_is_not_taken_over() {
    let client = common::cluster().await;
    let home = common::TestNamespace::new(&client, "tn-race").await;
    let target = common::TestNamespace::new(&client, "tn-race-t").await;
    let _cleanup = common::StripFinalizersOnDrop(home.name.clone());
    let source: ConfigMap = typed(json!({
        "metadata": {"name": "shared", "labels": {"copy": "yes"}},
        "data": {"k": "from the source"},
    }));
    Api::<ConfigMap>::namespaced(client.clone(), &home.name)
        .create(&PostParams::default(), &source)
        .await
        .unwrap();
    // kubectl that, right before the first apply, creates the copy's name
    // with other data, as someone racing the operator would.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("kubectl");
    let done = dir.path().join("raced");
    let real = common::kubectl_path().display().to_string();
    common::write_script(
        &wrapper,
        &format!(
            r#"case "$*" in *' apply '*)
  if [ ! -e {done} ]; then touch {done}; {real} -n {ns} create configmap shared --from-literal=k=mine >/dev/null; fi;;
esac
exec {real} "$@""#,
            done = done.display(),
            ns = target.name,
        ),
    );
    let operator = common::start_operator(
        &home.name,
        &[
            "--kinds",
            "copyrator",
            "--kubectl",
            &wrapper.display().to_string(),
        ],
    )
    .await;
    let rules = Api::<CopyratorRule>::namespaced(client.clone(), &home.name);
    admitted(&rules, spec_rule("r", "configmap", Some(&[&target.name]))).await;
    // First the apply fails on the other manager's field; then the rule sees
    // a same-named object it did not create and leaves it alone.
    common::wait_until(
        TIMEOUT,
        "the rule r reporting a Conflict over shared",
        || async {
            rule_status(&client, &home.name, "r")
                .await
                .is_some_and(|s| {
                    s.copies
                        .targets
                        .iter()
                        .any(|t| t.result == "Conflict" && t.foreign == ["shared"])
                })
        },
    )
    .await;
    let theirs = Api::<ConfigMap>::namespaced(client.clone(), &target.name)
        .get("shared")
        .await
        .unwrap();
    assert_eq!(theirs.data.unwrap()["k"], "mine");
    let labels = theirs.metadata.labels.unwrap_or_default();
    assert!(
        !labels
            .keys()
            .any(|k| k.starts_with("kustomize-operator.io/")
                || k.starts_with("copyrator.flant.com/")),
        "marked: {labels:?}"
    );
    assert!(done.exists(), "the race was run");
    rules.delete("r", &Default::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the rule r gone", || async {
        stored_rule(&client, &home.name, "r").await.is_none()
    })
    .await;
    // Deleting the rule leaves the object alone too.
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), &target.name)
            .get_opt("shared")
            .await
            .unwrap()
            .is_some()
    );
    operator.stop().await;
}

/// One rule cannot take the operator's memory: past `--copyrator-max-bytes`
/// it is TooLarge, copies nothing, and waits for a change.
#[tokio::test]
async fn a_rule_wanting_more_than_the_byte_cap_is_too_large() {
    let client = common::cluster().await;
    let home = common::TestNamespace::new(&client, "tn-big").await;
    let target = common::TestNamespace::new(&client, "tn-big-t").await;
    let _cleanup = common::StripFinalizersOnDrop(home.name.clone());
    let source: ConfigMap = typed(json!({
        "metadata": {"name": "big", "labels": {"copy": "yes"}},
        "data": {"k": "x".repeat(4096)},
    }));
    Api::<ConfigMap>::namespaced(client.clone(), &home.name)
        .create(&PostParams::default(), &source)
        .await
        .unwrap();
    let operator = common::start_operator(
        &home.name,
        &["--kinds", "copyrator", "--copyrator-max-bytes", "1024"],
    )
    .await;
    let rules = Api::<CopyratorRule>::namespaced(client.clone(), &home.name);
    admitted(&rules, spec_rule("r", "configmap", Some(&[&target.name]))).await;
    common::wait_until(TIMEOUT, "the rule r TooLarge", || async {
        rule_status(&client, &home.name, "r")
            .await
            .is_some_and(|s| {
                s.common.ready_reason() == Some(kustomize_operator::kind::Reason::TooLarge)
            })
    })
    .await;
    let status = rule_status(&client, &home.name, "r").await.unwrap();
    let message = &status
        .common
        .condition(kustomize_operator::kind::ConditionType::Ready)
        .unwrap()
        .message;
    assert!(message.contains("--copyrator-max-bytes"), "{message}");
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), &target.name)
            .get_opt("big")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(operator.kubectl_stats().spawned(), 0, "nothing was applied");
    operator.stop().await;
}

/// The article's behaviour stays: a rule over every namespace (here: every
/// namespace the operator's selector lets it copy into) copies into a
/// namespace created later.
#[tokio::test]
async fn an_admin_rule_over_every_namespace_reaches_a_namespace_created_later() {
    let client = common::cluster().await;
    let home = common::TestNamespace::new(&client, "tn-all").await;
    let _cleanup = common::StripFinalizersOnDrop(home.name.clone());
    let run = format!("tn-all-{}", &home.name[home.name.len() - 6..]);
    let selector = format!("ko-tenancy-run={run}");
    let source: ConfigMap = typed(json!({
        "metadata": {"name": "everywhere", "labels": {"copy": "yes"}},
        "data": {"k": "v"},
    }));
    Api::<ConfigMap>::namespaced(client.clone(), &home.name)
        .create(&PostParams::default(), &source)
        .await
        .unwrap();
    let operator = common::start_operator(
        &home.name,
        &[
            "--kinds",
            "copyrator",
            "--copyrator-namespace-selector",
            &selector,
        ],
    )
    .await;
    let rules = Api::<CopyratorRule>::namespaced(client.clone(), &home.name);
    admitted(&rules, spec_rule("all", "configmap", None)).await;
    common::wait_until(TIMEOUT, "the rule all Ready", || async {
        rule_status(&client, &home.name, "all")
            .await
            .is_some_and(|s| s.common.is_ready())
    })
    .await;
    let later = common::TestNamespace::new(&client, "tn-all-later").await;
    let (ok, _, err) = common::kubectl(&[
        "label",
        "namespace",
        &later.name,
        &format!("ko-tenancy-run={run}"),
    ]);
    assert!(ok, "{err}");
    common::wait_until(
        TIMEOUT,
        format!("the copy everywhere in {}", later.name),
        || async {
            Api::<ConfigMap>::namespaced(client.clone(), &later.name)
                .get_opt("everywhere")
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
    rules.delete("all", &Default::default()).await.unwrap();
    common::wait_until(
        TIMEOUT,
        format!("the copy everywhere gone from {}", later.name),
        || async {
            Api::<ConfigMap>::namespaced(client.clone(), &later.name)
                .get_opt("everywhere")
                .await
                .unwrap()
                .is_none()
        },
    )
    .await;
    operator.stop().await;
}

/// F4 of #39: many rules over the cap at once. Each is TooLarge, having
/// measured its sources page by page under one shared read budget (here the
/// least there is: one page), none waits for ever, and a rule within the
/// cap beside them still copies.
#[tokio::test]
async fn rules_over_the_cap_at_once_share_the_read_budget() {
    let client = common::cluster().await;
    let home = common::TestNamespace::new(&client, "tn-flood").await;
    let target = common::TestNamespace::new(&client, "tn-flood-t").await;
    let _cleanup = common::StripFinalizersOnDrop(home.name.clone());
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &home.name);
    for i in 0..4 {
        let big: ConfigMap = typed(json!({
            "metadata": {"name": format!("big-{i}"), "labels": {"copy": "yes"}},
            "data": {"k": "x".repeat(4096)},
        }));
        cms.create(&PostParams::default(), &big).await.unwrap();
    }
    let small: ConfigMap = typed(json!({
        "metadata": {"name": "small", "labels": {"small": "yes"}},
        "data": {"k": "v"},
    }));
    cms.create(&PostParams::default(), &small).await.unwrap();
    let budget = kustomize_operator::kinds::copyrator::budget::MIN_READ_BUDGET.to_string();
    let operator = common::start_operator(
        &home.name,
        &[
            "--kinds",
            "copyrator",
            "--copyrator-max-bytes",
            "8192",
            "--copyrator-read-budget",
            &budget,
        ],
    )
    .await;
    let rules = Api::<CopyratorRule>::namespaced(client.clone(), &home.name);
    let big: Vec<String> = (0..8).map(|i| format!("big-{i}")).collect();
    for name in &big {
        admitted(&rules, spec_rule(name, "configmap", Some(&[&target.name]))).await;
    }
    let mut within = spec_rule("small", "configmap", Some(&[&target.name]));
    within["spec"]["selector"] = json!({"small": "yes"});
    admitted(&rules, within).await;

    let too_large = |name: &str| {
        let (client, ns, name) = (client.clone(), home.name.clone(), name.to_string());
        async move {
            rule_status(&client, &ns, &name).await.is_some_and(|s| {
                s.common.ready_reason() == Some(kustomize_operator::kind::Reason::TooLarge)
            })
        }
    };
    common::wait_until(TIMEOUT, "every big-N rule TooLarge", || async {
        for name in &big {
            if !too_large(name).await {
                return false;
            }
        }
        true
    })
    .await;
    let status = rule_status(&client, &home.name, "big-0").await.unwrap();
    let message = &status
        .common
        .condition(kustomize_operator::kind::ConditionType::Ready)
        .unwrap()
        .message;
    // 4,097 bytes each ("k" and its value): the second is over 8 KiB.
    assert!(
        message.contains("more than 8192 bytes (the first 2 hold 8194 bytes already)")
            && message.contains("--copyrator-max-bytes"),
        "{message}"
    );
    let copies = Api::<ConfigMap>::namespaced(client.clone(), &target.name);
    common::wait_until(
        TIMEOUT,
        format!("the copy small in {}", target.name),
        || async { copies.get_opt("small").await.unwrap().is_some() },
    )
    .await;
    for i in 0..4 {
        assert!(copies.get_opt(&format!("big-{i}")).await.unwrap().is_none());
    }
    operator.stop().await;
}

// ------------------------------------- deleting and resharding a ChaosAgent

/// The label that decides which operator shard serves a resource.
const SHARD_LABEL: &str = "kustomize-operator.io/shard";

/// The agent `name` as the admin sees it: its labels, and whether it is
/// being deleted; `None` once it is gone.
async fn stored_agent(agents: &Api<ChaosAgent>, name: &str) -> Option<(Value, bool)> {
    let agent = agents.get_opt(name).await.unwrap()?;
    let labels = json!(agent.metadata.labels.unwrap_or_default());
    Some((labels, agent.metadata.deletion_timestamp.is_some()))
}

/// Deleting a ChaosAgent, or changing its shard label (which operator
/// shard serves it), needs the rights of its enabled modes where it acts,
/// as creating it does: a tenant holding only the chaosagents grant may do
/// neither to another's agent, while one holding the rights may do both.
#[tokio::test]
async fn deleting_or_resharding_a_chaos_agent_needs_the_rights_of_its_modes() {
    let client = common::cluster().await;
    install_policies().await;
    let owner_home = common::TestNamespace::new(&client, "tn-agent-owner").await;
    let mallory_home = common::TestNamespace::new(&client, "tn-mallory").await;
    let (oh, mh) = (&owner_home.name, &mallory_home.name);
    let (home, wide) = (format!("{oh}-home"), format!("{oh}-wide"));
    let _agents = AgentGuard(vec![home.clone(), wide.clone()]);
    // The admin's agents: one acting in the owner's namespace, served by
    // shard "a"; one acting everywhere.
    let admin_agents = Api::<ChaosAgent>::all(client.clone());
    let mut labelled = agent(&home, Some(oh), [true, true, true]);
    labelled["metadata"]["labels"][SHARD_LABEL] = json!("a");
    for object in [labelled, agent(&wide, None, [true, false, false])] {
        admin_agents
            .create(&PostParams::default(), &typed(object))
            .await
            .expect("the admin's agent is admitted");
    }
    let grant = ["get", "list", "update", "patch", "delete"];
    // mallory may edit her own namespace, do anything to agents and use
    // every shard (so that the shard guard does not stand in the way: this
    // policy alone refuses her).
    let mallory = Tenant::new(
        &client,
        mh,
        "mallory",
        Grants {
            edit: &[mh],
            chaos_agents: &grant,
            shards: &["*"],
            ..Grants::default()
        },
        &[
            &["delete", "pods", "-n", mh],
            &["delete", "chaosagents.blackadder.io"],
        ],
    )
    .await;
    mallory.wait_shard("mallory", None).await;
    assert!(!mallory.token.can_i(&["delete", "pods", "-n", oh]));
    let kills_in_home =
        format!("delete pods in namespace {oh}, where this ChaosAgent's tantrumMode kills pods");
    let before = stored_agent(&admin_agents, &home).await.unwrap();
    assert_refused(
        mallory.agents().delete(&home, &Default::default()).await,
        AGENT_POLICY,
        &mallory.user(),
        &format!("{kills_in_home}; deleting it needs the rights it acts with"),
    );
    assert_refused(
        mallory.agents().delete(&wide, &Default::default()).await,
        AGENT_POLICY,
        &mallory.user(),
        "delete pods in all namespaces (cluster-wide), where this ChaosAgent's tantrumMode kills pods: it has no blackadder.io/namespace label, so it acts in every namespace; deleting it needs the rights it acts with",
    );
    for (shard, what) in [(json!("mallory"), "moving"), (Value::Null, "removing")] {
        let reshard = Patch::Merge(json!({"metadata": {"labels": {SHARD_LABEL: shard}}}));
        let result = mallory
            .agents()
            .patch(&home, &PatchParams::default(), &reshard)
            .await;
        assert!(result.is_err(), "{what} the shard label is refused");
        assert_refused(result, AGENT_POLICY, &mallory.user(), &kills_in_home);
    }
    assert_eq!(
        stored_agent(&admin_agents, &home).await,
        Some(before),
        "the agent is still there, unchanged"
    );
    assert!(
        stored_agent(&admin_agents, &wide)
            .await
            .is_some_and(|(_, deleting)| !deleting)
    );
    // A label the operator does not read is not checked.
    let team = Patch::Merge(json!({"metadata": {"labels": {"team": "m"}}}));
    mallory
        .agents()
        .patch(&home, &PatchParams::default(), &team)
        .await
        .expect("a label the operator does not read is admitted");

    // alice holds the same grant, the modes' rights in the owner's
    // namespace and the use of shards a and b: she may move the agent to
    // another shard, and delete it.
    let alice = Tenant::new(
        &client,
        oh,
        "alice",
        Grants {
            edit: &[oh],
            chaos_agents: &grant,
            shards: &["a", "b"],
            ..Grants::default()
        },
        &[
            &["delete", "pods", "-n", oh],
            &["patch", "deployments.apps", "-n", oh],
            &["delete", "chaosagents.blackadder.io"],
        ],
    )
    .await;
    alice.wait_shard("a", None).await;
    alice.wait_shard("b", None).await;
    let reshard = Patch::Merge(json!({"metadata": {"labels": {SHARD_LABEL: "b"}}}));
    alice
        .agents()
        .patch(&home, &PatchParams::default(), &reshard)
        .await
        .expect("one with the modes' rights may move the agent to another shard");
    let (labels, _) = stored_agent(&admin_agents, &home).await.unwrap();
    assert_eq!(labels[SHARD_LABEL], "b");
    assert_eq!(labels[SCOPE_LABEL], json!(oh));
    alice
        .agents()
        .delete(&home, &Default::default())
        .await
        .expect("one with the modes' rights may delete the agent");
    // Gone, or going (an operator serving agents may hold a finalizer).
    assert!(
        stored_agent(&admin_agents, &home)
            .await
            .is_none_or(|(_, deleting)| deleting),
        "the delete was carried out"
    );
}

/// The two-step attack: first disarm or take over a victim's agent by an
/// UPDATE that the agent as it would be allows (its modes switched off, or
/// its scope label moved to one's own namespace), then delete or re-shard
/// it freely. Every UPDATE needs the rights of the agent as it is too, so
/// both first steps are refused and the agent is left unchanged; one who
/// holds those rights may make the same changes.
#[tokio::test]
async fn updating_a_chaos_agent_needs_the_rights_of_the_agent_as_it_is() {
    let client = common::cluster().await;
    install_policies().await;
    let victim_home = common::TestNamespace::new(&client, "tn-victim").await;
    let mallory_home = common::TestNamespace::new(&client, "tn-mallory2").await;
    let (vh, mh) = (&victim_home.name, &mallory_home.name);
    let (home, wide) = (format!("{vh}-home"), format!("{vh}-wide"));
    let _agents = AgentGuard(vec![home.clone(), wide.clone()]);
    let admin_agents = Api::<ChaosAgent>::all(client.clone());
    for object in [
        agent(&home, Some(vh), [true, true, true]),
        agent(&wide, None, [false, false, true]),
    ] {
        admin_agents
            .create(&PostParams::default(), &typed(object))
            .await
            .expect("the admin's agent is admitted");
    }
    // mallory may do anything in her namespace and to agents.
    let grant = ["get", "list", "update", "patch", "delete"];
    let mallory = Tenant::new(
        &client,
        mh,
        "mallory",
        Grants {
            edit: &[mh],
            chaos_agents: &grant,
            ..Grants::default()
        },
        &[
            &["delete", "pods", "-n", mh],
            &["patch", "deployments.apps", "-n", mh],
            &["patch", "chaosagents.blackadder.io"],
        ],
    )
    .await;
    assert!(!mallory.token.can_i(&["delete", "pods", "-n", vh]));
    let now = "; changing it needs the rights it acts with now";
    let before_home = stored_agent(&admin_agents, &home).await.unwrap();
    let spec_of = async |name: &str| json!(admin_agents.get(name).await.unwrap().spec);
    let home_spec = spec_of(&home).await;
    let disarm = Patch::Merge(json!({"spec": {
        "tantrumMode": false, "cancerMode": false, "ipsumMode": false,
    }}));
    assert_refused(
        mallory
            .agents()
            .patch(&home, &PatchParams::default(), &disarm)
            .await,
        AGENT_POLICY,
        &mallory.user(),
        &format!(
            "delete pods in namespace {vh}, where this ChaosAgent's tantrumMode kills pods{now}"
        ),
    );
    let take_over = Patch::Merge(json!({"metadata": {"labels": {SCOPE_LABEL: mh}}}));
    assert_refused(
        mallory
            .agents()
            .patch(&home, &PatchParams::default(), &take_over)
            .await,
        AGENT_POLICY,
        &mallory.user(),
        &format!(
            "delete pods in namespace {vh}, where this ChaosAgent's tantrumMode kills pods{now}"
        ),
    );
    // The agent acting everywhere: narrowing it to her namespace (where she
    // holds ipsumMode's right) needs that right everywhere.
    assert_refused(
        mallory
            .agents()
            .patch(&wide, &PatchParams::default(), &take_over)
            .await,
        AGENT_POLICY,
        &mallory.user(),
        &format!(
            "patch configmaps in all namespaces (cluster-wide), where this ChaosAgent's ipsumMode rewrites configmaps: it has no blackadder.io/namespace label, so it acts in every namespace{now}"
        ),
    );
    assert_eq!(stored_agent(&admin_agents, &home).await, Some(before_home));
    assert_eq!(spec_of(&home).await, home_spec, "the modes are still on");
    let (wide_labels, _) = stored_agent(&admin_agents, &wide).await.unwrap();
    assert_eq!(wide_labels.get(SCOPE_LABEL), None, "still unlabelled");
    // So the second step is refused too.
    assert_refused(
        mallory.agents().delete(&home, &Default::default()).await,
        AGENT_POLICY,
        &mallory.user(),
        &format!(
            "delete pods in namespace {vh}, where this ChaosAgent's tantrumMode kills pods; deleting it needs the rights it acts with"
        ),
    );

    // victor holds the modes' rights in the victim's namespace and mallory's:
    // he may move the agent between them, and disarm it.
    let victor = Tenant::new(
        &client,
        vh,
        "victor",
        Grants {
            edit: &[vh, mh],
            chaos_agents: &grant,
            ..Grants::default()
        },
        &[
            &["delete", "pods", "-n", vh],
            &["delete", "pods", "-n", mh],
            &["patch", "chaosagents.blackadder.io"],
        ],
    )
    .await;
    victor
        .agents()
        .patch(&home, &PatchParams::default(), &take_over)
        .await
        .expect("one with the rights of the agent before and after may move it");
    victor
        .agents()
        .patch(&home, &PatchParams::default(), &disarm)
        .await
        .expect("one with the rights of the agent as it is may disarm it");
    let agent = admin_agents.get(&home).await.unwrap();
    assert_eq!(
        agent.metadata.labels.unwrap_or_default().get(SCOPE_LABEL),
        Some(mh)
    );
    assert_eq!(
        json!(agent.spec)["tantrumMode"],
        json!(false),
        "the agent is disarmed"
    );
}

// ------------------------------------------------------- the shard guard

/// A namespaced Api of `group/version` `kind` (`plural`) as dynamic objects.
fn dynamic(
    client: &Client,
    namespace: &str,
    (group, version, kind, plural): (&str, &str, &str, &str),
) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    Api::namespaced_with(
        client.clone(),
        namespace,
        &kube::api::ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

const SAMPLES: (&str, &str, &str, &str) = ("nuvolaris.org", "v1", "Sample", "samples");

/// An object of `kind` named `name`, labelled for `shard` if given.
fn labelled(
    kind: (&str, &str, &str, &str),
    name: &str,
    shard: Option<&str>,
    spec: Value,
) -> kube::api::DynamicObject {
    let (group, version, kind, _) = kind;
    let labels = shard.map_or(json!({}), |s| json!({SHARD_LABEL: s}));
    typed(json!({
        "apiVersion": format!("{group}/{version}"),
        "kind": kind,
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }))
}

/// The shard label of `name`, as the admin sees it (`None`: unlabelled;
/// the test fails when the object does not exist).
async fn shard_of(api: &Api<kube::api::DynamicObject>, name: &str) -> Option<String> {
    api.get(name)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .metadata
        .labels
        .unwrap_or_default()
        .remove(SHARD_LABEL)
}

/// A CRD made up for a test (a kind a KindDefinition could add while the
/// operator runs, of a group nothing knows in advance), deleted when dropped.
struct MadeUpKind {
    kind: (String, String, String, String),
}

impl MadeUpKind {
    async fn install() -> Self {
        let group = format!(
            "g{:06x}.ko-test.example.com",
            rand::random::<u32>() & 0xff_ffff
        );
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("gadgets.{group}")},
            "spec": {
                "group": group,
                "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget", "listKind": "GadgetList"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                }}}],
            },
        });
        let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &crd.to_string());
        assert!(ok, "creating the made-up CRD: {err}");
        common::wait_established(&[&format!("gadgets.{group}")])
            .unwrap_or_else(|e| panic!("gadgets.{group} not established: {e}"));
        Self {
            kind: (group, "v1".into(), "Gadget".into(), "gadgets".into()),
        }
    }

    fn kind(&self) -> (&str, &str, &str, &str) {
        let (g, v, k, p) = &self.kind;
        (g, v, k, p)
    }
}

impl Drop for MadeUpKind {
    fn drop(&mut self) {
        let name = format!("crd/gadgets.{}", self.kind.0);
        let _ = common::kubectl(&["delete", &name, "--wait=false"]);
    }
}

/// The shard label (which operator serves a resource, and so whose rights
/// its writes use) is an administrator's choice: a tenant who may create
/// and change her resources may neither set it, change it nor remove it,
/// on a Sample, on a kind no one knew in advance, nor on a cluster-scoped
/// ChaosAgent; the API server refuses with the shard guard's message and
/// nothing changes. Labels of built-in objects are not checked. Granted the
/// use of shard b in her namespace, she may move her resources there, but
/// not out of shard a, nor label a cluster-scoped object (only a
/// cluster-wide grant reaches those).
#[tokio::test]
async fn only_an_administrators_grant_lets_a_requester_choose_a_shard() {
    let client = common::cluster().await;
    install_policies().await;
    let home = common::TestNamespace::new(&client, "tn-shards").await;
    let h = &home.name;
    let gadgets = MadeUpKind::install().await;
    let agent_name = format!("{h}-sharded");
    let _agents = AgentGuard(vec![agent_name.clone()]);
    let own = ["create", "get", "list", "update", "patch", "delete"];
    let tess = Tenant::new(
        &client,
        h,
        "tess",
        Grants {
            edit: &[h],
            home_rules: vec![
                allow("nuvolaris.org", &["samples"], &own),
                allow(gadgets.kind().0, &["gadgets"], &own),
            ],
            chaos_agents: &["create"],
            ..Grants::default()
        },
        &[
            &["create", "samples.nuvolaris.org", "-n", h],
            &["create", &format!("gadgets.{}", gadgets.kind().0), "-n", h],
            &["create", "chaosagents.blackadder.io"],
        ],
    )
    .await;
    assert!(!tess.may_use_shard("b", Some(h)).await);
    let user = tess.user();
    let (admin, mine) = (
        dynamic(&client, h, SAMPLES),
        dynamic(&tess.client, h, SAMPLES),
    );
    let pp = PostParams::default();
    let to = |shard: Value| Patch::Merge(json!({"metadata": {"labels": {SHARD_LABEL: shard}}}));
    let why = "the label kustomize-operator.io/shard of";
    let use_b = format!("use shard \"b\" in namespace {h}: {why}");

    // A CREATE naming a shard.
    let spec = json!({"count": 0});
    assert_refused(
        mine.create(&pp, &labelled(SAMPLES, "s-b", Some("b"), spec.clone()))
            .await,
        SHARD_POLICY,
        &user,
        &format!("{use_b} Sample {h}/s-b chooses the operator that serves it"),
    );
    assert!(
        admin.get_opt("s-b").await.unwrap().is_none(),
        "nothing created"
    );
    // An UPDATE adding it.
    mine.create(&pp, &labelled(SAMPLES, "plain", None, spec.clone()))
        .await
        .expect("an unlabelled Sample is admitted");
    assert_refused(
        mine.patch("plain", &PatchParams::default(), &to(json!("b")))
            .await,
        SHARD_POLICY,
        &user,
        &use_b,
    );
    assert_eq!(shard_of(&admin, "plain").await, None);
    // An UPDATE removing or changing it, on a Sample the admin put in shard a.
    admin
        .create(&pp, &labelled(SAMPLES, "placed", Some("a"), spec.clone()))
        .await
        .expect("the admin may label");
    let leaves_a = format!("use shard \"a\" in namespace {h}, which Sample {h}/placed leaves");
    assert_refused(
        mine.patch("placed", &PatchParams::default(), &to(Value::Null))
            .await,
        SHARD_POLICY,
        &user,
        &leaves_a,
    );
    assert_refused(
        mine.patch("placed", &PatchParams::default(), &to(json!("b")))
            .await,
        SHARD_POLICY,
        &user,
        &use_b,
    );
    assert_eq!(shard_of(&admin, "placed").await.as_deref(), Some("a"));
    // A change that keeps the label is not checked.
    mine.patch(
        "placed",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"count": 1}})),
    )
    .await
    .expect("a spec change keeping the label is admitted");
    // A kind defined at runtime, of a group no one knew in advance.
    let my_gadgets = dynamic(&tess.client, h, gadgets.kind());
    assert_refused(
        my_gadgets
            .create(&pp, &labelled(gadgets.kind(), "g", Some("b"), json!({})))
            .await,
        SHARD_POLICY,
        &user,
        &format!("{use_b} Gadget {h}/g"),
    );
    // A cluster-scoped kind.
    let mut sharded = agent(&agent_name, None, [false; 3]);
    sharded["metadata"]["labels"][SHARD_LABEL] = json!("b");
    let cluster_wide = format!(
        "use shard \"b\" cluster-wide (the object is cluster-scoped): {why} ChaosAgent {agent_name}"
    );
    assert_refused(
        tess.agents().create(&pp, &typed(sharded.clone())).await,
        SHARD_POLICY,
        &user,
        &cluster_wide,
    );
    // Built-in objects are not checked: no shard serves them.
    Api::<ConfigMap>::namespaced(tess.client.clone(), h)
        .create(
            &pp,
            &typed(json!({"metadata": {"name": "c", "labels": {SHARD_LABEL: "b"}}})),
        )
        .await
        .expect("a labelled ConfigMap is admitted");

    // The admin grants tess the use of shard b in her namespace.
    apply(&[
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "shard-b", "namespace": h},
               "rules": [{"apiGroups": ["kustomize-operator.io"], "resources": ["shards"],
                          "resourceNames": ["b"], "verbs": ["use"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "shard-b", "namespace": h},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "shard-b"},
               "subjects": [{"kind": "ServiceAccount", "name": "tess", "namespace": h}]}),
    ]);
    tess.wait_shard("b", Some(h)).await;
    assert!(
        !tess.may_use_shard("b", None).await,
        "granted in her namespace only"
    );
    mine.patch("plain", &PatchParams::default(), &to(json!("b")))
        .await
        .expect("granted, she may move her Sample to shard b");
    assert_eq!(shard_of(&admin, "plain").await.as_deref(), Some("b"));
    mine.create(&pp, &labelled(SAMPLES, "s-b", Some("b"), spec.clone()))
        .await
        .expect("granted, she may create a Sample in shard b");
    my_gadgets
        .create(&pp, &labelled(gadgets.kind(), "g", Some("b"), json!({})))
        .await
        .expect("granted, she may create a gadget in shard b");
    // Still not out of shard a; out of b (to the default shard) she may:
    // leaving a shard needs the use of that shard.
    assert_refused(
        mine.patch("placed", &PatchParams::default(), &to(json!("b")))
            .await,
        SHARD_POLICY,
        &user,
        &leaves_a,
    );
    assert_eq!(shard_of(&admin, "placed").await.as_deref(), Some("a"));
    mine.patch("plain", &PatchParams::default(), &to(Value::Null))
        .await
        .expect("she may take her Sample out of shard b again");
    assert_eq!(shard_of(&admin, "plain").await, None);
    // A namespace's grant does not reach a cluster-scoped object...
    assert_refused(
        tess.agents().create(&pp, &typed(sharded.clone())).await,
        SHARD_POLICY,
        &user,
        &cluster_wide,
    );
    // ... a cluster-wide one does.
    let _cluster = Manifest::apply(&[
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": format!("{h}-shard-b")},
               "rules": [{"apiGroups": ["kustomize-operator.io"], "resources": ["shards"],
                          "resourceNames": ["b"], "verbs": ["use"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": format!("{h}-shard-b")},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{h}-shard-b")},
               "subjects": [{"kind": "ServiceAccount", "name": "tess", "namespace": h}]}),
    ]);
    tess.wait_shard("b", None).await;
    tess.agents()
        .create(&pp, &typed(sharded))
        .await
        .expect("granted cluster-wide, she may label a cluster-scoped object");
}
