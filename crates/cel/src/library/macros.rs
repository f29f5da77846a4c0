//! Macros the `cel` crate lacks: `cel.bind` and the two-variable comprehensions
//! (`all`, `exists`, `existsOne`, `transformList`, `transformMap`, `transformMapEntry` with an
//! index/key and a value variable).
//!
//! The interpreter only iterates with one variable, so a two-variable comprehension over `r` is
//! expanded to one over `@iterkeys(r)` (a list's indexes, a map's keys) that binds the value with
//! `cel.bind(v, r[k], …)`; `r` is evaluated once, bound to a hidden variable.

use cel::common::ast::{
    CallExpr, ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr, operators,
};
use cel::parser::{Macro, MacroExprHelper, ParseError};
use cel::{DeclarationError, Env};

use super::internal::{ITER_KEYS, MAP_INSERT};

/// The accumulator of expanded comprehensions, as the standard macros name it.
const RESULT: &str = "@result";

#[derive(Debug, Clone, Copy, PartialEq)]
enum TwoVar {
    All,
    Exists,
    ExistsOne,
    TransformList { filtered: bool },
    TransformMap { filtered: bool },
    TransformMapEntry { filtered: bool },
}

pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_macro(Macro::receiver("bind", 3, bind))?;
    let two_var = [
        ("all", 3, TwoVar::All),
        ("exists", 3, TwoVar::Exists),
        ("existsOne", 3, TwoVar::ExistsOne),
        ("exists_one", 3, TwoVar::ExistsOne),
        (
            "transformList",
            3,
            TwoVar::TransformList { filtered: false },
        ),
        ("transformList", 4, TwoVar::TransformList { filtered: true }),
        ("transformMap", 3, TwoVar::TransformMap { filtered: false }),
        ("transformMap", 4, TwoVar::TransformMap { filtered: true }),
        (
            "transformMapEntry",
            3,
            TwoVar::TransformMapEntry { filtered: false },
        ),
        (
            "transformMapEntry",
            4,
            TwoVar::TransformMapEntry { filtered: true },
        ),
    ];
    for (name, arity, kind) in two_var {
        env.add_macro(Macro::receiver(name, arity, move |helper, target, args| {
            expand_two_var(kind, helper, target, args).map(Some)
        }))?;
    }
    Ok(())
}

type Expansion = Result<Option<IdedExpr>, ParseError>;

/// `cel.bind(name, init, body)`: `body` with `name` bound to the value of `init`.
fn bind(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Expansion {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(name)) if name == "cel") {
        return Ok(None);
    }
    let body = args.pop().unwrap_or_default();
    let init = args.pop().unwrap_or_default();
    let variable = args.pop().unwrap_or_default();
    let name = simple_name(
        helper,
        &variable,
        "cel.bind() variable name must be a simple identifier",
    )?;
    Ok(Some(bind_expr(helper, name, init, body)))
}

fn bind_expr(
    helper: &mut MacroExprHelper<'_>,
    name: String,
    init: IdedExpr,
    body: IdedExpr,
) -> IdedExpr {
    let comprehension = ComprehensionExpr {
        iter_range: helper.next_expr(Expr::List(ListExpr::new(Vec::new()))),
        iter_var: "#unused".to_owned(),
        iter_var2: None,
        accu_var: name.clone(),
        accu_init: init,
        loop_cond: literal_bool(helper, false),
        loop_step: helper.next_expr(Expr::Ident(name)),
        result: body,
    };
    helper.next_expr(Expr::Comprehension(Box::new(comprehension)))
}

fn simple_name(
    helper: &MacroExprHelper<'_>,
    expr: &IdedExpr,
    message: &str,
) -> Result<String, ParseError> {
    match &expr.expr {
        Expr::Ident(name) if !name.starts_with('@') => Ok(name.clone()),
        _ => Err(helper.new_error(expr.id, message)),
    }
}

fn literal_bool(helper: &mut MacroExprHelper<'_>, value: bool) -> IdedExpr {
    helper.next_expr(Expr::Literal(LiteralValue::Boolean(value.into())))
}

fn ident(helper: &mut MacroExprHelper<'_>, name: &str) -> IdedExpr {
    helper.next_expr(Expr::Ident(name.to_owned()))
}

fn call(helper: &mut MacroExprHelper<'_>, function: &str, args: Vec<IdedExpr>) -> IdedExpr {
    helper.next_expr(Expr::Call(CallExpr {
        func_name: function.to_owned(),
        target: None,
        args,
    }))
}

fn expand_two_var(
    kind: TwoVar,
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<IdedExpr, ParseError> {
    let range = target.take().unwrap_or_default();
    let mut args = std::mem::take(args).into_iter();
    let (key_expr, value_expr) = (
        args.next().unwrap_or_default(),
        args.next().unwrap_or_default(),
    );
    let rest: Vec<IdedExpr> = args.collect();
    let key = simple_name(helper, &key_expr, "argument must be a simple name")?;
    let value = simple_name(helper, &value_expr, "argument must be a simple name")?;
    if key == value {
        return Err(helper.new_error(value_expr.id, format!("duplicate variable name: {value}")));
    }
    // The hidden name of the range, unique to this expansion.
    let range_name = format!("@range{}", range.id);
    let with_value = |helper: &mut MacroExprHelper<'_>, body: IdedExpr| {
        let index_args = vec![ident(helper, &range_name), ident(helper, &key)];
        let element = call(helper, operators::INDEX, index_args);
        bind_expr(helper, value.clone(), element, body)
    };
    let mut rest = rest.into_iter();
    let (filter, body) = match kind {
        TwoVar::TransformList { filtered: true }
        | TwoVar::TransformMap { filtered: true }
        | TwoVar::TransformMapEntry { filtered: true } => {
            let filter = rest.next().unwrap_or_default();
            (
                Some(with_value(helper, filter)),
                rest.next().unwrap_or_default(),
            )
        }
        _ => (None, rest.next().unwrap_or_default()),
    };
    let body = with_value(helper, body);
    let range_ident = ident(helper, &range_name);
    let keys = call(helper, ITER_KEYS, vec![range_ident]);
    let comprehension = fold(kind, helper, keys, key, filter, body);
    Ok(bind_expr(helper, range_name, range, comprehension))
}

/// The one-variable comprehension over `keys` computing `kind`, `body` already binding the value.
fn fold(
    kind: TwoVar,
    helper: &mut MacroExprHelper<'_>,
    keys: IdedExpr,
    key: String,
    filter: Option<IdedExpr>,
    body: IdedExpr,
) -> IdedExpr {
    let accu = |helper: &mut MacroExprHelper<'_>| ident(helper, RESULT);
    let (init, cond, step, result) = match kind {
        TwoVar::All | TwoVar::Exists => {
            let (init, connective) = if kind == TwoVar::All {
                (true, operators::LOGICAL_AND)
            } else {
                (false, operators::LOGICAL_OR)
            };
            let mut cond_arg = accu(helper);
            if kind == TwoVar::Exists {
                cond_arg = call(helper, operators::LOGICAL_NOT, vec![cond_arg]);
            }
            let cond = call(helper, operators::NOT_STRICTLY_FALSE, vec![cond_arg]);
            let step_args = vec![accu(helper), body];
            let step = call(helper, connective, step_args);
            (literal_bool(helper, init), cond, step, accu(helper))
        }
        TwoVar::ExistsOne => {
            let zero = helper.next_expr(Expr::Literal(LiteralValue::Int(0.into())));
            let one = helper.next_expr(Expr::Literal(LiteralValue::Int(1.into())));
            let add_args = vec![accu(helper), one];
            let incremented = call(helper, operators::ADD, add_args);
            let step_args = vec![body, incremented, accu(helper)];
            let step = call(helper, operators::CONDITIONAL, step_args);
            let one = helper.next_expr(Expr::Literal(LiteralValue::Int(1.into())));
            let result_args = vec![accu(helper), one];
            let result = call(helper, operators::EQUALS, result_args);
            (zero, literal_bool(helper, true), step, result)
        }
        TwoVar::TransformList { .. } => {
            let item = helper.next_expr(Expr::List(ListExpr::new(vec![body])));
            let add_args = vec![accu(helper), item];
            let appended = call(helper, operators::ADD, add_args);
            let init = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
            (
                init,
                literal_bool(helper, true),
                guarded(helper, filter, appended),
                accu(helper),
            )
        }
        TwoVar::TransformMap { .. } | TwoVar::TransformMapEntry { .. } => {
            let mut insert_args = vec![accu(helper)];
            if matches!(kind, TwoVar::TransformMap { .. }) {
                insert_args.push(ident(helper, &key));
            }
            insert_args.push(body);
            let inserted = call(helper, MAP_INSERT, insert_args);
            let init = helper.next_expr(Expr::Map(MapExpr::default()));
            (
                init,
                literal_bool(helper, true),
                guarded(helper, filter, inserted),
                accu(helper),
            )
        }
    };
    helper.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: keys,
        iter_var: key,
        iter_var2: None,
        accu_var: RESULT.to_owned(),
        accu_init: init,
        loop_cond: cond,
        loop_step: step,
        result,
    })))
}

/// `filter ? step : @result`, or just `step` without a filter.
fn guarded(helper: &mut MacroExprHelper<'_>, filter: Option<IdedExpr>, step: IdedExpr) -> IdedExpr {
    match filter {
        Some(filter) => {
            let accu = ident(helper, RESULT);
            call(helper, operators::CONDITIONAL, vec![filter, step, accu])
        }
        None => step,
    }
}
