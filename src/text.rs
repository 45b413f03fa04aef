//! Short texts naming many things: the first few names, then a count.

use std::fmt::Display;

/// How many names one event lists before the count.
pub const IN_EVENT: usize = 10;

/// How many names were left out of a list: `and 3 more`.
pub fn and_more(count: usize) -> String {
    format!("and {count} more")
}

/// The first `shown` of `items`, joined with `separator`, then how many
/// were left out: `a, b (and 3 more)`; all of them when they fit.
pub fn first_names<I>(items: I, shown: usize, separator: &str) -> String
where
    I: IntoIterator,
    I::Item: Display,
{
    let mut text = String::new();
    let mut total = 0;
    for item in items {
        if total < shown {
            if total > 0 {
                text.push_str(separator);
            }
            text.push_str(&item.to_string());
        }
        total += 1;
    }
    if total > shown {
        text.push_str(&format!(" ({})", and_more(total - shown)));
    }
    text
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("abcdef", 10), "abcdef");
        assert_eq!(truncate("ééééé", 6), "é...");
    }

    #[test]
    fn the_first_names_then_a_count() {
        assert_eq!(
            first_names(["a", "b", "c", "d"], 2, ", "),
            "a, b (and 2 more)"
        );
        assert_eq!(first_names(["a", "b"], 2, "; "), "a; b");
        assert_eq!(first_names(Vec::<String>::new(), 2, ", "), "");
        assert_eq!(first_names(["a", "b"], 0, ", "), " (and 2 more)");
    }
}
