//! The webhook's certificates as the data of the Secret every replica reads them from: the
//! serving pair under the names TLS Secrets use (`tls.crt`, `tls.key`), the CA (`ca.crt`,
//! `ca.key`), the bundle the webhook configurations trust (`ca-bundle.crt`), and what renewal
//! needs to know without parsing certificates (end times in Unix seconds, the DNS names).
//! Pure: a map of keys to bytes both ways.

use std::collections::BTreeMap;

use crate::certificates::Certificates;

pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const CA_BUNDLE: &str = "ca-bundle.crt";
pub const NOT_AFTER: &str = "not-after";
pub const CA_NOT_AFTER: &str = "ca-not-after";
pub const DNS_NAMES: &str = "dns-names";

/// A Secret's data that does not hold usable certificates.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("key {0} is missing")]
    Missing(&'static str),
    #[error("key {key} is not UTF-8 text")]
    NotText { key: &'static str },
    #[error("key {key} holds {value:?}, not a time in Unix seconds")]
    NotATime { key: &'static str, value: String },
}

impl Certificates {
    /// The Secret data holding these certificates.
    pub fn to_secret_data(&self) -> BTreeMap<String, Vec<u8>> {
        [
            (TLS_CERT, self.cert.clone()),
            (TLS_KEY, self.key.clone()),
            (CA_CERT, self.ca_cert.clone()),
            (CA_KEY, self.ca_key.clone()),
            (CA_BUNDLE, self.ca_bundle.clone()),
            (NOT_AFTER, self.not_after.to_string()),
            (CA_NOT_AFTER, self.ca_not_after.to_string()),
            (DNS_NAMES, self.dns_names.join(",")),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value.into_bytes()))
        .collect()
    }

    /// The certificates a Secret's data holds (what [`Certificates::to_secret_data`] wrote).
    pub fn from_secret_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Certificates, SecretError> {
        let text = |key: &'static str| -> Result<String, SecretError> {
            let bytes = data.get(key).ok_or(SecretError::Missing(key))?;
            String::from_utf8(bytes.clone()).map_err(|_| SecretError::NotText { key })
        };
        let time = |key: &'static str| -> Result<i64, SecretError> {
            let value = text(key)?;
            value
                .trim()
                .parse()
                .map_err(|_| SecretError::NotATime { key, value })
        };
        Ok(Certificates {
            cert: text(TLS_CERT)?,
            key: text(TLS_KEY)?,
            ca_cert: text(CA_CERT)?,
            ca_key: text(CA_KEY)?,
            ca_bundle: text(CA_BUNDLE)?,
            not_after: time(NOT_AFTER)?,
            ca_not_after: time(CA_NOT_AFTER)?,
            dns_names: text(DNS_NAMES)?
                .split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificates::service_dns_names;

    #[test]
    fn certificates_survive_the_secret_and_a_broken_secret_says_which_key() {
        let names = service_dns_names("tessera-webhook", "tessera-system");
        let certs = Certificates::issue(&names, 1_790_000_000).unwrap();
        let mut data = certs.to_secret_data();
        assert_eq!(
            data.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                CA_BUNDLE,
                CA_NOT_AFTER,
                CA_CERT,
                CA_KEY,
                DNS_NAMES,
                NOT_AFTER,
                TLS_CERT,
                TLS_KEY
            ]
        );
        assert_eq!(Certificates::from_secret_data(&data), Ok(certs));

        data.insert(NOT_AFTER.to_owned(), b"soon".to_vec());
        assert_eq!(
            Certificates::from_secret_data(&data),
            Err(SecretError::NotATime {
                key: NOT_AFTER,
                value: "soon".into()
            })
        );
        data.remove(TLS_KEY);
        assert_eq!(
            Certificates::from_secret_data(&data),
            Err(SecretError::Missing(TLS_KEY))
        );
        data.insert(TLS_KEY.to_owned(), vec![0xff, 0xfe]);
        assert_eq!(
            Certificates::from_secret_data(&data)
                .unwrap_err()
                .to_string(),
            "key tls.key is not UTF-8 text"
        );
    }
}
