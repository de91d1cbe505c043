//! A bar chart of one ratio per day in basis points (the duty cycle, the margin share), drawn on
//! the server as inline SVG (so it shows with JavaScript off). The scale follows the data: from
//! the smallest value (or 0) to the largest (or 0), widened to round steps, so a duty cycle of
//! 0.27 % fills the chart and a margin of -23,035 % is drawn, not clipped. Each bar is labelled
//! with its value. [`layout`] computes the geometry in integers and is tested apart from the
//! markup. (The usage chart in `charts` stacks unsigned values; a signed ratio needs a zero line
//! that may sit anywhere, hence this one.)

use leptos::prelude::*;

use crate::money::group_thousands;

pub const WIDTH: i64 = 720;
pub const HEIGHT: i64 = 260;
const LEFT: i64 = 76;
const RIGHT: i64 = 16;
/// Room above the plot for the value labels (written upward from the bar's end).
const TOP: i64 = 66;
const BOTTOM: i64 = 24;
/// The scale's steps.
const STEPS: i64 = 4;

/// One day: its label and its ratio (`None`: undefined that day, not drawn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    pub label: String,
    pub value_bp: Option<i64>,
}

/// A bar, in user units, and where its value is written (rotated a quarter turn, reading up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bar {
    pub x: i64,
    pub y: i64,
    pub width: i64,
    pub height: i64,
    pub negative: bool,
    pub value: String,
    /// The label's anchor: above the bar's top (a positive bar) or above the zero line (a
    /// negative one, so no label runs into the day labels).
    pub label_x: i64,
    pub label_y: i64,
    pub title: String,
}

/// The chart's geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub bars: Vec<Bar>,
    /// The height of 0 %.
    pub zero_y: i64,
    /// Ticks: height and label.
    pub ticks: Vec<(i64, String)>,
    pub labels: Vec<(i64, String)>,
    /// The scale's ends, in basis points.
    pub low_bp: i64,
    pub high_bp: i64,
}

/// A ratio as a percentage with two decimals: `55.56 %`, `-3.10 %`, `-23,035.00 %`.
pub fn percent(bp: i64) -> String {
    let sign = if bp < 0 { "-" } else { "" };
    let a = bp.unsigned_abs();
    format!("{sign}{}.{:02} %", group_thousands(a / 100), a % 100)
}

/// The smallest round step (1, 2 or 5 times a power of ten) of at least `raw`.
pub fn nice_step(raw: i64) -> i64 {
    let raw = raw.max(1);
    let mut unit: i64 = 1;
    loop {
        for m in [1, 2, 5] {
            let step = unit.saturating_mul(m);
            if step >= raw || step == i64::MAX {
                return step;
            }
        }
        unit = unit.saturating_mul(10);
    }
}

/// The scale for `values`: its ends (multiples of the step, 0 included) and its step.
pub fn scale(values: impl Iterator<Item = i64> + Clone) -> (i64, i64, i64) {
    let lo = values.clone().min().unwrap_or(0).min(0);
    let hi = values.max().unwrap_or(0).max(0);
    if hi == lo {
        // An empty or all-zero chart still has a scale: 0 to 1 %.
        return (0, 100, 25);
    }
    let step = nice_step((hi.saturating_sub(lo) + STEPS - 1) / STEPS);
    let low = lo.div_euclid(step).saturating_mul(step);
    let high = (-((-hi).div_euclid(step))).saturating_mul(step);
    (low, high, step)
}

/// A bar's value: two decimals up to 100 %, whole percentages beyond (`-23,035 %`, rounded
/// half away from zero), so a label stays short enough to write above its bar.
pub fn bar_value(bp: i64) -> String {
    if bp.unsigned_abs() < 10_000 {
        return percent(bp);
    }
    let sign = if bp < 0 { "-" } else { "" };
    format!(
        "{sign}{} %",
        group_thousands((bp.unsigned_abs() + 50) / 100)
    )
}

/// A tick's label: whole percentages when the step allows (`-3,000,000 %`), else two decimals.
fn tick_label(bp: i64, step: i64) -> String {
    if step % 100 == 0 {
        let sign = if bp < 0 { "-" } else { "" };
        format!("{sign}{} %", group_thousands(bp.unsigned_abs() / 100))
    } else {
        percent(bp)
    }
}

/// Lays out `points` in a [`WIDTH`] x [`HEIGHT`] drawing; `name` is the series' name in each
/// bar's tooltip.
pub fn layout(points: &[Point], name: &str) -> Layout {
    let (low, high, step) = scale(points.iter().filter_map(|p| p.value_bp));
    let plot_h = i128::from(HEIGHT - TOP - BOTTOM);
    let span = i128::from(high.saturating_sub(low).max(1));
    // `high` at TOP, `low` at the plot's bottom; rounded to the nearest unit.
    let y_of = |bp: i64| {
        let from_top = (i128::from(high) - i128::from(bp)) * plot_h;
        TOP + i64::try_from((2 * from_top + span) / (2 * span)).unwrap_or(0)
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let n = i64::try_from(points.len()).unwrap_or(i64::MAX).max(1);
    let edge = |i: i64| LEFT + plot_w * i / n;
    let bar_w = ((plot_w / n) * 6 / 10).max(1);
    let zero_y = y_of(0);
    let every = usize::try_from((n + 9) / 10).unwrap_or(1).max(1);
    let mut bars = Vec::new();
    let mut labels = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let i64_i = i64::try_from(i).unwrap_or(0);
        let (slot_x, slot) = (edge(i64_i), edge(i64_i + 1) - edge(i64_i));
        let mid = slot_x + slot / 2;
        if let Some(bp) = p.value_bp {
            let end = y_of(bp);
            let (y, height) = if bp >= 0 {
                (end, zero_y - end)
            } else {
                (zero_y, end - zero_y)
            };
            bars.push(Bar {
                x: slot_x + (slot - bar_w) / 2,
                y,
                width: bar_w,
                // A value too small to see still shows as a hairline.
                height: height.max(i64::from(bp != 0)),
                negative: bp < 0,
                value: bar_value(bp),
                label_x: mid + 4,
                label_y: y.min(zero_y) - 3,
                title: format!("{}: {name} {}", p.label, percent(bp)),
            });
        }
        if i.is_multiple_of(every) {
            labels.push((mid, p.label.clone()));
        }
    }
    let ticks = (0..=STEPS * 2)
        .map(|k| low.saturating_add(step.saturating_mul(k)))
        .take_while(|bp| *bp <= high)
        .map(|bp| (y_of(bp), tick_label(bp, step)))
        .collect();
    Layout {
        bars,
        zero_y,
        ticks,
        labels,
        low_bp: low,
        high_bp: high,
    }
}

/// The chart with its scale, each bar's value written on it.
#[component]
pub fn RatioChart(points: Vec<Point>, caption: String, name: &'static str) -> impl IntoView {
    let chart = layout(&points, name);
    let right = WIDTH - RIGHT;
    let base = HEIGHT - BOTTOM;
    view! {
        <figure class="chart ratio-chart" data-series=name>
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") role="img" aria-label=caption.clone()>
                {chart.ticks.iter().map(|(y, label)| view! {
                    <line class="grid" x1=LEFT y1=*y x2=right y2=*y/>
                    <text class="tick" x=LEFT - 6 y=*y + 4 text-anchor="end">{label.clone()}</text>
                }).collect_view()}
                <line class="zero" x1=LEFT y1=chart.zero_y x2=right y2=chart.zero_y/>
                {chart.bars.iter().map(|b| {
                    let class = if b.negative { "series-0 negative" } else { "series-0" };
                    let rotate = format!("rotate(-90 {} {})", b.label_x, b.label_y);
                    view! {
                        <rect class=class x=b.x y=b.y width=b.width height=b.height>
                            <title>{b.title.clone()}</title>
                        </rect>
                        <text class="value" x=b.label_x y=b.label_y transform=rotate>
                            {b.value.clone()}
                        </text>
                    }
                }).collect_view()}
                {chart.labels.iter().map(|(x, label)| view! {
                    <text class="tick" x=*x y=base + 16 text-anchor="middle">{label.clone()}</text>
                }).collect_view()}
            </svg>
            <figcaption>{caption}</figcaption>
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(label: &str, v: Option<i64>) -> Point {
        Point {
            label: label.into(),
            value_bp: v,
        }
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(1), 1);
        assert_eq!(nice_step(7), 10);
        assert_eq!(nice_step(11), 20);
        assert_eq!(nice_step(2_000), 2_000);
        assert_eq!(nice_step(575_875), 1_000_000);
    }

    #[test]
    fn the_scale_follows_the_data_and_includes_zero() {
        // A duty cycle of 0.27 %: steps of 0.07 % rounded to 0.10 %, so 0 to 0.30 %.
        assert_eq!(scale([27].into_iter()), (0, 30, 10));
        // A margin of -23,035 % beside +50 %.
        let (low, high, step) = scale([-2_303_500, 5_000].into_iter());
        assert_eq!(step, 1_000_000);
        assert_eq!((low, high), (-3_000_000, 1_000_000));
        // Nothing: 0 to 1 %.
        assert_eq!(scale(std::iter::empty()), (0, 100, 25));
        // All negative: the top is 0.
        assert_eq!(scale([-150, -20].into_iter()).1, 0);
    }

    #[test]
    fn a_small_duty_cycle_fills_the_chart_and_is_labelled() {
        let chart = layout(&[point("a", Some(27)), point("b", None)], "duty cycle");
        assert_eq!(chart.bars.len(), 1, "no bar for an undefined day");
        let b = &chart.bars[0];
        assert_eq!(b.y + b.height, chart.zero_y, "rises from zero");
        // 27 of 30 bp: nine tenths of the plot's height.
        let plot_h = HEIGHT - TOP - BOTTOM;
        assert_eq!(b.height, (27 * plot_h + 15) / 30);
        assert_eq!(b.value, "0.27 %");
        assert_eq!(chart.ticks.first().map(|t| t.1.as_str()), Some("0.00 %"));
        assert_eq!(chart.ticks.last().map(|t| t.1.as_str()), Some("0.30 %"));
    }

    #[test]
    fn a_large_negative_margin_is_drawn_down_from_zero_unclipped() {
        let chart = layout(
            &[point("a", Some(-2_303_500)), point("b", Some(5_000))],
            "margin share",
        );
        let (neg, pos) = (&chart.bars[0], &chart.bars[1]);
        assert!(neg.negative);
        assert_eq!(neg.y, chart.zero_y);
        // -23,035 % of a -30,000 % bottom: within a unit of 23,035 / 30,000 of the part below 0.
        let below = HEIGHT - BOTTOM - chart.zero_y;
        assert!((neg.height - below * 23_035 / 30_000).abs() <= 1);
        assert!(neg.y + neg.height <= HEIGHT - BOTTOM, "inside the plot");
        assert_eq!(neg.value, "-23,035 %", "whole percentages beyond 100 %");
        assert_eq!(neg.label_y, chart.zero_y - 3, "written above the zero line");
        assert_eq!(pos.value, "50.00 %");
        assert!(
            pos.height >= 1,
            "a small positive bar is a hairline at least"
        );
        assert!(chart.ticks.iter().any(|(_, l)| l == "-30,000 %"));
    }

    #[test]
    fn percentages_keep_two_decimals_and_the_sign() {
        assert_eq!(percent(5_556), "55.56 %");
        assert_eq!(percent(-310), "-3.10 %");
        assert_eq!(percent(0), "0.00 %");
    }
}
