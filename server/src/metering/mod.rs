//! Metering: reading every response to its end to capture usage, and the usage event itself.

pub mod edit;
pub mod meter;
pub mod refusal;
pub mod relay;
pub mod sse;
pub mod stream;
pub mod usage;
