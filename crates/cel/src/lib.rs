//! The DRA CEL environment: device selectors evaluated exactly as kube-scheduler evaluates them.
//! No IO, no kube, no tokio.
//!
//! ```
//! use tessera_cel::{AttributeValue, DeviceContext, SelectorCompiler};
//!
//! let compiler = SelectorCompiler::new();
//! let selector = compiler
//!     .compile(r#"device.capacity["gpu.tessera.dev"].memory.isGreaterThan(quantity("40Gi"))"#)
//!     .unwrap();
//! let device = DeviceContext::from_parts(
//!     "gpu.tessera.dev",
//!     false,
//!     [("type".to_owned(), AttributeValue::String("gpu".to_owned()))],
//!     [("memory".to_owned(), "80Gi".to_owned())],
//! );
//! assert_eq!(selector.evaluate(&device), Ok(true));
//! ```
//!
//! # The environment
//!
//! One variable, `device`, with `driver`, `attributes` (domain → identifier → value),
//! `capacity` (domain → identifier → quantity) and `allowMultipleAllocations`. Unqualified names
//! appear under the driver's domain; versions are semver values; an unknown domain is an empty
//! map, a missing key a `no such key` error. On top of the CEL standard library and optional
//! types (`.?x`, `m[?k]`, `orValue`), the `library` module adds what Kubernetes enables: the quantity
//! and semver libraries, the strings extension, `matches`/`find`/`findAll`, the lists and sets
//! libraries, `includes`, `cel.bind` and two-variable comprehensions. Functions Kubernetes does
//! not have are compile errors, as upstream.
//!
//! # Compiling
//!
//! [`SelectorCompiler::compile`] parses with the `cel` crate, then runs a light type checker over
//! the AST (module `check`): unknown identifiers, functions and fields, overloads that cannot apply to
//! the known argument types, mixed-type literals, bad literal regexes, and a result type that is
//! known not to be `bool` are compile errors with a position, as upstream reports them. Where a
//! type is only known at run time (attribute values), the check is lenient and evaluation
//! decides. Results, errors included, are cached by expression.
//!
//! # Cost
//!
//! Upstream bounds a selector's cost at 1,000,000 units twice: the API server rejects selectors
//! whose *estimated* worst case exceeds it, and the scheduler stops an evaluation whose *actual*
//! cost exceeds it. The `cel` crate has no cost hooks, so both are done here:
//!
//! - **Static estimate** ([`Selector::estimated_cost`]): the checker computes an upper bound in
//!   cel-go's units from the sizes it can bound — literals, and the limits the API puts on a
//!   device (32 attributes and capacities, 64-character values) — multiplying the body of each
//!   comprehension by the size of its range. Seven nested `all()` over 10-element lists
//!   estimate to over 10,000,000. Where a size depends on run-time values (a `split` result) the
//!   estimate is unbounded. [`Selector::check_estimated_cost`] is what the API server would
//!   refuse; `compile` itself does not refuse on it, since the scheduler evaluates whatever was
//!   stored.
//! - **Runtime budget** (always on, [`COST_LIMIT`]): compilation rewrites the program so that
//!   evaluating it pays for its work (module `instrument`): each comprehension iteration calls a tick
//!   that charges the number of nodes the iteration evaluates; values whose size is not bounded
//!   by the source or the device are charged by size where a function traverses them, and
//!   concatenations by what they build; the library functions charge before working (string
//!   traversals at a tenth per byte as cel-go does, regexes by text × pattern length, lists per
//!   element). The budget lives in a thread-local armed for one evaluation (module `meter`); once
//!   spent, every charge fails and the evaluation fails with `actual cost limit exceeded`, even
//!   if CEL's error absorption (`error || true`) swallowed the failing call. Loops are the only
//!   unbounded work in CEL and every iteration ticks, so no selector runs away: the seven nested
//!   `all()` stop after about 10^5 iterations, in milliseconds.
//!
//! Expressions longer than 10 KiB are rejected, as the API rejects them, and so are expressions
//! nested deeper than [`MAX_NESTING`] (which bounds the interpreter's recursion).
//!
//! # Modules
//!
//! From the ground up (a module imports only from modules on its line or the lines before):
//! - `meter` (the runtime budget), `quantity` and `version` (the CEL values of quantities and
//!   semvers), `references` (what a selector names), `walk` (visiting an expression's nodes);
//! - `path` (constant device paths resolved in one step), `values` (quantities, versions and a
//!   device's maps as interpreter values);
//! - `error`, `check` (the type checker and cost estimate; `types` and `cost` below its `mod.rs`),
//!   `library` (the Kubernetes functions; `overload` below the libraries, `register` in `mod.rs`);
//! - `device` (the `device` variable), `instrument` (the cost rewrite);
//! - `env` (the environment), `selector` (compiling and evaluating), `rewrite` (`rewrite_domain`).

mod check;
mod device;
mod env;
mod error;
mod instrument;
mod library;
mod meter;
mod path;
mod quantity;
mod references;
mod rewrite;
mod selector;
mod values;
mod version;
mod walk;

pub use device::{AttributeValue, DeviceContext, DeviceView};
pub use error::{CompileError, EvalError};
pub use quantity::{QuantityError, QuantityValue};
pub use references::{DeviceMap, NameReference};
pub use rewrite::{NameFate, Rewritten, rewrite_domain};
pub use selector::{Selector, SelectorCompiler};
pub use version::{Version, VersionError};

/// Upstream's limit on a selector's cost (`CELSelectorExpressionMaxCost`), estimated and actual.
pub const COST_LIMIT: u64 = 1_000_000;
/// Upstream's limit on a selector's length in bytes (`CELSelectorExpressionMaxLength`).
pub const MAX_EXPRESSION_LENGTH: usize = 10 * 1024;
/// Deepest expression nesting accepted.
pub const MAX_NESTING: usize = 64;
