//! The status shape every kind shares: conditions, observed generation,
//! the last kubectl command and the digest of what was applied.
//!
//! Everything here is bounded: messages and command output are trimmed so a
//! resource's status stays a few KiB whatever kubectl prints.

use serde::{Deserialize, Serialize};

use crate::kubectl::CommandRecord;

/// Condition type: the last reconcile succeeded.
pub const READY: &str = "Ready";
/// Condition type: a reconcile is in progress.
pub const RECONCILING: &str = "Reconciling";

/// Longest `message` / condition message kept, in bytes.
pub const MESSAGE_LIMIT: usize = 1024;
/// Longest stdout or stderr kept in `lastCommand`, in bytes.
pub const OUTPUT_LIMIT: usize = 2048;

/// A standard Kubernetes-style condition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready` or `Reconciling`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason, e.g. `Applied`, `ApplyFailed`, `InvalidSpec`.
    pub reason: String,
    /// Human-readable detail.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: String,
    /// The generation this condition describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The status fields common to every kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommonStatus {
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and `Reconciling`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// kubectl's first useful output line, or the error (printer column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last kubectl run for this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_command: Option<CommandRecord>,
    /// sha256 of the overlay last applied successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_digest: Option<String>,
    /// When the overlay was last applied successfully (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_at: Option<String>,
}

impl CommonStatus {
    /// The condition of type `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// True when `Ready` is `True`.
    pub fn is_ready(&self) -> bool {
        self.condition(READY).is_some_and(|c| c.status == "True")
    }

    /// Sets a condition, keeping its transition time when the status is unchanged.
    pub fn set_condition(
        &mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
        generation: Option<i64>,
    ) {
        let status = if status { "True" } else { "False" };
        let message = truncate(message, MESSAGE_LIMIT);
        let now = jiff::Timestamp::now().to_string();
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status.into();
                c.reason = reason.into();
                c.message = message;
                c.observed_generation = generation;
            }
            None => self.conditions.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message,
                last_transition_time: now,
                observed_generation: generation,
            }),
        }
    }

    /// Sets `message`, trimmed.
    pub fn set_message(&mut self, message: &str) {
        self.message = Some(truncate(message, MESSAGE_LIMIT));
    }

    /// Records a kubectl run, trimming its output to [`OUTPUT_LIMIT`].
    pub fn record_command(&mut self, record: &CommandRecord) {
        let mut r = record.clone();
        r.stdout = keep_tail(&r.stdout, OUTPUT_LIMIT);
        r.stderr = keep_tail(&r.stderr, OUTPUT_LIMIT);
        r.command = truncate(&r.command, MESSAGE_LIMIT);
        self.last_command = Some(r);
    }
}

/// The first `limit` bytes of `s` (on a char boundary), marked when cut.
pub fn truncate(s: &str, limit: usize) -> String {
    if s.len() <= limit {
        return s.to_string();
    }
    let mut end = limit.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// The last `limit` bytes of `s` (on a char boundary), marked when cut.
pub fn keep_tail(s: &str, limit: usize) -> String {
    if s.len() <= limit {
        return s.to_string();
    }
    let marker = "[...]\n";
    let mut start = s.len() - limit.saturating_sub(marker.len());
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("{marker}{}", &s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_changes_only_with_status() {
        let mut s = CommonStatus::default();
        s.set_condition(READY, true, "Applied", "ok", Some(1));
        let t0 = s.condition(READY).unwrap().last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        s.set_condition(READY, true, "Applied", "again", Some(2));
        assert_eq!(s.condition(READY).unwrap().last_transition_time, t0);
        assert_eq!(s.condition(READY).unwrap().observed_generation, Some(2));
        s.set_condition(READY, false, "ApplyFailed", "bad", Some(2));
        assert_ne!(s.condition(READY).unwrap().last_transition_time, t0);
        assert!(!s.is_ready());
        assert_eq!(s.conditions.len(), 1);
    }

    #[test]
    fn status_stays_bounded_whatever_kubectl_prints() {
        let mut s = CommonStatus::default();
        let huge = "é".repeat(3_000_000);
        s.record_command(&CommandRecord {
            command: huge.clone(),
            stdout: huge.clone(),
            stderr: huge.clone(),
            ..Default::default()
        });
        s.set_message(&huge);
        s.set_condition(READY, false, "ApplyFailed", &huge, None);
        let size = serde_json::to_string(&s).unwrap().len();
        assert!(size < 8 * 1024, "status is {size} bytes");
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("abcdef", 10), "abcdef");
        assert_eq!(truncate("ééééé", 6), "é...");
        assert_eq!(keep_tail("abcdefghij", 8), "[...]\nij");
        assert!(keep_tail(&"é".repeat(100), 20).is_char_boundary(0));
    }
}
