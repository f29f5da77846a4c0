//! Functions that only compilation writes into programs (their names start with `@`, which CEL
//! source cannot spell): cost ticks, size charges, and the helpers of two-variable comprehensions.

use std::collections::HashMap;

use cel::common::types::{
    CelBytes, CelInt, CelMap, CelMapKey, CelString, DYN_TYPE, INT_TYPE, Kind,
};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::overload::{Return, boolean, fail, int_arg, list};
use crate::meter::{charge, string_traversal};
use crate::quantity::QuantityValue;
use crate::version::Version;

/// `@cost(value, units)`: charges `units`, evaluates to `value`.
pub(crate) const COST: &str = "@cost";
/// `@size(value)`: charges for traversing `value` once, evaluates to `value`.
pub(crate) const SIZE: &str = "@size";
/// `@iterkeys(range)`: what a two-variable comprehension iterates: a list's indexes, a map's keys.
pub(crate) const ITER_KEYS: &str = "@iterkeys";
/// `@mapInsert(map, key, value)` and `@mapInsert(map, entries)`: a map with more entries.
pub(crate) const MAP_INSERT: &str = "@mapInsert";
/// `@eq(a, b)` and `@ne(a, b)`: `==` and `!=` as cel-go evaluates them, where the left operand's
/// type decides: a semver or a quantity compared with anything but its own type (or null) is a
/// `no such overload` error for `==` (and true for `!=`), and lists and maps compare element by
/// element, an element whose comparison fails counting as equal.
pub(crate) const EQUALS: &str = "@eq";
pub(crate) const NOT_EQUALS: &str = "@ne";
/// `@inset(x, [literals])`: `x in [literals]`, which cel-go evaluates through a hash set of the
/// literals: a value that cannot be hashed there (a semver, a list, a map) is an error.
pub(crate) const IN_SET: &str = "@inset";

pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(COST, "cost_dyn_int", vec![DYN_TYPE, INT_TYPE], cost)?;
    env.add_overload(SIZE, "size_charge_dyn", vec![DYN_TYPE], size)?;
    env.add_overload(ITER_KEYS, "iter_keys_dyn", vec![DYN_TYPE], iter_keys)?;
    env.add_overload(
        MAP_INSERT,
        "map_insert_key_value",
        vec![DYN_TYPE, DYN_TYPE, DYN_TYPE],
        map_insert,
    )?;
    env.add_overload(
        MAP_INSERT,
        "map_insert_entries",
        vec![DYN_TYPE, DYN_TYPE],
        map_insert,
    )?;
    env.add_overload(EQUALS, "strict_equals", vec![DYN_TYPE, DYN_TYPE], equals)?;
    env.add_overload(
        NOT_EQUALS,
        "strict_not_equals",
        vec![DYN_TYPE, DYN_TYPE],
        not_equals,
    )?;
    env.add_overload(IN_SET, "in_literal_set", vec![DYN_TYPE, DYN_TYPE], in_set)
}

#[inline(never)]
fn unreachable_two<T>() -> Result<T, ExecutionError> {
    Err(ExecutionError::invalid_argument_count(2, 0))
}

/// cel-go's `types.Equal(a, b)` for the values of this environment.
pub(crate) fn strict_equals(a: &dyn Val, b: &dyn Val) -> Result<bool, ExecutionError> {
    let (ka, kb) = (a.get_type().kind(), b.get_type().kind());
    if ka == Kind::NullType || kb == Kind::NullType {
        return Ok(ka == kb);
    }
    if a.downcast_ref::<Version>().is_some() || a.downcast_ref::<QuantityValue>().is_some() {
        if a.get_type().name() != b.get_type().name() {
            return Err(ExecutionError::function_error(
                "_==_",
                format!(
                    "no such overload: {} compared with {}",
                    a.get_type().name(),
                    b.get_type().name()
                ),
            ));
        }
        return Ok(a.equals(b));
    }
    match (ka, kb) {
        (Kind::List, Kind::List) => {
            let (Some(sa), Some(sb), Some(ia), Some(ib)) =
                (a.as_sizer(), b.as_sizer(), a.as_iterable(), b.as_iterable())
            else {
                return Ok(a.equals(b));
            };
            if sa.size().inner() != sb.size().inner() {
                return Ok(false);
            }
            let (mut xs, mut ys) = (ia.iter(), ib.iter());
            while let (Some(x), Some(y)) = (xs.next(), ys.next()) {
                if matches!(strict_equals(x, y), Ok(false)) {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        (Kind::Map, Kind::Map) => {
            let (Some(sa), Some(sb), Some(keys), Some(ia), Some(ib)) = (
                a.as_sizer(),
                b.as_sizer(),
                a.as_iterable(),
                a.as_indexer(),
                b.as_indexer(),
            ) else {
                return Ok(a.equals(b));
            };
            if sa.size().inner() != sb.size().inner() {
                return Ok(false);
            }
            let mut keys = keys.iter();
            while let Some(key) = keys.next() {
                let Ok(theirs) = ib.get(key) else {
                    return Ok(false);
                };
                let Ok(mine) = ia.get(key) else {
                    return Ok(false);
                };
                if matches!(strict_equals(&*mine, &*theirs), Ok(false)) {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        _ => Ok(a.equals(b)),
    }
}

fn pair<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<(CowVal<'b, 'v>, CowVal<'b, 'v>), ExecutionError> {
    let mut args = args.into_iter();
    match (args.next(), args.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => unreachable_two(),
    }
}

fn equals<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let (a, b) = pair(args)?;
    boolean(strict_equals(&*a, &*b)?)
}

fn not_equals<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let (a, b) = pair(args)?;
    // cel-go's `!=` is "not known to be equal": a failed comparison makes it true.
    boolean(!matches!(strict_equals(&*a, &*b), Ok(true)))
}

fn in_set<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let (x, set) = pair(args)?;
    let unhashable = x.downcast_ref::<Version>().is_some()
        || matches!(x.get_type().kind(), Kind::List | Kind::Map);
    if unhashable {
        return Err(ExecutionError::function_error(
            "@in",
            format!("hash of unhashable type {}", x.get_type().name()),
        ));
    }
    let Some(items) = set.as_iterable() else {
        return boolean(false);
    };
    let mut items = items.iter();
    while let Some(item) = items.next() {
        if x.equals(item) {
            return boolean(true);
        }
    }
    boolean(false)
}

fn first<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    args.into_iter()
        .next()
        .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))
}

fn cost<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let units = args.get(1).map(|u| int_arg(&**u)).transpose()?.unwrap_or(1);
    charge(u64::try_from(units).unwrap_or(1))?;
    first(args)
}

/// What traversing `value` once costs: a tenth per byte of a string, one per element.
pub(crate) fn traversal_cost(value: &dyn Val) -> u64 {
    if let Some(s) = value.downcast_ref::<CelString<'_>>() {
        string_traversal(s.inner().len())
    } else if let Some(b) = value.downcast_ref::<CelBytes<'_>>() {
        string_traversal(b.inner().len())
    } else if let Some(sizer) = value.as_sizer() {
        1 + u64::try_from(*sizer.size().inner()).unwrap_or(0)
    } else {
        1
    }
}

fn size<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    if let Some(value) = args.first() {
        charge(traversal_cost(&**value))?;
    }
    first(args)
}

fn iter_keys<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let range = first(args)?;
    if range.get_type().kind() == cel::common::types::Kind::Map {
        return Ok(range);
    }
    let Some(sizer) = range.as_sizer().filter(|_| range.as_iterable().is_some()) else {
        return Err(ExecutionError::UnexpectedType {
            got: range.get_type().name().to_owned(),
            want: "iterable".to_owned(),
        });
    };
    let length = *sizer.size().inner();
    charge(u64::try_from(length).unwrap_or(0))?;
    list(
        (0..length)
            .map(|i| Box::new(CelInt::from(i)) as Box<dyn Val>)
            .collect(),
    )
}

fn map_insert<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let mut args = args.into_iter();
    let (Some(map), Some(second)) = (args.next(), args.next()) else {
        return Err(ExecutionError::invalid_argument_count(2, 0));
    };
    let mut entries: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> =
        match map.downcast_ref::<CelMap<'_>>() {
            Some(m) => m
                .inner()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone_as_boxed()))
                .collect(),
            None => return fail("transformMap", "the accumulator is not a map"),
        };
    let mut additions: Vec<(CelMapKey<'v>, Box<dyn Val + 'v>)> = Vec::new();
    match args.next() {
        Some(value) => additions.push((CelMapKey::try_from(second)?, value.into_owned())),
        None => match second.downcast_ref::<CelMap<'_>>() {
            Some(more) => additions.extend(
                more.inner()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone_as_boxed())),
            ),
            None => {
                return fail(
                    "transformMapEntry",
                    format!(
                        "the transform must evaluate to a map, not {}",
                        second.get_type().name()
                    ),
                );
            }
        },
    }
    charge(entries.len() as u64 + additions.len() as u64)?;
    for (key, value) in additions {
        if entries.contains_key(&key) {
            return fail(
                "transformMap",
                format!("insert failed: key {:?} already exists", key.inner()),
            );
        }
        entries.insert(key, value);
    }
    Ok(CowVal::owned(CelMap::from(entries)))
}
