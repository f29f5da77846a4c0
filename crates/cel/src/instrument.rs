//! Rewrites a checked expression so that evaluating it charges its cost (see [`crate::meter`]):
//!
//! - every comprehension iteration calls `@cost(…, w)`, where `w` is the number of nodes the
//!   iteration evaluates; the tick goes on the loop condition, or, for `map`/`filter`-shaped
//!   comprehensions (which the interpreter runs in place), on the appended element or the filter;
//! - arguments whose size is not bounded by the source or by the device (anything computed:
//!   concatenations, split results, bound variables…) are wrapped in `@size(…)` where a function
//!   would traverse them, and concatenations charge for what they build.
//!
//! The library functions of this crate charge for themselves and are not wrapped.

use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue, operators,
};

use crate::check::calls_qualified_function;
use crate::library::internal::{COST, EQUALS, IN_SET, NOT_EQUALS, SIZE};
use crate::path;
use crate::references::DeviceMap;
use crate::walk::visit;

/// Rewrites `expr` in place.
pub(crate) fn instrument(expr: &mut IdedExpr) {
    let mut next_id = max_id(expr) + 1;
    shorten_device_paths(expr, &mut Vec::new());
    rewrite(expr, &mut next_id);
}

/// Rewrites `device.attributes["<domain>"]` and `device.capacity["<domain>"]` into the single
/// identifiers of [`crate::path`], where `device` is not a comprehension or `cel.bind` variable.
fn shorten_device_paths(expr: &mut IdedExpr, shadowing: &mut Vec<String>) {
    let shadowed = shadowing.iter().any(|name| name == "device");
    if let Some(name) = device_path(expr).filter(|_| !shadowed) {
        expr.expr = Expr::Ident(name);
        return;
    }
    // `device.attributes["d"].id` as a whole: the identifier `@attributes:d.id`. A presence test
    // (`has(…)`) stays a selection.
    if let Expr::Select(select) = &mut expr.expr
        && !select.test
    {
        shorten_device_paths(&mut select.operand, shadowing);
        if let Expr::Ident(domain) = &select.operand.expr
            && path::is_identifier(domain)
            && !domain.contains('.')
        {
            expr.expr = Expr::Ident(format!("{domain}.{}", select.field));
        }
        return;
    }
    match &mut expr.expr {
        Expr::Call(call) => {
            if let Some(target) = &mut call.target {
                shorten_device_paths(target, shadowing);
            }
            call.args
                .iter_mut()
                .for_each(|a| shorten_device_paths(a, shadowing));
        }
        Expr::Comprehension(c) => {
            shorten_device_paths(&mut c.iter_range, shadowing);
            shorten_device_paths(&mut c.accu_init, shadowing);
            shadowing.push(c.accu_var.clone());
            shadowing.push(c.iter_var.clone());
            for e in [&mut c.loop_cond, &mut c.loop_step, &mut c.result] {
                shorten_device_paths(e, shadowing);
            }
            shadowing.truncate(shadowing.len() - 2);
        }
        Expr::List(list) => list
            .elements
            .iter_mut()
            .for_each(|e| shorten_device_paths(e, shadowing)),
        Expr::Map(map) => {
            for entry in &mut map.entries {
                if let EntryExpr::MapEntry(e) = &mut entry.expr {
                    shorten_device_paths(&mut e.key, shadowing);
                    shorten_device_paths(&mut e.value, shadowing);
                }
            }
        }
        Expr::Select(select) => shorten_device_paths(&mut select.operand, shadowing),
        _ => {}
    }
}

/// The identifier standing for `expr` if it is `device.<map>["<domain>"]`.
fn device_path(expr: &IdedExpr) -> Option<String> {
    let Expr::Call(call) = &expr.expr else {
        return None;
    };
    let (operators::INDEX, None, [maps, domain]) =
        (call.func_name.as_str(), &call.target, call.args.as_slice())
    else {
        return None;
    };
    let (Expr::Select(select), Expr::Literal(LiteralValue::String(domain))) =
        (&maps.expr, &domain.expr)
    else {
        return None;
    };
    if select.test || !matches!(&select.operand.expr, Expr::Ident(name) if name == "device") {
        return None;
    }
    let map = match select.field.as_str() {
        "attributes" => DeviceMap::Attributes,
        "capacity" => DeviceMap::Capacity,
        _ => return None,
    };
    path::identifier(map, domain.inner())
}

fn max_id(expr: &IdedExpr) -> u64 {
    let mut max = expr.id;
    visit(expr, &mut |e| max = max.max(e.id));
    max
}

/// Functions that traverse their arguments in time proportional to their size.
fn traverses_arguments(name: &str) -> bool {
    matches!(
        name,
        "size"
            | "contains"
            | "int"
            | "uint"
            | "double"
            | "string"
            | "bytes"
            | "bool"
            | "timestamp"
            | "duration"
            | operators::IN
    )
}

/// Operators that compare their operands: linear in the shorter one, so bounded if either is.
fn compares(name: &str) -> bool {
    matches!(
        name,
        operators::EQUALS
            | operators::NOT_EQUALS
            | EQUALS
            | NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS
            | "startsWith"
            | "endsWith"
    )
}

/// Whether the size of `expr`'s value is bounded without metering: a literal, or a value read
/// from the device through constant keys.
fn bounded(expr: &IdedExpr) -> bool {
    match &expr.expr {
        Expr::Literal(_) => true,
        Expr::Ident(name) => name == "device" || path::is_identifier(name),
        Expr::Select(select) => !select.test && bounded(&select.operand),
        Expr::Call(call) if call.func_name == operators::INDEX && call.target.is_none() => {
            matches!(call.args.as_slice(), [container, key] if bounded(container) && matches!(key.expr, Expr::Literal(_)))
        }
        _ => false,
    }
}

fn call(id: &mut u64, function: &str, args: Vec<IdedExpr>) -> IdedExpr {
    *id += 1;
    IdedExpr {
        id: *id,
        expr: Expr::Call(CallExpr {
            func_name: function.to_owned(),
            target: None,
            args,
        }),
    }
}

fn wrap_size(expr: &mut IdedExpr, id: &mut u64) {
    let inner = std::mem::take(expr);
    *expr = call(id, SIZE, vec![inner]);
}

fn wrap_cost(expr: &mut IdedExpr, weight: u64, id: &mut u64) {
    let inner = std::mem::take(expr);
    *id += 1;
    let units = IdedExpr {
        id: *id,
        expr: Expr::Literal(LiteralValue::Int((weight as i64).into())),
    };
    *expr = call(id, COST, vec![inner, units]);
}

fn rewrite(expr: &mut IdedExpr, id: &mut u64) {
    // `x in []`: cel-go folds it to `false` without evaluating `x`.
    if let Expr::Call(c) = &expr.expr
        && c.func_name == operators::IN
        && c.target.is_none()
        && matches!(c.args.get(1).map(|a| &a.expr), Some(Expr::List(l)) if l.elements.is_empty())
    {
        expr.expr = Expr::Literal(LiteralValue::Boolean(false.into()));
        return;
    }
    let mut charge_result = false;
    match &mut expr.expr {
        Expr::Call(c) => charge_result = rewrite_call(c, id),
        Expr::Comprehension(c) => {
            for e in [
                &mut c.iter_range,
                &mut c.accu_init,
                &mut c.loop_cond,
                &mut c.loop_step,
                &mut c.result,
            ] {
                rewrite(e, id);
            }
            tick(c, id);
        }
        Expr::List(list) => {
            for element in &mut list.elements {
                rewrite(element, id);
                if !bounded(element) {
                    wrap_size(element, id);
                }
            }
        }
        Expr::Map(map) => {
            for entry in &mut map.entries {
                if let EntryExpr::MapEntry(e) = &mut entry.expr {
                    rewrite(&mut e.key, id);
                    rewrite(&mut e.value, id);
                    if !bounded(&e.value) {
                        wrap_size(&mut e.value, id);
                    }
                }
            }
        }
        Expr::Select(select) => rewrite(&mut select.operand, id),
        _ => {}
    }
    if charge_result {
        wrap_size(expr, id);
    }
}

/// Rewrites a call's operands; `true` when the call's result must be charged by its size (a
/// concatenation of unbounded operands).
fn rewrite_call(c: &mut CallExpr, id: &mut u64) -> bool {
    if let Some(target) = &mut c.target {
        rewrite(target, id);
    }
    c.args.iter_mut().for_each(|a| rewrite(a, id));
    strict_operator(c);
    let name = c.func_name.clone();
    if let Some(target) = c.target.as_deref()
        && calls_qualified_function(target, &name)
    {
        // `sets.contains(…)`: the target is the function's namespace, not a value.
    } else if traverses_arguments(&name) {
        if let Some(target) = c.target.as_deref_mut().filter(|t| !bounded(t)) {
            wrap_size(target, id);
        }
        for arg in c.args.iter_mut().filter(|a| !bounded(a)) {
            wrap_size(arg, id);
        }
    } else if compares(&name) {
        let mut operands: Vec<&mut IdedExpr> = c
            .target
            .as_deref_mut()
            .into_iter()
            .chain(c.args.iter_mut())
            .collect();
        if !operands.iter().any(|o| bounded(o)) {
            operands.iter_mut().for_each(|o| wrap_size(o, id));
        }
    } else if name == operators::ADD && !c.args.iter().all(bounded) {
        return true;
    }
    false
}

/// Replaces `==`, `!=` and `in` by the functions that evaluate them as cel-go does where the
/// `cel` crate's operators would answer differently (see `library::internal`): equality whose
/// left operand may be a semver, a quantity, a list or a map at run time, and membership in a
/// list of literals.
fn strict_operator(c: &mut CallExpr) {
    if c.target.is_some() || c.args.len() != 2 {
        return;
    }
    let name = c.func_name.as_str();
    if (name == operators::EQUALS || name == operators::NOT_EQUALS) && !primitive(&c.args[0]) {
        c.func_name = if name == operators::EQUALS {
            EQUALS
        } else {
            NOT_EQUALS
        }
        .to_owned();
    } else if name == operators::IN
        && let Expr::List(list) = &c.args[1].expr
        && !list.elements.is_empty()
        && list.elements.iter().all(|e| {
            matches!(
                &e.expr,
                Expr::Literal(
                    LiteralValue::Boolean(_)
                        | LiteralValue::Int(_)
                        | LiteralValue::UInt(_)
                        | LiteralValue::Double(_)
                        | LiteralValue::String(_)
                )
            )
        })
    {
        c.func_name = IN_SET.to_owned();
    }
}

/// An operand whose value is known to be a bool, number, string, bytes or null: a literal, or a
/// device field that is one.
fn primitive(expr: &IdedExpr) -> bool {
    match &expr.expr {
        Expr::Literal(_) => true,
        Expr::Select(select) => {
            !select.test
                && matches!(&select.operand.expr, Expr::Ident(name) if name == "device")
                && matches!(select.field.as_str(), "driver" | "allowMultipleAllocations")
        }
        _ => false,
    }
}

/// Puts the per-iteration `@cost` tick into comprehension `c`.
fn tick(c: &mut ComprehensionExpr, id: &mut u64) {
    if matches!(&c.iter_range.expr, Expr::List(list) if list.elements.is_empty()) {
        return; // `cel.bind`: never iterates.
    }
    let weight = 1 + nodes_per_iteration(&c.loop_cond) + nodes_per_iteration(&c.loop_step);
    let accu = c.accu_var.clone();
    let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(name) if *name == accu);
    let appends_in_place = matches!(c.loop_cond.expr, Expr::Literal(_)) && is_accu(&c.result);
    if appends_in_place && let Expr::Call(step) = &mut c.loop_step.expr {
        // `cond ? @result + [e] : @result`: tick on the filter.
        if step.func_name == operators::CONDITIONAL
            && step.args.len() == 3
            && is_accu(&step.args[2])
        {
            wrap_cost(&mut step.args[0], weight, id);
            return;
        }
        // `@result + [e]`: tick on the element.
        if step.func_name == operators::ADD
            && step.args.len() == 2
            && is_accu(&step.args[0])
            && let Expr::List(items) = &mut step.args[1].expr
            && let Some(item) = items.elements.first_mut()
        {
            wrap_cost(item, weight, id);
            return;
        }
    }
    wrap_cost(&mut c.loop_cond, weight, id);
}

/// Nodes evaluated once per iteration; nested comprehensions count their setup only, as they
/// tick for their own iterations.
fn nodes_per_iteration(expr: &IdedExpr) -> u64 {
    match &expr.expr {
        Expr::Comprehension(c) => {
            1 + nodes_per_iteration(&c.iter_range) + nodes_per_iteration(&c.accu_init)
        }
        Expr::Call(c) => {
            1 + c.target.as_deref().map_or(0, nodes_per_iteration)
                + c.args.iter().map(nodes_per_iteration).sum::<u64>()
        }
        Expr::List(list) => 1 + list.elements.iter().map(nodes_per_iteration).sum::<u64>(),
        Expr::Map(map) => {
            1 + map
                .entries
                .iter()
                .map(|entry| match &entry.expr {
                    EntryExpr::MapEntry(e) => {
                        nodes_per_iteration(&e.key) + nodes_per_iteration(&e.value)
                    }
                    EntryExpr::StructField(f) => nodes_per_iteration(&f.value),
                })
                .sum::<u64>()
        }
        Expr::Select(select) => 1 + nodes_per_iteration(&select.operand),
        Expr::Literal(_) => 0,
        _ => 1,
    }
}
