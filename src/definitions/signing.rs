//! The key that signs every revision the operator keeps in the cluster,
//! so that a restarted operator serves only revisions it wrote. A
//! ControllerRevision anyone with write access to the operator's
//! namespace can create; the key lives in a Secret of that namespace
//! ([`SECRET`]) that only the operator reads: whoever can write
//! ControllerRevisions there but cannot read that Secret cannot make a
//! revision the operator accepts.
//!
//! The signature is an HMAC-SHA256 over what identifies a revision: the
//! definition's UID (a copy under another definition fails), its number
//! (a copy under another number fails), the definition's generation and
//! the digest of its spec (a changed file fails). The key never leaves
//! the Secret and the operator's memory: no log, status or event shows it.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The Secret of the operator's namespace holding the key.
pub const SECRET: &str = "kustomize-operator-revisions";
/// The Secret's field holding it.
const FIELD: &str = "hmac-sha256.key";
/// The key's length, in bytes.
const KEY_BYTES: usize = 32;
/// What a signature starts with: the scheme, so that another can follow.
const SCHEME: &str = "hmac-sha256:";

/// What a revision's signature covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    /// The UID of the definition the revision belongs to.
    pub definition_uid: &'a str,
    /// The revision's number.
    pub number: u32,
    /// The definition's generation it was accepted at.
    pub generation: i64,
    /// The sha256 of its spec (but the rollout), hex.
    pub digest: &'a str,
}

impl Claim<'_> {
    /// The bytes signed: one field a line, after a versioned header.
    fn message(&self) -> String {
        format!(
            "kustomize-operator.io/revision v1\n{}\n{}\n{}\n{}\n",
            self.definition_uid, self.number, self.generation, self.digest
        )
    }
}

/// Signs and checks revisions with the operator's key.
pub struct Signer {
    key: hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer { key: <hidden> }")
    }
}

/// Why the key cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The Secret cannot be read or created.
    #[error("the Secret {secret} holding the key that signs the kept revisions: {source}")]
    Api {
        /// `namespace/name`.
        secret: String,
        /// What the API server said.
        source: kube::Error,
    },
    /// The Secret holds no key of the right length.
    #[error("the Secret {0} holds no {KEY_BYTES}-byte key in {FIELD}")]
    Malformed(String),
    /// The system gave no random bytes for a new key.
    #[error("no random bytes for a new key")]
    Random,
}

impl Signer {
    /// A signer of `key` (exactly [`KEY_BYTES`] bytes).
    fn new(key: &[u8]) -> Option<Self> {
        (key.len() == KEY_BYTES).then(|| Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
        })
    }

    /// A signer of `key`, for tests.
    #[cfg(test)]
    pub fn for_tests(key: &[u8]) -> Self {
        Self::new(key).expect("a 32-byte key")
    }

    /// The key every replica shares: the one in the Secret [`SECRET`] of
    /// `namespace`, made by whichever replica needs it first (another
    /// made it meanwhile: that one is read).
    pub async fn shared(client: &Client, namespace: &str) -> Result<Self, KeyError> {
        let api = Api::<Secret>::namespaced(client.clone(), namespace);
        let failed = |source| KeyError::Api {
            secret: format!("{namespace}/{SECRET}"),
            source,
        };
        if let Some(secret) = api.get_opt(SECRET).await.map_err(failed)? {
            return Self::of(&secret, namespace);
        }
        let mut key = [0u8; KEY_BYTES];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| KeyError::Random)?;
        match api.create(&PostParams::default(), &secret_of(&key)).await {
            Ok(_) => {
                tracing::info!(secret = %format!("{namespace}/{SECRET}"), "made the key that signs the kept revisions");
                Self::new(&key).ok_or(KeyError::Random)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let secret = api.get(SECRET).await.map_err(failed)?;
                Self::of(&secret, namespace)
            }
            Err(e) => Err(failed(e)),
        }
    }

    /// The signer of the key `secret` holds.
    fn of(secret: &Secret, namespace: &str) -> Result<Self, KeyError> {
        let key = (secret.data.as_ref()).and_then(|data| data.get(FIELD));
        key.and_then(|k| Self::new(&k.0))
            .ok_or_else(|| KeyError::Malformed(format!("{namespace}/{SECRET}")))
    }

    /// The signature of `claim` (`hmac-sha256:<hex>`).
    pub fn sign(&self, claim: &Claim<'_>) -> String {
        let tag = hmac::sign(&self.key, claim.message().as_bytes());
        format!("{SCHEME}{}", hex::encode(tag.as_ref()))
    }

    /// True when `signature` is this key's of `claim` (compared in
    /// constant time).
    pub fn verify(&self, claim: &Claim<'_>, signature: &str) -> bool {
        let Some(tag) = (signature.strip_prefix(SCHEME)).and_then(|h| hex::decode(h).ok()) else {
            return false;
        };
        hmac::verify(&self.key, claim.message().as_bytes(), &tag).is_ok()
    }
}

/// The Secret holding `key`.
fn secret_of(key: &[u8]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "kustomize-operator".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            FIELD.to_string(),
            ByteString(key.to_vec()),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(number: u32, digest: &str) -> Claim<'_> {
        Claim {
            definition_uid: "uid-1",
            number,
            generation: 4,
            digest,
        }
    }

    #[test]
    fn a_signature_holds_for_its_claim_only_and_its_key_only() {
        let signer = Signer::new(&[7; KEY_BYTES]).unwrap();
        let signature = signer.sign(&claim(2, "abc"));
        assert!(signature.starts_with("hmac-sha256:"), "{signature}");
        assert!(signer.verify(&claim(2, "abc"), &signature));
        // Another number, digest, definition, generation: refused.
        assert!(!signer.verify(&claim(7, "abc"), &signature));
        assert!(!signer.verify(&claim(2, "abd"), &signature));
        let other_definition = Claim {
            definition_uid: "uid-2",
            ..claim(2, "abc")
        };
        assert!(!signer.verify(&other_definition, &signature));
        let other_generation = Claim {
            generation: 5,
            ..claim(2, "abc")
        };
        assert!(!signer.verify(&other_generation, &signature));
        // Another key, a malformed or missing signature: refused.
        let other = Signer::new(&[8; KEY_BYTES]).unwrap();
        assert!(!other.verify(&claim(2, "abc"), &signature));
        assert!(!signer.verify(&claim(2, "abc"), "hmac-sha256:zz"));
        assert!(!signer.verify(&claim(2, "abc"), &signature[SCHEME.len()..]));
        assert!(!signer.verify(&claim(2, "abc"), ""));
    }

    #[test]
    fn the_key_is_read_from_its_secret_and_never_shown() {
        let secret = secret_of(&[1; KEY_BYTES]);
        let signer = Signer::of(&secret, "ops").unwrap();
        assert_eq!(format!("{signer:?}"), "Signer { key: <hidden> }");
        let made = Signer::new(&[1; KEY_BYTES]).unwrap();
        assert_eq!(signer.sign(&claim(1, "d")), made.sign(&claim(1, "d")));
        let short = secret_of(&[1; 16]);
        let err = Signer::of(&short, "ops").unwrap_err().to_string();
        assert_eq!(
            err,
            "the Secret ops/kustomize-operator-revisions holds no 32-byte key in hmac-sha256.key"
        );
    }
}
