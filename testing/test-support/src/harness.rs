//! The runner of test executables with their own `main` (`harness = false`): those that also
//! play a fake driver's binaries under their names, so they cannot use libtest's `main`.
//!
//! It keeps what `cargo test` relies on: a name filter (the first argument that is not a flag),
//! `--list`, `test NAME ... ok|FAILED` lines, and a failing exit status when any test failed.
//! Each test runs in turn; a panic fails that test only.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

/// One test: its name and its body.
pub type Test<'a> = (&'a str, &'a dyn Fn());

/// Runs the tests `argv` (this process's arguments) selects; the exit status says whether all
/// passed.
pub fn run(argv: &[String], tests: &[Test<'_>]) -> ExitCode {
    if argv.iter().any(|a| a == "--list") {
        for (name, _) in tests {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filter = argv.iter().skip(1).find(|a| !a.starts_with('-'));
    let mut failed = 0;
    for (name, test) in tests {
        if filter.is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        match catch_unwind(AssertUnwindSafe(test)) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_filter_selects_and_a_panic_fails_only_its_test() {
        let ran = Cell::new(Vec::new());
        let record = |name: &'static str| {
            let mut names = ran.take();
            names.push(name);
            ran.set(names);
        };
        let passes = || record("passes");
        let panics = || {
            record("panics");
            panic!("expected");
        };
        let tests: [Test<'_>; 2] = [("a_passing_test", &passes), ("a_panicking_test", &panics)];
        assert_eq!(
            run(&args(&["exe", "--nocapture", "passing"]), &tests),
            ExitCode::SUCCESS
        );
        assert_eq!(run(&args(&["exe"]), &tests), ExitCode::FAILURE);
        assert_eq!(ran.take(), vec!["passes", "passes", "panics"]);
        assert_eq!(run(&args(&["exe", "--list"]), &tests), ExitCode::SUCCESS);
    }
}
