//! The load's residency timeline: `--trace FILE.csv` (one row per sample)
//! and `--plot FILE.svg` (the same drawn with plotters).

use std::io::Write;
use std::path::Path;

use plotters::prelude::*;
use seam_tools::load::{LoadReport, Sample};

const MIB: f64 = 1024.0 * 1024.0;

/// A line of the plot: its label, colour and what it reads from a sample.
type Series = (&'static str, RGBColor, fn(&Sample) -> u64);

/// Writes `seconds,vm_rss_mib,rss_file_mib,rss_anon_mib,device_mib` rows.
pub fn write_csv(path: &Path, samples: &[Sample]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(
        out,
        "seconds,vm_rss_mib,rss_file_mib,rss_anon_mib,device_mib"
    )?;
    for s in samples {
        writeln!(
            out,
            "{:.4},{:.2},{:.2},{:.2},{:.2}",
            s.seconds,
            s.residency.rss as f64 / MIB,
            s.residency.rss_file as f64 / MIB,
            s.residency.rss_anon as f64 / MIB,
            s.device_bytes as f64 / MIB
        )?;
    }
    out.flush()
}

/// Draws host RSS (total, file, anonymous) and device bytes over time: host
/// memory on the left axis, device bytes on the right, so a flat host line
/// under a rising device line reads at a glance.
pub fn write_svg(path: &Path, report: &LoadReport) -> Result<(), String> {
    let samples = &report.samples;
    let end = samples.last().map_or(1.0, |s| s.seconds).max(1e-3);
    let host_max = samples
        .iter()
        .map(|s| {
            s.residency
                .rss
                .max(s.residency.rss_file)
                .max(s.residency.rss_anon) as f64
                / MIB
        })
        .fold(1.0, f64::max)
        * 1.15;
    let device_max = samples
        .iter()
        .map(|s| s.device_bytes as f64 / MIB)
        .fold(1.0, f64::max)
        * 1.05;
    let root = SVGBackend::new(path, (1200, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let title = format!(
        "seam load, {}, host peak {:.0} MiB over a {:.0} MiB baseline",
        report.staged_text(),
        report.rss.peak_mib,
        report.rss.baseline_mib
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .right_y_label_area_size(80)
        .build_cartesian_2d(0f64..end, 0f64..host_max)
        .map_err(|e| e.to_string())?
        .set_secondary_coord(0f64..end, 0f64..device_max);
    chart
        .configure_mesh()
        .x_desc("seconds since the load began")
        .y_desc("host memory (MiB)")
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .configure_secondary_axes()
        .y_desc("bytes on the device (MiB)")
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(|e| e.to_string())?;
    let series: [Series; 3] = [
        ("VmRSS", BLACK, |s| s.residency.rss),
        ("RssFile", BLUE, |s| s.residency.rss_file),
        ("RssAnon", RED, |s| s.residency.rss_anon),
    ];
    for (name, color, f) in series {
        chart
            .draw_series(LineSeries::new(
                samples.iter().map(|s| (s.seconds, f(s) as f64 / MIB)),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    let green = RGBColor(0, 140, 0);
    chart
        .draw_secondary_series(LineSeries::new(
            samples
                .iter()
                .map(|s| (s.seconds, s.device_bytes as f64 / MIB)),
            green.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?
        .label("device bytes (right axis)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], green.stroke_width(2)));
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
