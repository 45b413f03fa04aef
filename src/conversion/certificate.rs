//! The webhook's serving certificate: a CA, and a certificate it signs
//! for the host names the API server calls. Every replica serves the same
//! one, kept in a Secret of the operator's namespace ([`shared`]): the
//! first replica makes it, the others (and the next start) read it, so a
//! restart or a new leader keeps the `caBundle` of every CRD valid. A new
//! one is made when the hosts change or fewer than [`RENEW_DAYS`] are
//! left. Never on disk: the Secret, and the operator's memory.

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
/// A certificate with fewer days left is replaced at start.
pub const RENEW_DAYS: i64 = 30;
/// How often writing the Secret is tried when another replica wrote it
/// meanwhile.
const WRITE_ATTEMPTS: u32 = 5;
/// The Secret's annotation naming the hosts the certificate is for.
const HOSTS_ANNOTATION: &str = "kustomize-operator.io/webhook-hosts";
/// The Secret's annotation with the day the certificate expires.
const EXPIRES_ANNOTATION: &str = "kustomize-operator.io/webhook-expires";

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
    #[error("the Secret {secret} holding the webhook's certificate: {source}")]
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

/// The certificate every replica serves for `hosts`: the one in the Secret
/// `name` of `namespace` while it is for those hosts and not about to
/// expire, else a new one written there (the first writer wins a race;
/// the others read what it wrote).
pub async fn shared(
    client: &Client,
    namespace: &str,
    name: &str,
    hosts: &[String],
) -> Result<Certificate, CertificateError> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let failed = |source| CertificateError::Secret {
        secret: format!("{namespace}/{name}"),
        source,
    };
    let renew_after = jiff::Zoned::now()
        .date()
        .checked_add(jiff::Span::new().days(RENEW_DAYS))?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let existing = api.get_opt(name).await.map_err(failed)?;
        let kept = existing.as_ref().and_then(|s| read(s, hosts));
        if let Some(kept) = kept.filter(|k| k.expires > renew_after) {
            return Ok(kept);
        }
        let made = make(hosts)?;
        let mut secret = secret_of(&made, name, hosts);
        let written = match existing {
            Some(old) => {
                secret.metadata.resource_version = old.metadata.resource_version;
                api.replace(name, &PostParams::default(), &secret).await
            }
            None => api.create(&PostParams::default(), &secret).await,
        };
        match written {
            Ok(_) => return Ok(made),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < WRITE_ATTEMPTS => continue,
            Err(e) => return Err(failed(e)),
        }
    }
}

/// The certificate `secret` holds, if it is one for `hosts`.
fn read(secret: &Secret, hosts: &[String]) -> Option<Certificate> {
    let annotations = secret.metadata.annotations.as_ref()?;
    if annotations.get(HOSTS_ANNOTATION)? != &hosts.join(",") {
        return None;
    }
    let data = secret.data.as_ref()?;
    let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
    Some(Certificate {
        ca_pem: text("ca.crt")?,
        cert_pem: text("tls.crt")?,
        key_pem: text("tls.key")?,
        expires: annotations.get(EXPIRES_ANNOTATION)?.parse().ok()?,
    })
}

/// The Secret holding `certificate` for `hosts`.
fn secret_of(certificate: &Certificate, name: &str, hosts: &[String]) -> Secret {
    let bytes = |text: &str| ByteString(text.as_bytes().to_vec());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: Some(BTreeMap::from([
                (HOSTS_ANNOTATION.to_string(), hosts.join(",")),
                (
                    EXPIRES_ANNOTATION.to_string(),
                    certificate.expires.to_string(),
                ),
            ])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("ca.crt".to_string(), bytes(&certificate.ca_pem)),
            ("tls.crt".to_string(), bytes(&certificate.cert_pem)),
            ("tls.key".to_string(), bytes(&certificate.key_pem)),
        ])),
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
        let secret = secret_of(&made, "webhook", &hosts);
        assert_eq!(read(&secret, &hosts), Some(made));
        assert_eq!(read(&secret, &hosts[..1]), None, "for other hosts");
    }
}
