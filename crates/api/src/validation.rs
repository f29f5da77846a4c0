//! Name and value rules of `resource.k8s.io/v1` that Tessera must respect before the API server
//! would refuse an object (upstream-facts.md "resource.k8s.io/v1").

/// Most devices one ResourceSlice may hold.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Most devices one ResourceSlice may hold if any device has taints, consumes counters or has list attributes.
pub const MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// Most attributes plus capacities of one device.
pub const MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE: usize = 32;
/// Longest string or version attribute value.
pub const MAX_ATTRIBUTE_VALUE_LENGTH: usize = 64;
/// Longest C-identifier part of a qualified name.
pub const MAX_IDENTIFIER_LENGTH: usize = 32;
/// Longest domain part of a qualified name.
pub const MAX_DOMAIN_LENGTH: usize = 63;
/// Longest pool name.
pub const MAX_POOL_NAME_LENGTH: usize = 253;
/// Most counters in one counter set, and most counters one device consumes from a set.
pub const MAX_COUNTERS_PER_SET: usize = 32;

/// RFC 1123 label: ≤ 63 lowercase alphanumerics or `-`, starting and ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// RFC 1123 subdomain: ≤ 253 characters, dot-separated DNS labels.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// C identifier of at most 32 characters (the identifier part of a qualified name).
pub fn is_c_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_IDENTIFIER_LENGTH
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Checks an attribute or capacity name: `<identifier>` or `<domain>/<identifier>`.
pub fn check_qualified_name(name: &str) -> Result<(), String> {
    let (domain, id) = match name.split_once('/') {
        Some((domain, id)) => (Some(domain), id),
        None => (None, name),
    };
    if let Some(domain) = domain
        && (domain.len() > MAX_DOMAIN_LENGTH || !is_dns_subdomain(domain))
    {
        return Err(format!(
            "domain `{domain}` of `{name}` must be a DNS subdomain of at most {MAX_DOMAIN_LENGTH} characters"
        ));
    }
    if !is_c_identifier(id) {
        return Err(format!(
            "identifier `{id}` of `{name}` must be a C identifier of at most {MAX_IDENTIFIER_LENGTH} characters"
        ));
    }
    Ok(())
}

/// Checks a version attribute value: semantic version 2.0.0, at most 64 characters.
pub fn check_version_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_ATTRIBUTE_VALUE_LENGTH {
        return Err(format!(
            "version `{value}` is longer than {MAX_ATTRIBUTE_VALUE_LENGTH} characters"
        ));
    }
    semver::Version::parse(value)
        .map(|_| ())
        .map_err(|e| format!("`{value}` is not a semantic version 2.0.0 ({e})"))
}

/// Checks a string attribute value: at most 64 characters.
pub fn check_string_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_ATTRIBUTE_VALUE_LENGTH {
        return Err(format!(
            "string `{value}` is longer than {MAX_ATTRIBUTE_VALUE_LENGTH} characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        for ok in ["gpu-0", "a", "gpu-7-mig-1g-10gb-0", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "Gpu", "gpu_0", "gpu.0", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_subdomain("gpu.tessera.dev"));
        assert!(!is_dns_subdomain("gpu..dev"));
    }

    #[test]
    fn qualified_names() {
        for ok in [
            "memory",
            "gpu.tessera.dev/memory",
            "resource.kubernetes.io/pcieRoot",
            "_x1",
        ] {
            assert_eq!(check_qualified_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "1gpu",
            "gpu-index",
            "Bad_Domain/x",
            "a/b/c",
            &"x".repeat(33),
            &format!("{}/x", "d".repeat(64)),
        ] {
            assert!(check_qualified_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn values() {
        assert!(check_version_value("535.129.3").is_ok());
        assert!(check_version_value("9.0.0").is_ok());
        assert!(
            check_version_value("535.129.03").is_err(),
            "leading zeros are not semver"
        );
        assert!(check_version_value("12.2").is_err());
        assert!(check_string_value(&"x".repeat(64)).is_ok());
        assert!(check_string_value(&"x".repeat(65)).is_err());
    }
}
