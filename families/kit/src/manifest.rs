//! The manifest: every tensor a family claims, named once with its role,
//! dims, type rule and route, and the tensors it drops (or refuses) by
//! name. One manifest serves both directions of the check
//! ([`Manifest::check`]: every tensor of the file is claimed or dropped by
//! name, every claimed tensor exists with the expected dims and type), the
//! census, and the load ([`crate::LoadedWeights`]), which hands weights out
//! by [`Handle`] rather than by name.
//!
//! A family writes its manifest with a [`ManifestBuilder`]: per-layer
//! patterns are plain loops over [`ManifestBuilder::layer`], optional
//! tensors are claimed only when the file has them
//! ([`ManifestBuilder::optional`]), expert stacks are
//! [`ManifestBuilder::stack`] (routed as sub-span borrows), and drop or
//! refusal rules match names ([`ManifestBuilder::drop_when`],
//! [`ManifestBuilder::refuse`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use seam::gguf::{GgmlType, TensorInfo};
use seam::weight::Role;
use serde::Serialize;

use crate::error::LoadError;

/// How a weight reaches the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// Staged whole through `seam::resident_weight`, once, on first use.
    Dense,
    /// A stack of experts kept as it is in the file (quantized): one
    /// expert's rows are a sub-span borrow staged when the router picks it;
    /// the stack is never staged whole (`expert_streamed`).
    ExpertStack,
    /// A table read by row gathers from its borrow; never staged whole
    /// (`expert_streamed`).
    LazyTable,
}

impl Route {
    /// The name in reports (`dense`, `expert_stack`, `lazy_table`).
    pub fn name(self) -> &'static str {
        match self {
            Route::Dense => "dense",
            Route::ExpertStack => "expert_stack",
            Route::LazyTable => "lazy_table",
        }
    }
}

/// The ggml types a tensor may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TypeClass {
    /// Any type `family-ops` dequantizes (matrices: quantized or float);
    /// a type the forward pass could not read is refused at load.
    Any,
    /// F32 only: RMSNorm gammas named `*_norm.weight` (llama.cpp's
    /// converter and quantizer keep them F32), 1-D biases and `ssm_a`, and
    /// `ssm_conv1d` (ggml_ssm_conv asserts F32).
    F32,
    /// A float type (F32, F16, BF16): tables ggml multiplies elementwise
    /// or casts to F32, whose names escape the quantizer's `_norm.weight`
    /// rule (`ple_norm_*`, `ple_conv1d`).
    Float,
}

impl TypeClass {
    /// Whether `ty` is allowed.
    pub fn allows(self, ty: GgmlType) -> bool {
        match self {
            TypeClass::Any => family_ops::is_supported(ty),
            TypeClass::F32 => ty == GgmlType::F32,
            TypeClass::Float => matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16),
        }
    }
}

impl fmt::Display for TypeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TypeClass::Any => "a ggml type family-ops dequantizes",
            TypeClass::F32 => "F32",
            TypeClass::Float => "a float type (F32, F16 or BF16)",
        })
    }
}

/// The dims a tensor must have (GGUF order, ne0 first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dims {
    /// Exactly these (trailing 1s are equivalent to absent dims).
    Exact(Vec<u64>),
    /// Any dims with as many elements as these (llama.cpp allows the
    /// reshape: `{E, hc}` may be stored as `{E * hc}`).
    Reshape(Vec<u64>),
    /// `{ne0, rows}` with at least `min_rows` rows (the PLE table).
    RowsAtLeast {
        /// The row width.
        ne0: u64,
        /// The fewest rows.
        min_rows: u64,
    },
}

fn trimmed(dims: &[u64]) -> &[u64] {
    let n = dims.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
    &dims[..n]
}

impl Dims {
    /// Whether `found` satisfies the rule.
    pub fn matches(&self, found: &[u64]) -> bool {
        match self {
            Dims::Exact(d) => trimmed(d) == trimmed(found),
            Dims::Reshape(d) => {
                let want: Option<u64> = d.iter().try_fold(1u64, |a, &x| a.checked_mul(x));
                let have: Option<u64> = found.iter().try_fold(1u64, |a, &x| a.checked_mul(x));
                want.is_some() && want == have
            }
            Dims::RowsAtLeast { ne0, min_rows } => {
                matches!(trimmed(found), [n0, rows] if n0 == ne0 && rows >= min_rows)
                    || (*min_rows <= 1 && trimmed(found) == [*ne0])
            }
        }
    }

    /// The canonical dims (for a reshape rule, the documented ones; for a
    /// row rule, the fewest rows).
    pub fn canonical(&self) -> Vec<u64> {
        match self {
            Dims::Exact(d) | Dims::Reshape(d) => d.clone(),
            Dims::RowsAtLeast { ne0, min_rows } => vec![*ne0, *min_rows],
        }
    }
}

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dims::Exact(d) => write!(f, "{d:?}"),
            Dims::Reshape(d) => write!(
                f,
                "{d:?} (or any dims of {} elements)",
                d.iter().product::<u64>()
            ),
            Dims::RowsAtLeast { ne0, min_rows } => {
                write!(f, "[{ne0}, rows] with rows >= {min_rows}")
            }
        }
    }
}

/// One tensor the family claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorSpec {
    /// The GGUF name.
    pub name: String,
    /// What it is for.
    #[serde(serialize_with = "role_name")]
    pub role: Role,
    /// Its layer (`None` for globals).
    pub layer: Option<usize>,
    /// The dims it must have.
    pub dims: Dims,
    /// The types it may have.
    pub types: TypeClass,
    /// How it reaches the device.
    pub route: Route,
}

fn role_name<S: serde::Serializer>(role: &Role, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(role.as_str())
}

/// A tensor of the file dropped on purpose.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DroppedTensor {
    /// Its name.
    pub name: String,
    /// Why the family drops it.
    pub reason: &'static str,
    /// Its bytes.
    pub bytes: u64,
}

/// A claimed tensor's place in its manifest: how the forward pass asks for
/// a weight (no name is parsed after the manifest is built).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Handle(pub usize);

type NameRule = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// A rule that drops tensors by name.
struct DropRule {
    /// How the rule reads in reports (`blk.{3..}.*`).
    pattern: String,
    reason: &'static str,
    matches: NameRule,
}

/// Builds a [`Manifest`].
pub struct ManifestBuilder {
    arch: &'static str,
    present: HashSet<String>,
    tensors: Vec<TensorSpec>,
    drops: Vec<DropRule>,
    refusals: Vec<(String, String)>,
}

impl fmt::Debug for ManifestBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManifestBuilder")
            .field("arch", &self.arch)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl ManifestBuilder {
    /// A builder for architecture `arch` over a file whose tensor table is
    /// `file` (read only to decide optional tensors).
    pub fn new(arch: &'static str, file: &[TensorInfo]) -> ManifestBuilder {
        ManifestBuilder {
            arch,
            present: file.iter().map(|t| t.name.clone()).collect(),
            tensors: Vec::new(),
            drops: Vec::new(),
            refusals: Vec::new(),
        }
    }

    /// Whether the file has a tensor named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.present.contains(name)
    }

    /// Claims `name`.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        role: &'static str,
        layer: Option<usize>,
        dims: Dims,
        types: TypeClass,
        route: Route,
    ) -> Handle {
        self.tensors.push(TensorSpec {
            name: name.into(),
            role: Role::new(role),
            layer,
            dims,
            types,
            route,
        });
        Handle(self.tensors.len() - 1)
    }

    /// Claims the global `{role}.weight`.
    pub fn global(
        &mut self,
        role: &'static str,
        dims: Dims,
        types: TypeClass,
        route: Route,
    ) -> Handle {
        self.tensor(format!("{role}.weight"), role, None, dims, types, route)
    }

    /// Claims `blk.{layer}.{suffix}` with role `role`, routed dense.
    pub fn layer(
        &mut self,
        layer: usize,
        suffix: &str,
        role: &'static str,
        dims: Dims,
        types: TypeClass,
    ) -> Handle {
        self.tensor(
            format!("blk.{layer}.{suffix}"),
            role,
            Some(layer),
            dims,
            types,
            Route::Dense,
        )
    }

    /// Claims the expert stack `blk.{layer}.{suffix}` (dims
    /// `[ne0, rows, n_expert]`): never staged whole, one expert's rows are
    /// a sub-span borrow.
    pub fn stack(
        &mut self,
        layer: usize,
        suffix: &str,
        role: &'static str,
        dims: &[u64],
    ) -> Handle {
        self.tensor(
            format!("blk.{layer}.{suffix}"),
            role,
            Some(layer),
            Dims::Exact(dims.to_vec()),
            TypeClass::Any,
            Route::ExpertStack,
        )
    }

    /// Claims `name` only if the file has it.
    pub fn optional(
        &mut self,
        name: impl Into<String>,
        role: &'static str,
        layer: Option<usize>,
        dims: Dims,
        types: TypeClass,
        route: Route,
    ) -> Option<Handle> {
        let name = name.into();
        self.has(&name)
            .then(|| self.tensor(name, role, layer, dims, types, route))
    }

    /// The spec of a tensor claimed so far.
    pub fn spec(&self, handle: Handle) -> &TensorSpec {
        &self.tensors[handle.0]
    }

    /// The claimed tensors so far.
    pub fn claimed(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Drops, on purpose, every unclaimed tensor whose name `matches`;
    /// `pattern` is how the rule reads in reports.
    pub fn drop_when(
        &mut self,
        pattern: impl Into<String>,
        reason: &'static str,
        matches: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> &mut Self {
        self.drops.push(DropRule {
            pattern: pattern.into(),
            reason,
            matches: Box::new(matches),
        });
        self
    }

    /// Refuses a file that holds `name` (a table the family borrows from
    /// elsewhere, a tensor published broken), with `reason`.
    pub fn refuse(&mut self, name: impl Into<String>, reason: impl Into<String>) -> &mut Self {
        self.refusals.push((name.into(), reason.into()));
        self
    }

    /// The manifest.
    pub fn build(self) -> Manifest {
        let index = self
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), Handle(i)))
            .collect();
        Manifest {
            arch: self.arch,
            tensors: self.tensors,
            index,
            drops: self.drops,
            refusals: self.refusals,
        }
    }
}

/// Every tensor a family claims, and what it drops or refuses by name.
#[derive(Serialize)]
pub struct Manifest {
    /// The architecture.
    pub arch: &'static str,
    /// The claimed tensors, each named once; a [`Handle`] indexes them.
    pub tensors: Vec<TensorSpec>,
    #[serde(skip)]
    index: HashMap<String, Handle>,
    #[serde(skip)]
    drops: Vec<DropRule>,
    #[serde(skip)]
    refusals: Vec<(String, String)>,
}

impl fmt::Debug for Manifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Manifest")
            .field("arch", &self.arch)
            .field("tensors", &self.tensors.len())
            .field("drop_rules", &self.drop_rules())
            .finish()
    }
}

impl Manifest {
    /// The handle of the claimed tensor `name`.
    pub fn handle(&self, name: &str) -> Option<Handle> {
        self.index.get(name).copied()
    }

    /// The index in [`Manifest::tensors`] of the claimed tensor `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.handle(name).map(|h| h.0)
    }

    /// The claimed tensor named `name`.
    pub fn spec(&self, name: &str) -> Option<&TensorSpec> {
        self.handle(name).map(|h| &self.tensors[h.0])
    }

    /// Why the family drops the tensor `name` on purpose, or `None` when it
    /// does not (a claimed tensor is never dropped).
    pub fn drop_reason(&self, name: &str) -> Option<&'static str> {
        if self.index.contains_key(name) {
            return None;
        }
        self.drops
            .iter()
            .find(|r| (r.matches)(name))
            .map(|r| r.reason)
    }

    /// The rules by which tensors are dropped, for reports.
    pub fn drop_rules(&self) -> Vec<String> {
        self.drops
            .iter()
            .map(|r| format!("{}: {}", r.pattern, r.reason))
            .collect()
    }

    /// Checks the file's tensor table against the manifest, both ways:
    /// every tensor of the file is claimed (with the expected dims and an
    /// allowed type) or dropped by name, none is refused by name, and every
    /// claimed tensor exists. Returns the dropped tensors.
    ///
    /// # Errors
    ///
    /// The first mismatch, naming the tensor: refused, extra, wrong shape or
    /// wrong type (in file order), else missing (in manifest order).
    pub fn check(&self, tensors: &[TensorInfo]) -> Result<Vec<DroppedTensor>, LoadError> {
        let mut dropped = Vec::new();
        let mut seen = vec![false; self.tensors.len()];
        for t in tensors {
            if let Some((_, reason)) = self.refusals.iter().find(|(n, _)| *n == t.name) {
                return Err(LoadError::RefusedTensor {
                    name: t.name.clone(),
                    reason: reason.clone(),
                });
            }
            let Some(&Handle(i)) = self.index.get(&t.name) else {
                match self.drop_reason(&t.name) {
                    Some(reason) => dropped.push(DroppedTensor {
                        name: t.name.clone(),
                        reason,
                        bytes: t.n_bytes,
                    }),
                    None => {
                        return Err(LoadError::ExtraTensor {
                            arch: self.arch,
                            name: t.name.clone(),
                        });
                    }
                }
                continue;
            };
            let spec = &self.tensors[i];
            seen[i] = true;
            if !spec.dims.matches(&t.dims) {
                return Err(LoadError::WrongShape {
                    name: t.name.clone(),
                    expected: spec.dims.to_string(),
                    found: t.dims.clone(),
                });
            }
            if !spec.types.allows(t.ggml_type) {
                return Err(LoadError::WrongType {
                    name: t.name.clone(),
                    expected: spec.types,
                    found: t.ggml_type,
                });
            }
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(LoadError::MissingTensor {
                arch: self.arch,
                name: self.tensors[i].name.clone(),
            });
        }
        Ok(dropped)
    }

    /// Counts, bytes and route per role of the claimed tensors in
    /// `tensors`, and what was dropped.
    pub fn census(&self, tensors: &[TensorInfo]) -> Census {
        let mut census = Census::default();
        for t in tensors {
            census.file_tensors += 1;
            census.file_bytes += t.n_bytes;
            let Some(spec) = self.spec(&t.name) else {
                if let Some(reason) = self.drop_reason(&t.name) {
                    census.dropped.push(DroppedTensor {
                        name: t.name.clone(),
                        reason,
                        bytes: t.n_bytes,
                    });
                }
                continue;
            };
            let role = census
                .roles
                .entry(spec.role.as_str().to_owned())
                .or_insert_with(|| RoleCensus {
                    route: spec.route,
                    count: 0,
                    bytes: 0,
                    types: BTreeMap::new(),
                });
            role.count += 1;
            role.bytes += t.n_bytes;
            *role.types.entry(t.ggml_type.name().to_owned()).or_default() += 1;
            let route = census
                .routes
                .entry(spec.route.name().to_owned())
                .or_default();
            route.count += 1;
            route.bytes += t.n_bytes;
            census.claimed_tensors += 1;
            census.claimed_bytes += t.n_bytes;
        }
        census
    }
}

/// One role in the census.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoleCensus {
    /// How its tensors reach the device.
    pub route: Route,
    /// Tensors.
    pub count: usize,
    /// Bytes in the file.
    pub bytes: u64,
    /// Tensors per ggml type.
    pub types: BTreeMap<String, usize>,
}

/// Tensors and bytes of one route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RouteCensus {
    /// Tensors.
    pub count: usize,
    /// Bytes in the file.
    pub bytes: u64,
}

/// What the file holds, per role and route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Census {
    /// Per role (`attn_qkv`, `ffn_down_exps`, ...).
    pub roles: BTreeMap<String, RoleCensus>,
    /// Per route (`dense`, `expert_stack`, `lazy_table`).
    pub routes: BTreeMap<String, RouteCensus>,
    /// Claimed tensors.
    pub claimed_tensors: usize,
    /// Their bytes.
    pub claimed_bytes: u64,
    /// Tensors dropped by name.
    pub dropped: Vec<DroppedTensor>,
    /// Every tensor of the file.
    pub file_tensors: usize,
    /// The bytes of every tensor of the file.
    pub file_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, ty: GgmlType, dims: &[u64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            ggml_type: ty,
            dims: dims.to_vec(),
            offset: 0,
            n_bytes: 4 * dims.iter().product::<u64>(),
            split: 0,
        }
    }

    fn manifest(file: &[TensorInfo]) -> Manifest {
        let mut b = ManifestBuilder::new("fam", file);
        b.global(
            "token_embd",
            Dims::Exact(vec![4, 8]),
            TypeClass::Any,
            Route::Dense,
        );
        for l in 0..2 {
            b.layer(
                l,
                "attn_norm.weight",
                "attn_norm",
                Dims::Exact(vec![4]),
                TypeClass::F32,
            );
            b.stack(l, "ffn_down_exps.weight", "ffn_down_exps", &[4, 4, 2]);
        }
        b.optional(
            "output.weight",
            "output",
            None,
            Dims::Exact(vec![4, 8]),
            TypeClass::Any,
            Route::Dense,
        );
        b.drop_when("blk.{2..}.*", "MTP", |n| n.starts_with("blk.2."));
        b.refuse("mm.patch", "published broken");
        b.build()
    }

    fn good() -> Vec<TensorInfo> {
        let mut t = vec![info("token_embd.weight", GgmlType::F32, &[4, 8])];
        for l in 0..2 {
            t.push(info(
                &format!("blk.{l}.attn_norm.weight"),
                GgmlType::F32,
                &[4],
            ));
            t.push(info(
                &format!("blk.{l}.ffn_down_exps.weight"),
                GgmlType::Q8_0,
                &[4, 4, 2],
            ));
        }
        t
    }

    #[track_caller]
    fn check(file: Vec<TensorInfo>, expect: &str) {
        let got = match manifest(&file).check(&file) {
            Ok(d) => format!(
                "ok, dropped {:?}",
                d.iter().map(|d| &d.name).collect::<Vec<_>>()
            ),
            Err(e) => e.to_string(),
        };
        assert!(got.contains(expect), "{got:?} does not contain {expect:?}");
    }

    #[test]
    fn both_ways_by_name() {
        check(good(), "ok, dropped []");
        let mut f = good();
        f.push(info("blk.2.nextn.weight", GgmlType::F32, &[4]));
        check(f, "ok, dropped [\"blk.2.nextn.weight\"]");
        let mut f = good();
        f.push(info("output.weight", GgmlType::F32, &[4, 8]));
        check(f, "ok, dropped []");
        let mut f = good();
        f.remove(1);
        check(
            f,
            "\"blk.0.attn_norm.weight\" is required by the fam manifest but absent",
        );
        let mut f = good();
        f.push(info("blk.1.surplus", GgmlType::F32, &[4]));
        check(f, "\"blk.1.surplus\" is in the file but neither claimed");
        let mut f = good();
        f[2].dims = vec![4, 4, 3];
        check(f, "\"blk.0.ffn_down_exps.weight\" has dims [4, 4, 3]");
        let mut f = good();
        f[1].ggml_type = GgmlType::F16;
        check(f, "\"blk.0.attn_norm.weight\" is F16, expected F32");
        let mut f = good();
        f.push(info("mm.patch", GgmlType::F32, &[4]));
        check(f, "\"mm.patch\": published broken");
    }

    #[test]
    fn handles_index_the_claimed_tensors_and_the_census_adds_up() {
        let file = good();
        let m = manifest(&file);
        let h = m.handle("blk.1.ffn_down_exps.weight").unwrap();
        assert_eq!(m.tensors[h.0].route, Route::ExpertStack);
        assert_eq!(m.tensors[h.0].layer, Some(1));
        assert!(m.handle("output.weight").is_none());
        let c = m.census(&file);
        assert_eq!(c.claimed_tensors, 5);
        assert_eq!(c.routes["expert_stack"].count, 2);
        assert_eq!(c.roles["attn_norm"].count, 2);
        assert_eq!(m.drop_rules(), vec!["blk.{2..}.*: MTP".to_owned()]);
    }
}
