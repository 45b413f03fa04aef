//! The syntax of Kubernetes labels, checked before the API server would
//! refuse one.

/// True for a label value: at most 63 characters of letters, digits, `-`,
/// `_` and `.`, beginning and ending with a letter or digit, or empty.
pub fn is_value(s: &str) -> bool {
    s.len() <= 63 && is_qualified_part(s, true)
}

/// True for a label key: an optional DNS-subdomain prefix and `/`, then a
/// name of at most 63 characters.
pub fn is_key(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && name.len() <= 63 && is_qualified_part(name, false)
}

fn is_qualified_part(s: &str, allow_empty: bool) -> bool {
    if s.is_empty() {
        return allow_empty;
    }
    let bytes = s.as_bytes();
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1])
        && bytes
            .iter()
            .all(|&b| alnum(b) || b == b'-' || b == b'_' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::{is_key, is_value};

    #[test]
    fn label_values_are_short_plain_and_begin_and_end_with_a_letter_or_digit() {
        for good in ["", "a", "shard-1", "a.b_c", &"x".repeat(63)] {
            assert!(is_value(good), "{good:?}");
        }
        for bad in ["-a", "a-", ".a", "a b", "ä", "a/b", &"x".repeat(64)] {
            assert!(!is_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn label_syntax() {
        assert!(is_value(""));
        assert!(is_value("a.b_c-d"));
        assert!(!is_value("-a"));
        assert!(!is_value("a,b"));
        assert!(!is_value("a=b"));
        assert!(!is_value(&"a".repeat(64)));
        assert!(is_key("copyrator"));
        assert!(is_key("example.com/app"));
        assert!(!is_key("a,b"));
        assert!(!is_key("!a"));
        assert!(!is_key("a b"));
        assert!(!is_key("Example.com/app"));
        assert!(!is_key("/app"));
        assert!(!is_key(""));
    }
}
