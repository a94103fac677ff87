//! The workspace as the audit sees it: its packages and targets (from
//! `cargo metadata --no-deps`), and every Rust file each target compiles,
//! found by walking the module tree from the target's root (`mod x;`,
//! `#[path]`, inline modules), each with its module path and whether it is
//! test code.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// What kind of crate a target builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TargetKind {
    /// The library.
    Lib,
    /// A binary.
    Bin,
    /// An integration test (`tests/*.rs` or a `[[test]]`).
    Test,
    /// A benchmark.
    Bench,
    /// An example.
    Example,
    /// A build script.
    Build,
}

/// One target of a package.
#[derive(Clone, Debug)]
pub struct Target {
    /// Its name (`seam`, `residency`).
    pub name: String,
    /// Its kind.
    pub kind: TargetKind,
    /// Its root file.
    pub src_path: PathBuf,
}

impl Target {
    /// The label the reports use: `lib`, `bin seam`, `test residency`.
    pub fn label(&self) -> String {
        match self.kind {
            TargetKind::Lib => "lib".to_owned(),
            TargetKind::Bin => format!("bin {}", self.name),
            TargetKind::Test => format!("test {}", self.name),
            TargetKind::Bench => format!("bench {}", self.name),
            TargetKind::Example => format!("example {}", self.name),
            TargetKind::Build => "build.rs".to_owned(),
        }
    }
}

/// A workspace member.
#[derive(Clone, Debug)]
pub struct Package {
    /// The package name (`seam-cli`).
    pub name: String,
    /// The directory of its manifest.
    pub dir: PathBuf,
    /// The crate name of its library (`platform_fake`), if it has one.
    pub lib_crate: Option<String>,
    /// Its targets, library first.
    pub targets: Vec<Target>,
    /// The names its code may use for other crates (`seam`, or a rename)
    /// mapped to the crate names they stand for; dev-dependencies included.
    pub externs: BTreeMap<String, String>,
}

/// The workspace's packages.
#[derive(Debug)]
pub struct Workspace {
    /// The workspace root.
    pub root: PathBuf,
    /// Its members, by name.
    pub packages: Vec<Package>,
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn kind_of(kinds: &[Value]) -> Option<TargetKind> {
    let kinds: Vec<&str> = kinds.iter().filter_map(Value::as_str).collect();
    Some(
        if kinds
            .iter()
            .any(|k| k.ends_with("lib") || *k == "proc-macro")
        {
            TargetKind::Lib
        } else if kinds.contains(&"bin") {
            TargetKind::Bin
        } else if kinds.contains(&"test") {
            TargetKind::Test
        } else if kinds.contains(&"bench") {
            TargetKind::Bench
        } else if kinds.contains(&"example") {
            TargetKind::Example
        } else if kinds.contains(&"custom-build") {
            TargetKind::Build
        } else {
            return None;
        },
    )
}

fn str_field<'v>(v: &'v Value, key: &str) -> Result<&'v str> {
    v.get(key)
        .and_then(Value::as_str)
        .with_context(|| format!("cargo metadata: no string field {key:?}"))
}

impl Workspace {
    /// Reads the workspace at `root` with `cargo metadata --no-deps`.
    ///
    /// # Errors
    ///
    /// cargo fails or prints something unexpected.
    pub fn load(root: &Path) -> Result<Workspace> {
        let out = Command::new(cargo())
            .current_dir(root)
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .output()
            .context("running cargo metadata")?;
        if !out.status.success() {
            bail!(
                "cargo metadata in {} failed: {}",
                root.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let meta: Value = serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
        let root = PathBuf::from(str_field(&meta, "workspace_root")?);
        let members: HashSet<&str> = meta["workspace_members"]
            .as_array()
            .context("cargo metadata: workspace_members")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let mut packages = Vec::new();
        for p in meta["packages"]
            .as_array()
            .context("cargo metadata: packages")?
        {
            if !members.contains(str_field(p, "id")?) {
                continue;
            }
            let manifest = PathBuf::from(str_field(p, "manifest_path")?);
            let mut targets = Vec::new();
            for t in p["targets"].as_array().context("cargo metadata: targets")? {
                let Some(kind) = kind_of(t["kind"].as_array().map_or(&[][..], Vec::as_slice))
                else {
                    continue;
                };
                targets.push(Target {
                    name: str_field(t, "name")?.to_owned(),
                    kind,
                    src_path: normalize(Path::new(str_field(t, "src_path")?)),
                });
            }
            targets.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
            let lib_crate = targets
                .iter()
                .find(|t| t.kind == TargetKind::Lib)
                .map(|t| t.name.replace('-', "_"));
            let mut externs = BTreeMap::new();
            for d in p["dependencies"].as_array().map_or(&[][..], Vec::as_slice) {
                let name = str_field(d, "name")?.replace('-', "_");
                let local = d["rename"]
                    .as_str()
                    .map_or(name.clone(), |r| r.replace('-', "_"));
                externs.insert(local, name);
            }
            packages.push(Package {
                name: str_field(p, "name")?.to_owned(),
                dir: manifest.parent().unwrap_or(&root).to_path_buf(),
                lib_crate,
                targets,
                externs,
            });
        }
        // A dependency's crate name is its library's name, which a workspace
        // member may have set apart from its package name.
        let lib_names: BTreeMap<String, String> = packages
            .iter()
            .filter_map(|p| Some((p.name.replace('-', "_"), p.lib_crate.clone()?)))
            .collect();
        for p in &mut packages {
            for real in p.externs.values_mut() {
                if let Some(lib) = lib_names.get(real.as_str()) {
                    real.clone_from(lib);
                }
            }
        }
        packages.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Workspace { root, packages })
    }

    /// `path` relative to the workspace root, with `/` separators.
    pub fn rel(&self, path: &Path) -> String {
        let rel = path.strip_prefix(&self.root).unwrap_or(path);
        rel.to_string_lossy().replace('\\', "/")
    }

    /// The package named `name`.
    pub fn package(&self, name: &str) -> Option<&Package> {
        self.packages.iter().find(|p| p.name == name)
    }
}

/// `path` without `.` and `..` components (lexically: `cli/../tests/x.rs`
/// is `tests/x.rs`).
pub fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The identity of a crate being compiled: a library is known by its crate
/// name (other crates reach it by that name); the other targets get a name
/// nobody can write in a path.
pub fn crate_id(package: &Package, target: &Target) -> String {
    match target.kind {
        TargetKind::Lib => package
            .lib_crate
            .clone()
            .unwrap_or_else(|| target.name.replace('-', "_")),
        _ => format!("{}#{}", package.name, target.label()),
    }
}

/// One parsed file of one target.
pub struct SourceFile {
    /// Index of its package in [`Workspace::packages`].
    pub package: usize,
    /// Index of its target in the package's targets.
    pub target: usize,
    /// The crate it belongs to ([`crate_id`]).
    pub crate_id: String,
    /// Its module path inside the crate (empty for the crate root).
    pub module: Vec<String>,
    /// The file.
    pub path: PathBuf,
    /// Whether the whole file is test code (reached through a
    /// `#[cfg(test)]` module).
    pub test_code: bool,
    /// The syntax tree.
    pub ast: syn::File,
}

/// Whether `attrs` hold `#[cfg(...)]` that is only true under `test`:
/// `test`, `all(test, ..)`, `any(test, test)`.
pub fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    fn test_only(meta: &syn::Meta) -> bool {
        match meta {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(list) => {
                let Ok(nested) = list.parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                ) else {
                    return false;
                };
                if list.path.is_ident("all") {
                    nested.iter().any(test_only)
                } else if list.path.is_ident("any") {
                    !nested.is_empty() && nested.iter().all(test_only)
                } else {
                    false
                }
            }
            syn::Meta::NameValue(_) => false,
        }
    }
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| test_only(&m))
    })
}

/// Whether `attrs` mark a test function: `#[test]`, `#[tokio::test]`,
/// `#[rstest]`, `#[bench]`.
pub fn is_test_fn(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path()
            .segments
            .last()
            .is_some_and(|s| matches!(s.ident.to_string().as_str(), "test" | "rstest" | "bench"))
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Parses `path`.
///
/// # Errors
///
/// The file cannot be read or is not valid Rust.
pub fn parse(path: &Path) -> Result<syn::File> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    syn::parse_file(&text).map_err(|e| {
        let at = e.span().start();
        anyhow::anyhow!(
            "{}:{}:{}: cannot parse: {e}",
            path.display(),
            at.line,
            at.column + 1
        )
    })
}

/// Every file of every target, parsed; plus notes about modules whose file
/// was not found (a `mod` under a `cfg` for another platform).
///
/// # Errors
///
/// A file cannot be read or parsed.
pub fn source_files(ws: &Workspace) -> Result<(Vec<SourceFile>, Vec<String>)> {
    let mut files = Vec::new();
    let mut notes = Vec::new();
    for (pi, package) in ws.packages.iter().enumerate() {
        // A file compiled by several targets of one package (a shared
        // `tests/common/mod.rs`) is reported once, for the first.
        let mut seen = HashSet::new();
        for (ti, target) in package.targets.iter().enumerate() {
            let path = target.src_path.clone();
            if !seen.insert(path.clone()) {
                continue;
            }
            let child_dir = path.parent().unwrap_or(&ws.root).to_path_buf();
            let mut walker = Walker {
                package: pi,
                target: ti,
                crate_id: crate_id(package, target),
                files: &mut files,
                notes: &mut notes,
                seen: &mut seen,
                ws,
            };
            walker.file(path, Vec::new(), false, child_dir)?;
        }
    }
    Ok((files, notes))
}

struct Walker<'a> {
    package: usize,
    target: usize,
    crate_id: String,
    files: &'a mut Vec<SourceFile>,
    notes: &'a mut Vec<String>,
    seen: &'a mut HashSet<PathBuf>,
    ws: &'a Workspace,
}

impl Walker<'_> {
    fn file(
        &mut self,
        path: PathBuf,
        module: Vec<String>,
        test_code: bool,
        child_dir: PathBuf,
    ) -> Result<()> {
        let ast = parse(&path)?;
        let mut children = Vec::new();
        let file_dir = path.parent().unwrap_or(&self.ws.root).to_path_buf();
        collect_mods(
            &ast.items,
            &module,
            test_code,
            &child_dir,
            Some(&file_dir),
            &mut children,
        );
        self.files.push(SourceFile {
            package: self.package,
            target: self.target,
            crate_id: self.crate_id.clone(),
            module,
            path: path.clone(),
            test_code,
            ast,
        });
        for child in children {
            match child.candidates.iter().find(|c| c.is_file()) {
                Some(found) => {
                    let found = &normalize(found);
                    if !self.seen.insert(found.clone()) {
                        continue;
                    }
                    let is_mod_rs = found.file_name().is_some_and(|n| n == "mod.rs");
                    let dir = found.parent().unwrap_or(&self.ws.root);
                    let child_dir = if is_mod_rs || child.by_path_attr {
                        dir.to_path_buf()
                    } else {
                        dir.join(found.file_stem().unwrap_or_default())
                    };
                    self.file(found.clone(), child.module, child.test_code, child_dir)?;
                }
                None => self.notes.push(format!(
                    "{}: module `{}` has no file ({}); not audited",
                    self.ws.rel(&path),
                    child.module.join("::"),
                    child
                        .candidates
                        .iter()
                        .map(|c| self.ws.rel(c))
                        .collect::<Vec<_>>()
                        .join(" or ")
                )),
            }
        }
        Ok(())
    }
}

struct ChildMod {
    module: Vec<String>,
    test_code: bool,
    candidates: Vec<PathBuf>,
    by_path_attr: bool,
}

/// The `mod x;` declarations in `items` (inline modules followed), with the
/// files they may live in. `file_dir` is the declaring file's directory at
/// its top level, `None` inside an inline module.
fn collect_mods(
    items: &[syn::Item],
    module: &[String],
    test_code: bool,
    dir: &Path,
    file_dir: Option<&Path>,
    out: &mut Vec<ChildMod>,
) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        let name = m.ident.to_string();
        let mut child = module.to_vec();
        child.push(name.clone());
        let test_code = test_code || is_cfg_test(&m.attrs);
        let path_attr = path_attr(&m.attrs);
        match &m.content {
            Some((_, inner)) => {
                let inner_dir = match &path_attr {
                    Some(p) => dir.join(p),
                    None => dir.join(&name),
                };
                collect_mods(inner, &child, test_code, &inner_dir, None, out);
            }
            None => {
                let (candidates, by_path_attr) = match path_attr {
                    // A `#[path]` outside inline modules is relative to the
                    // declaring file's directory; inside one, to the inline
                    // module's directory.
                    Some(p) => (vec![file_dir.unwrap_or(dir).join(p)], true),
                    None => (
                        vec![
                            dir.join(format!("{name}.rs")),
                            dir.join(&name).join("mod.rs"),
                        ],
                        false,
                    ),
                };
                out.push(ChildMod {
                    module: child,
                    test_code,
                    candidates,
                    by_path_attr,
                });
            }
        }
    }
}
