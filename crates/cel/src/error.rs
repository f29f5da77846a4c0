//! Compile and evaluation errors, with the texts upstream (cel-go in kube-scheduler) reports.

use cel::ExecutionError;

/// Why an expression cannot be used as a device selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The API limits `cel.expression` to 10 KiB.
    #[error(
        "expression is {length} bytes long, more than the {limit} bytes a CEL selector may have; shorten it"
    )]
    TooLong { length: usize, limit: usize },
    /// The expression is not CEL. `message` is the parser's text, `ERROR: <input>:line:column: …`
    /// followed by the offending line and a caret.
    #[error("compilation failed: {message}")]
    Syntax {
        message: String,
        line: usize,
        column: usize,
    },
    /// The expression is CEL but refers to something the DRA environment does not have, or applies
    /// a function to arguments it cannot take (`undeclared reference to 'x'`,
    /// `found no matching overload for …`, `undefined field 'x'`).
    #[error("compilation failed: ERROR: <input>:{line}:{column}: {message}{snippet}")]
    Check {
        message: String,
        line: usize,
        column: usize,
        /// The offending line and a caret under the column, each line prefixed with `\n | `.
        snippet: String,
    },
    /// The expression's type is known and is not `bool`.
    #[error("must evaluate to bool or the unknown type, not {found}")]
    NotBool { found: String },
    /// The expression nests deeper than the evaluator supports.
    #[error("expression nests {depth} levels deep, more than the {limit} supported; simplify it")]
    TooDeep { depth: usize, limit: usize },
    /// The worst-case cost estimate is above the limit; the API server refuses such selectors.
    #[error(
        "too complex, exceeds cost limit: the estimated worst-case cost {estimated} is more than {limit}; iterate over fewer or smaller lists"
    )]
    EstimatedCostExceedsLimit { estimated: u64, limit: u64 },
}

/// Why a selector could not be evaluated on a device. Never a silent "no match": the allocator
/// fails the claim and names the selector and the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// A map lookup of a key the map does not have.
    #[error(
        "no such key: {key} (guard the lookup: `\"{key}\" in …`, `has(….{key})` or `….?{key}.orValue(…)`)"
    )]
    NoSuchKey { key: String },
    /// The result was not a bool (for example a list attribute returned as is).
    #[error("CEL result of type {found} could not be converted to bool")]
    NotBool { found: String },
    /// The evaluation used up its cost budget (upstream's runtime limit).
    #[error("operation cancelled: actual cost limit exceeded (limit {limit})")]
    CostLimitExceeded { limit: u64 },
    /// The device carries an attribute or capacity CEL cannot represent, such as a version that
    /// is not semver. Upstream fails every selector on such a device.
    #[error("{name}: {problem}")]
    InvalidDevice { name: String, problem: String },
    /// Any other runtime error: no matching overload, division by zero, a bad argument.
    #[error("{message}")]
    Runtime { message: String },
}

impl EvalError {
    pub(crate) fn from_execution(error: ExecutionError) -> EvalError {
        let runtime = |message: String| EvalError::Runtime { message };
        match error {
            ExecutionError::NoSuchKey(key) => EvalError::NoSuchKey {
                key: key.to_string(),
            },
            ExecutionError::UnexpectedType { got, want } if want == "iterable" => {
                runtime(format!("got '{got}', expected iterable type"))
            }
            ExecutionError::UnexpectedType { got, want } => {
                runtime(format!("got '{got}', expected '{want}'"))
            }
            ExecutionError::UndeclaredReference(name) => match crate::path::missing_key(&name) {
                Some(key) => EvalError::NoSuchKey {
                    key: key.to_owned(),
                },
                None => runtime(format!("undeclared reference to '{name}'")),
            },
            ExecutionError::FunctionError { function, message } => {
                runtime(format!("{function}: {message}"))
            }
            ExecutionError::DivisionByZero(_) => runtime("division by zero".to_owned()),
            ExecutionError::RemainderByZero(_) => runtime("modulus by zero".to_owned()),
            ExecutionError::Overflow(..) => runtime("integer overflow".to_owned()),
            ExecutionError::UnsupportedBinaryOperator(operator, lhs, rhs) => {
                let symbol = match operator {
                    "add" => "+",
                    "sub" => "-",
                    "mul" => "*",
                    "div" => "/",
                    "rem" => "%",
                    other => other,
                };
                runtime(format!(
                    "found no matching overload for '_{symbol}_' applied to '({}, {})'",
                    type_name(&lhs),
                    type_name(&rhs)
                ))
            }
            other => runtime(other.to_string()),
        }
    }
}

fn type_name(value: &cel::Value) -> String {
    match value.type_of().to_string().as_str() {
        "float" => "double".to_owned(),
        other => other.to_owned(),
    }
}
