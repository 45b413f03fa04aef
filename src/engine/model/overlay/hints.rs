//! Hints for an overlay that did not build: the commonest cause of a
//! rendered template that is not YAML is a value written next to text
//! (`name: {{ metadata.name }}-v2`). Every value reaches a template as a
//! quoted string of its own (`"shop"`), so the line reads `name:
//! "shop"-v2`, which no YAML parser takes. Looked for only once a build
//! failed, so a false hint costs a sentence, never a refused kind.

use std::collections::BTreeMap;

use crate::text::truncate;

/// The folders of an overlay that hold rendered templates.
const RENDERED: [&str; 2] = ["templated/", "patches/"];

/// The first line of a rendered template where a quoted string touches
/// text, as a hint to add to the build's failure; the line itself only
/// when `quote` (never for an overlay that may hold Secret data).
pub(super) fn quoted_next_to_text(
    files: &BTreeMap<String, Vec<u8>>,
    quote: bool,
) -> Option<String> {
    files
        .iter()
        .filter(|(path, _)| RENDERED.iter().any(|dir| path.starts_with(dir)))
        .find_map(|(path, bytes)| {
            let text = std::str::from_utf8(bytes).ok()?;
            let (number, line) = text
                .lines()
                .enumerate()
                .find(|(_, line)| touches_text(line))?;
            let shown = if quote {
                format!(" (`{}`)", truncate(line.trim(), 120))
            } else {
                String::new()
            };
            Some(format!(
                "{path} line {}{shown}: a value written next to text is a quoted string of its own; \
                 join the text inside the braces, as in `{{{{ metadata.name ~ \"-v2\" }}}}`",
                number + 1,
            ))
        })
}

/// True when a double-quoted string on `line` (outside a comment) has a
/// letter, digit or one of `-._/@` right before or right after it.
fn touches_text(line: &str) -> bool {
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '#' if i == 0 || chars[i - 1].is_whitespace() => return false,
            '"' => {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                let before = start.checked_sub(1).map(|b| chars[b]);
                let after = chars.get(i + 1).copied();
                if before.is_some_and(is_text) || after.is_some_and(is_text) {
                    return true;
                }
            }
            _ => {}
        }
        i += 1;
    }
    false
}

fn is_text(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '-' | '.' | '_' | '/' | '@')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(path: &str, text: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(path.to_string(), text.as_bytes().to_vec())])
    }

    #[test]
    fn a_value_written_next_to_text_is_named_with_its_line_and_the_fix() {
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: \"shop\"-v2\n";
        let service = files("templated/00-service.yaml", text);
        let hint = quoted_next_to_text(&service, true).expect("hint");
        assert!(
            hint.starts_with("templated/00-service.yaml line 4 (`name: \"shop\"-v2`):"),
            "{hint}"
        );
        assert!(hint.contains("{{ metadata.name ~ \"-v2\" }}"), "{hint}");
        let secret = quoted_next_to_text(&service, false).expect("hint");
        assert!(
            secret.starts_with("templated/00-service.yaml line 4: a value"),
            "{secret}"
        );
        let before = "metadata:\n  name: v1-\"shop\"\n";
        assert!(quoted_next_to_text(&files("patches/00-x.yaml", before), true).is_some());
    }

    #[test]
    fn quoted_values_in_their_places_and_other_files_give_no_hint() {
        let fine = concat!(
            "metadata:\n",
            "  name: \"shop\"\n",
            "  labels: {\"app\": \"shop\", tier: \"a \\\"b\\\" c\"}\n",
            "  list: [\"a\", \"b\"]\n",
            "  # a comment: \"x\"-y\n",
            "- op: replace\n  path: /spec/replicas\n  value: 3\n",
        );
        assert_eq!(
            quoted_next_to_text(&files("templated/00-a.yaml", fine), true),
            None
        );
        let base = "metadata:\n  name: \"shop\"-v2\n";
        assert_eq!(
            quoted_next_to_text(&files("base/deployment.yaml", base), true),
            None
        );
    }
}
