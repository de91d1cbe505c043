//! Who a base's GPU cost is for (issue 36): one base-day's cost, idle floor included, split
//! among the tenants and adapters that used it, to the micro. No I/O: `db::attribution` reads
//! the usage and `db::economics::days` the cost.
//!
//! The rule:
//! - the *used* cost (the GPU cost minus the idle floor cost) is split by load: each tenant and
//!   adapter pays for the capacity its tokens took, cached prompt tokens at their weight
//!   ([`crate::economics::Served::load_milli`]);
//! - the *idle floor* cost is split by the idle time each request was waited for: a request's
//!   weight is the time since the base's previous request (since the day's start for the
//!   first). The floor idles to be warm for the next request, so the request that ends a quiet
//!   spell is the one the warmth was kept for: a long-tail adapter called a few times a day pays
//!   for the hours the floor waited for it, and a busy tenant whose requests follow each other
//!   closely pays little of the floor;
//! - a part nobody used (no load, or no request at all) is its own row, *unattributed*, so the
//!   rows still add up to the base's cost.
//!
//! Integer money: each part is split by the largest remainder (Hamilton's method): every
//! share is first rounded down, then the micros left over go one each to the largest
//! remainders, ties to the earlier row (rows are ordered by tenant id, then adapter), so the
//! shares sum to the part exactly.

use serde::Serialize;
use uuid::Uuid;

use super::{div_half_up, Served};

/// One tenant's use of a base on a day through one served model (its adapter, or the bare base).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    pub tenant_id: Uuid,
    pub adapter: Option<String>,
    pub requests: i64,
    pub served: Served,
    /// The idle time before each of its requests, summed (see the module's rule).
    pub waited_for_ms: i64,
}

/// One row of the attribution. `tenant_id` `None`: the unattributed part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Share {
    pub tenant_id: Option<Uuid>,
    pub adapter: Option<String>,
    pub requests: i64,
    pub load_tokens: i64,
    pub waited_for_ms: i64,
    pub used_cost_micros: i64,
    pub idle_floor_cost_micros: i64,
    pub cost_micros: i64,
}

/// Splits `total` (0 or more) by `weights` (0 or more) by the largest remainder, ties to the
/// earlier weight: the parts sum to `total` exactly. All weights zero: `None`.
pub fn apportion(total: i64, weights: &[i128]) -> Option<Vec<i64>> {
    let sum: i128 = weights.iter().map(|w| (*w).max(0)).sum();
    if sum <= 0 {
        return None;
    }
    let total_i = i128::from(total.max(0));
    let mut parts: Vec<i128> = Vec::with_capacity(weights.len());
    let mut rems: Vec<(i128, usize)> = Vec::with_capacity(weights.len());
    for (i, w) in weights.iter().enumerate() {
        let n = total_i * (*w).max(0);
        parts.push(n / sum);
        rems.push((n % sum, i));
    }
    let given: i128 = parts.iter().sum();
    let left = usize::try_from(total_i - given).unwrap_or(0);
    // Largest remainder first; equal remainders by position.
    rems.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in rems.iter().take(left) {
        if let Some(p) = parts.get_mut(i) {
            *p += 1;
        }
    }
    Some(
        parts
            .into_iter()
            .map(|p| i64::try_from(p).unwrap_or(i64::MAX))
            .collect(),
    )
}

/// Attributes a base-day's `cost_micros`, of which `idle_floor_micros` idle floor, to `uses`
/// (sorted here by tenant, then adapter). The shares (and the unattributed row, when there is
/// one) sum to `cost_micros`.
pub fn attribute(cost_micros: i64, idle_floor_micros: i64, uses: &[Use]) -> Vec<Share> {
    let mut uses: Vec<&Use> = uses.iter().collect();
    uses.sort_by(|a, b| (a.tenant_id, &a.adapter).cmp(&(b.tenant_id, &b.adapter)));
    let cost = cost_micros.max(0);
    let idle = idle_floor_micros.clamp(0, cost);
    let used = cost - idle;
    let loads: Vec<i128> = uses.iter().map(|u| u.served.load_milli()).collect();
    let waits: Vec<i128> = uses.iter().map(|u| i128::from(u.waited_for_ms)).collect();
    // Waits all zero but requests made (they came in the day's first millisecond): by requests.
    let by_requests: Vec<i128> = uses.iter().map(|u| i128::from(u.requests)).collect();
    let used_parts = apportion(used, &loads);
    let idle_parts = apportion(idle, &waits).or_else(|| apportion(idle, &by_requests));
    let mut out: Vec<Share> = uses
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let used = used_parts
                .as_ref()
                .and_then(|p| p.get(i))
                .copied()
                .unwrap_or(0);
            let idle = idle_parts
                .as_ref()
                .and_then(|p| p.get(i))
                .copied()
                .unwrap_or(0);
            Share {
                tenant_id: Some(u.tenant_id),
                adapter: u.adapter.clone(),
                requests: u.requests,
                load_tokens: div_half_up(u.served.load_milli(), 1000),
                waited_for_ms: u.waited_for_ms,
                used_cost_micros: used,
                idle_floor_cost_micros: idle,
                cost_micros: used.saturating_add(idle),
            }
        })
        .collect();
    let unused = if used_parts.is_some() { 0 } else { used };
    let unidle = if idle_parts.is_some() { 0 } else { idle };
    if unused > 0 || unidle > 0 {
        out.push(Share {
            tenant_id: None,
            adapter: None,
            requests: 0,
            load_tokens: 0,
            waited_for_ms: 0,
            used_cost_micros: unused,
            idle_floor_cost_micros: unidle,
            cost_micros: unused + unidle,
        });
    }
    out
}

/// A tenant's gross margin on a base-day: its rated revenue less its attributed cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TenantMargin {
    pub tenant_id: Uuid,
    pub revenue_micros: i64,
    pub cost_micros: i64,
    pub margin_micros: i64,
    /// Of the revenue, in basis points; `None` without revenue.
    pub margin_bp: Option<i64>,
}

/// Each tenant's margin from `shares` (its adapters summed) and its revenue (tenant, micros),
/// by tenant id; a tenant with revenue but no share (rated, not served that day) is included.
pub fn tenant_margins(shares: &[Share], revenue: &[(Uuid, i64)]) -> Vec<TenantMargin> {
    let mut by: std::collections::BTreeMap<Uuid, (i64, i64)> = std::collections::BTreeMap::new();
    for s in shares {
        if let Some(t) = s.tenant_id {
            let e = by.entry(t).or_default();
            e.1 = e.1.saturating_add(s.cost_micros);
        }
    }
    for &(t, r) in revenue {
        let e = by.entry(t).or_default();
        e.0 = e.0.saturating_add(r);
    }
    by.into_iter()
        .map(|(tenant_id, (revenue_micros, cost_micros))| {
            let margin_micros = revenue_micros.saturating_sub(cost_micros);
            TenantMargin {
                tenant_id,
                revenue_micros,
                cost_micros,
                margin_micros,
                margin_bp: (revenue_micros > 0).then(|| {
                    div_half_up(
                        i128::from(margin_micros) * 10_000,
                        i128::from(revenue_micros),
                    )
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn use_of(t: u128, adapter: Option<&str>, tokens: i64, waited_for_ms: i64) -> Use {
        Use {
            tenant_id: Uuid::from_u128(t),
            adapter: adapter.map(str::to_owned),
            requests: 1,
            served: Served {
                prompt_tokens: tokens,
                cached_tokens: 0,
                completion_tokens: 0,
            },
            waited_for_ms,
        }
    }

    #[test]
    fn remainders_go_to_the_largest_then_the_earliest() {
        // 10 by 1:1:1: 3 each, the one left to the first.
        assert_eq!(apportion(10, &[1, 1, 1]), Some(vec![4, 3, 3]));
        // 10 by 1:2: 3.33 and 6.67: the larger remainder gets the micro.
        assert_eq!(apportion(10, &[1, 2]), Some(vec![3, 7]));
        assert_eq!(apportion(10, &[0, 0]), None);
        assert_eq!(apportion(0, &[5]), Some(vec![0]));
    }

    #[test]
    fn a_base_day_by_hand() {
        // $10 of which $6 idle floor. Used $4 by load 3:1; idle by waits of 1 h and 5 h.
        let uses = [
            use_of(2, Some("tail"), 1_000, 5 * 3_600_000),
            use_of(1, None, 3_000, 3_600_000),
        ];
        let s = attribute(10_000_000, 6_000_000, &uses);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].tenant_id, Some(Uuid::from_u128(1)));
        assert_eq!(
            (s[0].used_cost_micros, s[0].idle_floor_cost_micros),
            (3_000_000, 1_000_000)
        );
        assert_eq!(
            (s[1].used_cost_micros, s[1].idle_floor_cost_micros),
            (1_000_000, 5_000_000)
        );
        let m = tenant_margins(&s, &[(Uuid::from_u128(1), 5_000_000)]);
        assert_eq!(m[0].margin_micros, 1_000_000);
        assert_eq!(m[0].margin_bp, Some(2_000));
        assert_eq!(m[1].margin_micros, -6_000_000);
        assert_eq!(m[1].margin_bp, None);
    }

    #[test]
    fn a_day_without_requests_is_unattributed() {
        let s = attribute(5_000_000, 5_000_000, &[]);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].tenant_id, s[0].cost_micros), (None, 5_000_000));
    }

    proptest! {
        /// INVARIANT: the shares sum to the base's cost exactly, every share is within a micro
        /// of its exact proportion.
        #[test]
        fn shares_sum_to_the_cost(
            cost in 0i64..1_000_000_000_000,
            idle_share in 0i64..=100,
            uses in proptest::collection::vec((0u128..5, 0i64..10_000_000, 0i64..86_400_000), 0..12),
        ) {
            let idle = cost / 100 * idle_share;
            let uses: Vec<Use> = uses
                .iter()
                .enumerate()
                .map(|(i, &(t, tok, w))| use_of(t, Some(&format!("a{i}")), tok, w))
                .collect();
            let s = attribute(cost, idle, &uses);
            prop_assert_eq!(s.iter().map(|s| s.cost_micros).sum::<i64>(), cost);
            prop_assert_eq!(s.iter().map(|s| s.idle_floor_cost_micros).sum::<i64>(), idle);
            let load: i128 = uses.iter().map(|u| u.served.load_milli()).sum();
            if load > 0 {
                for x in s.iter().filter(|x| x.tenant_id.is_some()) {
                    let exact = i128::from(cost - idle) * i128::from(x.load_tokens) * 1000 / load;
                    prop_assert!((i128::from(x.used_cost_micros) - exact).abs() <= 1);
                }
            }
        }
    }
}
