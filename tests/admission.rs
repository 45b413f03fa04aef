//! The admission policies of `deploy/admission`, checked without a cluster:
//! shipped with the install, bound, failing closed, matching what they must,
//! generated from their script, and within CEL's cost limits. What they admit
//! and refuse is tested against the API server in `tests/tenancy.rs`.

use ko_test_support as common;

use serde_json::Value;

const RULE_POLICY: &str = "kustomize-operator-copyrator-rights";
const AGENT_POLICY: &str = "kustomize-operator-chaosagent-rights";
const DEFINITION_POLICY: &str = "kustomize-operator-kinddefinition-guard";
const SHARD_POLICY: &str = "kustomize-operator-shard-guard";

/// CEL's price of one authorization check, and the most one expression and
/// one policy (per request) may spend (k8s.io/apiserver: pkg/cel/library/cost.go,
/// pkg/apis/cel/config.go).
const CHECK_COST: u64 = 350_000;
const PER_EXPRESSION_LIMIT: u64 = 1_000_000;
const PER_POLICY_BUDGET: u64 = 10_000_000;

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("a list: {value}"))
        .iter()
        .map(|v| v.as_str().expect("a string"))
        .collect()
}

/// The validations' expressions.
fn expressions(policy: &Value) -> Vec<&str> {
    policy["spec"]["validations"]
        .as_array()
        .expect("validations")
        .iter()
        .map(|v| v["expression"].as_str().expect("an expression"))
        .collect()
}

#[test]
fn the_policies_ship_with_the_install_bound_and_failing_closed() {
    let kustomization = std::fs::read_to_string(common::repo().join("deploy/kustomization.yaml"))
        .expect("deploy/kustomization.yaml");
    assert!(
        kustomization.lines().any(|l| l.trim() == "- admission"),
        "deploy/kustomization.yaml does not list admission"
    );
    let docs = common::kustomize_documents("deploy");
    // A ChaosAgent's DELETE is checked too: deleting someone else's agent
    // needs the rights it acts with.
    for (name, group, resource, operations) in [
        (
            RULE_POLICY,
            "flant.com",
            "copyrators",
            &["CREATE", "UPDATE"][..],
        ),
        (
            AGENT_POLICY,
            "blackadder.io",
            "chaosagents",
            &["CREATE", "UPDATE", "DELETE"][..],
        ),
        (SHARD_POLICY, "*", "*", &["CREATE", "UPDATE"][..]),
    ] {
        let spec = &shipped_bound_failing_closed(&docs, name, group, resource, operations)["spec"];
        for validation in spec["validations"].as_array().expect("validations") {
            let expression = validation["expression"].as_str().unwrap();
            assert_eq!(validation["reason"], "Forbidden", "{expression}");
            assert!(validation["message"].is_string(), "{expression}");
            // The messages cannot call the authorizer (it is not bound there).
            let message = validation["messageExpression"]
                .as_str()
                .unwrap_or_else(|| panic!("a messageExpression for {expression}"));
            assert!(!message.contains("authorizer"), "{message}");
            let checks = expression.matches(".check(").count() as u64;
            assert!(
                checks * CHECK_COST <= PER_EXPRESSION_LIMIT,
                "{expression}: {checks} authorization checks exceed one expression's cost limit"
            );
        }
    }
}

/// The policy `name` of `docs`, after checking that it fails closed, matches
/// `operations` on `group`'s `resource` alone, and is bound to deny.
fn shipped_bound_failing_closed<'a>(
    docs: &'a [Value],
    name: &str,
    group: &str,
    resource: &str,
    operations: &[&str],
) -> &'a Value {
    let policy = find(docs, "ValidatingAdmissionPolicy", name);
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail", "{name}");
    let rules = spec["matchConstraints"]["resourceRules"]
        .as_array()
        .expect("resourceRules");
    assert_eq!(rules.len(), 1, "{name}");
    assert_eq!(strings(&rules[0]["apiGroups"]), [group], "{name}");
    // Not `<resource>/status`: the operator's status writes stay unchecked.
    assert_eq!(strings(&rules[0]["resources"]), [resource], "{name}");
    assert_eq!(strings(&rules[0]["operations"]), operations, "{name}");
    let binding = find(docs, "ValidatingAdmissionPolicyBinding", name);
    assert_eq!(binding["spec"]["policyName"], name);
    assert_eq!(strings(&binding["spec"]["validationActions"]), ["Deny"]);
    policy
}

/// KindDefinitions: an UPDATE of the kind's API identity and a DELETE while
/// resources of the kind exist are refused, each with a message built from
/// the request (what it does with them: `deploy/admission/kinddefinition.yaml`,
/// checked against the API server when it was written).
#[test]
fn the_kinddefinition_policy_guards_identity_and_deletion() {
    let docs = common::kustomize_documents("deploy");
    let policy = shipped_bound_failing_closed(
        &docs,
        DEFINITION_POLICY,
        "kustomize-operator.io",
        "kinddefinitions",
        &["UPDATE", "DELETE"],
    );
    let spec = &policy["spec"];
    let changed = spec["variables"]
        .as_array()
        .expect("variables")
        .iter()
        .find(|v| v["name"] == "changed")
        .expect("the variable changed");
    for field in [
        "spec.group",
        "spec.version",
        "spec.names.kind",
        "spec.names.plural",
        "spec.scope",
    ] {
        assert!(
            changed["expression"]
                .as_str()
                .unwrap()
                .contains(&format!("['{field}']")),
            "{field} is not compared"
        );
    }
    let validations = spec["validations"].as_array().expect("validations");
    assert_eq!(validations.len(), 2);
    for validation in validations {
        assert!(validation["messageExpression"].is_string(), "{validation}");
        assert!(validation["message"].is_string(), "{validation}");
    }
    let text = serde_json::to_string(spec).unwrap();
    for needle in [
        "kustomize-operator.io/allow-breaking-changes",
        "'Orphan'",
        "orValue('Namespaced')",
        "status.?resources",
    ] {
        assert!(text.contains(needle), "{DEFINITION_POLICY} lacks {needle}");
    }
}

#[test]
fn the_copyrator_policy_is_generated_by_its_script() {
    let script = common::repo().join("hack/generate-copyrator-policy");
    let out = std::process::Command::new(&script)
        .output()
        .expect("run hack/generate-copyrator-policy");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read_to_string(common::repo().join("deploy/admission/copyrator.yaml"))
        .expect("deploy/admission/copyrator.yaml");
    assert!(
        committed == String::from_utf8_lossy(&out.stdout),
        "deploy/admission/copyrator.yaml is stale: run hack/generate-copyrator-policy > deploy/admission/copyrator.yaml"
    );
}

/// Each listed namespace up to the limit has its create and patch checks, in
/// order; the worst request (a rule listing exactly the limit) stays within
/// the policy's budget.
#[test]
fn the_copyrator_policy_checks_each_listed_namespace_within_the_budget() {
    let docs = common::kustomize_documents("deploy/admission");
    let policy = find(&docs, "ValidatingAdmissionPolicy", RULE_POLICY);
    let expressions = expressions(policy);
    let per_namespace: Vec<&str> = expressions
        .iter()
        .copied()
        .filter(|e| e.contains("variables.targets["))
        .collect();
    let one_by_one = per_namespace.len() / 2;
    assert!(one_by_one >= 1, "no per-namespace checks");
    for (i, pair) in per_namespace.chunks(2).enumerate() {
        for (expression, verb) in pair.iter().zip(["create", "patch"]) {
            assert!(
                expression.contains(&format!(
                    "namespace(variables.targets[{i}]).check('{verb}')"
                )) && expression.contains(&format!("size(variables.targets) <= {i} ||")),
                "validation {verb} #{i}: {expression}"
            );
        }
    }
    let cluster_wide = expressions
        .iter()
        .filter(|e| e.starts_with("variables.oneByOne ||"))
        .count();
    let source = expressions
        .iter()
        .filter(|e| e.contains("namespace(request.namespace)"))
        .count();
    assert_eq!((cluster_wide, source), (2, 2), "{expressions:#?}");
    assert_eq!(expressions.len(), 2 * one_by_one + 4);
    let limit = policy["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "oneByOne")
        .and_then(|v| v["expression"].as_str())
        .expect("the oneByOne variable");
    assert!(
        limit.ends_with(&format!("<= {one_by_one}")),
        "oneByOne ({limit}) and the per-namespace validations ({one_by_one}) disagree"
    );
    // Per request: either the cluster-wide pair or the per-namespace ones,
    // and the source pair.
    let worst = (2 * one_by_one as u64).max(2) + 2;
    assert!(
        worst * CHECK_COST <= PER_POLICY_BUDGET * 95 / 100,
        "{worst} checks leave too little of the policy's CEL budget"
    );
}

/// ChaosAgent: every mode is checked on the agent as it would be (CREATE,
/// UPDATE) and on the agent as it is (UPDATE, DELETE), so an UPDATE needs
/// the rights of both: switching a victim's modes off or moving its scope
/// to one's own namespace is refused like deleting it.
#[test]
fn the_chaosagent_policy_checks_the_agent_before_and_after_an_update() {
    let docs = common::kustomize_documents("deploy/admission");
    let policy = find(&docs, "ValidatingAdmissionPolicy", AGENT_POLICY);
    let expressions = expressions(policy);
    assert_eq!(expressions.len(), 6, "{expressions:#?}");
    let variables: Vec<(&str, &str)> = policy["spec"]["variables"]
        .as_array()
        .expect("variables")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap(),
                v["expression"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(variables.contains(&("after", "object")), "{variables:?}");
    assert!(
        variables.contains(&("before", "oldObject")),
        "{variables:?}"
    );
    for (mode, check) in [
        ("tantrumMode", "resource('pods')"),
        ("cancerMode", "resource('deployments')"),
        ("ipsumMode", "resource('configmaps')"),
    ] {
        for (side, skipped_on) in [("after", "DELETE"), ("before", "CREATE")] {
            let found = expressions.iter().any(|e| {
                e.starts_with(&format!("request.operation == '{skipped_on}' ||"))
                    && e.contains(&format!("variables.{side}.spec.?{mode}"))
                    && e.contains(check)
                    && e.contains(&format!("namespace(variables.{side}Scope)"))
            });
            assert!(found, "no check of {mode} on the agent {side} the request");
        }
    }
}

/// The shard guard: every group and resource (no subresource), only objects
/// carrying the label, only custom resources, each validation one check.
#[test]
fn the_shard_guard_matches_every_custom_resource_carrying_the_label() {
    let docs = common::kustomize_documents("deploy/admission");
    let policy = find(&docs, "ValidatingAdmissionPolicy", SHARD_POLICY);
    let spec = &policy["spec"];
    assert_eq!(
        spec["matchConstraints"]["objectSelector"],
        serde_json::json!({"matchExpressions": [
            {"key": "kustomize-operator.io/shard", "operator": "Exists"}
        ]})
    );
    let conditions = serde_json::to_string(&spec["matchConditions"]).unwrap();
    for needle in [
        "request.resource.group.contains('.')",
        "endsWith('.k8s.io')",
        "endsWith('.kubernetes.io')",
        "request.operation == 'CREATE'",
    ] {
        assert!(conditions.contains(needle), "{needle}: {conditions}");
    }
    let expressions = expressions(policy);
    assert_eq!(expressions.len(), 2, "{expressions:#?}");
    for (expression, shard) in expressions.iter().zip(["entered", "left"]) {
        assert!(
            expression.contains(&format!(
                "authorizer.group('kustomize-operator.io').resource('shards').namespace(variables.ns).name(variables.{shard}).check('use')"
            )),
            "{expression}"
        );
    }
}

/// The revision guard: every custom resource carrying the pin label, each
/// KindDefinition a param (none: nothing checked), the fields it reads
/// declared in the KindDefinition CRD (params are typed by it), one
/// authorization check at most.
#[test]
fn the_revision_guard_reads_each_definition_for_every_pinned_custom_resource() {
    let docs = common::kustomize_documents("deploy/admission");
    let name = "kustomize-operator-revision-guard";
    let policy = find(&docs, "ValidatingAdmissionPolicy", name);
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(
        spec["paramKind"],
        serde_json::json!({"apiVersion": "kustomize-operator.io/v1alpha1", "kind": "KindDefinition"})
    );
    assert_eq!(
        spec["matchConstraints"]["objectSelector"],
        serde_json::json!({"matchExpressions": [
            {"key": "kustomize-operator.io/revision", "operator": "Exists"}
        ]})
    );
    let rule = &spec["matchConstraints"]["resourceRules"][0];
    assert_eq!(strings(&rule["apiGroups"]), ["*"]);
    assert_eq!(strings(&rule["resources"]), ["*"]);
    assert_eq!(strings(&rule["operations"]), ["CREATE", "UPDATE"]);
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding", name);
    assert_eq!(binding["spec"]["policyName"], name);
    assert_eq!(
        binding["spec"]["paramRef"],
        serde_json::json!({"selector": {}, "parameterNotFoundAction": "Allow"})
    );
    assert_eq!(strings(&binding["spec"]["validationActions"]), ["Deny"]);
    let all = serde_json::to_string(spec).unwrap();
    for read in [
        "params.?status.?pinnable",
        "params.?spec.?rollout.?withdrawn",
        "params.?spec.?rollout.?pinBy",
    ] {
        assert!(all.contains(read), "{read}");
    }
    for expression in expressions(policy) {
        let checks = expression.matches(".check(").count() as u64;
        assert!(checks * CHECK_COST <= PER_EXPRESSION_LIMIT, "{expression}");
    }
    // What it reads, the CRD declares (else the API server prunes it).
    let crd = serde_json::to_value(kustomize_operator::definitions::resource::crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let rollout = &schema["spec"]["properties"]["rollout"]["properties"];
    assert_eq!(rollout["withdrawn"]["items"]["type"], "integer");
    assert_eq!(rollout["pinnable"]["items"]["type"], "integer");
    assert_eq!(
        rollout["pinBy"]["enum"],
        serde_json::json!(["Anyone", "Granted"])
    );
    let pinnable = &schema["status"]["properties"]["pinnable"];
    assert_eq!(pinnable["items"]["type"], "integer");
    assert!(pinnable["maxItems"].is_u64(), "{pinnable}");
}
