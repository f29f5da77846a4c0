//! Table tests derived from upstream's `cel/compile_test.go` (dynamic-resource-allocation), the
//! Kubernetes quantity and semver library documentation, and the CEL extensions Kubernetes
//! enables. Each row: expression, device, expected outcome.

mod table;

use table::Outcome::{CompileError, EvalError, Match};
use table::{Case, run};
use tessera_cel::AttributeValue;

const D: &str = r#"device.attributes["dra.example.com"]"#;
const C: &str = r#"device.capacity["dra.example.com"]"#;

fn on(expression: &str) -> String {
    expression.replace("$D", D).replace("$C", C)
}

/// Looking attributes up: missing domains and keys, `in`, the driver, qualified and short names,
/// comparisons.
fn lookup_cases() -> Vec<Case> {
    vec![
        Case::new(
            on(r#"device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))"#),
            EvalError("no such key: noSuchAttr"),
        ),
        Case::new(
            on(r#"device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))"#),
            EvalError("no such key: noSuchAttr"),
        ),
        Case::new(r#""dra.example.com" in device.attributes"#, Match(true))
            .bool_attr("dra.example.com/something", true),
        Case::new(r#"device.driver == "dra.example.com""#, Match(true)),
        Case::new(on(r#"$D["name"]"#), Match(true)).bool_attr("name", true),
        Case::new(
            r#"device.attributes["other.example.com"].name"#,
            Match(true),
        )
        .bool_attr("other.example.com/name", true),
        Case::new(on("$D.name > 0"), Match(true)).int_attr("name", 1),
        Case::new(on(r#"$D.name == "fish""#), Match(true)).string_attr("name", "fish"),
    ]
}

/// `exists` on a scalar attribute is an error; `includes` on a list of strings matches.
fn scalar_as_list_cases() -> Vec<Case> {
    vec![
        Case::new(
            on("$D.name.exists(x, x == true)"),
            EvalError("expected iterable type"),
        )
        .bool_attr("name", true),
        Case::new(
            on(r#"$D.name.exists(x, x == "fish")"#),
            EvalError("expected iterable type"),
        )
        .string_attr("name", "fish"),
        Case::new(
            on(r#"$D.name.exists(x, x.isGreaterThan(semver("0.0.1")))"#),
            EvalError("expected iterable type"),
        )
        .version_attr("name", "1.0.0"),
        Case::new(on(r#"$D.name.includes("fish")"#), Match(true))
            .strings_attr("name", &["fish", "bird"]),
    ]
}

/// Lists of every kind: size, `exists`, `all`, `includes` (a scalar read as a one-value list), the
/// 48-value limit, `in`.
fn list_cases() -> Vec<Case> {
    let long_list: Vec<String> = (0..49).map(|i| format!("value-{i}")).collect();
    let long_list: Vec<&str> = long_list.iter().map(String::as_str).collect();
    vec![
        Case::new(on("$D.names.size() == 2"), Match(true))
            .attr("names", AttributeValue::Bools(vec![true, false])),
        Case::new(on("$D.names.size() == 2"), Match(true))
            .attr("names", AttributeValue::Ints(vec![1, 2])),
        Case::new(on("$D.names.size() == 2"), Match(true)).attr(
            "names",
            AttributeValue::Versions(vec!["1.0.0".into(), "2.0.0".into()]),
        ),
        Case::new(on("$D.names.exists(x, x > 0)"), Match(true))
            .attr("names", AttributeValue::Ints(vec![1, 2])),
        Case::new(on(r#"$D.names.all(x, x != "")"#), Match(true))
            .strings_attr("names", &["fish", "bird"]),
        Case::new(
            on(r#"$D.names.all(x, x.isGreaterThan(semver("0.0.1")))"#),
            Match(true),
        )
        .attr(
            "names",
            AttributeValue::Versions(vec!["1.0.0".into(), "2.0.0".into()]),
        ),
        Case::new(on("$D.name.includes(true)"), Match(false)).bool_attr("name", false),
        Case::new(on("$D.name.includes(1)"), Match(true)).int_attr("name", 1),
        Case::new(on("$D.name.includes(3)"), Match(false))
            .attr("name", AttributeValue::Ints(vec![1, 2])),
        Case::new(on(r#"$D.name.includes(semver("1.0.0"))"#), Match(true)).attr(
            "name",
            AttributeValue::Versions(vec!["1.0.0".into(), "2.0.0".into()]),
        ),
        Case::new(
            on(r#"$D.name.includes("value-48")"#),
            EvalError("longer than 48 values"),
        )
        .strings_attr("name", &long_list),
        Case::new(on(r#"$D.name.includes("value-47")"#), Match(true))
            .strings_attr("name", &long_list[..48]),
        Case::new(on("1 in $D.names"), Match(true))
            .attr("names", AttributeValue::Ints(vec![1, 2, 3])),
    ]
}

/// Capacities, many lookups combined, `exists_one`, multiple allocations and macros.
fn capacity_and_combination_cases() -> Vec<Case> {
    vec![
        Case::new(
            on(r#""name" in $C && $C.name.isGreaterThan(quantity("1Ki"))"#),
            Match(true),
        )
        .capacity("name", "1Mi"),
        Case::new(
            on(r#"!("name" in $C) || $C.name.isGreaterThan(quantity("1Ki"))"#),
            Match(true),
        ),
        Case::new(
            on(
                r#"$C.quantity.isGreaterThan(quantity("1Ki")) && $D.bool && $D.int > 0 &&
                $D.string == "fish" && $D.version.isGreaterThan(semver("0.0.1")) &&
                $C["quantity"].isGreaterThan(quantity("1Ki")) && $D["bool"] && $D["int"] > 0 &&
                $D["string"] == "fish" && $D["version"].isGreaterThan(semver("0.0.1"))"#,
            ),
            Match(true),
        )
        .bool_attr("bool", true)
        .int_attr("int", 1)
        .string_attr("string", "fish")
        .version_attr("version", "1.0.0")
        .capacity("quantity", "1Mi"),
        Case::new(on("$D.a && $D.b && $D.c"), Match(true))
            .bool_attr("a", true)
            .bool_attr("b", true)
            .bool_attr("c", true),
        Case::new(on(r#"$D.exists_one(x, x == "services")"#), Match(true))
            .string_attr("services", "some_example_value"),
        Case::new(
            r#"device.capacity.exists_one(x, x == "dra.example.com")"#,
            Match(true),
        )
        .capacity("memory", "1Mi"),
        Case::new(on(r#"$C.exists_one(x, x == "memory")"#), Match(true)).capacity("memory", "1Mi"),
        Case::new("device.allowMultipleAllocations == true", Match(true))
            .multiple_allocations(true),
        Case::new("device.allowMultipleAllocations == false", Match(true)),
        Case::new(
            on("$D.map(key, $D[key] * 20).filter(e, e > 50).exists(e, e == 60)"),
            Match(true),
        )
        .int_attr("attr1", 1)
        .int_attr("attr3", 3),
    ]
}

#[test]
fn from_upstream_compile_test() {
    let cases: Vec<Case> = [
        lookup_cases(),
        scalar_as_list_cases(),
        list_cases(),
        capacity_and_combination_cases(),
    ]
    .into_iter()
    .flatten()
    .collect();
    run(&cases);
}

#[test]
fn from_the_quantity_library_docs() {
    run(&[
        Case::new(
            r#"isQuantity("1.3G") && isQuantity("1.3Gi") && isQuantity("10000k")"#,
            Match(true),
        ),
        Case::new(
            r#"isQuantity("1,3G") || isQuantity("200K") || isQuantity("Three") || isQuantity("Mi")"#,
            Match(false),
        ),
        Case::new(
            r#"quantity("200K") == quantity("200k")"#,
            EvalError("unable to parse quantity's suffix"),
        ),
        Case::new(
            r#"quantity("Three").sign() == 1"#,
            EvalError("quantities must match"),
        ),
        Case::new(
            r#"quantity("50000000G").isInteger() && quantity("50k").isInteger()"#,
            Match(true),
        ),
        Case::new(r#"quantity("1.1").isInteger()"#, Match(false)),
        Case::new(r#"quantity("50k").asInteger() == 50000"#, Match(true)),
        Case::new(
            r#"quantity("1.1").asInteger() == 1"#,
            EvalError("cannot convert value to integer"),
        ),
        Case::new(
            r#"quantity("50.703k").asApproximateFloat() == 50703.0"#,
            Match(true),
        ),
        Case::new(
            r#"quantity("50k").sign() == 1 && quantity("-50k").sign() == -1 && quantity("0").sign() == 0"#,
            Match(true),
        ),
        Case::new(
            r#"quantity("50k").isGreaterThan(quantity("100k"))"#,
            Match(false),
        ),
        Case::new(
            r#"quantity("50k").isLessThan(quantity("100k"))"#,
            Match(true),
        ),
        Case::new(
            r#"quantity("100k").compareTo(quantity("50k")) == 1"#,
            Match(true),
        ),
        Case::new(
            r#"quantity("50k").add(quantity("20k")) == quantity("70k")"#,
            Match(true),
        ),
        Case::new(
            r#"quantity("50k").add(20) == quantity("50020")"#,
            Match(true),
        ),
        Case::new(
            r#"quantity("50k").sub(20000) == quantity("30k")"#,
            Match(true),
        ),
        Case::new(
            r#"quantity("50k").add(quantity("20k")).sub(quantity("70k")) == quantity("0")"#,
            Match(true),
        ),
        Case::new(r#"quantity("1Gi") == quantity("1024Mi")"#, Match(true)),
        // Upstream's decimal quantities are unbounded; this one is beyond Tessera's ±1.7e29.
        Case::new(
            r#"quantity("9999999999999999999999999999999999999G").isInteger()"#,
            EvalError("out of the supported range"),
        ),
        // Quantities are not ordered by `<`: upstream refuses this at compile time.
        Case::new(
            on(r#"$C.memory > quantity("1Gi")"#),
            CompileError(
                "found no matching overload for '_>_' applied to '(kubernetes.Quantity, kubernetes.Quantity)'",
            ),
        ),
    ]);
}

#[test]
fn from_the_semver_library_docs() {
    run(&[
        Case::new(
            r#"isSemver("1.0.0") && isSemver("0.1.0-alpha.1")"#,
            Match(true),
        ),
        Case::new(
            r#"isSemver("hello") || isSemver("v1.0") || isSemver("200K")"#,
            Match(false),
        ),
        Case::new(
            r#"isSemver("v1.0", true) && isSemver("01.01.01", true)"#,
            Match(true),
        ),
        Case::new(r#"semver("v1.0.0", true) == semver("1.0.0")"#, Match(true)),
        Case::new(r#"semver("1.0", true) == semver("1.0.0")"#, Match(true)),
        Case::new(
            r#"semver("01.01.01", true) == semver("1.1.1")"#,
            Match(true),
        ),
        Case::new(
            r#"semver("Three").major() == 3"#,
            EvalError("invalid semantic version"),
        ),
        Case::new(
            r#"semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3"#,
            Match(true),
        ),
        Case::new(
            r#"semver("1.2.3").compareTo(semver("1.2.3")) == 0"#,
            Match(true),
        ),
        Case::new(
            r#"semver("1.2.3").compareTo(semver("2.0.0")) == -1"#,
            Match(true),
        ),
        Case::new(
            r#"semver("1.2.3").compareTo(semver("0.1.2")) == 1"#,
            Match(true),
        ),
        Case::new(
            r#"semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))"#,
            Match(true),
        ),
        Case::new(
            r#"semver("1.0.0+build.1") == semver("1.0.0+build.2")"#,
            Match(true),
        ),
        Case::new(
            on(r#"$D.driverVersion.isGreaterThan(semver("535.0.0"))"#),
            Match(true),
        )
        .version_attr("driverVersion", "550.54.15"),
    ]);
}

#[test]
fn strings_regex_lists_and_sets() {
    run(&[
        Case::new(
            r#""hello".charAt(1) == "e" && "hello".charAt(5) == """#,
            Match(true),
        ),
        Case::new(
            r#""hello".charAt(6) == """#,
            EvalError("index out of range: 6"),
        ),
        Case::new(
            r#""hello mellow".indexOf("ello") == 1 && "hello mellow".indexOf("ello", 2) == 7"#,
            Match(true),
        ),
        Case::new(
            r#""hello mellow".lastIndexOf("ello") == 7 && "héllo".indexOf("l") == 2"#,
            Match(true),
        ),
        Case::new(
            r#""TacoCat".lowerAscii() == "tacocat" && "TacoCat".upperAscii() == "TACOCAT""#,
            Match(true),
        ),
        Case::new(
            r#""a-b-c".replace("-", "+") == "a+b+c" && "a-b-c".replace("-", "+", 1) == "a+b-c""#,
            Match(true),
        ),
        Case::new(
            r#""a,b,c".split(",") == ["a", "b", "c"] && "a,b,c".split(",", 2) == ["a", "b,c"]"#,
            Match(true),
        ),
        Case::new(
            r#""tacocat".substring(4) == "cat" && "tacocat".substring(0, 4) == "taco""#,
            Match(true),
        ),
        Case::new(
            r#""tacocat".substring(5, 2) == """#,
            EvalError("invalid substring range"),
        ),
        Case::new(
            r#""  x ".trim() == "x" && ["a", "b"].join("-") == "a-b" && ["a", "b"].join() == "ab""#,
            Match(true),
        ),
        Case::new(r#"strings.quote("a\"b") == "\"a\\\"b\"""#, Match(true)),
        Case::new(
            r#""%s has %d GPUs, %.1f%%".format([dyn("node"), dyn(8), dyn(12.34)]) == "node has 8 GPUs, 12.3%""#,
            Match(true),
        ),
        Case::new(
            r#""reverse".reverse() == "esrever""#,
            CompileError("undeclared reference to 'reverse'"),
        ),
        Case::new(
            r#""NVIDIA H100 80GB HBM3".find("[0-9]+GB") == "80GB""#,
            Match(true),
        ),
        Case::new(
            r#""a1b22c333".findAll("[0-9]+") == ["1", "22", "333"] && "a1b22c333".findAll("[0-9]+", 2) == ["1", "22"]"#,
            Match(true),
        ),
        Case::new(
            r#""abc".matches("(")"#,
            CompileError("invalid regular expression"),
        ),
        Case::new(
            r#"[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && [3, 1, 2].min() == 1 && [3, 1, 2].max() == 3"#,
            Match(true),
        ),
        Case::new(
            r#"[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1"#,
            Match(true),
        ),
        Case::new(r#"[0][1:] == []"#, CompileError("Syntax error")),
        Case::new(
            r#"sets.contains([1, 2, 3], [2, 3]) && sets.equivalent([1, 2], [2, 1, 1]) && sets.intersects([1], [3, 1])"#,
            Match(true),
        ),
        Case::new(r#"sets.contains([1], [2])"#, Match(false)),
        Case::new("[].min() == 0", EvalError("min called on empty list")),
    ]);
}

#[test]
fn optionals_bindings_and_comprehensions() {
    run(&[
        Case::new(on("$D.?missing.orValue(7) == 7"), Match(true)),
        Case::new(on(r#"$D[?"present"].orValue(0) == 3"#), Match(true)).int_attr("present", 3),
        Case::new(
            on("$D.?present.hasValue() && !$D.?missing.hasValue()"),
            Match(true),
        )
        .int_attr("present", 3),
        Case::new(
            "optional.of(1).value() == 1 && !optional.none().hasValue()",
            Match(true),
        ),
        Case::new(on("has($D.present) && !has($D.missing)"), Match(true)).int_attr("present", 3),
        Case::new(
            r#"cel.bind(x, [1, 2], cel.bind(y, x + [3], y.size() == 3))"#,
            Match(true),
        ),
        Case::new(
            "cel.bind(x.y, 1, true)",
            CompileError("variable name must be a simple identifier"),
        ),
        Case::new("[10, 20].all(i, v, v == (i + 1) * 10)", Match(true)),
        Case::new(
            r#"{"a": 1, "b": 2}.exists(k, v, k == "b" && v == 2)"#,
            Match(true),
        ),
        Case::new(r#"{"a": 1, "b": 2}.existsOne(k, v, v > 1)"#, Match(true)),
        Case::new(
            "[1, 2, 3].transformList(i, v, v > 1, v * 10) == [20, 30]",
            Match(true),
        ),
        Case::new(
            r#"{"a": 1}.transformMap(k, v, v + 1) == {"a": 2}"#,
            Match(true),
        ),
        Case::new(
            r#"["a", "b"].transformMapEntry(i, v, {v: i}) == {"a": 0, "b": 1}"#,
            Match(true),
        ),
        Case::new(
            "[1].all(x, x, x > 0)",
            CompileError("duplicate variable name: x"),
        ),
        Case::new(
            "[1, 2].map(x, x * 2) == [2, 4] && [1, 2].filter(x, x > 1) == [2]",
            Match(true),
        ),
    ]);
}

#[test]
fn compile_and_runtime_errors() {
    run(&[
        Case::new("nope == 1", CompileError("undeclared reference to 'nope'")),
        Case::new("device.nope == 1", CompileError("undefined field 'nope'")),
        Case::new(
            "size(1) == 1",
            CompileError("found no matching overload for 'size' applied to '(int)'"),
        ),
        Case::new(
            r#""a".startsWith(1)"#,
            CompileError("found no matching overload for 'startsWith' applied to 'string.(int)'"),
        ),
        Case::new(
            r#"[1, "a"].size() == 2"#,
            CompileError("expected type 'int' but found 'string'"),
        ),
        Case::new(
            r#"device.driver"#,
            CompileError("must evaluate to bool or the unknown type, not string"),
        ),
        Case::new(on(r#"$C.memory"#), CompileError("not kubernetes.Quantity")),
        Case::new(
            "[1, 2].map(x, x)",
            CompileError("must evaluate to bool or the unknown type, not list"),
        ),
        Case::new(
            r#""%d".format([1, "a"]) == """#,
            CompileError("expected type 'int' but found 'string'"),
        ),
        Case::new("1 / 0 == 1", EvalError("division by zero")),
        Case::new(on("$D.n / 0 == 1"), EvalError("division by zero")).int_attr("n", 1),
        Case::new(on(r#"$D.n + "a" == 1"#), EvalError("no matching overload")).int_attr("n", 1),
        Case::new(on("$D.s.size() > 1 || true"), Match(true)).string_attr("s", "xy"),
        Case::new(on("$D.missing == 1 || true"), Match(true)),
        Case::new(
            "true && ".repeat(1300),
            CompileError("more than the 10240 bytes"),
        ),
    ]);
}

/// Equality and membership as cel-go evaluates them (checked against upstream by
/// `tessera-parity cel`): the left operand's type decides, and `in` a list of literals looks the
/// value up in a hash set.
#[test]
fn equality_and_membership_like_cel_go() {
    run(&[
        Case::new(on("$D.v == 1"), EvalError("no such overload")).version_attr("v", "1.0.0"),
        Case::new(on(r#"$D.v == "1.0.0""#), EvalError("no such overload"))
            .version_attr("v", "1.0.0"),
        Case::new(on("1 == $D.v"), Match(false)).version_attr("v", "1.0.0"),
        Case::new(on(r#"$D.v != "x""#), Match(true)).version_attr("v", "1.0.0"),
        Case::new(on("$D.v == null"), Match(false)).version_attr("v", "1.0.0"),
        Case::new(on(r#"$D.v == semver("1.0.0")"#), Match(true)).version_attr("v", "1.0.0"),
        Case::new(on("$D.v in [1, 2]"), EvalError("unhashable")).version_attr("v", "1.0.0"),
        Case::new(on(r#"$D.v in [semver("1.0.0")]"#), Match(true)).version_attr("v", "1.0.0"),
        Case::new(on("$D.v in [1, 2].map(x, x)"), Match(false)).version_attr("v", "1.0.0"),
        Case::new(on("$D.n in [0, 1]"), Match(true)).int_attr("n", 1),
        Case::new(on("$D.missing in []"), Match(false)),
        Case::new(on("[$D.v] == [1]"), Match(true)).version_attr("v", "1.0.0"),
    ]);
}
