//! The load's knobs, resolved once per load: environment, then the config
//! file, then the device-aware default (the brief's prefault policy; the
//! same precedence for every knob).
//!
//! Unknown config keys and unparsable values are errors naming the key (a
//! typo there once cost a machine its memory). [`LoadPolicy::summary_line`]
//! names each resolved value and where it came from.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::platform::{Backend, DeviceId, Platform, ResidencyPolicy, StageCounters};
use crate::ring::StagingRing;

/// Where a resolved value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// An environment variable.
    Env(&'static str),
    /// A key of the config file.
    Config(&'static str),
    /// The device-aware default (what the platform's device calls for).
    DeviceDefault,
    /// The built-in default.
    BuiltIn,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Env(var) => write!(f, "env {var}"),
            Source::Config(key) => write!(f, "config {key}"),
            Source::DeviceDefault => f.write_str("device default"),
            Source::BuiltIn => f.write_str("built-in default"),
        }
    }
}

/// A resolved knob: its value and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved<T> {
    /// The value.
    pub value: T,
    /// Its source.
    pub source: Source,
}

/// A knob's names: its environment variable and its config key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knob {
    /// The environment variable.
    pub env: &'static str,
    /// The config file key.
    pub key: &'static str,
}

/// Map files without copying (off: read tensors into owned buffers).
pub const MMAP: Knob = Knob {
    env: "VT_GGUF_MMAP",
    key: "vllm_cpp.mmap.enabled",
};
/// Prefault the mapping (MAP_POPULATE + WILLNEED).
pub const PREFAULT: Knob = Knob {
    env: "VT_GGUF_PREFAULT",
    key: "vllm_cpp.mmap.prefault",
};
/// Give owned host copies back after upload.
pub const RELEASE_HOST_WEIGHTS: Knob = Knob {
    env: "VT_RELEASE_HOST_WEIGHTS",
    key: "vllm_cpp.release_host_weights",
};
/// Drop the page cache of released borrows (posix_fadvise DONTNEED).
pub const DROP_PAGE_CACHE: Knob = Knob {
    env: "VT_GGUF_DROP_PAGE_CACHE",
    key: "vllm_cpp.mmap.drop_page_cache",
};

/// Every knob, in the order the summary line prints them.
pub const KNOBS: &[Knob] = &[MMAP, PREFAULT, RELEASE_HOST_WEIGHTS, DROP_PAGE_CACHE];

/// An error resolving the load policy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// A config key no knob has.
    #[error("{}: unknown config key {key:?} (known: {known})", file.display())]
    UnknownKey {
        /// The config file.
        file: PathBuf,
        /// The key.
        key: String,
        /// The known keys.
        known: String,
    },
    /// A value that does not parse.
    #[error("{source_name}: cannot read {value:?} as {expected}")]
    BadValue {
        /// The variable or key.
        source_name: String,
        /// The value as found.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The config file cannot be read or is not a JSON object.
    #[error("{}: {message}", file.display())]
    BadFile {
        /// The config file.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The knobs of a config file (`--config FILE`), flattened to dotted keys.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyConfig {
    file: PathBuf,
    values: BTreeMap<String, serde_json::Value>,
}

/// A JSON value whose objects never repeat a key: serde_json keeps the last
/// of two equal keys silently, and a config whose second `prefault` undoes
/// the first is a mistake to point at, not to guess about.
struct StrictJson(serde_json::Value);

impl<'de> serde::Deserialize<'de> for StrictJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = StrictJson;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<StrictJson, E> {
                Ok(StrictJson(v.into()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<StrictJson, E> {
                Ok(StrictJson(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<StrictJson, E> {
                Ok(StrictJson(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<StrictJson, E> {
                Ok(StrictJson(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<StrictJson, E> {
                Ok(StrictJson(v.into()))
            }
            fn visit_string<E>(self, v: String) -> Result<StrictJson, E> {
                Ok(StrictJson(v.into()))
            }
            fn visit_unit<E>(self) -> Result<StrictJson, E> {
                Ok(StrictJson(serde_json::Value::Null))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<StrictJson, A::Error> {
                let mut out = Vec::new();
                while let Some(StrictJson(v)) = seq.next_element()? {
                    out.push(v);
                }
                Ok(StrictJson(out.into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StrictJson, A::Error> {
                let mut out = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    let StrictJson(v) = map.next_value()?;
                    if out.contains_key(&key) {
                        return Err(serde::de::Error::custom(format_args!(
                            "duplicate key {key:?}"
                        )));
                    }
                    out.insert(key, v);
                }
                Ok(StrictJson(out.into()))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// Flattens nested objects to dotted keys; the same dotted key reached two
/// ways (`{"a.b": 1, "a": {"b": 2}}`) is an error naming it.
fn flatten(
    prefix: &str,
    v: &serde_json::Value,
    out: &mut BTreeMap<String, serde_json::Value>,
) -> Result<(), String> {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out)?;
            }
            Ok(())
        }
        other => match out.insert(prefix.to_owned(), other.clone()) {
            None => Ok(()),
            Some(_) => Err(format!("key {prefix:?} is given twice")),
        },
    }
}

impl PolicyConfig {
    /// Parses a JSON config: nested objects (`{"vllm_cpp": {"mmap":
    /// {"prefault": true}}}`) or dotted keys (`{"vllm_cpp.mmap.prefault":
    /// true}`). Every key must name a knob in `knobs`.
    ///
    /// # Errors
    ///
    /// Not a JSON object, a key given twice (literally, or once dotted and
    /// once nested), or a key no knob has.
    pub fn parse(file: &Path, text: &str, knobs: &[Knob]) -> Result<PolicyConfig, PolicyError> {
        let bad = |message: String| PolicyError::BadFile {
            file: file.to_path_buf(),
            message,
        };
        let StrictJson(json) = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if !json.is_object() {
            return Err(bad("the config must be a JSON object".into()));
        }
        let mut values = BTreeMap::new();
        flatten("", &json, &mut values).map_err(bad)?;
        if let Some(key) = values
            .keys()
            .find(|k| !knobs.iter().any(|n| n.key == k.as_str()))
        {
            return Err(PolicyError::UnknownKey {
                file: file.to_path_buf(),
                key: key.clone(),
                known: knobs.iter().map(|k| k.key).collect::<Vec<_>>().join(", "),
            });
        }
        Ok(PolicyConfig {
            file: file.to_path_buf(),
            values,
        })
    }

    /// How errors name `key` of this file: `FILE: config key KEY`.
    pub fn describe(&self, key: &str) -> String {
        format!("{}: config key {key}", crate::text::path_safe(&self.file))
    }

    /// Reads and parses a config file.
    ///
    /// # Errors
    ///
    /// As [`PolicyConfig::parse`], or the file cannot be read.
    pub fn from_file(file: &Path, knobs: &[Knob]) -> Result<PolicyConfig, PolicyError> {
        let text = std::fs::read_to_string(file).map_err(|e| PolicyError::BadFile {
            file: file.to_path_buf(),
            message: e.to_string(),
        })?;
        PolicyConfig::parse(file, &text, knobs)
    }
}

/// A knob value readable from an environment string and a JSON value.
pub trait KnobValue: Sized + Clone + fmt::Display {
    /// What a valid value looks like, for errors.
    const EXPECTED: &'static str;
    /// Parses an environment variable's text.
    fn from_env(text: &str) -> Option<Self>;
    /// Reads a config value.
    fn from_json(value: &serde_json::Value) -> Option<Self>;
}

/// A boolean knob, printed `on`/`off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Switch(pub bool);

impl fmt::Display for Switch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0 { "on" } else { "off" })
    }
}

impl KnobValue for Switch {
    const EXPECTED: &'static str = "a switch (1/0, true/false, on/off, yes/no)";
    fn from_env(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Some(Switch(true)),
            "0" | "false" | "off" | "no" => Some(Switch(false)),
            _ => None,
        }
    }
    fn from_json(value: &serde_json::Value) -> Option<Self> {
        match value {
            serde_json::Value::Bool(b) => Some(Switch(*b)),
            // 1/0 as the error message promises, in JSON as in the env.
            serde_json::Value::Number(n) => match n.as_u64() {
                Some(1) => Some(Switch(true)),
                Some(0) => Some(Switch(false)),
                _ => None,
            },
            serde_json::Value::String(s) => Switch::from_env(s),
            _ => None,
        }
    }
}

impl KnobValue for u64 {
    const EXPECTED: &'static str = "a non-negative integer";
    fn from_env(text: &str) -> Option<Self> {
        text.trim().parse().ok()
    }
    /// A JSON number only: `"64"` is a string, and a config that quotes a
    /// number is refused rather than read as the number it might mean.
    fn from_json(value: &serde_json::Value) -> Option<Self> {
        value.as_u64()
    }
}

/// How errors name where a resolved value of `knob` came from: its
/// environment variable, or the config file and key.
pub fn source_name(knob: Knob, source: &Source, config: Option<&PolicyConfig>) -> String {
    match (source, config) {
        (Source::Env(var), _) => (*var).to_owned(),
        (Source::Config(key), Some(c)) => c.describe(key),
        (Source::Config(key), None) => (*key).to_owned(),
        _ => format!("{} (or {})", knob.env, knob.key),
    }
}

/// Resolves one knob: the environment wins, then the config file, then
/// `default` (with its source).
///
/// # Errors
///
/// The environment or config value does not parse.
pub fn resolve_knob<T: KnobValue>(
    knob: Knob,
    env: &dyn Fn(&str) -> Option<String>,
    config: Option<&PolicyConfig>,
    default: Resolved<T>,
) -> Result<Resolved<T>, PolicyError> {
    if let Some(text) = env(knob.env) {
        let value = T::from_env(&text).ok_or_else(|| PolicyError::BadValue {
            source_name: knob.env.to_owned(),
            value: text.clone(),
            expected: T::EXPECTED,
        })?;
        return Ok(Resolved {
            value,
            source: Source::Env(knob.env),
        });
    }
    if let Some(json) = config.and_then(|c| c.values.get(knob.key)) {
        let value = T::from_json(json).ok_or_else(|| PolicyError::BadValue {
            source_name: config.map_or_else(|| knob.key.to_owned(), |c| c.describe(knob.key)),
            value: json.to_string(),
            expected: T::EXPECTED,
        })?;
        return Ok(Resolved {
            value,
            source: Source::Config(knob.key),
        });
    }
    Ok(default)
}

/// The prefault default for a device: ON where kernels read host memory
/// directly (the CPU, host-addressable devices: faults move off the first
/// forward step), OFF where the device cannot read host memory (staging
/// reads every page exactly once anyway).
pub fn prefault_for_device(platform: &dyn Platform) -> bool {
    !platform.needs_weight_staging() || platform.host_memory_is_device_addressable()
}

/// The resolved knobs of one load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadPolicy {
    /// Map the file (else read tensors into owned buffers).
    pub mmap: Resolved<Switch>,
    /// Prefault the mapping.
    pub prefault: Resolved<Switch>,
    /// Give owned host copies back after upload.
    pub release_host_weights: Resolved<Switch>,
    /// Drop the page cache of released borrows.
    pub drop_page_cache: Resolved<Switch>,
}

impl LoadPolicy {
    /// Resolves every knob for a load onto `platform`, reading the
    /// environment through `env` (`std::env::var(..).ok()` in binaries; a
    /// map in tests).
    ///
    /// # Errors
    ///
    /// A value does not parse.
    pub fn resolve(
        env: &dyn Fn(&str) -> Option<String>,
        config: Option<&PolicyConfig>,
        platform: &dyn Platform,
    ) -> Result<LoadPolicy, PolicyError> {
        let device = |value: bool| Resolved {
            value: Switch(value),
            source: Source::DeviceDefault,
        };
        let platform_policy = platform.residency_policy();
        Ok(LoadPolicy {
            mmap: resolve_knob(
                MMAP,
                env,
                config,
                Resolved {
                    value: Switch(true),
                    source: Source::BuiltIn,
                },
            )?,
            prefault: resolve_knob(PREFAULT, env, config, device(prefault_for_device(platform)))?,
            release_host_weights: resolve_knob(
                RELEASE_HOST_WEIGHTS,
                env,
                config,
                device(platform_policy.release_host_weights_after_upload),
            )?,
            drop_page_cache: resolve_knob(
                DROP_PAGE_CACHE,
                env,
                config,
                device(platform_policy.drop_page_cache),
            )?,
        })
    }

    /// The residency policy these knobs give.
    pub fn residency_policy(&self) -> ResidencyPolicy {
        ResidencyPolicy {
            release_host_weights_after_upload: self.release_host_weights.value.0,
            drop_page_cache: self.drop_page_cache.value.0,
        }
    }

    /// One line naming each value and where it came from.
    pub fn summary_line(&self) -> String {
        let item = |name: &str, r: &Resolved<Switch>| format!("{name}={} ({})", r.value, r.source);
        format!(
            "policy: {}, {}, {}, {}",
            item("mmap", &self.mmap),
            item("prefault", &self.prefault),
            item("release_host_weights", &self.release_host_weights),
            item("drop_page_cache", &self.drop_page_cache),
        )
    }
}

/// A platform with a load's residency policy applied: delegates everything
/// to the platform it wraps except [`Platform::residency_policy`].
pub struct WithPolicy<'p> {
    platform: &'p dyn Platform,
    policy: ResidencyPolicy,
    ring: Option<StagingRing>,
}

impl<'p> WithPolicy<'p> {
    /// `platform` with `policy`.
    pub fn new(platform: &'p dyn Platform, policy: ResidencyPolicy) -> WithPolicy<'p> {
        WithPolicy {
            platform,
            policy,
            ring: None,
        }
    }

    /// The same, with large copies going through `ring`.
    pub fn with_ring(mut self, ring: StagingRing) -> WithPolicy<'p> {
        self.ring = Some(ring);
        self
    }
}

impl Platform for WithPolicy<'_> {
    fn backend(&self) -> &dyn Backend {
        self.platform.backend()
    }
    fn device_id(&self) -> DeviceId {
        self.platform.device_id()
    }
    fn needs_weight_staging(&self) -> bool {
        self.platform.needs_weight_staging()
    }
    fn host_memory_is_device_addressable(&self) -> bool {
        self.platform.host_memory_is_device_addressable()
    }
    fn residency_policy(&self) -> ResidencyPolicy {
        self.policy
    }
    fn stage_counters(&self) -> &StageCounters {
        self.platform.stage_counters()
    }
    fn staging_ring(&self) -> Option<&StagingRing> {
        self.ring.as_ref()
    }
}
