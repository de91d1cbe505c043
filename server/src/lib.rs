//! Token Factory: the `tokenfactory` binary's library. `app::build` assembles the whole server
//! (portal, `/v1` gateway, background workers) so tests start the real thing on port 0.

pub mod admin;
pub mod app;
pub mod cli;
pub mod demo;
pub mod fleet;
pub mod gateway;
pub mod journal;
pub mod metering;
pub mod notify;
pub mod portal;
pub mod quota;
pub mod secret;
pub mod serve;
pub mod sim;
