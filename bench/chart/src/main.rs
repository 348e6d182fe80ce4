//! rdmablk-chart: renders the results `bench/suite.sh` writes (one JSON
//! array of measurements) as SVG charts, one pair per access pattern and
//! block size: IOPS, and latency (p50 and p99), at each queue depth
//! measured, a bar per path, medians over the rounds.
//!
//! rdmablk-chart RESULTS.json OUT_DIR

use plotters::prelude::*;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One measurement of the suite.
#[derive(Deserialize)]
struct Run {
    path: String,
    rw: String,
    bs: String,
    qd: u32,
    iops: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Medians per path and queue depth: (IOPS, p50, p99).
type Series = BTreeMap<String, BTreeMap<u32, (f64, f64, f64)>>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The runs of each path and queue depth.
type Rounds<'a> = BTreeMap<String, BTreeMap<u32, Vec<&'a Run>>>;

/// Groups runs by (rw, bs), then path and queue depth, with the medians of
/// their rounds.
fn group(runs: &[Run]) -> BTreeMap<(String, String), Series> {
    let mut raw: BTreeMap<(String, String), Rounds> = BTreeMap::new();
    for r in runs {
        raw.entry((r.rw.clone(), r.bs.clone()))
            .or_default()
            .entry(r.path.clone())
            .or_default()
            .entry(r.qd)
            .or_default()
            .push(r);
    }
    raw.into_iter()
        .map(|(k, paths)| {
            let series = paths
                .into_iter()
                .map(|(path, qds)| {
                    let points = qds
                        .into_iter()
                        .map(|(qd, rs)| {
                            let m = |f: fn(&Run) -> f64| median(rs.iter().map(|r| f(r)).collect());
                            (qd, (m(|r| r.iops), m(|r| r.p50_us), m(|r| r.p99_us)))
                        })
                        .collect();
                    (path, points)
                })
                .collect();
            (k, series)
        })
        .collect()
}

type Draw = Result<(), Box<dyn std::error::Error>>;

/// Colours told apart on screen and in print, also by most colour-blind
/// readers (Okabe and Ito's set, without its yellow).
const COLOURS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(230, 159, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

/// One bar chart: for each queue depth measured, a group of bars, one per
/// path (`y` gives the bar, and optionally a lighter one behind it). Queue
/// depths are categories, evenly spaced: nothing is drawn between two
/// depths, where nothing was measured.
fn chart(
    file: &Path,
    title: &str,
    y_label: &str,
    series: &Series,
    y: impl Fn(&(f64, f64, f64)) -> (f64, Option<f64>),
) -> Draw {
    let root = SVGBackend::new(file, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let qds: Vec<u32> = series
        .values()
        .flat_map(|p| p.keys().copied())
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .collect();
    let groups = qds.len().max(1);
    let max_y = series
        .values()
        .flat_map(|p| p.values().map(&y))
        .map(|(v, behind)| v.max(behind.unwrap_or(0.0)))
        .fold(0.0, f64::max)
        * 1.15;
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..groups as f64, 0.0..max_y.max(1.0))?;
    // Key points fall every half group at this count: a label at each
    // group's centre, none elsewhere.
    let label = |x: &f64| {
        let i = x - 0.5;
        if (i - i.round()).abs() > 1e-6 || i < -1e-6 {
            return String::new();
        }
        qds.get(i.round() as usize)
            .map_or(String::new(), |qd| format!("QD {qd}"))
    };
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(4 * groups)
        .x_label_formatter(&label)
        .x_desc("queue depth")
        .y_desc(y_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let width = 0.8 / series.len().max(1) as f64;
    for (i, (path, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let (qds, y) = (&qds, &y);
        let bars = |light: bool| -> Vec<Rectangle<(f64, f64)>> {
            points
                .iter()
                .filter_map(|(qd, p)| {
                    let g = qds.iter().position(|q| q == qd)? as f64;
                    let x0 = g + 0.1 + i as f64 * width;
                    let (v, behind) = y(p);
                    let (top, style) = if light {
                        (behind?, colour.mix(0.35).filled())
                    } else {
                        (v, colour.filled())
                    };
                    Some(Rectangle::new([(x0, 0.0), (x0 + width * 0.9, top)], style))
                })
                .collect()
        };
        c.draw_series(bars(true))?;
        c.draw_series(bars(false))?
            .label(path.clone())
            .legend(move |(x, yy)| {
                Rectangle::new([(x, yy - 5), (x + 14, yy + 5)], colour.filled())
            });
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(input), Some(out)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: rdmablk-chart RESULTS.json OUT_DIR");
        std::process::exit(2);
    };
    let runs: Vec<Run> = match std::fs::read_to_string(input)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rdmablk-chart: {input}: {e}");
            std::process::exit(1);
        }
    };
    let out = Path::new(out);
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("rdmablk-chart: {}: {e}", out.display());
        std::process::exit(1);
    }
    for ((rw, bs), series) in group(&runs) {
        let iops = out.join(format!("{rw}-{bs}-iops.svg"));
        let lat = out.join(format!("{rw}-{bs}-latency.svg"));
        let drawn = chart(&iops, &format!("{rw} {bs}: IOPS"), "IOPS", &series, |p| {
            (p.0, None)
        })
        .and_then(|()| {
            chart(
                &lat,
                &format!("{rw} {bs}: latency, p50 (solid) and p99 (light)"),
                "latency (us)",
                &series,
                |p| (p.1, Some(p.2)),
            )
        });
        match drawn {
            Ok(()) => println!("{}\n{}", iops.display(), lat.display()),
            Err(e) => {
                eprintln!("rdmablk-chart: drawing {rw} {bs}: {e}");
                std::process::exit(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(path: &str, qd: u32, iops: f64) -> Run {
        Run {
            path: path.into(),
            rw: "randread".into(),
            bs: "4k".into(),
            qd,
            iops,
            p50_us: iops / 1000.0,
            p99_us: iops / 500.0,
        }
    }

    #[test]
    fn medians_per_path_and_depth() {
        let runs = vec![
            run("a", 1, 10.0),
            run("a", 1, 30.0),
            run("a", 1, 20.0),
            run("b", 32, 5.0),
        ];
        let g = group(&runs);
        let s = &g[&("randread".to_string(), "4k".to_string())];
        assert_eq!(s["a"][&1].0, 20.0);
        assert_eq!(s["b"][&32].0, 5.0);
    }

    #[test]
    fn draws_an_svg_with_every_path() {
        let dir = std::env::temp_dir().join(format!("rdmablk-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut runs = Vec::new();
        for qd in [1, 4, 16, 32, 64] {
            runs.push(run("rdmablk bench", qd, 1e4 * qd as f64));
            runs.push(run("qemu-nbd", qd, 8e3 * qd as f64));
        }
        let g = group(&runs);
        let file = dir.join("c.svg");
        chart(
            &file,
            "t",
            "latency",
            &g[&("randread".into(), "4k".into())],
            |p| (p.1, Some(p.2)),
        )
        .expect("drawn");
        let svg = std::fs::read_to_string(&file).expect("svg");
        assert!(
            svg.starts_with("<svg") && svg.contains("rdmablk bench") && svg.contains("qemu-nbd"),
            "{svg}"
        );
        // Every depth measured is labelled once, and nothing else is.
        for qd in [1, 4, 16, 32, 64] {
            assert_eq!(
                svg.matches(&format!("\nQD {qd}\n")).count(),
                1,
                "QD {qd}: {svg}"
            );
        }
        assert_eq!(svg.matches("\nQD ").count(), 5, "{svg}");
        // Per depth, the first path's two bars (p99 light, p50 solid), and
        // its legend swatch; no line in its colour joins two depths.
        let blue = "#0072B2";
        assert_eq!(
            svg.matches(&format!("fill=\"{blue}\"")).count(),
            2 * 5 + 1,
            "{svg}"
        );
        assert_eq!(
            svg.matches(&format!("stroke=\"{blue}\"")).count(),
            0,
            "{svg}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
