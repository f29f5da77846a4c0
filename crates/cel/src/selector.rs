//! Compiling expressions into selectors (cached) and evaluating them on devices.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cel::common::ast::IdedExpr;
use cel::common::types::CelBool;
use cel::{Context, ParseErrors, Value};

use crate::check::{self, Ty};
use crate::device::DeviceContext;
use crate::env::environment;
use crate::error::{CompileError, EvalError};
use crate::instrument::instrument;
use crate::meter::Meter;
use crate::{COST_LIMIT, MAX_EXPRESSION_LENGTH, MAX_NESTING};

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
        let result = Selector::compile(expression).map(Arc::new);
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

/// A compiled selector. `Send + Sync`: evaluate it from any thread.
#[derive(Debug)]
pub struct Selector {
    expression: String,
    program: IdedExpr,
    estimated_cost: Option<u64>,
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
        instrument(&mut program);
        Ok(Selector {
            expression: expression.to_owned(),
            program,
            estimated_cost: checked.cost.bound(),
        })
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
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

    /// [`Selector::evaluate`] and the cost the evaluation was charged.
    pub fn evaluate_with_cost(&self, device: &DeviceContext) -> (Result<bool, EvalError>, u64) {
        if let Some(invalid) = device.invalid() {
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
fn syntax_error(source: &str, errors: &ParseErrors) -> CompileError {
    let mut message = String::new();
    for (i, error) in errors.errors.iter().enumerate() {
        let (line, column) = (error.pos.0.max(1) as usize, error.pos.1.max(1) as usize);
        if i > 0 {
            message.push('\n');
        }
        message.push_str(&format!("ERROR: <input>:{line}:{column}: {}", error.msg));
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
