//! What `plan` found, as data: one [`ResourcePlan`] per resource, the
//! counts, the breaking-change guard's verdict; the table a person reads,
//! the JSON CI reads, and the exit code. Pure: nothing here reads the
//! cluster.

use std::fmt::Write as _;

use serde::Serialize;

use crate::kind::ObjectId;

/// The plan of a change across the fleet of its kind.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The kind's short name.
    pub kind: String,
    /// What serves the resources now (`KindDefinition greeting, revision 3`).
    pub current: String,
    /// What the change is (`folder /tmp/kinds/greeting`).
    pub change: String,
    /// The counts.
    pub summary: Summary,
    /// The breaking-change guard's verdict between the current kind and
    /// the change.
    pub guard: Guard,
    /// Every resource of the kind, by namespace and name.
    pub resources: Vec<ResourcePlan>,
    /// What could not be read of what serves now, in words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// How many resources the change leaves alone, changes, or would fail on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Resources planned.
    pub resources: usize,
    /// Resources whose objects the change leaves as they are.
    pub unchanged: usize,
    /// Resources whose objects would change, and whose dry run passed.
    pub would_change: usize,
    /// Resources the change would fail on (render, build, dry run or
    /// conversion).
    pub would_fail: usize,
    /// Resources whose stored fields a change of versions would lose.
    pub would_lose_fields: usize,
}

/// The breaking-change guard's verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Guard {
    /// The breaking changes, in words (`spec.replicas: type changed: ...`).
    pub changes: Vec<String>,
    /// The change carries the annotation allowing breaking changes.
    pub allowed: bool,
}

impl Guard {
    /// True when the operator would refuse the change (`Accepted=False`,
    /// `BreakingChange`).
    pub fn refuses(&self) -> bool {
        !self.changes.is_empty() && !self.allowed
    }
}

/// What the change does to one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePlan {
    /// Its namespace (`None`: cluster-scoped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The revision serving it now, when a definition's revisions do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u32>,
    /// Unchanged, changes or fails.
    pub outcome: Outcome,
    /// Its objects that would be added, changed or pruned.
    pub objects: Vec<ObjectChange>,
    /// Why it would fail.
    pub failures: Vec<Failure>,
    /// Fields of the stored resource a change of versions would lose
    /// (`spec.language`).
    pub lost_fields: Vec<String>,
    /// What could not be compared (the current render unknown, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl ResourcePlan {
    /// `namespace/name`, or `name` for a cluster-scoped resource.
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The outcome its objects and failures make.
    pub fn settle(&mut self) {
        self.outcome = if !self.failures.is_empty() {
            Outcome::Fails
        } else if self.objects.is_empty() {
            Outcome::Unchanged
        } else {
            Outcome::Changes
        };
    }
}

/// What the change does to a resource, all told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// Its objects stay as they are.
    Unchanged,
    /// Its objects would change, and the dry run passed.
    Changes,
    /// Something would fail.
    Fails,
}

/// How one object would change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectChange {
    /// The object.
    pub object: ObjectId,
    /// Added, changed or pruned.
    pub change: Change,
    /// The fields that change, as paths (`spec.replicas`,
    /// `spec.template.spec.containers[0].image`); empty unless changed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

/// What happens to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Change {
    /// Rendered by the change only: created.
    Added,
    /// Rendered by both, differently: updated.
    Changed,
    /// Rendered now, no longer by the change: pruned.
    Pruned,
}

impl Change {
    fn sign(self) -> char {
        match self {
            Self::Added => '+',
            Self::Changed => '~',
            Self::Pruned => '-',
        }
    }
}

/// Why a resource would fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The object it is about, if one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Box<ObjectId>>,
    /// Why, in one word.
    pub reason: Reason,
    /// What the API server, the template or the conversion said.
    pub message: String,
}

/// Why a resource would fail, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Reason {
    /// The change's templates do not render for it.
    RenderFailed,
    /// Its overlay does not build (`kubectl kustomize`).
    BuildFailed,
    /// The identity that would write it may not (or may not be acted as).
    Forbidden,
    /// The API server would refuse an object as invalid.
    Invalid,
    /// Another field manager owns a field the change sets.
    Conflict,
    /// A new object exists already, not the resource's: the engine takes
    /// over no object it did not create.
    OwnershipConflict,
    /// What an object needs is not there (its namespace, its API).
    NotFound,
    /// The operator would refuse to write for it (a protected namespace,
    /// a cluster-scoped resource without an account).
    Refused,
    /// Its stored object does not convert to the change's version.
    ConversionFailed,
    /// The API server said no for another reason.
    Rejected,
}

impl Reason {
    /// The reason of an API server's refusal (`Status.reason`, else its code).
    pub fn of_api(reason: &str, code: u16) -> Self {
        match (reason, code) {
            ("Forbidden", _) | (_, 403) => Self::Forbidden,
            ("Invalid", _) | (_, 422) => Self::Invalid,
            ("Conflict", _) | (_, 409) => Self::Conflict,
            ("NotFound", _) | (_, 404) => Self::NotFound,
            _ => Self::Rejected,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

impl Report {
    /// Counts the resources' outcomes into the summary.
    pub fn count(&mut self) {
        let mut summary = Summary {
            resources: self.resources.len(),
            ..Summary::default()
        };
        for resource in &self.resources {
            match resource.outcome {
                Outcome::Unchanged => summary.unchanged += 1,
                Outcome::Changes => summary.would_change += 1,
                Outcome::Fails => summary.would_fail += 1,
            }
            if !resource.lost_fields.is_empty() {
                summary.would_lose_fields += 1;
            }
        }
        self.summary = summary;
    }

    /// True when something would fail: a resource, or the guard.
    pub fn fails(&self) -> bool {
        self.summary.would_fail > 0 || self.guard.refuses()
    }

    /// The exit code: 0 when nothing would fail, 1 when something would
    /// (errors before a plan exit 2).
    pub fn exit_code(&self) -> u8 {
        u8::from(self.fails())
    }

    /// The report as JSON.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The report as a person reads it: the counts, the guard's verdict,
    /// the resources that would fail with why; with `details`, every
    /// resource's changes and lost fields too.
    pub fn table(&self, details: bool) -> String {
        let s = &self.summary;
        let noun = if s.resources == 1 {
            "resource"
        } else {
            "resources"
        };
        let mut out = format!(
            "plan of {}: {} {noun}: {} unchanged, {} would change, {} would fail",
            self.kind, s.resources, s.unchanged, s.would_change, s.would_fail
        );
        if s.would_lose_fields > 0 {
            let _ = write!(out, ", {} would lose fields", s.would_lose_fields);
        }
        let _ = write!(
            out,
            "\ncurrent: {}\nchange:  {}\n",
            self.current, self.change
        );
        if !self.guard.changes.is_empty() {
            let verdict = match self.guard.allowed {
                true => "breaking changes, allowed by the change's annotation:",
                false => "the operator would refuse the change, breaking changes:",
            };
            let _ = writeln!(out, "\n{verdict}");
            for change in &self.guard.changes {
                let _ = writeln!(out, "  {change}");
            }
        }
        let failing: Vec<_> = (self.resources.iter())
            .filter(|r| r.outcome == Outcome::Fails)
            .collect();
        if !failing.is_empty() {
            out.push_str("\nwould fail:\n");
            out.push_str(&failure_table(&failing));
        }
        let losing: Vec<_> = (self.resources.iter())
            .filter(|r| !r.lost_fields.is_empty())
            .collect();
        if !losing.is_empty() {
            out.push_str("\nwould lose fields:\n");
            for r in losing.iter().take(if details { usize::MAX } else { 20 }) {
                let _ = writeln!(out, "  {}: {}", r.key(), r.lost_fields.join(", "));
            }
        }
        if details {
            out.push_str(&self.details());
        }
        out
    }

    /// Every resource's changes, `+` added, `~` changed (its fields), `-`
    /// pruned.
    fn details(&self) -> String {
        let mut out = String::new();
        for r in &self.resources {
            let revision = r
                .revision
                .map(|n| format!(" (revision {n})"))
                .unwrap_or_default();
            let outcome = match r.outcome {
                Outcome::Unchanged => "unchanged",
                Outcome::Changes => "would change",
                Outcome::Fails => "would fail",
            };
            let _ = writeln!(out, "\n{}{revision}: {outcome}", r.key());
            for o in &r.objects {
                let _ = write!(out, "  {} {}", o.change.sign(), o.object.kubectl_name());
                match o.fields.is_empty() {
                    true => out.push('\n'),
                    false => {
                        let _ = writeln!(out, ": {}", o.fields.join(", "));
                    }
                }
            }
            for note in &r.notes {
                let _ = writeln!(out, "  note: {note}");
            }
        }
        out
    }
}

/// NAMESPACE, NAME, REVISION, REASON, MESSAGE: one line per failure.
fn failure_table(failing: &[&ResourcePlan]) -> String {
    let mut rows = vec![[
        "NAMESPACE".to_string(),
        "NAME".into(),
        "REVISION".into(),
        "REASON".into(),
        "MESSAGE".into(),
    ]];
    for r in failing {
        for f in &r.failures {
            let message = match &f.object {
                Some(object) => format!("{}: {}", object.kubectl_name(), f.message),
                None => f.message.clone(),
            };
            rows.push([
                r.namespace.clone().unwrap_or_default(),
                r.name.clone(),
                r.revision.map(|n| n.to_string()).unwrap_or_default(),
                f.reason.to_string(),
                one_line(&message),
            ]);
        }
    }
    columns(&rows)
}

/// A message on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Rows as aligned columns, three spaces apart, indented by two.
fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::from("  ");
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            line.push_str(cell);
            if i + 1 < N {
                line.push_str(&" ".repeat(w - cell.chars().count() + 3));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str) -> ObjectId {
        ObjectId {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("shop".into()),
            name: name.into(),
        }
    }

    fn resource(name: &str, objects: Vec<ObjectChange>, failures: Vec<Failure>) -> ResourcePlan {
        let mut plan = ResourcePlan {
            namespace: Some("shop".into()),
            name: name.into(),
            revision: Some(2),
            outcome: Outcome::Unchanged,
            objects,
            failures,
            lost_fields: Vec::new(),
            notes: Vec::new(),
        };
        plan.settle();
        plan
    }

    fn changed(name: &str) -> ObjectChange {
        ObjectChange {
            object: object(name),
            change: Change::Changed,
            fields: vec!["spec.replicas".into()],
        }
    }

    fn report(resources: Vec<ResourcePlan>) -> Report {
        let mut report = Report {
            kind: "website".into(),
            current: "KindDefinition website, revision 2".into(),
            change: "folder /tmp/website".into(),
            summary: Summary::default(),
            guard: Guard::default(),
            resources,
            notes: Vec::new(),
        };
        report.count();
        report
    }

    fn invalid(name: &str) -> Failure {
        Failure {
            object: Some(Box::new(object(name))),
            reason: Reason::Invalid,
            message: "Deployment.apps \"x\" is invalid:\n spec.replicas: Invalid value: -1".into(),
        }
    }

    #[test]
    fn the_counts_come_first_then_each_failure_with_its_reason() {
        let report = report(vec![
            resource("a", vec![], vec![]),
            resource("b", vec![changed("b-web")], vec![]),
            resource("c", vec![changed("c-web")], vec![invalid("c-web")]),
        ]);
        assert_eq!(
            report.summary,
            Summary {
                resources: 3,
                unchanged: 1,
                would_change: 1,
                would_fail: 1,
                would_lose_fields: 0
            }
        );
        let table = report.table(false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "plan of website: 3 resources: 1 unchanged, 1 would change, 1 would fail"
        );
        assert!(table.contains("would fail:\n  NAMESPACE   NAME   REVISION   REASON    MESSAGE\n  shop        c      2          Invalid   deployment.apps/c-web: Deployment.apps \"x\" is invalid: spec.replicas: Invalid value: -1\n"), "{table}");
        assert!(!table.contains("spec.replicas\n"), "details only asked for");
        let details = report.table(true);
        assert!(
            details.contains(
                "shop/b (revision 2): would change\n  ~ deployment.apps/b-web: spec.replicas\n"
            ),
            "{details}"
        );
    }

    #[test]
    fn the_exit_code_is_1_when_a_resource_or_the_guard_fails() {
        let good = report(vec![resource("b", vec![changed("b")], vec![])]);
        assert_eq!(good.exit_code(), 0);
        let bad = report(vec![resource("c", vec![], vec![invalid("c")])]);
        assert_eq!(bad.exit_code(), 1);
        let mut refused = report(vec![]);
        refused.guard.changes = vec!["spec.replicas: type changed: integer to string".into()];
        assert_eq!(refused.exit_code(), 1);
        assert!(
            refused
                .table(false)
                .contains("the operator would refuse the change")
        );
        refused.guard.allowed = true;
        assert_eq!(refused.exit_code(), 0);
    }

    #[test]
    fn the_json_names_each_failing_resource_and_its_reason() {
        let report = report(vec![resource("c", vec![], vec![invalid("c-web")])]);
        let json: serde_json::Value = serde_json::from_str(&report.json()).unwrap();
        assert_eq!(json["summary"]["wouldFail"], 1);
        let resource = &json["resources"][0];
        assert_eq!(resource["outcome"], "Fails");
        assert_eq!(resource["failures"][0]["reason"], "Invalid");
        assert_eq!(resource["failures"][0]["object"]["name"], "c-web");
    }

    #[test]
    fn api_reasons_map_to_words() {
        assert_eq!(Reason::of_api("Forbidden", 403), Reason::Forbidden);
        assert_eq!(Reason::of_api("", 422), Reason::Invalid);
        assert_eq!(Reason::of_api("Conflict", 409), Reason::Conflict);
        assert_eq!(Reason::of_api("BadRequest", 400), Reason::Rejected);
    }
}
