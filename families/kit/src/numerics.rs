//! How a decoder computes where llama.cpp gives its user a choice: the
//! element types of the attention caches and flash attention (its context
//! parameters `type_k`, `type_v`, `flash_attn_type`). Every family's
//! decoder takes one [`Numerics`]; the defaults are llama.cpp's and
//! llama-cpp-python's own (an F16 cache, the non-flash path), so the
//! logits are what people running llama.cpp on the same file get.

pub use family_ops::CacheType;
use seam::policy::{Knob, KnobValue, PolicyError, Resolved, Source, Switch, resolve_knob};

/// The K cache's element type ([`CacheType`]); the flag is
/// `--cache-type-k`. Family binaries read no config file: the key names
/// the knob for an engine's.
pub const CACHE_TYPE_K: Knob = Knob {
    env: "VT_CACHE_TYPE_K",
    key: "vllm_cpp.cache.type_k",
};
/// The V cache's element type; the flag is `--cache-type-v`.
pub const CACHE_TYPE_V: Knob = Knob {
    env: "VT_CACHE_TYPE_V",
    key: "vllm_cpp.cache.type_v",
};
/// Flash attention (a switch); the flag is `--flash-attn on|off`.
pub const FLASH_ATTN: Knob = Knob {
    env: "VT_FLASH_ATTN",
    key: "vllm_cpp.attention.flash",
};

/// The choices of one decoder ([`CacheType`] of K and V, flash attention).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Numerics {
    /// The K cache's element type (and every cache llama.cpp keeps as K:
    /// MLA's latent, the indexer's keys).
    pub cache_type_k: CacheType,
    /// The V cache's element type.
    pub cache_type_v: CacheType,
    /// llama.cpp's flash attention (its CPU arithmetic: Q rounded to F16,
    /// an online softmax) instead of the two products and a softmax.
    pub flash_attn: bool,
}

impl Numerics {
    /// Both caches in f32, no flash attention: the setting of the goldens
    /// written before the cache became a knob.
    pub const F32_CACHE: Numerics = Numerics {
        cache_type_k: CacheType::F32,
        cache_type_v: CacheType::F32,
        flash_attn: false,
    };

    /// Both caches in f16 (llama.cpp's default), no flash attention.
    pub const F16_CACHE: Numerics = Numerics {
        cache_type_k: CacheType::F16,
        cache_type_v: CacheType::F16,
        flash_attn: false,
    };
}

/// Refuses flash attention in a pass that does not compute it (the
/// non-flash path is llama.cpp's default).
///
/// # Errors
///
/// `numerics.flash_attn` is set; the error names the family.
pub fn refuse_flash_attn(family: &str, numerics: Numerics) -> Result<(), crate::LoadError> {
    if numerics.flash_attn {
        return Err(crate::LoadError::Forward(format!(
            "{family} has no flash attention (the non-flash path is llama.cpp's default; leave --flash-attn off)"
        )));
    }
    Ok(())
}

/// What the command line said of the numerics (`None`: not given).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NumericsFlags {
    /// `--cache-type-k`.
    pub cache_type_k: Option<CacheType>,
    /// `--cache-type-v`.
    pub cache_type_v: Option<CacheType>,
    /// `--flash-attn`.
    pub flash_attn: Option<bool>,
}

/// The numerics of a run, each with where it came from: a flag, then the
/// environment, then llama.cpp's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedNumerics {
    /// [`CACHE_TYPE_K`].
    pub cache_type_k: Resolved<CacheType>,
    /// [`CACHE_TYPE_V`].
    pub cache_type_v: Resolved<CacheType>,
    /// [`FLASH_ATTN`].
    pub flash_attn: Resolved<Switch>,
}

impl ResolvedNumerics {
    /// Resolves each knob: the flag where given, else the environment
    /// (read through `env`), else [`Numerics::default`] (llama.cpp's).
    ///
    /// # Errors
    ///
    /// An environment variable's value does not parse (the error names
    /// it).
    pub fn resolve(
        flags: NumericsFlags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ResolvedNumerics, PolicyError> {
        let d = Numerics::default();
        fn pick<T: KnobValue>(
            flag: Option<T>,
            name: &'static str,
            knob: Knob,
            env: &dyn Fn(&str) -> Option<String>,
            default: T,
        ) -> Result<Resolved<T>, PolicyError> {
            match flag {
                Some(value) => Ok(Resolved {
                    value,
                    source: Source::Flag(name),
                }),
                None => resolve_knob(
                    knob,
                    env,
                    None,
                    Resolved {
                        value: default,
                        source: Source::BuiltIn,
                    },
                ),
            }
        }
        Ok(ResolvedNumerics {
            cache_type_k: pick(
                flags.cache_type_k,
                "--cache-type-k",
                CACHE_TYPE_K,
                env,
                d.cache_type_k,
            )?,
            cache_type_v: pick(
                flags.cache_type_v,
                "--cache-type-v",
                CACHE_TYPE_V,
                env,
                d.cache_type_v,
            )?,
            flash_attn: pick(
                flags.flash_attn.map(Switch),
                "--flash-attn",
                FLASH_ATTN,
                env,
                Switch(d.flash_attn),
            )?,
        })
    }

    /// The values alone.
    pub fn numerics(&self) -> Numerics {
        Numerics {
            cache_type_k: self.cache_type_k.value,
            cache_type_v: self.cache_type_v.value,
            flash_attn: self.flash_attn.value.0,
        }
    }

    /// Each value and its source, as the policy line names the load's
    /// knobs: `cache_type_k=f16 (built-in default) ...`.
    pub fn summary_line(&self) -> String {
        format!(
            "cache_type_k={} ({}) cache_type_v={} ({}) flash_attn={} ({})",
            self.cache_type_k.value,
            self.cache_type_k.source,
            self.cache_type_v.value,
            self.cache_type_v.source,
            self.flash_attn.value,
            self.flash_attn.source
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    /// A flag wins over the environment, which wins over llama.cpp's
    /// default; each source is named, and a bad value names its variable.
    #[test]
    fn llama_cpps_defaults() {
        assert_eq!(Numerics::default().cache_type_k, CacheType::F16);
        assert_eq!(Numerics::default().cache_type_v, CacheType::F16);
        assert!(!Numerics::default().flash_attn);
    }

    #[test]
    fn numerics_resolve_flag_then_env_then_default_and_name_their_source() {
        let none = ResolvedNumerics::resolve(NumericsFlags::default(), &env_of(&[])).unwrap();
        assert_eq!(none.numerics(), Numerics::default());
        assert_eq!(
            none.summary_line(),
            "cache_type_k=f16 (built-in default) cache_type_v=f16 (built-in default) flash_attn=off (built-in default)"
        );
        let env = env_of(&[
            ("VT_CACHE_TYPE_K", "f32"),
            ("VT_CACHE_TYPE_V", "bf16"),
            ("VT_FLASH_ATTN", "on"),
        ]);
        let from_env = ResolvedNumerics::resolve(NumericsFlags::default(), &env).unwrap();
        assert_eq!(from_env.cache_type_k.value, CacheType::F32);
        assert_eq!(from_env.cache_type_k.source, Source::Env("VT_CACHE_TYPE_K"));
        assert_eq!(from_env.cache_type_v.value, CacheType::Bf16);
        assert!(from_env.flash_attn.value.0);
        let flags = NumericsFlags {
            cache_type_k: Some(CacheType::F16),
            cache_type_v: Some(CacheType::F32),
            flash_attn: Some(false),
        };
        let flagged = ResolvedNumerics::resolve(flags, &env).unwrap();
        assert_eq!(
            flagged.numerics(),
            Numerics {
                cache_type_k: CacheType::F16,
                cache_type_v: CacheType::F32,
                flash_attn: false
            }
        );
        assert_eq!(
            flagged.summary_line(),
            "cache_type_k=f16 (flag --cache-type-k) cache_type_v=f32 (flag --cache-type-v) flash_attn=off (flag --flash-attn)"
        );
        let bad = ResolvedNumerics::resolve(
            NumericsFlags::default(),
            &env_of(&[("VT_CACHE_TYPE_V", "q8")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            bad.contains("VT_CACHE_TYPE_V") && bad.contains("\"q8\""),
            "{bad}"
        );
    }
}
