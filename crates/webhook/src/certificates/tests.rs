use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::*;

const NOW: i64 = 1_790_000_000; // 2026-09-21
const DAY: i64 = 24 * 3600;

fn names() -> Vec<String> {
    service_dns_names("tessera-webhook", "tessera-system")
}

fn ders(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("PEM certificates")
}

/// Whether `cert` (PEM) chains to one of the CAs in `bundle` for `name` at `at`, as a TLS client
/// checks a server.
fn verifies(bundle: &str, cert: &str, name: &str, at: i64) -> bool {
    let anchors_der = ders(bundle);
    let anchors: Vec<_> = anchors_der
        .iter()
        .map(|c| webpki::anchor_from_trusted_cert(c).expect("a trust anchor"))
        .collect();
    let leaf_der = ders(cert).remove(0);
    let leaf = webpki::EndEntityCert::try_from(&leaf_der).expect("an end-entity certificate");
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(at as u64));
    let chain = leaf.verify_for_usage(
        &[webpki::ring::ECDSA_P256_SHA256],
        &anchors,
        &[],
        time,
        webpki::KeyUsage::server_auth(),
        None,
        None,
    );
    let server_name = ServerName::try_from(name.to_owned()).unwrap();
    chain.is_ok() && leaf.verify_is_valid_for_subject_name(&server_name).is_ok()
}

#[test]
fn the_serving_certificate_chains_to_the_ca_for_every_service_name() {
    let certs = Certificates::issue(&names(), NOW).unwrap();
    assert_eq!(certs.ca_bundle, certs.ca_cert);
    for name in names() {
        assert!(
            verifies(&certs.ca_bundle, &certs.cert, &name, NOW + DAY),
            "{name}"
        );
    }
    assert!(!verifies(
        &certs.ca_bundle,
        &certs.cert,
        "other.tessera-system.svc",
        NOW + DAY
    ));
    // Not yet valid long before it was made; no longer valid after a year.
    assert!(!verifies(
        &certs.ca_bundle,
        &certs.cert,
        &names()[0],
        NOW - DAY
    ));
    assert!(!verifies(
        &certs.ca_bundle,
        &certs.cert,
        &names()[0],
        certs.not_after + 1
    ));
    assert_eq!(certs.not_after, NOW + SERVING_VALIDITY_SECONDS);
    assert_eq!(certs.ca_not_after, NOW + CA_VALIDITY_SECONDS);
    // Another CA does not vouch for it.
    let other = Certificates::issue(&names(), NOW).unwrap();
    assert!(!verifies(
        &other.ca_bundle,
        &certs.cert,
        &names()[0],
        NOW + DAY
    ));
}

#[test]
fn certificates_are_kept_until_a_month_before_they_end() {
    let certs = Certificates::issue(&names(), NOW).unwrap();
    assert_eq!(certs.renewal(&names(), NOW + DAY).unwrap(), Renewal::Keep);
    let late = certs.not_after - RENEW_BEFORE_SECONDS;
    assert_eq!(certs.renewal(&names(), late - 1).unwrap(), Renewal::Keep);
    let Renewal::Replace(next) = certs.renewal(&names(), late).unwrap() else {
        panic!("renewed a month before the end");
    };
    // Same CA, same bundle: the webhook configurations need no change.
    assert_eq!(
        (&next.ca_cert, &next.ca_bundle),
        (&certs.ca_cert, &certs.ca_bundle)
    );
    assert_ne!(next.cert, certs.cert);
    assert_ne!(next.key, certs.key);
    assert!(verifies(
        &certs.ca_bundle,
        &next.cert,
        &names()[0],
        late + DAY
    ));
    assert_eq!(next.not_after, late + SERVING_VALIDITY_SECONDS);
}

#[test]
fn other_names_get_a_new_certificate_from_the_same_ca() {
    let certs = Certificates::issue(&names(), NOW).unwrap();
    let moved = service_dns_names("tessera-webhook", "gpu-system");
    let Renewal::Replace(next) = certs.renewal(&moved, NOW + DAY).unwrap() else {
        panic!("new names, new certificate");
    };
    assert_eq!(next.ca_cert, certs.ca_cert);
    assert!(verifies(
        &next.ca_bundle,
        &next.cert,
        &moved[0],
        NOW + 2 * DAY
    ));
    assert!(!verifies(
        &next.ca_bundle,
        &next.cert,
        &names()[0],
        NOW + 2 * DAY
    ));
}

#[test]
fn a_ca_near_its_end_is_replaced_and_the_bundle_trusts_both() {
    let certs = Certificates::issue(&names(), NOW).unwrap();
    // Serving certificates renewed under the old CA end with it at the latest.
    let late_in_ca = certs.ca_not_after - SERVING_VALIDITY_SECONDS - RENEW_BEFORE_SECONDS - DAY;
    let Renewal::Replace(last) = certs.renewal(&names(), late_in_ca).unwrap() else {
        panic!("the first serving certificate has ended");
    };
    assert_eq!(last.ca_cert, certs.ca_cert);
    assert!(last.not_after <= certs.ca_not_after);
    let at = late_in_ca + 2 * DAY;
    let Renewal::Replace(next) = last.renewal(&names(), at).unwrap() else {
        panic!("the CA cannot cover another year");
    };
    assert_ne!(next.ca_cert, certs.ca_cert);
    assert_eq!(ders(&next.ca_bundle).len(), 2);
    // Replicas still serving the old certificate stay trusted while they switch.
    assert!(verifies(&next.ca_bundle, &last.cert, &names()[0], at + DAY));
    assert!(verifies(&next.ca_bundle, &next.cert, &names()[0], at + DAY));
}

#[test]
fn a_damaged_ca_key_is_an_error_naming_it() {
    let mut certs = Certificates::issue(&names(), NOW).unwrap();
    certs.ca_key = "not a key".into();
    let error = certs.renewal(&names(), certs.not_after).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cannot read the CA key kept in the Secret"),
        "{error}"
    );
    // Key material never shows in debug output.
    assert!(!format!("{certs:?}").contains("PRIVATE KEY"));
}
