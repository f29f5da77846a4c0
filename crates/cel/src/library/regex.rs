//! Regular expressions: `matches` (standard CEL) and the Kubernetes regex library's `find` and
//! `findAll`. RE2 syntax, which the `regex` crate implements. Compiled patterns are cached per
//! thread, so a constant pattern is compiled once, not once per device.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use cel::common::types::{CelString, INT_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};
use regex::{Regex, RegexBuilder};

use super::overload::{Return, boolean, int_arg, list, string, string_arg};
use crate::meter::{charge, string_traversal};

/// Compiled programs may not grow beyond this (the `regex` default is 10 MiB).
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Patterns cached per thread before the cache starts over.
const CACHE_CAPACITY: usize = 128;

thread_local! {
    static CACHE: RefCell<HashMap<String, Rc<Regex>>> = RefCell::new(HashMap::new());
}

pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || STRING_TYPE;
    env.add_overload("matches", "matches", vec![s(), s()], matches)?;
    env.add_member_overload("matches", "matches_string", s(), vec![s()], matches)?;
    env.add_member_overload("find", "string_find_string", s(), vec![s()], find)?;
    env.add_member_overload(
        "findAll",
        "string_find_all_string",
        s(),
        vec![s()],
        find_all,
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_string_int",
        s(),
        vec![s(), INT_TYPE],
        find_all,
    )
}

/// Compiles `pattern`, as the compile-time check of literal patterns does.
pub(crate) fn compile(pattern: &str) -> Result<Regex, regex::Error> {
    RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
}

/// The compiled `pattern`, charging the evaluation for matching it against `text`.
fn regex_for(function: &str, text: &str, pattern: &str) -> Result<Rc<Regex>, ExecutionError> {
    // cel-go charges the string traversal times a quarter of the pattern length.
    let pattern_factor = 1 + (pattern.len() as u64).div_ceil(4);
    charge(string_traversal(text.len()).saturating_mul(pattern_factor))?;
    if let Some(cached) = CACHE.with(|c| c.borrow().get(pattern).cloned()) {
        return Ok(cached);
    }
    let regex = compile(pattern)
        .map_err(|e| ExecutionError::function_error(function, format!("invalid regex: {e}")))?;
    let regex = Rc::new(regex);
    CACHE.with(|c| {
        let mut cache = c.borrow_mut();
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(pattern.to_owned(), Rc::clone(&regex));
    });
    Ok(regex)
}

fn text_and_pattern<'a>(args: &'a [CowVal<'_, '_>]) -> Result<(&'a str, &'a str), ExecutionError> {
    match args {
        [text, pattern, ..] => Ok((string_arg(&**text)?, string_arg(&**pattern)?)),
        _ => Err(ExecutionError::invalid_argument_count(2, args.len())),
    }
}

fn matches<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let (text, pattern) = text_and_pattern(&args)?;
    boolean(regex_for("matches", text, pattern)?.is_match(text))
}

fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let (text, pattern) = text_and_pattern(&args)?;
    let regex = regex_for("find", text, pattern)?;
    string(
        regex
            .find(text)
            .map(|m| m.as_str().to_owned())
            .unwrap_or_default(),
    )
}

fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Return<'b, 'v> {
    let (text, pattern) = text_and_pattern(&args)?;
    let limit = match args.get(2) {
        Some(limit) => int_arg(&**limit)?,
        None => -1,
    };
    if limit == 0 {
        return list(Vec::new());
    }
    let regex = regex_for("findAll", text, pattern)?;
    let found = regex
        .find_iter(text)
        .map(|m| Box::new(CelString::from(m.as_str().to_owned())) as Box<dyn Val>);
    match usize::try_from(limit) {
        Ok(limit) => list(found.take(limit).collect()),
        Err(_) => list(found.collect()),
    }
}
