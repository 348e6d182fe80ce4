//! rdmablk-chart: renders the results `bench/suite.sh` writes (one JSON
//! array of measurements) as SVG charts, one pair per access pattern and
//! block size: IOPS against queue depth, and latency (p50 and p99) against
//! queue depth, a line per path, medians over the rounds.
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

/// One line chart: `y` of each path against queue depth (log2 axis).
fn chart(
    file: &Path,
    title: &str,
    y_label: &str,
    series: &Series,
    y: impl Fn(&(f64, f64, f64)) -> Vec<(&'static str, f64)>,
) -> Draw {
    let root = SVGBackend::new(file, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let qds: Vec<u32> = series.values().flat_map(|p| p.keys().copied()).collect();
    let max_qd = qds.iter().copied().max().unwrap_or(1).max(2);
    let max_y = series
        .values()
        .flat_map(|p| p.values().flat_map(&y))
        .map(|(_, v)| v)
        .fold(0.0, f64::max)
        * 1.1;
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((1u32..max_qd).log_scale(), 0.0..max_y.max(1.0))?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_desc("queue depth")
        .y_desc(y_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    for (i, (path, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let names: Vec<&str> = points
            .values()
            .next()
            .map(|p| y(p).iter().map(|(n, _)| *n).collect())
            .unwrap_or_default();
        for (k, name) in names.iter().enumerate() {
            let line: Vec<(u32, f64)> = points.iter().map(|(qd, p)| (*qd, y(p)[k].1)).collect();
            let style = if k == 0 {
                color.stroke_width(2)
            } else {
                color.stroke_width(1)
            };
            let label = if name.is_empty() {
                path.clone()
            } else {
                format!("{path} {name}")
            };
            c.draw_series(LineSeries::new(line.clone(), style))?
                .label(label)
                .legend(move |(x, yy)| PathElement::new(vec![(x, yy), (x + 18, yy)], color));
            c.draw_series(
                line.iter()
                    .map(|&(x, v)| Circle::new((x, v), 3, color.filled())),
            )?;
        }
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
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
            vec![("", p.0)]
        })
        .and_then(|()| {
            chart(
                &lat,
                &format!("{rw} {bs}: latency"),
                "latency (us)",
                &series,
                |p| vec![("p99", p.2), ("p50", p.1)],
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
        let runs = vec![
            run("rdmablk bench", 1, 1e4),
            run("rdmablk bench", 32, 1e5),
            run("qemu-nbd", 1, 8e3),
            run("qemu-nbd", 32, 6e4),
        ];
        let g = group(&runs);
        let file = dir.join("c.svg");
        chart(
            &file,
            "t",
            "IOPS",
            &g[&("randread".into(), "4k".into())],
            |p| vec![("", p.0)],
        )
        .expect("drawn");
        let svg = std::fs::read_to_string(&file).expect("svg");
        assert!(
            svg.starts_with("<svg") && svg.contains("rdmablk bench") && svg.contains("qemu-nbd"),
            "{svg}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
