//! The strings extension as Kubernetes enables it (cel-go `ext.Strings`, version 2): `charAt`,
//! `indexOf`, `lastIndexOf`, `lowerAscii`, `upperAscii`, `replace`, `split`, `substring`, `trim`,
//! `join`, `strings.quote` and `format`. Indexes count code points, as in cel-go.
//!
//! The `cel` crate has an extension of its own, but it also carries functions Kubernetes does not
//! enable (`reverse`) and searches in quadratic time; these are linear and metered.

use cel::common::types::{CelString, INT_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::overload::{Return, fail, int, int_arg, list, list_arg, string, string_arg, take};
use super::strings_format::format;
use crate::meter::{charge, string_traversal};

pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || STRING_TYPE;
    env.add_member_overload("charAt", "string_char_at_int", s(), vec![INT_TYPE], char_at)?;
    env.add_member_overload(
        "indexOf",
        "string_index_of_string",
        s(),
        vec![s()],
        index_of,
    )?;
    env.add_member_overload(
        "indexOf",
        "string_index_of_string_int",
        s(),
        vec![s(), INT_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "string_last_index_of_string",
        s(),
        vec![s()],
        last_index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "string_last_index_of_string_int",
        s(),
        vec![s(), INT_TYPE],
        last_index_of,
    )?;
    env.add_member_overload("lowerAscii", "string_lower_ascii", s(), vec![], lower_ascii)?;
    env.add_member_overload("upperAscii", "string_upper_ascii", s(), vec![], upper_ascii)?;
    env.add_member_overload(
        "replace",
        "string_replace_string_string",
        s(),
        vec![s(), s()],
        replace,
    )?;
    env.add_member_overload(
        "replace",
        "string_replace_string_string_int",
        s(),
        vec![s(), s(), INT_TYPE],
        replace,
    )?;
    env.add_member_overload("split", "string_split_string", s(), vec![s()], split)?;
    env.add_member_overload(
        "split",
        "string_split_string_int",
        s(),
        vec![s(), INT_TYPE],
        split,
    )?;
    env.add_member_overload(
        "substring",
        "string_substring_int",
        s(),
        vec![INT_TYPE],
        substring,
    )?;
    env.add_member_overload(
        "substring",
        "string_substring_int_int",
        s(),
        vec![INT_TYPE, INT_TYPE],
        substring,
    )?;
    env.add_member_overload("trim", "string_trim", s(), vec![], trim)?;
    env.add_member_overload("join", "list_join", LIST_TYPE, vec![], join)?;
    env.add_member_overload("join", "list_join_string", LIST_TYPE, vec![s()], join)?;
    env.add_overload("strings.quote", "strings_quote", vec![s()], quote)?;
    env.add_member_overload("format", "string_format_list", s(), vec![LIST_TYPE], format)
}

fn out_of_range<'b, 'v>(function: &str, index: i64) -> Return<'b, 'v> {
    fail(function, format!("index out of range: {index}"))
}

/// The receiver string, charged for one traversal.
fn receiver<'a>(args: &'a [CowVal<'_, '_>]) -> Result<&'a str, ExecutionError> {
    let text = string_arg(
        args.first()
            .map(|a| &**a)
            .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))?,
    )?;
    charge(string_traversal(text.len()))?;
    Ok(text)
}

fn optional_int(args: &[CowVal<'_, '_>], index: usize) -> Result<Option<i64>, ExecutionError> {
    args.get(index).map(|a| int_arg(&**a)).transpose()
}

/// The byte offset of code point `index`, `text.len()` for the index just past the end.
fn byte_offset(text: &str, index: usize) -> Option<usize> {
    text.char_indices()
        .map(|(offset, _)| offset)
        .chain(std::iter::once(text.len()))
        .nth(index)
}

fn code_points_before(text: &str, byte: usize) -> i64 {
    text[..byte].chars().count() as i64
}

fn char_at<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let text = receiver(&args)?;
    let index = int_arg(&*args[1])?;
    let found = usize::try_from(index)
        .ok()
        .and_then(|i| byte_offset(text, i).map(|offset| (i, offset)));
    match found {
        Some((_, offset)) => string(
            text[offset..]
                .chars()
                .next()
                .map(String::from)
                .unwrap_or_default(),
        ),
        None => out_of_range("charAt", index),
    }
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let text = receiver(&args)?;
    let needle = string_arg(&*args[1])?;
    let length = text.chars().count() as i64;
    let offset = optional_int(&args, 2)?.unwrap_or(0);
    if offset < 0 {
        return out_of_range("indexOf", offset);
    }
    if needle.is_empty() {
        return int(offset.min(length));
    }
    if args.len() > 2 && offset >= length {
        return out_of_range("indexOf", offset);
    }
    let start = byte_offset(text, offset as usize).unwrap_or(text.len());
    match text[start..].find(needle) {
        Some(found) => int(code_points_before(text, start + found)),
        None => int(-1),
    }
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let text = receiver(&args)?;
    let needle = string_arg(&*args[1])?;
    let length = text.chars().count() as i64;
    let offset = match optional_int(&args, 2)? {
        None if needle.is_empty() => return int(length),
        None => length,
        Some(offset) if offset < 0 => return out_of_range("lastIndexOf", offset),
        Some(offset) if needle.is_empty() => return int(offset.min(length)),
        Some(offset) if offset >= length => return out_of_range("lastIndexOf", offset),
        Some(offset) => offset,
    };
    let max_start = byte_offset(text, offset as usize).unwrap_or(text.len());
    match last_match_at_or_before(text, needle, max_start) {
        Some(found) => int(code_points_before(text, found)),
        None => int(-1),
    }
}

/// The byte offset of the last occurrence of a non-empty `needle` starting at or before
/// `max_start` (occurrences may overlap).
fn last_match_at_or_before(text: &str, needle: &str, max_start: usize) -> Option<usize> {
    let mut end = (max_start + needle.len()).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    loop {
        let found = text[..end].rfind(needle)?;
        if found <= max_start {
            return Some(found);
        }
        end = found + needle.len() - 1;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
    }
}

fn lower_ascii<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    string(receiver(&args)?.to_ascii_lowercase())
}

fn upper_ascii<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    string(receiver(&args)?.to_ascii_uppercase())
}

fn trim<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    string(receiver(&args)?.trim().to_owned())
}

/// `replace(old, new[, n])`: Go's `strings.Replace`; a negative or missing `n` replaces all.
fn replace<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let text = receiver(&args)?;
    let (from, to) = (string_arg(&*args[1])?, string_arg(&*args[2])?);
    let limit = optional_int(&args, 3)?.and_then(|n| usize::try_from(n).ok());
    let occurrences = if from.is_empty() {
        text.chars().count() + 1
    } else {
        text.matches(from).count()
    };
    let replaced = limit.map_or(occurrences, |n| n.min(occurrences));
    let output = text.len() + replaced * to.len();
    charge(string_traversal(output))?;
    string(match limit {
        Some(n) => text.replacen(from, to, n),
        None => text.replace(from, to),
    })
}

/// `split(sep[, n])`: Go's `strings.SplitN`; `n == 0` gives no parts, a negative or missing `n`
/// all of them, an empty separator splits between code points.
fn split<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let text = receiver(&args)?;
    let separator = string_arg(&*args[1])?;
    let limit = optional_int(&args, 2)?.unwrap_or(-1);
    let parts: Vec<&str> = match (usize::try_from(limit), separator.is_empty()) {
        (Ok(0), _) => Vec::new(),
        (Ok(n), true) => {
            let mut parts: Vec<&str> = text
                .char_indices()
                .take(n - 1)
                .map(|(i, c)| &text[i..i + c.len_utf8()])
                .collect();
            let consumed: usize = parts.iter().map(|p| p.len()).sum();
            if consumed < text.len() {
                parts.push(&text[consumed..]);
            }
            parts
        }
        (Ok(n), false) => text.splitn(n, separator).collect(),
        (Err(_), true) => text
            .char_indices()
            .map(|(i, c)| &text[i..i + c.len_utf8()])
            .collect(),
        (Err(_), false) => text.split(separator).collect(),
    };
    charge(parts.len() as u64)?;
    list(
        parts
            .into_iter()
            .map(|part| Box::new(CelString::from(part.to_owned())) as Box<dyn Val>)
            .collect(),
    )
}

fn substring<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let text = receiver(&args)?;
    let length = text.chars().count() as i64;
    let start = int_arg(&*args[1])?;
    let end = optional_int(&args, 2)?;
    if start < 0 || start > length {
        return out_of_range("substring", start);
    }
    let end = end.unwrap_or(length);
    if start > end {
        return fail(
            "substring",
            format!("invalid substring range. start: {start}, end: {end}"),
        );
    }
    if end > length {
        return out_of_range("substring", end);
    }
    let from = byte_offset(text, start as usize).unwrap_or(text.len());
    let to = byte_offset(text, end as usize).unwrap_or(text.len());
    string(text[from..to].to_owned())
}

fn join<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let items = list_arg(&*args[0])?;
    let separator = match args.get(1) {
        Some(s) => string_arg(&**s)?,
        None => "",
    };
    let parts: Result<Vec<&str>, _> = items.iter().map(|item| string_arg(item.as_ref())).collect();
    let parts = parts?;
    let total: usize = parts.iter().map(|p| p.len() + separator.len()).sum();
    charge(string_traversal(total))?;
    string(parts.join(separator))
}

/// `strings.quote(s)`: `s` as a double-quoted CEL string literal.
fn quote<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let [text] = take(args)?;
    let text = string_arg(&*text)?;
    charge(string_traversal(text.len() * 2))?;
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '\x07' => quoted.push_str("\\a"),
            '\x08' => quoted.push_str("\\b"),
            '\x0c' => quoted.push_str("\\f"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            '\x0b' => quoted.push_str("\\v"),
            '\\' => quoted.push_str("\\\\"),
            '"' => quoted.push_str("\\\""),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    string(quoted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_match_allows_overlaps_and_respects_the_offset() {
        assert_eq!(last_match_at_or_before("aaaa", "aa", 1), Some(1));
        assert_eq!(last_match_at_or_before("aaaa", "aa", 4), Some(2));
        assert_eq!(last_match_at_or_before("abcabc", "abc", 2), Some(0));
        assert_eq!(last_match_at_or_before("héllo héllo", "é", 3), Some(1));
        assert_eq!(last_match_at_or_before("abc", "x", 3), None);
    }
}
