//! The webhook's certificates, made by the controller itself: a CA (ten years) and a serving
//! certificate it signs (one year) for the webhook Service's DNS names. The API server trusts the
//! CA through the webhook configurations' `caBundle`; every replica serves the certificate kept in
//! one Secret. Pure: keys and certificates in, keys and certificates out, the time passed in.
//!
//! Renewal: a serving certificate within [`RENEW_BEFORE`] of its end, or made for other names, is
//! replaced by one from the same CA, so the `caBundle` stays valid and replicas may switch at any
//! time. A CA that could not cover a whole new serving certificate is replaced too, and the bundle
//! keeps the old CA beside the new one: replicas still serving the old certificate stay trusted
//! until they load the new one.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;

/// How long the CA is valid.
pub const CA_VALIDITY_SECONDS: i64 = 10 * 365 * 24 * 3600;
/// How long a serving certificate is valid.
pub const SERVING_VALIDITY_SECONDS: i64 = 365 * 24 * 3600;
/// A serving certificate is renewed this long before it ends.
pub const RENEW_BEFORE_SECONDS: i64 = 30 * 24 * 3600;
/// Certificates start this long before they are made (clocks of the API server and the
/// controller differ a little).
const BACKDATE_SECONDS: i64 = 3600;
/// The CA's common name.
pub const CA_COMMON_NAME: &str = "tessera-webhook-ca";

/// A CA and the serving certificate it signed, PEM-encoded, with their end times (Unix seconds).
#[derive(Clone, PartialEq, Eq)]
pub struct Certificates {
    pub ca_cert: String,
    pub ca_key: String,
    /// What the webhook configurations trust: the current CA, and after a CA change the previous
    /// one as well.
    pub ca_bundle: String,
    pub cert: String,
    pub key: String,
    pub dns_names: Vec<String>,
    pub ca_not_after: i64,
    pub not_after: i64,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("dns_names", &self.dns_names)
            .field("ca_not_after", &self.ca_not_after)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("cannot generate a key: {0}")]
    Key(rcgen::Error),
    #[error("cannot read the CA key kept in the Secret: {0}")]
    CaKey(rcgen::Error),
    #[error("cannot make a certificate for {names:?}: {source}")]
    Sign {
        names: Vec<String>,
        source: rcgen::Error,
    },
    #[error("time {0} (Unix seconds) is out of range")]
    Time(i64),
}

/// The names the API server may dial a webhook Service by.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
    ]
}

/// What [`Certificates::renewal`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The certificates serve as they are.
    Keep,
    /// Replace them with these (store them, then write the bundle into the configurations).
    Replace(Certificates),
}

impl Certificates {
    /// A new CA and a serving certificate for `dns_names`, valid from `now` (Unix seconds).
    pub fn issue(dns_names: &[String], now: i64) -> Result<Certificates, CertificateError> {
        let ca_key = KeyPair::generate().map_err(CertificateError::Key)?;
        let ca_not_after = now + CA_VALIDITY_SECONDS;
        let params = ca_params(now, ca_not_after)?;
        let ca_cert = params
            .self_signed(&ca_key)
            .map_err(|source| CertificateError::Sign {
                names: vec![CA_COMMON_NAME.to_owned()],
                source,
            })?;
        let ca_cert = ca_cert.pem();
        let ca_key = ca_key.serialize_pem();
        serve(
            &ca_cert,
            &ca_key,
            ca_cert.clone(),
            ca_not_after,
            dns_names,
            now,
        )
    }

    /// Whether, at `now`, these certificates still serve `dns_names`, and if not, their
    /// replacement.
    pub fn renewal(&self, dns_names: &[String], now: i64) -> Result<Renewal, CertificateError> {
        let ca_too_short =
            now + SERVING_VALIDITY_SECONDS + RENEW_BEFORE_SECONDS > self.ca_not_after;
        if ca_too_short {
            let mut next = Certificates::issue(dns_names, now)?;
            next.ca_bundle = format!("{}{}", next.ca_cert, self.ca_cert);
            return Ok(Renewal::Replace(next));
        }
        let names_differ = self.dns_names.as_slice() != dns_names;
        if names_differ || now + RENEW_BEFORE_SECONDS >= self.not_after {
            let next = serve(
                &self.ca_cert,
                &self.ca_key,
                self.ca_bundle.clone(),
                self.ca_not_after,
                dns_names,
                now,
            )?;
            return Ok(Renewal::Replace(next));
        }
        Ok(Renewal::Keep)
    }
}

/// A serving certificate for `dns_names` signed by the CA (`ca_key`, PEM), ending at the CA's end
/// at the latest.
fn serve(
    ca_cert: &str,
    ca_key: &str,
    ca_bundle: String,
    ca_not_after: i64,
    dns_names: &[String],
    now: i64,
) -> Result<Certificates, CertificateError> {
    let ca_signing_key = KeyPair::from_pem(ca_key).map_err(CertificateError::CaKey)?;
    // The issuer is the CA's name, key usages and key: what `ca_params` always makes.
    let issuer = Issuer::new(ca_params(now, ca_not_after)?, ca_signing_key);
    let not_after = (now + SERVING_VALIDITY_SECONDS).min(ca_not_after);
    let sign_error = |source| CertificateError::Sign {
        names: dns_names.to_vec(),
        source,
    };
    let mut params = CertificateParams::new(dns_names.to_vec()).map_err(sign_error)?;
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        dns_names.first().cloned().unwrap_or_default(),
    );
    params.distinguished_name = name;
    params.not_before = timestamp(now - BACKDATE_SECONDS)?;
    params.not_after = timestamp(not_after)?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(CertificateError::Key)?;
    let cert = params.signed_by(&key, &issuer).map_err(sign_error)?;
    Ok(Certificates {
        ca_cert: ca_cert.to_owned(),
        ca_key: ca_key.to_owned(),
        ca_bundle,
        cert: cert.pem(),
        key: key.serialize_pem(),
        dns_names: dns_names.to_vec(),
        ca_not_after,
        not_after,
    })
}

/// The CA's parameters: the same name and usages every time, so a serving certificate signed
/// later names the CA it was made under.
fn ca_params(now: i64, not_after: i64) -> Result<CertificateParams, CertificateError> {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_COMMON_NAME);
    name.push(DnType::OrganizationName, "tessera");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = timestamp(now - BACKDATE_SECONDS)?;
    params.not_after = timestamp(not_after)?;
    Ok(params)
}

fn timestamp(seconds: i64) -> Result<OffsetDateTime, CertificateError> {
    OffsetDateTime::from_unix_timestamp(seconds).map_err(|_| CertificateError::Time(seconds))
}

#[cfg(test)]
mod tests;
