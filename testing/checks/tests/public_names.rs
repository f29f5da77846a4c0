//! One name per concept: no two public types of the workspace share a name. A reader who meets
//! `Outcome` in one crate and `Outcome` in another should not have to find out which one it is;
//! two types for one concept should be one type.
//!
//! Public types are `pub` structs, enums, unions, traits and type aliases (not `pub(crate)` or
//! narrower) outside test code, in every crate root of every workspace member (libraries,
//! `main.rs`, `src/bin/`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use syn::{Item, Visibility};
use tessera_checks::module_tree::{ModuleTree, crate_roots};

/// Names shared by public types that are being renamed, each with the files that define it (from
/// the workspace root, sorted). The files sharing a listed name must be among the entry's (a
/// file may stop sharing it, none may start), and an entry stays only while the name is shared:
/// the test fails once it is not, so the list only shrinks.
const BEING_RENAMED: &[(&str, &[&str])] = &[];

/// The public types one crate root's modules define, as (name, file).
fn public_types(workspace: &Path, root: &Path) -> Vec<(String, String)> {
    let tree = ModuleTree::read(root);
    let mut found = Vec::new();
    for module in &tree.modules {
        let file = module
            .file
            .strip_prefix(workspace)
            .unwrap_or(&module.file)
            .display()
            .to_string();
        for item in &module.items {
            let (vis, ident) = match item {
                Item::Struct(i) => (&i.vis, &i.ident),
                Item::Enum(i) => (&i.vis, &i.ident),
                Item::Union(i) => (&i.vis, &i.ident),
                Item::Trait(i) => (&i.vis, &i.ident),
                Item::Type(i) => (&i.vis, &i.ident),
                _ => continue,
            };
            if matches!(vis, Visibility::Public(_)) {
                found.push((ident.to_string(), file.clone()));
            }
        }
    }
    found
}

/// Every public type name of the workspace with the files defining a type of that name.
fn workspace_public_types(workspace: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for krate in tessera_checks::crate_dirs(workspace) {
        for root in crate_roots(&krate) {
            for (name, file) in public_types(workspace, &root) {
                names.entry(name).or_default().insert(file);
            }
        }
    }
    names
}

#[test]
fn no_two_public_types_share_a_name() {
    let workspace = tessera_checks::workspace_root();
    let names = workspace_public_types(&workspace);
    assert!(
        names.len() > 400,
        "only {} public type names found: the reader misses crates",
        names.len()
    );
    let shared: BTreeMap<&String, &BTreeSet<String>> =
        names.iter().filter(|(_, files)| files.len() > 1).collect();
    let mut unexpected = Vec::new();
    for (name, files) in &shared {
        let listed = BEING_RENAMED.iter().any(|(listed, listed_files)| {
            listed == name
                && files
                    .iter()
                    .all(|file| listed_files.contains(&file.as_str()))
        });
        if !listed {
            let files: Vec<&str> = files.iter().map(String::as_str).collect();
            unexpected.push(format!("{name}: {}", files.join(", ")));
        }
    }
    assert!(
        unexpected.is_empty(),
        "public types sharing a name; name each for what it is (or make one type of one \
         concept):\n{}",
        unexpected.join("\n")
    );
    for (name, _) in BEING_RENAMED {
        assert!(
            shared.contains_key(&(*name).to_owned()),
            "{name} is no longer shared: remove it from BEING_RENAMED"
        );
    }
}

/// The reader itself: `pub` types only (not `pub(crate)`, not functions or impl items), in every
/// module of the tree, test code left out.
#[test]
fn the_reader_finds_public_types_outside_tests() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (
            "src/lib.rs",
            "pub mod a;\nmod b;\npub struct Top;\npub(crate) struct Hidden;\npub fn f() {}\n\
             #[cfg(test)]\nmod tests { pub struct InTests; }\n",
        ),
        (
            "src/a.rs",
            "pub enum Kind { X }\npub trait Named {}\npub type Alias = u32;\n\
             impl Named for Kind {}\n#[cfg(test)]\npub struct TestOnly;\n",
        ),
        (
            "src/b.rs",
            "pub struct Kind;\npub union U { x: u32 }\nmod inner { pub struct Deep; }\n",
        ),
    ];
    for (path, source) in files {
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, source).unwrap();
    }
    let mut found = public_types(dir.path(), &dir.path().join("src/lib.rs"));
    found.sort();
    let found: Vec<(&str, &str)> = found
        .iter()
        .map(|(name, file)| (name.as_str(), file.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("Alias", "src/a.rs"),
            ("Deep", "src/b.rs"),
            ("Kind", "src/a.rs"),
            ("Kind", "src/b.rs"),
            ("Named", "src/a.rs"),
            ("Top", "src/lib.rs"),
            ("U", "src/b.rs"),
        ]
    );
}
