//! Bad input, property-based, for every kind: any spec the API server would
//! accept (the generators follow each CRD's schema, including what it leaves
//! open) renders an overlay that the real `kubectl kustomize` accepts and that
//! does what the kind promises, or yields a clear error; nothing panics.
//!
//! Rendering goes through the same path as `kustomize-operator render`: the
//! resource, then the documents describing the cluster it would see. Every
//! overlay the engine builds in process (without kubectl) must build to
//! exactly what `kubectl kustomize` prints for it.

use ko_test_support as common;

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ObjectMeta;
use kustomize_operator::kind::{KustomizeDir, ObjectId, Overlay, Step};
use kustomize_operator::kinds::chaos_agent::MAX_REPLICAS;
use kustomize_operator::kinds::copyrator::marker;
use kustomize_operator::kinds::exchange_rate::config_map_name;
use kustomize_operator::kinds::{KindOptions, RenderError};
use proptest::prelude::*;
use serde_json::{Value, json};

/// 24 cases per property by default (each runs `kubectl kustomize`);
/// `PROPTEST_CASES=500` explores further.
fn config() -> ProptestConfig {
    if std::env::var_os("PROPTEST_CASES").is_some() {
        ProptestConfig::default()
    } else {
        ProptestConfig::with_cases(24)
    }
}

fn kustomize_dir() -> KustomizeDir {
    common::kustomize_dirs()
}

/// What rendering `resource` (followed by `rest`) and building each of its
/// overlays with `kubectl kustomize` gave: the built objects, the plan's
/// kind-specific status, and the objects it deletes without owning them;
/// or the handler's error.
/// One object `kubectl kustomize` printed, read through types where it
/// matters: a label or data value is text even when it looks like a number
/// (as kubectl reads it), whatever a schema-less YAML reader would guess.
#[derive(serde::Deserialize)]
struct PrintedObject {
    kind: String,
    metadata: ObjectMeta,
    #[serde(default)]
    data: Option<BTreeMap<String, String>>,
    #[serde(default)]
    spec: Value,
}

struct Built {
    objects: Vec<Value>,
    status: serde_json::Map<String, Value>,
    deletes: Vec<ObjectId>,
    /// Overlays the engine builds in process (without kubectl), each
    /// checked equal to what `kubectl kustomize` printed.
    built_in_process: usize,
}

fn build(resource: &Value, rest: &[Value]) -> Result<Built, RenderError> {
    let kind = common::kind_of(resource);
    let out = kind.render(resource, rest, &KindOptions::default(), &kustomize_dir())?;
    let mut objects = Vec::new();
    let mut deletes = Vec::new();
    let mut built_in_process = 0;
    for (step, overlay) in out.steps.iter().zip(&out.overlays) {
        if let Step::DeleteForeign { objects } = step {
            deletes.extend(objects.iter().cloned());
        }
        let Some(overlay) = overlay else { continue };
        let dir = tempfile::tempdir().unwrap();
        overlay.write_to(dir.path()).unwrap();
        let (ok, built, err) = common::kubectl(&["kustomize", &dir.path().display().to_string()]);
        assert!(
            ok,
            "kubectl kustomize refused the overlay of {resource}: {err}"
        );
        if let (Some(native), false) = (overlay.prebuilt(), overlay.is_plain()) {
            let printed: Vec<Value> = serde_saphyr::from_multiple(&built).unwrap();
            let printed: Vec<Value> = printed.into_iter().filter(|d| !d.is_null()).collect();
            assert_eq!(
                native,
                printed.as_slice(),
                "the overlay of {resource} built in process differs from kubectl kustomize"
            );
            built_in_process += 1;
        }
        let docs: Vec<Option<PrintedObject>> = serde_saphyr::from_multiple(&built).unwrap();
        objects.extend(docs.into_iter().flatten().map(|d| {
            json!({"kind": d.kind, "metadata": d.metadata, "data": d.data.unwrap_or_default(), "spec": d.spec})
        }));
    }
    Ok(Built {
        objects,
        status: match out.status {
            Some(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        },
        deletes,
        built_in_process,
    })
}

/// DNS-1123 labels, as the API server accepts for namespaces.
fn dns_label() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9-]{0,61}[a-z0-9])?"
}

/// DNS-1123 subdomains, as the API server accepts for most object names.
fn dns_subdomain() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9.-]{0,120}[a-z0-9])?".prop_filter("no empty segments", |s| {
        !s.contains("..") && !s.contains(".-") && !s.contains("-.")
    })
}

/// Label values (the pattern every kind's schema and the API server use).
fn label_value() -> impl Strategy<Value = String> {
    "([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
}

/// Label keys: mostly valid ones, sometimes any printable text (a map key
/// the schema cannot constrain).
fn label_key() -> impl Strategy<Value = String> {
    let name = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?";
    prop_oneof![
        4 => (proptest::option::of("[a-z]([a-z0-9-]{0,10}[a-z0-9])?(\\.[a-z]{2,5})?"), name)
            .prop_map(|(prefix, name)| match prefix {
                Some(p) => format!("{p}/{name}"),
                None => name,
            }),
        1 => "[ -~]{1,20}",
    ]
}

/// ConfigMap and Secret data keys.
fn data_key() -> impl Strategy<Value = String> {
    "[-._a-zA-Z0-9]{1,40}".prop_filter("not . or ..", |k| k != "." && k != "..")
}

/// Any text a ConfigMap value may hold: newlines, quotes, YAML and Tera
/// syntax, non-ASCII, control characters.
fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(?s).{0,60}",
        Just(String::new()),
        Just("{{ x }} {% if %} ${VAR} 'q' \"dq\" : - # &a *a !tag".to_string()),
        Just("true".to_string()),
        Just("0x1F".to_string()),
        Just(" leading and trailing \n".to_string()),
    ]
}

// ---------------------------------------------------------------- Sample

proptest! {
    #![proptest_config(config())]

    #[test]
    fn accepted_samples_build_or_fail_clearly(
        name in dns_subdomain(),
        namespace in dns_label(),
        count in 0..=1000i32,
    ) {
        let sample = json!({
            "apiVersion": "nuvolaris.org/v1",
            "kind": "Sample",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"count": count},
        });
        let built = match build(&sample, &[]) {
            Ok(built) => built,
            Err(e) => {
                // The one thing the schema cannot catch: a name too long for a label.
                prop_assert!(name.len() > 63, "unexpected refusal: {e}");
                prop_assert!(e.to_string().contains("at most 63"), "unclear: {e}");
                return Ok(());
            }
        };
        prop_assert_eq!(built.built_in_process, 1, "a Sample's overlay is built in process");
        let docs = built.objects;
        prop_assert_eq!(docs.len(), 1);
        prop_assert_eq!(&docs[0]["metadata"]["name"], &Value::from(name.clone()));
        prop_assert_eq!(&docs[0]["metadata"]["namespace"], &Value::from(namespace));
        prop_assert_eq!(&docs[0]["spec"]["replicas"], &Value::from(count));
        prop_assert_eq!(
            &docs[0]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
            &Value::from(name)
        );
    }
}

// ---------------------------------------------------------- ExchangeRate

/// `refreshInterval` values the schema's pattern accepts.
fn refresh_interval() -> impl Strategy<Value = String> {
    let n = "[0-9]{1,6}";
    prop_oneof![
        (n, proptest::option::of(n), proptest::option::of(n)).prop_map(|(h, m, s)| format!(
            "{h}h{}{}",
            m.map(|m| format!("{m}m")).unwrap_or_default(),
            s.map(|s| format!("{s}s")).unwrap_or_default()
        )),
        (n, proptest::option::of(n))
            .prop_map(|(m, s)| format!("{m}m{}", s.map(|s| format!("{s}s")).unwrap_or_default())),
        n.prop_map(|s| format!("{s}s")),
    ]
}

/// A rate as a provider reports it (the status stores it as text).
fn rate() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u32..100_000, 0u32..10_000).prop_map(|(i, f)| format!("{i}.{f}")),
        (1u64..u64::MAX).prop_map(|i| i.to_string()),
        Just("1e-7".to_string()),
    ]
}

fn fetched_at() -> impl Strategy<Value = String> {
    (0i64..4_000_000_000).prop_map(|s| jiff::Timestamp::from_second(s).unwrap().to_string())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn accepted_exchange_rates_build_a_config_map_named_as_status_says(
        name in dns_subdomain(),
        namespace in dns_label(),
        currency in "[A-Z]{3}",
        base in proptest::option::of("[A-Z]{3}"),
        interval in proptest::option::of(refresh_interval()),
        rate in rate(),
        fetched_at in fetched_at(),
        uid in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    ) {
        let mut spec = json!({"currency": currency});
        if let Some(base) = &base {
            spec["base"] = json!(base);
        }
        if let Some(interval) = &interval {
            spec["refreshInterval"] = json!(interval);
        }
        let er = json!({
            "apiVersion": "operators.brennerm.github.io/v1",
            "kind": "ExchangeRate",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
            "spec": spec,
            "status": {"rate": rate, "fetchedAt": fetched_at, "base": base.clone().unwrap_or("EUR".into())},
        });
        let built = match build(&er, &[]) {
            Ok(built) => built,
            Err(e) => {
                // What the pattern allows and the handler refuses: intervals
                // under the minimum, or too large to represent.
                let message = e.to_string();
                prop_assert!(interval.is_some(), "unexpected refusal: {message}");
                prop_assert!(message.contains("refreshInterval"), "unclear: {message}");
                return Ok(());
            }
        };
        prop_assert_eq!(built.objects.len(), 1);
        let cm = &built.objects[0];
        prop_assert_eq!(&cm["kind"], "ConfigMap");
        prop_assert_eq!(&cm["metadata"]["namespace"], &Value::from(namespace));
        // The name the operator records is the one kustomize generated.
        prop_assert_eq!(&cm["metadata"]["name"], &built.status["configMapName"]);
        prop_assert_eq!(&cm["data"]["rate"], &Value::from(rate.clone()));
        prop_assert_eq!(&cm["data"]["currency"], &Value::from(currency));
        prop_assert_eq!(&cm["metadata"]["ownerReferences"][0]["uid"], &Value::from(uid));
        let data: BTreeMap<String, String> = serde_json::from_value(cm["data"].clone()).unwrap();
        prop_assert_eq!(Value::from(config_map_name(&name, &data)), cm["metadata"]["name"].clone());
    }
}

// -------------------------------------------------------------- ChaosAgent

#[derive(Debug, Clone)]
struct Cluster {
    namespaces: Vec<String>,
    pods: Vec<(usize, String)>,
    deployments: Vec<(usize, String, Option<i32>)>,
    config_maps: Vec<(usize, String, bool, BTreeMap<String, String>)>,
}

impl Cluster {
    fn documents(&self) -> Vec<Value> {
        let ns = |i: &usize| self.namespaces[*i % self.namespaces.len()].clone();
        let mut docs = Vec::new();
        for (i, name) in &self.pods {
            docs.push(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns(i)}}));
        }
        for (i, name, replicas) in &self.deployments {
            let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns(i)},
                "spec": {"selector": {"matchLabels": {"app": "x"}},
                         "template": {"metadata": {"labels": {"app": "x"}}}}});
            if let Some(r) = replicas {
                d["spec"]["replicas"] = json!(r);
            }
            docs.push(d);
        }
        for (i, name, immutable, data) in &self.config_maps {
            docs.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns(i)},
                "immutable": immutable, "data": data}));
        }
        docs
    }
}

fn cluster() -> impl Strategy<Value = Cluster> {
    let namespaces = prop::collection::btree_set(
        prop_oneof![3 => dns_label(), 1 => Just("kube-system".to_string())],
        1..5,
    )
    .prop_map(|s| s.into_iter().collect::<Vec<_>>());
    let pods = prop::collection::vec((0usize..8, dns_subdomain()), 0..6);
    let deployments = prop::collection::vec(
        (0usize..8, dns_label(), proptest::option::of(0..=200i32)),
        0..6,
    );
    let config_maps = prop::collection::vec(
        (
            0usize..8,
            dns_subdomain(),
            any::<bool>(),
            prop::collection::btree_map(data_key(), any_text(), 0..4),
        ),
        0..6,
    );
    (namespaces, pods, deployments, config_maps).prop_map(
        |(namespaces, mut pods, mut deployments, mut config_maps)| {
            // One object per namespace and name, as in a real cluster.
            let n = namespaces.len();
            let mut seen = BTreeSet::new();
            pods.retain(|(i, name)| seen.insert((i % n, name.clone())));
            seen.clear();
            deployments.retain(|(i, name, _)| seen.insert((i % n, name.clone())));
            seen.clear();
            config_maps.retain(|(i, name, _, _)| seen.insert((i % n, name.clone())));
            Cluster {
                namespaces,
                pods,
                deployments,
                config_maps,
            }
        },
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn accepted_chaos_agents_build_a_round_that_stays_in_bounds(
        name in dns_subdomain(),
        modes in (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        eagerness in 1..=100i32,
        pod_tolerance in 0..10i32,
        max_actions in 1..=100i32,
        seed in any::<i64>(),
        scope in proptest::option::of(0usize..8),
        excluded in prop::collection::vec("[ -~]{0,12}", 0..3),
        cluster in cluster(),
    ) {
        let (tantrum, cancer, ipsum, dry_run) = modes;
        let docs = cluster.documents();
        let scope = scope.map(|i| cluster.namespaces[i % cluster.namespaces.len()].clone());
        let mut labels = json!({});
        if let Some(ns) = &scope {
            labels["blackadder.io/namespace"] = json!(ns);
        }
        let mut excluded = excluded;
        if let Some(first) = cluster.namespaces.first() {
            excluded.push(first.clone());
        }
        let agent = json!({
            "apiVersion": "blackadder.io/v1beta1",
            "kind": "ChaosAgent",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "tantrumMode": tantrum, "cancerMode": cancer, "ipsumMode": ipsum,
                "dryRun": dry_run, "eagerness": eagerness, "podTolerance": pod_tolerance,
                "pauseDuration": 10, "maxActionsPerRound": max_actions, "seed": seed,
                "excludedNamespaces": excluded,
            },
        });
        let built = build(&agent, &docs).map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
        let touchable = |ns: &str| {
            ns != "kube-system"
                && !excluded.iter().any(|e| e == ns)
                && scope.as_deref().is_none_or(|s| s == ns)
        };
        let killed = built.deletes.len();
        let actions = built.objects.len() + killed;
        prop_assert!(actions <= usize::try_from(max_actions).unwrap(), "{actions} actions > {max_actions}");
        if dry_run {
            prop_assert!(built.objects.is_empty() && built.deletes.is_empty(), "a dry run changes nothing");
        }
        for pod in &built.deletes {
            prop_assert!(tantrum, "a kill without tantrumMode: {pod}");
            prop_assert_eq!(pod.kind.as_str(), "Pod");
            let ns = pod.namespace.as_deref().unwrap_or_default();
            prop_assert!(touchable(ns), "killed pods in {ns}: {pod}");
        }
        for object in &built.objects {
            let ns = object["metadata"]["namespace"].as_str().unwrap_or_default();
            prop_assert!(touchable(ns), "touched {object}");
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            match object["kind"].as_str() {
                Some("Deployment") => {
                    prop_assert!(cancer);
                    let (_, _, before) = cluster.deployments.iter()
                        .find(|(i, n, _)| n == name && cluster.namespaces[*i % cluster.namespaces.len()] == ns)
                        .unwrap();
                    let before = before.unwrap_or(1);
                    let after = object["spec"]["replicas"].as_i64().unwrap();
                    prop_assert!(before < MAX_REPLICAS, "scaled {name} beyond {MAX_REPLICAS}");
                    prop_assert_eq!(after, i64::from((before.max(0) * 2).clamp(1, MAX_REPLICAS)));
                }
                Some("ConfigMap") => {
                    prop_assert!(ipsum);
                    let (_, _, immutable, data) = cluster.config_maps.iter()
                        .find(|(i, n, _, _)| n == name && cluster.namespaces[*i % cluster.namespaces.len()] == ns)
                        .unwrap();
                    prop_assert!(!immutable, "rewrote an immutable ConfigMap");
                    let keys: BTreeSet<&String> = object["data"].as_object().unwrap().keys().collect();
                    prop_assert_eq!(keys, data.keys().collect::<BTreeSet<_>>());
                }
                other => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}

// ----------------------------------------------------------- CopyratorRule

#[derive(Debug, Clone)]
struct Source {
    name: String,
    matching: bool,
    labels: BTreeMap<String, String>,
    data: BTreeMap<String, String>,
}

fn sources() -> impl Strategy<Value = Vec<Source>> {
    let unique = |sources: Vec<Source>| {
        let mut seen = BTreeSet::new();
        sources
            .into_iter()
            .filter(|s| seen.insert(s.name.clone()))
            .collect()
    };
    prop::collection::vec(
        (
            dns_subdomain(),
            any::<bool>(),
            prop::collection::btree_map(
                "[a-z]([a-z0-9.-]{0,8}[a-z0-9])?/[a-z]{1,8}".prop_filter("segments", |k| {
                    !k.contains("..") && !k.contains(".-") && !k.contains("-.")
                }),
                label_value(),
                0..3,
            ),
            prop::collection::btree_map(data_key(), any_text(), 0..4),
        )
            .prop_map(|(name, matching, labels, data)| Source {
                name,
                matching,
                labels,
                data,
            }),
        0..5,
    )
    .prop_map(unique)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn accepted_copyrator_rules_copy_exactly_the_sources_or_fail_clearly(
        name in dns_subdomain(),
        namespace in dns_label(),
        secret in any::<bool>(),
        selector in prop::collection::btree_map(label_key(), label_value(), 1..4),
        listed in prop::collection::vec(dns_label(), 0..4),
        others in prop::collection::btree_set(dns_label(), 0..4),
        top_level in any::<bool>(),
        source_namespace in proptest::option::of(prop_oneof![Just(None), dns_label().prop_map(Some)]),
        retain in any::<bool>(),
        sources in sources(),
    ) {
        let kind = if secret { "Secret" } else { "ConfigMap" };
        let mut fields = json!({
            "ruleType": if secret { "secret" } else { "configmap" },
            "selector": selector,
            "deletionPolicy": if retain { "Retain" } else { "Delete" },
        });
        if !listed.is_empty() {
            fields["namespaces"] = json!(listed);
        }
        let mut rule = json!({
            "apiVersion": "flant.com/v1",
            "kind": "CopyratorRule",
            "metadata": {"name": name, "namespace": namespace},
        });
        if top_level {
            for (k, v) in fields.as_object().unwrap() {
                rule[k] = v.clone();
            }
        } else {
            rule["spec"] = fields;
        }
        if let Some(source_namespace) = &source_namespace {
            rule["namespace"] = json!(source_namespace.clone().unwrap_or(namespace.clone()));
        }
        // What the API server stores: Secret data is base64 (the text's
        // bytes as hex digits, valid base64), ConfigMap data the text.
        let stored_data = |s: &Source| -> BTreeMap<String, String> {
            if secret {
                s.data.iter().map(|(k, v)| (k.clone(), hex_as_base64(v))).collect()
            } else {
                s.data.clone()
            }
        };
        let mut docs: Vec<Value> = others
            .iter()
            .chain([&namespace])
            .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .collect();
        for s in &sources {
            let mut labels = s.labels.clone();
            if s.matching {
                labels.extend(selector.clone());
            }
            docs.push(json!({"apiVersion": "v1", "kind": kind,
                "metadata": {"name": s.name, "namespace": namespace, "labels": labels},
                "data": stored_data(s)}));
        }
        let built = match build(&rule, &docs) {
            Ok(built) => built,
            Err(e) => {
                let message = e.to_string();
                let bad_key = selector.keys().any(|k| !kustomize_operator::label::is_key(k) || k.starts_with(marker::PREFIX));
                let other_namespace = matches!(&source_namespace, Some(Some(ns)) if *ns != namespace);
                prop_assert!(bad_key || other_namespace, "unexpected refusal: {message}");
                prop_assert!(
                    message.contains("selector key") || message.contains("top-level namespace"),
                    "unclear: {message}"
                );
                return Ok(());
            }
        };
        let targets: BTreeSet<String> = if listed.is_empty() {
            others.iter().filter(|ns| **ns != namespace).cloned().collect()
        } else {
            listed.iter().filter(|ns| **ns != namespace).cloned().collect()
        };
        // Sources that match (the selector's labels win over the source's
        // own); a ConfigMap value kustomize cannot carry is reported instead.
        let matching: Vec<&Source> = sources
            .iter()
            .filter(|s| s.matching || selector.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect();
        let refused = |s: &Source| !secret && s.data.values().any(|v| v.chars().any(Overlay::kustomize_refuses));
        let wanted: BTreeMap<&str, &Source> = matching
            .iter()
            .filter(|s| !refused(s))
            .map(|s| (s.name.as_str(), *s))
            .collect();
        let reported = built.status.get("notCopyable").and_then(Value::as_array).map_or(0, Vec::len);
        prop_assert_eq!(reported, matching.iter().filter(|s| refused(s)).count());
        let mut copies = BTreeSet::new();
        for object in &built.objects {
            prop_assert_eq!(&object["kind"], kind);
            let ns = object["metadata"]["namespace"].as_str().unwrap().to_string();
            let copy_name = object["metadata"]["name"].as_str().unwrap().to_string();
            prop_assert!(targets.contains(&ns), "copy in {ns}, targets {targets:?}");
            let source = wanted.get(copy_name.as_str());
            prop_assert!(source.is_some(), "copy of an unwanted {copy_name}");
            let data: BTreeMap<String, String> = serde_json::from_value(object["data"].clone()).unwrap();
            prop_assert_eq!(data, stored_data(source.unwrap()), "data of {}/{} changed on the way", ns, copy_name);
            for (key, value) in object["metadata"]["labels"].as_object().unwrap() {
                prop_assert!(kustomize_operator::label::is_key(key), "label key {key:?}");
                prop_assert!(kustomize_operator::label::is_value(value.as_str().unwrap()), "label {key}={value}");
            }
            copies.insert((ns, copy_name));
        }
        // Every wanted source is in every target namespace, once.
        prop_assert_eq!(built.objects.len(), copies.len());
        prop_assert_eq!(copies.len(), wanted.len() * targets.len());
    }
}

/// Valid base64 made from `text`: its bytes as lowercase hex digits, padded
/// to a multiple of four characters.
fn hex_as_base64(text: &str) -> String {
    let mut s = hex_encode(text.as_bytes());
    while !s.len().is_multiple_of(4) {
        s.push('A');
    }
    s
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ------------------------------------------------------- declared kinds

/// Values that follow an OpenAPI schema as a CRD declares it: strings
/// (within `maxLength`, or one of `enum`), integers (within `minimum` and
/// `maximum`), booleans, objects (required properties always, optional ones
/// sometimes); anything else as a string.
fn from_schema(schema: &Value) -> BoxedStrategy<Value> {
    if let Some(choices) = schema["enum"].as_array().filter(|c| !c.is_empty()) {
        return proptest::sample::select(choices.clone()).boxed();
    }
    match schema["type"].as_str() {
        Some("integer") => {
            let min = schema["minimum"].as_i64().unwrap_or(-1_000_000);
            let max = schema["maximum"].as_i64().unwrap_or(1_000_000);
            (min..=max).prop_map(Value::from).boxed()
        }
        Some("boolean") => any::<bool>().prop_map(Value::from).boxed(),
        Some("object") => object_from_schema(schema),
        _ => {
            let max = schema["maxLength"].as_u64().unwrap_or(300) as usize;
            let min = schema["minLength"].as_u64().unwrap_or(0) as usize;
            any_text()
                .prop_map(move |t| t.chars().take(max).collect::<String>())
                .prop_filter("minLength", move |t| t.chars().count() >= min)
                .prop_map(Value::from)
                .boxed()
        }
    }
}

fn object_from_schema(schema: &Value) -> BoxedStrategy<Value> {
    let required: BTreeSet<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let properties: Vec<(String, bool, BoxedStrategy<Value>)> = schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, s)| {
            (
                name.clone(),
                required.contains(name.as_str()),
                from_schema(s),
            )
        })
        .collect();
    properties
        .into_iter()
        .fold(
            Just(serde_json::Map::new()).boxed(),
            |acc, (name, needed, value)| {
                let value = if needed {
                    value.prop_map(Some).boxed()
                } else {
                    proptest::option::of(value).boxed()
                };
                (acc, value)
                    .prop_map(move |(mut map, v)| {
                        if let Some(v) = v {
                            map.insert(name.clone(), v);
                        }
                        map
                    })
                    .boxed()
            },
        )
        .prop_map(Value::Object)
        .boxed()
}

/// Every declared kind of the repo and of the test fixtures.
fn declared_kinds() -> Vec<std::sync::Arc<kustomize_operator::kinds::declared::DeclaredKind>> {
    kustomize_operator::kinds::registry::Registry::load(&kustomize_dir())
        .unwrap()
        .all()
        .iter()
        .filter_map(|k| k.declared().cloned())
        .collect()
}

/// A resource of `kind` named `name` (in `namespace` when namespaced) with
/// a spec that follows its schema.
fn declared_resource() -> impl Strategy<Value = (Value, String)> {
    let kinds = declared_kinds();
    assert!(kinds.len() >= 3, "sample, webapp, tenant");
    proptest::sample::select(kinds)
        .prop_flat_map(|kind| {
            let spec = from_schema(&kind.file.spec.schema);
            (Just(kind), spec, dns_subdomain(), dns_label())
        })
        .prop_map(|(kind, spec, name, namespace)| {
            let mut metadata = json!({"name": name});
            if kind.namespaced() {
                metadata["namespace"] = json!(namespace);
            }
            let resource = json!({
                "apiVersion": kind.resource.api_version,
                "kind": kind.resource.kind,
                "metadata": metadata,
                "spec": spec,
            });
            (resource, kind.name().to_string())
        })
}

proptest! {
    #![proptest_config(config())]

    /// A spec the schema allows builds (or is refused as an invalid spec,
    /// naming what), and a namespaced kind's objects all land in the
    /// resource's namespace.
    #[test]
    fn declared_kinds_build_what_their_schema_allows_and_stay_in_their_namespace(
        (resource, kind) in declared_resource()
    ) {
        let built = match build(&resource, &[]) {
            Ok(built) => built,
            Err(e) if e.unrendered().is_some() => {
                let e = e.unrendered().expect("why it did not render");
                // What a schema cannot say: a name too long for a label, a
                // character kustomize cannot carry.
                prop_assert!(e.is_permanent(), "{kind}: {e}");
                let clear = e.to_string().contains("at most 63")
                    || e.to_string().contains("a character kustomize cannot carry");
                prop_assert!(clear, "{kind}: unclear: {e}");
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(format!("{kind}: {e}"))),
        };
        prop_assert!(!built.objects.is_empty(), "{kind}: nothing built");
        if let Some(namespace) = resource["metadata"]["namespace"].as_str() {
            for object in &built.objects {
                prop_assert_eq!(
                    object["metadata"]["namespace"].as_str(),
                    Some(namespace),
                    "{}: {} escaped its namespace", kind, object["metadata"]["name"]
                );
            }
        }
    }
}
