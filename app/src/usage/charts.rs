//! Charts drawn on the server as inline SVG, so they show with JavaScript off: a stacked bar per
//! day (token kinds) with a line over it (cost). The geometry is computed in integers by [`layout`]
//! and tested apart from the markup; [`StackedBarsWithLine`] only draws it.

use leptos::prelude::*;

/// Width and height of the drawing in SVG user units; the `viewBox` scales it to the page.
pub const WIDTH: i64 = 720;
pub const HEIGHT: i64 = 240;
/// Room for the axis labels: left (bar scale), right (line scale), bottom (day labels).
const LEFT: i64 = 56;
const RIGHT: i64 = 64;
const TOP: i64 = 22;
const BOTTOM: i64 = 28;
/// Horizontal ticks on each scale (plus zero).
const TICKS: u64 = 4;

/// One day (or other bucket) of the chart: a value per bar series, and the line's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub label: String,
    pub stack: Vec<u64>,
    pub line: u64,
}

/// What to draw: the series names (bottom of the stack first), the columns, and how the two scales
/// print their numbers.
#[derive(Debug, Clone)]
pub struct ChartData {
    pub series: Vec<String>,
    /// What the bars count, printed above the left scale (`tokens`).
    pub unit: &'static str,
    pub line_name: &'static str,
    pub columns: Vec<Column>,
    pub bar_format: fn(u64) -> String,
    pub line_format: fn(u64) -> String,
}

/// One bar segment, in user units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub x: i64,
    pub y: i64,
    pub width: i64,
    pub height: i64,
    pub series: usize,
    pub title: String,
}

/// A tick on a scale: its height and label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    pub y: i64,
    pub label: String,
}

/// The chart's geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub segments: Vec<Segment>,
    /// `x,y` pairs of the line's polyline.
    pub line: Vec<(i64, i64)>,
    pub bar_ticks: Vec<Tick>,
    pub line_ticks: Vec<Tick>,
    /// Day labels to print (thinned so they do not overlap) with their x.
    pub labels: Vec<(i64, String)>,
}

/// The smallest of 1, 2, 5 x 10^k that is at least `value` divided by the tick count, times the
/// tick count: a scale whose ticks are round numbers.
pub fn nice_max(value: u64) -> u64 {
    let per_tick = value.div_ceil(TICKS).max(1);
    let mut magnitude = 1u64;
    while magnitude.saturating_mul(10) <= per_tick {
        magnitude = magnitude.saturating_mul(10);
    }
    let step = [1u64, 2, 5, 10]
        .into_iter()
        .map(|m| m.saturating_mul(magnitude))
        .find(|step| *step >= per_tick)
        .unwrap_or(per_tick);
    step.saturating_mul(TICKS)
}

/// Scales `value` of `max` onto `span` units, rounding to the nearest unit.
fn scale(value: u64, max: u64, span: i64) -> i64 {
    let scaled = (u128::from(value) * span as u128 * 2 + u128::from(max)) / (u128::from(max) * 2);
    i64::try_from(scaled).unwrap_or(span).min(span)
}

/// Lays out `data` in a [`WIDTH`] x [`HEIGHT`] drawing.
pub fn layout(data: &ChartData) -> Layout {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let base = TOP + plot_h;
    let n = i64::try_from(data.columns.len()).unwrap_or(i64::MAX).max(1);
    // Slot edges from the exact share of the width (`plot_w * i / n`), so many days still fill the
    // plot instead of leaving the remainder of a whole-unit slot width empty on the right.
    let edge = |i: i64| LEFT + plot_w * i / n;
    let bar_w = ((plot_w / n) * 7 / 10).max(1);
    let bar_max = nice_max(
        data.columns
            .iter()
            .map(|c| c.stack.iter().sum::<u64>())
            .max()
            .unwrap_or(0),
    );
    let line_max = nice_max(data.columns.iter().map(|c| c.line).max().unwrap_or(0));

    let mut segments = Vec::new();
    let mut line = Vec::new();
    let mut labels = Vec::new();
    // At most about 12 labels, whatever the number of days.
    let every = usize::try_from((n + 11) / 12).unwrap_or(1).max(1);
    for (i, column) in data.columns.iter().enumerate() {
        let i64_i = i64::try_from(i).unwrap_or(0);
        let (slot_x, slot) = (edge(i64_i), edge(i64_i + 1) - edge(i64_i));
        let x = slot_x + (slot - bar_w) / 2;
        let mut below = 0u64;
        for (series, value) in column.stack.iter().copied().enumerate() {
            if value == 0 {
                continue;
            }
            // Heights from cumulative sums, so rounding never makes a stack taller than its total.
            let bottom = scale(below, bar_max, plot_h);
            below += value;
            let top = scale(below, bar_max, plot_h);
            segments.push(Segment {
                x,
                y: base - top,
                width: bar_w,
                height: top - bottom,
                series,
                title: format!(
                    "{}: {} {}",
                    column.label,
                    (data.bar_format)(value),
                    data.series.get(series).map_or("", String::as_str)
                ),
            });
        }
        line.push((
            slot_x + slot / 2,
            base - scale(column.line, line_max, plot_h),
        ));
        if i.is_multiple_of(every) {
            labels.push((slot_x + slot / 2, column.label.clone()));
        }
    }
    let ticks = |max: u64, format: fn(u64) -> String| {
        (0..=TICKS)
            .map(|k| Tick {
                y: base - scale(max / TICKS * k, max, plot_h),
                label: format(max / TICKS * k),
            })
            .collect::<Vec<_>>()
    };
    Layout {
        segments,
        line,
        bar_ticks: ticks(bar_max, data.bar_format),
        line_ticks: ticks(line_max, data.line_format),
        labels,
    }
}

/// A count in a few characters: 950, 12.5k, 3.2M, 1.1B.
pub fn compact(value: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1_000_000_000, "B"), (1_000_000, "M"), (1_000, "k")];
    for (unit, suffix) in UNITS {
        if value >= unit {
            let tenths = value / (unit / 10);
            return if tenths.is_multiple_of(10) || tenths >= 1000 {
                format!("{}{suffix}", tenths / 10)
            } else {
                format!("{}.{}{suffix}", tenths / 10, tenths % 10)
            };
        }
    }
    value.to_string()
}

/// The stacked bars and the line, with both scales and a legend; a table next to it carries the
/// exact figures (the chart is for the eye).
#[component]
pub fn StackedBarsWithLine(data: ChartData, caption: String) -> impl IntoView {
    let chart = layout(&data);
    let plot_right = WIDTH - RIGHT;
    let base = HEIGHT - BOTTOM;
    let points = chart
        .line
        .iter()
        .map(|(x, y)| format!("{x},{y}"))
        .collect::<Vec<_>>()
        .join(" ");
    let legend = data
        .series
        .iter()
        .enumerate()
        .map(|(i, name)| {
            view! { <li><span class=format!("swatch series-{i}")></span>{name.clone()}</li> }
        })
        .collect_view();
    view! {
        <figure class="chart">
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") role="img" aria-label=caption.clone()>
                <text class="tick unit" x=4 y=12>{data.unit}</text>
                <text class="tick unit" x=WIDTH - 4 y=12 text-anchor="end">{data.line_name}</text>
                {chart.bar_ticks.iter().map(|t| view! {
                    <line class="grid" x1=LEFT y1=t.y x2=plot_right y2=t.y/>
                    <text class="tick" x=LEFT - 6 y=t.y + 4 text-anchor="end">{t.label.clone()}</text>
                }).collect_view()}
                {chart.line_ticks.iter().map(|t| view! {
                    <text class="tick line-tick" x=plot_right + 6 y=t.y + 4>{t.label.clone()}</text>
                }).collect_view()}
                {chart.segments.iter().map(|s| view! {
                    <rect class=format!("series-{}", s.series) x=s.x y=s.y width=s.width height=s.height>
                        <title>{s.title.clone()}</title>
                    </rect>
                }).collect_view()}
                <polyline class="line" points=points fill="none"/>
                {chart.labels.iter().map(|(x, label)| view! {
                    <text class="tick" x=*x y=base + 16 text-anchor="middle">{label.clone()}</text>
                }).collect_view()}
            </svg>
            <figcaption>
                <ul class="legend">{legend}<li><span class="swatch line"></span>{data.line_name}</li></ul>
            </figcaption>
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(columns: Vec<Column>) -> ChartData {
        ChartData {
            series: vec!["fresh".into(), "cached".into(), "output".into()],
            unit: "tokens",
            line_name: "cost",
            columns,
            bar_format: compact,
            line_format: compact,
        }
    }

    fn column(label: &str, stack: [u64; 3], line: u64) -> Column {
        Column {
            label: label.into(),
            stack: stack.to_vec(),
            line,
        }
    }

    #[test]
    fn scales_end_on_round_numbers() {
        assert_eq!(nice_max(0), 4);
        assert_eq!(nice_max(7), 8);
        assert_eq!(nice_max(101), 200);
        assert_eq!(nice_max(1_234_567), 2_000_000);
        assert_eq!(nice_max(4_000), 4_000);
        assert!(nice_max(u64::MAX) >= u64::MAX / 2);
    }

    #[test]
    fn the_tallest_stack_reaches_its_share_of_the_scale_and_segments_touch() {
        let chart = layout(&data(vec![
            column("d1", [100, 50, 50], 10),
            column("d2", [400, 0, 0], 40),
        ]));
        let plot_h = HEIGHT - TOP - BOTTOM;
        // Scale 400 (ticks 0,100,..,400): d2 fills the plot, d1 half of it.
        let d2: Vec<_> = chart
            .segments
            .iter()
            .filter(|s| s.x > chart.segments[0].x)
            .collect();
        assert_eq!(d2.len(), 1, "a zero segment draws nothing");
        assert_eq!(d2[0].height, plot_h);
        let d1: Vec<_> = chart
            .segments
            .iter()
            .filter(|s| s.x == chart.segments[0].x)
            .collect();
        assert_eq!(d1.iter().map(|s| s.height).sum::<i64>(), plot_h / 2);
        for pair in d1.windows(2) {
            assert_eq!(
                pair[0].y,
                pair[1].y + pair[1].height,
                "stacked without gaps"
            );
        }
        assert_eq!(
            chart.line[1].1, TOP,
            "the largest line value is the top of its scale"
        );
        assert_eq!(chart.line[0].1, TOP + plot_h * 3 / 4);
    }

    #[test]
    fn rounding_never_makes_a_stack_taller_than_its_total() {
        let chart = layout(&data(vec![
            column("d", [1, 1, 1], 0),
            column("e", [3, 0, 0], 0),
        ]));
        let heights = |x: i64| {
            chart
                .segments
                .iter()
                .filter(|s| s.x == x)
                .map(|s| s.height)
                .sum::<i64>()
        };
        let xs: Vec<i64> = chart.segments.iter().map(|s| s.x).collect();
        assert_eq!(heights(xs[0]), heights(*xs.last().unwrap_or(&0)));
    }

    #[test]
    fn labels_are_thinned_to_about_twelve() {
        let columns = (0..90)
            .map(|d| column(&format!("{d}"), [d, 0, 0], d))
            .collect();
        let chart = layout(&data(columns));
        assert!(chart.labels.len() <= 12, "{}", chart.labels.len());
        assert_eq!(chart.labels[0].1, "0");
    }

    #[test]
    fn many_days_fill_the_plot_width() {
        let columns = (0..90)
            .map(|d| column(&format!("{d}"), [1, 0, 0], 1))
            .collect();
        let chart = layout(&data(columns));
        let last = chart.segments.last().map(|s| s.x + s.width).unwrap_or(0);
        let plot_right = WIDTH - RIGHT;
        // The last bar ends within one slot of the plot's right edge (600 / 90 = 6.67 units).
        assert!(
            plot_right - last <= 7,
            "last bar ends at {last}, plot at {plot_right}"
        );
    }

    #[test]
    fn an_empty_range_draws_axes_and_no_bars() {
        let chart = layout(&data(vec![]));
        assert!(chart.segments.is_empty());
        assert_eq!(chart.bar_ticks.len(), 5);
    }

    #[test]
    fn compact_numbers() {
        assert_eq!(compact(950), "950");
        assert_eq!(compact(1_000), "1k");
        assert_eq!(compact(12_540), "12.5k");
        assert_eq!(compact(3_200_000), "3.2M");
        assert_eq!(compact(999_999_999), "999M");
        assert_eq!(compact(1_100_000_000), "1.1B");
    }
}
