//! No function is longer than [`MAX_LINES`] lines in any crate of the workspace, tests and
//! benchmarks included: a longer one is split into parts whose names say what each does. A test
//! is read by whoever debugs its failure, so it is held to the same limit as the code it tests.
//!
//! A line scanner, not a parser: it relies on rustfmt's layout (`cargo fmt --check` runs in CI),
//! where a function's body closes with a `}` at the indentation its `fn` line starts at. Every
//! `.rs` file under a crate's directory is read: `src/` with its unit tests (`tests.rs` files and
//! `#[cfg(test)]` modules), `tests/`, `benches/`, `build.rs`, fixtures and fuzz targets. The
//! end-to-end suite (`tests/e2e`) is checked like any crate: its scenarios are read as steps by
//! whoever debugs a failed run.

use std::path::{Path, PathBuf};

/// The longest a function may be, its signature and closing brace included.
const MAX_LINES: usize = 80;

/// Functions over the limit that are being split, as (file, function): each stays listed only
/// while it is over the limit (the test fails once it is not, so the list only shrinks).
const BEING_SPLIT: &[(&str, &str)] = &[];

/// What is checked (paths from the workspace root): the directory of every crate of the
/// workspace (under `crates/` and `testing/`, and `tests/e2e`), found by listing them, so a new
/// crate is checked without being named here.
fn checked(root: &Path) -> Vec<PathBuf> {
    let mut checked = Vec::new();
    for krate in tessera_checks::crate_dirs(root) {
        assert!(
            krate.join("src").is_dir(),
            "{} has no src/",
            krate.display()
        );
        checked.push(krate);
    }
    checked
}

/// A function found in a source file.
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    /// 1-based line of its `fn`.
    line: usize,
    lines: usize,
}

/// The word after `fn` when `line` starts a function item (any visibility and qualifiers).
fn function_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace().peekable();
    while let Some(word) = words.next() {
        match word {
            "fn" => {
                let name = words.next()?;
                let end = name
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(name.len());
                return (end > 0).then(|| &name[..end]);
            }
            "pub" | "async" | "const" | "unsafe" | "default" | "extern" | "\"C\"" => {}
            w if w.starts_with("pub(") => {}
            _ => return None,
        }
    }
    None
}

fn indentation(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// The end (exclusive) of the item starting at `start`: the line after its closing brace at its
/// own indentation, or after its `;` for an item without a body.
fn item_end(lines: &[&str], start: usize) -> usize {
    let indent = indentation(lines[start]);
    let close = format!("{indent}}}");
    for (offset, line) in lines[start..].iter().enumerate() {
        let trimmed = line.trim_end();
        if offset == 0 && trimmed.ends_with('}') && trimmed.contains('{') {
            return start + 1;
        }
        if trimmed.ends_with(';')
            && !lines[start..start + offset]
                .iter()
                .any(|l| l.trim_end().ends_with('{'))
        {
            return start + offset + 1;
        }
        if offset > 0 && line.trim_end() == close {
            return start + offset + 1;
        }
    }
    lines.len()
}

/// The functions of one file's source, test code included; a function nested in another is
/// measured on its own as well as within the one around it.
fn functions(source: &str) -> Vec<Function> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = function_name(line) {
            let end = item_end(&lines, i);
            found.push(Function {
                name: name.to_owned(),
                line: i + 1,
                lines: end - i,
            });
        }
    }
    found
}

/// The `.rs` files under `dir`, leaving out build outputs (`target/`) a fuzz crate may hold.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("crate directories are readable") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_none_or(|n| n != "target") {
                rust_files(&path, files);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let root = tessera_checks::workspace_root();
    let checked = checked(&root);
    for krate in [
        "crates/api",
        "crates/node",
        "crates/controller",
        "crates/placement",
        "crates/cli",
        "testing/parity",
        "testing/fake-driver",
        "tests/e2e",
    ] {
        assert!(
            checked.contains(&root.join(krate)),
            "{krate} is not among the checked directories"
        );
    }
    let mut long = Vec::new();
    let mut still_long = Vec::new();
    for path in checked {
        let mut files = Vec::new();
        rust_files(&path, &mut files);
        assert!(!files.is_empty(), "{} holds no Rust file", path.display());
        files.sort();
        for file in files {
            let shown = file
                .strip_prefix(&root)
                .unwrap_or(&file)
                .display()
                .to_string();
            let source = std::fs::read_to_string(&file).unwrap();
            for function in functions(&source) {
                if function.lines <= MAX_LINES {
                    continue;
                }
                if BEING_SPLIT.contains(&(shown.as_str(), function.name.as_str())) {
                    still_long.push((shown.clone(), function.name.clone()));
                    continue;
                }
                long.push(format!(
                    "{shown}:{} fn {} ({} lines)",
                    function.line, function.name, function.lines
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_LINES} lines; split them into parts named for what each does:\n{}",
        long.join("\n")
    );
    for (file, name) in BEING_SPLIT {
        assert!(
            still_long.iter().any(|(f, n)| f == file && n == name),
            "{file}: fn {name} is no longer over {MAX_LINES} lines (or gone): remove it from \
             BEING_SPLIT"
        );
    }
}

/// The scanner itself: function lengths, bodiless items, and test code measured like the rest.
#[test]
fn the_scanner_measures_functions_test_code_included() {
    let source = "\
pub(crate) async fn first(
    a: u32,
) -> u32 {
    a
}

impl X {
    fn short(&self) -> u32 { 1 }

    pub fn method(&self) {
        if true {
        }
    }
}

trait T {
    fn declared(
        &self,
    ) -> u32;
}

#[cfg(test)]
#[allow(unused)]
mod tests {
    fn in_a_test_module() {
    }
}

#[cfg(test)]
fn under_cfg_test() {
    let x = 1;
}
";
    let found = functions(source);
    let summary: Vec<(&str, usize, usize)> = found
        .iter()
        .map(|f| (f.name.as_str(), f.line, f.lines))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("first", 1, 5),
            ("short", 8, 1),
            ("method", 10, 4),
            ("declared", 17, 3),
            ("in_a_test_module", 25, 2),
            ("under_cfg_test", 30, 3),
        ]
    );
}
