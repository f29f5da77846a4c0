//! The table-test harness shared by the behaviour tests.

// Each test binary uses its own part of the harness.
#![allow(dead_code)]

use tessera_cel::{AttributeValue, DeviceContext, SelectorCompiler};

/// Seven nested `all()` over 10-element lists, from upstream's "expensive" case.
pub const SEVEN_NESTED_ALL: &str = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z4, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z5, int('1'.find('[0-9]*')) < 100)))))))";

/// What a case expects.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    /// Compiles and evaluates to this.
    Match(bool),
    /// Fails to compile with an error containing this text.
    CompileError(&'static str),
    /// Compiles, then fails to evaluate with an error containing this text.
    EvalError(&'static str),
}

/// One row: an expression, the device it runs on, the expected outcome.
pub struct Case {
    expression: String,
    driver: String,
    allow_multiple_allocations: bool,
    attributes: Vec<(String, AttributeValue)>,
    capacity: Vec<(String, String)>,
    outcome: Outcome,
}

impl Case {
    pub fn new(expression: impl Into<String>, outcome: Outcome) -> Case {
        Case {
            expression: expression.into(),
            driver: "dra.example.com".to_owned(),
            allow_multiple_allocations: false,
            attributes: Vec::new(),
            capacity: Vec::new(),
            outcome,
        }
    }

    pub fn driver(mut self, driver: &str) -> Case {
        self.driver = driver.to_owned();
        self
    }

    pub fn multiple_allocations(mut self, allowed: bool) -> Case {
        self.allow_multiple_allocations = allowed;
        self
    }

    pub fn attr(mut self, name: &str, value: AttributeValue) -> Case {
        self.attributes.push((name.to_owned(), value));
        self
    }

    pub fn bool_attr(self, name: &str, value: bool) -> Case {
        self.attr(name, AttributeValue::Bool(value))
    }

    pub fn int_attr(self, name: &str, value: i64) -> Case {
        self.attr(name, AttributeValue::Int(value))
    }

    pub fn string_attr(self, name: &str, value: &str) -> Case {
        self.attr(name, AttributeValue::String(value.to_owned()))
    }

    pub fn version_attr(self, name: &str, value: &str) -> Case {
        self.attr(name, AttributeValue::Version(value.to_owned()))
    }

    pub fn strings_attr(self, name: &str, values: &[&str]) -> Case {
        let values = values.iter().map(|v| (*v).to_owned()).collect();
        self.attr(name, AttributeValue::Strings(values))
    }

    pub fn capacity(mut self, name: &str, quantity: &str) -> Case {
        self.capacity.push((name.to_owned(), quantity.to_owned()));
        self
    }
}

/// Runs every case and reports all failures at once.
pub fn run(cases: &[Case]) {
    let compiler = SelectorCompiler::new();
    let mut failures = Vec::new();
    for case in cases {
        let device = DeviceContext::from_parts(
            &case.driver,
            case.allow_multiple_allocations,
            case.attributes.clone(),
            case.capacity.clone(),
        );
        let outcome = match compiler.compile(&case.expression) {
            Err(e) => Err(format!("compile error: {e}")),
            Ok(selector) => selector
                .evaluate(&device)
                .map_err(|e| format!("evaluation error: {e}")),
        };
        let ok = match (case.outcome, &outcome) {
            (Outcome::Match(expected), Ok(actual)) => expected == *actual,
            (Outcome::CompileError(text), Err(e)) => {
                e.starts_with("compile error") && e.contains(text)
            }
            (Outcome::EvalError(text), Err(e)) => {
                e.starts_with("evaluation error") && e.contains(text)
            }
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{}\n    expected {:?}, got {:?}",
                case.expression, case.outcome, outcome
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
