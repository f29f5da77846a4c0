//! The attribute and capacity names a selector reads with constant keys, for linting them
//! against a driver's schema (`tessera validate`).

use cel::common::ast::{Expr, IdedExpr, LiteralValue, operators};

/// Which map of the device a name is looked up in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceMap {
    /// `device.attributes`
    Attributes,
    /// `device.capacity`
    Capacity,
}

/// A constant lookup such as `device.attributes["gpu.tessera.dev"].productName`,
/// `device.capacity["gpu.tessera.dev"][?"memory"]` or `"nvlinkIsland" in …`, also through a
/// `cel.bind` alias of the domain map.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameReference {
    pub map: DeviceMap,
    pub domain: String,
    pub name: String,
}

/// Every constant name lookup in `expr`, in source order, duplicates removed.
pub(crate) fn name_references(expr: &IdedExpr) -> Vec<NameReference> {
    let mut found = Vec::new();
    walk(expr, &mut Vec::new(), &mut found);
    let mut unique = Vec::with_capacity(found.len());
    for reference in found {
        if !unique.contains(&reference) {
            unique.push(reference);
        }
    }
    unique
}

/// A variable bound to a domain map by `cel.bind`.
type Alias = (String, DeviceMap, String);

fn walk(expr: &IdedExpr, aliases: &mut Vec<Alias>, found: &mut Vec<NameReference>) {
    if let Some(reference) = lookup(expr, aliases) {
        found.push(reference);
    }
    match &expr.expr {
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                walk(target, aliases, found);
            }
            for arg in &call.args {
                walk(arg, aliases, found);
            }
        }
        Expr::Comprehension(c) => {
            walk(&c.iter_range, aliases, found);
            walk(&c.accu_init, aliases, found);
            // `cel.bind(v, device.attributes["d"], body)` makes `v` an alias of the domain map,
            // any other comprehension variable hides an alias of the same name.
            let bound = domain_map(&c.accu_init, aliases)
                .map(|(map, domain)| (c.accu_var.clone(), map, domain));
            let depth = aliases.len();
            aliases.push(
                bound.unwrap_or_else(|| (c.accu_var.clone(), DeviceMap::Attributes, String::new())),
            );
            aliases.push((c.iter_var.clone(), DeviceMap::Attributes, String::new()));
            for e in [&c.loop_cond, &c.loop_step, &c.result] {
                walk(e, aliases, found);
            }
            aliases.truncate(depth);
        }
        Expr::List(list) => list.elements.iter().for_each(|e| walk(e, aliases, found)),
        Expr::Map(map) => {
            for entry in &map.entries {
                if let cel::common::ast::EntryExpr::MapEntry(e) = &entry.expr {
                    walk(&e.key, aliases, found);
                    walk(&e.value, aliases, found);
                }
            }
        }
        Expr::Select(select) => walk(&select.operand, aliases, found),
        _ => {}
    }
}

fn string_literal(expr: &IdedExpr) -> Option<&str> {
    match &expr.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

/// `expr` as a name lookup in a domain map, if it is one.
fn lookup(expr: &IdedExpr, aliases: &[Alias]) -> Option<NameReference> {
    let (container, name) = match &expr.expr {
        Expr::Select(select) => (&*select.operand, select.field.as_str()),
        Expr::Call(call) if call.target.is_none() => {
            match (call.func_name.as_str(), call.args.as_slice()) {
                (
                    operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT,
                    [container, key],
                ) => (container, string_literal(key)?),
                (operators::IN, [key, container]) => (container, string_literal(key)?),
                _ => return None,
            }
        }
        _ => return None,
    };
    let (map, domain) = domain_map(container, aliases)?;
    Some(NameReference {
        map,
        domain,
        name: name.to_owned(),
    })
}

/// `expr` as `device.attributes["domain"]` (or `device.capacity[…]`, or an alias of one).
fn domain_map(expr: &IdedExpr, aliases: &[Alias]) -> Option<(DeviceMap, String)> {
    match &expr.expr {
        Expr::Ident(name) => aliases
            .iter()
            .rev()
            .find(|(alias, _, _)| alias == name)
            .filter(|(_, _, domain)| !domain.is_empty())
            .map(|(_, map, domain)| (*map, domain.clone())),
        Expr::Call(call) if call.target.is_none() && call.func_name == operators::INDEX => {
            let [maps, domain] = call.args.as_slice() else {
                return None;
            };
            let Expr::Select(select) = &maps.expr else {
                return None;
            };
            let is_device = matches!(&select.operand.expr, Expr::Ident(name) if name == "device");
            let map = match select.field.as_str() {
                "attributes" if is_device && !select.test => DeviceMap::Attributes,
                "capacity" if is_device && !select.test => DeviceMap::Capacity,
                _ => return None,
            };
            Some((map, string_literal(domain)?.to_owned()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SelectorCompiler;

    fn references(expression: &str) -> Vec<(DeviceMap, String, String)> {
        let selector = SelectorCompiler::new().compile(expression).unwrap();
        selector
            .name_references()
            .iter()
            .map(|r| (r.map, r.domain.clone(), r.name.clone()))
            .collect()
    }

    fn attr(domain: &str, name: &str) -> (DeviceMap, String, String) {
        (DeviceMap::Attributes, domain.to_owned(), name.to_owned())
    }

    #[test]
    fn finds_every_form_of_constant_lookup() {
        let g = "gpu.tessera.dev";
        assert_eq!(
            references(
                r#"device.attributes["gpu.tessera.dev"].productName == "x" &&
                   device.attributes["gpu.tessera.dev"]["memroy"] == 1 &&
                   device.attributes["gpu.tessera.dev"].?brand.orValue("") == "" &&
                   device.attributes["gpu.tessera.dev"][?"index"].orValue(0) == 0 &&
                   has(device.attributes["gpu.tessera.dev"].migEnabled) &&
                   "nvlinkIsland" in device.attributes["gpu.tessera.dev"] &&
                   device.attributes["resource.kubernetes.io"].pcieRoot != "" &&
                   device.attributes["gpu.tessera.dev"].productName != "y""#
            ),
            vec![
                attr(g, "productName"),
                attr(g, "memroy"),
                attr(g, "brand"),
                attr(g, "index"),
                attr(g, "migEnabled"),
                attr(g, "nvlinkIsland"),
                attr("resource.kubernetes.io", "pcieRoot"),
            ]
        );
        assert_eq!(
            references(
                r#"device.capacity["gpu.tessera.dev"].memory.isGreaterThan(quantity("1Gi"))"#
            ),
            vec![(DeviceMap::Capacity, g.to_owned(), "memory".to_owned())]
        );
    }

    #[test]
    fn follows_bind_aliases_and_respects_shadowing() {
        assert_eq!(
            references(
                r#"cel.bind(t, device.attributes["gpu.tessera.dev"], t.type == "gpu" && [1].all(t, t > 0) && t.archtecture == "Hopper")"#
            ),
            vec![
                attr("gpu.tessera.dev", "type"),
                attr("gpu.tessera.dev", "archtecture")
            ]
        );
        assert!(
            references(r#"device.attributes["gpu.tessera.dev"].exists(k, k == "x")"#).is_empty()
        );
    }
}
