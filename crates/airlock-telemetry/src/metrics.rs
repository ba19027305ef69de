//! The server's metrics over OTLP, read from the same registry `/metrics` renders: one
//! set of counting, two ways out.
//!
//! prometheus-client keeps its values private and gives them out only as an exposition;
//! OpenTelemetry's observable instruments are read by callbacks at each export. So each
//! export renders the registry once (OpenMetrics text, a few kilobytes) and reports its
//! samples through observable instruments: counters as monotonic sums, gauges as
//! gauges, a histogram as its `_count` and `_sum` (OpenTelemetry has no observable
//! histogram; the buckets stay on `/metrics`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;

use crate::setup::SCOPE;

/// One rendering serves every instrument's callback of one export.
const RENDER_REUSE: Duration = Duration::from_millis(500);

/// A sample of the exposition.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    labels: Vec<KeyValue>,
    value: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The samples of one rendering, by series name.
type SamplesBySeries = BTreeMap<String, Vec<Sample>>;

struct Cache {
    render: Render,
    last: Mutex<Option<(Instant, SamplesBySeries)>>,
}

impl Cache {
    fn samples(&self, series: &str) -> Vec<Sample> {
        let Ok(mut last) = self.last.lock() else {
            return Vec::new();
        };
        let fresh = last
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < RENDER_REUSE);
        if !fresh {
            *last = Some((Instant::now(), parse_samples(&(self.render)())));
        }
        last.as_ref()
            .and_then(|(_, all)| all.get(series).cloned())
            .unwrap_or_default()
    }
}

/// Exports the counters and gauges of an OpenMetrics exposition (`render` gives what
/// `/metrics` serves) over OTLP, read at each export. Nothing when export is off.
pub fn register_openmetrics_source(render: impl Fn() -> String + Send + Sync + 'static) {
    let Some(active) = crate::setup::active() else {
        return;
    };
    let meter = active.meters.meter(SCOPE);
    let render: Render = Arc::new(render);
    let cache = Arc::new(Cache {
        render: render.clone(),
        last: Mutex::new(None),
    });
    let mut known = BTreeSet::new();
    register_new(&meter, &cache, &render(), &mut known);
    // A labelled family shows in the exposition only once it has a series (the first job
    // of an outcome, the first rejection): look again now and then, off the job path.
    let spawned = std::thread::Builder::new()
        .name("airlock-otel-metrics".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(DISCOVERY_INTERVAL);
                register_new(&meter, &cache, &render(), &mut known);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "OTLP metrics: families that appear later are not exported");
    }
}

/// How often the exposition is searched for families that appeared since.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(1);

fn register_new(
    meter: &opentelemetry::metrics::Meter,
    cache: &Arc<Cache>,
    text: &str,
    known: &mut BTreeSet<String>,
) {
    for (series, kind, help) in parse_families(text) {
        if !known.insert(series.clone()) {
            continue;
        }
        let name = series.replace('_', ".");
        let cache = cache.clone();
        let read = series.clone();
        match kind {
            Kind::Counter => {
                let _ = meter
                    .f64_observable_counter(name)
                    .with_description(help)
                    .with_callback(move |observer| {
                        for sample in cache.samples(&read) {
                            observer.observe(sample.value, &sample.labels);
                        }
                    })
                    .build();
            }
            Kind::Gauge => {
                let _ = meter
                    .f64_observable_gauge(name)
                    .with_description(help)
                    .with_callback(move |observer| {
                        for sample in cache.samples(&read) {
                            observer.observe(sample.value, &sample.labels);
                        }
                    })
                    .build();
            }
        }
    }
}

/// The series to export: `(sample name, kind, help)`; a histogram gives two counters.
fn parse_families(text: &str) -> Vec<(String, Kind, String)> {
    let mut help = BTreeMap::new();
    let mut families = Vec::new();
    for line in text.lines() {
        let mut words = line.splitn(4, ' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("#"), Some("HELP"), Some(name), rest) => {
                help.insert(name.to_owned(), rest.unwrap_or("").to_owned());
            }
            (Some("#"), Some("TYPE"), Some(name), Some(kind)) => {
                let text = help.get(name).cloned().unwrap_or_default();
                match kind.trim() {
                    "counter" => families.push((format!("{name}_total"), Kind::Counter, text)),
                    "gauge" => families.push((name.to_owned(), Kind::Gauge, text)),
                    "histogram" => {
                        families.push((format!("{name}_count"), Kind::Counter, text.clone()));
                        families.push((format!("{name}_sum"), Kind::Counter, text));
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    families
}

/// Samples by series name: `name{a="x",b="y"} 1.0`.
fn parse_samples(text: &str) -> BTreeMap<String, Vec<Sample>> {
    let mut all: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, rest) = match line.find('{') {
            Some(open) => match line[open..].find('}') {
                Some(close) => (&line[..open], &line[open + 1..open + close + 1]),
                None => continue,
            },
            None => match line.split_once(' ') {
                Some((name, _)) => (name, ""),
                None => continue,
            },
        };
        let (labels_text, value_text) = if line.contains('{') {
            let labels = rest.trim_end_matches('}');
            let after = line.rsplit_once('}').map_or("", |(_, v)| v);
            (labels, after)
        } else {
            ("", line.split_once(' ').map_or("", |(_, v)| v))
        };
        let Some(value) = value_text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let labels = labels_text
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| KeyValue::new(k.trim().to_owned(), v.trim().trim_matches('"').to_owned()))
            .collect();
        all.entry(series.to_owned())
            .or_default()
            .push(Sample { labels, value });
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP airlock_jobs Jobs finished.\n# TYPE airlock_jobs counter\nairlock_jobs_total{outcome=\"exited\",backend=\"native\"} 3\n# HELP airlock_in_flight Jobs running.\n# TYPE airlock_in_flight gauge\nairlock_in_flight 1\n# TYPE airlock_job_duration_seconds histogram\nairlock_job_duration_seconds_sum 0.5\nairlock_job_duration_seconds_count 3\nairlock_job_duration_seconds_bucket{le=\"0.01\"} 1\n# EOF\n";

    #[test]
    fn families_and_samples_are_read_from_the_exposition() {
        let families = parse_families(TEXT);
        let names: Vec<_> = families.iter().map(|(n, k, _)| (n.as_str(), *k)).collect();
        assert_eq!(
            names,
            [
                ("airlock_jobs_total", Kind::Counter),
                ("airlock_in_flight", Kind::Gauge),
                ("airlock_job_duration_seconds_count", Kind::Counter),
                ("airlock_job_duration_seconds_sum", Kind::Counter),
            ]
        );
        let samples = parse_samples(TEXT);
        let jobs = &samples["airlock_jobs_total"][0];
        assert_eq!(jobs.value, 3.0);
        assert_eq!(
            jobs.labels,
            [
                KeyValue::new("outcome", "exited"),
                KeyValue::new("backend", "native")
            ]
        );
        assert_eq!(samples["airlock_in_flight"][0].value, 1.0);
        assert_eq!(samples["airlock_job_duration_seconds_count"][0].value, 3.0);
    }
}
