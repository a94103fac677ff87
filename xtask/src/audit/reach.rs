//! The reach of the seam: every call of `resident_weight` and of the borrow
//! producers, every reader of `release_host_weights_after_upload`, and every
//! call of a backend copy method, found in the syntax trees (macro bodies
//! included).

use std::collections::HashMap;

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};

use super::resolve::{
    AbsPath, BlockName, BlockScopes, FnDef, Names, RawPath, Scope, flatten_use, item_name,
};
use super::workspace::{SourceFile, Workspace, is_cfg_test, is_test_fn};

/// The package that is the seam.
pub const SEAM_PACKAGE: &str = "seam";

/// The seam function: every weight's bytes reach a device through it.
pub const SEAM_FN: &str = "resident_weight";

/// A function of the seam whose calls the audit lists.
#[derive(Clone, Copy, Debug)]
pub struct Producer {
    /// The type whose associated function it is.
    pub ty: &'static str,
    /// The function.
    pub name: &'static str,
    /// Called as a method (`x.f()`): such calls are matched by name, since
    /// the audit knows no types.
    pub method: bool,
}

/// The borrow producers: the seam's functions that create file-backed
/// borrows, or the mapping they view. A weight's bytes come from one of
/// these before they go through `resident_weight`.
///
/// - `GgufModel::tensor_borrow`: a tensor's bytes in its shard's mapping
///   (how models hand out weights);
/// - `Borrow::new`: a borrow of any range of a mapping;
/// - `Borrow::sub_span`: a narrower borrow of a borrow (one expert's rows);
/// - `MappedFile::open`: the file mapping itself, which every file-backed
///   borrow views.
///
/// Not listed: `MappedFile::anonymous` (no file behind it, so never
/// released), `Borrow::clone` (the same span again), and the openers
/// `GgufFile::open`/`GgufModel::open` (they map a file through
/// `MappedFile::open`, which is listed, and parse its header).
pub const BORROW_PRODUCERS: &[Producer] = &[
    Producer {
        ty: "GgufModel",
        name: "tensor_borrow",
        method: true,
    },
    Producer {
        ty: "Borrow",
        name: "new",
        method: false,
    },
    Producer {
        ty: "Borrow",
        name: "sub_span",
        method: true,
    },
    Producer {
        ty: "MappedFile",
        name: "open",
        method: false,
    },
];

/// The policy flag whose readers the audit lists (field reads, struct
/// patterns that bind it, and calls of a method of that name; initializing
/// the field in a struct literal is not a read).
pub const FLAG: &str = "release_host_weights_after_upload";

/// The backend methods that copy host bytes to a device
/// (`seam::platform::Backend`). Called as methods, so matched by name.
pub const COPY_METHODS: &[&str] = &["copy_to_device_async"];

/// A function the audit looks for, located in the seam.
#[derive(Clone, Debug)]
pub struct Wanted {
    /// How the table names it: `resident_weight`, `Borrow::new`.
    pub display: String,
    /// Its definition's absolute path.
    pub abs: AbsPath,
    /// The method name, for functions matched by name at method calls.
    pub method: Option<&'static str>,
}

/// Finds the seam's definitions of [`SEAM_FN`] and [`BORROW_PRODUCERS`];
/// a problem for each one defined no or several times, and for each
/// function outside the seam that shadows one of them.
pub fn locate(ws: &Workspace, names: &Names) -> (Vec<Wanted>, Vec<String>) {
    let mut problems = Vec::new();
    let Some(seam) = ws.packages.iter().position(|p| p.name == SEAM_PACKAGE) else {
        return (
            Vec::new(),
            vec![format!("the workspace has no package `{SEAM_PACKAGE}`")],
        );
    };
    let seam_crate = ws.packages[seam].lib_crate.clone().unwrap_or_default();
    let mut wanted = Vec::new();
    let specs = std::iter::once((None, SEAM_FN, false)).chain(
        BORROW_PRODUCERS
            .iter()
            .map(|p| (Some(p.ty), p.name, p.method)),
    );
    for (ty, name, method) in specs {
        let display = ty.map_or(name.to_owned(), |t| format!("{t}::{name}"));
        let is_it = |f: &&FnDef| f.name == name && f.self_ty.as_deref() == ty;
        let defs: Vec<&FnDef> = names
            .fns
            .iter()
            .filter(|f| f.crate_id == seam_crate && !f.test_code)
            .filter(is_it)
            .collect();
        match defs.as_slice() {
            [] => problems.push(format!(
                "the seam defines no `{display}`: update the audit's list (xtask/src/audit/reach.rs)"
            )),
            [def] => wanted.push(Wanted {
                display: display.clone(),
                abs: def.abs(),
                method: method.then_some(name),
            }),
            several => problems.push(format!(
                "the seam defines `{display}` {} times ({}): one of them shadows the other",
                several.len(),
                several.iter().map(|d| format!("{}:{}", d.at.0, d.at.1)).collect::<Vec<_>>().join(", ")
            )),
        }
        // Outside the seam, a function named like the seam function shadows
        // it (the seed engine's two `ResidentWeight`s); a method named like
        // a producer matched by name makes its calls indistinguishable.
        if ty.is_none() || method {
            for f in names
                .fns
                .iter()
                .filter(|f| f.package != seam && f.name == name)
            {
                if ty.is_none() || f.self_ty.is_some() {
                    let owner = f
                        .self_ty
                        .as_ref()
                        .map_or(String::new(), |t| format!("{t}::"));
                    problems.push(format!(
                        "{}:{}: `{owner}{name}` is defined outside the seam; its calls would be \
                         confused with the seam's `{display}`: rename it",
                        f.at.0, f.at.1
                    ));
                }
            }
        }
    }
    (wanted, problems)
}

/// How a site uses what it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// A call through a path.
    Call,
    /// A method call.
    Method,
    /// The function named as a value (`let f = resident_weight;`).
    Value,
    /// A field read or a pattern that binds the field.
    Read,
    /// Found in macro tokens that do not parse as Rust.
    MacroTokens,
}

/// One place in the source.
#[derive(Clone, Debug)]
pub struct Site {
    /// Index of the package.
    pub package: usize,
    /// Index of the target in the package.
    pub target: usize,
    /// The file, relative to the workspace root.
    pub file: String,
    /// The line.
    pub line: usize,
    /// The column (from 1).
    pub column: usize,
    /// The enclosing function (`load::stage_all`, `Borrow::sub_span`).
    pub function: String,
    /// What it names: the wanted function's display name, the flag or the
    /// copy method.
    pub what: String,
    /// How.
    pub how: How,
    /// Whether it is test code: a `#[cfg(test)]` module, a `#[test]`
    /// function, or a test, bench or example target.
    pub test_code: bool,
    /// Whether it is inside an implementation of the copy method itself
    /// (a backend forwarding to another).
    pub in_copy_impl: bool,
}

/// What the audit found in the source.
#[derive(Debug, Default)]
pub struct Found {
    /// Calls of the seam function and the producers.
    pub calls: Vec<Site>,
    /// Readers of the flag.
    pub readers: Vec<Site>,
    /// Calls of a backend copy method.
    pub copies: Vec<Site>,
}

/// Finds every site in `files`.
pub fn find(ws: &Workspace, names: &Names, wanted: &[Wanted], files: &[SourceFile]) -> Found {
    let mut found = Found::default();
    for file in files {
        let target = &ws.packages[file.package].targets[file.target];
        let mut finder = Finder {
            names,
            wanted,
            package: file.package,
            target: file.target,
            crate_id: file.crate_id.clone(),
            file: ws.rel(&file.path),
            module: file.module.clone(),
            fns: Vec::new(),
            impl_fns: Vec::new(),
            test_depth: usize::from(file.test_code || super::is_test_target(target.kind)),
            self_ty: Vec::new(),
            blocks: Vec::new(),
            found: &mut found,
        };
        finder.visit_file(&file.ast);
    }
    for list in [&mut found.calls, &mut found.readers, &mut found.copies] {
        let key = |s: &Site| (s.package, s.file.clone(), s.line, s.column, s.what.clone());
        list.sort_by_key(key);
        // Tokens a macro call repeats are one site.
        list.dedup_by(|a, b| key(a) == key(b));
    }
    found
}

struct Finder<'a> {
    names: &'a Names,
    wanted: &'a [Wanted],
    package: usize,
    target: usize,
    crate_id: String,
    file: String,
    module: Vec<String>,
    fns: Vec<String>,
    impl_fns: Vec<Option<String>>,
    test_depth: usize,
    self_ty: Vec<Option<AbsPath>>,
    blocks: BlockScopes,
    found: &'a mut Found,
}

enum List {
    Calls,
    Readers,
    Copies,
}

impl Finder<'_> {
    fn resolve(&self, raw: &RawPath) -> AbsPath {
        let self_ty = self.self_ty.last().and_then(Option::as_ref);
        let scope = Scope {
            crate_id: &self.crate_id,
            module: &self.module,
            blocks: &self.blocks,
            self_ty,
        };
        self.names.resolve(&scope, raw)
    }

    fn function(&self) -> String {
        let mut parts: Vec<&str> = self.module.iter().map(String::as_str).collect();
        if self.fns.is_empty() {
            parts.push("(item)");
        }
        parts.extend(self.fns.iter().map(String::as_str));
        parts.join("::")
    }

    fn record(&mut self, list: List, span: Span, what: &str, how: How) {
        let site = Site {
            package: self.package,
            target: self.target,
            file: self.file.clone(),
            line: span.start().line,
            column: span.start().column + 1,
            function: self.function(),
            what: what.to_owned(),
            how,
            test_code: self.test_depth > 0,
            in_copy_impl: self
                .impl_fns
                .last()
                .and_then(Option::as_deref)
                .is_some_and(|f| COPY_METHODS.contains(&f)),
        };
        match list {
            List::Calls => self.found.calls.push(site),
            List::Readers => self.found.readers.push(site),
            List::Copies => self.found.copies.push(site),
        }
    }

    /// A path in expression position (`how` says whether it is called).
    fn check_path(&mut self, raw: &RawPath, span: Span, how: How) {
        let Some(last) = raw.segs.last() else { return };
        if COPY_METHODS.contains(&last.as_str()) {
            self.record(List::Copies, span, last, how);
        }
        // `Policy::release_host_weights_after_upload(&p)`: a getter called
        // through its path. A single segment is a local variable (bound by a
        // pattern that was counted) or a function of that name.
        if last == FLAG && raw.segs.len() > 1 {
            self.record(List::Readers, span, FLAG, How::Read);
        }
        let abs = self.resolve(raw);
        if let Some(w) = self.wanted.iter().find(|w| w.abs == abs) {
            let what = w.display.clone();
            self.record(List::Calls, span, &what, how);
        }
    }

    fn check_method(&mut self, name: &str, span: Span, how: How) {
        if COPY_METHODS.contains(&name) {
            self.record(List::Copies, span, name, how);
        }
        if name == FLAG {
            self.record(List::Readers, span, FLAG, How::Read);
        }
        if let Some(w) = self.wanted.iter().find(|w| w.method == Some(name)) {
            let what = w.display.clone();
            self.record(List::Calls, span, &what, how);
        }
    }

    fn expr_path(&mut self, qself: Option<&syn::QSelf>, path: &syn::Path, how: How) {
        let Some(last) = path.segments.last() else {
            return;
        };
        let span = last.ident.span();
        let mut raw = RawPath::of(path);
        // `<Borrow>::new`: the path continues from the type.
        if let Some(q) = qself
            && q.position == 0
            && let syn::Type::Path(tp) = &*q.ty
        {
            let mut ty = RawPath::of(&tp.path);
            ty.segs.extend(raw.segs);
            raw = ty;
        }
        self.check_path(&raw, span, how);
    }

    fn with_fn<F: FnOnce(&mut Self)>(
        &mut self,
        name: String,
        impl_fn: Option<String>,
        test: bool,
        f: F,
    ) {
        self.fns.push(name);
        self.impl_fns.push(impl_fn);
        self.test_depth += usize::from(test);
        f(self);
        self.test_depth -= usize::from(test);
        self.impl_fns.pop();
        self.fns.pop();
    }

    /// The tokens of a macro call: as comma-separated expressions
    /// (`assert!`, `println!`, `vec!`), `expr; expr` (`vec![x; n]`),
    /// statements; else each comma-separated piece that parses as an
    /// expression, and the tokens of the rest.
    fn macro_tokens(&mut self, tokens: TokenStream) {
        if let Ok(exprs) =
            Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated.parse2(tokens.clone())
        {
            for e in &exprs {
                self.visit_expr(e);
            }
            return;
        }
        let repeat = |input: syn::parse::ParseStream<'_>| {
            let a: syn::Expr = input.parse()?;
            input.parse::<syn::Token![;]>()?;
            let b: syn::Expr = input.parse()?;
            Ok((a, b))
        };
        if let Ok((a, b)) = repeat.parse2(tokens.clone()) {
            self.visit_expr(&a);
            self.visit_expr(&b);
            return;
        }
        if let Ok(stmts) = syn::Block::parse_within.parse2(tokens.clone()) {
            self.block_items(&stmts, |me| {
                for s in &stmts {
                    me.visit_stmt(s);
                }
            });
            return;
        }
        let mut piece = Vec::new();
        let mut pieces = Vec::new();
        for tt in tokens {
            if let TokenTree::Punct(p) = &tt
                && matches!(p.as_char(), ',' | ';')
            {
                pieces.push(std::mem::take(&mut piece));
            } else {
                piece.push(tt);
            }
        }
        pieces.push(piece);
        for piece in pieces {
            let stream: TokenStream = piece.into_iter().collect();
            match syn::parse2::<syn::Expr>(stream.clone()) {
                Ok(e) => self.visit_expr(&e),
                Err(_) => self.scan_tokens(stream),
            }
        }
    }

    /// Tokens that are not Rust (a macro's own syntax, `$x` metavariables):
    /// paths followed by `(` are calls, `.name(` method calls, `.name` field
    /// reads; groups are tried as Rust again.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => {
                    if g.delimiter() == Delimiter::Brace || g.delimiter() == Delimiter::Parenthesis
                    {
                        self.macro_tokens(g.stream());
                    } else {
                        self.scan_tokens(g.stream());
                    }
                    i += 1;
                }
                TokenTree::Ident(first) => {
                    let after_dot =
                        i > 0 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == '.');
                    let after_dollar =
                        i > 0 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == '$');
                    let mut segs = vec![if after_dollar && first == "crate" {
                        "$crate".to_owned()
                    } else {
                        first.to_string()
                    }];
                    let mut span = first.span();
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (tts.get(j), tts.get(j + 1), tts.get(j + 2))
                        && a.as_char() == ':'
                        && b.as_char() == ':'
                    {
                        segs.push(next.to_string());
                        span = next.span();
                        j += 3;
                    }
                    let called = matches!(tts.get(j), Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis);
                    if after_dot && segs.len() == 1 {
                        self.check_method(&segs[0], span, How::MacroTokens);
                    } else if segs.len() > 1 || called {
                        self.check_path(
                            &RawPath {
                                global: false,
                                segs,
                            },
                            span,
                            How::MacroTokens,
                        );
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }

    /// Visits `f` with the names that `stmts` (a block) import or define.
    fn block_items<F: FnOnce(&mut Self)>(&mut self, stmts: &[syn::Stmt], f: F) {
        let mut scope = HashMap::new();
        for s in stmts {
            let syn::Stmt::Item(item) = s else { continue };
            if let syn::Item::Use(u) = item {
                let (mut uses, mut globs) = (Vec::new(), Vec::new());
                flatten_use(
                    &u.tree,
                    &mut Vec::new(),
                    u.leading_colon.is_some(),
                    &mut uses,
                    &mut globs,
                );
                for (name, path) in uses {
                    scope.insert(name, BlockName::Use(path));
                }
            } else if let Some(name) = item_name(item) {
                scope.insert(name, BlockName::Item);
            }
        }
        self.blocks.push(scope);
        f(self);
        self.blocks.pop();
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let Some((_, items)) = &m.content else { return };
        let test = is_cfg_test(&m.attrs);
        self.module.push(m.ident.to_string());
        self.test_depth += usize::from(test);
        let blocks = std::mem::take(&mut self.blocks);
        let fns = std::mem::take(&mut self.fns);
        for item in items {
            self.visit_item(item);
        }
        self.fns = fns;
        self.blocks = blocks;
        self.test_depth -= usize::from(test);
        self.module.pop();
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        let test = is_cfg_test(&f.attrs) || is_test_fn(&f.attrs);
        self.with_fn(f.sig.ident.to_string(), None, test, |me| {
            visit::visit_item_fn(me, f)
        });
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let ty = match &*i.self_ty {
            syn::Type::Path(p) => Some(self.resolve(&RawPath::of(&p.path))),
            _ => None,
        };
        let test = is_cfg_test(&i.attrs);
        self.self_ty.push(ty);
        self.test_depth += usize::from(test);
        visit::visit_item_impl(self, i);
        self.test_depth -= usize::from(test);
        self.self_ty.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        let ty = self
            .self_ty
            .last()
            .and_then(Option::as_ref)
            .and_then(|t| t.last().cloned())
            .unwrap_or_else(|| "_".into());
        let name = f.sig.ident.to_string();
        let test = is_cfg_test(&f.attrs) || is_test_fn(&f.attrs);
        self.with_fn(format!("{ty}::{name}"), Some(name), test, |me| {
            visit::visit_impl_item_fn(me, f)
        });
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        let path = {
            let mut p = vec![self.crate_id.clone()];
            p.extend(self.module.iter().cloned());
            p.push(t.ident.to_string());
            p
        };
        self.self_ty.push(Some(path));
        visit::visit_item_trait(self, t);
        self.self_ty.pop();
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        let ty = self
            .self_ty
            .last()
            .and_then(Option::as_ref)
            .and_then(|t| t.last().cloned())
            .unwrap_or_default();
        let name = f.sig.ident.to_string();
        self.with_fn(format!("{ty}::{name}"), Some(name), false, |me| {
            visit::visit_trait_item_fn(me, f)
        });
    }

    fn visit_item_const(&mut self, c: &'ast syn::ItemConst) {
        self.with_fn(format!("const {}", c.ident), None, false, |me| {
            visit::visit_item_const(me, c)
        });
    }

    fn visit_item_static(&mut self, s: &'ast syn::ItemStatic) {
        self.with_fn(format!("static {}", s.ident), None, false, |me| {
            visit::visit_item_static(me, s)
        });
    }

    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.block_items(&b.stmts, |me| visit::visit_block(me, b));
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*c.func {
            for attr in &c.attrs {
                self.visit_attribute(attr);
            }
            self.expr_path(p.qself.as_ref(), &p.path, How::Call);
            for arg in &c.args {
                self.visit_expr(arg);
            }
        } else {
            visit::visit_expr_call(self, c);
        }
    }

    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        self.expr_path(p.qself.as_ref(), &p.path, How::Value);
        visit::visit_expr_path(self, p);
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        self.check_method(&m.method.to_string(), m.method.span(), How::Method);
        visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_field(&mut self, f: &'ast syn::ExprField) {
        if let syn::Member::Named(name) = &f.member
            && name == FLAG
        {
            self.record(List::Readers, name.span(), FLAG, How::Read);
        }
        visit::visit_expr_field(self, f);
    }

    fn visit_field_pat(&mut self, f: &'ast syn::FieldPat) {
        if let syn::Member::Named(name) = &f.member
            && name == FLAG
        {
            self.record(List::Readers, name.span(), FLAG, How::Read);
        }
        visit::visit_field_pat(self, f);
    }

    fn visit_item_macro(&mut self, m: &'ast syn::ItemMacro) {
        if m.mac.path.is_ident("macro_rules") {
            let name = m
                .ident
                .as_ref()
                .map_or_else(String::new, ToString::to_string);
            let tokens = m.mac.tokens.clone();
            self.with_fn(format!("macro_rules! {name}"), None, false, |me| {
                // `(matcher) => { transcriber };`: only transcribers are code.
                let tts: Vec<TokenTree> = tokens.into_iter().collect();
                for w in tts.windows(3) {
                    if let (TokenTree::Punct(eq), TokenTree::Punct(gt), TokenTree::Group(body)) =
                        (&w[0], &w[1], &w[2])
                        && eq.as_char() == '='
                        && gt.as_char() == '>'
                    {
                        me.macro_tokens(body.stream());
                    }
                }
            });
            return;
        }
        visit::visit_item_macro(self, m);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.macro_tokens(m.tokens.clone());
    }
}
