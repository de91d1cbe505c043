//! Stand-ins for what the fleet backends drive: a fake Kubernetes API server playing Dynamo's
//! operator, and a fake `vllm` executable running the engine simulator.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: fails loudly
#![allow(
    clippy::disallowed_methods,
    reason = "the fake API server runs until the test ends; nothing waits for it at shutdown"
)]

pub mod crd_schema;
pub mod fake_kube;
pub mod vllm;
