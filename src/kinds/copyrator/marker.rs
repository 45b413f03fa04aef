//! The marker every copy carries, and the label syntax checks it relies on.
//!
//! A copy carries:
//! - label `copyrator.flant.com/rule`: the rule, as `<namespace>.<name>` (or a
//!   hash when that is too long for a label value), for label-selected lists,
//!   watches and deletes;
//! - label `copyrator.flant.com/source`: the source's name (or a hash);
//! - annotations `copyrator.flant.com/rule` and `copyrator.flant.com/source`:
//!   `<namespace>/<name>` of the rule and of the source, exact. An object is
//!   the rule's copy only when the rule annotation names it;
//! - annotation `copyrator.flant.com/digest`: sha256 of the labels and content
//!   the copy should hold, to tell an up-to-date copy from one to re-apply.

use crate::label::is_value;
use sha2::{Digest, Sha256};

/// Prefix of every marker key.
pub const PREFIX: &str = "copyrator.flant.com/";
/// Label and annotation naming the rule.
pub const RULE: &str = "copyrator.flant.com/rule";
/// Label and annotation naming the source.
pub const SOURCE: &str = "copyrator.flant.com/source";
/// Annotation: sha256 of what the copy should hold (labels and content).
pub const DIGEST: &str = "copyrator.flant.com/digest";

/// The value of the [`RULE`] label for a rule.
pub fn rule_label(namespace: &str, name: &str) -> String {
    let plain = format!("{namespace}.{name}");
    if is_value(&plain) {
        plain
    } else {
        format!("h.{}", short_hash(&format!("{namespace}/{name}"), 32))
    }
}

/// The value of the [`RULE`] annotation for a rule.
pub fn rule_annotation(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The value of the [`SOURCE`] label for a source name.
pub fn source_label(name: &str) -> String {
    if is_value(name) {
        name.to_string()
    } else {
        format!("h.{}", short_hash(name, 32))
    }
}

fn short_hash(s: &str, len: usize) -> String {
    let mut hex = hex::encode(Sha256::digest(s.as_bytes()));
    hex.truncate(len);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_label_is_readable_when_it_fits_and_hashed_otherwise() {
        assert_eq!(rule_label("team-a", "main-rule"), "team-a.main-rule");
        let long = rule_label("team-a", &"r".repeat(70));
        assert!(long.starts_with("h.") && is_value(&long), "{long}");
        assert_ne!(long, rule_label("team-b", &"r".repeat(70)));
    }
}
