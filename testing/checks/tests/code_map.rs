//! docs/ARCHITECTURE.md's code map is true to the workspace: it has one section per crate (a
//! `#### \`path\`` heading for every workspace member, and none for anything else), each
//! section's "Depends on" line names exactly the crate's normal dependencies among our crates
//! (its `Cargo.toml`), and every type or function its "Main types" line names is defined `pub`
//! in the crate's sources.

use std::collections::BTreeSet;
use std::path::Path;

use regex::Regex;
use tessera_checks::{crate_dirs, workspace_root};

/// One crate's section of the code map.
#[derive(Debug)]
struct Section {
    /// The crate's directory from the workspace root (`crates/api`).
    path: String,
    /// Our crates it says it depends on, without the `tessera-` prefix.
    depends_on: BTreeSet<String>,
    main_types: Vec<String>,
}

fn backticked(text: &str) -> Vec<String> {
    Regex::new(r"`([^`]+)`")
        .unwrap()
        .captures_iter(text)
        .map(|c| c[1].to_owned())
        .collect()
}

/// The code map's sections: the text between `## Code map` and the next `## ` heading.
fn sections(architecture: &str) -> Vec<Section> {
    let start = architecture
        .find("\n## Code map\n")
        .expect("docs/ARCHITECTURE.md has a `## Code map` section");
    let rest = &architecture[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    let heading = Regex::new(r"(?m)^#### `([^`]+)`$").unwrap();
    let starts: Vec<(usize, String)> = heading
        .captures_iter(&rest[..end])
        .map(|c| (c.get(0).unwrap().start(), c[1].to_owned()))
        .collect();
    let mut found = Vec::new();
    for (i, (at, path)) in starts.iter().enumerate() {
        let until = starts.get(i + 1).map_or(end, |(next, _)| *next);
        let body = &rest[*at..until];
        let line = |label: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(label))
                .unwrap_or_else(|| panic!("the code map's section {path} has no `{label}` line"))
                .to_owned()
        };
        let depends = line("- Depends on: ");
        let depends_on: BTreeSet<String> = if depends.trim() == "nothing of ours." {
            BTreeSet::new()
        } else {
            backticked(&depends).into_iter().collect()
        };
        found.push(Section {
            path: path.clone(),
            depends_on,
            main_types: backticked(&line("- Main types: ")),
        });
    }
    found
}

/// Our crates `krate` depends on (normal dependencies, `tessera-` prefix dropped), from its
/// `Cargo.toml`'s `[dependencies]` table.
fn our_dependencies(krate: &Path) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    let Some(table) = manifest.split("\n[dependencies]\n").nth(1) else {
        return BTreeSet::new();
    };
    let table = table.split("\n[").next().unwrap_or_default();
    table
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tessera-"))
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .map(str::to_owned)
        .collect()
}

/// Whether `name` is defined `pub` somewhere under `src` (a type, trait, function or constant).
fn defines_pub(src: &Path, name: &str) -> bool {
    let item = Regex::new(&format!(
        r"(?m)^\s*pub (?:async )?(?:struct|enum|union|trait|type|fn|const|static|mod) {}\b",
        regex::escape(name)
    ))
    .unwrap();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && item.is_match(&std::fs::read_to_string(&path).unwrap())
            {
                return true;
            }
        }
    }
    false
}

#[test]
fn the_code_map_has_a_true_section_for_every_crate() {
    let root = workspace_root();
    let architecture = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let sections = sections(&architecture);
    let members: BTreeSet<String> = crate_dirs(&root)
        .iter()
        .map(|d| {
            let d = std::fs::canonicalize(d).unwrap();
            let r = std::fs::canonicalize(&root).unwrap();
            d.strip_prefix(r).unwrap().display().to_string()
        })
        .collect();
    let mapped: BTreeSet<String> = sections.iter().map(|s| s.path.clone()).collect();
    let mut problems = Vec::new();
    for missing in members.difference(&mapped) {
        problems.push(format!("{missing} is a workspace member without a section"));
    }
    for extra in mapped.difference(&members) {
        problems.push(format!("{extra} has a section but is no workspace member"));
    }
    for section in sections.iter().filter(|s| members.contains(&s.path)) {
        let krate = root.join(&section.path);
        let actual = our_dependencies(&krate);
        if actual != section.depends_on {
            problems.push(format!(
                "{}: the map says it depends on {:?}; its Cargo.toml on {:?}",
                section.path, section.depends_on, actual
            ));
        }
        for name in &section.main_types {
            if !defines_pub(&krate.join("src"), name) {
                problems.push(format!(
                    "{}: `{name}` is named as a main type but defined `pub` nowhere in its src/",
                    section.path
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/ARCHITECTURE.md's code map is not true to the workspace:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_reader_finds_sections_dependencies_and_types() {
    let text = "# A\n\n## Code map\n\nIntro.\n\n### Floor\n\n#### `crates/a`\nWhat.\n\
                - Depends on: nothing of ours.\n- Main types: `A`, `make_a`.\n\n\
                #### `crates/b`\n- Depends on: `a`, `c`.\n- Main types: `B`.\n\n## Invariants\n\n\
                #### `crates/z`\n- Depends on: `q`.\n- Main types: `Z`.\n";
    let found = sections(text);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].path, "crates/a");
    assert!(found[0].depends_on.is_empty());
    assert_eq!(found[0].main_types, ["A", "make_a"]);
    assert_eq!(
        found[1].depends_on,
        BTreeSet::from(["a".into(), "c".into()])
    );
}

/// The modules declared at the top of a crate root (`mod x;` / `pub mod x;` lines), each with
/// whether the root's `//!` docs name it.
fn root_modules(root_file: &str) -> Vec<(String, bool)> {
    let declared = Regex::new(r"(?m)^(?:pub(?:\([a-z]+\))? )?mod ([a-z_0-9]+);").unwrap();
    let docs: String = root_file
        .lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    declared
        .captures_iter(root_file)
        .map(|c| {
            let name = c[1].to_owned();
            let named = Regex::new(&format!(r"\b{}\b", regex::escape(&name)))
                .unwrap()
                .is_match(&docs);
            (name, named)
        })
        .collect()
}

/// Each crate's `lib.rs` and `main.rs` list its modules: a newcomer reads the crate's map there.
#[test]
fn every_crate_root_names_its_modules() {
    let root = workspace_root();
    let mut unnamed = Vec::new();
    for krate in crate_dirs(&root) {
        for file in ["src/lib.rs", "src/main.rs"] {
            let Ok(text) = std::fs::read_to_string(krate.join(file)) else {
                continue;
            };
            for (module, named) in root_modules(&text) {
                if !named {
                    unnamed.push(format!("{}/{file}: `{module}`", krate.display()));
                }
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "crate roots whose docs (`//!`) do not name these modules; say in a line what each is:\n{}",
        unnamed.join("\n")
    );
}

#[test]
fn root_modules_are_read_with_whether_the_docs_name_them() {
    let text =
        "//! Modules: `alpha` (the first).\n\nmod alpha;\npub mod beta;\npub(crate) mod gamma;\n";
    assert_eq!(
        root_modules(text),
        [
            ("alpha".to_owned(), true),
            ("beta".to_owned(), false),
            ("gamma".to_owned(), false)
        ]
    );
}
