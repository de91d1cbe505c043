//! Rated usage in the formats an operator's billing platform ingests. Every record carries the
//! request id as its id (CloudEvents `id`, Lago `transaction_id`), so sending an export twice
//! counts once downstream. Pages of the live run's lines are streamed, never held whole.
//!
//! - CSV: a header, then one row per rated event (RFC 4180 quoting). The endpoint that served
//!   the event and its reasoning tokens (part of the output tokens, not added to them) are the
//!   last two columns, so readers of the earlier columns by position are unaffected.
//! - CloudEvents 1.0, structured mode, one JSON object per line: `id` = request id, `source` =
//!   this deployment, `type` = [`CLOUDEVENT_TYPE`], `subject` = tenant id, `time`, and `data` with
//!   the model and token counts (the shape OpenMeter and Kong metering ingest).
//! - Lago: one batch body (`{"events": [...]}`, at most [`LAGO_BATCH`] events) per line, each
//!   event with `transaction_id` = request id, `external_subscription_id` = tenant id, `code` =
//!   [`LAGO_CODE`], `timestamp` (Unix seconds) and `properties`.

use std::io::Write;

use serde_json::{json, Value};
use sqlx::PgPool;
use tf_core::db::billing::{self, Rated};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The CloudEvents `type` of a rated usage event.
pub const CLOUDEVENT_TYPE: &str = "dev.tokenfactory.usage.v1";
/// The Lago billable metric code the events count under.
pub const LAGO_CODE: &str = "llm_tokens";
/// Lago's batch endpoint takes at most 100 events per call.
pub const LAGO_BATCH: usize = 100;
/// Rows read per page.
const PAGE: i64 = 10_000;

/// An export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    CloudEvents,
    Lago,
}

/// The CSV header row.
pub const CSV_HEADER: &str = "request_id,tenant_id,tenant,model,base_model,price_key,started_at,status,provenance,fresh_input_tokens,cached_input_tokens,output_tokens,price_version,amount_micros,flag,endpoint,reasoning_tokens";

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// One CSV row (no line end).
pub fn csv_row(r: &Rated) -> String {
    [
        r.request_id.to_string(),
        r.tenant_id.to_string(),
        csv_field(&r.tenant_name),
        csv_field(&r.served_name),
        csv_field(&r.base_model),
        csv_field(&r.price_key),
        rfc3339(r.started_at),
        r.status.clone(),
        r.provenance.clone(),
        (r.prompt_tokens - r.cached_tokens).to_string(),
        r.cached_tokens.to_string(),
        r.completion_tokens.to_string(),
        r.price_version_id
            .map(|v| v.to_string())
            .unwrap_or_default(),
        r.amount_micros.to_string(),
        r.flag.clone(),
        csv_field(&r.endpoint),
        r.reasoning_tokens.to_string(),
    ]
    .join(",")
}

/// The event's token counts and model, shared by both JSON formats.
fn data(r: &Rated) -> Value {
    json!({
        "model": r.served_name,
        "base_model": r.base_model,
        "price_key": r.price_key,
        "tenant": r.tenant_name,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "fresh_input_tokens": r.prompt_tokens - r.cached_tokens,
        "output_tokens": r.completion_tokens,
        "reasoning_tokens": r.reasoning_tokens,
        "endpoint": r.endpoint,
        "total_tokens": r.prompt_tokens + r.completion_tokens,
        "status": r.status,
        "provenance": r.provenance,
        "price_version": r.price_version_id,
        "amount_micros": r.amount_micros,
        "flag": r.flag,
    })
}

/// A CloudEvents 1.0 event in structured mode.
pub fn cloudevent(r: &Rated, source: &str) -> Value {
    json!({
        "specversion": "1.0",
        "id": r.request_id.to_string(),
        "source": source,
        "type": CLOUDEVENT_TYPE,
        "subject": r.tenant_id.to_string(),
        "time": rfc3339(r.started_at),
        "datacontenttype": "application/json",
        "data": data(r),
    })
}

/// A Lago event (an element of a batch body's `events`).
pub fn lago_event(r: &Rated) -> Value {
    json!({
        "transaction_id": r.request_id.to_string(),
        "external_subscription_id": r.tenant_id.to_string(),
        "code": LAGO_CODE,
        "timestamp": r.started_at.unix_timestamp(),
        "properties": data(r),
    })
}

/// Writes the live run's rated events started in `[since, until)` to `out` in `format`; returns
/// how many events it wrote. `source` names this deployment (CloudEvents `source`).
pub async fn export(
    pool: &PgPool,
    format: Format,
    since: OffsetDateTime,
    until: OffsetDateTime,
    source: &str,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    if format == Format::Csv {
        writeln!(out, "{CSV_HEADER}")?;
    }
    let mut after = None;
    let mut written = 0;
    let mut lago: Vec<Value> = Vec::with_capacity(LAGO_BATCH);
    loop {
        let page = billing::rated_usage(pool, since, until, after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some((last.started_at, last.request_id));
        for r in &page {
            match format {
                Format::Csv => writeln!(out, "{}", csv_row(r))?,
                Format::CloudEvents => {
                    serde_json::to_writer(&mut *out, &cloudevent(r, source))?;
                    out.write_all(b"\n")?;
                }
                Format::Lago => {
                    lago.push(lago_event(r));
                    if lago.len() == LAGO_BATCH {
                        write_lago(out, &mut lago)?;
                    }
                }
            }
            written += 1;
        }
        if i64::try_from(page.len()).unwrap_or(0) < PAGE {
            break;
        }
    }
    if !lago.is_empty() {
        write_lago(out, &mut lago)?;
    }
    out.flush()?;
    Ok(written)
}

fn write_lago(out: &mut impl Write, events: &mut Vec<Value>) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, &json!({ "events": events }))?;
    out.write_all(b"\n")?;
    events.clear();
    Ok(())
}
