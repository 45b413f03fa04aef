//! kro's CEL functions, computed as kro computes them, so that a kro
//! instance moved here gets the same values: `random.seededString`,
//! `random.seededInt`, `hash.fnv64a`, `hash.sha256`, `json.unmarshal` and
//! `json.marshal` (kro's `pkg/cel/library`, whose algorithms are public).
//! The kind file's CEL calls them under kro's names
//! (`kinds/declared/kro_library.rs`, which adds the `cel` crate's own
//! `base64.encode` and `base64.decode`, cel-go's encoders, as kro has them);
//! each here is pure and bounded.

use std::hash::Hasher as _;

use sha2::{Digest, Sha256};

use super::{FunctionError, SEEDED_STRING_LIMIT};

/// The characters of kro's seeded strings, in kro's order.
const KRO_ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// `random.seededString(length, seed)`: kro's deterministic string. Each
/// character is a big-endian 4-byte word of the seed's SHA-256, modulo the
/// alphabet's 36; the word for character `i` starts at byte `4i mod 32`,
/// so the string repeats every 8 characters, as kro's does. At most
/// [`SEEDED_STRING_LIMIT`] characters.
pub fn seeded_string(length: i64, seed: &str) -> Result<String, FunctionError> {
    if length <= 0 {
        return Err(FunctionError(
            "random.seededString length must be positive".into(),
        ));
    }
    let length = u64::try_from(length).unwrap_or(u64::MAX);
    if length > SEEDED_STRING_LIMIT {
        return Err(FunctionError(format!(
            "random.seededString length={length} is more than {SEEDED_STRING_LIMIT}"
        )));
    }
    let digest = Sha256::digest(seed.as_bytes());
    let text = (0..length as usize)
        .map(|i| {
            let start = (i * 4) % digest.len();
            let word = u32::from_be_bytes([
                digest[start],
                digest[start + 1],
                digest[start + 2],
                digest[start + 3],
            ]);
            char::from(KRO_ALPHABET[(word % KRO_ALPHABET.len() as u32) as usize])
        })
        .collect();
    Ok(text)
}

/// `random.seededInt(min, max, seed)`: kro's deterministic integer in
/// `[min, max)`: the seed's SHA-256, its first 8 bytes big-endian, modulo
/// the range (Go's wrapping arithmetic, as kro's).
pub fn seeded_int(min: i64, max: i64, seed: &str) -> Result<i64, FunctionError> {
    if min >= max {
        return Err(FunctionError(
            "random.seededInt min must be less than max".into(),
        ));
    }
    let digest = Sha256::digest(seed.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let range = max.wrapping_sub(min) as u64;
    Ok(min.wrapping_add((u64::from_be_bytes(first) % range) as i64))
}

/// `hash.fnv64a(s)`: the FNV-1a 64-bit hash of the UTF-8 bytes of `s`, 8
/// bytes big-endian (Go's `hash/fnv` `Sum`).
pub fn fnv64a(text: &str) -> [u8; 8] {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(text.as_bytes());
    hasher.finish().to_be_bytes()
}

/// `hash.sha256(s)`: the SHA-256 of the UTF-8 bytes of `s`, 32 bytes.
pub fn sha256(text: &str) -> Vec<u8> {
    Sha256::digest(text.as_bytes()).to_vec()
}

/// `json.unmarshal(s)`: the value `s` holds as JSON, every number a
/// double, as Go's `encoding/json` reads it into kro's CEL (`[1]` gives
/// `[1.0]`). serde_json refuses nesting deeper than 128 levels.
pub fn json_unmarshal(text: &str) -> Result<serde_json::Value, FunctionError> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| FunctionError(format!("json.unmarshal failed to parse JSON: {e}")))?;
    Ok(numbers_as_doubles(value))
}

fn numbers_as_doubles(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_doubles).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, numbers_as_doubles(v)))
                .collect(),
        ),
        other => other,
    }
}

/// `json.marshal(v)`: `value` as Go's `encoding/json` writes it, compact:
/// object keys sorted, `<`, `>`, `&`, U+2028 and U+2029 escaped as
/// `\u003c`, ..., a whole double without a fraction (`42`), a double below
/// 1e-6 or from 1e21 on with an exponent (`1e-7`, `1e+21`).
pub fn json_marshal(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_go_json(value, &mut out);
    out
}

fn write_go_json(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(_) => out.push_str(&value.to_string()),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) if !n.is_f64() => out.push_str(&i.to_string()),
            (_, Some(u), _) if !n.is_f64() => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&go_float(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => out.push_str(&go_string(s)),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&go_string(key));
                out.push(':');
                write_go_json(item, out);
            }
            out.push('}');
        }
    }
}

/// A JSON string as Go escapes it: serde_json's escapes (the same as Go's
/// for quotes, backslashes and control characters) and Go's HTML-safe ones.
fn go_string(text: &str) -> String {
    let json = serde_json::Value::String(text.to_string()).to_string();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            other => out.push(other),
        }
    }
    out
}

/// A double as Go's `encoding/json` writes it: the shortest text that reads
/// back as the same double, without an exponent from 1e-6 up to 1e21.
fn go_float(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude == 0.0 || (1e-6..1e21).contains(&magnitude) {
        return format!("{value}");
    }
    let text = format!("{value:e}");
    match text.split_once('e') {
        Some((mantissa, exponent)) if !exponent.starts_with('-') => {
            format!("{mantissa}e+{exponent}")
        }
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    //! Expected values computed with kro's published algorithms, not with
    //! this code:
    //!
    //! - seeded strings: an independent Python rendering of kro's
    //!   `generateDeterministicString` (random.go):
    //!   ```python
    //!   import hashlib
    //!   def seeded(n, seed):
    //!       h = hashlib.sha256(seed.encode()).digest()
    //!       return "".join("0123456789abcdefghijklmnopqrstuvwxyz"[
    //!           int.from_bytes(h[(i*4) % 32:(i*4) % 32 + 4], "big") % 36]
    //!           for i in range(n))
    //!   ```
    //!   (kro's "regenerate the hash" branch never runs: a 4-byte word at a
    //!   multiple of 4 always fits in 32 bytes, so the string repeats every
    //!   8 characters);
    //! - seeded integers: the same digest's first 8 bytes, `int.from_bytes(
    //!   h[:8], "big") % (max - min) + min`;
    //! - FNV-1a 64: its published test vectors (`""` is the offset basis
    //!   cbf29ce484222325; "hello world" is 779a65e7023cd2e7, as Go's
    //!   hash/fnv gives), checked with a Python loop (`h ^= b; h = h *
    //!   0x100000001b3 % 2**64`);
    //! - SHA-256 in base64: `base64.b64encode(hashlib.sha256(s).digest())`,
    //!   as kro's own test computes `base64.encode(hash.sha256(...))`;
    //! - JSON: kro's json_test.go expectations.
    use super::*;
    use base64::Engine as _;
    use serde_json::json;

    fn base64_encode(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn seeded_strings_are_kros() {
        for (length, seed, want) in [
            (10, "test-seed", "5czheg3o5c"),
            (20, "test-seed", "5czheg3o5czheg3o5czh"),
            (8, "", "ew0w84jl"),
            (10, "4f1f2b4e-1a2b-4c3d-8e9f-0a1b2c3d4e5f", "9abbo9489a"),
            (1, "uid-1", "0"),
        ] {
            assert_eq!(seeded_string(length, seed).unwrap(), want, "{seed}");
        }
        for refused in [0, -1] {
            let error = seeded_string(refused, "x").unwrap_err().to_string();
            assert_eq!(error, "random.seededString length must be positive");
        }
        assert!(seeded_string(SEEDED_STRING_LIMIT as i64 + 1, "x").is_err());
    }

    #[test]
    fn seeded_ints_are_kros() {
        // Python: int.from_bytes(sha256(b"my-service").digest()[:8], "big")
        // % 2768 + 30000, and the like.
        assert_eq!(seeded_int(30000, 32768, "my-service").unwrap(), 31247);
        assert_eq!(seeded_int(0, 100, "test-seed").unwrap(), 56);
        assert_eq!(seeded_int(5, 6, "seed").unwrap(), 5);
        assert_eq!(seeded_int(-100, -50, "seed").unwrap(), -58);
        let error = seeded_int(5, 5, "seed").unwrap_err().to_string();
        assert_eq!(error, "random.seededInt min must be less than max");
        assert!(seeded_int(i64::MIN, i64::MAX, "seed").is_ok());
    }

    #[test]
    fn hashes_are_bytes_as_kro_gives_them() {
        assert_eq!(hex::encode(fnv64a("")), "cbf29ce484222325");
        assert_eq!(hex::encode(fnv64a("hello world")), "779a65e7023cd2e7");
        assert_eq!(base64_encode(&fnv64a("hello world")), "d5pl5wI80uc=");
        assert_eq!(base64_encode(&fnv64a("app")), "50+nGQVqg4w=");
        assert_eq!(
            base64_encode(&sha256("hello world")),
            "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek="
        );
        assert_eq!(
            base64_encode(&sha256("")),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
    }

    #[test]
    fn json_reads_and_writes_as_go_does() {
        assert_eq!(
            json_unmarshal(r#"{"name": "test", "count": 42}"#).unwrap(),
            json!({"name": "test", "count": 42.0})
        );
        assert_eq!(json_unmarshal("[1, 2, 3]").unwrap(), json!([1.0, 2.0, 3.0]));
        assert!(json_unmarshal("{\"invalid\"}").is_err());
        assert!(json_unmarshal("").is_err());
        for (value, want) in [
            (
                json!({"name": "test", "count": 42}),
                r#"{"count":42,"name":"test"}"#,
            ),
            (json!([1, 2, 3]), "[1,2,3]"),
            (json!("hello"), r#""hello""#),
            (json!(null), "null"),
            (
                json!({"outer": {"inner": "value"}}),
                r#"{"outer":{"inner":"value"}}"#,
            ),
            (
                json!({"count": 42.0, "name": "test"}),
                r#"{"count":42,"name":"test"}"#,
            ),
            (json!(18446744073709551615u64), "18446744073709551615"),
            (
                json!("<a&b>\u{2028}\n"),
                r#""\u003ca\u0026b\u003e\u2028\n""#,
            ),
            (
                json!([1.5, 1e21, 1e-7, 0.000001, -0.0]),
                "[1.5,1e+21,1e-7,0.000001,-0]",
            ),
        ] {
            assert_eq!(json_marshal(&value), want, "{value}");
        }
    }
}
