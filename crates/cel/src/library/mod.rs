//! The functions and macros of the Kubernetes DRA CEL environment that the `cel` crate does not
//! have: the quantity and semver libraries, the strings extension (version 2), the regex, lists
//! and sets libraries, `includes`, `cel.bind`, two-variable comprehensions, and the internal
//! functions compilation inserts to meter cost.
//!
//! Every function here charges the running evaluation's budget ([`crate::meter`]) for the work it
//! does before doing it.

pub(crate) mod internal;
pub(crate) mod lists;
pub(crate) mod macros;
pub(crate) mod quantity;
pub(crate) mod regex;
pub(crate) mod semver;
pub(crate) mod strings;
mod strings_format;

use std::sync::LazyLock;

use cel::common::types::{CelBool, CelDouble, CelInt, CelList, CelString};
use cel::common::value::{CowVal, FromVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// Registers everything this module provides on `env`.
pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    quantity::register(env)?;
    semver::register(env)?;
    strings::register(env)?;
    regex::register(env)?;
    lists::register(env)?;
    internal::register(env)?;
    macros::register(env)
}

/// The result type of every overload.
pub(crate) type Return<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

/// `args` as exactly `N` arguments.
pub(crate) fn take<'b, 'v, const N: usize>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<[CowVal<'b, 'v>; N], ExecutionError> {
    args.try_into()
        .map_err(|args: Vec<_>| ExecutionError::invalid_argument_count(N, args.len()))
}

/// `val` as the Rust type its overload was declared with.
pub(crate) fn arg<'b, 'v, T: FromVal<'b, 'v> + Val>(
    val: &'b (dyn Val + 'v),
) -> Result<&'b T, ExecutionError> {
    val.downcast_ref::<T>()
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: val.get_type().name().to_owned(),
            want: T::cel_type().name().to_owned(),
        })
}

pub(crate) fn string_arg(val: &dyn Val) -> Result<&str, ExecutionError> {
    arg::<CelString<'_>>(val).map(|s| s.inner())
}

pub(crate) fn int_arg(val: &dyn Val) -> Result<i64, ExecutionError> {
    arg::<CelInt>(val).map(|i| *i.inner())
}

pub(crate) fn bool_arg(val: &dyn Val) -> Result<bool, ExecutionError> {
    arg::<CelBool>(val).map(|b| *b.inner())
}

pub(crate) fn list_arg<'b, 'v>(
    val: &'b (dyn Val + 'v),
) -> Result<&'b [Box<dyn Val + 'v>], ExecutionError> {
    arg::<CelList<'_>>(val).map(|l| l.inner())
}

pub(crate) fn int<'b, 'v>(value: i64) -> Return<'b, 'v> {
    Ok(CowVal::owned(CelInt::from(value)))
}

static TRUE: LazyLock<CelBool> = LazyLock::new(|| CelBool::from(true));
static FALSE: LazyLock<CelBool> = LazyLock::new(|| CelBool::from(false));

/// A bool result, borrowed from a constant: no allocation.
pub(crate) fn boolean<'b, 'v>(value: bool) -> Return<'b, 'v> {
    Ok(CowVal::Borrowed(if value { &*TRUE } else { &*FALSE }))
}

pub(crate) fn double<'b, 'v>(value: f64) -> Return<'b, 'v> {
    Ok(CowVal::owned(CelDouble::from(value)))
}

pub(crate) fn string<'b, 'v>(value: String) -> Return<'b, 'v> {
    Ok(CowVal::owned(CelString::from(value)))
}

pub(crate) fn list<'b, 'v>(items: Vec<Box<dyn Val + 'v>>) -> Return<'b, 'v> {
    Ok(CowVal::owned(CelList::from(items)))
}

pub(crate) fn fail<'b, 'v>(function: &str, message: impl ToString) -> Return<'b, 'v> {
    Err(ExecutionError::function_error(function, message))
}

/// `-1`, `0` or `1` for an ordering, as `compareTo` returns.
pub(crate) fn ordering_int(ordering: std::cmp::Ordering) -> i64 {
    ordering as i64
}
