//! The syntax of Kubernetes object names, checked before the API server
//! would refuse one (label syntax is [`crate::label`]'s).

/// Checks a ServiceAccount name: a DNS subdomain (lower-case
/// alphanumerics, `-` and `.`, at most 253, alphanumeric at both ends).
pub fn check_account_name(name: &str) -> Result<(), String> {
    let valid = (1..=253).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.']);
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a ServiceAccount name (a DNS subdomain)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::check_account_name;

    #[test]
    fn an_account_name_is_a_dns_subdomain() {
        for good in ["a", "tenant-1", "ci.bot", &"x".repeat(253)] {
            assert!(check_account_name(good).is_ok(), "{good:?}");
        }
        for bad in ["", "-a", "a.", "A", "a_b", "a/b", &"x".repeat(254)] {
            let refused = check_account_name(bad).unwrap_err();
            assert!(refused.contains("not a ServiceAccount name"), "{refused}");
        }
    }
}
