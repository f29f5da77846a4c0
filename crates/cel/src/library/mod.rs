//! The functions and macros of the Kubernetes DRA CEL environment that the `cel` crate does not
//! have: the quantity and semver libraries, the strings extension (version 2), the regex, lists
//! and sets libraries, `includes`, `cel.bind`, two-variable comprehensions, and the internal
//! functions compilation inserts to meter cost.
//!
//! Every function here charges the running evaluation's budget ([`crate::meter`]) for the work it
//! does before doing it.

mod overload;

pub(crate) mod internal;
pub(crate) mod lists;
pub(crate) mod macros;
pub(crate) mod quantity;
pub(crate) mod regex;
pub(crate) mod semver;
pub(crate) mod strings;
mod strings_format;

use cel::{DeclarationError, Env};

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
