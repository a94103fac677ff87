//! The load's knobs: env > config file > device default for every knob in
//! `KNOBS`, both config forms, errors that name the key or variable, the
//! summary line, the prefault default per device, and `WithPolicy`.
//!
//! The environment is a closure over a map: no test sets a real variable.

use std::collections::HashMap;
use std::path::Path;

use platform_fake::{FakeConfig, FakePlatform};
use platform_host::HostPlatform;
use seam::platform::{Backend, Platform, ResidencyPolicy};
use seam::policy::{
    DROP_PAGE_CACHE, KNOBS, Knob, KnobValue, LoadPolicy, MMAP, PREFAULT, PolicyConfig, PolicyError,
    RELEASE_HOST_WEIGHTS, Resolved, Source, Switch, WithPolicy, prefault_for_device, resolve_knob,
};
use seam::weight::{Role, Weight};
use seam::{Resident, resident_weight};

const FILE: &str = "/etc/seam/load.json";

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn config(json: serde_json::Value) -> PolicyConfig {
    PolicyConfig::parse(Path::new(FILE), &json.to_string(), KNOBS).unwrap()
}

/// The same key in both config forms: `{"a": {"b": {"c": v}}}` and
/// `{"a.b.c": v}`.
fn both_forms(key: &str, value: serde_json::Value) -> [PolicyConfig; 2] {
    let nested = key
        .rsplit('.')
        .fold(value.clone(), |v, part| serde_json::json!({ part: v }));
    [config(nested), config(serde_json::json!({ key: value }))]
}

/// The resolved value of `knob` (every knob in `KNOBS` must be here).
fn field(policy: &LoadPolicy, knob: Knob) -> &Resolved<Switch> {
    match knob {
        MMAP => &policy.mmap,
        PREFAULT => &policy.prefault,
        RELEASE_HOST_WEIGHTS => &policy.release_host_weights,
        DROP_PAGE_CACHE => &policy.drop_page_cache,
        other => panic!("{other:?} is in KNOBS but not in LoadPolicy: add it here and there"),
    }
}

fn resolved(value: bool, source: Source) -> Resolved<Switch> {
    Resolved {
        value: Switch(value),
        source,
    }
}

/// What `knob` resolves to with no env and no config on `platform`.
fn default_of(knob: Knob, platform: &dyn Platform) -> Resolved<Switch> {
    let policy = platform.residency_policy();
    match knob {
        MMAP => resolved(true, Source::BuiltIn),
        PREFAULT => resolved(prefault_for_device(platform), Source::DeviceDefault),
        RELEASE_HOST_WEIGHTS => resolved(
            policy.release_host_weights_after_upload,
            Source::DeviceDefault,
        ),
        DROP_PAGE_CACHE => resolved(policy.drop_page_cache, Source::DeviceDefault),
        other => panic!("no default known for {other:?}"),
    }
}

/// Resolves with `env` and `config` on `platform` and checks that `knob`
/// came out as `expected` and every other knob as its default.
#[track_caller]
fn check(
    knob: Knob,
    env: &dyn Fn(&str) -> Option<String>,
    config: Option<&PolicyConfig>,
    platform: &dyn Platform,
    expected: Resolved<Switch>,
) {
    let policy = LoadPolicy::resolve(env, config, platform).unwrap();
    for &k in KNOBS {
        let want = if k == knob {
            expected.clone()
        } else {
            default_of(k, platform)
        };
        assert_eq!(
            field(&policy, k),
            &want,
            "{} (resolving {})",
            k.env,
            knob.env
        );
    }
}

fn fake_with_policy(release: bool, drop_page_cache: bool) -> FakePlatform {
    FakePlatform::new(FakeConfig {
        policy: ResidencyPolicy {
            release_host_weights_after_upload: release,
            drop_page_cache,
        },
        ..FakeConfig::default()
    })
}

/// Platforms whose defaults differ for every knob that has a device default.
fn platforms() -> Vec<Box<dyn Platform>> {
    vec![
        Box::new(fake_with_policy(true, true)),
        Box::new(fake_with_policy(false, false)),
        Box::new(fake_with_policy(true, false)),
        Box::new(HostPlatform::new()),
    ]
}

#[test]
fn every_knob_env_beats_config_beats_device_default() {
    for platform in platforms() {
        let platform = &*platform;
        for &knob in KNOBS {
            let default = default_of(knob, platform);
            check(knob, &no_env, None, platform, default.clone());
            check(
                knob,
                &no_env,
                Some(&PolicyConfig::default()),
                platform,
                default.clone(),
            );
            for value in [true, false] {
                let text = if value { "on" } else { "off" };
                let env = env_of(&[(knob.env, text)]);
                check(
                    knob,
                    &env,
                    None,
                    platform,
                    resolved(value, Source::Env(knob.env)),
                );
                for config in both_forms(knob.key, serde_json::json!(value)) {
                    check(
                        knob,
                        &no_env,
                        Some(&config),
                        platform,
                        resolved(value, Source::Config(knob.key)),
                    );
                    check(
                        knob,
                        &env,
                        Some(&config),
                        platform,
                        resolved(value, Source::Env(knob.env)),
                    );
                }
                for config in both_forms(knob.key, serde_json::json!(!value)) {
                    check(
                        knob,
                        &env,
                        Some(&config),
                        platform,
                        resolved(value, Source::Env(knob.env)),
                    );
                }
            }
        }
    }
}

/// Each knob reads only its own variable and key.
#[test]
fn knobs_have_distinct_names() {
    for (i, a) in KNOBS.iter().enumerate() {
        for b in &KNOBS[i + 1..] {
            assert!(a.env != b.env && a.key != b.key, "{a:?} and {b:?}");
        }
    }
    assert_eq!(PREFAULT.env, "VT_GGUF_PREFAULT");
    assert_eq!(PREFAULT.key, "vllm_cpp.mmap.prefault");
}

#[test]
fn config_forms_nested_dotted_and_mixed_read_alike() {
    let fake = fake_with_policy(true, true);
    let forms = [
        serde_json::json!({"vllm_cpp": {"mmap": {"prefault": true, "enabled": false}}}),
        serde_json::json!({"vllm_cpp.mmap.prefault": true, "vllm_cpp.mmap.enabled": false}),
        serde_json::json!({"vllm_cpp": {"mmap.prefault": true}, "vllm_cpp.mmap": {"enabled": false}}),
    ];
    for json in forms {
        let p = LoadPolicy::resolve(&no_env, Some(&config(json.clone())), &fake).unwrap();
        assert_eq!(
            p.prefault,
            resolved(true, Source::Config("vllm_cpp.mmap.prefault")),
            "{json}"
        );
        assert_eq!(
            p.mmap,
            resolved(false, Source::Config("vllm_cpp.mmap.enabled")),
            "{json}"
        );
    }
}

#[test]
fn unknown_config_keys_are_errors_naming_the_key() {
    let known = KNOBS.iter().map(|k| k.key).collect::<Vec<_>>().join(", ");
    let cases = [
        (
            serde_json::json!({"vllm_cpp": {"mmap": {"prefech": true}}}),
            "vllm_cpp.mmap.prefech",
        ),
        (
            serde_json::json!({"vllm_cpp.mmap.prefech": true}),
            "vllm_cpp.mmap.prefech",
        ),
        (
            serde_json::json!({"vllm_cpp.mmap.prefault": true, "mmap": false}),
            "mmap",
        ),
        (
            serde_json::json!({"vllm_cpp.mmap.prefault": {"on": true}}),
            "vllm_cpp.mmap.prefault.on",
        ),
    ];
    for (json, key) in cases {
        let err = PolicyConfig::parse(Path::new(FILE), &json.to_string(), KNOBS).unwrap_err();
        assert_eq!(
            err,
            PolicyError::UnknownKey {
                file: FILE.into(),
                key: key.into(),
                known: known.clone(),
            },
            "{json}"
        );
        let message = err.to_string();
        assert!(
            message.starts_with(FILE) && message.contains(&format!("{key:?}")),
            "{message}"
        );
    }
}

#[test]
fn a_config_that_is_not_a_json_object_is_an_error_naming_the_file() {
    for text in [
        "[1, 2]",
        "true",
        "\"vllm_cpp.mmap.prefault\"",
        "{\"vllm_cpp\": ",
        "",
    ] {
        match PolicyConfig::parse(Path::new(FILE), text, KNOBS) {
            Err(e @ PolicyError::BadFile { .. }) => assert!(e.to_string().starts_with(FILE), "{e}"),
            other => panic!("{text:?}: {other:?}"),
        }
    }
    let empty = PolicyConfig::parse(Path::new(FILE), "{}", KNOBS).unwrap();
    assert_eq!(empty.describe("k"), format!("{FILE}: config key k"));
}

#[test]
fn config_files_are_read_or_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("load.json");
    std::fs::write(&path, r#"{"vllm_cpp": {"release_host_weights": "off"}}"#).unwrap();
    let config = PolicyConfig::from_file(&path, KNOBS).unwrap();
    let p = LoadPolicy::resolve(&no_env, Some(&config), &fake_with_policy(true, true)).unwrap();
    assert_eq!(
        p.release_host_weights,
        resolved(false, Source::Config("vllm_cpp.release_host_weights"))
    );

    std::fs::write(&path, r#"{"vllm_cpp": {"release_host_weight": "off"}}"#).unwrap();
    assert!(matches!(
        PolicyConfig::from_file(&path, KNOBS),
        Err(PolicyError::UnknownKey { key, .. }) if key == "vllm_cpp.release_host_weight"
    ));

    let missing = dir.path().join("missing.json");
    match PolicyConfig::from_file(&missing, KNOBS) {
        Err(e @ PolicyError::BadFile { .. }) => {
            assert!(
                e.to_string().starts_with(&missing.display().to_string()),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_values_are_errors_naming_the_variable_or_key() {
    let fake = fake_with_policy(true, true);
    for &knob in KNOBS {
        for text in ["maybe", "", "2", "enabled"] {
            let err = LoadPolicy::resolve(&env_of(&[(knob.env, text)]), None, &fake).unwrap_err();
            assert_eq!(
                err,
                PolicyError::BadValue {
                    source_name: knob.env.into(),
                    value: text.into(),
                    expected: Switch::EXPECTED,
                }
            );
            assert!(
                err.to_string().starts_with(&format!("{}: ", knob.env)),
                "{err}"
            );
        }
        for value in [
            serde_json::json!("maybe"),
            serde_json::json!(2),
            serde_json::json!(null),
            serde_json::json!([true]),
        ] {
            for config in both_forms(knob.key, value.clone()) {
                let err = LoadPolicy::resolve(&no_env, Some(&config), &fake).unwrap_err();
                assert_eq!(
                    err,
                    PolicyError::BadValue {
                        source_name: format!("{FILE}: config key {}", knob.key),
                        value: value.to_string(),
                        expected: Switch::EXPECTED,
                    }
                );
                assert!(
                    err.to_string()
                        .starts_with(&format!("{FILE}: config key {}: ", knob.key)),
                    "{err}"
                );
            }
        }
    }
}

#[test]
fn switches_read_every_documented_spelling() {
    for (text, value) in [
        ("1", Some(true)),
        ("true", Some(true)),
        ("on", Some(true)),
        ("yes", Some(true)),
        (" TRUE ", Some(true)),
        ("Yes", Some(true)),
        ("0", Some(false)),
        ("false", Some(false)),
        ("off", Some(false)),
        ("no", Some(false)),
        ("OFF\n", Some(false)),
        ("", None),
        ("y", None),
        ("10", None),
    ] {
        assert_eq!(Switch::from_env(text), value.map(Switch), "{text:?}");
        assert_eq!(
            Switch::from_json(&serde_json::json!(text)),
            value.map(Switch),
            "{text:?}"
        );
    }
    for (json, value) in [
        (serde_json::json!(true), Some(true)),
        (serde_json::json!(false), Some(false)),
        (serde_json::json!(1), Some(true)),
        (serde_json::json!(0), Some(false)),
        (serde_json::json!(2), None),
        (serde_json::json!(-1), None),
        (serde_json::json!(1.0), None),
        (serde_json::json!(null), None),
        (serde_json::json!({}), None),
    ] {
        assert_eq!(Switch::from_json(&json), value.map(Switch), "{json}");
    }
    assert_eq!(Switch(true).to_string(), "on");
    assert_eq!(Switch(false).to_string(), "off");
}

/// Integer knobs (the staging ring's sizes) resolve by the same rules.
#[test]
fn integer_knobs_resolve_by_the_same_precedence() {
    const SIZE: Knob = Knob {
        env: "VT_TEST_RING_MIB",
        key: "vllm_cpp.test.ring_mib",
    };
    let knobs = &[SIZE];
    let parse = |json: serde_json::Value| {
        PolicyConfig::parse(Path::new(FILE), &json.to_string(), knobs).unwrap()
    };
    let default = Resolved {
        value: 64u64,
        source: Source::BuiltIn,
    };
    let resolve = |env: &dyn Fn(&str) -> Option<String>, config: Option<&PolicyConfig>| {
        resolve_knob(SIZE, env, config, default.clone())
    };
    let env = |v: &str| Resolved {
        value: v.trim().parse::<u64>().unwrap(),
        source: Source::Env(SIZE.env),
    };
    let from_config = |v: u64| Resolved {
        value: v,
        source: Source::Config(SIZE.key),
    };
    assert_eq!(resolve(&no_env, None), Ok(default.clone()));
    assert_eq!(
        resolve(&no_env, Some(&parse(serde_json::json!({})))),
        Ok(default.clone())
    );
    assert_eq!(resolve(&env_of(&[(SIZE.env, "0")]), None), Ok(env("0")));
    assert_eq!(resolve(&env_of(&[(SIZE.env, " 7 ")]), None), Ok(env("7")));
    let config = parse(serde_json::json!({"vllm_cpp": {"test": {"ring_mib": 5}}}));
    assert_eq!(resolve(&no_env, Some(&config)), Ok(from_config(5)));
    assert_eq!(
        resolve(&env_of(&[(SIZE.env, "9")]), Some(&config)),
        Ok(env("9"))
    );
    let config = parse(serde_json::json!({"vllm_cpp.test.ring_mib": 6}));
    assert_eq!(resolve(&no_env, Some(&config)), Ok(from_config(6)));
    for bad in ["-1", "x", "", "1.5"] {
        assert_eq!(
            resolve(&env_of(&[(SIZE.env, bad)]), None),
            Err(PolicyError::BadValue {
                source_name: SIZE.env.into(),
                value: bad.into(),
                expected: u64::EXPECTED,
            })
        );
    }
    for bad in [
        serde_json::json!(-1),
        serde_json::json!(1.5),
        serde_json::json!(true),
        serde_json::json!("x"),
        // A quoted number is a string: JSON has numbers for that.
        serde_json::json!("6"),
    ] {
        let config = parse(serde_json::json!({ SIZE.key: bad }));
        assert_eq!(
            resolve(&no_env, Some(&config)),
            Err(PolicyError::BadValue {
                source_name: format!("{FILE}: config key {}", SIZE.key),
                value: bad.to_string(),
                expected: u64::EXPECTED,
            })
        );
    }
    // The switch knobs are unknown keys to a parser that knows only SIZE.
    assert!(matches!(
        PolicyConfig::parse(Path::new(FILE), r#"{"vllm_cpp.mmap.prefault": true}"#, knobs),
        Err(PolicyError::UnknownKey { known, .. }) if known == SIZE.key
    ));
}

#[test]
fn summary_line_names_each_value_and_its_source() {
    let fake = fake_with_policy(true, true);
    let config = config(serde_json::json!({"vllm_cpp": {"mmap": {"drop_page_cache": false}}}));
    let env = env_of(&[("VT_RELEASE_HOST_WEIGHTS", "yes")]);
    let p = LoadPolicy::resolve(&env, Some(&config), &fake).unwrap();
    assert_eq!(
        p.summary_line(),
        "policy: mmap=on (built-in default), prefault=off (device default), \
         release_host_weights=on (env VT_RELEASE_HOST_WEIGHTS), \
         drop_page_cache=off (config vllm_cpp.mmap.drop_page_cache)"
    );
    let config =
        PolicyConfig::parse(Path::new(FILE), r#"{"vllm_cpp.mmap.enabled": "no"}"#, KNOBS).unwrap();
    let env = env_of(&[("VT_GGUF_PREFAULT", "1"), ("VT_GGUF_DROP_PAGE_CACHE", "0")]);
    let p = LoadPolicy::resolve(&env, Some(&config), &HostPlatform::new()).unwrap();
    assert_eq!(
        p.summary_line(),
        "policy: mmap=off (config vllm_cpp.mmap.enabled), prefault=on (env VT_GGUF_PREFAULT), \
         release_host_weights=off (device default), drop_page_cache=off (env VT_GGUF_DROP_PAGE_CACHE)"
    );
}

#[test]
fn the_residency_policy_is_the_resolved_switches() {
    let fake = fake_with_policy(true, true);
    for (release, drop_page_cache) in [(true, false), (false, true), (true, true), (false, false)] {
        let on = |b: bool| if b { "on" } else { "off" };
        let env = env_of(&[
            ("VT_RELEASE_HOST_WEIGHTS", on(release)),
            ("VT_GGUF_DROP_PAGE_CACHE", on(drop_page_cache)),
        ]);
        let p = LoadPolicy::resolve(&env, None, &fake).unwrap();
        assert_eq!(
            p.residency_policy(),
            ResidencyPolicy {
                release_host_weights_after_upload: release,
                drop_page_cache,
            }
        );
    }
}

fn fake_addressable(platform: bool, backend: bool) -> FakePlatform {
    FakePlatform::new(FakeConfig {
        host_memory_is_device_addressable: platform,
        device_memory_is_host_addressable: backend,
        ..FakeConfig::default()
    })
}

/// Prefault is on where kernels read host memory (the CPU, a device that
/// reads host memory), off where staging reads every page once anyway
/// (including where only the host reads device memory).
#[test]
fn prefault_default_follows_the_device() {
    let host = HostPlatform::new();
    assert!(prefault_for_device(&host));
    assert!(!prefault_for_device(&fake_addressable(false, false)));
    assert!(prefault_for_device(&fake_addressable(true, false)));
    assert!(!prefault_for_device(&fake_addressable(false, true)));
    assert!(prefault_for_device(&fake_addressable(true, true)));
    for (platform, on) in [
        (&host as &dyn Platform, true),
        (&fake_addressable(false, false), false),
        (&fake_addressable(true, false), true),
    ] {
        let p = LoadPolicy::resolve(&no_env, None, platform).unwrap();
        assert_eq!(p.prefault, resolved(on, Source::DeviceDefault));
        let env = env_of(&[("VT_GGUF_PREFAULT", if on { "off" } else { "on" })]);
        let p = LoadPolicy::resolve(&env, None, platform).unwrap();
        assert_eq!(
            p.prefault,
            resolved(!on, Source::Env("VT_GGUF_PREFAULT")),
            "env wins"
        );
    }
}

#[test]
fn sources_print_where_a_value_came_from() {
    assert_eq!(Source::Env("VT_X").to_string(), "env VT_X");
    assert_eq!(Source::Config("a.b").to_string(), "config a.b");
    assert_eq!(Source::DeviceDefault.to_string(), "device default");
    assert_eq!(Source::BuiltIn.to_string(), "built-in default");
}

fn same_backend(a: &dyn Backend, b: &dyn Backend) -> bool {
    std::ptr::addr_eq(a as *const dyn Backend, b as *const dyn Backend)
}

/// `WithPolicy` answers with its own residency policy and delegates every
/// other question to the platform it wraps.
#[test]
fn with_policy_delegates_everything_but_the_residency_policy() {
    let mine = ResidencyPolicy {
        release_host_weights_after_upload: false,
        drop_page_cache: false,
    };
    let fakes = [fake_addressable(true, true), fake_addressable(false, false)];
    let host = HostPlatform::new();
    for inner in [&fakes[0] as &dyn Platform, &fakes[1], &host] {
        let wrapped = WithPolicy::new(inner, mine);
        assert!(same_backend(wrapped.backend(), inner.backend()));
        assert_eq!(wrapped.device_id(), inner.device_id());
        assert_eq!(wrapped.needs_weight_staging(), inner.needs_weight_staging());
        assert_eq!(
            wrapped.host_memory_is_device_addressable(),
            inner.host_memory_is_device_addressable()
        );
        assert!(std::ptr::eq(
            wrapped.stage_counters(),
            inner.stage_counters()
        ));
        assert_eq!(wrapped.residency_policy(), mine);
    }
    assert_ne!(fakes[1].residency_policy(), mine);
    assert!(
        fakes[0].host_memory_is_device_addressable()
            && !fakes[1].host_memory_is_device_addressable()
    );
    assert!(fakes[0].needs_weight_staging() && !host.needs_weight_staging());

    // Staged through the wrapper: the wrapper's policy keeps the owned
    // bytes the inner platform would give back; the counts land on the
    // inner platform, the copy belongs to its device.
    let fake = &fakes[1];
    assert!(fake.residency_policy().release_host_weights_after_upload);
    let wrapped = WithPolicy::new(fake, mine);
    let weight = Weight::owned(
        "w",
        seam::gguf::GgmlType::I8,
        vec![64],
        Role::new("test"),
        vec![3u8; 64],
    );
    let queue = fake.backend().create_queue().unwrap();
    let Ok(Resident::Device(copy)) = resident_weight(&weight, &wrapped, &*queue) else {
        panic!("staged")
    };
    assert_eq!(copy.device(), fake.device_id());
    assert!(
        weight.host_view().is_some(),
        "the wrapper's policy keeps owned bytes"
    );
    let counts = fake.stage_counters().snapshot();
    assert_eq!((counts.uploads, counts.releases), (1, 0));
    assert!(
        resident_weight(&weight, fake, &*queue).is_ok(),
        "the same device"
    );
}

/// A key given twice, literally or once dotted and once nested, is an
/// error naming the file and the key (serde_json alone keeps the last).
#[test]
fn duplicate_config_keys_are_refused() {
    for text in [
        r#"{"vllm_cpp.mmap.prefault": true, "vllm_cpp.mmap.prefault": false}"#,
        r#"{"vllm_cpp": {"mmap": {"prefault": true, "prefault": true}}}"#,
        r#"{"vllm_cpp.mmap.prefault": true, "vllm_cpp": {"mmap": {"prefault": false}}}"#,
        r#"{"vllm_cpp": {"mmap": {"prefault": true}}, "vllm_cpp": {}}"#,
    ] {
        match PolicyConfig::parse(Path::new(FILE), text, KNOBS) {
            Err(e @ PolicyError::BadFile { .. }) => {
                let m = e.to_string();
                assert!(
                    m.starts_with(FILE)
                        && (m.contains("duplicate key \"") || m.contains("is given twice")),
                    "{m}"
                );
            }
            other => panic!("{text}: {other:?}"),
        }
    }
}

/// The page-cache default's rule: kept while the files take at most
/// 1/PAGE_CACHE_ROOM_DIVISOR of the room (the boundary included), dropped
/// beyond and where the host's figures are unknown; the cgroup's room
/// binds where it is smaller; the reason names the sizes.
#[test]
fn page_cache_default_keeps_what_fits_in_its_share_of_the_room() {
    use seam::host_memory::HostMemory;
    use seam::policy::{PAGE_CACHE_ROOM_DIVISOR, page_cache_default};
    const GIB: u64 = 1 << 30;
    let host = |available, cgroup_room| {
        Some(HostMemory {
            total: available,
            available,
            cgroup_room,
        })
    };
    let decide = |bytes, h| {
        let r = page_cache_default(bytes, h);
        (r.value.0, r.source.to_string())
    };
    assert_eq!(PAGE_CACHE_ROOM_DIVISOR, 2);
    let room = 118 * GIB + 512 * (1 << 20);
    assert_eq!(
        decide(23 * GIB + GIB / 2, host(room, None)),
        (
            false,
            "device default: 23.5 GiB fits in 1/2 of 118.5 GiB available".into()
        )
    );
    // The boundary: exactly the share fits, one byte more does not.
    assert!(!decide(room / 2, host(room, None)).0);
    assert!(decide(room / 2 + 1, host(room, None)).0);
    assert_eq!(
        decide(67 * GIB + GIB / 2, host(30 * GIB, None)),
        (
            true,
            "device default: 67.5 GiB is more than 1/2 of 30.0 GiB available".into()
        )
    );
    // A cgroup's room binds where it is the smaller one, not elsewhere.
    assert_eq!(
        decide(GIB, host(100 * GIB, Some(GIB))),
        (
            true,
            "device default: 1.0 GiB is more than 1/2 of 1.0 GiB available to the cgroup".into()
        )
    );
    assert_eq!(
        decide(GIB, host(4 * GIB, Some(64 * GIB))),
        (
            false,
            "device default: 1.0 GiB fits in 1/2 of 4.0 GiB available".into()
        )
    );
    // Below a GiB the sizes are in MiB.
    assert_eq!(
        decide(3 << 20, host(1023 << 20, None)).1,
        "device default: 3.0 MiB fits in 1/2 of 1023.0 MiB available"
    );
    assert_eq!(
        decide(0, None),
        (true, "device default: host memory unknown".into())
    );
}
