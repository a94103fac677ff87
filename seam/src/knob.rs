//! Knobs: a value resolved from the environment, then a config file, then
//! a default, with where it came from. The load's knobs
//! ([`policy`](crate::policy)) and the ring's ([`ring`](crate::ring)) are
//! both resolved here; this module depends on no other of the seam's.
//!
//! Unknown config keys and unparsable values are errors naming the key (a
//! typo there once cost a machine its memory).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where a resolved value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag: the most explicit answer, read before the
    /// environment by the commands that offer one.
    Flag(&'static str),
    /// An environment variable.
    Env(&'static str),
    /// A key of the config file.
    Config(&'static str),
    /// The device-aware default (what the platform's device calls for).
    DeviceDefault,
    /// The device-aware default, sized by what this load is and what the
    /// host has (the page-cache default: why it was chosen).
    DeviceDefaultBecause(String),
    /// The built-in default.
    BuiltIn,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag(flag) => write!(f, "flag {flag}"),
            Source::Env(var) => write!(f, "env {var}"),
            Source::Config(key) => write!(f, "config {key}"),
            Source::DeviceDefault => f.write_str("device default"),
            Source::DeviceDefaultBecause(why) => write!(f, "device default: {why}"),
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

/// How errors name where a resolved value of `knob` came from: its flag
/// or environment variable, or the config file and key.
pub fn source_name(knob: Knob, source: &Source, config: Option<&PolicyConfig>) -> String {
    match (source, config) {
        (Source::Flag(name) | Source::Env(name), _) => (*name).to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;

    const KNOB: Knob = Knob {
        env: "VT_TEST_KNOB",
        key: "test.knob",
    };

    /// An error names where its value came from: the variable, the config
    /// file and key, the bare key without a file, else both names.
    #[test]
    fn source_name_names_each_origin() {
        let config = PolicyConfig::parse(Path::new("/etc/seam.json"), "{}", &[KNOB]).unwrap();
        let env = Source::Env("VT_FROM_ENV");
        let key = Source::Config("from.config");
        assert_eq!(source_name(KNOB, &env, Some(&config)), "VT_FROM_ENV");
        assert_eq!(source_name(KNOB, &env, None), "VT_FROM_ENV");
        let flag = Source::Flag("--from-flag");
        assert_eq!(source_name(KNOB, &flag, Some(&config)), "--from-flag");
        assert_eq!(flag.to_string(), "flag --from-flag");
        assert_eq!(
            source_name(KNOB, &key, Some(&config)),
            "/etc/seam.json: config key from.config"
        );
        assert_eq!(source_name(KNOB, &key, None), "from.config");
        let sized = Source::DeviceDefaultBecause("1.0 GiB fits".into());
        assert_eq!(sized.to_string(), "device default: 1.0 GiB fits");
        assert_eq!(Source::DeviceDefault.to_string(), "device default");
        for other in [Source::DeviceDefault, sized, Source::BuiltIn] {
            assert_eq!(
                source_name(KNOB, &other, Some(&config)),
                "VT_TEST_KNOB (or test.knob)"
            );
        }
    }

    /// What a config value that is no JSON value is refused as says what
    /// was expected (serde_json itself never hands over bytes; another
    /// deserializer can).
    #[test]
    fn strict_json_says_what_it_expects() {
        use serde::Deserialize;
        use serde::de::value::{BytesDeserializer, Error};
        let refused = StrictJson::deserialize(BytesDeserializer::<Error>::new(b"x"))
            .err()
            .unwrap();
        assert!(
            refused.to_string().contains("expected a JSON value"),
            "{refused}"
        );
    }
}
