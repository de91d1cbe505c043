//! A chart of two ratios per day in basis points, drawn on the server as inline SVG (so it shows
//! with JavaScript off): a bar (the duty cycle, 0 up) and a line that may go negative (the
//! margin), on one scale from -100 % to +100 %. Values beyond it are drawn at its edge and marked;
//! the exact figures are in the table beside it. [`layout`] computes the geometry in integers and
//! is tested apart from the markup. (The usage chart in `charts` stacks unsigned values; a signed
//! margin needs a zero line in the middle, hence this one.)

use leptos::prelude::*;

pub const WIDTH: i64 = 720;
pub const HEIGHT: i64 = 220;
const LEFT: i64 = 56;
const RIGHT: i64 = 16;
const TOP: i64 = 12;
const BOTTOM: i64 = 28;
/// The scale's ends: -100 % and +100 %.
const LIMIT: i64 = 10_000;

/// One day: its label and the two ratios (`None`: undefined that day, not drawn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    pub label: String,
    pub bar_bp: Option<i64>,
    pub line_bp: Option<i64>,
}

/// A bar, in user units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bar {
    pub x: i64,
    pub y: i64,
    pub width: i64,
    pub height: i64,
    /// Beyond the scale (drawn at its edge).
    pub clipped: bool,
    pub title: String,
}

/// The chart's geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub bars: Vec<Bar>,
    /// Runs of consecutive defined line values (a day without one breaks the line).
    pub lines: Vec<Vec<(i64, i64)>>,
    /// The height of 0 %.
    pub zero_y: i64,
    /// Ticks: height and label.
    pub ticks: Vec<(i64, String)>,
    pub labels: Vec<(i64, String)>,
}

/// A ratio as a percentage with two decimals: `55.56 %`, `-3.10 %`.
pub fn percent(bp: i64) -> String {
    let sign = if bp < 0 { "-" } else { "" };
    let a = bp.unsigned_abs();
    format!("{sign}{}.{:02} %", a / 100, a % 100)
}

fn y_of(bp: i64) -> i64 {
    let plot_h = HEIGHT - TOP - BOTTOM;
    let clamped = bp.clamp(-LIMIT, LIMIT);
    // +LIMIT at TOP, -LIMIT at the bottom; rounded to the nearest unit.
    let from_top = ((LIMIT - clamped) * plot_h * 2 + 2 * LIMIT) / (4 * LIMIT);
    TOP + from_top
}

/// Lays out `points` in a [`WIDTH`] x [`HEIGHT`] drawing.
pub fn layout(points: &[Point]) -> Layout {
    let plot_w = WIDTH - LEFT - RIGHT;
    let n = i64::try_from(points.len()).unwrap_or(i64::MAX).max(1);
    let edge = |i: i64| LEFT + plot_w * i / n;
    let bar_w = ((plot_w / n) * 6 / 10).max(1);
    let zero_y = y_of(0);
    let every = usize::try_from((n + 9) / 10).unwrap_or(1).max(1);
    let mut bars = Vec::new();
    let mut lines: Vec<Vec<(i64, i64)>> = vec![Vec::new()];
    let mut labels = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let i64_i = i64::try_from(i).unwrap_or(0);
        let (slot_x, slot) = (edge(i64_i), edge(i64_i + 1) - edge(i64_i));
        let mid = slot_x + slot / 2;
        if let Some(bp) = p.bar_bp.filter(|bp| *bp > 0) {
            let top = y_of(bp);
            bars.push(Bar {
                x: slot_x + (slot - bar_w) / 2,
                y: top,
                width: bar_w,
                height: zero_y - top,
                clipped: bp > LIMIT,
                title: format!("{}: duty cycle {}", p.label, percent(bp)),
            });
        }
        match p.line_bp {
            Some(bp) => {
                if let Some(l) = lines.last_mut() {
                    l.push((mid, y_of(bp)));
                }
            }
            None if lines.last().is_some_and(|l| !l.is_empty()) => lines.push(Vec::new()),
            None => {}
        }
        if i.is_multiple_of(every) {
            labels.push((mid, p.label.clone()));
        }
    }
    lines.retain(|l| !l.is_empty());
    let ticks = [-LIMIT, -LIMIT / 2, 0, LIMIT / 2, LIMIT]
        .into_iter()
        .map(|bp| (y_of(bp), format!("{} %", bp / 100)))
        .collect();
    Layout {
        bars,
        lines,
        zero_y,
        ticks,
        labels,
    }
}

/// The chart with its scale and a legend.
#[component]
pub fn RatioChart(
    points: Vec<Point>,
    caption: String,
    bar_name: &'static str,
    line_name: &'static str,
) -> impl IntoView {
    let chart = layout(&points);
    let right = WIDTH - RIGHT;
    let base = HEIGHT - BOTTOM;
    view! {
        <figure class="chart">
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") role="img" aria-label=caption>
                {chart.ticks.iter().map(|(y, label)| view! {
                    <line class="grid" x1=LEFT y1=*y x2=right y2=*y/>
                    <text class="tick" x=LEFT - 6 y=*y + 4 text-anchor="end">{label.clone()}</text>
                }).collect_view()}
                <line class="zero" x1=LEFT y1=chart.zero_y x2=right y2=chart.zero_y/>
                {chart.bars.iter().map(|b| {
                    let class = if b.clipped { "series-0 clipped" } else { "series-0" };
                    view! {
                        <rect class=class x=b.x y=b.y width=b.width height=b.height>
                            <title>{b.title.clone()}</title>
                        </rect>
                    }
                }).collect_view()}
                {chart.lines.iter().map(|l| {
                    let points = l.iter().map(|(x, y)| format!("{x},{y}")).collect::<Vec<_>>().join(" ");
                    view! { <polyline class="line" points=points fill="none"/> }
                }).collect_view()}
                {chart.labels.iter().map(|(x, label)| view! {
                    <text class="tick" x=*x y=base + 16 text-anchor="middle">{label.clone()}</text>
                }).collect_view()}
            </svg>
            <figcaption>
                <ul class="legend">
                    <li><span class="swatch series-0"></span>{bar_name}</li>
                    <li><span class="swatch line"></span>{line_name}</li>
                </ul>
            </figcaption>
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(label: &str, bar: Option<i64>, line: Option<i64>) -> Point {
        Point {
            label: label.into(),
            bar_bp: bar,
            line_bp: line,
        }
    }

    #[test]
    fn the_scale_runs_from_minus_to_plus_one_hundred_percent() {
        let plot_h = HEIGHT - TOP - BOTTOM;
        assert_eq!(y_of(10_000), TOP);
        assert_eq!(y_of(-10_000), TOP + plot_h);
        assert_eq!(y_of(0), TOP + plot_h / 2);
        assert_eq!(y_of(50_000), TOP, "clamped");
    }

    #[test]
    fn bars_rise_from_zero_and_the_line_breaks_on_undefined_days() {
        let chart = layout(&[
            point("a", Some(5_000), Some(2_000)),
            point("b", Some(20_000), None),
            point("c", None, Some(-30_000)),
            point("d", Some(0), Some(0)),
        ]);
        assert_eq!(chart.bars.len(), 2, "no bar for none or zero");
        assert_eq!(chart.bars[0].y + chart.bars[0].height, chart.zero_y);
        assert_eq!(chart.bars[0].height, (chart.zero_y - TOP) / 2);
        assert!(chart.bars[1].clipped);
        assert_eq!(chart.lines.len(), 2);
        assert_eq!(chart.lines[1].len(), 2);
        assert_eq!(chart.lines[1][0].1, HEIGHT - BOTTOM, "clamped at -100 %");
    }

    #[test]
    fn percentages_keep_two_decimals_and_the_sign() {
        assert_eq!(percent(5_556), "55.56 %");
        assert_eq!(percent(-310), "-3.10 %");
        assert_eq!(percent(0), "0.00 %");
    }
}
