//! The syntax of Kubernetes label values, checked before the API server
//! would refuse one.

/// True for a label value: at most 63 characters of letters, digits, `-`,
/// `_` and `.`, beginning and ending with a letter or digit, or empty.
pub fn is_value(value: &str) -> bool {
    let edge = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edge(value.chars().next())
        && edge(value.chars().last())
}

#[cfg(test)]
mod tests {
    use super::is_value;

    #[test]
    fn label_values_are_short_plain_and_begin_and_end_with_a_letter_or_digit() {
        for good in ["", "a", "shard-1", "a.b_c", &"x".repeat(63)] {
            assert!(is_value(good), "{good:?}");
        }
        for bad in ["-a", "a-", ".a", "a b", "ä", "a/b", &"x".repeat(64)] {
            assert!(!is_value(bad), "{bad:?}");
        }
    }
}
