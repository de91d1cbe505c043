//! Adapter validation lives in its own crate (`adapter-check/`), with no server dependencies, so
//! the boundary is cargo's and the fuzz target builds without the server; re-exported here under
//! the path the lifecycle code and the tests use.

pub use tf_adapter_check::{
    check, config, lora, pickle, rejection, safetensors, Accepted, GraphLimits, Rejection,
    CONFIG_FILE, WEIGHTS_FILE,
};
