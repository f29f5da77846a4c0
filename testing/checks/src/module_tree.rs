//! A crate's modules as its files declare them: `mod x;` (in `x.rs` or `x/mod.rs` beside the
//! declaring file, or under its directory) and inline `mod x { .. }`, each with the items it holds
//! outside test code. An item whose `#[cfg(..)]` holds only under `test` (`#[cfg(test)]`,
//! `#[cfg(all(test, ..))]`) is test code and left out, with everything in it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use syn::punctuated::Punctuated;
use syn::{Attribute, Item, Meta, Token};

/// The modules of one crate (a library, a binary), the crate root first.
pub struct ModuleTree {
    pub modules: Vec<Module>,
}

/// One module of a [`ModuleTree`].
pub struct Module {
    /// Its path from the crate root (empty for the root).
    pub path: Vec<String>,
    /// The file it is written in: its own, or for an inline module the file around it.
    pub file: PathBuf,
    /// The module it is declared in (`None` for the root).
    pub parent: Option<usize>,
    /// Its modules by name, as indices into [`ModuleTree::modules`].
    pub children: BTreeMap<String, usize>,
    /// Its items outside test code, its modules left out (they are modules of the tree).
    pub items: Vec<Item>,
}

impl ModuleTree {
    /// The modules of the crate whose root file is `root` (a `lib.rs`, `main.rs` or binary).
    pub fn read(root: &Path) -> ModuleTree {
        let mut tree = ModuleTree {
            modules: Vec::new(),
        };
        let dir = root.parent().expect("a crate root is in a directory");
        let items = parse(root);
        tree.add(Vec::new(), root, None, items, dir);
        tree
    }

    /// Adds a module holding `items` and, depth first, the modules it declares; `dir` is where
    /// the files of its `mod x;` declarations are. Returns its index.
    fn add(
        &mut self,
        path: Vec<String>,
        file: &Path,
        parent: Option<usize>,
        items: Vec<Item>,
        dir: &Path,
    ) -> usize {
        let index = self.modules.len();
        self.modules.push(Module {
            path: path.clone(),
            file: file.to_owned(),
            parent,
            children: BTreeMap::new(),
            items: Vec::new(),
        });
        let mut kept = Vec::new();
        for item in items {
            if is_test_only(item_attributes(&item)) {
                continue;
            }
            let Item::Mod(module) = item else {
                kept.push(item);
                continue;
            };
            let name = module.ident.to_string();
            let mut child_path = path.clone();
            child_path.push(name.clone());
            let child = match module.content {
                Some((_, inline)) => {
                    self.add(child_path, file, Some(index), inline, &dir.join(&name))
                }
                None => {
                    let (child_file, child_dir) = module_file(dir, &name, &module.attrs);
                    let inline = parse(&child_file);
                    self.add(child_path, &child_file, Some(index), inline, &child_dir)
                }
            };
            self.modules[index].children.insert(name, child);
        }
        self.modules[index].items = kept;
        index
    }
}

/// The crate roots of the package in `krate`: `src/lib.rs`, `src/main.rs` and each binary under
/// `src/bin/` (`name.rs` or `name/main.rs`), those that exist.
pub fn crate_roots(krate: &Path) -> Vec<PathBuf> {
    let src = krate.join("src");
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|file| src.join(file))
        .filter(|file| file.is_file())
        .collect();
    if let Ok(listing) = std::fs::read_dir(src.join("bin")) {
        let mut binaries: Vec<PathBuf> = listing
            .map(|entry| entry.expect("a directory entry").path())
            .filter_map(|path| {
                if path.extension().is_some_and(|e| e == "rs") {
                    Some(path)
                } else {
                    Some(path.join("main.rs")).filter(|main| main.is_file())
                }
            })
            .collect();
        binaries.sort();
        roots.extend(binaries);
    }
    roots
}

/// The file of module `name` declared in a module whose files are in `dir`, and where its own
/// modules' files are.
fn module_file(dir: &Path, name: &str, attrs: &[Attribute]) -> (PathBuf, PathBuf) {
    assert!(
        !attrs.iter().any(|attr| attr.path().is_ident("path")),
        "mod {name} in {} has a #[path]: not read by the workspace checks",
        dir.display()
    );
    let flat = dir.join(format!("{name}.rs"));
    if flat.is_file() {
        return (flat, dir.join(name));
    }
    let nested = dir.join(name).join("mod.rs");
    assert!(
        nested.is_file(),
        "mod {name}: neither {} nor {} exists",
        flat.display(),
        nested.display()
    );
    (nested, dir.join(name))
}

fn parse(file: &Path) -> Vec<Item> {
    let source = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("{} is not readable: {e}", file.display()));
    syn::parse_file(&source)
        .unwrap_or_else(|e| panic!("{} is not Rust syn reads: {e}", file.display()))
        .items
}

/// The attributes of an item (none for the few kinds that have none).
pub fn item_attributes(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Whether attributes make their item test code: a `#[cfg(..)]` that holds only under `test`.
pub fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<Meta>()
                .is_ok_and(|predicate| needs_test(&predicate))
    })
}

/// Whether a `cfg` predicate can hold only when `test` does.
fn needs_test(predicate: &Meta) -> bool {
    match predicate {
        Meta::Path(path) => path.is_ident("test"),
        Meta::List(list) => {
            let Ok(operands) =
                list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            else {
                return false;
            };
            if list.path.is_ident("all") {
                operands.iter().any(needs_test)
            } else if list.path.is_ident("any") {
                !operands.is_empty() && operands.iter().all(needs_test)
            } else {
                false
            }
        }
        Meta::NameValue(_) => false,
    }
}
