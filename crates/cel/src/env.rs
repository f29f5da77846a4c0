//! The one CEL environment every selector compiles and evaluates in.

use std::sync::{Arc, LazyLock};

use cel::Env;

use crate::library;

static ENVIRONMENT: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Registration only fails on a duplicate declaration, a bug the unit tests catch.
    if let Err(e) = library::register(&mut env) {
        panic!("the DRA CEL library declares every function once: {e}");
    }
    Arc::new(env)
});

/// The DRA environment: the CEL standard library, optional types, and [`library`].
pub(crate) fn environment() -> &'static Arc<Env> {
    &ENVIRONMENT
}
