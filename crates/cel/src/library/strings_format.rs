//! `"…".format([args])` of the strings extension: the verbs `%s`, `%d`, `%f`, `%e`, `%b`, `%o`,
//! `%x`, `%X` and `%%`, with an optional precision (`%.2f`) for the floating-point verbs.

use cel::ExecutionError;
use cel::common::types::{
    CelBool, CelBytes, CelDouble, CelInt, CelList, CelMap, CelNull, CelString, CelUInt,
};
use cel::common::value::{CowVal, Val};

use super::overload::{Return, list_arg, string, string_arg};
use crate::meter::{charge, string_traversal};

/// The largest precision Rust's formatting machinery takes.
const MAX_PRECISION: usize = u16::MAX as usize;

pub(crate) fn format<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let template = string_arg(&*args[0])?;
    let values = list_arg(&*args[1])?;
    charge(string_traversal(template.len()))?;
    let mut output = String::with_capacity(template.len());
    let mut values = values.iter();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            output.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            output.push('%');
            continue;
        }
        let precision = precision(&mut chars)?;
        let verb = chars
            .next()
            .ok_or_else(|| error("unexpected end of string after '%'"))?;
        let value = values
            .next()
            .ok_or_else(|| error(format!("too few arguments for clause \"%{verb}\"")))?;
        let formatted = clause(verb, precision, value.as_ref())?;
        charge(string_traversal(formatted.len()))?;
        output.push_str(&formatted);
    }
    string(output)
}

fn error(message: impl ToString) -> ExecutionError {
    ExecutionError::function_error("format", message)
}

fn precision(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
) -> Result<Option<usize>, ExecutionError> {
    if chars.peek() != Some(&'.') {
        return Ok(None);
    }
    chars.next();
    let mut digits = String::new();
    while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
        digits.push(*d);
        chars.next();
    }
    let precision: usize = digits
        .parse()
        .ok()
        .filter(|p| *p <= MAX_PRECISION)
        .ok_or_else(|| {
            error(format!(
                "invalid precision {digits:?}: at most {MAX_PRECISION} digits are supported"
            ))
        })?;
    charge(precision as u64 / 10)?;
    Ok(Some(precision))
}

fn clause(verb: char, precision: Option<usize>, value: &dyn Val) -> Result<String, ExecutionError> {
    match verb {
        's' => as_string(value, false),
        'd' => integer(value).map(|i| i.to_string()),
        'f' => number(value).map(|n| format!("{:.*}", precision.unwrap_or(6), n)),
        'e' => number(value).map(|n| scientific(n, precision.unwrap_or(6))),
        'b' => radix(value, |i| format!("{i:b}")),
        'o' => radix(value, |i| format!("{i:o}")),
        'x' => hex(value, false),
        'X' => hex(value, true),
        other => Err(error(format!(
            "could not parse formatting clause: unrecognized formatting clause \"{other}\""
        ))),
    }
}

fn integer(value: &dyn Val) -> Result<i128, ExecutionError> {
    if let Some(i) = value.downcast_ref::<CelInt>() {
        Ok(i128::from(*i.inner()))
    } else if let Some(u) = value.downcast_ref::<CelUInt>() {
        Ok(i128::from(*u.inner()))
    } else {
        Err(error(format!(
            "decimal clause can only be used on integers, was given {}",
            value.get_type().name()
        )))
    }
}

fn number(value: &dyn Val) -> Result<f64, ExecutionError> {
    match value.downcast_ref::<CelDouble>() {
        Some(d) => Ok(*d.inner()),
        None => integer(value).map(|i| i as f64).map_err(|_| {
            error(format!(
                "fixed-point clause can only be used on doubles, was given {}",
                value.get_type().name()
            ))
        }),
    }
}

/// Go's `%e`: mantissa, `e`, sign, at least two exponent digits.
fn scientific(n: f64, precision: usize) -> String {
    let text = format!("{n:.precision$e}");
    match text.split_once('e') {
        Some((mantissa, exponent)) => {
            let (sign, digits) = match exponent.strip_prefix('-') {
                Some(digits) => ('-', digits),
                None => ('+', exponent),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => text,
    }
}

fn radix(value: &dyn Val, f: fn(u128) -> String) -> Result<String, ExecutionError> {
    let i = integer(value)?;
    let sign = if i < 0 { "-" } else { "" };
    Ok(format!("{sign}{}", f(i.unsigned_abs())))
}

fn hex(value: &dyn Val, upper: bool) -> Result<String, ExecutionError> {
    let bytes: Option<&[u8]> = if let Some(s) = value.downcast_ref::<CelString<'_>>() {
        Some(s.inner().as_bytes())
    } else {
        value.downcast_ref::<CelBytes<'_>>().map(|b| b.inner())
    };
    let text = match bytes {
        Some(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        None => radix(value, |i| format!("{i:x}"))?,
    };
    Ok(if upper { text.to_uppercase() } else { text })
}

/// `%s`: strings as they are (quoted inside lists and maps), other values as `string()` writes
/// them, lists and maps element by element.
fn as_string(value: &dyn Val, nested: bool) -> Result<String, ExecutionError> {
    if let Some(s) = value.downcast_ref::<CelString<'_>>() {
        return Ok(if nested {
            format!("{:?}", s.inner())
        } else {
            s.inner().to_owned()
        });
    }
    if let Some(b) = value.downcast_ref::<CelBool>() {
        return Ok(b.inner().to_string());
    }
    if let Some(i) = value.downcast_ref::<CelInt>() {
        return Ok(i.inner().to_string());
    }
    if let Some(u) = value.downcast_ref::<CelUInt>() {
        return Ok(u.inner().to_string());
    }
    if let Some(d) = value.downcast_ref::<CelDouble>() {
        return Ok(d.inner().to_string());
    }
    if value.downcast_ref::<CelNull>().is_some() {
        return Ok("null".to_owned());
    }
    if let Some(b) = value.downcast_ref::<CelBytes<'_>>() {
        return Ok(String::from_utf8_lossy(b.inner()).into_owned());
    }
    if let Some(l) = value.downcast_ref::<CelList<'_>>() {
        let items: Result<Vec<String>, _> = l
            .inner()
            .iter()
            .map(|v| as_string(v.as_ref(), true))
            .collect();
        return Ok(format!("[{}]", items?.join(", ")));
    }
    if let Some(m) = value.downcast_ref::<CelMap<'_>>() {
        let mut entries = Vec::with_capacity(m.inner().len());
        for (key, value) in m.inner() {
            entries.push(format!(
                "{}: {}",
                as_string(key.inner(), true)?,
                as_string(value.as_ref(), true)?
            ));
        }
        entries.sort();
        return Ok(format!("{{{}}}", entries.join(", ")));
    }
    Err(error(format!(
        "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, and timestamps, was given {}",
        value.get_type().name()
    )))
}
