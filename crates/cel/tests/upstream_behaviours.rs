//! Table test: every behaviour upstream-facts.md lists under "Behaviours to match", plus cases
//! derived from upstream's `cel/compile_test.go` and the quantity/semver library documentation.

mod table;

use table::Outcome::{CompileError, EvalError, Match};
use table::{Case, run};

#[test]
fn behaviours_to_match() {
    run(&[
        Case::new("true", Match(true)),
        Case::new("false", Match(false)),
        Case::new("?!", CompileError("Syntax error")),
        Case::new("1", CompileError("must evaluate to bool")),
        Case::new(r#""no-such-domain" in device.attributes"#, Match(false)),
        Case::new(r#"device.driver == """#, Match(true)).driver(""),
        Case::new(r#"device.attributes["dra.example.com"].name"#, Match(true)).bool_attr("name", true),
        Case::new(r#"cel.bind(dra, device.attributes["dra.example.com"], dra.name)"#, Match(true))
            .bool_attr("name", true),
        Case::new(r#"device.attributes["dra.example.com"].name.isGreaterThan(semver("0.0.1"))"#, Match(true))
            .version_attr("name", "1.0.0"),
        Case::new(
            r#"device.attributes["dra.example.com"].name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)"#,
            Match(true),
        )
        .version_attr("name", "1.0.0"),
        Case::new(r#"device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))"#, Match(true))
            .capacity("name", "1Mi"),
        Case::new(r#"device.attributes["dra.example.com"].services.split("example").size() >= 2"#, Match(true))
            .string_attr("services", "some_example_value"),
        Case::new(r#"device.attributes["dra.example.com"].services.matches("[^a]?sym")"#, Match(true))
            .string_attr("services", "asymetric"),
        Case::new(r#"device.attributes.exists_one(x, x == "dra.example.com")"#, Match(true))
            .string_attr("services", "some_example_value"),
        Case::new(table::SEVEN_NESTED_ALL, EvalError("actual cost limit exceeded")),
        Case::new(r#"device.attributes["dra.example.com"].name.exists(x, x > 0)"#, EvalError("expected iterable type"))
            .int_attr("name", 1),
        Case::new(r#"device.attributes["dra.example.com"].names"#, EvalError("could not be converted to bool"))
            .strings_attr("names", &["fish", "bird"]),
    ]);
}
