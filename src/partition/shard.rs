//! Sharding: several operators split the resources of a cluster between
//! them by a label, each reconciling only its own. A resource labelled
//! `kustomize-operator.io/shard=<name>` belongs to the operator started with
//! `--shard <name>`; an unlabelled one to the operator started without
//! `--shard` (the default shard), and to no other.

/// The label naming a resource's shard.
pub const SHARD_LABEL: &str = "kustomize-operator.io/shard";

/// The label selector of the resources the operator of `shard` reconciles.
pub fn selector(shard: Option<&str>) -> String {
    match shard {
        Some(name) => format!("{SHARD_LABEL}={name}"),
        None => format!("!{SHARD_LABEL}"),
    }
}

/// Checks a shard name: a label value (at most 63 characters: letters,
/// digits, `-`, `_`, `.`, beginning and ending with a letter or digit).
pub fn parse_name(name: &str) -> Result<String, String> {
    if !name.is_empty() && crate::label::is_value(name) {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a shard name: a label value (at most 63 letters, digits, '-', '_', '.', beginning and ending with a letter or digit)"
        ))
    }
}

/// Both selectors (a kind's own and the shard's), as one.
pub fn combine(own: Option<String>, shard: &str) -> String {
    match own {
        Some(own) if !own.is_empty() => format!("{own},{shard}"),
        _ => shard.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_takes_its_label_and_the_default_shard_takes_the_unlabelled() {
        assert_eq!(selector(Some("b")), "kustomize-operator.io/shard=b");
        assert_eq!(selector(None), "!kustomize-operator.io/shard");
        assert_eq!(
            combine(Some("blackadder.io/namespace=team".into()), &selector(None)),
            "blackadder.io/namespace=team,!kustomize-operator.io/shard"
        );
        assert_eq!(combine(None, "x=y"), "x=y");
    }

    #[test]
    fn shard_names_are_label_values() {
        assert_eq!(parse_name("shard-2").as_deref(), Ok("shard-2"));
        for bad in ["", "-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            assert!(parse_name(bad).is_err(), "{bad:?}");
        }
    }
}
