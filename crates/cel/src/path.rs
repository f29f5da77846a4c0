//! Constant device paths, resolved in one step.
//!
//! The interpreter walks `device.attributes["gpu.tessera.dev"].type` field by field, joining and
//! looking up names at each step. Compilation rewrites the constant path into one identifier,
//! `@attributes:gpu/tessera/dev.type` (or `@attributes:gpu/tessera/dev` for the domain's map),
//! which the `DeviceContext` resolves directly. The domain's dots become slashes so that the names
//! stay unambiguous (domains cannot contain `/`). `@` cannot start an identifier in CEL source,
//! so these names never clash with a user's. An identifier the device does not have surfaces as
//! an undeclared reference, which [`missing_key`] turns back into upstream's `no such key`.

use cel::common::ast::{Expr, IdedExpr};

use crate::references::DeviceMap;

const ATTRIBUTES: &str = "@attributes:";
const CAPACITY: &str = "@capacity:";

/// A rewritten lookup: the domain (dots encoded as slashes) and possibly an identifier in it.
pub(crate) struct Lookup<'a> {
    pub encoded_domain: &'a str,
    pub id: Option<&'a str>,
}

/// The identifier standing for `device.<map>[domain]`, or `None` if `domain` cannot be encoded
/// (it is not a plain DNS subdomain).
pub(crate) fn identifier(map: DeviceMap, domain: &str) -> Option<String> {
    let plain = !domain.is_empty()
        && domain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    plain.then(|| {
        let prefix = match map {
            DeviceMap::Attributes => ATTRIBUTES,
            DeviceMap::Capacity => CAPACITY,
        };
        format!("{prefix}{}", domain.replace('.', "/"))
    })
}

/// Whether `name` is one of the identifiers [`identifier`] makes.
pub(crate) fn is_identifier(name: &str) -> bool {
    name.starts_with(ATTRIBUTES) || name.starts_with(CAPACITY)
}

/// Splits a name the interpreter looks up: `@attributes:<domain>` or `@attributes:<domain>.<id>`.
pub(crate) fn parse(name: &str) -> Option<(DeviceMap, Lookup<'_>)> {
    let (map, rest) = match name.strip_prefix(ATTRIBUTES) {
        Some(rest) => (DeviceMap::Attributes, rest),
        None => (DeviceMap::Capacity, name.strip_prefix(CAPACITY)?),
    };
    let lookup = match rest.split_once('.') {
        Some((encoded_domain, id)) => Lookup {
            encoded_domain,
            id: Some(id),
        },
        None => Lookup {
            encoded_domain: rest,
            id: None,
        },
    };
    Some((map, lookup))
}

/// The identifier missing from the device, if `name` is a rewritten attribute or capacity lookup.
pub(crate) fn missing_key(name: &str) -> Option<&str> {
    parse(name).and_then(|(_, lookup)| lookup.id)
}

/// Whether `domain` is `encoded` with its dots encoded as slashes.
pub(crate) fn is_encoded(domain: &str, encoded: &str) -> bool {
    domain.len() == encoded.len()
        && domain
            .bytes()
            .zip(encoded.bytes())
            .all(|(d, e)| d == e || (d == b'.' && e == b'/'))
}

/// Whether a compiled (rewritten) program reads the device only through names resolved in one
/// step: the lookups of this module, `device.driver` and `device.allowMultipleAllocations`.
/// Such a program never needs the `device` map or its `attributes`/`capacity` maps as a whole,
/// so it can be evaluated on a [`crate::DeviceView`] without building a
/// [`crate::DeviceContext`]. Conservative: a comprehension or `cel.bind` variable named `device`,
/// or a struct literal, answers no.
pub(crate) fn reads_paths_only(program: &IdedExpr) -> bool {
    let (mut device_idents, mut one_step_fields, mut other) = (0usize, 0usize, false);
    crate::walk::visit(program, &mut |e| match &e.expr {
        Expr::Ident(name) if name == "device" => device_idents += 1,
        Expr::Select(select)
            if !select.test
                && matches!(&select.operand.expr, Expr::Ident(name) if name == "device")
                && matches!(select.field.as_str(), "driver" | "allowMultipleAllocations") =>
        {
            one_step_fields += 1;
        }
        Expr::Comprehension(c) => {
            other |= [Some(&c.iter_var), c.iter_var2.as_ref(), Some(&c.accu_var)]
                .into_iter()
                .flatten()
                .any(|v| v == "device");
        }
        Expr::Struct(_) => other = true,
        _ => {}
    });
    !other && device_idents == one_step_fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_round_trip() {
        let id = identifier(DeviceMap::Capacity, "gpu.tessera.dev").unwrap();
        assert_eq!(id, "@capacity:gpu/tessera/dev");
        assert!(is_identifier(&id));
        let name = format!("{id}.memory");
        let (map, lookup) = parse(&name).unwrap();
        assert_eq!(map, DeviceMap::Capacity);
        assert!(is_encoded("gpu.tessera.dev", lookup.encoded_domain));
        assert!(!is_encoded("gpu.tessera.de", lookup.encoded_domain));
        assert_eq!(lookup.id, Some("memory"));
        assert_eq!(identifier(DeviceMap::Attributes, "a/b"), None);
        assert_eq!(identifier(DeviceMap::Attributes, ""), None);
        assert!(parse("device").is_none());
    }
}
