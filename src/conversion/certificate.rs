//! The webhook's serving certificate: a CA, and a certificate it signs
//! for the host names the API server calls. Every replica serves the same
//! one, kept in a Secret of the operator's namespace ([`shared`]): the
//! first replica makes it, the others (and the next start) read it, so a
//! restart or a new leader keeps the `caBundle` of every CRD valid.
//!
//! It is renewed while the operator runs, without a moment when the API
//! server distrusts what a replica serves: when fewer than
//! [`Renewal::renew_days`] are left, a successor (a new CA and a
//! certificate it signs) is written beside it and both CAs go into the
//! bundle every CRD trusts; only after [`Renewal::promote_after`] does the
//! successor serve. A new one is made at once when the hosts change or it
//! has expired. Never on disk: the Secret, and the operator's memory.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How long a certificate is valid, in days.
pub const VALID_DAYS: i64 = 365;
/// A certificate with fewer days left gets a successor.
pub const RENEW_DAYS: i64 = 30;
/// How often writing the Secret is tried when another replica wrote it
/// meanwhile.
const WRITE_ATTEMPTS: u32 = 5;
/// The Secret's annotation naming the hosts the certificate is for.
const HOSTS_ANNOTATION: &str = "kustomize-operator.io/webhook-hosts";
/// The Secret's annotation with the day the certificate expires.
const EXPIRES_ANNOTATION: &str = "kustomize-operator.io/webhook-expires";
/// ... the day its successor expires.
const NEXT_EXPIRES_ANNOTATION: &str = "kustomize-operator.io/webhook-next-expires";
/// ... when its successor was made (RFC 3339).
const NEXT_SINCE_ANNOTATION: &str = "kustomize-operator.io/webhook-next-since";

/// When the certificate is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// A certificate with fewer days left gets a successor.
    pub renew_days: i64,
    /// How long a successor's CA is trusted before it serves: long enough
    /// for every replica to read it and put it in every CRD's `caBundle`.
    pub promote_after: std::time::Duration,
}

impl Default for Renewal {
    fn default() -> Self {
        Self {
            renew_days: RENEW_DAYS,
            promote_after: std::time::Duration::from_secs(30 * 60),
        }
    }
}

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// rcgen refused.
    #[error("cannot make the webhook's certificate: {0}")]
    Make(#[from] rcgen::Error),
    /// A date out of range.
    #[error("cannot date the webhook's certificate: {0}")]
    Date(#[from] jiff::Error),
    /// Its PEM does not parse.
    #[error("the webhook's certificate does not parse: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    /// The Secret holding it cannot be read or written.
    #[error(
        "the Secret {secret} holding the webhook's certificate: {}",
        crate::error_text::kube(.source)
    )]
    Secret {
        /// `namespace/name`.
        secret: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// A serving certificate and the CA that signed it, PEM.
#[derive(Clone, PartialEq)]
pub struct Certificate {
    /// The CA: what a CRD's `caBundle` holds.
    pub ca_pem: String,
    /// The serving certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
    /// The day it expires.
    pub expires: jiff::civil::Date,
}

impl std::fmt::Debug for Certificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl Certificate {
    /// The certificate and key a TLS server serves.
    pub fn server_parts(
        &self,
    ) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), CertificateError> {
        let cert = CertificateDer::from_pem_slice(self.cert_pem.as_bytes())?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())?;
        Ok((cert, key))
    }
}

/// A new CA and a certificate it signs for `hosts` (names or IP addresses).
pub fn make(hosts: &[String]) -> Result<Certificate, CertificateError> {
    let today = jiff::Zoned::now().date();
    let until = today.checked_add(jiff::Span::new().days(VALID_DAYS))?;
    let dated = |params: &mut CertificateParams| {
        params.not_before = rcgen::date_time_ymd(
            i32::from(today.year()),
            today.month() as u8,
            today.day() as u8,
        );
        params.not_after = rcgen::date_time_ymd(
            i32::from(until.year()),
            until.month() as u8,
            until.day() as u8,
        );
    };
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name.push(
        DnType::CommonName,
        "kustomize-operator conversion webhook CA",
    );
    dated(&mut ca);
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(hosts.to_vec())?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kustomize-operator conversion webhook");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    dated(&mut serving);
    let cert = serving.signed_by(&key, &issuer)?;
    Ok(Certificate {
        ca_pem,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        expires: until,
    })
}

/// What the Secret holds: the certificate served, and its successor with
/// when it was made.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// Served now; its `ca_pem` is the bundle every CRD trusts.
    pub current: Certificate,
    /// The successor (its `ca_pem` its own CA only), and since when.
    pub next: Option<(Certificate, jiff::Timestamp)>,
}

/// What one look at the Secret does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing: the certificate served is good.
    Keep,
    /// A new certificate, served at once: there is none for these hosts,
    /// or it expired.
    Make,
    /// A successor, trusted from now on and served later.
    Prepare,
    /// The successor serves; both CAs stay trusted.
    Promote,
}

/// The step `stored` (none: no certificate for these hosts) needs on
/// `today` at `now`.
pub fn step(stored: Option<&Stored>, now: jiff::Timestamp, renewal: &Renewal) -> Step {
    let Some(stored) = stored else {
        return Step::Make;
    };
    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    if stored.current.expires <= today {
        return Step::Make;
    }
    let promote_after = jiff::SignedDuration::try_from(renewal.promote_after).unwrap_or_default();
    match &stored.next {
        Some((_, since)) if now.duration_since(*since) >= promote_after => Step::Promote,
        Some(_) => Step::Keep,
        None => {
            let renew_after = today.checked_add(jiff::Span::new().days(renewal.renew_days));
            match renew_after {
                Ok(day) if stored.current.expires > day => Step::Keep,
                _ => Step::Prepare,
            }
        }
    }
}

/// `stored` after `step` (a certificate made for `hosts` if need be).
fn after(
    step: Step,
    stored: Option<Stored>,
    hosts: &[String],
    now: jiff::Timestamp,
) -> Result<Stored, CertificateError> {
    match (step, stored) {
        (Step::Keep, Some(stored)) => Ok(stored),
        (Step::Prepare, Some(stored)) => {
            let next = make(hosts)?;
            let mut current = stored.current;
            current.ca_pem = format!("{}{}", last_certificate(&current.ca_pem), next.ca_pem);
            Ok(Stored {
                current,
                next: Some((next, now)),
            })
        }
        (
            Step::Promote,
            Some(Stored {
                current,
                next: Some((next, _)),
            }),
        ) => Ok(Stored {
            current: Certificate {
                ca_pem: current.ca_pem,
                ..next
            },
            next: None,
        }),
        _ => Ok(Stored {
            current: make(hosts)?,
            next: None,
        }),
    }
}

/// The last certificate of a PEM bundle (the newest CA).
fn last_certificate(bundle: &str) -> &str {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    bundle.rfind(BEGIN).map_or(bundle, |at| &bundle[at..])
}

/// The certificate every replica serves for `hosts`: the one in the Secret
/// `name` of `namespace`, after the step it needs ([`step`]) is written
/// there (the first writer wins a race; the others read what it wrote).
/// Called at start, and again while the operator runs.
pub async fn shared(
    client: &Client,
    namespace: &str,
    name: &str,
    hosts: &[String],
    renewal: &Renewal,
) -> Result<Certificate, CertificateError> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let failed = |source| CertificateError::Secret {
        secret: format!("{namespace}/{name}"),
        source,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let existing = api.get_opt(name).await.map_err(failed)?;
        let stored = existing.as_ref().and_then(|s| read(s, hosts));
        let now = jiff::Timestamp::now();
        let step = step(stored.as_ref(), now, renewal);
        if let (Step::Keep, Some(stored)) = (step, &stored) {
            return Ok(stored.current.clone());
        }
        let next = after(step, stored, hosts, now)?;
        let mut secret = secret_of(&next, name, hosts);
        let written = match existing {
            Some(old) => {
                secret.metadata.resource_version = old.metadata.resource_version;
                api.replace(name, &PostParams::default(), &secret).await
            }
            None => api.create(&PostParams::default(), &secret).await,
        };
        match written {
            Ok(_) => {
                tracing::info!(?step, expires = %next.current.expires, "conversion webhook: certificate written");
                return Ok(next.current);
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < WRITE_ATTEMPTS => continue,
            Err(e) => return Err(failed(e)),
        }
    }
}

/// What `secret` holds, if it is for `hosts`.
fn read(secret: &Secret, hosts: &[String]) -> Option<Stored> {
    let annotations = secret.metadata.annotations.as_ref()?;
    if annotations.get(HOSTS_ANNOTATION)? != &hosts.join(",") {
        return None;
    }
    let data = secret.data.as_ref()?;
    let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
    let current = Certificate {
        ca_pem: text("ca.crt")?,
        cert_pem: text("tls.crt")?,
        key_pem: text("tls.key")?,
        expires: annotations.get(EXPIRES_ANNOTATION)?.parse().ok()?,
    };
    let next = (|| {
        let certificate = Certificate {
            ca_pem: last_certificate(&current.ca_pem).to_string(),
            cert_pem: text("next.crt")?,
            key_pem: text("next.key")?,
            expires: annotations.get(NEXT_EXPIRES_ANNOTATION)?.parse().ok()?,
        };
        let since = annotations.get(NEXT_SINCE_ANNOTATION)?.parse().ok()?;
        Some((certificate, since))
    })();
    Some(Stored { current, next })
}

/// The Secret holding `stored` for `hosts`.
fn secret_of(stored: &Stored, name: &str, hosts: &[String]) -> Secret {
    let bytes = |text: &str| ByteString(text.as_bytes().to_vec());
    let current = &stored.current;
    let mut annotations = BTreeMap::from([
        (HOSTS_ANNOTATION.to_string(), hosts.join(",")),
        (EXPIRES_ANNOTATION.to_string(), current.expires.to_string()),
    ]);
    let mut data = BTreeMap::from([
        ("ca.crt".to_string(), bytes(&current.ca_pem)),
        ("tls.crt".to_string(), bytes(&current.cert_pem)),
        ("tls.key".to_string(), bytes(&current.key_pem)),
    ]);
    if let Some((next, since)) = &stored.next {
        annotations.insert(NEXT_EXPIRES_ANNOTATION.into(), next.expires.to_string());
        annotations.insert(NEXT_SINCE_ANNOTATION.into(), since.to_string());
        data.insert("next.crt".into(), bytes(&next.cert_pem));
        data.insert("next.key".into(), bytes(&next.key_pem));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: Some(annotations),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_made_for_a_name_and_an_address() {
        let hosts = ["127.0.0.1".to_string(), "webhook.ns.svc".to_string()];
        let made = make(&hosts).unwrap();
        assert!(made.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(made.server_parts().is_ok());
        assert!(!format!("{made:?}").contains("BEGIN"));
        let stored = Stored {
            current: made,
            next: None,
        };
        let secret = secret_of(&stored, "webhook", &hosts);
        assert_eq!(read(&secret, &hosts), Some(stored));
        assert_eq!(read(&secret, &hosts[..1]), None, "for other hosts");
    }

    fn at(day: &str) -> jiff::Timestamp {
        format!("{day}T12:00:00Z").parse().unwrap()
    }

    #[test]
    fn a_successor_is_trusted_first_and_serves_after_the_delay() {
        let hosts = ["127.0.0.1".to_string()];
        let renewal = Renewal::default();
        let mut current = make(&hosts).unwrap();
        current.expires = "2026-12-20".parse().unwrap();
        let stored = Stored {
            current: current.clone(),
            next: None,
        };
        assert_eq!(step(None, at("2026-01-01"), &renewal), Step::Make);
        assert_eq!(step(Some(&stored), at("2026-11-01"), &renewal), Step::Keep);
        let now = at("2026-11-27");
        assert_eq!(step(Some(&stored), now, &renewal), Step::Prepare);
        let prepared = after(Step::Prepare, Some(stored.clone()), &hosts, now).unwrap();
        // Served: the same certificate, now trusted with the successor's CA.
        assert_eq!(prepared.current.cert_pem, current.cert_pem);
        let (next, since) = prepared.next.clone().unwrap();
        assert_eq!(since, now);
        assert_eq!(
            prepared.current.ca_pem,
            format!("{}{}", current.ca_pem, next.ca_pem)
        );
        let secret = secret_of(&prepared, "webhook", &hosts);
        assert_eq!(
            read(&secret, &hosts),
            Some(prepared.clone()),
            "kept as written"
        );
        let soon = now
            .checked_add(jiff::SignedDuration::from_mins(29))
            .unwrap();
        assert_eq!(step(Some(&prepared), soon, &renewal), Step::Keep);
        let later = now
            .checked_add(jiff::SignedDuration::from_mins(30))
            .unwrap();
        assert_eq!(step(Some(&prepared), later, &renewal), Step::Promote);
        let promoted = after(Step::Promote, Some(prepared.clone()), &hosts, later).unwrap();
        assert_eq!(promoted.current.cert_pem, next.cert_pem);
        assert_eq!(
            promoted.current.ca_pem, prepared.current.ca_pem,
            "both CAs still trusted"
        );
        assert_eq!(promoted.next, None);
        // The next renewal trusts the newest CA and its successor's only.
        let again = after(Step::Prepare, Some(promoted), &hosts, later).unwrap();
        let (third, _) = again.next.unwrap();
        assert_eq!(
            again.current.ca_pem,
            format!("{}{}", next.ca_pem, third.ca_pem)
        );
    }

    #[test]
    fn an_expired_certificate_is_replaced_at_once() {
        let hosts = ["127.0.0.1".to_string()];
        let mut current = make(&hosts).unwrap();
        current.expires = "2026-11-27".parse().unwrap();
        let stored = Stored {
            current,
            next: None,
        };
        let renewal = Renewal::default();
        assert_eq!(step(Some(&stored), at("2026-11-27"), &renewal), Step::Make);
    }
}
