//! Server half of `/usage` and `/logs`: reads the query strings, asks `tf_core::db::reports` (the
//! tenant id always from the session) and shapes what the pages show. Days are UTC days.

use sqlx::PgPool;
use tf_core::db::reports::{self, LogFilter, NO_KEY};
use time::macros::format_description;
use time::{Date, Duration, OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use super::{
    Choice, EndpointUsage, KeyDay, LogEntry, LogParams, LogReport, UsageFigures, UsageParams,
    UsageReport, UsageRow, ENDPOINTS, LOG_PAGE_SIZE, MAX_RANGE_DAYS, STATUSES, VIEWS,
};
use crate::error::PortalError;
use crate::ssr::{session, Portal};

const DAY: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]");

/// The tenant of the signed-in session; anyone else (signed out, an admin) gets 403.
pub async fn session_tenant(portal: &Portal) -> Result<Uuid, PortalError> {
    let s = session::current().await?;
    match session::signed_in(portal, &s)
        .await?
        .and_then(|si| si.tenant)
    {
        Some(tenant) => Ok(tenant.id),
        None => {
            session::set_status(http::StatusCode::FORBIDDEN);
            Err(PortalError::Forbidden)
        }
    }
}

/// Today, UTC.
pub fn today() -> Date {
    OffsetDateTime::now_utc().date()
}

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The range a query string asks for, or the last 30 days with a notice.
fn range(params: &UsageParams, today: Date) -> (String, Date, Date, Option<String>) {
    let last = |days: i64| today - Duration::days(days - 1);
    match given(&params.range).unwrap_or("30") {
        "7" => ("7".into(), last(7), today, None),
        "30" => ("30".into(), last(30), today, None),
        "90" => ("90".into(), last(90), today, None),
        "custom" => {
            let parse = |v: &Option<String>| given(v).and_then(|s| Date::parse(s, DAY).ok());
            match (parse(&params.from), parse(&params.to)) {
                (Some(from), Some(to)) if from <= to && (to - from).whole_days() < MAX_RANGE_DAYS => {
                    ("custom".into(), from, to, None)
                }
                (Some(from), Some(to)) if from <= to => (
                    "custom".into(),
                    to - Duration::days(MAX_RANGE_DAYS - 1),
                    to,
                    Some(format!(
                        "Ranges are at most {MAX_RANGE_DAYS} days: showing the last {MAX_RANGE_DAYS} days to the chosen end."
                    )),
                ),
                _ => (
                    "30".into(),
                    last(30),
                    today,
                    Some("Pick a start and an end date (the start first): showing the last 30 days.".into()),
                ),
            }
        }
        _ => (
            "30".into(),
            last(30),
            today,
            Some("Unknown range: showing the last 30 days.".into()),
        ),
    }
}

/// The key filter: a key of this tenant, `none` (requests without a key), or all. A key id of
/// another tenant matches nothing of this tenant's anyway (every query is scoped by tenant); it
/// is ignored here so the form does not show a choice it does not list.
fn key_filter(raw: &Option<String>, keys: &[Choice]) -> (String, Option<Uuid>, bool) {
    match given(raw) {
        None => (String::new(), None, true),
        Some("none") => ("none".into(), Some(NO_KEY), true),
        Some(v) => match Uuid::parse_str(v) {
            Ok(id) if keys.iter().any(|k| k.value == id.to_string()) => {
                (id.to_string(), Some(id), true)
            }
            _ => (String::new(), None, false),
        },
    }
}

fn key_choices(keys: Vec<reports::KeyLabel>) -> Vec<Choice> {
    keys.into_iter()
        .map(|k| Choice {
            value: k.id.to_string(),
            label: format!("{} ({}…)", k.name, k.prefix),
        })
        .collect()
}

/// The usage page's data.
pub async fn usage(
    pool: &PgPool,
    tenant: Uuid,
    params: &UsageParams,
    today: Date,
) -> sqlx::Result<UsageReport> {
    let (range_name, from, to, mut notice) = range(params, today);
    let keys = key_choices(reports::key_labels(pool, tenant).await?);
    let models = reports::models(pool, tenant).await?;
    let (key, key_id, key_ok) = key_filter(&params.key, &keys);
    let model = given(&params.model).map(str::to_owned);
    if !key_ok {
        notice = Some("Unknown key: showing every key.".into());
    }
    let rows = reports::daily(pool, tenant, from, to, key_id, model.as_deref()).await?;
    let view = match given(&params.view) {
        None => "kind",
        Some(v) => match VIEWS.iter().find(|(name, _)| *name == v) {
            Some((name, _)) => name,
            None => {
                notice = Some("Unknown chart view: showing tokens by kind.".into());
                "kind"
            }
        },
    };
    let key_days = if view == "key" {
        let label = |id: Uuid| {
            if id == NO_KEY {
                "Without a key".to_owned()
            } else {
                keys.iter()
                    .find(|k| k.value == id.to_string())
                    .map_or_else(|| "(unknown key)".to_owned(), |k| k.label.clone())
            }
        };
        reports::daily_by_key(pool, tenant, from, to, model.as_deref())
            .await?
            .into_iter()
            // The key filter applies here too (the rollup query reads every key of the tenant).
            .filter(|r| key_id.is_none_or(|k| k == r.api_key_id))
            .map(|r| KeyDay {
                day: fmt_day(r.day),
                key: label(r.api_key_id),
                tokens: r.tokens,
            })
            .collect()
    } else {
        Vec::new()
    };
    let day_start = |d: Date| d.midnight().assume_utc();
    let endpoints = reports::by_endpoint(
        pool,
        tenant,
        day_start(from),
        day_start(to) + Duration::days(1),
        key_id,
        model.as_deref(),
    )
    .await?
    .into_iter()
    .map(|r| EndpointUsage {
        label: ENDPOINTS
            .iter()
            .find(|(v, _)| *v == r.endpoint)
            .map_or_else(|| r.endpoint.clone(), |(_, l)| (*l).to_owned()),
        endpoint: r.endpoint,
        requests: r.requests,
        prompt_tokens: r.prompt_tokens,
        cached_tokens: r.cached_tokens,
        completion_tokens: r.completion_tokens,
    })
    .collect();

    let mut days: Vec<(Date, UsageFigures)> = Vec::new();
    let mut day = from;
    while day <= to {
        days.push((day, UsageFigures::default()));
        match day.next_day() {
            Some(next) => day = next,
            None => break,
        }
    }
    let mut totals = UsageFigures::default();
    let mut table = Vec::with_capacity(rows.len());
    for r in rows {
        let figures = UsageFigures {
            requests: r.requests,
            prompt_tokens: r.prompt_tokens,
            cached_tokens: r.cached_tokens,
            completion_tokens: r.completion_tokens,
            cost_micros: r.cost_micros,
        };
        totals.add(&figures);
        let index = usize::try_from((r.day - from).whole_days()).unwrap_or(usize::MAX);
        if let Some((_, f)) = days.get_mut(index) {
            f.add(&figures);
        }
        table.push(UsageRow {
            day: fmt_day(r.day),
            model: r.served_name,
            figures,
        });
    }
    // Newest day first; models in name order within a day.
    table.sort_by(|a, b| b.day.cmp(&a.day).then(a.model.cmp(&b.model)));
    Ok(UsageReport {
        range: range_name,
        from: fmt_day(from),
        to: fmt_day(to),
        key,
        model: model.unwrap_or_default(),
        keys,
        models,
        days: days.into_iter().map(|(d, f)| (fmt_day(d), f)).collect(),
        rows: table,
        totals,
        view: view.to_owned(),
        key_days,
        endpoints,
        notice,
    })
}

fn fmt_day(day: Date) -> String {
    day.format(DAY).unwrap_or_default()
}

/// `YYYY-MM-DDTHH:MM[:SS]` read as UTC.
fn parse_local(v: &str) -> Option<OffsetDateTime> {
    let long = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");
    let short = format_description!("[year]-[month]-[day]T[hour]:[minute]");
    PrimitiveDateTime::parse(v, long)
        .or_else(|_| PrimitiveDateTime::parse(v, short))
        .ok()
        .map(PrimitiveDateTime::assume_utc)
}

/// The cursor of the "Older" link: the last row's start (unix nanoseconds) and request id.
pub fn cursor(started_at: OffsetDateTime, request_id: Uuid) -> String {
    format!(
        "{}_{}",
        started_at.unix_timestamp_nanos(),
        request_id.simple()
    )
}

fn parse_cursor(v: &str) -> Option<(OffsetDateTime, Uuid)> {
    let (nanos, id) = v.split_once('_')?;
    let at = OffsetDateTime::from_unix_timestamp_nanos(nanos.parse().ok()?).ok()?;
    Some((at, Uuid::parse_str(id).ok()?))
}

/// The request log's data: one page, newest first.
pub async fn log(pool: &PgPool, tenant: Uuid, params: &LogParams) -> sqlx::Result<LogReport> {
    let keys = key_choices(reports::key_labels(pool, tenant).await?);
    let models = reports::models(pool, tenant).await?;
    let mut ignored = Vec::new();
    let (key, key_id, key_ok) = key_filter(&params.key, &keys);
    if !key_ok {
        ignored.push("key");
    }
    let status = given(&params.status).filter(|s| {
        let known = STATUSES.contains(s);
        if !known {
            ignored.push("status");
        }
        known
    });
    let mut time = |name: &'static str, v: &Option<String>| {
        given(v).and_then(|s| {
            let t = parse_local(s);
            if t.is_none() {
                ignored.push(name);
            }
            t.map(|t| (s.to_owned(), t))
        })
    };
    let since = time("from", &params.since);
    let until = time("to", &params.until);
    let mut cursor_of = |v: &Option<String>| {
        given(v).and_then(|s| {
            let c = parse_cursor(s);
            if c.is_none() {
                ignored.push("page");
            }
            c
        })
    };
    let before = cursor_of(&params.before);
    // "Newer" pages read after their cursor; a page has one cursor (`before` wins).
    let after = cursor_of(&params.after).filter(|_| before.is_none());
    let endpoint = given(&params.endpoint).filter(|e| {
        let known = ENDPOINTS.iter().any(|(v, _)| v == e);
        if !known {
            ignored.push("endpoint");
        }
        known
    });
    let model = given(&params.model).map(str::to_owned);
    // Events with no key are stored with a NULL key in usage_events (the nil id is the rollup's).
    let no_key = key_id == Some(NO_KEY);
    let filter = LogFilter {
        model: model.as_deref(),
        key: key_id.filter(|_| !no_key),
        status,
        since: since.as_ref().map(|(_, t)| *t),
        until: until.as_ref().map(|(_, t)| *t),
        no_key,
        endpoint,
    };
    let page = usize::try_from(LOG_PAGE_SIZE).unwrap_or(usize::MAX);
    let (rows, older, newer) = if let Some(after) = after {
        // The page just newer than `after`: read oldest first, shown newest first. The page it
        // came from is older, so "Older" is the last row shown.
        let mut rows =
            reports::log_page_newer(pool, tenant, &filter, after, LOG_PAGE_SIZE + 1).await?;
        let more = rows.len() > page;
        rows.truncate(page);
        rows.reverse();
        let newer = more
            .then(|| rows.first().map(|r| cursor(r.started_at, r.request_id)))
            .flatten();
        let older = rows
            .last()
            .map(|r| cursor(r.started_at, r.request_id))
            .or_else(|| Some(cursor(after.0, after.1)));
        (rows, older, newer)
    } else {
        // The newest possible cursor: every stored time is before it.
        let start = before.unwrap_or((
            OffsetDateTime::now_utc() + Duration::days(36_500),
            Uuid::max(),
        ));
        let mut rows = reports::log_page(pool, tenant, &filter, start, LOG_PAGE_SIZE + 1).await?;
        let older = if rows.len() > page {
            rows.truncate(page);
            rows.last().map(|r| cursor(r.started_at, r.request_id))
        } else {
            None
        };
        // A page reached by "Older" has newer rows: those before its first row (or its cursor
        // when it came out empty).
        let newer = before.map(|b| {
            rows.first()
                .map_or_else(|| cursor(b.0, b.1), |r| cursor(r.started_at, r.request_id))
        });
        (rows, older, newer)
    };
    let entries = rows.into_iter().map(log_entry).collect();
    let notice = (!ignored.is_empty()).then(|| {
        format!(
            "Ignored a filter that did not parse ({}).",
            ignored.join(", ")
        )
    });
    Ok(LogReport {
        filter: LogParams {
            model,
            key: Some(key).filter(|k| !k.is_empty()),
            status: status.map(str::to_owned),
            since: since.map(|(s, _)| s),
            until: until.map(|(s, _)| s),
            before: None,
            after: None,
            endpoint: endpoint.map(str::to_owned),
        },
        keys,
        models,
        entries,
        older,
        newer,
        notice,
    })
}

/// A request log row as the pages show it.
pub fn log_entry(r: reports::LogRow) -> LogEntry {
    let stamp = format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    LogEntry {
        request_id: r.request_id.to_string(),
        time: r.started_at.format(stamp).unwrap_or_default(),
        model: r.served_name,
        key: match (r.key_name, r.key_prefix) {
            (Some(name), Some(prefix)) => format!("{name} ({prefix}…)"),
            _ if r.api_key_id.is_none() => "-".into(),
            _ => "(unknown key)".into(),
        },
        status: r.status,
        cost_micros: r.cost_micros,
        prompt_tokens: r.prompt_tokens,
        cached_tokens: r.cached_tokens,
        completion_tokens: r.completion_tokens,
        ttft_ms: r.ttft_ms,
        duration_ms: r.duration_ms,
        endpoint: r.endpoint,
        stream: r.stream,
        provenance: r.provenance,
        reasoning_tokens: r.reasoning_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::date;

    fn params(range: &str, from: &str, to: &str) -> UsageParams {
        UsageParams {
            range: Some(range.into()),
            from: Some(from.into()),
            to: Some(to.into()),
            ..Default::default()
        }
    }

    #[test]
    fn ranges_end_today_and_include_it() {
        let today = date!(2026 - 12 - 03);
        let (name, from, to, notice) = range(&UsageParams::default(), today);
        assert_eq!(
            (name.as_str(), from, to, notice),
            ("30", date!(2026 - 11 - 04), today, None)
        );
        let (_, from, _, _) = range(&params("7", "", ""), today);
        assert_eq!(from, date!(2026 - 11 - 27));
        let (name, from, to, notice) = range(&params("custom", "2026-01-05", "2026-01-05"), today);
        assert_eq!(
            (name.as_str(), from, to),
            ("custom", date!(2026 - 01 - 05), date!(2026 - 01 - 05))
        );
        assert!(notice.is_none());
    }

    #[test]
    fn bad_ranges_fall_back_with_a_notice() {
        let today = date!(2026 - 12 - 03);
        for p in [
            params("custom", "2026-02-01", "2026-01-01"),
            params("custom", "yesterday", "2026-01-01"),
            params("1000", "", ""),
        ] {
            let (name, _, to, notice) = range(&p, today);
            assert_eq!((name.as_str(), to), ("30", today));
            assert!(notice.is_some());
        }
        let (_, from, to, notice) = range(&params("custom", "2020-01-01", "2026-01-01"), today);
        assert_eq!((to - from).whole_days(), MAX_RANGE_DAYS - 1);
        assert!(notice.is_some());
    }

    #[test]
    fn cursors_round_trip() {
        let at = OffsetDateTime::from_unix_timestamp_nanos(1_764_000_000_123_456_789).unwrap();
        let id = Uuid::now_v7();
        assert_eq!(parse_cursor(&cursor(at, id)), Some((at, id)));
        assert_eq!(parse_cursor("x_y"), None);
        assert_eq!(
            parse_local("2026-12-03T10:20"),
            Some(time::macros::datetime!(2026-12-03 10:20 UTC))
        );
    }
}
