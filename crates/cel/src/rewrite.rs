//! Moving a selector from one driver's names to another's (`tessera migrate`): the driver name
//! and attribute/capacity domain in string literals, and attribute or capacity names, edited in
//! place by the parser's source offsets, so the rest of the expression (spacing, comments, quote
//! style) stays as written. Only the literals and names the AST shows to be a domain, a driver
//! or a lookup are touched; any other occurrence of the old domain is reported, not edited.
//! A `cel.bind` variable bound to `device.attributes` / `device.capacity`, or to one domain's map
//! of them, is followed like the expression it stands for (inner comprehension variables of the
//! same name hide it), so names read through it are renamed and checked too.

use cel::common::ast::{Expr, IdedExpr, LiteralValue, SourceInfo, operators};

use crate::error::CompileError;
use crate::references::DeviceMap;

/// What becomes of a name looked up under the old domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameFate {
    /// The new driver publishes it under the same name.
    Same,
    /// The new driver publishes it under another name.
    Renamed(String),
    /// The new driver has no such attribute or capacity; the text says what to do instead.
    Missing(String),
}

/// A rewritten selector and what was (not) done to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The new expression.
    pub expression: String,
    /// One line per edit.
    pub changes: Vec<String>,
    /// One line per thing that could not be carried over (the expression keeps it as written).
    pub not_carried: Vec<String>,
}

/// Rewrites `expression` from domain/driver `from` to `to`; `fate` says what becomes of each
/// attribute or capacity name looked up under `from`. A selector that does not parse is an error.
pub fn rewrite_domain(
    expression: &str,
    from: &str,
    to: &str,
    fate: &dyn Fn(DeviceMap, &str) -> NameFate,
) -> Result<Rewritten, CompileError> {
    let (program, source) = crate::env::environment()
        .parser()
        .parse_with_source_info(expression)
        .map_err(|errors| crate::selector::syntax_error(expression, &errors))?;
    let mut walker = Walker {
        text: expression,
        source: &source,
        from,
        to,
        fate,
        edits: Vec::new(),
        handled: Vec::new(),
        aliases: Vec::new(),
        changes: Vec::new(),
        not_carried: Vec::new(),
    };
    walker.walk(&program);
    walker.report_stray_literals(&program);
    let Walker {
        mut edits,
        changes,
        mut not_carried,
        ..
    } = walker;
    edits.sort_by_key(|e| e.0);
    edits.dedup_by_key(|e| e.0);
    let mut out = String::with_capacity(expression.len());
    let mut at = 0;
    for (start, end, replacement) in edits {
        if start < at {
            not_carried.push(format!(
                "overlapping edits at byte {start}; that part is left as written"
            ));
            continue;
        }
        out.push_str(&expression[at..start]);
        out.push_str(&replacement);
        at = end;
    }
    out.push_str(&expression[at..]);
    Ok(Rewritten {
        expression: out,
        changes,
        not_carried,
    })
}

struct Walker<'a> {
    text: &'a str,
    source: &'a SourceInfo,
    from: &'a str,
    to: &'a str,
    fate: &'a dyn Fn(DeviceMap, &str) -> NameFate,
    /// (start, end exclusive, replacement), byte offsets.
    edits: Vec<(usize, usize, String)>,
    /// Ids of literals already dealt with.
    handled: Vec<u64>,
    /// Comprehension and `cel.bind` variables in scope, innermost last.
    aliases: Vec<(String, Bound)>,
    changes: Vec<String>,
    not_carried: Vec<String>,
}

fn string_literal(expr: &IdedExpr) -> Option<&str> {
    match &expr.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

/// What a variable in scope stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// `device.attributes` or `device.capacity`.
    DeviceMap(DeviceMap),
    /// `device.attributes["<from>"]` (or capacity): the old domain's map.
    OldDomainMap(DeviceMap),
    /// Anything else (also hides an outer alias of the same name).
    Other,
}

/// `device.<field>`.
fn is_device_field(expr: &IdedExpr, field: &str) -> bool {
    matches!(&expr.expr, Expr::Select(s)
        if s.field == field && !s.test && matches!(&s.operand.expr, Expr::Ident(i) if i == "device"))
}

/// `device.attributes` or `device.capacity`.
fn device_map(expr: &IdedExpr) -> Option<DeviceMap> {
    if is_device_field(expr, "attributes") {
        Some(DeviceMap::Attributes)
    } else if is_device_field(expr, "capacity") {
        Some(DeviceMap::Capacity)
    } else {
        None
    }
}

impl Walker<'_> {
    /// The byte range of node `id` (the parser's offsets are inclusive).
    fn span(&self, id: u64) -> Option<(usize, usize)> {
        let (start, stop) = self.source.offset_for(id)?;
        let (start, end) = (start as usize, stop as usize + 1);
        (end <= self.text.len()
            && self.text.is_char_boundary(start)
            && self.text.is_char_boundary(end))
        .then_some((start, end))
    }

    /// Replaces the string literal `expr` by `value`, in the literal's quote style.
    fn replace_literal(&mut self, expr: &IdedExpr, value: &str, what: &str) {
        let Some((start, end)) = self.span(expr.id) else {
            self.not_carried.push(format!(
                "{what}: no source position for the literal; left as written"
            ));
            return;
        };
        let written = &self.text[start..end];
        let quote = written.chars().last().filter(|c| *c == '"' || *c == '\'');
        let Some(quote) = quote.filter(|_| !written.starts_with(['r', 'R', 'b', 'B'])) else {
            self.not_carried.push(format!(
                "{what}: `{written}` is not a plain quoted string; left as written"
            ));
            return;
        };
        self.handled.push(expr.id);
        self.edits
            .push((start, end, format!("{quote}{value}{quote}")));
        self.changes
            .push(format!("{what}: {written} → {quote}{value}{quote}"));
    }

    fn walk(&mut self, expr: &IdedExpr) {
        match &expr.expr {
            Expr::Call(call) => {
                self.call(expr, call);
                if let Some(target) = &call.target {
                    self.walk(target);
                }
                for arg in &call.args {
                    self.walk(arg);
                }
            }
            Expr::Select(select) => {
                self.select(expr, select);
                self.walk(&select.operand);
            }
            Expr::Comprehension(c) => {
                self.walk(&c.iter_range);
                self.walk(&c.accu_init);
                // `cel.bind(v, init, body)` is a comprehension whose accumulator is `init`.
                let bound = if let Some(map) = self.old_domain_map(&c.accu_init) {
                    Bound::OldDomainMap(map)
                } else if let Some(map) = self.device_map(&c.accu_init) {
                    Bound::DeviceMap(map)
                } else {
                    Bound::Other
                };
                let depth = self.aliases.len();
                self.aliases.push((c.accu_var.clone(), bound));
                self.aliases.push((c.iter_var.clone(), Bound::Other));
                if let Some(second) = &c.iter_var2 {
                    self.aliases.push((second.clone(), Bound::Other));
                }
                for e in [&c.loop_cond, &c.loop_step, &c.result] {
                    self.walk(e);
                }
                self.aliases.truncate(depth);
            }
            Expr::List(list) => {
                for e in &list.elements {
                    self.walk(e);
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let cel::common::ast::EntryExpr::MapEntry(e) = &entry.expr {
                        self.walk(&e.key);
                        self.walk(&e.value);
                    }
                }
            }
            _ => {}
        }
    }

    /// `container[domain]`, `device.driver == "..."`, `"domain" in device.attributes`,
    /// `domain_map["name"]`, `"name" in domain_map`.
    fn call(&mut self, _expr: &IdedExpr, call: &cel::common::ast::CallExpr) {
        if call.target.is_some() {
            return;
        }
        let (from, to) = (self.from.to_owned(), self.to.to_owned());
        match (call.func_name.as_str(), call.args.as_slice()) {
            (operators::INDEX | operators::OPT_INDEX, [container, key]) => {
                if self.device_map(container).is_some()
                    && string_literal(key) == Some(from.as_str())
                {
                    self.replace_literal(key, &to, "domain");
                } else if let (Some(map), Some(name)) =
                    (self.old_domain_map(container), string_literal(key))
                {
                    let name = name.to_owned();
                    self.name_literal(map, key, &name);
                }
            }
            (operators::IN, [key, container]) => {
                if self.device_map(container).is_some()
                    && string_literal(key) == Some(from.as_str())
                {
                    self.replace_literal(key, &to, "domain");
                } else if let (Some(map), Some(name)) =
                    (self.old_domain_map(container), string_literal(key))
                {
                    let name = name.to_owned();
                    self.name_literal(map, key, &name);
                }
            }
            (operators::EQUALS | operators::NOT_EQUALS, [left, right]) => {
                for (a, b) in [(left, right), (right, left)] {
                    if is_device_field(a, "driver") && string_literal(b) == Some(from.as_str()) {
                        self.replace_literal(b, &to, "driver");
                    }
                }
            }
            _ => {}
        }
    }

    /// What the variable `expr` is bound to, if it is a variable in scope.
    fn bound(&self, expr: &IdedExpr) -> Option<Bound> {
        let Expr::Ident(name) = &expr.expr else {
            return None;
        };
        self.aliases
            .iter()
            .rev()
            .find(|(alias, _)| alias == name)
            .map(|(_, bound)| *bound)
    }

    /// `device.attributes` or `device.capacity`, or a variable bound to one.
    fn device_map(&self, expr: &IdedExpr) -> Option<DeviceMap> {
        match self.bound(expr) {
            Some(Bound::DeviceMap(map)) => Some(map),
            Some(_) => None,
            None => device_map(expr),
        }
    }

    /// `device.attributes["<from>"]` (or capacity), or a variable bound to it: the map of the
    /// old domain.
    fn old_domain_map(&self, expr: &IdedExpr) -> Option<DeviceMap> {
        if let Some(bound) = self.bound(expr) {
            return match bound {
                Bound::OldDomainMap(map) => Some(map),
                _ => None,
            };
        }
        let Expr::Call(call) = &expr.expr else {
            return None;
        };
        match (call.func_name.as_str(), call.args.as_slice()) {
            (operators::INDEX, [container, key]) if string_literal(key) == Some(self.from) => {
                self.device_map(container)
            }
            _ => None,
        }
    }

    fn select(&mut self, expr: &IdedExpr, select: &cel::common::ast::SelectExpr) {
        let Some(map) = self.old_domain_map(&select.operand) else {
            return;
        };
        match (self.fate)(map, &select.field) {
            NameFate::Same => {}
            NameFate::Renamed(new) => {
                // The select node's offset is its `.`; the field name follows it.
                let located = self.span(expr.id).and_then(|(dot, _)| {
                    let rest = &self.text[dot + 1..];
                    let skipped = rest.len() - rest.trim_start().len();
                    let start = dot + 1 + skipped;
                    self.text[start..]
                        .starts_with(select.field.as_str())
                        .then_some((start, start + select.field.len()))
                });
                match located {
                    Some((start, end)) => {
                        self.edits.push((start, end, new.clone()));
                        self.changes.push(format!(
                            "{} `{}` → `{new}`",
                            map_word(map),
                            select.field
                        ));
                    }
                    None => self.not_carried.push(format!(
                        "{} `{}`: not found in the source; rename it to `{new}` by hand",
                        map_word(map),
                        select.field
                    )),
                }
            }
            NameFate::Missing(why) => {
                self.not_carried
                    .push(format!("{} `{}`: {why}", map_word(map), select.field))
            }
        }
    }

    fn name_literal(&mut self, map: DeviceMap, key: &IdedExpr, name: &str) {
        match (self.fate)(map, name) {
            NameFate::Same => {
                self.handled.push(key.id);
            }
            NameFate::Renamed(new) => self.replace_literal(key, &new, map_word(map)),
            NameFate::Missing(why) => {
                self.handled.push(key.id);
                self.not_carried
                    .push(format!("{} `{name}`: {why}", map_word(map)));
            }
        }
    }

    /// Literals equal to the old domain that are not a domain, driver or name: reported.
    fn report_stray_literals(&mut self, expr: &IdedExpr) {
        let mut stray = Vec::new();
        collect_literals(expr, self.from, &mut stray);
        for id in stray {
            if !self.handled.contains(&id) {
                let at = self
                    .span(id)
                    .map(|(start, _)| format!(" at byte {start}"))
                    .unwrap_or_default();
                self.not_carried.push(format!(
                    "the string \"{}\"{at} is not used as a driver name or attribute domain; left as written",
                    self.from
                ));
            }
        }
    }
}

fn map_word(map: DeviceMap) -> &'static str {
    match map {
        DeviceMap::Attributes => "attribute",
        DeviceMap::Capacity => "capacity",
    }
}

fn collect_literals(expr: &IdedExpr, value: &str, found: &mut Vec<u64>) {
    match &expr.expr {
        Expr::Literal(LiteralValue::String(s)) if s.inner() == value => found.push(expr.id),
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                collect_literals(target, value, found);
            }
            for arg in &call.args {
                collect_literals(arg, value, found);
            }
        }
        Expr::Select(select) => collect_literals(&select.operand, value, found),
        Expr::Comprehension(c) => {
            for e in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                collect_literals(e, value, found);
            }
        }
        Expr::List(list) => list
            .elements
            .iter()
            .for_each(|e| collect_literals(e, value, found)),
        Expr::Map(map) => {
            for entry in &map.entries {
                if let cel::common::ast::EntryExpr::MapEntry(e) = &entry.expr {
                    collect_literals(&e.key, value, found);
                    collect_literals(&e.value, value, found);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fate(map: DeviceMap, name: &str) -> NameFate {
        match (map, name) {
            (_, "addressingMode") => NameFate::Missing("not published".into()),
            (DeviceMap::Attributes, "pcieBusID") => NameFate::Renamed("pciBusID".into()),
            _ => NameFate::Same,
        }
    }

    fn rewrite(expression: &str) -> Rewritten {
        rewrite_domain(expression, "gpu.nvidia.com", "gpu.tessera.dev", &fate).unwrap()
    }

    #[test]
    fn driver_domains_and_names_are_edited_in_place() {
        let r = rewrite(
            "device.driver == 'gpu.nvidia.com' &&\n  device.attributes[\"gpu.nvidia.com\"].productName.lowerAscii().matches('^.*a100.*$') &&\n  device.attributes['gpu.nvidia.com'].pcieBusID != '' && 'é' != ''",
        );
        assert_eq!(
            r.expression,
            "device.driver == 'gpu.tessera.dev' &&\n  device.attributes[\"gpu.tessera.dev\"].productName.lowerAscii().matches('^.*a100.*$') &&\n  device.attributes['gpu.tessera.dev'].pciBusID != '' && 'é' != ''"
        );
        assert_eq!(r.changes.len(), 4, "{:?}", r.changes);
        assert!(r.not_carried.is_empty(), "{:?}", r.not_carried);
        // The result compiles.
        crate::SelectorCompiler::new()
            .compile(&r.expression)
            .unwrap();
    }

    #[test]
    fn keys_in_and_index_forms_binds_and_capacity() {
        let r = rewrite(
            "'gpu.nvidia.com' in device.attributes && 'pcieBusID' in device.attributes['gpu.nvidia.com'] && device.capacity['gpu.nvidia.com']['memory'].compareTo(quantity('10Gi')) >= 0",
        );
        assert_eq!(
            r.expression,
            "'gpu.tessera.dev' in device.attributes && 'pciBusID' in device.attributes['gpu.tessera.dev'] && device.capacity['gpu.tessera.dev']['memory'].compareTo(quantity('10Gi')) >= 0"
        );
    }

    #[test]
    fn what_cannot_be_carried_is_reported_and_left() {
        let r = rewrite(
            "device.attributes['gpu.nvidia.com'].addressingMode == 'HMM' && 'gpu.nvidia.com'.size() > 0",
        );
        assert_eq!(
            r.expression,
            "device.attributes['gpu.tessera.dev'].addressingMode == 'HMM' && 'gpu.nvidia.com'.size() > 0"
        );
        assert_eq!(r.not_carried.len(), 2, "{:?}", r.not_carried);
        assert!(r.not_carried[0].contains("attribute `addressingMode`: not published"));
        assert!(r.not_carried[1].contains("not used as a driver name or attribute domain"));
    }

    #[test]
    fn names_read_through_cel_bind_are_renamed_and_checked() {
        let r = rewrite(
            "cel.bind(g, device.attributes['gpu.nvidia.com'], g.pcieBusID != '' && 'pcieBusID' in g && g.addressingMode == 'HMM' && [1].all(g, g > 0)) && cel.bind(a, device.attributes, a['gpu.nvidia.com'].pcieBusID != '')",
        );
        assert_eq!(
            r.expression,
            "cel.bind(g, device.attributes['gpu.tessera.dev'], g.pciBusID != '' && 'pciBusID' in g && g.addressingMode == 'HMM' && [1].all(g, g > 0)) && cel.bind(a, device.attributes, a['gpu.tessera.dev'].pciBusID != '')"
        );
        assert_eq!(r.not_carried.len(), 1, "{:?}", r.not_carried);
        assert!(r.not_carried[0].contains("attribute `addressingMode`: not published"));
        crate::SelectorCompiler::new()
            .compile(&r.expression)
            .unwrap();
        // An inner variable of the same name is not the alias: `g.pcieBusID` there is left.
        let r = rewrite(
            "cel.bind(g, device.attributes['gpu.nvidia.com'], [{'pcieBusID': 1}].all(g, g.pcieBusID > 0))",
        );
        assert!(
            r.expression.ends_with("all(g, g.pcieBusID > 0))"),
            "{}",
            r.expression
        );
        assert!(r.not_carried.is_empty(), "{:?}", r.not_carried);
    }

    #[test]
    fn a_selector_that_does_not_parse_is_an_error() {
        assert!(rewrite_domain("device.(", "a", "b", &fate).is_err());
    }
}
