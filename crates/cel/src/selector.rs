//! Compiling expressions into selectors (cached) and evaluating them on devices.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cel::common::ast::IdedExpr;
use cel::common::types::CelBool;
use cel::{Context, ParseErrors, Value};

use crate::check::{self, Ty};
use cel::context::VariableResolver;

use crate::device::{DeviceContext, DeviceView};
use crate::env::environment;
use crate::error::{CompileError, EvalError};
use crate::instrument::instrument;
use crate::meter::Meter;
use crate::references::{NameReference, name_references};
use crate::{COST_LIMIT, MAX_EXPRESSION_LENGTH, MAX_NESTING};

/// Stack of the compiling thread (reserved address space; only what is used is committed).
const COMPILE_STACK_BYTES: usize = 64 << 20;
/// Compiled selectors kept before the cache starts over.
const DEFAULT_CACHE_CAPACITY: usize = 4096;

/// Compiles selector expressions, caching the result (errors included) by expression.
/// `Send + Sync`: share one per process.
#[derive(Debug)]
pub struct SelectorCompiler {
    cache: RwLock<HashMap<String, Result<Arc<Selector>, CompileError>>>,
    capacity: usize,
}

impl Default for SelectorCompiler {
    fn default() -> Self {
        Self::with_cache_capacity(DEFAULT_CACHE_CAPACITY)
    }
}

impl SelectorCompiler {
    pub fn new() -> Self {
        Self::default()
    }

    /// A compiler that keeps at most `capacity` expressions (then starts over).
    pub fn with_cache_capacity(capacity: usize) -> Self {
        SelectorCompiler {
            cache: RwLock::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// Compiles `expression`, or returns the cached result of an earlier compilation.
    pub fn compile(&self, expression: &str) -> Result<Arc<Selector>, CompileError> {
        let cached = self
            .cache
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(expression)
            .cloned();
        if let Some(result) = cached {
            return result;
        }
        let result = compile_on_a_large_stack(expression).map(Arc::new);
        let mut cache = self
            .cache
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if cache.len() >= self.capacity {
            cache.clear();
        }
        cache.insert(expression.to_owned(), result.clone());
        result
    }
}

/// The parser recurses deeply on nested input: compile on a thread with a stack large enough
/// for any 10 KiB expression, whatever the caller's stack (a tokio worker has 2 MiB).
fn compile_on_a_large_stack(expression: &str) -> Result<Selector, CompileError> {
    std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("cel-compile".to_owned())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(scope, || Selector::compile(expression))
        {
            Ok(compiling) => compiling
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: compile here.
            Err(_) => Selector::compile(expression),
        }
    })
}

/// A compiled selector. `Send + Sync`: evaluate it from any thread.
#[derive(Debug)]
pub struct Selector {
    expression: String,
    program: IdedExpr,
    estimated_cost: Option<u64>,
    references: Vec<NameReference>,
    /// The program reads the device through one-step names only (see [`Selector::evaluate_view`]).
    paths_only: bool,
}

impl Selector {
    fn compile(expression: &str) -> Result<Selector, CompileError> {
        if expression.len() > MAX_EXPRESSION_LENGTH {
            return Err(CompileError::TooLong {
                length: expression.len(),
                limit: MAX_EXPRESSION_LENGTH,
            });
        }
        let (mut program, source) = environment()
            .parser()
            .parse_with_source_info(expression)
            .map_err(|errors| syntax_error(expression, &errors))?;
        let depth = check::depth(&program);
        if depth > MAX_NESTING {
            return Err(CompileError::TooDeep {
                depth,
                limit: MAX_NESTING,
            });
        }
        let checked = check::check(&program).map_err(|e| {
            let (line, column, snippet) = check::position(&source, e.id);
            CompileError::Check {
                message: e.message,
                line,
                column,
                snippet,
            }
        })?;
        if !matches!(checked.ty, Ty::Bool | Ty::Dyn) {
            return Err(CompileError::NotBool {
                found: checked.ty.to_string(),
            });
        }
        let references = name_references(&program);
        instrument(&mut program);
        Ok(Selector {
            expression: expression.to_owned(),
            paths_only: crate::path::reads_paths_only(&program),
            program,
            estimated_cost: checked.cost.bound(),
            references,
        })
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The attribute and capacity names the selector looks up with constant keys, in source
    /// order: what `tessera validate` checks against Tessera's schema.
    pub fn name_references(&self) -> &[NameReference] {
        &self.references
    }

    /// Upper bound of the evaluation cost in cel-go's units, or `None` when it depends on sizes
    /// only known at run time (evaluation is bounded by [`COST_LIMIT`] either way).
    pub fn estimated_cost(&self) -> Option<u64> {
        self.estimated_cost
    }

    /// Fails like the API server does for a selector whose estimated cost is above the limit.
    pub fn check_estimated_cost(&self) -> Result<(), CompileError> {
        match self.estimated_cost {
            Some(estimated) if estimated > COST_LIMIT => {
                Err(CompileError::EstimatedCostExceedsLimit {
                    estimated,
                    limit: COST_LIMIT,
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether `device` matches. Any failure is an error, never a silent `false`.
    pub fn evaluate(&self, device: &DeviceContext) -> Result<bool, EvalError> {
        self.evaluate_with_cost(device).0
    }

    /// Whether the selector reads the device only through names resolved in one step
    /// (`device.driver`, `device.allowMultipleAllocations`, `device.attributes["<domain>"].<id>`,
    /// `device.capacity["<domain>"]…`), never through the `device` or `attributes`/`capacity`
    /// maps as a whole: then [`Selector::evaluate_view`] needs no [`DeviceContext`].
    pub fn reads_paths_only(&self) -> bool {
        self.paths_only
    }

    /// Whether the device `view` shows matches: the same answer as [`Selector::evaluate`] on the
    /// device's [`DeviceContext`], without building one when the selector
    /// [reads paths only](Selector::reads_paths_only) (otherwise one is built for this call).
    pub fn evaluate_view(&self, view: &DeviceView<'_>) -> Result<bool, EvalError> {
        if !self.paths_only {
            return self.evaluate(&DeviceContext::new(view.driver(), view.device()));
        }
        self.run(view.invalid(), view).0
    }

    /// [`Selector::evaluate`] and the cost the evaluation was charged.
    pub fn evaluate_with_cost(&self, device: &DeviceContext) -> (Result<bool, EvalError>, u64) {
        self.run(device.invalid(), device)
    }

    fn run(
        &self,
        invalid: Option<&EvalError>,
        device: &dyn VariableResolver,
    ) -> (Result<bool, EvalError>, u64) {
        if let Some(invalid) = invalid {
            return (Err(invalid.clone()), 0);
        }
        let mut context = Context::with_env(Arc::clone(environment()));
        context.set_variable_resolver(device);
        let meter = Meter::start(COST_LIMIT);
        let result = Value::resolve_val(&self.program, &context)
            .map_err(EvalError::from_execution)
            .and_then(|value| match value.downcast_ref::<CelBool>() {
                Some(b) => Ok(*b.inner()),
                None => Err(EvalError::NotBool {
                    found: value.get_type().name().to_owned(),
                }),
            });
        let spent = meter.finish();
        if spent.exceeded {
            return (
                Err(EvalError::CostLimitExceeded { limit: COST_LIMIT }),
                spent.cost,
            );
        }
        (result, spent.cost)
    }
}

/// The parser's errors as cel-go prints them, with the offending line and a caret.
pub(crate) fn syntax_error(source: &str, errors: &ParseErrors) -> CompileError {
    let mut message = String::new();
    for (i, error) in errors.errors.iter().enumerate() {
        let (line, column) = (error.pos.0.max(1) as usize, error.pos.1.max(1) as usize);
        if i > 0 {
            message.push('\n');
        }
        message.push_str(&format!(
            "ERROR: <input>:{line}:{column}: {}",
            describe(&error.msg)
        ));
        if let Some(text) = source.lines().nth(line - 1) {
            message.push_str(&format!("\n | {text}\n | {:.>column$}", "^"));
        }
    }
    let (line, column) = errors.errors.first().map_or((1, 1), |e| {
        (e.pos.0.max(1) as usize, e.pos.1.max(1) as usize)
    });
    CompileError::Syntax {
        message,
        line,
        column,
    }
}

/// The parser reports its recursion limit as a debug dump of an inner error; say it as cel-go.
fn describe(message: &str) -> String {
    match message.split_once("Recursion limit of ") {
        Some((_, rest)) => {
            let limit: String = rest.chars().take_while(char::is_ascii_digit).collect();
            format!("expression recursion limit exceeded: {limit}")
        }
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread with tokio's default worker stack.
    fn on_a_two_mib_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn the_deepest_accepted_expressions_compile_and_evaluate_on_a_small_stack() {
        on_a_two_mib_stack(|| {
            let compiler = SelectorCompiler::new();
            let device = DeviceContext::from_parts("d", false, [], []);
            let depth = MAX_NESTING - 2;
            let shapes = [
                format!("{}1 == {}", "1 + ".repeat(depth), depth + 1),
                format!(
                    "{}true{}",
                    "[true].all(x, ".repeat(depth / 4),
                    ")".repeat(depth / 4)
                ),
                format!("{}true", "!!".repeat(depth)),
                format!(
                    "{}x{}",
                    "cel.bind(x, true, ".repeat(depth / 2),
                    ")".repeat(depth / 2)
                ),
                format!(
                    "{}1{} == 1",
                    "[".repeat(depth / 2 - 2),
                    "][0]".repeat(depth / 2 - 2)
                ),
            ];
            for expression in shapes {
                let selector = compiler.compile(&expression);
                let result = selector.as_ref().map(|s| s.evaluate(&device));
                assert!(matches!(result, Ok(Ok(true))), "{expression}: {result:?}");
            }
            let too_deep = format!("{}1 == 1", "1 + ".repeat(MAX_NESTING));
            assert!(matches!(
                compiler.compile(&too_deep),
                Err(CompileError::TooDeep { .. })
            ));
            let parens = format!("{}true{}", "(".repeat(500), ")".repeat(500));
            let error = compiler.compile(&parens).unwrap_err().to_string();
            assert!(
                error.contains("expression recursion limit exceeded"),
                "{error}"
            );
        });
    }

    #[test]
    fn errors_are_cached_too() {
        let compiler = SelectorCompiler::with_cache_capacity(2);
        assert!(compiler.compile("1 +").is_err());
        assert!(compiler.compile("1 +").is_err());
        let first = compiler.compile("true").unwrap();
        assert!(Arc::ptr_eq(&first, &compiler.compile("true").unwrap()));
        // Capacity 2: a third expression starts the cache over.
        compiler.compile("false").unwrap();
        assert!(!Arc::ptr_eq(&first, &compiler.compile("true").unwrap()));
    }
}
