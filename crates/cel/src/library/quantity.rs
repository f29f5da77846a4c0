//! The Kubernetes quantity library: `quantity`, `isQuantity`, `sign`, `isInteger`, `asInteger`,
//! `asApproximateFloat`, `add`, `sub`, `isGreaterThan`, `isLessThan`, `compareTo`.

use cel::common::types::{INT_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::overload::{
    Return, arg, boolean, double, fail, int, int_arg, ordering_int, string_arg, take,
};
use crate::meter::{charge, string_traversal};
use crate::quantity::QuantityValue;
use crate::values::QUANTITY_TYPE;

pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let q = || QUANTITY_TYPE.to_owned();
    env.add_overload(
        "quantity",
        "string_to_quantity",
        vec![STRING_TYPE],
        to_quantity,
    )?;
    env.add_overload(
        "isQuantity",
        "is_quantity_string",
        vec![STRING_TYPE],
        is_quantity,
    )?;
    env.add_member_overload("sign", "quantity_sign", q(), vec![], sign)?;
    env.add_member_overload("isInteger", "quantity_is_integer", q(), vec![], is_integer)?;
    env.add_member_overload("asInteger", "quantity_as_integer", q(), vec![], as_integer)?;
    env.add_member_overload(
        "asApproximateFloat",
        "quantity_as_approximate_float",
        q(),
        vec![],
        as_float,
    )?;
    env.add_member_overload("add", "quantity_add", q(), vec![q()], add)?;
    env.add_member_overload("add", "quantity_add_int", q(), vec![INT_TYPE], add_int)?;
    env.add_member_overload("sub", "quantity_sub", q(), vec![q()], sub)?;
    env.add_member_overload("sub", "quantity_sub_int", q(), vec![INT_TYPE], sub_int)?;
    env.add_member_overload(
        "isGreaterThan",
        "quantity_is_greater_than",
        q(),
        vec![q()],
        is_greater_than,
    )?;
    env.add_member_overload(
        "isLessThan",
        "quantity_is_less_than",
        q(),
        vec![q()],
        is_less_than,
    )?;
    env.add_member_overload(
        "compareTo",
        "quantity_compare_to",
        q(),
        vec![q()],
        compare_to,
    )?;
    Ok(())
}

fn quantity(val: &dyn Val) -> Result<QuantityValue, ExecutionError> {
    arg::<QuantityValue>(val).copied()
}

fn to_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [text] = take(args)?;
    let text = string_arg(&*text)?;
    charge(string_traversal(text.len()))?;
    match QuantityValue::parse(text) {
        Ok(q) => Ok(CowVal::owned(q)),
        Err(e) => fail("quantity", e),
    }
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [text] = take(args)?;
    let text = string_arg(&*text)?;
    charge(string_traversal(text.len()))?;
    boolean(QuantityValue::parse(text).is_ok())
}

fn sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [q] = take(args)?;
    int(quantity(&*q)?.sign())
}

fn is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [q] = take(args)?;
    boolean(quantity(&*q)?.as_integer().is_some())
}

fn as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [q] = take(args)?;
    match quantity(&*q)?.as_integer() {
        Some(i) => int(i),
        None => fail("asInteger", "cannot convert value to integer"),
    }
}

fn as_float<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [q] = take(args)?;
    double(quantity(&*q)?.as_approximate_float())
}

fn sum<'b, 'v>(function: &str, result: Option<QuantityValue>) -> Return<'b, 'v> {
    match result {
        Some(q) => Ok(CowVal::owned(q)),
        None => fail(function, "quantity out of range"),
    }
}

fn add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    sum("add", quantity(&*a)?.checked_add(quantity(&*b)?))
}

fn add_int<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    let b = QuantityValue::from_integer(int_arg(&*b)?);
    sum("add", quantity(&*a)?.checked_add(b))
}

fn sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    sum("sub", quantity(&*a)?.checked_sub(quantity(&*b)?))
}

fn sub_int<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    let b = QuantityValue::from_integer(int_arg(&*b)?);
    sum("sub", quantity(&*a)?.checked_sub(b))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    boolean(quantity(&*a)? > quantity(&*b)?)
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    boolean(quantity(&*a)? < quantity(&*b)?)
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [a, b] = take(args)?;
    int(ordering_int(quantity(&*a)?.cmp(&quantity(&*b)?)))
}
