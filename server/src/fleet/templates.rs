//! Base templates from files (`--base-templates` / `TF_BASE_TEMPLATES`): one file per base, read
//! at start-up and upserted into the desired state in PostgreSQL (idempotent: the same files
//! give the same rows), so the controller creates each base's graph when it is needed. The
//! Helm chart mounts its per-base ConfigMap here.
//!
//! A file is YAML (`.yaml`, `.yml`) or TOML (`.toml`); a directory is every such file in it
//! (hidden entries, such as a ConfigMap's `..data`, skipped), by name. Fields:
//!
//! ```yaml
//! base: llama-3.1-8b-instruct          # the public served name
//! model: meta-llama/Llama-3.1-8B-Instruct
//! image: nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.5.0   # Kubernetes only (default: this one)
//! gpus_per_replica: 1
//! replicas: 1                          # the floor
//! replicas_max: 4                      # the ceiling (default: the floor)
//! tensor_parallel_size: 1
//! quantization: fp8                    # "" or absent: none
//! max_loras: 8
//! max_lora_rank: 64                    # one of vLLM's ranks
//! extra_args: ["--max-cpu-loras", "16"]
//! env_from_secret: hf-token            # Kubernetes only
//! config_json: llama/config.json       # a path (relative to this file) or an inline map
//! tokenizer_json: llama/tokenizer.json # optional; without it prompts are estimated
//! allow_dora: false
//! idle_after_secs: 600                 # optional: sleep when idle
//! offered: true                        # the bare base is served to every tenant (default:
//!                                      # false: its GPUs start with its first started adapter)
//! prompt_estimator: byte-bound         # the fallback without a tokenizer
//! kind: chat                           # or embedding (served on /v1/embeddings only)
//! ```
//!
//! Any problem (unreadable file, unknown field, a rank vLLM refuses, a `tokenizer.json` the
//! `tokenizers` crate cannot load) stops start-up with a message naming the file. A base whose
//! file is removed keeps its rows: taking a base away is an operator's explicit act.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use sqlx::PgPool;
use tf_core::db::lifecycle::{offer_base, TemplateRow};

use super::dynamo_render::{graph_name, ServingTemplate};
use crate::base_tokenizer::BaseTokenizer;
use crate::engine_policy::PromptEstimator;

/// A JSON document given by path (relative to the template file) or inline.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum JsonSource {
    Path(String),
    Inline(serde_json::Map<String, Value>),
}

/// One base template file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateFile {
    pub base: String,
    pub model: String,
    #[serde(default)]
    pub image: String,
    #[serde(default = "one")]
    pub gpus_per_replica: u32,
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub replicas_max: Option<u32>,
    #[serde(default = "one")]
    pub tensor_parallel_size: u32,
    #[serde(default)]
    pub quantization: Option<String>,
    #[serde(default = "default_max_loras")]
    pub max_loras: u32,
    #[serde(default = "default_max_lora_rank")]
    pub max_lora_rank: u64,
    #[serde(default)]
    pub extra_args: Vec<String>,
    #[serde(default)]
    pub env_from_secret: Option<String>,
    pub config_json: JsonSource,
    #[serde(default)]
    pub tokenizer_json: Option<JsonSource>,
    #[serde(default)]
    pub allow_dora: bool,
    #[serde(default)]
    pub idle_after_secs: Option<u32>,
    /// Unset: false. A bare base that is offered keeps its graph (and GPUs) up for good; one that
    /// is not gets a graph only while an adapter on it is started.
    #[serde(default)]
    pub offered: bool,
    #[serde(default)]
    pub prompt_estimator: Option<String>,
    /// `chat` (default) or `embedding`: which endpoints may call the base.
    #[serde(default)]
    pub kind: Option<String>,
}

fn one() -> u32 {
    1
}
fn default_max_loras() -> u32 {
    8
}
fn default_max_lora_rank() -> u64 {
    64
}

/// A template ready to be upserted.
#[derive(Debug, Clone)]
pub struct BaseTemplate {
    pub base: String,
    pub offered: bool,
    pub estimator: PromptEstimator,
    pub row: TemplateRow,
    /// The file it came from, for messages.
    pub source: PathBuf,
}

/// Why the templates could not be loaded; names the file.
#[derive(Debug, thiserror::Error)]
#[error("base template {}: {reason}", path.display())]
pub struct TemplateError {
    pub path: PathBuf,
    pub reason: String,
}

fn error(path: &Path, reason: impl Into<String>) -> TemplateError {
    TemplateError {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads the template files at `path` (a file or a directory of them).
pub fn load(path: &Path) -> Result<Vec<BaseTemplate>, TemplateError> {
    let meta = std::fs::metadata(path).map_err(|e| error(path, e.to_string()))?;
    let files = if meta.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| error(path, e.to_string()))? {
            let entry = entry.map_err(|e| error(path, e.to_string()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let file = entry.path();
            if !name.starts_with('.') && format_of(&file).is_some() && file.is_file() {
                files.push(file);
            }
        }
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        let t = load_file(&file)?;
        if !seen.insert(t.base.clone()) {
            return Err(error(&file, format!("base {} is defined twice", t.base)));
        }
        out.push(t);
    }
    Ok(out)
}

#[derive(Clone, Copy)]
enum Format {
    Yaml,
    Toml,
}

fn format_of(path: &Path) -> Option<Format> {
    match path.extension()?.to_str()? {
        "yaml" | "yml" => Some(Format::Yaml),
        "toml" => Some(Format::Toml),
        _ => None,
    }
}

/// Reads and checks one template file.
pub fn load_file(path: &Path) -> Result<BaseTemplate, TemplateError> {
    let format = format_of(path).ok_or_else(|| error(path, "not a .yaml, .yml or .toml file"))?;
    let text = std::fs::read_to_string(path).map_err(|e| error(path, e.to_string()))?;
    let file: TemplateFile = match format {
        Format::Yaml => serde_saphyr::from_str(&text).map_err(|e| error(path, e.to_string()))?,
        Format::Toml => toml::from_str(&text).map_err(|e| error(path, e.to_string()))?,
    };
    resolve(file, path).map_err(|reason| error(path, reason))
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.trim().is_empty())
}

/// Checks a parsed file and reads the documents it names (relative to the file's folder).
fn resolve(f: TemplateFile, path: &Path) -> Result<BaseTemplate, String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    if f.base.trim().is_empty() || f.model.trim().is_empty() {
        return Err("base and model must not be empty".into());
    }
    let floor = f.replicas.max(1);
    let ceiling = f.replicas_max.unwrap_or(floor);
    if ceiling < floor {
        return Err(format!(
            "replicas_max {ceiling} is below the floor of {floor} replicas"
        ));
    }
    let serving = ServingTemplate {
        model: f.model.clone(),
        image: f.image.clone(),
        gpus_per_replica: f.gpus_per_replica,
        replicas: floor,
        tensor_parallel_size: f.tensor_parallel_size,
        quantization: non_empty(f.quantization.clone()),
        max_loras: f.max_loras,
        max_lora_rank: f.max_lora_rank,
        extra_args: f.extra_args.clone(),
        env_from_secret: non_empty(f.env_from_secret.clone()),
    };
    serving.validate().map_err(|e| e.to_string())?;
    let estimator = match f.prompt_estimator.as_deref() {
        None => PromptEstimator::default(),
        Some(name) => PromptEstimator::parse(name)
            .ok_or_else(|| format!("unknown prompt_estimator {name:?}"))?,
    };
    let kind = match f.kind.as_deref() {
        None => tf_core::endpoint::ModelKind::default(),
        Some(name) => tf_core::endpoint::ModelKind::parse(name)
            .ok_or_else(|| format!("unknown kind {name:?} (chat or embedding)"))?,
    };
    let config_json = document(&f.config_json, dir, "config_json")?;
    if !config_json.is_object() {
        return Err("config_json is not a JSON object".into());
    }
    let tokenizer_json = match &f.tokenizer_json {
        None => None,
        Some(source) => {
            let doc = document(source, dir, "tokenizer_json")?;
            // Checked now, so a base never starts with a tokenizer the gateway cannot load.
            BaseTokenizer::from_json(&doc.to_string())
                .map_err(|e| format!("tokenizer_json: {e}"))?;
            Some(doc)
        }
    };
    let int = |v: u64, what: &str| i32::try_from(v).map_err(|_| format!("{what} is too large"));
    let row = TemplateRow {
        model: serving.model,
        image: serving.image,
        tensor_parallel_size: int(serving.tensor_parallel_size.into(), "tensor_parallel_size")?,
        quantization: serving.quantization,
        max_loras: int(serving.max_loras.into(), "max_loras")?,
        max_lora_rank: int(serving.max_lora_rank, "max_lora_rank")?,
        extra_args: serving.extra_args,
        gpus_per_replica: int(serving.gpus_per_replica.into(), "gpus_per_replica")?,
        replicas_min: int(floor.into(), "replicas")?,
        replicas_max: int(ceiling.into(), "replicas_max")?,
        env_from_secret: serving.env_from_secret,
        config_json,
        tokenizer_json,
        allow_dora: f.allow_dora,
        idle_after_secs: f
            .idle_after_secs
            .map(|s| int(s.into(), "idle_after_secs"))
            .transpose()?
            .filter(|s| *s > 0),
        kind: kind.as_str().to_owned(),
    };
    Ok(BaseTemplate {
        base: f.base.trim().to_owned(),
        offered: f.offered,
        estimator,
        row,
        source: path.to_path_buf(),
    })
}

/// A JSON document: read from its path (relative to `dir`) or taken inline.
fn document(source: &JsonSource, dir: &Path, what: &str) -> Result<Value, String> {
    match source {
        JsonSource::Inline(map) => Ok(Value::Object(map.clone())),
        JsonSource::Path(p) => {
            let path = dir.join(p);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("{what}: {}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{what}: {}: {e}", path.display()))
        }
    }
}

/// Upserts `templates` as bases of `fleet` (idempotent); each base's graph is named as its
/// backend expects ([`graph_name`]). Returns how many were written.
pub async fn apply(pool: &PgPool, fleet: &str, templates: &[BaseTemplate]) -> sqlx::Result<usize> {
    for t in templates {
        offer_base(
            pool,
            fleet,
            &t.base,
            &graph_name(&t.base),
            t.offered,
            t.estimator.as_str(),
            &t.row,
        )
        .await?;
    }
    Ok(templates.len())
}

/// Loads the templates at `path` and offers them on `spec`'s fleet (start-up): the fleets the
/// controller drives only; a `static` fleet's engines are listed in its own file.
pub async fn offer_from(
    pool: &PgPool,
    spec: &super::FleetSpec,
    path: &Path,
) -> anyhow::Result<usize> {
    if matches!(spec, super::FleetSpec::Static(_)) {
        anyhow::bail!(
            "TF_BASE_TEMPLATES is for the fleets the controller drives (local-sim, local-vllm, \
             kubernetes); a static fleet lists its engines in its own file"
        );
    }
    // Parsing a large tokenizer.json takes a moment: off the runtime's threads.
    let owned = path.to_path_buf();
    let templates = tokio::task::spawn_blocking(move || load(&owned)).await??;
    Ok(apply(pool, spec.label(), &templates).await?)
}
