//! Name resolution, as far as the audit needs it: which item a path in the
//! source names, through `use` aliases (renames, groups, globs, block-level
//! imports), re-exports across crates, `crate`/`self`/`super`/`Self` and
//! dependency renames. Paths come out absolute and canonical: the crate
//! name, then the module path of the item's definition, then the item
//! (`seam::resident::resident_weight` for `seam::resident_weight`).
//!
//! It knows no types: a method call `x.f()` cannot be resolved here, and
//! the audit matches those by name.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::workspace::{SourceFile, TargetKind, Workspace};

/// An absolute path: crate, modules, item, and any associated items.
pub type AbsPath = Vec<String>;

/// A path as written in a `use` or an expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawPath {
    /// It starts with `::` (an extern crate follows).
    pub global: bool,
    /// Its segments, without generic arguments.
    pub segs: Vec<String>,
}

impl RawPath {
    /// The segments of a `syn::Path`.
    pub fn of(path: &syn::Path) -> RawPath {
        RawPath {
            global: path.leading_colon.is_some(),
            segs: path.segments.iter().map(|s| s.ident.to_string()).collect(),
        }
    }
}

/// A name brought in by a block (a `use` inside a function body, or an
/// item defined there).
#[derive(Clone, Debug)]
pub enum BlockName {
    /// `use` inside the block.
    Use(RawPath),
    /// An item defined in the block: shadows everything outside it.
    Item,
}

/// Names visible inside nested blocks, innermost last.
pub type BlockScopes = Vec<HashMap<String, BlockName>>;

#[derive(Default, Debug)]
struct Module {
    uses: HashMap<String, RawPath>,
    globs: Vec<RawPath>,
    defs: HashSet<String>,
}

/// A function defined at module level or in an `impl` block.
#[derive(Clone, Debug)]
pub struct FnDef {
    /// The crate.
    pub crate_id: String,
    /// Module path inside the crate.
    pub module: Vec<String>,
    /// The last segment of the `impl`'s self type, for methods.
    pub self_ty: Option<String>,
    /// The function's name.
    pub name: String,
    /// The file (relative to the workspace root) and line.
    pub at: (String, usize),
    /// Index of the package that defines it.
    pub package: usize,
    /// Whether it is test code.
    pub test_code: bool,
}

impl FnDef {
    /// Its absolute path (`seam::borrow::Borrow::new`).
    pub fn abs(&self) -> AbsPath {
        let mut p = vec![self.crate_id.clone()];
        p.extend(self.module.iter().cloned());
        p.extend(self.self_ty.iter().cloned());
        p.push(self.name.clone());
        p
    }
}

/// The module-level names of every crate of the workspace.
#[derive(Debug, Default)]
pub struct Names {
    modules: HashMap<(String, Vec<String>), Module>,
    externs: HashMap<String, BTreeMap<String, String>>,
    /// Every function definition, for finding the seam's and its shadows.
    pub fns: Vec<FnDef>,
}

/// Where a path is resolved.
pub struct Scope<'a> {
    /// The crate.
    pub crate_id: &'a str,
    /// The module inside it.
    pub module: &'a [String],
    /// Block-level names, innermost last.
    pub blocks: &'a [HashMap<String, BlockName>],
    /// The `impl`'s self type, resolved.
    pub self_ty: Option<&'a AbsPath>,
}

const MAX_DEPTH: usize = 24;

/// Flattens a `use` tree into (local name, path) pairs and glob bases.
pub fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    global: bool,
    names: &mut Vec<(String, RawPath)>,
    globs: &mut Vec<RawPath>,
) {
    let path = |prefix: &Vec<String>, last: Option<String>| RawPath {
        global,
        segs: prefix.iter().cloned().chain(last).collect(),
    };
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, global, names, globs);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                if let Some(last) = prefix.last() {
                    names.push((last.clone(), path(prefix, None)));
                }
            } else {
                names.push((name.clone(), path(prefix, Some(name))));
            }
        }
        syn::UseTree::Rename(r) => {
            let local = r.rename.to_string();
            if local != "_" {
                let name = r.ident.to_string();
                let target = if name == "self" {
                    path(prefix, None)
                } else {
                    path(prefix, Some(name))
                };
                names.push((local, target));
            }
        }
        syn::UseTree::Glob(_) => globs.push(path(prefix, None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, global, names, globs);
            }
        }
    }
}

/// The name an item defines in its module's namespace, if any.
pub fn item_name(item: &syn::Item) -> Option<String> {
    Some(
        match item {
            syn::Item::Const(i) => &i.ident,
            syn::Item::Enum(i) => &i.ident,
            syn::Item::Fn(i) => &i.sig.ident,
            syn::Item::Mod(i) => &i.ident,
            syn::Item::Static(i) => &i.ident,
            syn::Item::Struct(i) => &i.ident,
            syn::Item::Trait(i) => &i.ident,
            syn::Item::TraitAlias(i) => &i.ident,
            syn::Item::Type(i) => &i.ident,
            syn::Item::Union(i) => &i.ident,
            syn::Item::Macro(i) => i.ident.as_ref()?,
            _ => return None,
        }
        .to_string(),
    )
}

/// The last segment of a type path (`Borrow` for `crate::borrow::Borrow<T>`).
pub fn type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        syn::Type::Reference(r) => type_name(&r.elem),
        syn::Type::Paren(p) => type_name(&p.elem),
        syn::Type::Group(g) => type_name(&g.elem),
        _ => None,
    }
}

impl Names {
    /// Collects the module-level names of every file.
    pub fn collect(ws: &Workspace, files: &[SourceFile]) -> Names {
        let mut names = Names::default();
        for file in files {
            let package = &ws.packages[file.package];
            let target = &package.targets[file.target];
            // The crates this one may name: its package's dependencies
            // (dev-dependencies included), its own library, std.
            names
                .externs
                .entry(file.crate_id.clone())
                .or_insert_with(|| {
                    let mut e = package.externs.clone();
                    if target.kind != TargetKind::Lib
                        && let Some(lib) = &package.lib_crate
                    {
                        e.insert(lib.clone(), lib.clone());
                    }
                    for std in ["std", "core", "alloc"] {
                        e.insert(std.into(), std.into());
                    }
                    e
                });
            let rel = ws.rel(&file.path);
            names.collect_items(
                &file.ast.items,
                &file.crate_id,
                &file.module,
                &rel,
                file.package,
                file.test_code,
            );
        }
        names
    }

    fn collect_items(
        &mut self,
        items: &[syn::Item],
        crate_id: &str,
        module: &[String],
        file: &str,
        package: usize,
        test_code: bool,
    ) {
        let key = (crate_id.to_owned(), module.to_vec());
        for item in items {
            if let Some(name) = item_name(item) {
                self.modules
                    .entry(key.clone())
                    .or_default()
                    .defs
                    .insert(name);
            }
            let line = |span: proc_macro2::Span| span.start().line;
            match item {
                syn::Item::Use(u) => {
                    let (mut uses, mut globs) = (Vec::new(), Vec::new());
                    flatten_use(
                        &u.tree,
                        &mut Vec::new(),
                        u.leading_colon.is_some(),
                        &mut uses,
                        &mut globs,
                    );
                    let m = self.modules.entry(key.clone()).or_default();
                    m.uses.extend(uses);
                    m.globs.extend(globs);
                }
                syn::Item::ExternCrate(e) => {
                    let local = e.rename.as_ref().map_or(&e.ident, |(_, r)| r).to_string();
                    self.modules.entry(key.clone()).or_default().uses.insert(
                        local,
                        RawPath {
                            global: true,
                            segs: vec![e.ident.to_string()],
                        },
                    );
                }
                syn::Item::Fn(f) => self.fns.push(FnDef {
                    crate_id: crate_id.to_owned(),
                    module: module.to_vec(),
                    self_ty: None,
                    name: f.sig.ident.to_string(),
                    at: (file.to_owned(), line(f.sig.ident.span())),
                    package,
                    test_code: test_code || super::workspace::is_cfg_test(&f.attrs),
                }),
                syn::Item::Impl(i) => {
                    let self_ty = type_name(&i.self_ty);
                    for it in &i.items {
                        if let syn::ImplItem::Fn(f) = it {
                            self.fns.push(FnDef {
                                crate_id: crate_id.to_owned(),
                                module: module.to_vec(),
                                self_ty: self_ty.clone(),
                                name: f.sig.ident.to_string(),
                                at: (file.to_owned(), line(f.sig.ident.span())),
                                package,
                                test_code: test_code || super::workspace::is_cfg_test(&i.attrs),
                            });
                        }
                    }
                }
                syn::Item::Mod(m) => {
                    if let Some((_, inner)) = &m.content {
                        let mut child = module.to_vec();
                        child.push(m.ident.to_string());
                        let test = test_code || super::workspace::is_cfg_test(&m.attrs);
                        self.collect_items(inner, crate_id, &child, file, package, test);
                    }
                }
                _ => {}
            }
        }
    }

    /// Whether `path` names an item some module defines or imports.
    fn names_item(&self, path: &[String]) -> bool {
        let Some((last, module)) = path.split_last() else {
            return false;
        };
        let Some((krate, module)) = module.split_first() else {
            return false;
        };
        self.modules
            .get(&(krate.clone(), module.to_vec()))
            .is_some_and(|m| m.defs.contains(last) || m.uses.contains_key(last))
    }

    /// Resolves `raw` in `scope` to an absolute, canonical path.
    pub fn resolve(&self, scope: &Scope<'_>, raw: &RawPath) -> AbsPath {
        let abs = self.absolute(scope, raw, 0);
        self.canonical(abs, 0)
    }

    fn absolute(&self, scope: &Scope<'_>, raw: &RawPath, depth: usize) -> AbsPath {
        let here = || {
            let mut p = vec![scope.crate_id.to_owned()];
            p.extend(scope.module.iter().cloned());
            p
        };
        let Some((first, rest)) = raw.segs.split_first() else {
            return here();
        };
        let join = |mut base: AbsPath, rest: &[String]| {
            base.extend(rest.iter().cloned());
            base
        };
        let externs = self.externs.get(scope.crate_id);
        let extern_crate = |name: &str| externs.and_then(|e| e.get(name)).cloned();
        if raw.global {
            return join(
                vec![extern_crate(first).unwrap_or_else(|| first.clone())],
                rest,
            );
        }
        match first.as_str() {
            "crate" | "$crate" => return join(vec![scope.crate_id.to_owned()], rest),
            "self" => return join(here(), rest),
            "Self" => {
                if let Some(ty) = scope.self_ty {
                    return join(ty.clone(), rest);
                }
                return join(here(), &raw.segs);
            }
            "super" => {
                let mut module = scope.module.to_vec();
                let mut rest = raw.segs.as_slice();
                while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
                    module.pop();
                    rest = tail;
                }
                let mut base = vec![scope.crate_id.to_owned()];
                base.extend(module);
                return join(base, rest);
            }
            _ => {}
        }
        if depth > MAX_DEPTH {
            return join(here(), &raw.segs);
        }
        for (i, block) in scope.blocks.iter().enumerate().rev() {
            match block.get(first) {
                Some(BlockName::Use(target)) => {
                    // A block's `use` names what outer blocks or the module
                    // see.
                    let outer = Scope {
                        blocks: &scope.blocks[..i],
                        ..*scope
                    };
                    return join(self.absolute(&outer, target, depth + 1), rest);
                }
                Some(BlockName::Item) => {
                    let mut p = here();
                    p.push(format!("{{block {i}}}"));
                    return join(p, &raw.segs);
                }
                None => {}
            }
        }
        let key = (scope.crate_id.to_owned(), scope.module.to_vec());
        let module = self.modules.get(&key);
        let module_scope = Scope {
            blocks: &[],
            self_ty: None,
            ..*scope
        };
        if let Some(target) = module.and_then(|m| m.uses.get(first)) {
            if target.segs.first() == Some(first) && !target.global {
                // `use seam::x as seam_x;` is fine, but in `use seam;` or
                // `use foo::foo;` the first segment is not the import itself:
                // it is a module of this one or a crate.
                if module.is_some_and(|m| m.defs.contains(first)) {
                    return join(join(here(), &target.segs), rest);
                }
                if let Some(krate) = extern_crate(first) {
                    return join(join(vec![krate], &target.segs[1..]), rest);
                }
            }
            return join(self.absolute(&module_scope, target, depth + 1), rest);
        }
        if module.is_some_and(|m| m.defs.contains(first)) {
            return join(here(), &raw.segs);
        }
        if let Some(m) = module {
            for glob in &m.globs {
                let base = self.absolute(&module_scope, glob, depth + 1);
                let candidate =
                    self.canonical(join(base.clone(), std::slice::from_ref(first)), depth + 1);
                if self.names_item(&candidate) {
                    return join(candidate, rest);
                }
            }
        }
        if let Some(krate) = extern_crate(first) {
            return join(vec![krate], rest);
        }
        join(here(), &raw.segs)
    }

    /// Follows imports and re-exports, left to right, until the path names
    /// definitions only.
    fn canonical(&self, mut abs: AbsPath, depth: usize) -> AbsPath {
        'restart: for _ in 0..MAX_DEPTH {
            if depth > MAX_DEPTH {
                break;
            }
            for k in 2..=abs.len() {
                let key = (abs[0].clone(), abs[1..k - 1].to_vec());
                let Some(module) = self.modules.get(&key) else {
                    continue;
                };
                let name = &abs[k - 1];
                if module.defs.contains(name) {
                    continue;
                }
                let scope = Scope {
                    crate_id: &key.0,
                    module: &key.1,
                    blocks: &[],
                    self_ty: None,
                };
                if let Some(target) = module.uses.get(name) {
                    let base = self.absolute(&scope, target, depth + 1);
                    if base[..] == abs[..k] {
                        continue;
                    }
                    let mut next = base;
                    next.extend(abs[k..].iter().cloned());
                    abs = next;
                    continue 'restart;
                }
                for glob in &module.globs {
                    let mut candidate = self.absolute(&scope, glob, depth + 1);
                    candidate.push(name.clone());
                    if candidate[..] != abs[..k] && self.names_item(&candidate) {
                        candidate.extend(abs[k..].iter().cloned());
                        abs = candidate;
                        continue 'restart;
                    }
                }
            }
            break;
        }
        abs
    }
}
