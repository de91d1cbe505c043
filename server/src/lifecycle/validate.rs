//! Judging stored adapter files against their base, once, before the adapter can be started:
//! refuses pickle files by name and by content, then runs [`crate::adapter_check`] (bounded
//! safetensors header, PEFT config, every tensor's shape against the base's `config.json`, rank
//! against the graph's `--max-lora-rank`). Blocking file I/O: run it on a blocking thread.

use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::json;

use crate::adapter_check::config::{AdapterConfig, BaseConfig};
use crate::adapter_check::{self, safetensors, Accepted, GraphLimits, Rejection};

/// The two files of an adapter, as stored.
pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// File names of PyTorch pickles: loading one runs arbitrary code, so they are never accepted.
const PICKLE_SUFFIXES: [&str; 5] = [".bin", ".pt", ".pth", ".pkl", ".ckpt"];

/// The base an adapter is judged against.
#[derive(Debug, Clone)]
pub struct BaseSpec {
    /// The model id adapters must name (`base_model_name_or_path`).
    pub model: String,
    pub config_json: serde_json::Value,
    pub max_lora_rank: u64,
}

/// Refuses a weights file by its client-side name (`.bin`, `.pt`, ...).
pub fn check_file_name(name: Option<&str>) -> Result<(), Rejection> {
    let Some(name) = name else { return Ok(()) };
    let lower = name.to_ascii_lowercase();
    if PICKLE_SUFFIXES.iter().any(|s| lower.ends_with(s)) {
        return Err(Rejection::Format(format!(
            "{name} is a PyTorch pickle file; only .safetensors weights are accepted"
        )));
    }
    Ok(())
}

/// Refuses content that is a pickle (protocol opcode 0x80) or a `torch.save` zip archive.
fn check_not_pickle(first: &[u8]) -> Result<(), Rejection> {
    if first.starts_with(b"PK\x03\x04") || first.first() == Some(&0x80) {
        return Err(Rejection::Format(
            "the weights are a PyTorch pickle, not safetensors; convert them with safetensors' save_file"
                .into(),
        ));
    }
    Ok(())
}

/// Validates the stored files in `dir` against `base`; the summary is kept with the adapter.
pub fn validate_dir(dir: &Path, base: &BaseSpec) -> Result<Accepted, Rejection> {
    let config = std::fs::read_to_string(dir.join(CONFIG_FILE))
        .map_err(|e| Rejection::Config(format!("{CONFIG_FILE} is missing or not UTF-8: {e}")))?;
    let adapter = AdapterConfig::parse(&config)?;
    let base_config = BaseConfig::parse(&base.config_json.to_string())?;
    let file = std::fs::File::open(dir.join(WEIGHTS_FILE))
        .map_err(|e| Rejection::Format(format!("{WEIGHTS_FILE} is missing: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| Rejection::Format(format!("{WEIGHTS_FILE}: {e}")))?
        .len();
    let mut reader = BufReader::new(file);
    let mut first = [0u8; 4];
    let n = reader
        .read(&mut first)
        .map_err(|e| Rejection::Format(format!("{WEIGHTS_FILE}: {e}")))?;
    check_not_pickle(&first[..n])?;
    reader
        .seek(SeekFrom::Start(0))
        .map_err(|e| Rejection::Format(format!("{WEIGHTS_FILE}: {e}")))?;
    let header = safetensors::read_header(reader, len)?;
    adapter_check::check(
        &header,
        &adapter,
        &base_config,
        GraphLimits {
            base_name: &base.model,
            max_lora_rank: base.max_lora_rank,
        },
    )
}

/// The validation summary as stored and shown.
pub fn summary(a: &Accepted) -> serde_json::Value {
    json!({
        "rank": a.rank,
        "target_modules": a.modules,
        "layers": a.layers,
        "tensors": a.tensors,
        "weight_bytes": a.weight_bytes,
    })
}
