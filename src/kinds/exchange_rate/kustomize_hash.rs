//! The name kustomize gives a generated ConfigMap: `<name>-<hash>`.
//!
//! kustomize (v5, as bundled in kubectl) hashes the JSON encoding of
//! `{"data": <data>, "kind": "ConfigMap", "name": ""}` — the name is looked
//! up with a path kyaml does not resolve, so it is always empty, and only
//! `data` (plus `binaryData`, unused here) counts. The encoding is Go's
//! `json.Marshal`: keys sorted, no spaces, `<`, `>`, `&`, U+2028 and U+2029
//! escaped. The first ten hex digits of its sha256 are kept, with `0 1 3 a e`
//! replaced by `g h k m t`. A test checks the result against `kubectl kustomize`.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The suffix kustomize appends to a ConfigMap generated from `data`.
pub fn config_map_suffix(data: &BTreeMap<String, String>) -> String {
    let mut encoded = String::from("{\"data\":{");
    for (i, (key, value)) in data.iter().enumerate() {
        if i > 0 {
            encoded.push(',');
        }
        go_json_string(&mut encoded, key);
        encoded.push(':');
        go_json_string(&mut encoded, value);
    }
    encoded.push_str("},\"kind\":\"ConfigMap\",\"name\":\"\"}");
    let digest = hex::encode(Sha256::digest(encoded.as_bytes()));
    digest
        .chars()
        .take(10)
        .map(|c| match c {
            '0' => 'g',
            '1' => 'h',
            '3' => 'k',
            'a' => 'm',
            'e' => 't',
            other => other,
        })
        .collect()
}

/// The name kustomize gives a ConfigMap generated as `name` from `data`.
pub fn config_map_name(name: &str, data: &BTreeMap<String, String>) -> String {
    format!("{name}-{}", config_map_suffix(data))
}

/// Appends `s` as Go's `encoding/json` writes a string.
fn go_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_name_kustomize_produced() {
        // `kubectl kustomize` (v1.35, kustomize v5.7.1) on this data gave
        // exchange-rate-usd-895mkt58mt.
        let data = BTreeMap::from([
            ("base".to_string(), "EUR".to_string()),
            ("currency".to_string(), "USD".to_string()),
            ("fetchedAt".to_string(), "2021-01-18T10:00:00Z".to_string()),
            ("rate".to_string(), "1.1901".to_string()),
        ]);
        assert_eq!(
            config_map_name("exchange-rate-usd", &data),
            "exchange-rate-usd-895mkt58mt"
        );
    }

    #[test]
    fn escapes_like_go() {
        let mut out = String::new();
        go_json_string(&mut out, "a<b>&\"\\\n\u{1}\u{2028}é");
        assert_eq!(out, r#""a\u003cb\u003e\u0026\"\\\n\u0001\u2028é""#);
    }
}
