//! What every overload of the library uses: its arguments taken apart and checked, its result
//! built ([`Return`]).

use std::sync::LazyLock;

use cel::ExecutionError;
use cel::common::types::{CelBool, CelDouble, CelInt, CelList, CelString};
use cel::common::value::{CowVal, FromVal, Val};

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
