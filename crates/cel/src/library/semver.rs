//! The Kubernetes semver library (version 1): `semver`, `isSemver` (each with an optional
//! `normalize` flag), `major`, `minor`, `patch`, `isGreaterThan`, `isLessThan`, `compareTo`.

use cel::common::types::{BOOL_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::overload::{Return, arg, bool_arg, boolean, fail, int, ordering_int, string_arg, take};
use crate::meter::{charge, string_traversal};
use crate::values::SEMVER_TYPE;
use crate::version::{Version, VersionError};

pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let v = || SEMVER_TYPE.to_owned();
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], to_semver)?;
    env.add_overload(
        "semver",
        "string_bool_to_semver",
        vec![STRING_TYPE, BOOL_TYPE],
        to_semver,
    )?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], is_semver)?;
    env.add_overload(
        "isSemver",
        "is_semver_string_bool",
        vec![STRING_TYPE, BOOL_TYPE],
        is_semver,
    )?;
    env.add_member_overload("major", "semver_major", v(), vec![], major)?;
    env.add_member_overload("minor", "semver_minor", v(), vec![], minor)?;
    env.add_member_overload("patch", "semver_patch", v(), vec![], patch)?;
    env.add_member_overload(
        "isGreaterThan",
        "semver_is_greater_than",
        v(),
        vec![v()],
        is_greater_than,
    )?;
    env.add_member_overload(
        "isLessThan",
        "semver_is_less_than",
        v(),
        vec![v()],
        is_less_than,
    )?;
    env.add_member_overload("compareTo", "semver_compare_to", v(), vec![v()], compare_to)
}

/// Parses the first argument, normalizing if a second `true` argument says so.
fn parse(args: &[CowVal<'_, '_>]) -> Result<Result<Version, VersionError>, ExecutionError> {
    let text = string_arg(args.first().map(|a| &**a).ok_or_else(missing)?)?;
    let normalize = match args.get(1) {
        Some(flag) => bool_arg(&**flag)?,
        None => false,
    };
    charge(string_traversal(text.len()))?;
    Ok(if normalize {
        Version::parse_normalized(text)
    } else {
        Version::parse(text)
    })
}

fn missing() -> ExecutionError {
    ExecutionError::invalid_argument_count(1, 0)
}

fn version(val: &dyn Val) -> Result<&Version, ExecutionError> {
    arg::<Version>(val)
}

fn to_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    match parse(&args)? {
        Ok(v) => Ok(CowVal::owned(v)),
        Err(e) => fail("semver", e),
    }
}

fn is_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    boolean(parse(&args)?.is_ok())
}

fn component<'b, 'v>(args: Vec<CowVal<'b, 'v>>, f: fn(&Version) -> u64) -> Return<'b, 'v> {
    let [v] = take(args)?;
    let value = f(version(&*v)?);
    match i64::try_from(value) {
        Ok(value) => int(value),
        Err(_) => fail(
            "semver",
            format!("version component {value} is out of range"),
        ),
    }
}

fn major<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    component(args, Version::major)
}

fn minor<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    component(args, Version::minor)
}

fn patch<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    component(args, Version::patch)
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    boolean(version(&*a)? > version(&*b)?)
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    boolean(version(&*a)? < version(&*b)?)
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    int(ordering_int(version(&*a)?.cmp(version(&*b)?)))
}
