//! The Kubernetes lists library (`isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`),
//! cel-go's sets extension (`sets.contains`, `sets.equivalent`, `sets.intersects`) and DRA's
//! `includes` for list attributes.

use std::cmp::Ordering;

use cel::common::types::{DYN_TYPE, LIST_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::overload::{Return, boolean, fail, int, list_arg, take};
use crate::meter::charge;

/// Upstream refuses `includes` on longer lists (`ResourceSliceMaxAttributeValuesPerDevice`).
pub(crate) const INCLUDES_MAX_VALUES: usize = 48;

pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let l = || LIST_TYPE;
    env.add_member_overload("isSorted", "list_is_sorted", l(), vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", l(), vec![], sum)?;
    env.add_member_overload("min", "list_min", l(), vec![], min)?;
    env.add_member_overload("max", "list_max", l(), vec![], max)?;
    env.add_member_overload("indexOf", "list_index_of", l(), vec![DYN_TYPE], index_of)?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        l(),
        vec![DYN_TYPE],
        last_index_of,
    )?;
    env.add_overload(
        "sets.contains",
        "list_sets_contains_list",
        vec![l(), l()],
        contains,
    )?;
    env.add_overload(
        "sets.equivalent",
        "list_sets_equivalent_list",
        vec![l(), l()],
        equivalent,
    )?;
    env.add_overload(
        "sets.intersects",
        "list_sets_intersects_list",
        vec![l(), l()],
        intersects,
    )?;
    env.add_member_overload(
        "includes",
        "dra_includes_dyn_dyn",
        DYN_TYPE,
        vec![DYN_TYPE],
        includes,
    )
}

/// The elements of the list receiver, charged one unit each.
fn elements<'a, 'v>(arg: &'a CowVal<'_, 'v>) -> Result<&'a [Box<dyn Val + 'v>], ExecutionError> {
    let items = list_arg(&**arg)?;
    charge(items.len() as u64 + 1)?;
    Ok(items)
}

fn compare(function: &str, a: &dyn Val, b: &dyn Val) -> Result<Ordering, ExecutionError> {
    a.as_comparer()
        .ok_or(())
        .and_then(|c| c.compare(b).map_err(|_| ()))
        .map_err(|()| {
            ExecutionError::function_error(
                function,
                format!(
                    "cannot compare {} with {}",
                    a.get_type().name(),
                    b.get_type().name()
                ),
            )
        })
}

fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [list] = take(args)?;
    let items = elements(&list)?;
    for pair in items.windows(2) {
        if compare("isSorted", pair[0].as_ref(), pair[1].as_ref())? == Ordering::Greater {
            return boolean(false);
        }
    }
    boolean(true)
}

fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [list] = take(args)?;
    let items = elements(&list)?;
    let Some((first, rest)) = items.split_first() else {
        return int(0);
    };
    let mut total: Box<dyn Val + 'v> = first.clone_as_boxed();
    for item in rest {
        let next = total
            .as_adder()
            .ok_or_else(|| {
                ExecutionError::function_error(
                    "sum",
                    format!("cannot add {}", total.get_type().name()),
                )
            })?
            .add(item.as_ref())?
            .into_owned();
        total = next;
    }
    Ok(CowVal::Owned(total))
}

fn extreme<'b, 'v>(args: Vec<CowVal<'b, 'v>>, function: &str, keep: Ordering) -> Return<'b, 'v> {
    let [list] = take(args)?;
    let items = elements(&list)?;
    let Some(mut best) = items.first() else {
        return fail(function, format!("{function} called on empty list"));
    };
    for item in &items[1..] {
        if compare(function, item.as_ref(), best.as_ref())? == keep {
            best = item;
        }
    }
    Ok(CowVal::Owned(best.clone_as_boxed()))
}

fn min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    extreme(args, "min", Ordering::Less)
}

fn max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    extreme(args, "max", Ordering::Greater)
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [list, wanted] = take(args)?;
    let items = elements(&list)?;
    let found = items.iter().position(|item| item.equals(&*wanted));
    int(found.map_or(-1, |i| i as i64))
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [list, wanted] = take(args)?;
    let items = elements(&list)?;
    let found = items.iter().rposition(|item| item.equals(&*wanted));
    int(found.map_or(-1, |i| i as i64))
}

/// Whether every element of `subset` is in `set`; charged for the pairs compared.
fn all_in(set: &[Box<dyn Val + '_>], subset: &[Box<dyn Val + '_>]) -> Result<bool, ExecutionError> {
    charge((set.len() as u64).saturating_mul(subset.len() as u64) + 1)?;
    Ok(subset
        .iter()
        .all(|wanted| set.iter().any(|item| item.equals(wanted.as_ref()))))
}

fn contains<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [set, subset] = take(args)?;
    boolean(all_in(list_arg(&*set)?, list_arg(&*subset)?)?)
}

fn equivalent<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    let (a, b) = (list_arg(&*a)?, list_arg(&*b)?);
    boolean(all_in(a, b)? && all_in(b, a)?)
}

fn intersects<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    let (a, b) = (list_arg(&*a)?, list_arg(&*b)?);
    charge((a.len() as u64).saturating_mul(b.len() as u64) + 1)?;
    boolean(a.iter().any(|x| b.iter().any(|y| x.equals(y.as_ref()))))
}

/// `target.includes(value)`: `value in target` for a list attribute, `target == value` for a
/// single value.
fn includes<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [target, wanted] = take(args)?;
    match list_arg(&*target) {
        Ok(items) => {
            if items.len() > INCLUDES_MAX_VALUES {
                return fail(
                    "includes",
                    format!(
                        "'includes' function cannot be applied to lists longer than {INCLUDES_MAX_VALUES} values"
                    ),
                );
            }
            charge(items.len() as u64 + 1)?;
            boolean(items.iter().any(|item| item.equals(&*wanted)))
        }
        Err(_) => boolean(target.equals(&*wanted)),
    }
}
