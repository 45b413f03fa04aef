//! The webhook's serving certificate: a CA made at start, and a
//! certificate it signs for the host names the API server calls. Both live
//! in memory only (never on disk); a restart makes new ones, and the
//! operator puts the new CA into every CRD it applies with the webhook.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// How long a certificate is valid, in days.
pub const VALID_DAYS: i64 = 365;

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// rcgen refused.
    #[error("cannot make the webhook's certificate: {0}")]
    Make(#[from] rcgen::Error),
    /// A date out of range.
    #[error("cannot date the webhook's certificate: {0}")]
    Date(#[from] jiff::Error),
}

/// A serving certificate and the CA that signed it.
pub struct Certificate {
    /// The CA, PEM: what a CRD's `caBundle` holds.
    pub ca_pem: String,
    /// The serving certificate.
    pub cert: CertificateDer<'static>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for Certificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate").finish_non_exhaustive()
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
        cert: cert.der().clone(),
        key: PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_made_for_a_name_and_an_address() {
        let made = make(&["127.0.0.1".into(), "webhook.ns.svc".into()]).unwrap();
        assert!(made.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!made.cert.is_empty());
        assert!(!format!("{made:?}").contains("BEGIN"));
    }
}
