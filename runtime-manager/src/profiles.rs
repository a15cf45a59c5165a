//! RuntimeProfiles (SPEC R1): what a worker of each mode gets: its image, CPU and memory,
//! where it may run, how long it may sit idle and live at most, how many pre-started
//! workers wait for it, and which worker tool catalog it offers.
//!
//! The five modes are fixed (the agent's `runtime_profile` column, checked by the brain):
//! `none` never launches and has no settings; `light`, `browser`, `heavy` and `warm` have
//! built-in defaults following the SPEC R table ([`Profiles::builtin`]). Operators change
//! them with a file (`RUNTIME_MANAGER_PROFILES`, YAML or JSON, filled from Helm values):
//!
//! ```yaml
//! profiles:
//!   heavy:                      # only the fields given replace the built-in ones
//!     image: registry.example.com/agent-runtime/worker:0.1.0
//!     resources:
//!       limits: { cpu: "8", memory: 16Gi }
//!     idleWindowSeconds: 45
//! ```
//!
//! Every field is checked at start; a bad one stops the process with its path, for
//! example `profiles.heavy.resources.limits.memory: invalid quantity "12 GB"`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use protocol::profile::{BROWSER, HEAVY, LIGHT, WARM, WITH_HANDS};
use serde::Deserialize;

/// The image every profile but `browser` runs unless configured (what
/// `docker/worker.Dockerfile` builds; see `docs/kubernetes.md`).
pub const DEFAULT_WORKER_IMAGE: &str = "agent-runtime/worker:dev";
/// The `browser` profile's image: the worker with Chromium.
pub const DEFAULT_BROWSER_IMAGE: &str = "agent-runtime/worker-browser:dev";
/// The node label (and taint key) of the workers nodepool `heavy` runs on.
pub const WORKERS_POOL_LABEL: &str = "agent-runtime/pool";
pub const WORKERS_POOL_VALUE: &str = "workers";

/// Limits of the checks (beyond them a value is almost certainly a typo).
const MIN_MEMORY_BYTES: f64 = 32.0 * 1024.0 * 1024.0;
const MAX_IDLE_WINDOW_S: u64 = 24 * 3600;
const MIN_ACTIVE_DEADLINE_S: u64 = 60;
const MAX_ACTIVE_DEADLINE_S: u64 = 7 * 24 * 3600;
const MAX_WARM_POOL: u32 = 100;
/// The largest workspace snapshot a profile may allow (W10): it passes through the brain's
/// memory on its way to storage.
const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;
/// How long a pooled worker waits unclaimed before it is replaced, by default.
pub const DEFAULT_WARM_POOL_MAX_AGE: Duration = Duration::from_secs(1800);
/// The default cap of a workspace snapshot.
pub const DEFAULT_SNAPSHOT_MAX_BYTES: u64 = 256 << 20;

/// One mode's settings, complete and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeProfile {
    pub image: String,
    pub image_pull_policy: PullPolicy,
    pub resources: Resources,
    /// `sizeLimit` of the `emptyDir` volumes at `/workspace` and at `/tmp`.
    pub workspace_size: Quantity,
    /// A memory-backed `emptyDir` at `/dev/shm` of this size (Chromium needs more than a
    /// container's default 64 MiB); none when unset.
    pub shm_size: Option<Quantity>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// The pod's `runtimeClassName`: a RuntimeClass of the cluster that runs the worker
    /// under a sandboxing runtime (gVisor, Kata) instead of the node's default; none when
    /// unset.
    pub runtime_class_name: Option<String>,
    /// An unused session is torn down after this long (W7).
    pub idle_window: Duration,
    /// The Job's `activeDeadlineSeconds`: the worker ends by then whatever happens (R4).
    pub active_deadline: Duration,
    /// How many pre-started workers of this profile wait unassigned (R3).
    pub warm_pool_size: u32,
    /// A pooled worker still unclaimed this long after its start is retired and replaced
    /// (R3): pools pick up a new image or settings, and a claimed worker always has most
    /// of its Job's `activeDeadlineSeconds` left.
    pub warm_pool_max_age: Duration,
    /// The `channel::catalog` name whose worker tools the profile offers.
    pub tool_catalog: String,
    /// Whether a session torn down for idleness packs its workspace for the chat's next
    /// session (W10).
    pub snapshots: bool,
    /// The largest workspace (as a tar stream) a snapshot is taken of; above it, none is
    /// taken and the chat's previous one is dropped.
    pub snapshot_max_bytes: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Resources {
    pub requests: CpuMemory,
    pub limits: CpuMemory,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CpuMemory {
    pub cpu: Quantity,
    pub memory: Quantity,
}

/// A container's `imagePullPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// A pod toleration, as in the Kubernetes API (the operator and effect are checked).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub operator: Option<TolerationOperator>,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub effect: Option<TaintEffect>,
    #[serde(default)]
    pub toleration_seconds: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum TolerationOperator {
    Exists,
    Equal,
}

impl TolerationOperator {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exists => "Exists",
            Self::Equal => "Equal",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// A Kubernetes resource quantity (`250m`, `1`, `1.5`, `512Mi`, `1e3`), kept as written
/// and as a number (cores or bytes) for comparisons.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantity {
    text: String,
    value: f64,
}

impl Quantity {
    /// Parses the Kubernetes quantity syntax; `None` when it is not one, or negative.
    pub fn parse(text: &str) -> Option<Self> {
        parse_quantity(text).map(|value| Self {
            text: text.to_owned(),
            value,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The amount in base units (cores for CPU, bytes for memory).
    pub fn value(&self) -> f64 {
        self.value
    }

    fn known(text: &str) -> Self {
        Self::parse(text).unwrap_or(Self {
            text: text.to_owned(),
            value: 0.0,
        })
    }
}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Quantity;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a quantity such as 500m, 2, 512Mi or 4Gi")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Quantity::parse(v).ok_or_else(|| E::custom(format_args!("invalid quantity {v:?}")))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                self.visit_str(&v.to_string())
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                self.visit_str(&v.to_string())
            }

            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                self.visit_str(&v.to_string())
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `<sign><number><suffix>`, Kubernetes' `resource.Quantity` grammar (non-negative only).
fn parse_quantity(text: &str) -> Option<f64> {
    let body = text.strip_prefix('+').unwrap_or(text);
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(split);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let number: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E'])?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            10f64.powi(digits.parse::<i32>().ok()?)
        }
    };
    let value = number * multiplier;
    value.is_finite().then_some(value)
}

/// The four profiles with hands.
#[derive(Clone, Debug, PartialEq)]
pub struct Profiles {
    pub light: RuntimeProfile,
    pub browser: RuntimeProfile,
    pub heavy: RuntimeProfile,
    pub warm: RuntimeProfile,
}

/// A bad profiles file: where, and what is wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{path}: {problem}")]
pub struct ProfileError {
    /// The field's path (`profiles.heavy.resources.limits.memory`), or `(file)`.
    pub path: String,
    pub problem: String,
}

impl ProfileError {
    fn at(path: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            problem: problem.into(),
        }
    }
}

/// The file formats [`Profiles::parse`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Profiles {
    /// The SPEC R table.
    pub fn builtin() -> Self {
        let light = RuntimeProfile {
            image: DEFAULT_WORKER_IMAGE.into(),
            image_pull_policy: PullPolicy::IfNotPresent,
            resources: resources(("250m", "256Mi"), ("1", "1Gi")),
            workspace_size: Quantity::known("1Gi"),
            shm_size: None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            runtime_class_name: None,
            idle_window: Duration::from_secs(90),
            active_deadline: Duration::from_secs(3600),
            warm_pool_size: 0,
            warm_pool_max_age: DEFAULT_WARM_POOL_MAX_AGE,
            tool_catalog: "light".into(),
            snapshots: true,
            snapshot_max_bytes: DEFAULT_SNAPSHOT_MAX_BYTES,
        };
        Self {
            browser: RuntimeProfile {
                image: DEFAULT_BROWSER_IMAGE.into(),
                resources: resources(("500m", "1Gi"), ("2", "2Gi")),
                shm_size: Some(Quantity::known("512Mi")),
                idle_window: Duration::from_secs(120),
                tool_catalog: "browser".into(),
                ..light.clone()
            },
            heavy: RuntimeProfile {
                resources: resources(("2", "4Gi"), ("4", "8Gi")),
                workspace_size: Quantity::known("10Gi"),
                node_selector: BTreeMap::from([(
                    WORKERS_POOL_LABEL.to_owned(),
                    WORKERS_POOL_VALUE.to_owned(),
                )]),
                tolerations: vec![Toleration {
                    key: Some(WORKERS_POOL_LABEL.into()),
                    operator: Some(TolerationOperator::Equal),
                    value: Some(WORKERS_POOL_VALUE.into()),
                    effect: Some(TaintEffect::NoSchedule),
                    toleration_seconds: None,
                }],
                idle_window: Duration::from_secs(45),
                active_deadline: Duration::from_secs(2 * 3600),
                tool_catalog: "heavy".into(),
                ..light.clone()
            },
            warm: RuntimeProfile {
                idle_window: Duration::from_secs(20 * 60),
                active_deadline: Duration::from_secs(4 * 3600),
                tool_catalog: "warm".into(),
                ..light.clone()
            },
            light,
        }
    }

    /// The profile of a mode with hands; `None` for `none` and unknown names.
    pub fn get(&self, name: &str) -> Option<&RuntimeProfile> {
        match name {
            LIGHT => Some(&self.light),
            BROWSER => Some(&self.browser),
            HEAVY => Some(&self.heavy),
            WARM => Some(&self.warm),
            _ => None,
        }
    }

    /// `(name, profile)` for each mode with hands.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &RuntimeProfile)> {
        [
            (LIGHT, &self.light),
            (BROWSER, &self.browser),
            (HEAVY, &self.heavy),
            (WARM, &self.warm),
        ]
        .into_iter()
    }

    /// The idle window of `profile`; `None` for `none` and unknown names.
    pub fn idle_window(&self, profile: &str) -> Option<Duration> {
        self.get(profile).map(|p| p.idle_window)
    }

    /// Replaces every idle window (`RUNTIME_MANAGER_IDLE_WINDOW_MS`, for tests).
    pub fn set_idle_windows(&mut self, window: Duration) {
        for profile in [
            &mut self.light,
            &mut self.browser,
            &mut self.heavy,
            &mut self.warm,
        ] {
            profile.idle_window = window;
        }
    }

    /// Reads a profiles file: JSON when its name ends in `.json`, YAML otherwise.
    pub fn from_file(path: &Path) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ProfileError::at("(file)", format!("cannot be read: {e}")))?;
        let format = if path.extension().is_some_and(|e| e == "json") {
            Format::Json
        } else {
            Format::Yaml
        };
        Self::parse(&text, format)
    }

    /// The built-in profiles with a file's settings applied, checked.
    pub fn parse(text: &str, format: Format) -> Result<Self, ProfileError> {
        if text.trim().is_empty() {
            return Err(ProfileError::at(
                "(file)",
                "is empty (write `profiles: {}` to keep the built-in profiles)",
            ));
        }
        let mut path = String::new();
        let file: Result<ProfilesFile, String> = match format {
            Format::Json => {
                let mut de = serde_json::Deserializer::from_str(text);
                serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    path = e.path().to_string();
                    e.into_inner().to_string()
                })
            }
            Format::Yaml => {
                let options = serde_saphyr::options! { with_snippet: false };
                serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
                    serde_path_to_error::deserialize(de).map_err(|e| {
                        path = e.path().to_string();
                        e.into_inner()
                    })
                })
                .map_err(|e| e.to_string())
            }
        };
        let file = file.map_err(|problem| {
            ProfileError::at(if path == "." { "(file)".into() } else { path }, problem)
        })?;
        let mut profiles = Self::builtin();
        let overrides = [
            (LIGHT, &mut profiles.light, file.profiles.light),
            (BROWSER, &mut profiles.browser, file.profiles.browser),
            (HEAVY, &mut profiles.heavy, file.profiles.heavy),
            (WARM, &mut profiles.warm, file.profiles.warm),
        ];
        for (name, profile, over) in overrides {
            if let Some(over) = over {
                over.apply(profile);
            }
            check(name, profile)?;
        }
        Ok(profiles)
    }
}

fn resources(requests: (&str, &str), limits: (&str, &str)) -> Resources {
    Resources {
        requests: CpuMemory {
            cpu: Quantity::known(requests.0),
            memory: Quantity::known(requests.1),
        },
        limits: CpuMemory {
            cpu: Quantity::known(limits.0),
            memory: Quantity::known(limits.1),
        },
    }
}

/// The file: every field optional; what is given replaces the built-in value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfilesFile {
    #[serde(default)]
    profiles: FileProfiles,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProfiles {
    #[serde(default)]
    light: Option<FileProfile>,
    #[serde(default)]
    browser: Option<FileProfile>,
    #[serde(default)]
    heavy: Option<FileProfile>,
    #[serde(default)]
    warm: Option<FileProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileProfile {
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    image_pull_policy: Option<PullPolicy>,
    #[serde(default)]
    resources: Option<FileResources>,
    #[serde(default)]
    workspace_size: Option<Quantity>,
    #[serde(default)]
    shm_size: Option<Quantity>,
    #[serde(default)]
    node_selector: Option<BTreeMap<String, String>>,
    #[serde(default)]
    tolerations: Option<Vec<Toleration>>,
    #[serde(default)]
    runtime_class_name: Option<String>,
    #[serde(default)]
    idle_window_seconds: Option<u64>,
    #[serde(default)]
    active_deadline_seconds: Option<u64>,
    #[serde(default)]
    warm_pool_size: Option<u32>,
    #[serde(default)]
    warm_pool_max_age_seconds: Option<u64>,
    #[serde(default)]
    tool_catalog: Option<String>,
    #[serde(default)]
    snapshots: Option<bool>,
    #[serde(default)]
    snapshot_max_bytes: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileResources {
    #[serde(default)]
    requests: Option<FileCpuMemory>,
    #[serde(default)]
    limits: Option<FileCpuMemory>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCpuMemory {
    #[serde(default)]
    cpu: Option<Quantity>,
    #[serde(default)]
    memory: Option<Quantity>,
}

impl FileCpuMemory {
    fn apply(self, to: &mut CpuMemory) {
        if let Some(cpu) = self.cpu {
            to.cpu = cpu;
        }
        if let Some(memory) = self.memory {
            to.memory = memory;
        }
    }
}

impl FileProfile {
    fn apply(self, to: &mut RuntimeProfile) {
        if let Some(v) = self.image {
            to.image = v;
        }
        if let Some(v) = self.image_pull_policy {
            to.image_pull_policy = v;
        }
        if let Some(resources) = self.resources {
            if let Some(v) = resources.requests {
                v.apply(&mut to.resources.requests);
            }
            if let Some(v) = resources.limits {
                v.apply(&mut to.resources.limits);
            }
        }
        if let Some(v) = self.workspace_size {
            to.workspace_size = v;
        }
        if let Some(v) = self.shm_size {
            to.shm_size = Some(v);
        }
        if let Some(v) = self.node_selector {
            to.node_selector = v;
        }
        if let Some(v) = self.tolerations {
            to.tolerations = v;
        }
        if let Some(v) = self.runtime_class_name {
            to.runtime_class_name = Some(v);
        }
        if let Some(v) = self.idle_window_seconds {
            to.idle_window = Duration::from_secs(v);
        }
        if let Some(v) = self.active_deadline_seconds {
            to.active_deadline = Duration::from_secs(v);
        }
        if let Some(v) = self.warm_pool_size {
            to.warm_pool_size = v;
        }
        to.warm_pool_max_age = match self.warm_pool_max_age_seconds {
            Some(v) => Duration::from_secs(v),
            // Unset: the default, or less when the Job's deadline leaves less.
            None => DEFAULT_WARM_POOL_MAX_AGE
                .min(to.active_deadline.saturating_sub(to.idle_window))
                .max(Duration::from_secs(1)),
        };
        if let Some(v) = self.tool_catalog {
            to.tool_catalog = v;
        }
        if let Some(v) = self.snapshots {
            to.snapshots = v;
        }
        if let Some(v) = self.snapshot_max_bytes {
            to.snapshot_max_bytes = v;
        }
    }
}

/// The checks the file's types cannot express, in the order an operator reads a profile:
/// the first failure is the one reported, so the order is part of the behaviour.
fn check(name: &str, p: &RuntimeProfile) -> Result<(), ProfileError> {
    let at = |field: &str| format!("profiles.{name}.{field}");
    check_image(&at, p)?;
    check_resources(&at, p)?;
    check_placement(&at, p)?;
    check_lifetimes(&at, p)?;
    check_tools(&at, p)
}

/// Where a failing field sits in the file, e.g. `profiles.default.image`.
type FieldPath<'a> = &'a dyn Fn(&str) -> String;

fn check_image(at: FieldPath, p: &RuntimeProfile) -> Result<(), ProfileError> {
    if p.image.is_empty()
        || p.image.len() > 512
        || p.image.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ProfileError::at(
            at("image"),
            "must be an image reference such as registry.example.com/agent-runtime/worker:0.1.0",
        ));
    }
    Ok(())
}

/// CPU, memory and disk: a missing unit (`512` for `512Mi`) is the usual mistake, so the
/// floors are set where no real worker could run.
fn check_resources(at: FieldPath, p: &RuntimeProfile) -> Result<(), ProfileError> {
    for (kind, set) in [
        ("requests", &p.resources.requests),
        ("limits", &p.resources.limits),
    ] {
        if set.cpu.value() <= 0.0 {
            return Err(ProfileError::at(
                at(&format!("resources.{kind}.cpu")),
                format!("must be more than 0 (got {})", set.cpu),
            ));
        }
        if set.memory.value() < MIN_MEMORY_BYTES {
            return Err(ProfileError::at(
                at(&format!("resources.{kind}.memory")),
                format!(
                    "{} is less than 32Mi (a unit is probably missing: 512Mi, 4Gi)",
                    set.memory
                ),
            ));
        }
    }
    let (requests, limits) = (&p.resources.requests, &p.resources.limits);
    if requests.cpu.value() > limits.cpu.value() {
        return Err(ProfileError::at(
            at("resources.requests.cpu"),
            format!("{} is more than the limit {}", requests.cpu, limits.cpu),
        ));
    }
    if requests.memory.value() > limits.memory.value() {
        return Err(ProfileError::at(
            at("resources.requests.memory"),
            format!(
                "{} is more than the limit {}",
                requests.memory, limits.memory
            ),
        ));
    }
    if p.workspace_size.value() < 1024.0 * 1024.0 {
        return Err(ProfileError::at(
            at("workspaceSize"),
            format!("{} is less than 1Mi", p.workspace_size),
        ));
    }
    if let Some(shm) = &p.shm_size
        && shm.value() < 1024.0 * 1024.0
    {
        return Err(ProfileError::at(
            at("shmSize"),
            format!("{shm} is less than 1Mi"),
        ));
    }
    Ok(())
}

/// Where the Job's pod may be scheduled: Kubernetes would refuse these only at launch,
/// long after the profile was loaded.
fn check_placement(at: FieldPath, p: &RuntimeProfile) -> Result<(), ProfileError> {
    for (key, value) in &p.node_selector {
        if !is_label_key(key) {
            return Err(ProfileError::at(
                at(&format!("nodeSelector.{key}")),
                "is not a valid label key",
            ));
        }
        if !is_label_value(value) {
            return Err(ProfileError::at(
                at(&format!("nodeSelector.{key}")),
                format!("{value:?} is not a valid label value"),
            ));
        }
    }
    // A RuntimeClass is named like a label key's DNS-subdomain prefix.
    if let Some(class) = &p.runtime_class_name
        && !(is_label_key(&format!("{class}/x")) && class.len() <= 253)
    {
        return Err(ProfileError::at(
            at("runtimeClassName"),
            format!("{class:?} is not a RuntimeClass name (a DNS subdomain)"),
        ));
    }
    for (i, t) in p.tolerations.iter().enumerate() {
        let here = |field: &str| at(&format!("tolerations[{i}].{field}"));
        let key = t.key.as_deref().unwrap_or("");
        if !key.is_empty() && !is_label_key(key) {
            return Err(ProfileError::at(here("key"), "is not a valid label key"));
        }
        let exists = t.operator == Some(TolerationOperator::Exists);
        if key.is_empty() && !exists {
            return Err(ProfileError::at(
                here("operator"),
                "must be Exists when the key is empty",
            ));
        }
        let value = t.value.as_deref().unwrap_or("");
        if exists && !value.is_empty() {
            return Err(ProfileError::at(
                here("value"),
                "must be empty when the operator is Exists",
            ));
        }
        if !is_label_value(value) {
            return Err(ProfileError::at(
                here("value"),
                format!("{value:?} is not a valid label value"),
            ));
        }
        if t.toleration_seconds.is_some() && t.effect != Some(TaintEffect::NoExecute) {
            return Err(ProfileError::at(
                here("tolerationSeconds"),
                "applies only with the effect NoExecute",
            ));
        }
    }
    Ok(())
}

/// The idle window, the Job's deadline and the warm pool's age must nest, or a worker
/// could be killed while it still serves a session.
fn check_lifetimes(at: FieldPath, p: &RuntimeProfile) -> Result<(), ProfileError> {
    let idle = p.idle_window.as_secs();
    if idle == 0 || idle > MAX_IDLE_WINDOW_S {
        return Err(ProfileError::at(
            at("idleWindowSeconds"),
            format!("must be between 1 and {MAX_IDLE_WINDOW_S}"),
        ));
    }
    let deadline = p.active_deadline.as_secs();
    if !(MIN_ACTIVE_DEADLINE_S..=MAX_ACTIVE_DEADLINE_S).contains(&deadline) {
        return Err(ProfileError::at(
            at("activeDeadlineSeconds"),
            format!("must be between {MIN_ACTIVE_DEADLINE_S} and {MAX_ACTIVE_DEADLINE_S}"),
        ));
    }
    if deadline < idle {
        return Err(ProfileError::at(
            at("activeDeadlineSeconds"),
            format!(
                "{deadline} is shorter than the idle window ({idle} s): the Job would end \
                 before an unused session is torn down"
            ),
        ));
    }
    if p.warm_pool_size > MAX_WARM_POOL {
        return Err(ProfileError::at(
            at("warmPoolSize"),
            format!("must be at most {MAX_WARM_POOL}"),
        ));
    }
    let max_age = p.warm_pool_max_age.as_secs();
    if max_age == 0 || max_age + idle > deadline {
        return Err(ProfileError::at(
            at("warmPoolMaxAgeSeconds"),
            format!(
                "must be at least 1 and at most {} (activeDeadlineSeconds less the idle \
                 window): a worker claimed just before it is retired must still be able to \
                 serve its idle window before the Job's deadline",
                deadline.saturating_sub(idle)
            ),
        ));
    }
    Ok(())
}

fn check_tools(at: FieldPath, p: &RuntimeProfile) -> Result<(), ProfileError> {
    if !(1..=MAX_SNAPSHOT_BYTES).contains(&p.snapshot_max_bytes) {
        return Err(ProfileError::at(
            at("snapshotMaxBytes"),
            format!("must be between 1 and {MAX_SNAPSHOT_BYTES}"),
        ));
    }
    if channel::catalog::catalog_for(&p.tool_catalog).is_empty() {
        return Err(ProfileError::at(
            at("toolCatalog"),
            format!(
                "{:?} is not a worker tool catalog (one of {})",
                p.tool_catalog,
                WITH_HANDS.join(", ")
            ),
        ));
    }
    Ok(())
}

/// `[prefix/]name`: a DNS subdomain prefix of at most 253 characters, a name of 1-63
/// alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && is_label_value(name)
}

/// Empty, or 1-63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn yaml(text: &str) -> Result<Profiles, ProfileError> {
        Profiles::parse(text, Format::Yaml)
    }

    #[test]
    fn quantities_follow_the_kubernetes_grammar() {
        for (text, value) in [
            ("250m", 0.25),
            ("1", 1.0),
            ("1.5", 1.5),
            (".5", 0.5),
            ("512Mi", 512.0 * 1024.0 * 1024.0),
            ("4Gi", 4.0 * 1024.0 * 1024.0 * 1024.0),
            ("1G", 1e9),
            ("1e3", 1000.0),
            ("1E3", 1000.0),
            ("2E", 2e18),
            ("+3k", 3000.0),
        ] {
            let q = Quantity::parse(text).unwrap_or_else(|| panic!("{text}"));
            assert!((q.value() - value).abs() < 1e-6 * value.max(1.0), "{text}");
            assert_eq!(q.as_str(), text);
        }
        for bad in [
            "", "12 GB", "12GB", "-1", "1..0", ".", "Mi", "1mi", "1e", "1e+", "1Ki2", " 1",
        ] {
            assert!(Quantity::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn the_builtin_profiles_follow_the_spec_table_and_pass_their_own_checks() {
        let p = Profiles::builtin();
        for (name, profile) in p.iter() {
            check(name, profile).unwrap();
            assert_eq!(profile.tool_catalog, name);
        }
        let idle = |n: &str| p.idle_window(n).unwrap().as_secs();
        assert!((60..=120).contains(&idle("light")));
        assert!((30..=60).contains(&idle("heavy")));
        assert!((600..=1800).contains(&idle("warm")));
        assert_eq!(p.idle_window(protocol::profile::NONE), None);
        assert_eq!(
            p.heavy.node_selector[WORKERS_POOL_LABEL],
            WORKERS_POOL_VALUE
        );
        assert_eq!(
            p.heavy.tolerations[0].key.as_deref(),
            Some(WORKERS_POOL_LABEL)
        );
        assert!(p.heavy.resources.limits.memory.value() > p.light.resources.limits.memory.value());
        assert!(p.browser.shm_size.is_some());
        assert_eq!(p.browser.image, DEFAULT_BROWSER_IMAGE);
    }

    #[test]
    fn a_file_replaces_only_the_fields_it_gives() {
        let p = yaml(
            "profiles:\n  heavy:\n    image: registry.example.com/w:1\n    resources:\n      limits:\n        memory: 16Gi\n    idleWindowSeconds: 30\n  light:\n    warmPoolSize: 2\n    nodeSelector: {}\n",
        )
        .unwrap();
        let builtin = Profiles::builtin();
        assert_eq!(p.heavy.image, "registry.example.com/w:1");
        assert_eq!(p.heavy.resources.limits.memory.as_str(), "16Gi");
        assert_eq!(
            p.heavy.resources.limits.cpu,
            builtin.heavy.resources.limits.cpu
        );
        assert_eq!(p.heavy.resources.requests, builtin.heavy.resources.requests);
        assert_eq!(p.heavy.idle_window, Duration::from_secs(30));
        assert_eq!(p.heavy.tolerations, builtin.heavy.tolerations);
        assert_eq!(p.light.warm_pool_size, 2);
        assert_eq!(p.browser, builtin.browser);
        assert!(
            builtin.light.snapshots,
            "W10 is on unless a profile turns it off"
        );
        assert_eq!(builtin.light.snapshot_max_bytes, DEFAULT_SNAPSHOT_MAX_BYTES);
        let off = yaml("profiles:\n  warm:\n    snapshots: false\n    snapshotMaxBytes: 1048576\n")
            .unwrap();
        assert!(!off.warm.snapshots);
        assert_eq!(off.warm.snapshot_max_bytes, 1 << 20);
        assert_eq!(off.light, builtin.light);
        assert_eq!(yaml("profiles: {}\n").unwrap(), builtin);

        let json = Profiles::parse(
            r#"{"profiles": {"warm": {"idleWindowSeconds": 900, "resources": {"requests": {"cpu": 0.5}}}}}"#,
            Format::Json,
        )
        .unwrap();
        assert_eq!(json.warm.idle_window, Duration::from_secs(900));
        assert_eq!(json.warm.resources.requests.cpu.as_str(), "0.5");
    }

    #[test]
    fn a_bad_field_is_named_by_its_path() {
        for (text, path, problem) in [
            (
                "profiles:\n  heavy:\n    resources:\n      limits:\n        memory: 12 GB\n",
                "profiles.heavy.resources.limits.memory",
                "invalid quantity \"12 GB\"",
            ),
            (
                "profiles:\n  light:\n    imagee: x\n",
                "profiles.light.imagee",
                "unknown field `imagee`",
            ),
            (
                "profiles:\n  none:\n    image: x\n",
                "profiles.none",
                "unknown field `none`",
            ),
            ("profile: {}\n", "profile", "unknown field `profile`"),
            (
                "profiles:\n  light:\n    idleWindowSeconds: soon\n",
                "profiles.light.idleWindowSeconds",
                "",
            ),
            (
                "profiles:\n  light:\n    imagePullPolicy: Sometimes\n",
                "profiles.light.imagePullPolicy",
                "Sometimes",
            ),
            (
                "profiles:\n  heavy:\n    tolerations:\n      - key: a\n        operator: Maybe\n",
                "profiles.heavy.tolerations[0].operator",
                "Maybe",
            ),
            (
                "profiles:\n  heavy:\n    resources:\n      requests:\n        memory: 16Gi\n",
                "profiles.heavy.resources.requests.memory",
                "16Gi is more than the limit 8Gi",
            ),
            (
                "profiles:\n  light:\n    resources:\n      limits:\n        memory: \"12\"\n",
                "profiles.light.resources.limits.memory",
                "less than 32Mi",
            ),
            (
                "profiles:\n  warm:\n    activeDeadlineSeconds: 600\n",
                "profiles.warm.activeDeadlineSeconds",
                "shorter than the idle window",
            ),
            (
                "profiles:\n  light:\n    toolCatalog: everything\n",
                "profiles.light.toolCatalog",
                "not a worker tool catalog",
            ),
            (
                "profiles:\n  heavy:\n    nodeSelector:\n      agent-runtime/pool: \"bad value!\"\n",
                "profiles.heavy.nodeSelector.agent-runtime/pool",
                "not a valid label value",
            ),
            (
                "profiles:\n  browser:\n    runtimeClassName: Not_A_Class\n",
                "profiles.browser.runtimeClassName",
                "not a RuntimeClass name",
            ),
            (
                "profiles:\n  heavy:\n    tolerations:\n      - key: a\n        operator: Exists\n        value: b\n",
                "profiles.heavy.tolerations[0].value",
                "must be empty",
            ),
            (
                "profiles:\n  light:\n    image: \"\"\n",
                "profiles.light.image",
                "image reference",
            ),
            (
                "profiles:\n  light:\n    snapshotMaxBytes: 0\n",
                "profiles.light.snapshotMaxBytes",
                "between 1 and",
            ),
            ("", "(file)", "empty"),
        ] {
            let err = yaml(text).unwrap_err();
            assert_eq!(err.path, path, "{text}: {err}");
            assert!(err.problem.contains(problem), "{text}: {err}");
        }
        let err = Profiles::parse(
            r#"{"profiles": {"heavy": {"resources": {"limits": {"memory": "12 GB"}}}}}"#,
            Format::Json,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string().split(" at line").next().unwrap_or_default(),
            "profiles.heavy.resources.limits.memory: invalid quantity \"12 GB\""
        );
    }

    #[test]
    fn label_syntax() {
        for good in ["a", "agent-runtime/pool", "kubernetes.io/arch", "a.b_c-d"] {
            assert!(is_label_key(good), "{good}");
        }
        for bad in ["", "/a", "a/", "-a", "A_/b", "a/b/c", &"x".repeat(64)] {
            assert!(!is_label_key(bad), "{bad}");
        }
        assert!(is_label_value(""));
        assert!(!is_label_value("a b"));
    }
}
