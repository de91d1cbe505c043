//! Request-body capture for tenants that opted in (`tenants.body_logging`): the gateway hands a
//! bounded copy of the prompt and the completion to a bounded channel ([`capture`]); one writer
//! task per replica batch-inserts them ([`writer`]); the cluster's leader deletes what is older
//! than each tenant's retention period ([`retention`]). Capture never blocks the request path
//! and never touches metering: when the channel is full the capture is dropped and counted.

pub mod capture;
pub mod retention;
pub mod writer;
