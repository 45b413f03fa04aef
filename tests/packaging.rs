//! The image and the install, checked without a cluster or a container
//! engine: the Dockerfile's essentials (hadolint lints the rest in CI) and
//! the manifests `kubectl kustomize deploy` builds.

mod common;

use std::collections::BTreeSet;

use kustomize_operator::KindName;
use serde_json::Value;

const NAMESPACE: &str = "kustomize-operator-system";
const SERVICE_ACCOUNT: &str = "kustomize-operator";

fn read(path: &str) -> String {
    std::fs::read_to_string(common::repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One Dockerfile instruction: keyword (upper case) and its arguments, with
/// continuation lines joined and comments dropped.
fn instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(body) = trimmed.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (keyword, args) = current.split_once(' ').unwrap_or((&current, ""));
        out.push((keyword.to_ascii_uppercase(), args.trim().to_string()));
        current.clear();
    }
    out
}

/// A Dockerfile instruction: keyword and arguments.
type Instruction = (String, String);
/// A stage: its name (after AS), its image, its instructions after FROM.
type Stage = (String, String, Vec<Instruction>);

/// The stages, in order.
fn stages(text: &str) -> Vec<Stage> {
    let mut stages: Vec<Stage> = Vec::new();
    for (keyword, args) in instructions(text) {
        if keyword == "FROM" {
            let words: Vec<&str> = args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let image = words[0].to_string();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => name.to_string(),
                _ => String::new(),
            };
            stages.push((name, image, Vec::new()));
        } else if let Some(stage) = stages.last_mut() {
            stage.2.push((keyword, args));
        }
    }
    stages
}

/// `minor` of a `1.minor[.patch]` version in `text` after `prefix`.
fn minor_after(text: &str, prefix: &str) -> u32 {
    let rest = &text[text
        .find(prefix)
        .unwrap_or_else(|| panic!("{prefix} in {text}"))
        + prefix.len()..];
    rest.trim_start_matches("1.")
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no version after {prefix}"))
}

#[test]
fn dockerfile_has_the_essentials() {
    let text = read("Dockerfile");
    let stages = stages(&text);
    assert!(stages.len() >= 3, "multi-stage: kubectl, build, runtime");
    let names: BTreeSet<&str> = stages.iter().map(|s| s.0.as_str()).collect();

    // Every base image is pinned to a tag, never `latest`.
    for (_, image, _) in &stages {
        if names.contains(image.as_str()) {
            continue;
        }
        let tag = image.rsplit_once(':').map(|(_, t)| t);
        assert!(
            tag.is_some_and(|t| t != "latest" && !t.contains('/')),
            "base image {image} must carry a tag other than latest"
        );
    }
    // Nothing fetched from the network besides package registries.
    for (keyword, args) in instructions(&text) {
        assert!(
            !(keyword == "ADD" && args.contains("://")),
            "ADD of a URL: {args}"
        );
        assert!(
            !(keyword == "RUN" && (args.contains("curl ") || args.contains("wget "))),
            "downloads in RUN: {args}"
        );
    }

    // kubectl is built from the wrapper module that pins the tests' version.
    let kubectl_stage = stages
        .iter()
        .find(|s| {
            s.2.iter()
                .any(|(k, a)| k == "RUN" && a.contains("k8s.io/kubernetes/cmd/kubectl"))
        })
        .expect("a stage that builds kubectl");
    assert!(
        kubectl_stage
            .2
            .iter()
            .any(|(k, a)| k == "COPY" && a.contains("hack/control-plane/kubernetes")),
        "the kubectl stage builds from hack/control-plane/kubernetes (go.mod + go.sum)"
    );
    let go_needed = minor_after(&read("hack/control-plane/kubernetes/go.mod"), "\ngo ");
    assert!(
        minor_after(&kubectl_stage.1, "golang:") >= go_needed,
        "{} is older than go 1.{go_needed} in go.mod",
        kubectl_stage.1
    );
    let rust_needed = minor_after(&read("Cargo.toml"), "rust-version = \"");
    let rust_stage = stages
        .iter()
        .find(|s| s.1.starts_with("rust:"))
        .expect("a rust build stage");
    assert!(minor_after(&rust_stage.1, "rust:") >= rust_needed);

    // The runtime stage: kubectl and the binary from the build stages,
    // kustomize/ copied and named by KUSTOMIZE_DIR, a numeric non-root user,
    // writes under /tmp, exec-form entrypoint.
    let (_, base, runtime) = stages.last().unwrap();
    assert!(base.contains("distroless"), "minimal base: {base}");
    let copies: Vec<&str> = runtime
        .iter()
        .filter(|(k, _)| k == "COPY")
        .map(|(_, a)| a.as_str())
        .collect();
    let from_kubectl = format!("--from={} ", kubectl_stage.0);
    assert!(
        copies
            .iter()
            .any(|a| a.starts_with(&from_kubectl) && a.ends_with("/usr/local/bin/kubectl")),
        "kubectl bundled at /usr/local/bin/kubectl: {copies:?}"
    );
    assert!(
        copies.iter().any(|a| a.contains("kustomize-operator ")),
        "{copies:?}"
    );
    let kustomize_copy = copies
        .iter()
        .find(|a| a.starts_with("kustomize/ ") || a.starts_with("kustomize "))
        .expect("COPY kustomize/");
    let kustomize_dest = kustomize_copy.split_whitespace().last().unwrap();
    let env: String = runtime
        .iter()
        .filter(|(k, _)| k == "ENV")
        .map(|(_, a)| a.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        env.contains(&format!(
            "KUSTOMIZE_DIR={}",
            kustomize_dest.trim_end_matches('/')
        )),
        "KUSTOMIZE_DIR names {kustomize_dest}: {env}"
    );
    for var in [
        "WORK_DIR=/tmp/",
        "HOME=/tmp",
        "KUBECTL=/usr/local/bin/kubectl",
    ] {
        assert!(env.contains(var), "ENV {var}: {env}");
    }
    let user = runtime
        .iter()
        .rev()
        .find(|(k, _)| k == "USER")
        .map(|(_, a)| a.clone())
        .expect("USER in the runtime stage");
    let uid: u32 = user
        .split(':')
        .next()
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("USER must be numeric (runAsNonRoot checks it): {user}"));
    assert_ne!(uid, 0, "USER must not be root");
    let entrypoint = runtime
        .iter()
        .find(|(k, _)| k == "ENTRYPOINT")
        .expect("ENTRYPOINT");
    assert!(entrypoint.1.starts_with('['), "exec form: {}", entrypoint.1);

    // The build context lets through exactly what is copied from it.
    let ignore = read(".dockerignore");
    for (_, _, stage) in &stages {
        for (keyword, args) in stage {
            if keyword != "COPY" || args.starts_with("--from") {
                continue;
            }
            let words: Vec<&str> = args.split_whitespace().collect();
            for source in &words[..words.len() - 1] {
                assert!(
                    ignore.lines().any(|l| l.trim() == format!("!{source}")),
                    ".dockerignore must let {source} through"
                );
            }
        }
    }
}

/// The documents `kubectl kustomize deploy` builds.
fn deploy_documents() -> Vec<Value> {
    common::kustomize_documents("deploy")
}

/// The install with CopyratorRule confined to a list of namespaces.
const SCOPED_OVERLAY: &str = "overlays/copyrator-namespaces";

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in deploy"))
}

fn binds_operator(binding: &Value) -> bool {
    binding["subjects"].as_array().is_some_and(|subjects| {
        subjects.iter().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == SERVICE_ACCOUNT
                && s["namespace"] == NAMESPACE
        })
    })
}

#[test]
fn every_kind_has_its_rbac_file_listed_and_bound() {
    let kustomization = read("deploy/kustomization.yaml");
    let docs = deploy_documents();
    for kind in KindName::ALL {
        let file = format!("rbac/{}.yaml", kind.as_str());
        assert!(
            common::repo().join("deploy").join(&file).exists(),
            "deploy/{file} is missing: every kind needs its ClusterRole (see README, RBAC)"
        );
        assert!(
            kustomization
                .lines()
                .any(|l| l.trim() == format!("- {file}")),
            "deploy/kustomization.yaml does not list {file}"
        );
        let role = format!("kustomize-operator-{}", kind.as_str());
        find(&docs, "ClusterRole", &role);
        let binding = find(&docs, "ClusterRoleBinding", &role);
        assert_eq!(binding["roleRef"]["name"], role.as_str());
        assert!(
            binds_operator(binding),
            "{role} is not bound to the operator"
        );
        let crd = kind.crd().metadata.name.unwrap();
        find(&docs, "CustomResourceDefinition", &crd);
    }
}

#[test]
fn rbac_grants_no_wildcards_and_no_privilege_verbs() {
    for doc in deploy_documents()
        .into_iter()
        .chain(common::kustomize_documents(SCOPED_OVERLAY))
    {
        if doc["kind"] != "ClusterRole" && doc["kind"] != "Role" {
            continue;
        }
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for rule in doc["rules"].as_array().into_iter().flatten() {
            for field in ["verbs", "resources", "apiGroups"] {
                for value in rule[field].as_array().into_iter().flatten() {
                    assert_ne!(value, "*", "{name}: wildcard {field}");
                }
            }
            for verb in rule["verbs"].as_array().into_iter().flatten() {
                assert!(
                    !["escalate", "bind", "impersonate"].contains(&verb.as_str().unwrap_or("")),
                    "{name}: {verb}"
                );
            }
        }
    }
}

#[test]
fn the_deployment_is_hardened_and_wired() {
    let docs = deploy_documents();
    find(&docs, "Namespace", NAMESPACE);
    find(&docs, "ServiceAccount", SERVICE_ACCOUNT);
    find(&docs, "Role", "kustomize-operator-leader-election");
    assert!(binds_operator(find(
        &docs,
        "RoleBinding",
        "kustomize-operator-leader-election"
    )));
    let deployment = find(&docs, "Deployment", "kustomize-operator");
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], SERVICE_ACCOUNT);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let uid = pod["securityContext"]["runAsUser"]
        .as_u64()
        .expect("runAsUser");
    assert!(
        read("Dockerfile").contains(&format!("USER {uid}:")),
        "runAsUser {uid} matches the image's USER"
    );

    let container = &pod["containers"][0];
    let image = container["image"].as_str().unwrap();
    assert!(
        image.contains(':') && !image.ends_with(":latest"),
        "{image}"
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");

    let env = container["env"].as_array().unwrap();
    let var = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("env {name}"))
    };
    assert_eq!(
        var("NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(
        var("POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(var("METRICS_ADDR")["value"], "0.0.0.0:8080");
    assert_eq!(var("LEADER_ELECT")["value"], "true");
    assert!(
        var("WORK_DIR")["value"]
            .as_str()
            .unwrap()
            .starts_with("/tmp/")
    );

    // /tmp is an emptyDir: the only writable place.
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/tmp")
        .expect("/tmp mounted");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert!(volume["emptyDir"].is_object());

    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for field in ["requests", "limits"] {
        assert!(
            container["resources"][field]["memory"].is_string(),
            "resources.{field}.memory"
        );
    }

    let service = find(&docs, "Service", "kustomize-operator-metrics");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &labels[key], value,
            "the Service selects the operator's Pods"
        );
    }
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
}

/// The names of the roles (Role or ClusterRole) granting anything on Secrets.
fn roles_granting_secrets(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .filter(|d| {
            d["rules"].as_array().into_iter().flatten().any(|rule| {
                rule["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r == "secrets")
            })
        })
        .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_copyrator_namespaces_overlay_grants_secrets_only_in_its_list() {
    let docs = common::kustomize_documents(SCOPED_OVERLAY);
    assert!(
        !docs
            .iter()
            .any(|d| d["metadata"]["name"] == "kustomize-operator-copyrator"),
        "the cluster-wide copyrator role and binding are removed"
    );
    let secret_roles = roles_granting_secrets(&docs);
    assert!(!secret_roles.is_empty());
    let mut granted = BTreeSet::new();
    for binding in docs.iter().filter(|d| binds_operator(d)) {
        let role = binding["roleRef"]["name"].as_str().unwrap_or_default();
        if !secret_roles.contains(role) {
            continue;
        }
        assert_eq!(
            binding["kind"], "RoleBinding",
            "{role} (Secrets) must be bound per namespace, not cluster-wide"
        );
        granted.insert(
            binding["metadata"]["namespace"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let listed: BTreeSet<String> = common::copyrator_namespaces_env(&docs)
        .into_iter()
        .collect();
    assert_eq!(
        granted, listed,
        "RoleBindings (rolebindings.yaml) and COPYRATOR_NAMESPACES (namespaces.yaml) list the same namespaces"
    );
    // Every kind is still bound: Copyrator through its rules role.
    for role in [
        "kustomize-operator-sample",
        "kustomize-operator-exchangerate",
        "kustomize-operator-chaosagent",
        "kustomize-operator-copyrator-rules",
        "kustomize-operator-events",
    ] {
        assert!(
            binds_operator(find(&docs, "ClusterRoleBinding", role)),
            "{role}"
        );
    }
}
