//! The functions kinds get, in templates (as Tera filters and functions)
//! and in CEL expressions alike, under the same names: base64, SHA-256,
//! JSON parsing, a random-looking string a seed fixes (so a resource
//! renders the same at every reconcile, and the no-op skip holds), and
//! Kubernetes quantities as numbers. Each is pure and bounded.

pub mod kro;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest, Sha256};

/// The longest string one `seeded_string` call makes.
pub const SEEDED_STRING_LIMIT: u64 = 256;
/// The characters of a `seeded_string`: lower-case letters and digits,
/// valid in any Kubernetes name and any password field.
const SEEDED_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// Why a function gave no value (its message names the function).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FunctionError(String);

/// `b64encode`: the UTF-8 bytes of `text` in standard base64.
pub fn b64encode(text: &str) -> String {
    BASE64.encode(text)
}

/// `b64decode`: standard base64 decoded; the result must be text.
pub fn b64decode(text: &str) -> Result<String, FunctionError> {
    let bytes = BASE64
        .decode(text.trim())
        .map_err(|e| FunctionError(format!("b64decode: not base64 ({e})")))?;
    String::from_utf8(bytes)
        .map_err(|_| FunctionError("b64decode: the decoded bytes are not UTF-8 text".into()))
}

/// `sha256`: the SHA-256 of the UTF-8 bytes of `text`, in hex.
pub fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// `from_json`: the value `text` holds as JSON. serde_json refuses nesting
/// deeper than 128 levels.
pub fn from_json(text: &str) -> Result<serde_json::Value, FunctionError> {
    serde_json::from_str(text).map_err(|e| FunctionError(format!("from_json: not JSON ({e})")))
}

/// `seeded_string(seed, length)`: `length` letters and digits that look
/// random but depend on `seed` alone: SHA-256 in counter mode, bytes
/// outside a multiple of the alphabet's size dropped (no bias).
pub fn seeded_string(seed: &str, length: u64) -> Result<String, FunctionError> {
    if length == 0 || length > SEEDED_STRING_LIMIT {
        return Err(FunctionError(format!(
            "seeded_string(): length={length} is not between 1 and {SEEDED_STRING_LIMIT}"
        )));
    }
    let length = length as usize;
    let alphabet = SEEDED_ALPHABET.len();
    let unbiased = 256 - 256 % alphabet;
    let mut out = String::with_capacity(length);
    let mut block: u64 = 0;
    while out.len() < length {
        let digest = Sha256::new()
            .chain_update(seed.as_bytes())
            .chain_update(block.to_be_bytes())
            .finalize();
        for byte in digest.iter().map(|b| usize::from(*b)) {
            if byte < unbiased && out.len() < length {
                out.push(char::from(SEEDED_ALPHABET[byte % alphabet]));
            }
        }
        block += 1;
    }
    Ok(out)
}

/// `quantity`: a Kubernetes quantity (`500m`, `1.5Gi`, `2e3`, `128974848`)
/// as a number of base units (`0.5`, `1610612736`, `2000`, `128974848`),
/// for arithmetic; a plain number is itself a valid quantity to write back.
pub fn quantity(text: &str) -> Result<f64, FunctionError> {
    let refused = || FunctionError(format!("quantity: {text:?} is not a Kubernetes quantity"));
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if number.is_empty() || number.len() > 64 {
        return Err(refused());
    }
    let value: f64 = number.parse().map_err(|_| refused())?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent => {
            let digits = exponent
                .strip_prefix(['e', 'E'])
                .filter(|d| !d.is_empty() && d.len() <= 4)
                .ok_or_else(refused)?;
            let power: i32 = digits.parse().map_err(|_| refused())?;
            10f64.powi(power)
        }
    };
    let result = value * scale;
    result.is_finite().then_some(result).ok_or_else(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        for (text, want) in [
            ("500m", 0.5),
            ("2", 2.0),
            ("1.5Gi", 1_610_612_736.0),
            ("128Mi", 134_217_728.0),
            ("2k", 2000.0),
            ("2e3", 2000.0),
            ("1E-3", 0.001),
            ("100u", 0.0001),
        ] {
            let got = quantity(text).unwrap();
            assert!(
                (got - want).abs() < 1e-9 * want.abs().max(1.0),
                "{text}: {got}"
            );
        }
        for bad in ["", "Gi", "1Gb", "1.2.3", "1e", "1e99999", "x1"] {
            assert!(quantity(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn base64_sha256_and_seeded_strings_are_what_they_say() {
        assert_eq!(b64encode("user:pw"), "dXNlcjpwdw==");
        assert_eq!(b64decode("dXNlcjpwdw==").unwrap(), "user:pw");
        assert!(b64decode("***").is_err());
        assert_eq!(
            sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let a = seeded_string("uid-1", 16).unwrap();
        assert_eq!(a.len(), 16);
        assert_eq!(a, seeded_string("uid-1", 16).unwrap());
        assert_ne!(a, seeded_string("uid-2", 16).unwrap());
        assert!(seeded_string("x", 0).is_err());
        assert!(seeded_string("x", SEEDED_STRING_LIMIT + 1).is_err());
    }
}
