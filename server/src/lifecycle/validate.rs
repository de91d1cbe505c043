//! Judging stored adapter files against their base, once, before the adapter can be started:
//! refuses pickle files by name and by their real formats ([`adapter_check::pickle`]), then runs [`crate::adapter_check`] (bounded
//! safetensors header, PEFT config, every tensor's shape against the base's `config.json`, rank
//! against the graph's `--max-lora-rank`). Reads the stored files by range from the adapter
//! store; the parsing runs on a blocking thread.

use serde_json::json;

use super::storage::{AdapterStore, StoreError};

use crate::adapter_check::config::{AdapterConfig, BaseConfig};
use crate::adapter_check::pickle::{self, Pickle};
use crate::adapter_check::{self, safetensors, Accepted, GraphLimits, Rejection};

/// The two files of an adapter, as stored.
pub use crate::adapter_check::{CONFIG_FILE, WEIGHTS_FILE};
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
            "{name} is a PyTorch pickle file (loading one runs code); only .safetensors weights \
             are accepted"
        )));
    }
    Ok(())
}

/// Refuses content that is a pickle or a `torch.save` zip archive (and not a plausible
/// safetensors file: see [`pickle::sniff`]).
fn check_not_pickle(head: &[u8], len: u64) -> Result<(), Rejection> {
    let what = match pickle::sniff(head, len) {
        None => return Ok(()),
        Some(Pickle::Zip) => "a torch.save zip archive".to_owned(),
        Some(Pickle::Raw(protocol)) => format!("a raw pickle (protocol {protocol})"),
    };
    Err(Rejection::Format(format!(
        "the weights are a PyTorch pickle, {what}; convert them with safetensors' save_file"
    )))
}

/// Validates the stored version `key` against `base`; the summary is kept with the adapter.
/// Reads the config (at most `config_limit` bytes) and, of the weights, only the 8-byte length
/// prefix and then the header it announces, once that length is checked against the cap and the
/// object's real size: memory is bounded by the header size accepted, never by the file's.
/// Returns the verdict and the weights' size.
pub async fn validate_stored(
    store: &AdapterStore,
    key: &str,
    base: &BaseSpec,
    config_limit: u64,
) -> Result<(Result<Accepted, Rejection>, u64), StoreError> {
    let config = match store.read_small(key, CONFIG_FILE, config_limit).await {
        Ok(bytes) => bytes,
        Err(e) if e.is_not_found() => return Ok((Err(Rejection::Missing(CONFIG_FILE)), 0)),
        Err(e @ StoreError::TooLarge { .. }) => {
            return Ok((Err(Rejection::Config(e.to_string())), 0))
        }
        Err(e) => return Err(e),
    };
    let len = match store.size(key, WEIGHTS_FILE).await {
        Ok(len) => len,
        Err(e) if e.is_not_found() => return Ok((Err(Rejection::Missing(WEIGHTS_FILE)), 0)),
        Err(e) => return Err(e),
    };
    let prefix = store.read_range(key, WEIGHTS_FILE, 0..len.min(8)).await?;
    // The header is fetched only when its announced length is one `read_header` accepts;
    // otherwise `read_header` refuses it from the prefix alone, with its own reason.
    let announced = <[u8; 8]>::try_from(&prefix[..]).map_or(u64::MAX, u64::from_le_bytes);
    let head = if announced <= safetensors::MAX_HEADER_BYTES && announced <= len - 8 {
        let mut head = prefix.to_vec();
        head.extend_from_slice(
            &store
                .read_range(key, WEIGHTS_FILE, 8..8 + announced)
                .await?,
        );
        head
    } else {
        prefix.to_vec()
    };
    let base = base.clone();
    let verdict = tokio::task::spawn_blocking(move || judge(&config, &head, len, &base))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((verdict, len))
}

/// The CPU part of validation: the config, the pickle check and the header against the base.
fn judge(config: &[u8], head: &[u8], len: u64, base: &BaseSpec) -> Result<Accepted, Rejection> {
    let config = std::str::from_utf8(config).map_err(|_| Rejection::Config("not UTF-8".into()))?;
    let adapter = AdapterConfig::parse(config)?;
    let base_config = BaseConfig::parse(&base.config_json.to_string())?;
    check_not_pickle(head, len)?;
    let header = safetensors::read_header(head, len)?;
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
