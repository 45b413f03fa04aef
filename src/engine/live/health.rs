//! Health of the objects a resource owns, by kstatus-like rules: is each
//! one *current* (what was applied is in effect), still in progress, or
//! failed? Rules read the state the watches keep (`status`, the
//! generation, `spec.replicas`); objects of kinds without a state worth
//! watching (ConfigMaps, Secrets, RBAC) are current as soon as they exist.

use serde_json::Value;

use crate::engine::model::inventory::ObjectId;

/// What an object's state says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Health {
    /// In effect.
    Current,
    /// Not yet: what is missing, in words (`1/3 replicas available`).
    InProgress(String),
    /// Its controller has not looked at this generation yet: nothing is
    /// known to be wrong, the first look is all that is missing.
    Unobserved(i64),
    /// It will not get there by itself.
    Failed(String),
}

/// The health of `id`, whose watched state is `state` (`None`: not seen).
pub(crate) fn assess(id: &ObjectId, state: Option<&Value>) -> Health {
    if super::watch::always_current(id) {
        return Health::Current;
    }
    let Some(object) = state else {
        return Health::InProgress("not seen yet".into());
    };
    if let Some(waiting) = generation_not_observed(id, object) {
        return waiting;
    }
    match (id.group(), id.kind.as_str()) {
        ("apps", "Deployment") => deployment(object),
        ("apps", "StatefulSet") => stateful_set(object),
        ("apps", "DaemonSet") => daemon_set(object),
        ("apps", "ReplicaSet") => replica_set(object),
        ("batch", "Job") => job(object),
        ("", "Pod") => pod(object),
        ("", "PersistentVolumeClaim") => claim(object),
        ("", "Service") => service(object),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => crd(object),
        (group, _) if is_custom(group) => custom(object),
        _ => generic(object),
    }
}

/// True for a group of custom resources: not the core group, not one of
/// the built-in single-word groups (`apps`, `batch`, `policy`), not one of
/// Kubernetes' own (`*.k8s.io`).
fn is_custom(group: &str) -> bool {
    group.contains('.') && !group.ends_with(".k8s.io") && group != "k8s.io"
}

/// A custom resource is current only when it says so: its `Ready`
/// condition is true, or (without one) its controller reports having seen
/// its generation (checked before, in [`generation_not_observed`]). One
/// with no status yet is in progress: its controller has not looked.
fn custom(o: &Value) -> Health {
    if condition(o, "Ready").is_some() || condition(o, "Stalled").is_some() {
        return generic(o);
    }
    if o["status"]["observedGeneration"].is_i64() {
        return generic(o);
    }
    Health::InProgress(
        "no Ready condition and no observed generation yet: waiting for its controller".into(),
    )
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// The condition of `type_`: (status, reason, message).
fn condition<'a>(object: &'a Value, type_: &str) -> Option<(&'a str, &'a str, &'a str)> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default(),
            )
        })
}

/// In progress while the object's controller has not seen its latest
/// generation. The workloads' controllers always report the generation they
/// saw, so one without any report is not observed yet either (a Deployment
/// of 0 replicas would otherwise pass every other check unseen); other
/// kinds may never report it.
fn generation_not_observed(id: &ObjectId, object: &Value) -> Option<Health> {
    let generation = object["metadata"]["generation"].as_i64()?;
    let observed = match object["status"]["observedGeneration"].as_i64() {
        Some(observed) => observed,
        None if reports_observed_generation(id) => 0,
        None => return None,
    };
    (observed < generation).then_some(Health::Unobserved(generation))
}

/// Kinds whose controller always writes `status.observedGeneration`.
fn reports_observed_generation(id: &ObjectId) -> bool {
    id.group() == "apps"
        && matches!(
            id.kind.as_str(),
            "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet"
        )
}

fn deployment(d: &Value) -> Health {
    if let Some(("False", "ProgressDeadlineExceeded", message)) = condition(d, "Progressing") {
        return Health::Failed(format!("progress deadline exceeded: {message}"));
    }
    let wanted = d["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &d["status"];
    let updated = int(&status["updatedReplicas"]);
    let available = int(&status["availableReplicas"]);
    let total = int(&status["replicas"]);
    if updated < wanted {
        return Health::InProgress(format!("{updated}/{wanted} replicas updated"));
    }
    if total > updated {
        return Health::InProgress(format!("{} old replicas terminating", total - updated));
    }
    if available < wanted {
        return Health::InProgress(format!("{available}/{wanted} replicas available"));
    }
    Health::Current
}

fn stateful_set(s: &Value) -> Health {
    let wanted = s["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &s["status"];
    let ready = int(&status["readyReplicas"]);
    let updated = int(&status["updatedReplicas"]);
    if updated < wanted {
        return Health::InProgress(format!("{updated}/{wanted} replicas updated"));
    }
    if ready < wanted {
        return Health::InProgress(format!("{ready}/{wanted} replicas ready"));
    }
    if status["currentRevision"] != status["updateRevision"] {
        return Health::InProgress("rolling out the update revision".into());
    }
    Health::Current
}

fn daemon_set(d: &Value) -> Health {
    let status = &d["status"];
    let desired = int(&status["desiredNumberScheduled"]);
    let updated = int(&status["updatedNumberScheduled"]);
    let available = int(&status["numberAvailable"]);
    if updated < desired {
        return Health::InProgress(format!("{updated}/{desired} pods updated"));
    }
    if available < desired {
        return Health::InProgress(format!("{available}/{desired} pods available"));
    }
    Health::Current
}

fn replica_set(r: &Value) -> Health {
    if let Some(("True", _, message)) = condition(r, "ReplicaFailure") {
        return Health::Failed(format!("replica failure: {message}"));
    }
    let wanted = r["spec"]["replicas"].as_i64().unwrap_or(1);
    let available = int(&r["status"]["availableReplicas"]);
    if available < wanted {
        return Health::InProgress(format!("{available}/{wanted} replicas available"));
    }
    Health::Current
}

fn job(j: &Value) -> Health {
    if let Some(("True", _, _)) = condition(j, "Complete") {
        return Health::Current;
    }
    if let Some(("True", reason, message)) = condition(j, "Failed") {
        return Health::Failed(format!("failed ({reason}): {message}"));
    }
    Health::InProgress(format!("{} pods succeeded", int(&j["status"]["succeeded"])))
}

fn pod(p: &Value) -> Health {
    match p["status"]["phase"].as_str().unwrap_or("Pending") {
        "Succeeded" => Health::Current,
        "Failed" => Health::Failed(
            p["status"]["reason"]
                .as_str()
                .unwrap_or("the pod failed")
                .to_string(),
        ),
        "Running" if matches!(condition(p, "Ready"), Some(("True", _, _))) => Health::Current,
        phase => Health::InProgress(format!("pod {phase}, not ready")),
    }
}

fn claim(c: &Value) -> Health {
    match c["status"]["phase"].as_str() {
        Some("Bound") => Health::Current,
        Some("Lost") => Health::Failed("the claim lost its volume".into()),
        phase => Health::InProgress(format!("claim {}", phase.unwrap_or("Pending"))),
    }
}

fn service(s: &Value) -> Health {
    if s["spec"]["type"] == "LoadBalancer"
        && s["status"]["loadBalancer"]["ingress"]
            .as_array()
            .is_none_or(Vec::is_empty)
    {
        return Health::InProgress("waiting for a load balancer address".into());
    }
    Health::Current
}

fn crd(c: &Value) -> Health {
    if let Some(("False", reason, message)) = condition(c, "NamesAccepted") {
        return Health::Failed(format!("names not accepted ({reason}): {message}"));
    }
    if super::crds::is_established(c) {
        return Health::Current;
    }
    match super::crds::established_at(c) {
        Some(Some(observed)) => Health::InProgress(format!(
            "established for generation {observed}, not yet for generation {}",
            c["metadata"]["generation"]
        )),
        _ => Health::InProgress("not established yet".into()),
    }
}

/// Custom resources and anything else: their `Stalled`, `Ready` and
/// `Reconciling` conditions, when they have them.
fn generic(o: &Value) -> Health {
    if let Some(("True", reason, message)) = condition(o, "Stalled") {
        return Health::Failed(format!("stalled ({reason}): {message}"));
    }
    if let Some(("True", reason, message)) = condition(o, "Reconciling") {
        return Health::InProgress(format!("reconciling ({reason}): {message}"));
    }
    match condition(o, "Ready") {
        Some(("False" | "Unknown", reason, message)) => {
            Health::InProgress(format!("not ready ({reason}): {message}"))
        }
        _ => Health::Current,
    }
}

/// The objects not current, with what each is waiting for; empty when all are.
pub(crate) fn summary(assessed: &[(ObjectId, Health)]) -> (Vec<String>, Vec<String>) {
    let mut waiting = Vec::new();
    let mut failed = Vec::new();
    for (id, health) in assessed {
        let name = format!("{}/{}", id.kind.to_lowercase(), id.name);
        match health {
            Health::Current => {}
            Health::InProgress(why) => waiting.push(format!("{name}: {why}")),
            Health::Unobserved(generation) => {
                waiting.push(format!("{name}: generation {generation} not observed yet"));
            }
            Health::Failed(why) => failed.push(format!("{name}: {why}")),
        }
    }
    (waiting, failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(api_version: &str, kind: &str) -> ObjectId {
        ObjectId {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: "web".into(),
        }
    }

    fn deployment_state(replicas: i64, updated: i64, available: i64, total: i64) -> Value {
        json!({
            "metadata": {"generation": 2},
            "spec": {"replicas": replicas},
            "status": {"observedGeneration": 2, "replicas": total, "updatedReplicas": updated,
                       "availableReplicas": available},
        })
    }

    #[test]
    fn a_deployment_is_current_once_every_replica_is_updated_and_available() {
        let d = id("apps/v1", "Deployment");
        assert_eq!(
            assess(&d, Some(&deployment_state(3, 3, 3, 3))),
            Health::Current
        );
        assert_eq!(
            assess(&d, Some(&deployment_state(3, 3, 1, 3))),
            Health::InProgress("1/3 replicas available".into())
        );
        assert_eq!(
            assess(&d, Some(&deployment_state(3, 1, 1, 3))),
            Health::InProgress("1/3 replicas updated".into())
        );
        assert_eq!(
            assess(&d, Some(&deployment_state(3, 3, 3, 4))),
            Health::InProgress("1 old replicas terminating".into())
        );
        let mut stale = deployment_state(3, 3, 3, 3);
        stale["status"]["observedGeneration"] = json!(1);
        assert_eq!(assess(&d, Some(&stale)), Health::Unobserved(2));
        let mut stuck = deployment_state(3, 3, 0, 3);
        stuck["status"]["conditions"] = json!([{"type": "Progressing", "status": "False",
            "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet web-1 has timed out"}]);
        assert!(matches!(assess(&d, Some(&stuck)), Health::Failed(_)));
        assert_eq!(assess(&d, None), Health::InProgress("not seen yet".into()));
        assert_eq!(
            assess(&d, Some(&deployment_state(0, 0, 0, 0))),
            Health::Current
        );
    }

    #[test]
    fn a_workload_its_controller_has_not_seen_is_in_progress_even_with_nothing_wanted() {
        let unseen = json!({"metadata": {"generation": 1}, "spec": {"replicas": 0}});
        for kind in ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"] {
            assert_eq!(
                assess(&id("apps/v1", kind), Some(&unseen)),
                Health::Unobserved(1),
                "{kind}"
            );
        }
        // A built-in kind whose controller never reports a generation is
        // judged by its other fields; a custom resource must say it is
        // ready (it has no rule of its own).
        let unreported = json!({"metadata": {"generation": 1}, "status": {}});
        assert_eq!(
            assess(
                &id("networking.k8s.io/v1", "NetworkPolicy"),
                Some(&unreported)
            ),
            Health::Current
        );
        assert!(matches!(
            assess(&id("example.com/v1", "Widget"), Some(&unreported)),
            Health::InProgress(_)
        ));
    }

    #[test]
    fn workloads_jobs_pods_and_claims() {
        let sts = json!({"spec": {"replicas": 2}, "status": {"readyReplicas": 1, "updatedReplicas": 2,
            "currentRevision": "a", "updateRevision": "a"}});
        assert_eq!(
            assess(&id("apps/v1", "StatefulSet"), Some(&sts)),
            Health::InProgress("1/2 replicas ready".into())
        );
        let ds = json!({"status": {"desiredNumberScheduled": 3, "updatedNumberScheduled": 3, "numberAvailable": 3}});
        assert_eq!(
            assess(&id("apps/v1", "DaemonSet"), Some(&ds)),
            Health::Current
        );
        let rs = json!({"spec": {"replicas": 2}, "status": {"availableReplicas": 2}});
        assert_eq!(
            assess(&id("apps/v1", "ReplicaSet"), Some(&rs)),
            Health::Current
        );
        let done = json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}});
        assert_eq!(assess(&id("batch/v1", "Job"), Some(&done)), Health::Current);
        let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}});
        assert!(matches!(
            assess(&id("batch/v1", "Job"), Some(&failed)),
            Health::Failed(_)
        ));
        let running = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(assess(&id("v1", "Pod"), Some(&running)), Health::Current);
        let pending = json!({"status": {"phase": "Pending"}});
        assert!(matches!(
            assess(&id("v1", "Pod"), Some(&pending)),
            Health::InProgress(_)
        ));
        let bound = json!({"status": {"phase": "Bound"}});
        assert_eq!(
            assess(&id("v1", "PersistentVolumeClaim"), Some(&bound)),
            Health::Current
        );
    }

    #[test]
    fn services_crds_custom_resources_and_plain_objects() {
        let lb = json!({"spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {}}});
        assert!(matches!(
            assess(&id("v1", "Service"), Some(&lb)),
            Health::InProgress(_)
        ));
        let cluster_ip = json!({"spec": {"type": "ClusterIP"}});
        assert_eq!(
            assess(&id("v1", "Service"), Some(&cluster_ip)),
            Health::Current
        );
        let crd = json!({"status": {"conditions": [{"type": "Established", "status": "True"}]}});
        assert_eq!(
            assess(
                &id("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
                Some(&crd)
            ),
            Health::Current
        );
        let changed = json!({"metadata": {"generation": 3}, "status": {"conditions": [
            {"type": "Established", "status": "True", "observedGeneration": 2}
        ]}});
        assert_eq!(
            assess(
                &id("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
                Some(&changed)
            ),
            Health::InProgress("established for generation 2, not yet for generation 3".into())
        );
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Waiting"}]}});
        assert!(matches!(
            assess(&id("example.com/v1", "Widget"), Some(&not_ready)),
            Health::InProgress(_)
        ));
        let stalled = json!({"status": {"conditions": [{"type": "Stalled", "status": "True"}]}});
        assert!(matches!(
            assess(&id("example.com/v1", "Widget"), Some(&stalled)),
            Health::Failed(_)
        ));
        assert!(
            matches!(
                assess(&id("example.com/v1", "Widget"), Some(&json!({}))),
                Health::InProgress(_)
            ),
            "a custom resource with no status yet is not ready"
        );
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            assess(&id("example.com/v1", "Widget"), Some(&ready)),
            Health::Current
        );
        let observed = json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 2}});
        assert_eq!(
            assess(&id("example.com/v1", "Widget"), Some(&observed)),
            Health::Current
        );
        let behind = json!({"metadata": {"generation": 3}, "status": {"observedGeneration": 2}});
        assert_eq!(
            assess(&id("example.com/v1", "Widget"), Some(&behind)),
            Health::Unobserved(3)
        );
        assert_eq!(
            assess(&id("networking.k8s.io/v1", "Ingress"), Some(&json!({}))),
            Health::Current,
            "Kubernetes' own kinds without a rule are current once they exist"
        );
        assert_eq!(
            assess(&id("v1", "ConfigMap"), None),
            Health::Current,
            "not watched: current once applied"
        );
    }

    #[test]
    fn the_summary_names_what_is_waiting_and_what_failed() {
        let (waiting, failed) = summary(&[
            (
                id("apps/v1", "Deployment"),
                Health::InProgress("1/3 replicas available".into()),
            ),
            (id("v1", "ConfigMap"), Health::Current),
            (id("batch/v1", "Job"), Health::Failed("failed".into())),
            (id("apps/v1", "StatefulSet"), Health::Unobserved(2)),
        ]);
        assert_eq!(
            waiting,
            [
                "deployment/web: 1/3 replicas available",
                "statefulset/web: generation 2 not observed yet"
            ]
        );
        assert_eq!(failed, ["job/web: failed"]);
    }
}
