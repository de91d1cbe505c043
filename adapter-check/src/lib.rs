//! Validation of an uploaded LoRA adapter against the base it is registered on, once, at
//! registration (never at serve time): the weights are safetensors only, their header is bounded
//! and well formed, and every tensor is a LoRA A or B matrix of a projection the adapter's config
//! targets, on a layer the base has, with the shape the base's dimensions and the adapter's rank
//! imply; the rank fits the graph's `--max-lora-rank`. A rejection is a message for the tenant.
//!
//! vLLM would load the same adapter with fewer checks (it does not compare the declared base, and
//! falls back to pickle files): these are the checks that keep a bad upload from failing, or doing
//! worse, inside a shared engine.

pub mod config;
pub mod lora;
pub mod pickle;
pub mod rejection;
pub mod safetensors;

pub use lora::{check, Accepted, GraphLimits};
pub use rejection::{Rejection, CONFIG_FILE, WEIGHTS_FILE};
