//! Metering: reading every response to its end to capture usage, and finishing the request's
//! usage event. It reads bodies it is handed (any [`stream::EngineBody`]) and knows nothing of the
//! gateway's HTTP types.

pub mod assemble;
pub mod assemble_typed;
pub mod assembly_failure;
pub mod borrowed;
pub mod chunk;
pub mod context;
pub mod count;
pub mod edit;
pub mod in_use;
pub mod meter;
pub(crate) mod refusal;
pub mod sse;
pub mod stream;
pub mod typed;
pub mod whole;
pub mod whole_answer;
