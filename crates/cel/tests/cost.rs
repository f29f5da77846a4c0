//! The cost guard: expressions that would run away fail with a cost error, quickly, whatever
//! CEL's error absorption does; ordinary selectors cost little.

mod table;

use tessera_cel::{COST_LIMIT, CompileError, DeviceContext, EvalError, SelectorCompiler};

fn device() -> DeviceContext {
    DeviceContext::from_parts("dra.example.com", false, [], [])
}

fn cost_error(expression: &str) {
    let selector = SelectorCompiler::new().compile(expression).unwrap();
    let (result, cost) = selector.evaluate_with_cost(&device());
    assert_eq!(
        result,
        Err(EvalError::CostLimitExceeded { limit: COST_LIMIT }),
        "{expression}"
    );
    assert!(cost > COST_LIMIT, "{expression}: charged {cost}");
}

#[test]
fn seven_nested_alls_fail_on_both_estimate_and_budget() {
    let selector = SelectorCompiler::new()
        .compile(table::SEVEN_NESTED_ALL)
        .unwrap();
    let estimated = selector.estimated_cost().unwrap();
    assert!(estimated > 10_000_000, "estimated {estimated}");
    assert!(matches!(
        selector.check_estimated_cost(),
        Err(CompileError::EstimatedCostExceedsLimit { .. })
    ));
    cost_error(table::SEVEN_NESTED_ALL);
}

#[test]
fn swallowed_cost_errors_still_fail_the_evaluation() {
    // `error || true` is `true` in CEL; running out of budget is not an ordinary error.
    let nested = "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, true))))))";
    cost_error(&format!("({nested}) || true"));
    cost_error(&format!("[1, 2].exists(x, x == 2 || {nested})"));
}

#[test]
fn values_cannot_grow_without_paying_for_it() {
    // Each bind doubles a string: 2^40 bytes if nothing stopped it.
    let mut doubling = "s0 == s0".to_owned();
    for i in (1..=40).rev() {
        doubling = format!("cel.bind(s{i}, s{} + s{}, {doubling})", i - 1, i - 1);
    }
    cost_error(&format!(
        "cel.bind(s0, \"0123456789abcdef\", {})",
        doubling.replacen("s0 == s0", "s40 == s40", 1)
    ));
    // Replacing each character with many multiplies the size.
    cost_error(
        r#"cel.bind(a, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", cel.bind(b, a.replace("x", a), cel.bind(c, b.replace("x", b), cel.bind(d, c.replace("x", c), d.size() > 0))))"#,
    );
    // Scanning a big string in a loop pays for the scan each time.
    cost_error(
        r#"cel.bind(s, "abcdefghijklmnopqrstuvwxyz".replace("", "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz"), [1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, !s.contains("zzz"))))))"#,
    );
    cost_error(
        r#"[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, "%.60000f".format([1.0]).size() > 0))))"#,
    );
}

#[test]
fn ordinary_selectors_cost_little() {
    let compiler = SelectorCompiler::new();
    let device = DeviceContext::from_parts(
        "gpu.tessera.dev",
        false,
        [(
            "productName".to_owned(),
            tessera_cel::AttributeValue::String("NVIDIA H100 80GB HBM3".to_owned()),
        )],
        [("memory".to_owned(), "80Gi".to_owned())],
    );
    for expression in [
        r#"device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA H100")"#,
        r#"device.capacity["gpu.tessera.dev"].memory.isGreaterThan(quantity("40Gi"))"#,
        r#"device.attributes["gpu.tessera.dev"].productName.matches("H[0-9]+")"#,
    ] {
        let selector = compiler.compile(expression).unwrap();
        let (result, cost) = selector.evaluate_with_cost(&device);
        assert_eq!(result, Ok(true), "{expression}");
        assert!(cost < 100, "{expression}: charged {cost}");
        assert!(selector.estimated_cost().unwrap() < 1_000, "{expression}");
    }
}

#[test]
fn the_estimate_is_unbounded_only_when_sizes_are_unknown() {
    let compiler = SelectorCompiler::new();
    let bounded = compiler
        .compile(r#"device.attributes["gpu.tessera.dev"].exists(k, k.startsWith("nvlink"))"#)
        .unwrap();
    assert!(bounded.estimated_cost().is_some());
    let unbounded = compiler
        .compile(r#"device.attributes["gpu.tessera.dev"].exists(k, k.split("").exists(c, c.split("").exists(d, d == "x")))"#)
        .unwrap();
    assert_eq!(unbounded.estimated_cost(), None);
    assert!(unbounded.check_estimated_cost().is_ok());
}
