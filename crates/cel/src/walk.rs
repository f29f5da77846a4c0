//! Walking a parsed expression: every node, parents before children.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

/// Calls `f` on `expr` and on every expression under it, parents before children.
pub(crate) fn visit(expr: &IdedExpr, f: &mut impl FnMut(&IdedExpr)) {
    f(expr);
    match &expr.expr {
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                visit(target, f);
            }
            call.args.iter().for_each(|a| visit(a, f));
        }
        Expr::Comprehension(c) => {
            for e in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                visit(e, f);
            }
        }
        Expr::List(list) => list.elements.iter().for_each(|e| visit(e, f)),
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::MapEntry(e) = &entry.expr {
                    visit(&e.key, f);
                    visit(&e.value, f);
                }
            }
        }
        Expr::Select(select) => visit(&select.operand, f),
        _ => {}
    }
}
