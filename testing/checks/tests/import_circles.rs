//! No import circle between the files of one crate: a crate's files stand bottom-up, each using
//! only files below it, so a reader can learn the crate from its ground floor up.
//!
//! A file uses another when a path in it names an item of the other: a `use crate::…`,
//! `use super::…` or `use self::…` import (or one through a module declared in the file), or such
//! a path written in the code (`crate::x::f()`, `super::Y`, in macros too). A path is followed
//! to the file that defines the item it names, through the re-exports on its way (a `pub use` in
//! a `mod.rs` ties its user to the file that defines the item, not to the `mod.rs`). A module
//! counts as its file (`mod.rs` or `x.rs` for a directory module; an inline module as the file
//! around it). Test code is not read (`#[cfg(test)]` items and modules; `tests/`, `benches/`).
//! Every crate root of every workspace member is read: libraries, `main.rs` and `src/bin/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;
use syn::{Item, UseTree};
use tessera_checks::module_tree::{ModuleTree, crate_roots, is_test_only};

/// Circles being untied, each as the files it joins (from the workspace root, sorted). A circle
/// found must lie within the files of an entry (it may shrink or split while it is untied, never
/// grow), and an entry stays only while a circle lies within it: the test fails once none does,
/// so the list only shrinks.
const BEING_UNTIED: &[&[&str]] = &[];

/// A path from the crate root: module names, then possibly an item's name and more.
type CratePath = Vec<String>;

/// What a module's items say about names: what it defines, what its `use`s bring in.
#[derive(Debug, Default)]
struct Names {
    /// Items it defines (types, functions, constants, statics, macros).
    defines: BTreeSet<String>,
    /// Names its `use`s bring in from this crate, with their paths from the crate root.
    imports: BTreeMap<String, CratePath>,
    /// Paths of this crate its `use …::*` imports everything from.
    globs: Vec<CratePath>,
    /// The `use`s of this crate's items that tie the file to another, as (path from the crate
    /// root, glob?): every `use` but a re-export the file does not use itself.
    uses: Vec<(CratePath, bool)>,
}

/// One `use` leaf: its path as written, the name it binds (`None` for a glob), whether it is
/// visible outside its module (a re-export).
struct UseLeaf {
    path: Vec<String>,
    name: Option<String>,
    re_export: bool,
}

fn use_leaves(
    tree: &UseTree,
    re_export: bool,
    prefix: &mut Vec<String>,
    leaves: &mut Vec<UseLeaf>,
) {
    let mut leaf = |path: Vec<String>, name: Option<String>| {
        leaves.push(UseLeaf {
            path,
            name,
            re_export,
        })
    };
    match tree {
        UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            use_leaves(&path.tree, re_export, prefix, leaves);
            prefix.pop();
        }
        UseTree::Name(name) if name.ident == "self" => leaf(prefix.clone(), prefix.last().cloned()),
        UseTree::Name(name) => {
            let mut path = prefix.clone();
            path.push(name.ident.to_string());
            leaf(path, Some(name.ident.to_string()));
        }
        UseTree::Rename(rename) => {
            let mut path = prefix.clone();
            path.push(rename.ident.to_string());
            leaf(path, Some(rename.rename.to_string()));
        }
        UseTree::Glob(_) => leaf(prefix.clone(), None),
        UseTree::Group(group) => {
            for tree in &group.items {
                use_leaves(tree, re_export, prefix, leaves);
            }
        }
    }
}

/// The path from the crate root of `path` written in module `at`, when it names something of
/// this crate: through `crate`, `super`, `self`, a module declared in `at`, an item `at` defines
/// or (when `imports` are given) a name `at`'s `use`s bring in.
fn from_crate_root(
    tree: &ModuleTree,
    names: Option<&[Names]>,
    at: usize,
    path: &[String],
) -> Option<CratePath> {
    let first = path.first()?;
    let mut module = at;
    let mut rest = path;
    match first.as_str() {
        "crate" => {
            module = 0;
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                module = tree.modules[module].parent?;
                rest = &rest[1..];
            }
        }
        _ => {
            let module_names = names.map(|names| &names[at]);
            let declared = tree.modules[at].children.contains_key(first)
                || module_names.is_some_and(|n| n.defines.contains(first));
            if !declared {
                let imported = module_names?.imports.get(first)?;
                return Some(imported.iter().chain(&path[1..]).cloned().collect());
            }
        }
    }
    Some(
        tree.modules[module]
            .path
            .iter()
            .chain(rest)
            .cloned()
            .collect(),
    )
}

/// What a crate path leads to: the module holding the item it names, and the item's name (none
/// when the path names a module).
#[derive(Debug, PartialEq)]
struct Target {
    module: usize,
    item: Option<String>,
}

/// Follows `path` from the crate root through modules and re-exports to the module that defines
/// the item it names. When `strict`, a name no module is seen to define leads nowhere (`None`);
/// otherwise to the module it was looked for in.
fn resolve(
    tree: &ModuleTree,
    names: &[Names],
    path: &[String],
    depth: usize,
    strict: bool,
) -> Option<Target> {
    let mut module = 0;
    for (i, segment) in path.iter().enumerate() {
        if let Some(&child) = tree.modules[module].children.get(segment) {
            module = child;
            continue;
        }
        let here = Target {
            module,
            item: Some(segment.clone()),
        };
        if names[module].defines.contains(segment) {
            return Some(here);
        }
        if depth < 8 {
            if let Some(imported) = names[module].imports.get(segment) {
                let through: CratePath = imported.iter().chain(&path[i + 1..]).cloned().collect();
                return resolve(tree, names, &through, depth + 1, strict)
                    .or((!strict).then_some(here));
            }
            for glob in &names[module].globs {
                let through: CratePath = glob.iter().chain(&path[i..]).cloned().collect();
                if let Some(found) = resolve(tree, names, &through, depth + 1, true) {
                    return Some(found);
                }
            }
        }
        return (!strict).then_some(here);
    }
    Some(Target { module, item: None })
}

/// The items a module's items define (at its own level).
fn defined_names(items: &[Item]) -> BTreeSet<String> {
    items
        .iter()
        .filter_map(|item| match item {
            Item::Const(i) => Some(i.ident.to_string()),
            Item::Enum(i) => Some(i.ident.to_string()),
            Item::Fn(i) => Some(i.sig.ident.to_string()),
            Item::Macro(i) => i.ident.as_ref().map(ToString::to_string),
            Item::Static(i) => Some(i.ident.to_string()),
            Item::Struct(i) => Some(i.ident.to_string()),
            Item::Trait(i) => Some(i.ident.to_string()),
            Item::TraitAlias(i) => Some(i.ident.to_string()),
            Item::Type(i) => Some(i.ident.to_string()),
            Item::Union(i) => Some(i.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// Everything written in a module's items that the check reads: its `use` trees (at any depth:
/// inside functions too) and its paths of two segments or more (in macros too), test code left
/// out.
#[derive(Default)]
struct Written {
    uses: Vec<UseLeaf>,
    paths: Vec<Vec<String>>,
    /// The first segment of every path in the code (one segment too) and every identifier in
    /// its macros: what tells a re-export the file uses itself from one it only hands on.
    words: BTreeSet<String>,
}

impl<'ast> Visit<'ast> for Written {
    fn visit_item(&mut self, item: &'ast Item) {
        if !is_test_only(tessera_checks::module_tree::item_attributes(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, function: &'ast syn::ImplItemFn) {
        if !is_test_only(&function.attrs) {
            syn::visit::visit_impl_item_fn(self, function);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_none() && !is_test_only(&item.attrs) {
            let re_export = !matches!(item.vis, syn::Visibility::Inherited);
            use_leaves(&item.tree, re_export, &mut Vec::new(), &mut self.uses);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if let Some(first) = path.segments.first() {
            self.words.insert(first.ident.to_string());
        }
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            self.paths
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        token_paths(mac.tokens.clone(), &mut self.paths, &mut self.words);
        syn::visit::visit_macro(self, mac);
    }
}

/// The paths (`a::b`, two segments or more) in a macro's tokens.
fn token_paths(tokens: TokenStream, paths: &mut Vec<Vec<String>>, words: &mut BTreeSet<String>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(group) => token_paths(group.stream(), paths, words),
            TokenTree::Ident(first) => {
                words.insert(first.to_string());
                let mut path = vec![first.to_string()];
                while let [
                    TokenTree::Punct(a),
                    TokenTree::Punct(b),
                    TokenTree::Ident(next),
                    ..,
                ] = &tokens[i + 1..]
                {
                    if a.as_char() != ':' || b.as_char() != ':' {
                        break;
                    }
                    path.push(next.to_string());
                    words.insert(next.to_string());
                    i += 3;
                }
                if path.len() > 1 {
                    paths.push(path);
                }
            }
            TokenTree::Punct(_) | TokenTree::Literal(_) => {}
        }
        i += 1;
    }
}

/// Each module's [`Names`] and what its items write.
fn read_names(tree: &ModuleTree) -> (Vec<Names>, Vec<Written>) {
    let mut names: Vec<Names> = Vec::new();
    let mut written = Vec::new();
    for module in &tree.modules {
        let mut seen = Written::default();
        for item in &module.items {
            seen.visit_item(item);
        }
        names.push(Names {
            defines: defined_names(&module.items),
            ..Names::default()
        });
        written.push(seen);
    }
    for (at, seen) in written.iter().enumerate() {
        for leaf in &seen.uses {
            let Some(path) = from_crate_root(tree, Some(&names), at, &leaf.path) else {
                continue;
            };
            // A re-export the file does not use itself only hands the name on: no tie.
            let ties = !leaf.re_export
                || leaf
                    .name
                    .as_ref()
                    .is_some_and(|name| seen.words.contains(name));
            match &leaf.name {
                Some(name) => {
                    names[at].imports.insert(name.clone(), path.clone());
                }
                None => names[at].globs.push(path.clone()),
            }
            if ties {
                names[at].uses.push((path, leaf.name.is_none()));
            }
        }
    }
    (names, written)
}

/// File → file → the names the first takes from the second, over one crate.
type Ties = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The ties between the files of the crate rooted at `root`; paths shown from `workspace`.
fn ties(workspace: &Path, root: &Path) -> Ties {
    let tree = ModuleTree::read(root);
    let (names, written) = read_names(&tree);
    let shown = |module: usize| {
        let file = &tree.modules[module].file;
        file.strip_prefix(workspace)
            .unwrap_or(file)
            .display()
            .to_string()
    };
    let mut ties = Ties::new();
    for (at, seen) in written.iter().enumerate() {
        let mut targets: Vec<(Target, String)> = Vec::new();
        for (path, glob) in &names[at].uses {
            if let Some(target) = resolve(&tree, &names, path, 0, false) {
                let shown_name = path.last().cloned().unwrap_or_else(|| "crate".into());
                if *glob || target.item.is_some() {
                    let name = if *glob {
                        format!("{shown_name}::*")
                    } else {
                        target.item.clone().unwrap()
                    };
                    targets.push((target, name));
                }
            }
        }
        for path in &seen.paths {
            let Some(path) = from_crate_root(&tree, Some(&names), at, path) else {
                continue;
            };
            if let Some(target @ Target { item: Some(_), .. }) =
                resolve(&tree, &names, &path, 0, false)
            {
                let name = target.item.clone().unwrap();
                targets.push((target, name));
            }
        }
        for (target, name) in targets {
            let (from, to) = (shown(at), shown(target.module));
            if from != to {
                ties.entry(from)
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(name);
            }
        }
    }
    ties
}

/// The circles of a crate's ties: its strongly connected sets of two files or more (Tarjan),
/// each sorted.
fn circles(ties: &Ties) -> Vec<Vec<String>> {
    struct Search<'a> {
        ties: &'a Ties,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        circles: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, file: &'a str) {
            let n = self.index.len();
            self.index.insert(file, n);
            self.low.insert(file, n);
            self.stack.push(file);
            self.on_stack.insert(file);
            for next in self.ties.get(file).into_iter().flat_map(|t| t.keys()) {
                if !self.index.contains_key(next.as_str()) {
                    self.visit(next);
                    let low = self.low[file].min(self.low[next.as_str()]);
                    self.low.insert(file, low);
                } else if self.on_stack.contains(next.as_str()) {
                    let low = self.low[file].min(self.index[next.as_str()]);
                    self.low.insert(file, low);
                }
            }
            if self.low[file] == self.index[file] {
                let mut circle = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    circle.push(top.to_owned());
                    if top == file {
                        break;
                    }
                }
                if circle.len() > 1 {
                    circle.sort();
                    self.circles.push(circle);
                }
            }
        }
    }
    let mut search = Search {
        ties,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        circles: Vec::new(),
    };
    for file in ties.keys() {
        if !search.index.contains_key(file.as_str()) {
            search.visit(file);
        }
    }
    search.circles.sort();
    search.circles
}

/// A circle in words: its files, then each tie between them with the names it takes.
fn describe(circle: &[String], ties: &Ties) -> String {
    let mut text = format!("circle of {} files: {}", circle.len(), circle.join(", "));
    for from in circle {
        for (to, names) in ties.get(from).into_iter().flatten() {
            if circle.contains(to) {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                text.push_str(&format!("\n  {from} -> {to}: {}", names.join(", ")));
            }
        }
    }
    text
}

/// Every circle of the workspace, with its description.
fn workspace_circles(workspace: &Path) -> BTreeMap<Vec<String>, String> {
    let mut found = BTreeMap::new();
    for krate in tessera_checks::crate_dirs(workspace) {
        for root in crate_roots(&krate) {
            let ties = ties(workspace, &root);
            for circle in circles(&ties) {
                let text = describe(&circle, &ties);
                found.insert(circle, text);
            }
        }
    }
    found
}

#[test]
fn no_crate_has_an_import_circle_between_its_files() {
    let workspace = tessera_checks::workspace_root();
    let found = workspace_circles(&workspace);
    let within = |circle: &Vec<String>, files: &[&str]| {
        circle.iter().all(|file| files.contains(&file.as_str()))
    };
    let unexpected: Vec<&str> = found
        .iter()
        .filter(|(circle, _)| !BEING_UNTIED.iter().any(|files| within(circle, files)))
        .map(|(_, text)| text.as_str())
        .collect();
    assert!(
        unexpected.is_empty(),
        "import circles between a crate's files; order its modules bottom-up (move what both \
         sides need below them):\n{}",
        unexpected.join("\n")
    );
    for files in BEING_UNTIED {
        assert!(
            found.keys().any(|circle| within(circle, files)),
            "no circle is left among {}: remove it from BEING_UNTIED",
            files.join(", ")
        );
    }
}

/// Writes `files` (path from the crate directory, source) under a fresh directory and returns
/// the ties of the crate rooted at its `src/lib.rs`, paths shown from that directory.
fn ties_of(files: &[(&str, &str)]) -> Ties {
    let dir = tempfile::tempdir().unwrap();
    for (path, source) in files {
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, source).unwrap();
    }
    ties(dir.path(), &dir.path().join("src/lib.rs"))
}

/// The reader itself: `use` and written paths tie files, followed through re-exports; a
/// re-export the file does not use, test code and other crates' paths do not.
#[test]
fn the_reader_ties_files_by_the_items_they_name() {
    let ties = ties_of(&[
        (
            "src/lib.rs",
            "mod low;\nmod high;\npub mod group;\npub use high::Top;\n\
             #[cfg(test)]\nmod tests { use crate::high::Top; }\n",
        ),
        ("src/low.rs", "pub struct Base;\npub fn helper() {}\n"),
        (
            "src/high.rs",
            "use crate::group::Member;\npub struct Top(Member);\n\
             pub fn f() { crate::low::helper(); let _ = format!(\"{:?}\", crate::group::count()); }\n\
             #[cfg(test)]\nfn hidden() { crate::group::hidden(); }\n",
        ),
        (
            "src/group/mod.rs",
            "mod part;\npub use part::Member;\npub use part::Other;\n\
             pub fn count() -> usize { part::size() }\npub fn hidden() {}\n",
        ),
        (
            "src/group/part.rs",
            "use super::super::low::Base;\npub struct Member(Base);\npub struct Other;\n\
             pub fn size() -> usize { std::mem::size_of::<Member>() }\n\
             fn back() { super::count(); }\n",
        ),
    ]);
    let shown: Vec<String> = ties
        .iter()
        .flat_map(|(from, to)| {
            to.iter().map(move |(to, names)| {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                format!("{from} -> {to}: {}", names.join(", "))
            })
        })
        .collect();
    assert_eq!(
        shown,
        [
            "src/group/mod.rs -> src/group/part.rs: size",
            "src/group/part.rs -> src/group/mod.rs: count",
            "src/group/part.rs -> src/low.rs: Base",
            "src/high.rs -> src/group/mod.rs: count",
            "src/high.rs -> src/group/part.rs: Member",
            "src/high.rs -> src/low.rs: helper",
        ]
    );
    assert_eq!(
        circles(&ties),
        [vec![
            "src/group/mod.rs".to_owned(),
            "src/group/part.rs".to_owned()
        ]]
    );
}
