//! A light type checker for selectors, in the spirit of cel-go's: it resolves identifiers and
//! functions against the DRA environment, infers static types where the expression makes them
//! obvious (`Dyn` elsewhere, which is never an error), and estimates the worst-case cost.
//!
//! It reports what upstream reports at compile time: `undeclared reference to 'x'`,
//! `undefined field 'x'`, `found no matching overload for …` when argument types are known not to
//! fit, heterogeneous list and map literals, invalid literal regular expressions, and a result
//! type that is known and not `bool`. It is deliberately lenient where types are dynamic: a
//! selector upstream accepts must never be rejected here.

mod cost;
mod types;

use cel::common::ast::{
    ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue, SourceInfo, operators,
};

pub(crate) use cost::Cost;
use cost::{Info, Size};
pub(crate) use types::Ty;
use types::{Sig, regex_argument, signatures};

/// What upstream declares for the device: each attribute map is bound by the maximum number of
/// attributes and capacities per device.
const MAX_ENTRIES_PER_DEVICE: u64 = 32;
/// Longest domain, identifier, string value or list attribute a device can carry.
const MAX_DOMAIN_LENGTH: u64 = 63;
const MAX_ATTRIBUTE_VALUE_SIZE: u64 = 64;

/// A compile-time finding: the node it is about and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckError {
    pub id: u64,
    pub message: String,
}

/// The outcome of checking an expression.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub ty: Ty,
    pub cost: Cost,
}

/// Checks `expr`.
pub(crate) fn check(expr: &IdedExpr) -> Result<Checked, CheckError> {
    let mut checker = Checker { scopes: Vec::new() };
    let info = checker.expr(expr)?;
    Ok(Checked {
        ty: info.ty,
        cost: info.cost,
    })
}

/// Line and 1-based column of node `id`, and the caret snippet cel-go prints under errors.
pub(crate) fn position(source: &SourceInfo, id: u64) -> (usize, usize, String) {
    let offset = source.offset_for(id).map_or(0, |(start, _)| start as usize);
    let mut line_start = 0;
    for (number, line) in source.source.split_inclusive('\n').enumerate() {
        let line_end = line_start + line.chars().count();
        if offset < line_end {
            let column = offset - line_start + 1;
            let text = line.trim_end_matches(['\n', '\r']);
            let snippet = format!("\n | {text}\n | {:.>column$}", "^");
            return (number + 1, column, snippet);
        }
        line_start = line_end;
    }
    (1, 1, String::new())
}

/// The deepest nesting of `expr`, computed without recursion so that any parsed tree is safe.
pub(crate) fn depth(expr: &IdedExpr) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(expr, 1usize)];
    while let Some((node, level)) = stack.pop() {
        deepest = deepest.max(level);
        for child in children(node) {
            stack.push((child, level + 1));
        }
    }
    deepest
}

fn children(node: &IdedExpr) -> Vec<&IdedExpr> {
    match &node.expr {
        Expr::Call(call) => call.target.iter().map(|t| &**t).chain(&call.args).collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => map
            .entries
            .iter()
            .flat_map(|e| match &e.expr {
                EntryExpr::MapEntry(entry) => vec![&entry.key, &entry.value],
                EntryExpr::StructField(field) => vec![&field.value],
            })
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .flat_map(|e| match &e.expr {
                EntryExpr::MapEntry(entry) => vec![&entry.key, &entry.value],
                EntryExpr::StructField(field) => vec![&field.value],
            })
            .collect(),
        Expr::Select(select) => vec![&*select.operand],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

struct Checker {
    /// Variables in scope, innermost last.
    scopes: Vec<(String, Info)>,
}

fn error(id: u64, message: impl Into<String>) -> CheckError {
    CheckError {
        id,
        message: message.into(),
    }
}

fn no_overload(id: u64, function: &str, receiver: Option<&Ty>, args: &[Ty]) -> CheckError {
    let args = args
        .iter()
        .map(Ty::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let signature = match receiver {
        Some(r) => format!("{r}.({args})"),
        None => format!("({args})"),
    };
    error(
        id,
        format!("found no matching overload for '{function}' applied to '{signature}'"),
    )
}

impl Checker {
    fn expr(&mut self, e: &IdedExpr) -> Result<Info, CheckError> {
        match &e.expr {
            Expr::Literal(literal) => Ok(literal_info(literal)),
            Expr::Ident(name) => self.ident(e.id, name),
            Expr::Select(select) => {
                let operand = self.expr(&select.operand)?;
                let field = select_type(e.id, &operand.ty, &select.field)?;
                let ty = if select.test { Ty::Bool } else { field.ty };
                Ok(Info::new(ty, operand.cost.plus(1), field.size).with_elements(field.elements))
            }
            Expr::Call(call) => {
                let target = call.target.as_deref();
                self.call(e.id, &call.func_name, target, &call.args)
            }
            Expr::List(list) => {
                let mut items = Vec::with_capacity(list.elements.len());
                for (index, element) in list.elements.iter().enumerate() {
                    let mut info = self.expr(element)?;
                    if list.optional_indices.contains(&index)
                        && let Ty::Optional(inner) = info.ty
                    {
                        info.ty = *inner;
                    }
                    items.push((element.id, info));
                }
                let element = homogeneous(items.iter().map(|(id, i)| (*id, &i.ty)))?;
                let cost = items
                    .iter()
                    .fold(Cost::known(10), |c, (_, i)| c.add(i.cost));
                let elements = items
                    .iter()
                    .map(|(_, i)| i.size)
                    .fold(Size::Known(0), Size::max);
                Ok(
                    Info::new(Ty::list(element), cost, Size::Known(items.len() as u64))
                        .with_elements(elements),
                )
            }
            Expr::Map(map) => self.map_literal(map),
            Expr::Comprehension(c) => self.comprehension(c),
            Expr::Struct(s) => Err(error(
                e.id,
                format!(
                    "undeclared reference to '{}' (in container '')",
                    s.type_name
                ),
            )),
            Expr::Unspecified => Err(error(e.id, "unsupported expression")),
        }
    }

    fn ident(&self, id: u64, name: &str) -> Result<Info, CheckError> {
        if let Some((_, info)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
            return Ok(info.clone().with_cost(Cost::known(1)));
        }
        match name {
            "device" => Ok(Info::new(Ty::Device, Cost::known(1), Size::Unknown)),
            "int" | "uint" | "double" | "bool" | "string" | "bytes" | "list" | "map"
            | "null_type" | "type" | "optional_type" => {
                Ok(Info::new(Ty::Type, Cost::known(1), Size::Unknown))
            }
            _ => Err(error(
                id,
                format!("undeclared reference to '{name}' (in container '')"),
            )),
        }
    }

    fn map_literal(&mut self, map: &cel::common::ast::MapExpr) -> Result<Info, CheckError> {
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut cost = Cost::known(30);
        for entry in &map.entries {
            let EntryExpr::MapEntry(entry_expr) = &entry.expr else {
                return Err(error(entry.id, "unsupported map entry"));
            };
            let key = self.expr(&entry_expr.key)?;
            let mut value = self.expr(&entry_expr.value)?;
            if entry_expr.optional
                && let Ty::Optional(inner) = value.ty
            {
                value.ty = *inner;
            }
            if !matches!(key.ty, Ty::Dyn | Ty::Bool | Ty::Int | Ty::Uint | Ty::String) {
                return Err(error(
                    entry_expr.key.id,
                    format!("unsupported map key type: {}", key.ty),
                ));
            }
            cost = cost.add(key.cost).add(value.cost);
            keys.push((entry_expr.key.id, key.ty));
            values.push((entry_expr.value.id, value.ty));
        }
        let key = homogeneous(keys.iter().map(|(id, t)| (*id, t)))?;
        let value = homogeneous(values.iter().map(|(id, t)| (*id, t)))?;
        Ok(Info::new(
            Ty::map(key, value),
            cost,
            Size::Known(map.entries.len() as u64),
        ))
    }

    fn comprehension(&mut self, c: &ComprehensionExpr) -> Result<Info, CheckError> {
        let range = self.expr(&c.iter_range)?;
        let iter_ty = match &range.ty {
            Ty::List(element) => (**element).clone(),
            Ty::Map(key, _) => (**key).clone(),
            Ty::Dyn => Ty::Dyn,
            other => {
                return Err(error(
                    c.iter_range.id,
                    format!(
                        "expression of type '{other}' cannot be the range of a comprehension (must be list, map, or dynamic)"
                    ),
                ));
            }
        };
        let init = self.expr(&c.accu_init)?;
        let accu = Info::new(init.ty.clone(), Cost::known(1), init.size);
        self.scopes.push((c.accu_var.clone(), accu));
        self.scopes.push((
            c.iter_var.clone(),
            Info::new(iter_ty, Cost::known(1), range.elements),
        ));
        let body = self
            .expr(&c.loop_cond)
            .and_then(|cond| Ok((cond, self.expr(&c.loop_step)?)));
        self.scopes.pop();
        let result = body.and_then(|body| Ok((body, self.expr(&c.result)?)));
        self.scopes.pop();
        let ((cond, step), result) = result?;
        let iterations = range.size;
        let cost = range
            .cost
            .add(init.cost)
            .add(cond.cost.add(step.cost).times(iterations))
            .add(result.cost);
        Ok(Info::new(result.ty, cost, result.size).with_elements(result.elements))
    }

    fn call(
        &mut self,
        id: u64,
        name: &str,
        target: Option<&IdedExpr>,
        args: &[IdedExpr],
    ) -> Result<Info, CheckError> {
        // `optional.of(x)`, `sets.contains(a, b)`: a qualified global function, unless the
        // qualifier is a variable.
        if let Some(qualified) = target.and_then(qualified_name) {
            let root = qualified.split('.').next().unwrap_or_default();
            let full = format!("{qualified}.{name}");
            if signatures(&full).is_some()
                && !self.scopes.iter().any(|(n, _)| n == root)
                && root != "device"
            {
                return self.call(id, &full, None, args);
            }
        }
        let mut infos = Vec::with_capacity(args.len() + 1);
        if let Some(target) = target {
            infos.push(self.expr(target)?);
        }
        for arg in args {
            infos.push(self.expr(arg)?);
        }
        let cost = infos.iter().fold(Cost::known(1), |c, i| c.add(i.cost));
        if let Some(info) = operator(id, name, &infos)? {
            let total = cost.add(info.cost);
            return Ok(info.with_cost(total));
        }
        let Some(sigs) = signatures(name) else {
            return Err(error(
                id,
                format!("undeclared reference to '{name}' (in container '')"),
            ));
        };
        let types: Vec<Ty> = infos.iter().map(|i| i.ty.clone()).collect();
        let (receiver, arg_types) = match target {
            Some(_) => (types.first(), &types[1..]),
            None => (None, &types[..]),
        };
        let ty = overload_type(id, name, sigs, receiver, arg_types)?;
        check_regex_literal(name, target, args)?;
        let call_cost = cost::call_cost(name, &infos);
        let size = cost::result_size(name, &infos);
        Ok(Info::new(ty, cost.add(call_cost), size))
    }
}

/// The result type of a call to `name` whose overloads are `sigs` (the join of every matching
/// overload's), or why none matches.
fn overload_type(
    id: u64,
    name: &str,
    sigs: &[Sig],
    receiver: Option<&Ty>,
    arg_types: &[Ty],
) -> Result<Ty, CheckError> {
    let matching: Vec<&Sig> = sigs
        .iter()
        .filter(|s| {
            s.receiver.is_some() == receiver.is_some()
                && s.receiver.zip(receiver).is_none_or(|(p, t)| p.accepts(t))
                && s.params.len() == arg_types.len()
                && s.params.iter().zip(arg_types).all(|(p, t)| p.accepts(t))
        })
        .collect();
    let Some(first) = matching.first() else {
        if !sigs
            .iter()
            .any(|s| s.receiver.is_some() == receiver.is_some())
        {
            return Err(error(
                id,
                format!("undeclared reference to '{name}' (in container '')"),
            ));
        }
        return Err(no_overload(id, name, receiver, arg_types));
    };
    Ok(matching
        .iter()
        .map(|s| s.result.resolve(receiver, arg_types))
        .fold(first.result.resolve(receiver, arg_types), |a, b| {
            Ty::join(&a, &b)
        }))
}

/// A literal regular expression passed to `name` compiles (upstream's `ValidateRegexLiterals`).
fn check_regex_literal(
    name: &str,
    target: Option<&IdedExpr>,
    args: &[IdedExpr],
) -> Result<(), CheckError> {
    let Some(index) = regex_argument(name) else {
        return Ok(());
    };
    let all_args: Vec<&IdedExpr> = target.into_iter().chain(args).collect();
    if let Some(IdedExpr {
        id,
        expr: Expr::Literal(LiteralValue::String(pattern)),
    }) = all_args.get(index)
    {
        crate::library::regex::compile(pattern.inner()).map_err(|e| {
            error(
                *id,
                format!("invalid regular expression {:?}: {e}", pattern.inner()),
            )
        })?;
    }
    Ok(())
}

/// Whether `target.name(…)` calls the global function `target.name` (as `sets.contains(…)`),
/// rather than `name` on the value `target`.
pub(crate) fn calls_qualified_function(target: &IdedExpr, name: &str) -> bool {
    qualified_name(target)
        .is_some_and(|q| q != "device" && signatures(&format!("{q}.{name}")).is_some())
}

/// The dotted name `t` spells (`a.b.c`), if it is one.
fn qualified_name(t: &IdedExpr) -> Option<String> {
    match &t.expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(select) if !select.test => {
            qualified_name(&select.operand).map(|q| format!("{q}.{}", select.field))
        }
        _ => None,
    }
}

fn literal_info(literal: &LiteralValue) -> Info {
    let (ty, size) = match literal {
        LiteralValue::Boolean(_) => (Ty::Bool, Size::Known(1)),
        LiteralValue::Bytes(b) => (Ty::Bytes, Size::Known(b.inner().len() as u64)),
        LiteralValue::Double(_) => (Ty::Double, Size::Known(1)),
        LiteralValue::Int(_) => (Ty::Int, Size::Known(1)),
        LiteralValue::Null => (Ty::Null, Size::Known(1)),
        LiteralValue::String(s) => (Ty::String, Size::Known(s.inner().len() as u64)),
        LiteralValue::UInt(_) => (Ty::Uint, Size::Known(1)),
    };
    Info::new(ty, Cost::known(0), size)
}

/// The common type of aggregate literal members; mixed known types are an error, as with
/// upstream's homogeneous aggregate literals.
fn homogeneous<'a>(mut types: impl Iterator<Item = (u64, &'a Ty)>) -> Result<Ty, CheckError> {
    let Some((_, first)) = types.next() else {
        return Ok(Ty::Dyn);
    };
    let mut common = first.clone();
    for (id, ty) in types {
        if ty.is_dyn() || common.is_dyn() {
            common = Ty::Dyn;
        } else if *ty != common {
            return Err(error(
                id,
                format!("expected type '{common}' but found '{ty}'"),
            ));
        }
    }
    Ok(common)
}

/// What selecting `field` on a value of type `operand` gives.
fn select_type(id: u64, operand: &Ty, field: &str) -> Result<Info, CheckError> {
    let known = |ty, size| Ok(Info::new(ty, Cost::known(0), size));
    match operand {
        Ty::Device => match field {
            "driver" => known(Ty::String, Size::Known(MAX_DOMAIN_LENGTH)),
            "allowMultipleAllocations" => known(Ty::Bool, Size::Known(1)),
            "attributes" => Ok(Info::new(
                Ty::map(Ty::String, Ty::map(Ty::String, Ty::Dyn)),
                Cost::known(0),
                Size::Known(MAX_ENTRIES_PER_DEVICE),
            )
            .with_elements(Size::Known(MAX_DOMAIN_LENGTH))),
            "capacity" => Ok(Info::new(
                Ty::map(Ty::String, Ty::map(Ty::String, Ty::Quantity)),
                Cost::known(0),
                Size::Known(MAX_ENTRIES_PER_DEVICE),
            )
            .with_elements(Size::Known(MAX_DOMAIN_LENGTH))),
            _ => Err(error(id, format!("undefined field '{field}'"))),
        },
        Ty::Map(_, value) => known((**value).clone(), element_size(value)),
        Ty::Dyn => known(Ty::Dyn, Size::Unknown),
        Ty::Optional(inner) => {
            let selected = select_type(id, inner, field)?;
            known(Ty::optional(selected.ty), selected.size)
        }
        other => Err(error(
            id,
            format!("type '{other}' does not support field selection"),
        )),
    }
}

/// Upper bound of the size of a map value or list element of type `ty` on a device.
fn element_size(ty: &Ty) -> Size {
    match ty {
        Ty::Map(..) => Size::Known(MAX_ENTRIES_PER_DEVICE),
        Ty::Dyn | Ty::String => Size::Known(MAX_ATTRIBUTE_VALUE_SIZE),
        _ => Size::Known(1),
    }
}

/// Types and checks the operators; `None` for an ordinary function.
fn operator(id: u64, name: &str, args: &[Info]) -> Result<Option<Info>, CheckError> {
    let types: Vec<&Ty> = args.iter().map(|a| &a.ty).collect();
    let ty = match operator_type(name, &types) {
        None => return Ok(None),
        Some(Some(ty)) => ty,
        Some(None) => {
            let owned: Vec<Ty> = types.iter().map(|t| (*t).clone()).collect();
            return Err(no_overload(id, name, None, &owned));
        }
    };
    let mut info = Info::new(ty, Cost::known(0), Size::Unknown);
    if let (operators::INDEX, Some(container)) = (name, args.first()) {
        info.size = match &container.ty {
            Ty::Map(_, v) => element_size(v),
            Ty::List(_) => container.elements,
            _ => Size::Unknown,
        };
        if let Ty::Map(_, v) = &container.ty
            && matches!(**v, Ty::Map(..))
        {
            info = info.with_elements(Size::Known(MAX_DOMAIN_LENGTH));
        }
    }
    Ok(Some(info))
}

/// The result type of operator `name` on arguments of `types`: `None` when `name` is not an
/// operator, `Some(None)` when no overload takes these types.
fn operator_type(name: &str, types: &[&Ty]) -> Option<Option<Ty>> {
    let ty = match (name, types) {
        (operators::LOGICAL_AND | operators::LOGICAL_OR, [a, b]) => {
            if !matches!(a, Ty::Bool | Ty::Dyn) || !matches!(b, Ty::Bool | Ty::Dyn) {
                return Some(None);
            }
            Ty::Bool
        }
        (operators::LOGICAL_NOT, [a]) => {
            if !matches!(a, Ty::Bool | Ty::Dyn) {
                return Some(None);
            }
            Ty::Bool
        }
        (operators::NEGATE, [a]) => match a {
            Ty::Int | Ty::Double | Ty::Dyn => (*a).clone(),
            _ => return Some(None),
        },
        (operators::CONDITIONAL, [c, a, b]) => {
            if !matches!(c, Ty::Bool | Ty::Dyn) {
                return Some(None);
            }
            Ty::join(a, b)
        }
        (operators::EQUALS | operators::NOT_EQUALS, [_, _]) => Ty::Bool,
        (
            operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS,
            [a, b],
        ) => {
            let orderable = |t: &Ty| {
                t.is_numeric()
                    || matches!(
                        t,
                        Ty::String | Ty::Bytes | Ty::Bool | Ty::Timestamp | Ty::Duration | Ty::Dyn
                    )
            };
            let compatible =
                a.is_dyn() || b.is_dyn() || a == b || (a.is_numeric() && b.is_numeric());
            if !orderable(a) || !orderable(b) || !compatible {
                return Some(None);
            }
            Ty::Bool
        }
        (
            operators::ADD
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO,
            [a, b],
        ) => return Some(arithmetic_type(name, a, b)),
        (operators::IN, [_, container]) => match container {
            Ty::List(_) | Ty::Map(..) | Ty::Dyn => Ty::Bool,
            _ => return Some(None),
        },
        (operators::INDEX, [container, index]) => return Some(index_type(container, index)),
        (operators::OPT_INDEX, [container, index]) => {
            let inner: &Ty = match container {
                Ty::Optional(inner) => inner,
                other => other,
            };
            return Some(index_type(inner, index).map(Ty::optional));
        }
        (operators::OPT_SELECT, [operand, _]) => match operand {
            Ty::Map(_, value) => Ty::optional((**value).clone()),
            Ty::Optional(inner) => match &**inner {
                Ty::Map(_, value) => Ty::optional((**value).clone()),
                _ => Ty::optional(Ty::Dyn),
            },
            Ty::Dyn => Ty::optional(Ty::Dyn),
            Ty::Device => Ty::optional(Ty::Dyn),
            _ => return Some(None),
        },
        _ => return None,
    };
    Some(Some(ty))
}

/// The result type of arithmetic operator `name` on `a` and `b`, or `None` without an overload.
fn arithmetic_type(name: &str, a: &Ty, b: &Ty) -> Option<Ty> {
    Some(match name {
        operators::ADD => match (a, b) {
            (Ty::Dyn, _) | (_, Ty::Dyn) => Ty::Dyn,
            (Ty::List(x), Ty::List(y)) => Ty::list(Ty::join(x, y)),
            (Ty::Timestamp, Ty::Duration) | (Ty::Duration, Ty::Timestamp) => Ty::Timestamp,
            (x, y)
                if x == y
                    && matches!(
                        x,
                        Ty::Int | Ty::Uint | Ty::Double | Ty::String | Ty::Bytes | Ty::Duration
                    ) =>
            {
                (*x).clone()
            }
            _ => return None,
        },
        operators::SUBSTRACT => match (a, b) {
            (Ty::Dyn, _) | (_, Ty::Dyn) => Ty::Dyn,
            (Ty::Timestamp, Ty::Timestamp) => Ty::Duration,
            (Ty::Timestamp, Ty::Duration) => Ty::Timestamp,
            (x, y) if x == y && matches!(x, Ty::Int | Ty::Uint | Ty::Double | Ty::Duration) => {
                (*x).clone()
            }
            _ => return None,
        },
        operators::MULTIPLY | operators::DIVIDE => match (a, b) {
            (Ty::Dyn, _) | (_, Ty::Dyn) => Ty::Dyn,
            (x, y) if x == y && x.is_numeric() => (*x).clone(),
            _ => return None,
        },
        operators::MODULO => match (a, b) {
            (Ty::Dyn, _) | (_, Ty::Dyn) => Ty::Dyn,
            (x, y) if x == y && matches!(x, Ty::Int | Ty::Uint) => (*x).clone(),
            _ => return None,
        },
        _ => return None,
    })
}

fn index_type(container: &Ty, index: &Ty) -> Option<Ty> {
    match container {
        Ty::List(element) if matches!(index, Ty::Int | Ty::Uint | Ty::Dyn) => {
            Some((**element).clone())
        }
        Ty::Map(_, value) => Some((**value).clone()),
        Ty::Dyn => Some(Ty::Dyn),
        _ => None,
    }
}
