//! The generated files are current: the CRDs under deploy/crds are those the
//! Rust types and the kind files generate, and each declared kind's RBAC
//! under deploy/rbac is what `rbac --bind` derives (one ClusterRole, bound to
//! the install's ServiceAccount, not labelled for aggregation). `hack/generate`
//! rewrites them.

use ko_test_support as common;

use clap::Parser;
use kustomize_operator::cli::{Cli, Command};
use kustomize_operator::kinds::declared::rbac::AGGREGATE_LABEL;

/// Parses a `kustomize-operator` command line with the repo's kustomize dir.
fn command(args: &[&str]) -> Command {
    let kustomize = common::repo().join("kustomize");
    let mut argv = vec!["kustomize-operator"];
    argv.extend_from_slice(args);
    argv.extend(["--kustomize-dir", kustomize.to_str().unwrap()]);
    Cli::try_parse_from(argv).unwrap().command
}

#[test]
fn committed_crds_are_current() {
    let dir = common::repo().join("deploy/crds");
    let Command::Crd(args) = command(&["crd"]) else {
        unreachable!()
    };
    let crds = kustomize_operator::manifests::crds_yaml(&args).unwrap();
    assert!(
        crds.iter().any(|(name, _)| name == "samples.nuvolaris.org"),
        "the declared Sample's CRD is generated"
    );
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    for (name, yaml) in crds {
        let path = dir.join(format!("{name}.yaml"));
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run hack/generate", path.display()));
        assert!(
            committed == yaml,
            "{} is out of date; run hack/generate",
            path.display()
        );
        assert!(
            kustomization.contains(&format!("{name}.yaml")),
            "deploy/crds/kustomization.yaml does not list {name}.yaml"
        );
    }
}

#[tokio::test]
async fn committed_rbac_of_declared_kinds_is_current() {
    let kubectl = common::kubectl_path();
    let account = "kustomize-operator-system/kustomize-operator";
    let Command::Rbac(args) = command(&[
        "rbac",
        "--kubectl",
        kubectl.to_str().unwrap(),
        "--bind",
        account,
    ]) else {
        unreachable!()
    };
    let generated = kustomize_operator::manifests::rbac_yaml(&args)
        .await
        .unwrap();
    assert!(generated.iter().any(|(kind, _)| kind == "sample"));
    for (kind, yaml) in generated {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        let [role, binding] = &docs[..] else {
            panic!("{kind}: one ClusterRole and its binding: {yaml}")
        };
        assert_eq!(role["kind"], "ClusterRole", "{kind}");
        assert!(
            role["metadata"]["labels"][AGGREGATE_LABEL].is_null(),
            "{kind}: bound, not aggregated into the operator's role"
        );
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        let path = common::repo().join(format!("deploy/rbac/{kind}.yaml"));
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run hack/generate", path.display()));
        assert!(
            committed.trim_start_matches("---\n").trim_end() == yaml.trim_end(),
            "{} is out of date; run hack/generate",
            path.display()
        );
    }
}
