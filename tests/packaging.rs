//! The image and the install, checked without a cluster or a container
//! engine: the Dockerfile's essentials (hadolint lints the rest in CI) and
//! the manifests `kubectl kustomize deploy` builds.

use ko_test_support as common;

use std::collections::{BTreeMap, BTreeSet};

use kustomize_operator::kinds::declared::rbac::AGGREGATE_LABEL;
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

/// The global `ARG`s (before the first `FROM`) with their defaults.
fn global_args(text: &str) -> BTreeMap<String, String> {
    instructions(text)
        .into_iter()
        .take_while(|(keyword, _)| keyword != "FROM")
        .filter(|(keyword, _)| keyword == "ARG")
        .map(|(_, args)| match args.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None => (args, String::new()),
        })
        .collect()
}

/// `text` with `${NAME}` replaced by the value in `args`.
fn expand(text: &str, args: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    for (name, value) in args {
        out = out.replace(&format!("${{{name}}}"), value);
    }
    assert!(!out.contains('$'), "an ARG without a default in {text}");
    out
}

/// The stages, in order, with the global ARGs' defaults (the images a plain
/// `docker build .` uses) or `overrides` (`--build-arg`s) filled in.
fn stages_with(text: &str, overrides: &[(&str, &str)]) -> Vec<Stage> {
    let mut args = global_args(text);
    for (name, value) in overrides {
        assert!(args.contains_key(*name), "no ARG {name} in the Dockerfile");
        args.insert(name.to_string(), value.to_string());
    }
    let mut stages: Vec<Stage> = Vec::new();
    for (keyword, rest) in instructions(text) {
        if keyword == "FROM" {
            let words: Vec<&str> = rest
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let image = expand(words[0], &args);
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => name.to_string(),
                _ => String::new(),
            };
            stages.push((name, image, Vec::new()));
        } else if let Some(stage) = stages.last_mut() {
            stage.2.push((keyword, rest));
        }
    }
    stages
}

/// The stages of a plain `docker build .`.
fn stages(text: &str) -> Vec<Stage> {
    stages_with(text, &[])
}

/// The stage named `name`.
fn stage<'a>(stages: &'a [Stage], name: &str) -> &'a Stage {
    stages
        .iter()
        .find(|s| s.0 == name)
        .unwrap_or_else(|| panic!("no stage {name}"))
}

/// The stages `target` is built from (itself included): its `FROM` when
/// that is a stage, and the stages its `COPY --from` name, recursively.
fn needed(stages: &[Stage], target: &Stage) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut pending = vec![target.clone()];
    while let Some((name, image, instructions)) = pending.pop() {
        if !found.insert(name) {
            continue;
        }
        let from_copies = instructions.iter().filter_map(|(k, a)| {
            (k == "COPY")
                .then(|| a.strip_prefix("--from="))
                .flatten()
                .and_then(|a| a.split_whitespace().next())
        });
        for parent in from_copies.chain(std::iter::once(image.as_str())) {
            if let Some(stage) = stages.iter().find(|s| s.0 == parent) {
                pending.push(stage.clone());
            }
        }
    }
    found
}

/// The destination of each `COPY` of a stage, by source, as `(source, destination)`.
fn copies(stage: &Stage) -> Vec<(String, String)> {
    stage
        .2
        .iter()
        .filter(|(k, _)| k == "COPY")
        .flat_map(|(_, a)| {
            let words: Vec<&str> = a
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let (dest, sources) = words.split_last().expect("COPY <src> <dest>");
            sources
                .iter()
                .map(|s| (s.to_string(), dest.to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The files a `binaries-*` stage provides (`COPY`'s destination, plus the
/// source's file name when the destination is a directory).
fn provided(stage: &Stage) -> BTreeSet<String> {
    copies(stage)
        .into_iter()
        .map(|(source, dest)| {
            if dest.ends_with('/') {
                format!("{dest}{}", source.rsplit('/').next().unwrap())
            } else {
                dest
            }
        })
        .collect()
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
        if names.contains(image.as_str()) || image == "scratch" {
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

    // kubectl is built, static, from the wrapper module that pins the tests'
    // version, by the script hack/image runs too.
    let kubectl_stage = stages
        .iter()
        .find(|s| {
            s.2.iter()
                .any(|(k, a)| k == "RUN" && a.contains("build-kubectl "))
        })
        .expect("a stage that runs hack/build-kubectl");
    let module = common::newest_kubernetes_module();
    let minor = module.rsplit('/').next().unwrap_or_default();
    assert!(
        read("Dockerfile").contains(&format!("ARG KUBERNETES_MINOR={minor}\n")),
        "the Dockerfile's kubectl is the newest supported minor's ({minor})"
    );
    for source in [
        "hack/build-kubectl",
        "hack/control-plane/kubernetes/${KUBERNETES_MINOR}",
    ] {
        assert!(
            kubectl_stage
                .2
                .iter()
                .any(|(k, a)| k == "COPY" && a.contains(source)),
            "the kubectl stage copies {source}"
        );
    }
    let script = read("hack/build-kubectl");
    for part in [
        "CGO_ENABLED=0",
        "-trimpath",
        "k8s.io/kubernetes/cmd/kubectl",
    ] {
        assert!(script.contains(part), "hack/build-kubectl: {part}");
    }
    let go_needed = minor_after(&read(&format!("{module}/go.mod")), "\ngo ");
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
    // cargo loads every workspace member's manifest, even to build one
    // binary: the build stage copies each (tests/support's alone).
    let manifest = read("Cargo.toml");
    let members = manifest
        .split_once("\nmembers = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .expect("members = [...] in Cargo.toml")
        .0;
    let built_from = copies(rust_stage);
    for member in members.split(',').map(|m| m.trim().trim_matches('"')) {
        if member.is_empty() || member == "." {
            continue;
        }
        let manifest = format!("{member}/Cargo.toml");
        assert!(
            built_from.iter().any(|(source, _)| *source == manifest),
            "the build stage copies {manifest}"
        );
    }

    // The runtime stage takes both binaries from the `binaries` stage: by
    // default the kubectl and rust stages' output, with BINARIES=prebuilt
    // (hack/image) the same two files from the build context, and then
    // neither the Go nor the Rust image is needed.
    let (_, base, runtime) = stages.last().unwrap();
    assert!(base.contains("distroless"), "minimal base: {base}");
    let runtime_stage = stages.last().unwrap();
    for (from, to) in [
        ("/kubectl", "/usr/local/bin/kubectl"),
        ("/kustomize-operator", "/usr/local/bin/kustomize-operator"),
    ] {
        assert!(
            runtime
                .iter()
                .any(|(k, a)| k == "COPY" && a == &format!("--from=binaries {from} {to}")),
            "COPY --from=binaries {from} {to}"
        );
    }
    let source = provided(stage(&stages, "binaries-source"));
    assert_eq!(
        source,
        ["/kubectl", "/kustomize-operator"].map(String::from).into()
    );
    assert_eq!(provided(stage(&stages, "binaries-prebuilt")), source);
    let by_default = needed(&stages, runtime_stage);
    assert!(by_default.contains(&kubectl_stage.0) && by_default.contains(&rust_stage.0));
    let prebuilt = stages_with(&text, &[("BINARIES", "prebuilt")]);
    let with_prebuilt = needed(&prebuilt, prebuilt.last().unwrap());
    assert!(
        with_prebuilt.contains("binaries-prebuilt")
            && !with_prebuilt.contains(&kubectl_stage.0)
            && !with_prebuilt.contains(&rust_stage.0),
        "{with_prebuilt:?}"
    );

    // kustomize/ copied and named by KUSTOMIZE_DIR, a numeric non-root user,
    // writes under /tmp, exec-form entrypoint.
    let copies: Vec<&str> = runtime
        .iter()
        .filter(|(k, _)| k == "COPY")
        .map(|(_, a)| a.as_str())
        .collect();
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
    let let_through = |source: &str| {
        ignore
            .lines()
            .filter_map(|l| l.trim().strip_prefix('!'))
            .any(|p| p == source || (p.ends_with('/') && source.starts_with(p)))
    };
    for stage in &stages {
        for (source, _) in copies_from_context(stage) {
            assert!(
                let_through(&source),
                ".dockerignore must let {source} through"
            );
        }
    }
}

/// The sources a stage copies from the build context (not `--from`).
fn copies_from_context(stage: &Stage) -> Vec<(String, String)> {
    let from_context = (
        stage.0.clone(),
        stage.1.clone(),
        stage
            .2
            .iter()
            .filter(|(k, a)| k == "COPY" && !a.contains("--from="))
            .cloned()
            .collect(),
    );
    copies(&from_context)
}

/// hack/image builds this Dockerfile, not a copy of it: its build args are
/// the Dockerfile's ARGs, it puts the binaries where `binaries-prebuilt`
/// takes them, and it builds them with the commands the source stages run.
#[test]
fn hack_image_builds_the_dockerfile_with_its_prebuilt_binaries() {
    let text = read("Dockerfile");
    let script = read("hack/image");
    let args = global_args(&text);
    let mut passed = BTreeSet::new();
    for (i, _) in script.match_indices("--build-arg ") {
        let word = script[i + "--build-arg ".len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .trim_matches('"');
        let name = word.split('=').next().unwrap();
        assert!(
            args.contains_key(name),
            "hack/image passes {name}, which the Dockerfile lacks"
        );
        passed.insert(name.to_string());
    }
    assert_eq!(
        passed,
        ["BINARIES", "RUNTIME_IMAGE"].map(String::from).into(),
        "hack/image passes BINARIES and RUNTIME_IMAGE"
    );
    assert!(script.contains("--build-arg BINARIES=prebuilt"));
    let stages = stages_with(&text, &[("BINARIES", "prebuilt")]);
    for (source, _) in copies(stage(&stages, "binaries-prebuilt")) {
        assert!(
            script.contains(&format!(" {source}\n")),
            "hack/image must copy a binary to {source}"
        );
    }
    assert!(script.contains("hack/build-kubectl \"$module\" "));
    assert!(
        script.contains("ls -d 1.* | sort -V | tail -1"),
        "hack/image builds the newest minor's kubectl"
    );
    let cargo = "cargo build --release --locked --bin kustomize-operator";
    assert!(script.contains(cargo), "hack/image runs {cargo}");
    let build = stages.iter().find(|s| s.1.starts_with("rust:")).unwrap();
    assert!(build.2.iter().any(|(k, a)| k == "RUN" && a.contains(cargo)));
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

/// The ClusterRole that aggregates the roles of declared kinds added later,
/// bound to the operator (deploy/rbac/kind-definitions.yaml).
const AGGREGATING_ROLE: &str = "kustomize-operator-kinds";

/// Fails unless `role`'s rules reach the operator by its own
/// ClusterRoleBinding, a declared kind's too, and unless no role of the
/// install is a source of the aggregating role: deleting the install would
/// then change a source while the role goes, and the control plane's
/// aggregation controller (a server-side apply of its rules) could create
/// it again, unlabelled, in the way of the next install.
fn assert_granted(docs: &[Value], role: &str) {
    find(docs, "ClusterRole", role);
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding" && d["metadata"]["name"] == role)
        .unwrap_or_else(|| panic!("{role} is not bound"));
    assert_eq!(binding["roleRef"]["name"], role);
    assert!(
        binds_operator(binding),
        "{role} is not bound to the operator"
    );
    for cluster_role in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        assert!(
            cluster_role["metadata"]["labels"][AGGREGATE_LABEL].is_null(),
            "{}: no role of the install is aggregated (label {AGGREGATE_LABEL})",
            cluster_role["metadata"]["name"]
        );
    }
    let aggregating = find(docs, "ClusterRole", AGGREGATING_ROLE);
    assert_eq!(
        aggregating["aggregationRule"]["clusterRoleSelectors"],
        serde_json::json!([{"matchLabels": {AGGREGATE_LABEL: "true"}}])
    );
    assert!(
        aggregating.get("rules").is_none(),
        "{AGGREGATING_ROLE}: the control plane owns its rules"
    );
    assert!(binds_operator(find(
        docs,
        "ClusterRoleBinding",
        AGGREGATING_ROLE
    )));
}

#[test]
fn every_kind_has_its_rbac_file_listed_and_granted() {
    let kustomization = read("deploy/kustomization.yaml");
    let docs = deploy_documents();
    for kind in common::all_kinds() {
        let file = format!("rbac/{}.yaml", kind.name());
        assert!(
            common::repo().join("deploy").join(&file).exists(),
            "deploy/{file} is missing: every kind needs its ClusterRole (see docs/deploy.md, RBAC)"
        );
        assert!(
            kustomization
                .lines()
                .any(|l| l.trim() == format!("- {file}")),
            "deploy/kustomization.yaml does not list {file}"
        );
        let role = format!("kustomize-operator-{}", kind.name());
        assert_granted(&docs, &role);
        let crd = kind.crd().metadata.name.unwrap();
        find(&docs, "CustomResourceDefinition", &crd);
    }
}

/// The operator may serve KindDefinitions: watch them, write their
/// finalizer and status, apply and delete the CRDs they declare, and make
/// the StorageVersionMigrations of their kinds.
#[test]
fn the_operator_may_serve_kind_definitions() {
    let docs = deploy_documents();
    let role = "kustomize-operator-kind-definitions";
    assert!(binds_operator(find(&docs, "ClusterRoleBinding", role)));
    let rules = &find(&docs, "ClusterRole", role)["rules"];
    let verbs = |group: &str, resource: &str| -> Vec<String> {
        rules
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["apiGroups"] == serde_json::json!([group]))
            .filter(|r| r["resources"] == serde_json::json!([resource]))
            .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(
        verbs("kustomize-operator.io", "kinddefinitions"),
        ["get", "list", "watch", "patch", "update"]
    );
    assert_eq!(
        verbs("kustomize-operator.io", "kinddefinitions/status"),
        ["patch", "update"]
    );
    assert_eq!(
        verbs("apiextensions.k8s.io", "customresourcedefinitions"),
        ["get", "list", "watch", "create", "patch", "delete"]
    );
    // A kind's storage migrated by the API server, where it serves them.
    assert_eq!(
        verbs("storagemigration.k8s.io", "storageversionmigrations"),
        ["get", "list", "create", "patch", "delete"]
    );
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

    // Nothing the operator writes rests on node disk.
    let tmp = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tmp")
        .expect("the /tmp volume");
    assert_eq!(tmp["emptyDir"]["medium"], "Memory", "{tmp}");
    assert!(tmp["emptyDir"]["sizeLimit"].is_string(), "{tmp}");

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
    let mut secret_roles = roles_granting_secrets(&docs);
    // Besides the copies: the key that signs the definitions' revisions,
    // in the operator's own namespace (that one Secret read by name, and
    // made: create cannot be limited to a name).
    let revisions = find(&docs, "Role", "kustomize-operator-revisions");
    let on_secrets: Vec<&Value> = (revisions["rules"].as_array().unwrap().iter())
        .filter(|r| r["resources"] == serde_json::json!(["secrets"]))
        .collect();
    assert_eq!(
        on_secrets,
        [
            &serde_json::json!({"apiGroups": [""], "resources": ["secrets"],
                                "resourceNames": ["kustomize-operator-revisions"], "verbs": ["get"]}),
            &serde_json::json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
        ]
    );
    assert!(secret_roles.remove("kustomize-operator-revisions"));
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
    // Every kind is still granted: Copyrator through its rules role.
    assert_granted(&docs, "kustomize-operator-sample");
    for role in [
        "kustomize-operator-kinds",
        "kustomize-operator-kind-definitions",
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

/// `overlays/shards`: deploy/ plus a second operator for shard `b`, with
/// selectors that do not overlap, its own shard and Lease, and the grant to
/// take that Lease.
#[test]
fn the_shards_overlay_runs_a_second_operator_for_shard_b() {
    let docs = common::kustomize_documents("overlays/shards");
    let main = find(&docs, "Deployment", "kustomize-operator");
    let shard_b = find(&docs, "Deployment", "kustomize-operator-shard-b");
    let selector = |d: &Value| d["spec"]["selector"]["matchLabels"].clone();
    let labels = |d: &Value| d["spec"]["template"]["metadata"]["labels"].clone();
    let matches = |selector: &Value, labels: &Value| {
        selector
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(
        !matches(&selector(main), &labels(shard_b)),
        "the main Deployment selects shard b's Pods"
    );
    assert!(
        !matches(&selector(shard_b), &labels(main)),
        "shard b selects the main Pods"
    );
    let env = |d: &Value, name: &str| {
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(env(shard_b, "SHARD"), Some(Value::from("b")));
    assert_eq!(
        env(main, "SHARD"),
        None,
        "deploy/'s operator is the default shard"
    );
    assert_eq!(
        shard_b["metadata"]["namespace"],
        "kustomize-operator-system"
    );
    assert_eq!(
        shard_b["spec"]["template"]["spec"]["serviceAccountName"],
        "kustomize-operator"
    );
    let role = find(&docs, "Role", "kustomize-operator-leader-election");
    let leases: Vec<&Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resourceNames"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(leases, ["kustomize-operator", "kustomize-operator-b"]);
    // Shard b's Pods have their own NetworkPolicy.
    let policy = find(&docs, "NetworkPolicy", "kustomize-operator-shard-b");
    assert!(matches(
        &policy["spec"]["podSelector"]["matchLabels"],
        &labels(shard_b)
    ));
    // The right to use shard b, granted to no one.
    let use_b = find(&docs, "ClusterRole", "kustomize-operator-use-shard-b");
    assert_eq!(
        use_b["rules"],
        serde_json::json!([{"apiGroups": ["kustomize-operator.io"], "resources": ["shards"],
                            "resourceNames": ["b"], "verbs": ["use"]}])
    );
    assert!(
        !docs
            .iter()
            .any(|d| d["roleRef"]["name"] == "kustomize-operator-use-shard-b"),
        "the use of shard b is an administrator's grant, not the install's"
    );
}

/// The operator's env var `name` in the Deployment of `docs`, if set.
fn env_var(docs: &[Value], name: &str) -> Option<Value> {
    find(docs, "Deployment", "kustomize-operator")["spec"]["template"]["spec"]["containers"][0]
        ["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].clone())
}

/// The verbs `docs`' ClusterRoles grant on CRDs, by role.
fn crd_rights(docs: &[Value]) -> BTreeMap<String, Vec<Value>> {
    docs.iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .filter_map(|d| {
            let verbs: Vec<Value> = d["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| {
                    r["resources"]
                        .as_array()
                        .is_some_and(|rs| rs.iter().any(|x| x == "customresourcedefinitions"))
                })
                .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
                .collect();
            (!verbs.is_empty())
                .then(|| (d["metadata"]["name"].as_str().unwrap().to_string(), verbs))
        })
        .collect()
}

/// overlays/locked-down serves no KindDefinitions and holds no right on
/// CRDs (serving them takes create, patch and delete on every CRD); its
/// component kind-definitions/ (overlays/locked-down-kind-definitions)
/// brings back deploy/'s role, unchanged, and the default (serve them).
#[test]
fn the_locked_down_install_holds_crd_rights_only_with_kind_definitions() {
    let locked = common::kustomize_documents("overlays/locked-down");
    assert_eq!(crd_rights(&locked), BTreeMap::new());
    assert_eq!(
        env_var(&locked, "SERVE_KIND_DEFINITIONS"),
        Some(Value::from("false"))
    );
    let with = common::kustomize_documents("overlays/locked-down-kind-definitions");
    let role = "kustomize-operator-kind-definitions";
    assert_eq!(
        find(&with, "ClusterRole", role),
        find(&deploy_documents(), "ClusterRole", role),
        "overlays/locked-down/kind-definitions/rbac.yaml is not deploy/rbac/kind-definitions.yaml's role"
    );
    assert!(binds_operator(find(&with, "ClusterRoleBinding", role)));
    assert_eq!(env_var(&with, "SERVE_KIND_DEFINITIONS"), None);
    assert_eq!(crd_rights(&with).keys().collect::<Vec<_>>(), [role]);
    // ... and the Role keeping the definitions' revisions, the same as
    // deploy/'s. Otherwise the two are the same install.
    let revisions = "kustomize-operator-revisions";
    for kind in ["Role", "RoleBinding"] {
        assert_eq!(
            find(&with, kind, revisions),
            find(&deploy_documents(), kind, revisions)
        );
    }
    let others = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| d["metadata"]["name"] != role && d["kind"] != "Deployment")
            .filter(|d| d["metadata"]["name"] != revisions)
            .cloned()
            .collect()
    };
    assert_eq!(others(&locked), others(&with));
}

/// The NetworkPolicy of the operator's Pods: ingress only to the metrics
/// port, egress only to DNS and the API server's ports (any address but
/// the link-local range, where cloud metadata services answer).
#[test]
fn the_operators_pods_reach_only_dns_and_the_api_server() {
    let docs = deploy_documents();
    let policy = find(&docs, "NetworkPolicy", "kustomize-operator");
    let deployment = find(&docs, "Deployment", "kustomize-operator");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &pod_labels[k], v,
            "the policy does not select the operator's Pods"
        );
    }
    assert_eq!(policy["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert_eq!(
        policy["spec"]["ingress"],
        serde_json::json!([{"ports": [{"port": 8080, "protocol": "TCP"}]}])
    );
    let egress = policy["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 2, "{egress:#?}");
    assert_eq!(
        egress[0],
        serde_json::json!({"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]})
    );
    assert_eq!(
        egress[1]["ports"],
        serde_json::json!([{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}])
    );
    assert_eq!(
        egress[1]["to"],
        serde_json::json!([
            {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}},
            {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}},
        ])
    );
}

/// The binary's allocator is jemalloc with the options `main.rs` gives it
/// (no thread caches, one arena, freed pages handed back by a background
/// thread):
/// jemalloc itself confirms where each option came from.
#[cfg(feature = "jemalloc")]
#[test]
fn the_binary_allocates_with_jemalloc_as_configured() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kustomize-operator"))
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "confirm_conf:true")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let from_binary = stderr
        .lines()
        .find(|line| line.contains("global variable malloc_conf"))
        .unwrap_or_else(|| panic!("jemalloc did not read the binary's options:\n{stderr}"));
    for option in ["tcache:false", "narenas:1", "background_thread:true"] {
        assert!(from_binary.contains(option), "{option} in {from_binary}");
    }
}

/// Runs `hack/check-imports` on a copy of `src/` with `line` appended to
/// the file `file` (relative to `src/`); returns (passed, what it printed).
fn check_imports_with(file: &str, line: &str) -> (bool, String) {
    let copy = tempfile::tempdir().unwrap();
    let src = copy.path().join("src");
    copy_tree(&common::repo().join("src"), &src);
    if !file.is_empty() {
        let path = src.join(file);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(line);
        std::fs::write(&path, text).unwrap();
    }
    let out = std::process::Command::new(common::repo().join("hack/check-imports"))
        .arg(&src)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), printed)
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn check_imports_passes_the_tree_and_fails_each_rule_broken() {
    let (ok, printed) = check_imports_with("", "");
    assert!(ok, "the repository's src/ must pass: {printed}");
    let cases = [
        // model/ names live/, a layer above it.
        (
            "engine/model/status.rs",
            "\nuse crate::engine::live::health;\n",
            "layer order: src/engine/model/status.rs",
        ),
        // the kubectl runner, a leaf outside the engine, names its root.
        (
            "kubectl.rs",
            "\nuse crate::engine::Engine;\n",
            "boundary: src/kubectl.rs",
        ),
        // a kind names an engine path past its door (src/kind.rs).
        (
            "kinds/copyrator/plan.rs",
            "\nuse crate::engine::model::status::MESSAGE_LIMIT;\n",
            "boundary: src/kinds/copyrator/plan.rs",
        ),
        // the engine names the kinds' door (the contract is its own leaf).
        (
            "engine/reconcile/steps.rs",
            "\nuse crate::kind::Handler as _;\n",
            "boundary: src/engine/reconcile/steps.rs",
        ),
        // the engine names host code (its metrics are passed in).
        (
            "engine/reconcile/handled.rs",
            "\nuse crate::metrics::Metrics as _;\n",
            "boundary: src/engine/reconcile/handled.rs",
        ),
        // contract/ names reconcile/, above it.
        (
            "engine/contract/plan.rs",
            "\nuse crate::engine::reconcile::steps;\n",
            "layer order: src/engine/contract/plan.rs",
        ),
        // the engine's root names a stage (its own descendant, above it).
        (
            "engine/mod.rs",
            "\nuse crate::engine::reconcile::runtime::Engine as _;\n",
            "layer order: src/engine/mod.rs",
        ),
        // kubectl.rs names the kinds, which reach it through the engine.
        (
            "kubectl.rs",
            "\nuse crate::kinds::copyrator::plan;\n",
            "import cycle:",
        ),
        // the door widens by one name.
        (
            "engine/host.rs",
            "\npub(crate) use super::model::status::MESSAGE_LIMIT;\n",
            "facade: src/kind.rs and src/engine/host.rs re-export",
        ),
        // a name said through both doors.
        (
            "engine/host.rs",
            "\npub(crate) use super::model::status::CommonStatus;\n",
            "facade: CommonStatus is re-exported by both",
        ),
    ];
    for (file, line, expected) in cases {
        let (ok, printed) = check_imports_with(file, line);
        assert!(!ok, "{file} + {line:?} passed: {printed}");
        assert!(
            printed.contains(expected),
            "{file} + {line:?}: expected {expected:?} in {printed}"
        );
    }
}

/// With the conversion webhook, its port is open to any source (a policy
/// cannot name the API server); the patch docs/deploy.md shows
/// ("NetworkPolicy") narrows it to the addresses the API server calls from.
#[test]
fn the_webhooks_port_is_narrowed_by_the_documented_patch() {
    let docs = common::kustomize_documents("overlays/conversion-webhook");
    let policy = find(&docs, "NetworkPolicy", "kustomize-operator");
    assert_eq!(
        policy["spec"]["ingress"][1],
        serde_json::json!({"ports": [{"port": 9443, "protocol": "TCP"}]})
    );
    let dir = tempfile::tempdir().unwrap();
    // kustomize takes no absolute root: the overlay relative to the
    // kustomization, through the file system's root.
    let up = "../".repeat(dir.path().components().count() - 1);
    let overlay = common::repo().join("overlays/conversion-webhook");
    let overlay = format!("{up}{}", overlay.display()).replace("//", "/");
    let kustomization = format!(
        r#"resources: ["{}"]
patches:
  - target: {{kind: NetworkPolicy, name: kustomize-operator}}
    patch: |
      - op: add
        path: /spec/ingress/1/from
        value: [{{ipBlock: {{cidr: 10.0.0.5/32}}}}]
"#,
        overlay
    );
    std::fs::write(dir.path().join("kustomization.yaml"), kustomization).unwrap();
    let docs = common::kustomize_documents(&dir.path().display().to_string());
    let policy = find(&docs, "NetworkPolicy", "kustomize-operator");
    assert_eq!(
        policy["spec"]["ingress"][1],
        serde_json::json!({
            "ports": [{"port": 9443, "protocol": "TCP"}],
            "from": [{"ipBlock": {"cidr": "10.0.0.5/32"}}],
        })
    );
}
