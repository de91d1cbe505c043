//! The advisor's cost versus cold-start chart, drawn on the server as inline SVG: every candidate
//! policy as a dot (cold starts over the window across, GPU cost over the window up, both from
//! 0), the frontier (no other policy both cheaper and with fewer cold starts) joined and
//! labelled, the recommended policy ringed and the current one squared. [`layout`] computes the
//! geometry in integers and is tested apart from the markup.

use leptos::prelude::*;

use super::chart::nice_step;
use super::policy::PolicyRow;
use crate::money::{format_micros, group_thousands};

pub const WIDTH: i64 = 720;
pub const HEIGHT: i64 = 320;
const LEFT: i64 = 96;
const RIGHT: i64 = 24;
const TOP: i64 = 16;
const BOTTOM: i64 = 52;
const STEPS: i64 = 4;

/// One policy's dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dot {
    pub x: i64,
    pub y: i64,
    /// Written beside it (frontier, recommended and current policies only).
    pub label: Option<String>,
    /// The label's anchor reads leftward near the right edge.
    pub anchor_end: bool,
    pub frontier: bool,
    pub recommended: bool,
    pub current: bool,
    pub title: String,
}

/// The chart's geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub dots: Vec<Dot>,
    /// The frontier, cheapest first, as a staircase.
    pub frontier: Vec<(i64, i64)>,
    pub x_ticks: Vec<(i64, String)>,
    pub y_ticks: Vec<(i64, String)>,
}

/// An axis from 0 to a round value of at least `max`, and its step.
pub fn axis(max: i64) -> (i64, i64) {
    if max <= 0 {
        return (STEPS, 1);
    }
    let step = nice_step((max + STEPS - 1) / STEPS);
    (
        (max.saturating_add(step - 1) / step).saturating_mul(step),
        step,
    )
}

fn at(v: i64, high: i64, length: i64) -> i64 {
    let v = i128::from(v.clamp(0, high));
    let (high, length) = (i128::from(high.max(1)), i128::from(length));
    i64::try_from((2 * v * length + high) / (2 * high)).unwrap_or(0)
}

/// Lays out `rows` (their cold starts and GPU cost) in a [`WIDTH`] x [`HEIGHT`] drawing.
pub fn layout(rows: &[PolicyRow]) -> Layout {
    let (x_high, x_step) = axis(rows.iter().map(|r| r.cold_starts).max().unwrap_or(0));
    let (y_high, y_step) = axis(rows.iter().map(|r| r.gpu_cost_micros).max().unwrap_or(0));
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x_of = |v: i64| LEFT + at(v, x_high, plot_w);
    let y_of = |v: i64| TOP + plot_h - at(v, y_high, plot_h);
    let dots: Vec<Dot> = rows
        .iter()
        .map(|r| {
            let x = x_of(r.cold_starts);
            let mut marks = Vec::new();
            if r.recommended {
                marks.push("recommended");
            }
            if r.current {
                marks.push("current");
            }
            let label = (r.frontier || r.recommended || r.current).then(|| {
                if marks.is_empty() {
                    r.label()
                } else {
                    format!("{} ({})", r.label(), marks.join(", "))
                }
            });
            Dot {
                x,
                y: y_of(r.gpu_cost_micros),
                anchor_end: x > LEFT + plot_w * 2 / 3,
                label,
                frontier: r.frontier,
                recommended: r.recommended,
                current: r.current,
                title: format!(
                    "{}: {} cold starts, GPU cost {}",
                    r.label(),
                    group_thousands(r.cold_starts.unsigned_abs()),
                    format_micros(r.gpu_cost_micros)
                ),
            }
        })
        .collect();
    let mut on: Vec<&PolicyRow> = rows.iter().filter(|r| r.frontier).collect();
    on.sort_by_key(|r| (r.gpu_cost_micros, r.cold_starts));
    let mut frontier = Vec::new();
    for (i, r) in on.iter().enumerate() {
        let (x, y) = (x_of(r.cold_starts), y_of(r.gpu_cost_micros));
        if i > 0 {
            // Across at the cheaper policy's cold starts, then up to this one's cost.
            if let Some(&(px, _)) = frontier.last() {
                frontier.push((px, y));
            }
        }
        frontier.push((x, y));
    }
    let x_ticks = (0..=STEPS * 2)
        .map(|k| k * x_step)
        .take_while(|v| *v <= x_high)
        .map(|v| (x_of(v), group_thousands(v.unsigned_abs())))
        .collect();
    let y_ticks = (0..=STEPS * 2)
        .map(|k| k.saturating_mul(y_step))
        .take_while(|v| *v <= y_high)
        .map(|v| (y_of(v), format_micros(v)))
        .collect();
    Layout {
        dots,
        frontier,
        x_ticks,
        y_ticks,
    }
}

/// The chart, its axes titled with their units.
#[component]
pub fn FrontierChart(rows: Vec<PolicyRow>, days: i64, caption: String) -> impl IntoView {
    let chart = layout(&rows);
    let (right, bottom) = (WIDTH - RIGHT, HEIGHT - BOTTOM);
    let line = chart
        .frontier
        .iter()
        .map(|(x, y)| format!("{x},{y}"))
        .collect::<Vec<_>>()
        .join(" ");
    let y_title_y = TOP + (bottom - TOP) / 2;
    view! {
        <figure class="chart frontier">
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") role="img" aria-label=caption.clone()>
                {chart.y_ticks.iter().map(|(y, label)| view! {
                    <line class="grid" x1=LEFT y1=*y x2=right y2=*y/>
                    <text class="tick" x=LEFT - 6 y=*y + 4 text-anchor="end">{label.clone()}</text>
                }).collect_view()}
                {chart.x_ticks.iter().map(|(x, label)| view! {
                    <line class="grid" x1=*x y1=TOP x2=*x y2=bottom/>
                    <text class="tick" x=*x y=bottom + 14 text-anchor="middle">{label.clone()}</text>
                }).collect_view()}
                <line class="zero" x1=LEFT y1=bottom x2=right y2=bottom/>
                <line class="zero" x1=LEFT y1=TOP x2=LEFT y2=bottom/>
                <text class="axis-title" x=LEFT + (right - LEFT) / 2 y=HEIGHT - 8 text-anchor="middle">
                    {format!("cold starts over the {days} days (count)")}
                </text>
                <text class="axis-title" x=14 y=y_title_y text-anchor="middle"
                    transform=format!("rotate(-90 14 {y_title_y})")>
                    {format!("GPU cost over the {days} days (USD)")}
                </text>
                <polyline class="line frontier-line" points=line fill="none"/>
                {chart.dots.iter().map(|d| {
                    let class = if d.frontier { "dot on-frontier" } else { "dot" };
                    let label_x = if d.anchor_end { d.x - 8 } else { d.x + 8 };
                    let anchor = if d.anchor_end { "end" } else { "start" };
                    view! {
                        <circle class=class cx=d.x cy=d.y r="3.5"><title>{d.title.clone()}</title></circle>
                        {d.recommended.then(|| view! {
                            <circle class="mark recommended" cx=d.x cy=d.y r="8" fill="none"/>
                        })}
                        {d.current.then(|| view! {
                            <rect class="mark current" x=d.x - 7 y=d.y - 7 width="14" height="14" fill="none"/>
                        })}
                        {d.label.clone().map(|l| view! {
                            <text class="point-label" x=label_x y=d.y - 8 text-anchor=anchor>{l}</text>
                        })}
                    }
                }).collect_view()}
            </svg>
            <figcaption>
                {caption}
                <ul class="legend">
                    <li><span class="swatch line frontier-swatch"></span>"the frontier: no other policy is both cheaper and has fewer cold starts"</li>
                    <li>"ringed: recommended"</li>
                    <li>"squared: current"</li>
                </ul>
            </figcaption>
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(floor: i64, idle: Option<i64>, cold: i64, cost: i64) -> PolicyRow {
        PolicyRow {
            floor,
            idle_after_secs: idle,
            cold_starts: cold,
            gpu_cost_micros: cost,
            ..PolicyRow::default()
        }
    }

    #[test]
    fn axes_are_round_and_start_at_zero() {
        assert_eq!(axis(0), (4, 1));
        assert_eq!(axis(90), (100, 50));
        assert_eq!(axis(4_320), (6_000, 2_000));
        assert_eq!(axis(2_592_000_000), (3_000_000_000, 1_000_000_000));
    }

    #[test]
    fn the_frontier_is_a_staircase_and_the_marks_are_labelled() {
        let mut rows = vec![
            // Always on: dear, no cold start. 5 min: cheap, many. 1 h: between.
            row(1, None, 0, 2_000_000),
            row(1, Some(300), 90, 500_000),
            row(1, Some(3_600), 30, 1_000_000),
            // Off the frontier: dearer and colder than always on.
            row(2, Some(3_600), 30, 2_000_000),
        ];
        rows[0].frontier = true;
        rows[0].current = true;
        rows[1].frontier = true;
        rows[2].frontier = true;
        rows[2].recommended = true;
        let chart = layout(&rows);
        // x: 0..100 cold starts over 720 - 96 - 24 = 600; y: $0..$2 over 320 - 16 - 52 = 252.
        assert_eq!((chart.dots[0].x, chart.dots[0].y), (LEFT, TOP));
        assert_eq!(chart.dots[1].x, LEFT + 540);
        assert_eq!(chart.dots[1].y, TOP + 252 - 63);
        // Cheapest first: (90, $0.50), across to 30 at $1, (30, $1), across to 0 at $2, (0, $2).
        let xs: Vec<i64> = chart.frontier.iter().map(|p| p.0).collect();
        assert_eq!(xs, [LEFT + 540, LEFT + 540, LEFT + 180, LEFT + 180, LEFT]);
        assert_eq!(
            chart.dots[0].label.as_deref(),
            Some("floor 1 · always on (current)")
        );
        assert_eq!(
            chart.dots[2].label.as_deref(),
            Some("floor 1 · 1h (recommended)")
        );
        assert!(chart.dots[1].anchor_end, "near the right edge");
        assert_eq!(chart.dots[3].label, None, "off the frontier: a bare dot");
        assert_eq!(chart.y_ticks.last().map(|t| t.1.as_str()), Some("$2.00"));
        assert_eq!(chart.x_ticks.last().map(|t| t.1.as_str()), Some("100"));
    }
}
