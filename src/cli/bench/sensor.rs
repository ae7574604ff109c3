//! Generated 1 Hz sensor points, for the series benchmarks: a daily sine plus noise in every
//! bit, so compression does not flatter what is stored.

use anyhow::Context;
use rand::Rng;
use rand::rngs::StdRng;

use crate::series::layout::TICKS_PER_SECOND;
use crate::series::{NewPoints, Point, Series, SeriesName};

pub(super) const DAY_SECONDS: u64 = 86_400;

/// Writes `seconds` points at 1 Hz from `start` to `series`, `chunk` points a write.
pub(super) async fn write_seconds_in(
    series: &Series,
    name: &SeriesName,
    (start, seconds): (u64, u64),
    chunk: u64,
    noise: &mut StdRng,
) -> anyhow::Result<()> {
    let mut second = 0;
    while second < seconds {
        let end = seconds.min(second + chunk);
        let points = (second..end)
            .map(|at_second| Point {
                at: start + at_second * TICKS_PER_SECOND,
                value: sensor_value(at_second, noise),
            })
            .collect();
        series
            .write(vec![NewPoints {
                series: name.clone(),
                points,
            }])
            .await
            .with_context(|| format!("failed to write points to {name}"))?;
        second = end;
    }
    Ok(())
}

/// A temperature-like reading: 20 ± 5 over a day, plus noise that fills the mantissa.
pub(super) fn sensor_value(second: u64, noise: &mut StdRng) -> f64 {
    let phase = (second % DAY_SECONDS) as f64 / DAY_SECONDS as f64 * std::f64::consts::TAU;
    5.0f64.mul_add(phase.sin(), 20.0 + noise.random_range(-0.5..0.5))
}
